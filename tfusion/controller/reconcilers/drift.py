"""Drift check and repair: the leader audits its ledger against what the cluster says, counts every
disagreement, reports it on the object, and repairs it from the source of truth.

Sources of truth: the pods for whether an allocation exists (a live worker pod with `gpu-ids`
holds GPUs; nothing else does), the ledger for the amounts (a GPU's `status.available` and
`runningApps` are the allocator's output). Kinds, each counted in `tfusion_drift_total{kind}` and
reported as a Warning event `DriftDetected` on the object:

- `gpu-status`: a GPU's `status.available`/`runningApps` says something the ledger does not.
  Caught two ways: at once, when an update changes them away from what the ledger says (a hand
  edit: the GPU said what the ledger says before, and says something else now), and by the
  periodic audit, when a GPU still differs from the ledger with the same resourceVersion after
  longer than a pending write takes (2 x (flush + --sync-interval) + 1 s), so a write the
  gpu-status reconciler has pending is not drift. Repair: the
  gpu-status reconciler rewrites it from the ledger (it reacts to the same update; the audit
  enqueues it as well).
- `orphan-allocation`: the ledger holds a committed allocation whose pod is gone (confirmed with a
  GET), replaced (another UID) or finished. Repair: released.
- `missing-allocation`: a live worker pod (bound, with `gpu-ids`, GPUs all known) the ledger holds
  nothing for. Repair: adopted from its annotations.
- `allocation-gpus`: a pod's `gpu-ids` name other GPUs than the ledger holds for it. Reported
  only: a released UID cannot be allocated again, and which side is right needs a person.
- `hypervisor-workers`: a Running GPUNode's hypervisor (`GET /api/v1/workers` on the Node's
  InternalIP and the hypervisor port) lists other worker UIDs than the ledger places there, for as
  long (its own pod informer may lag). Reported on the GPUNode: the pod-side kinds above repair the
  ledger, and the hypervisor follows the pods by itself. An unreachable hypervisor is not drift
  (the GPUNode reconciler turns a silent node Unknown).

The last audit is `drift` in `/api/allocation`: when it ran, what it found (with any hand edit
caught since the audit before), the last 100 findings of any audit (`recent`) and the totals.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypedDict

import anyio
import httpx
from prometheus_client import Counter

from tfusion.allocator import GpuAllocator, RequestError
from tfusion.api import annotations as tfa
from tfusion.api.accessors import Body, Gpu, Pod, items
from tfusion.api.annotations import AnnotationError
from tfusion.controller.allocation import FLUSH_INTERVAL_S, AllocatorService
from tfusion.controller.hypervisors import HYPERVISOR_TIMEOUT_S, running_hypervisors
from tfusion.controller.reconcilers.holdings import gpu_names, knows_gpu, worker_request
from tfusion.controller.views import gpu_status
from tfusion.kube import resources as r
from tfusion.kube.client import KubeError, NotFound
from tfusion.kube.pacing import paced

if TYPE_CHECKING:
    from tfusion.controller.runtime import ControllerRuntime

log = logging.getLogger(__name__)

MAX_FINDINGS = 100
KINDS = ("gpu-status", "orphan-allocation", "missing-allocation", "allocation-gpus", "hypervisor-workers")


class Finding(TypedDict):
    """One disagreement: its kind (one of KINDS), `Kind/[namespace/]name`, what was seen, what was done."""
    kind: str
    object: str
    message: str
    repair: str
    at: str


class DriftReport(TypedDict):
    """An audit's outcome, as `/api/allocation` shows it under `drift`."""
    checkedAt: str
    audits: int
    found: int
    byKind: dict[str, int]
    findings: list[Finding]
    recent: list[Finding]
    total: dict[str, int]


def _gpu_fields(gpu: Gpu) -> tuple[object, Sequence[object]]:
    return gpu.status.get("available"), items(gpu.status, "runningApps")


def _ledger_fields(allocator: GpuAllocator, name: str) -> tuple[object, Sequence[object]]:
    wanted = gpu_status(allocator, name)
    return wanted["available"], wanted["runningApps"]


def _status_difference(have: tuple[object, Sequence[object]], ledger: tuple[object, Sequence[object]]) -> str:
    """What a GPU's status says that the ledger does not, in words."""
    said = []
    if have[0] != ledger[0]:
        said.append(f"status.available {have[0]} but the ledger says {ledger[0]}")
    if have[1] != ledger[1]:
        said.append(f"status.runningApps lists {len(have[1])} app(s), not the {len(ledger[1])} the ledger holds")
    return "; ".join(said)


