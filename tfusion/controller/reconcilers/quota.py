"""GPUResourceQuota status: written by the allocator's `quota-status` reconciler
(tfusion/controller/allocation.py), the one writer of that status; this module adds what users see
when the alert condition flips.

The status itself (from the ledger): `used.requests` / `used.limits` (TFLOPS, VRAM) and
`used.workers`, `availablePercent` per resource ((total - used) / total x 100, two decimals, "100"
without a total), and the condition Ready: False with reason AlertThresholdReached once any
resource's available percent falls below 100 - `alertThresholdPercent` (the message names each
resource with its own flag; the original swapped them), else True with CapacitySufficient.
Here: a Warning event QuotaAlertThresholdReached when it turns False, a Normal event
QuotaCapacitySufficient when it turns True again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from tfusion.kube.events import EventRecorder

ALERT_REASON = "AlertThresholdReached"


def _ready(conditions: Iterable[Mapping[str, Any]] | None) -> Mapping[str, Any] | None:
    return next((c for c in conditions or [] if c.get("type") == "Ready"), None)


def report_alert_transition(events: EventRecorder, quota: Mapping[str, Any],
                            old_conditions: Iterable[Mapping[str, Any]] | None,
                            new_conditions: Iterable[Mapping[str, Any]]) -> None:
    """An event on the quota when its Ready condition changes status."""
    before, after = _ready(old_conditions), _ready(new_conditions)
    if after is None or (before is not None and before.get("status") == after.get("status")):
        return
    if after.get("status") == "False":
        events.warning(quota, "QuotaAlertThresholdReached", str(after.get("message") or ALERT_REASON))
    elif before is not None:
        events.normal(quota, "QuotaCapacitySufficient", str(after.get("message") or ""))
