"""Changing the GPU share of a running worker pod: in place where its isolation mode allows.

Why it exists: a recommendation only saves GPU capacity once the workers that already run give the
difference back (or get more when they need it). New pods get the workload's recommendation from
the webhook; this module moves the running ones. What a change means depends on how the worker's
share is enforced, so each isolation mode (the pod's `isolation` annotation, as the allocator read
it) is handled on its own:

- **soft**: in place. The hypervisor's soft limiter (tfusion/hypervisor/limiter/soft.py) rebuilds a
  worker from its pod on every pod update and, when the device limits differ from what it wrote,
  calls `apply_limits` on the worker's existing shared-memory file: the in-container limiter reads
  the new `mem_limit` and `up_limit` at once; no file is recreated and no process restarts.
- **shared**: in place. Nothing is enforced on the node; the annotations and the ledger change.
- **hard**: not in place: the limits reach the container as environment when it starts. A worker
  that a controller owns (ReplicaSet, StatefulSet, Job, ...; any owner reference with
  `controller: true`) is recreated: the pod is deleted (UID precondition) and its controller makes
  a new one, which gets the workload's recommendation from the webhook, so the caller writes
  `status.recommendation` first. The same capacity and quota dry run as in place must pass first
  (the new size fits where the worker runs now). A worker nothing owns is not deleted: refused.
- **partitioned**: refused: a hardware partition's size is its template's.

In place, in this order: VRAM request and limit are floored at the VRAM the worker uses now (a worker
is never shrunk below its use; the outcome says so); the allocator's `adjust` runs as a dry run
(capacity of every GPU the worker holds, and the namespace's quota); then the pod's request/limit
annotations are patched (the hypervisor follows them); then the ledger is adjusted for real and
the GPUs it changed are handed to the GPU status write-back. A refusal is a Warning event
`ResizeRefused` on the pod naming what is short, with nothing changed; a ledger adjustment that
fails after the patch (the room was taken in between) patches the annotations back. A change
applied is a Normal event `Resized` saying old -> new. Only the leader (which holds the allocator)
resizes; elsewhere the outcome is `NotLeader` and nothing happens.

Outcome reasons: Resized, Recreated, Unchanged, NotLeader, NotAllocated, PodGone, ReadFailed, Partitioned,
NotRecreatable, InsufficientCapacity, QuotaExceeded, InvalidResize, PatchFailed, DeleteFailed. The
refusals come with the ResizeRefused event; NotLeader, PodGone, ReadFailed and Unchanged have none
(no pod to speak of, or nothing to say).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from tfusion.allocator import GpuAllocator
from tfusion.allocator.errors import AllocatorError, InvalidAllocation, QuotaExceeded, Unschedulable
from tfusion.allocator.request import AllocRequest, Resources
from tfusion.allocator.units import percent_str, tflops_str, vram_str
from tfusion.api import annotations as tfa
from tfusion.api.accessors import Body, Pod
from tfusion.kube import resources as r
from tfusion.kube.client import KubeError, NotFound

if TYPE_CHECKING:
    from tfusion.controller.allocation import AllocatorService
    from tfusion.controller.runtime import ControllerRuntime

REFUSED_EVENT = "ResizeRefused"
RESIZED_EVENT = "Resized"
RECREATED_EVENT = "ResizeRecreate"


@dataclass(frozen=True)
class ResizeOutcome:
    """What `WorkerResizer.resize` did: `pod` is namespace/name, `reason` one of the module's
    outcome reasons, `message` one sentence a person can act on."""

    pod: str
    applied: bool
    reason: str
    message: str


def share_text(request: Resources, limit: Resources) -> str:
    """"request 10 TFLOPS/2Gi, limit 20 TFLOPS/4Gi" (compute percent where the share is one)."""
    return f"request {_amounts(request)}, limit {_amounts(limit)}"


def _amounts(res: Resources) -> str:
    compute = f"{percent_str(res.percent)}%" if res.percent and not res.tflops else f"{tflops_str(res.tflops)} TFLOPS"
    return f"{compute}/{vram_str(res.vram)}"


def current_share(req: AllocRequest) -> tuple[Resources, Resources]:
    """The per-GPU request and limit an allocation holds now."""
    return (Resources(req.tflops_request, req.percent_request, req.vram_request),
            Resources(req.tflops_limit, req.percent_limit, req.vram_limit))


def floored(request: Resources, limit: Resources, vram_in_use: int) -> tuple[Resources, Resources]:
    """VRAM request and limit raised to `vram_in_use` (a limit of 0, no limit, stays 0)."""
    new_request = replace(request, vram=max(request.vram, vram_in_use))
    new_limit = replace(limit, vram=max(limit.vram, vram_in_use)) if limit.vram else limit
    return new_request, new_limit


def check_share(request: Resources, limit: Resources, vram_in_use: int) -> None:
    """ValueError naming the field and value when the asked share cannot be meant."""
    for name, value in (("request.tflops", request.tflops), ("request.percent", request.percent),
                        ("request.vram", request.vram), ("limit.tflops", limit.tflops),
                        ("limit.percent", limit.percent), ("limit.vram", limit.vram), ("vram_in_use", vram_in_use)):
        if value < 0:
            raise ValueError(f"resize {name}: {value} is negative (allowed: 0 or more)")
    for side, res in (("request", request), ("limit", limit)):
        if res.tflops and res.percent:
            raise ValueError(f"resize {side}: TFLOPS {res.tflops}m and compute percent {res.percent} both given "
                             "(allowed: one of them)")


def check_readable(request: Resources, limit: Resources) -> None:
    """ValueError unless the pod's annotations will read back as exactly this share (the way
    `request_from_pod` reads them: TFLOPS wins over compute percent, a missing request is its limit)
    and the webhook would accept them (no request above its limit)."""
    if (request.tflops and limit.percent) or (request.percent and limit.tflops):
        raise ValueError("resize: request and limit give compute in different forms (allowed: both TFLOPS or "
                         "both compute percent)")
    for name, asked, ceiling in (("tflops", request.tflops, limit.tflops), ("percent", request.percent, limit.percent),
                                 ("vram", request.vram, limit.vram)):
        if ceiling and asked > ceiling:
            raise ValueError(f"resize request.{name}: {asked} is above limit.{name} {ceiling} "
                             "(allowed: at most the limit, or a limit of 0 for none)")
    if not (request.tflops or request.percent) and (limit.tflops or limit.percent):
        raise ValueError("resize request: no compute with a compute limit reads back as request = limit "
                         "(allowed: a compute request, or no compute limit)")
    if not request.vram and limit.vram:
        raise ValueError("resize request.vram: 0 with a VRAM limit reads back as request = limit "
                         "(allowed: a VRAM request, or no VRAM limit)")


def share_annotations(request: Resources, limit: Resources) -> dict[str, str | None]:
    """The pod annotations that say this share (None removes a key: the compute form not used)."""
    notes: dict[str, str | None] = {tfa.VRAM_REQUEST: vram_str(request.vram),
                                    tfa.VRAM_LIMIT: vram_str(limit.vram) if limit.vram else None}
    if request.percent and not request.tflops:
        notes |= {tfa.COMPUTE_PERCENT_REQUEST: percent_str(request.percent), tfa.TFLOPS_REQUEST: None}
    else:
        notes |= {tfa.TFLOPS_REQUEST: tflops_str(request.tflops), tfa.COMPUTE_PERCENT_REQUEST: None}
    if limit.percent and not limit.tflops:
        notes |= {tfa.COMPUTE_PERCENT_LIMIT: percent_str(limit.percent), tfa.TFLOPS_LIMIT: None}
    elif limit.tflops:
        notes |= {tfa.TFLOPS_LIMIT: tflops_str(limit.tflops), tfa.COMPUTE_PERCENT_LIMIT: None}
    else:
        notes |= {tfa.TFLOPS_LIMIT: None, tfa.COMPUTE_PERCENT_LIMIT: None}
    return notes


def annotations_before(pod: Pod, changed: dict[str, str | None]) -> dict[str, str | None]:
    """What the pod says now for the keys a patch changes (None: the key was absent)."""
    notes = pod.meta.annotations
    return {key: notes.get(key) for key in changed}


class WorkerResizer:
    """Resizes one running worker at a time; see the module docstring."""

    def __init__(self, runtime: ControllerRuntime, service: AllocatorService) -> None:
        self.runtime = runtime
        self.service = service

    async def resize(self, pod: Pod, request: Resources, limit: Resources, *, vram_in_use: int = 0,
                     reason: str = "") -> ResizeOutcome:
        """Give `pod` the per-GPU `request` and `limit`; `reason` (why) goes into the event text.
        Raises ValueError for a share that cannot be meant (negative, TFLOPS and percent both, a
        request above its limit, compute forms mixed: `check_share`, `check_readable`)."""
        check_share(request, limit, vram_in_use)
        ref = f"{pod.namespace}/{pod.name}"
        allocator = self.service.allocator
        if allocator is None:
            return ResizeOutcome(ref, False, "NotLeader", "this replica does not hold the allocator (not the leader)")
        try:
            fresh = Pod(await self.runtime.client.get(r.PODS, pod.name, namespace=pod.namespace))
        except NotFound:
            return ResizeOutcome(ref, False, "PodGone", f"pod {ref} is gone")
        except KubeError as exc:
            return ResizeOutcome(ref, False, "ReadFailed", f"cannot read pod {ref}: {exc}")
        if allocator is not self.service.allocator:
            return ResizeOutcome(ref, False, "NotLeader", "leadership changed while the pod was read")
        if fresh.uid != pod.uid or fresh.finished or fresh.meta.deletion_timestamp:
            return ResizeOutcome(ref, False, "PodGone", f"pod {ref} ({pod.uid}) was replaced, finished or is deleting")
        info = allocator.allocation(pod.uid)
        if info is None or info.assumed:
            return self._refuse(fresh, "NotAllocated", f"the allocator holds no committed allocation for pod {ref}")
        old_request, old_limit = current_share(info.request)
        new_request, new_limit = floored(request, limit, vram_in_use)
        check_readable(new_request, new_limit)
        floor_note = ""
        if (new_request.vram, new_limit.vram) != (request.vram, limit.vram):
            floor_note = f"; VRAM floored at the {vram_str(vram_in_use)} in use"
        why = f" ({reason})" if reason else ""
        change = f"{share_text(old_request, old_limit)} -> {share_text(new_request, new_limit)}{why}{floor_note}"
        if (new_request, new_limit) == (old_request, old_limit):
            now = share_text(old_request, old_limit)
            return ResizeOutcome(ref, False, "Unchanged", f"pod {ref} already runs with {now}{floor_note}")
        isolation = info.request.isolation
        if isolation == tfa.ISOLATION_PARTITIONED:
            return self._refuse(fresh, "Partitioned", f"{change}: a hardware partition's size is its template's; "
                                                      "it cannot be resized")
        refused = self._dry_run(allocator, fresh, new_request, new_limit, change)
        if refused is not None:
            return refused
        if isolation == tfa.ISOLATION_HARD:
            return await self._recreate(fresh, change)
        return await self._in_place(allocator, fresh, new_request, new_limit, change)

    # --- steps ------------------------------------------------------------------------------------

    def _dry_run(self, allocator: GpuAllocator, pod: Pod, request: Resources, limit: Resources,
                 change: str) -> ResizeOutcome | None:
        try:
            allocator.adjust(pod.uid, request, limit, dry_run=True)
        except QuotaExceeded as exc:
            return self._refuse(pod, "QuotaExceeded", f"{change}: {exc.message}")
        except Unschedulable as exc:
            return self._refuse(pod, "InsufficientCapacity", f"{change}: {exc.message}")
        except InvalidAllocation as exc:
            return self._refuse(pod, "InvalidResize", f"{change}: {exc}")
        return None

    async def _in_place(self, allocator: GpuAllocator, pod: Pod, request: Resources, limit: Resources,
                        change: str) -> ResizeOutcome:
        ref = f"{pod.namespace}/{pod.name}"
        notes = share_annotations(request, limit)
        before = annotations_before(pod, notes)
        try:
            await self._patch(pod, notes)
        except KubeError as exc:
            return self._refuse(pod, "PatchFailed", f"{change}: cannot patch the pod's annotations: {exc}")
        try:
            if allocator is not self.service.allocator:
                raise InvalidAllocation("leadership changed during the resize")
            allocator.adjust(pod.uid, request, limit)
        except AllocatorError as exc:
            undone = await self._undo(pod, before)
            code = "QuotaExceeded" if isinstance(exc, QuotaExceeded) else "InsufficientCapacity" \
                if isinstance(exc, Unschedulable) else "InvalidResize"
            return self._refuse(pod, code, f"{change}: {getattr(exc, 'message', exc)}; {undone}")
        self.service.flush()
        self.runtime.events.normal(self._target(pod), RESIZED_EVENT, f"resized in place: {change}")
        return ResizeOutcome(ref, True, "Resized", f"pod {ref} resized in place: {change}")

    async def _recreate(self, pod: Pod, change: str) -> ResizeOutcome:
        ref = f"{pod.namespace}/{pod.name}"
        owner = pod.meta.controller_ref()
        if owner is None:
            return self._refuse(pod, "NotRecreatable", f"{change}: isolation hard fixes the limits when the "
                                                       "container starts, and no controller owns the pod to "
                                                       "recreate it")
        try:
            await self.runtime.client.delete(r.PODS, pod.name, namespace=pod.namespace,
                                             preconditions={"uid": pod.uid})
        except KubeError as exc:
            return self._refuse(pod, "DeleteFailed", f"{change}: cannot delete the pod to recreate it: {exc}")
        by = f"{owner.get('kind', '')}/{owner.get('name', '')}"
        self.runtime.events.normal(self._target(pod), RECREATED_EVENT,
                                   f"isolation hard: deleted for {by} to recreate it with the new size: {change}")
        return ResizeOutcome(ref, True, "Recreated", f"pod {ref} (isolation hard) deleted for {by} to recreate "
                                                     f"it: {change}")

    async def _patch(self, pod: Pod, notes: dict[str, str | None]) -> None:
        await self.runtime.client.patch(r.PODS, pod.name, {"metadata": {"annotations": notes}},
                                        namespace=pod.namespace)

    async def _undo(self, pod: Pod, before: dict[str, str | None]) -> str:
        try:
            await self._patch(pod, before)
        except KubeError as exc:
            return f"patching the annotations back failed too: {exc}"
        return "the annotations were patched back"

    def _refuse(self, pod: Pod, code: str, message: str) -> ResizeOutcome:
        ref = f"{pod.namespace}/{pod.name}"
        self.runtime.events.warning(self._target(pod), REFUSED_EVENT, f"resize refused ({code}): {message}")
        return ResizeOutcome(ref, False, code, f"pod {ref}: resize refused: {message}")

    @staticmethod
    def _target(pod: Pod) -> Body:
        return Body({**pod.raw, "kind": "Pod", "apiVersion": "v1"})