class DriftAudit:
    """See the module docstring."""

    def __init__(self, runtime: ControllerRuntime, service: AllocatorService) -> None:
        self.runtime = runtime
        self.service = service
        self.interval = runtime.settings.drift_check_interval
        self.hypervisor_port = runtime.settings.hypervisor_port
        self.counter = Counter("tfusion_drift", "disagreements the drift audit found (and repaired where it can), "
                               "by kind", ["kind"], registry=runtime.registry)
        #: kind -> disagreements found since this process started (the counter's values)
        self.totals = dict.fromkeys(KINDS, 0)
        for kind in KINDS:
            self.counter.labels(kind)
        self.audits = 0
        self._pending: list[Finding] = []  # caught between audits (hand edits)
        self._recent: list[Finding] = []  # the last MAX_FINDINGS findings of any audit
        #: (kind, object) -> (the disagreement seen, since when): reported once it outlasts `settle`
        self._suspects: dict[tuple[str, str], tuple[str, float]] = {}
        self.settle = 2 * (runtime.settings.sync_interval + FLUSH_INTERVAL_S) + 1.0
        runtime.informer(r.GPUS).add_handler(
            on_update=lambda old, new: self._on_gpu_update(old and Gpu(old), Gpu(new)))
        runtime.add_leader_task(self.run)

    # --- findings -----------------------------------------------------------------------------------

    def _found(self, kind: str, target: Body, message: str, repaired: str) -> Finding:
        """A finding on `target` (an object with its kind, as the Warning event needs it)."""
        self.counter.labels(kind).inc()
        self.totals[kind] += 1
        text = f"{message}; {repaired}" if repaired else message
        self.runtime.events.warning(target, "DriftDetected", text)
        log.warning("drift (%s) on %s %s: %s", kind, target.kind, target.name, text)
        return {"kind": kind, "object": f"{target.kind}/{self._ref(target)}", "message": message,
                "repair": repaired, "at": tfa.now_rfc3339()}

    @staticmethod
    def _ref(target: Body) -> str:
        return f"{target.namespace}/{target.name}" if target.namespace else target.name

    def _persists(self, kind: str, key: str, seen: str, now: set[tuple[str, str]]) -> bool:
        """True when the same disagreement (`seen`) has been there since an audit at least `settle`
        seconds ago: longer than a pending write takes to land (flush, then --sync-interval)."""
        now.add((kind, key))
        clock = anyio.current_time()
        before = self._suspects.get((kind, key))
        if before is None or before[0] != seen:
            self._suspects[(kind, key)] = (seen, clock)
            return False
        if clock - before[1] < self.settle:
            return False
        self._suspects[(kind, key)] = (seen, clock)  # reported: report again only after another settle
        return True

    # --- hand edits, at once ------------------------------------------------------------------------

    def _on_gpu_update(self, old: Gpu | None, new: Gpu) -> None:
        allocator = self.service.allocator
        name = new.name
        if old is None or allocator is None or not knows_gpu(allocator, name):
            return
        before, after, ledger = _gpu_fields(old), _gpu_fields(new), _ledger_fields(allocator, name)
        if after in (before, ledger) or before != ledger:
            return
        gpu = Body({**new.raw, "kind": "GPU", "apiVersion": r.GPUS.api_version})
        self._pending.append(self._found(
            "gpu-status", gpu, f"status.available {after[0]} (ledger: {ledger[0]}), "
            f"{len(after[1])} runningApps (ledger: {len(ledger[1])}) changed by someone else",
            "rewritten from the ledger"))
        if self.service.gpu_status is not None:
            self.service.gpu_status.enqueue(name)

    # --- the periodic audit -------------------------------------------------------------------------

    async def run(self) -> None:
        """Leader-only: audit every `interval` until leadership ends."""
        self._suspects.clear()
        while True:
            await anyio.sleep(self.interval)
            try:
                await self.audit_once()
            except TimeoutError:
                log.info("drift audit skipped: the allocator is still recovering")
            except Exception:
                log.exception("drift audit failed")

    async def audit_once(self) -> DriftReport | None:
        allocator = await self.service.wait_ready()
        if allocator is None:
            return None
        findings, self._pending = self._pending, []
        seen: set[tuple[str, str]] = set()
        findings += await self._audit_gpus(allocator, seen)
        findings += await self._audit_allocations(allocator)
        findings += await self._audit_hypervisors(allocator, seen)
        self._suspects = {k: v for k, v in self._suspects.items() if k in seen}
        if findings:
            self.service.flush()
        self.audits += 1
        counts: dict[str, int] = {}
        for finding in findings:
            counts[finding["kind"]] = counts.get(finding["kind"], 0) + 1
        self._recent = [*self._recent, *findings][-MAX_FINDINGS:]
        result: DriftReport = {"checkedAt": tfa.now_rfc3339(), "audits": self.audits, "found": len(findings),
                               "byKind": counts, "findings": findings[-MAX_FINDINGS:], "recent": list(self._recent),
                               "total": dict(self.totals)}
        self.service.last_drift = result
        return result

    async def _audit_gpus(self, allocator: GpuAllocator, seen: set[tuple[str, str]]) -> list[Finding]:
        found = []
        async for gpu in paced(map(Gpu, self.runtime.informer(r.GPUS).list())):
            name = gpu.name
            if not knows_gpu(allocator, name):
                continue
            have, ledger = _gpu_fields(gpu), _ledger_fields(allocator, name)
            if have == ledger:
                continue
            if self._persists("gpu-status", name, gpu.meta.resource_version, seen):
                found.append(self._found("gpu-status", Body({**gpu.raw, "kind": "GPU"}),
                                         _status_difference(have, ledger),
                                         "rewritten from the ledger"))
                if self.service.gpu_status is not None:
                    self.service.gpu_status.enqueue(name)
        return found

    async def _audit_allocations(self, allocator: GpuAllocator) -> list[Finding]:
        found: list[Finding] = []
        pods = self.runtime.informer(r.PODS)
        async for uid in paced(allocator.committed_uids()):
            info = allocator.allocation(uid)
            if info is None:
                continue  # released since the audit began
            req = info.request
            cached = pods.get(f"{req.namespace}/{req.pod_name}")
            pod = Pod(cached) if cached is not None else None
            if pod is not None and pod.uid == uid and not pod.finished:
                held = self._gpu_ids(pod)
                if held is not None and sorted(held) != sorted(info.gpu_names):
                    found.append(self._found("allocation-gpus", Body({**pod.raw, "kind": "Pod"}),
                                             f"gpu-ids {','.join(held)} but the ledger holds "
                                             f"{','.join(info.gpu_names)} for it", "left for a person to decide"))
                continue
            if not await self._confirmed_gone(req.namespace, req.pod_name, uid):
                continue
            if allocator is self.service.allocator and await self.service.release(uid, "drift"):
                gpu = self.runtime.informer(r.GPUS).get(info.gpu_names[0]) if info.gpu_names else None
                target = Body({**gpu, "kind": "GPU"} if gpu else {"kind": "Pod", "apiVersion": "v1", "metadata": {
                    "name": req.pod_name, "namespace": req.namespace, "uid": uid}})
                found.append(self._found("orphan-allocation", target, f"the ledger held GPUs for pod "
                                         f"{req.namespace}/{req.pod_name} ({uid}), which is gone or finished",
                                         "released"))
        async for pod in paced(map(Pod, pods.list())):
            if not pod.holds_gpus or allocator.has_allocation(pod.uid):
                continue
            current = pods.get(f"{pod.namespace}/{pod.name}")  # the list is older than this turn
            if current is None:
                continue
            pod = Pod(current)
            if not pod.holds_gpus or allocator.has_allocation(pod.uid):
                continue
            finding = self._adopt(allocator, pod)
            if finding is not None:
                found.append(finding)
        return found

    @staticmethod
    def _gpu_ids(pod: Pod) -> tuple[str, ...] | None:
        try:
            return gpu_names(pod)
        except AnnotationError:
            return None

    async def _confirmed_gone(self, namespace: str, name: str, uid: str) -> bool:
        try:
            pod = await self.runtime.client.get(r.PODS, name, namespace=namespace)
        except NotFound:
            return True
        except KubeError as exc:
            log.info("drift audit: cannot read pod %s/%s: %s", namespace, name, exc)
            return False
        found = Pod(pod)
        return found.uid != uid or found.finished

    def _adopt(self, allocator: GpuAllocator, pod: Pod) -> Finding | None:
        try:
            req, names = worker_request(pod, allocator)
        except RequestError:
            return None  # the allocator's feed reports unreadable annotations itself
        if not all(knows_gpu(allocator, g) for g in names):
            return None  # waits for its GPUs to appear (the feed adopts it then)
        skipped = allocator.restore([(req, names)])
        target = Body({**pod.raw, "kind": "Pod"})
        if skipped:
            return self._found("missing-allocation", target, f"holds {','.join(names)} but the ledger had "
                               "nothing for it", f"not adopted: {skipped[0][1]}")
        return self._found("missing-allocation", target, f"holds {','.join(names)} but the ledger had nothing "
                           "for it", "adopted from its annotations")

    async def _audit_hypervisors(self, allocator: GpuAllocator, seen: set[tuple[str, str]]) -> list[Finding]:
        found = []
        placed = allocator.node_workers()
        async with httpx.AsyncClient(timeout=HYPERVISOR_TIMEOUT_S) as http:
            for name, (gpunode, base) in running_hypervisors(self.runtime).items():
                listed = await self._hypervisor_workers(http, base)
                if listed is None:
                    continue
                ledger = set(placed.get(name, {}))
                if listed == ledger:
                    continue
                extra, absent = sorted(listed - ledger), sorted(ledger - listed)
                if self._persists("hypervisor-workers", name, f"{extra}{absent}", seen):
                    found.append(self._found(
                        "hypervisor-workers", Body({**gpunode.raw, "kind": "GPUNode"}),
                        f"the hypervisor lists worker(s) {extra or '-'} the ledger does not place here, and "
                        f"misses {absent or '-'} that it does", "the ledger follows the pods; the hypervisor "
                        "follows them on its own"))
        return found

    @staticmethod
    async def _hypervisor_workers(http: httpx.AsyncClient, base: str) -> set[str] | None:
        try:
            response = await http.get(f"{base}/api/v1/workers")
            if response.status_code != 200:
                return None
            body = response.json()
            return {str(item["WorkerInfo"]["WorkerUID"]) for item in body.get("data") or []
                    if not item["WorkerInfo"].get("DeletedAt")}
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return None
