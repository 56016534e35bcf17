"""The `quota-status` reconciler: a GPUResourceQuota's status from the allocator's ledger.

Why it exists apart from the allocator service (allocation.py): the service feeds quota specs to
the allocator; this loop, the one writer of the quota's status, writes back what the ledger says.
Key = namespace/name. Written when they differ from the ledger:

- `used.requests` / `used.limits` (TFLOPS, VRAM) and `used.workers`;
- `availablePercent` per resource ((total - used) / total x 100, two decimals, "100" without a total);
- the condition Ready: False with reason AlertThresholdReached once any resource's available percent
  falls below 100 - `alertThresholdPercent` (the message names each resource with its own flag; the
  original swapped them), else True with CapacitySufficient; its lastTransitionTime is kept while
  its status does not change;
- `lastUpdateTime`.

What users see when the alert flips: a Warning event QuotaAlertThresholdReached when Ready turns
False, a Normal event QuotaCapacitySufficient when it turns True again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from tfusion.allocator import GpuAllocator
from tfusion.api import annotations as tfa
from tfusion.api.accessors import Body, sequence_of_maps
from tfusion.controller import views
from tfusion.controller.reconcilers.common import condition
from tfusion.kube import resources as r
from tfusion.kube.client import KubeError, NotFound
from tfusion.kube.events import EventRecorder
from tfusion.kube.reconciler import Result

if TYPE_CHECKING:
    from tfusion.controller.allocation import AllocatorService

log = logging.getLogger(__name__)

ALERT_REASON = "AlertThresholdReached"


class QuotaStatusReconciler:
    """See the module docstring; `controller` is the Manager's `quota-status` controller."""

    def __init__(self, service: AllocatorService) -> None:
        self.service = service
        self.runtime = service.runtime
        self.controller = self.runtime.manager.controller("quota-status").for_(r.GPURESOURCEQUOTAS) \
            .complete(self.reconcile)

    async def reconcile(self, key: str) -> Result | None:
        service = self.service
        allocator = await service.wait_ready()
        if allocator is None:
            return None
        namespace, _, name = key.partition("/")
        cached = self.runtime.informer(r.GPURESOURCEQUOTAS).get(key)
        if cached is None:
            service.forget_quota(namespace, name)
            return None
        if service.quota_name(namespace) != name:
            service.apply_quota(allocator, Body(cached))
        if service.quota_name(namespace) == name:
            try:
                await self._write(allocator, Body(cached))
            except KubeError as exc:
                service.metrics.writes.labels("quota", "error").inc()
                log.warning("cannot write the status of GPUResourceQuota %s: %s; retrying", key, exc)
                raise
        return None

    async def _write(self, allocator: GpuAllocator, quota: Body) -> None:
        """Write the quota's status when the ledger's differs from the cached one."""
        body = views.quota_status(allocator, quota.namespace)
        old_status = quota.status
        old_conditions = sequence_of_maps(old_status.get("conditions"))
        if old_status.get("used") == body["used"] and old_status.get("availablePercent") == \
                body["availablePercent"] and _condition_statuses(old_conditions) == \
                _condition_statuses(body["conditions"]):
            return
        now = tfa.now_rfc3339()
        conditions = [condition(old_conditions, c["type"], c["status"], c["reason"], c["message"],
                                generation=quota.meta.generation, now=now) for c in body["conditions"]]
        patch = {"status": {"used": body["used"], "availablePercent": body["availablePercent"],
                            "conditions": conditions, "lastUpdateTime": now}}
        try:
            await self.runtime.client.patch(r.GPURESOURCEQUOTAS, quota.name, patch, namespace=quota.namespace,
                                            subresource="status")
        except NotFound:
            return
        self.service.metrics.writes.labels("quota", "ok").inc()
        report_alert_transition(self.runtime.events, quota, old_conditions, conditions)


def _condition_statuses(conditions: Iterable[Mapping[str, object]]) -> list[tuple[object, ...]]:
    """What the conditions say, without their stamps (time, generation)."""
    return [(c.get("type"), c.get("status"), c.get("reason"), c.get("message")) for c in conditions]


def _ready(conditions: Iterable[Mapping[str, object]] | None) -> Mapping[str, object] | None:
    return next((c for c in conditions or [] if c.get("type") == "Ready"), None)


def report_alert_transition(events: EventRecorder, quota: Body,
                            old_conditions: Iterable[Mapping[str, object]] | None,
                            new_conditions: Iterable[Mapping[str, object]]) -> None:
    """An event on the quota when its Ready condition changes status."""
    before, after = _ready(old_conditions), _ready(new_conditions)
    if after is None or (before is not None and before.get("status") == after.get("status")):
        return
    if after.get("status") == "False":
        events.warning(quota, "QuotaAlertThresholdReached", str(after.get("message") or ALERT_REASON))
    elif before is not None:
        events.normal(quota, "QuotaCapacitySufficient", str(after.get("message") or ""))
