"""Pod reconciler: the one place that releases what a pod holds, and only then lets its finalizer go.

- A worker pod (label `tensor-fusion.ai/component=worker`) carries the finalizer
  `tensor-fusion.ai/finalizer` while it lives: the pod webhook sets it at admission (render.py),
  and this reconciler adds it to a worker that came without it (created past the webhook).
- When it finishes (Succeeded/Failed) or is being deleted, `AllocatorService.release` frees what it
  holds: its GPUs in the ledger and, through the release hooks, its pod index, its host port and
  its billing. A deleted worker's finalizer is removed after that. Releasing is idempotent against
  the ledgers themselves (the allocator's, the index and port allocators'): a second reconcile of
  the same pod finds nothing held and changes nothing, so no set of released UIDs is kept here.
- A pod that leaves this reconciler's informer (its key has no cached pod) was deleted or lost its
  `component` label. What it held is found in the ledger (the GPU allocations under its name) and
  in the tombstone its deletion left (its UID: a pod that never carried our finalizer, e.g. one
  created before the controller ran, may hold an index or port and no GPU). The pod is then read
  from the API server: gone, finished, being deleted, or replaced by another UID -> released (and
  our finalizer removed from a pod we will not see again); still running without its label -> kept
  held, a Warning event `WorkerLabelRemoved` says so, and it is looked at again every
  `LABEL_RECHECK_S`. The informer's delete handler only records the tombstone and wakes the
  reconciler. Tombstones are a hint, not state: after a restart every ledger is rebuilt from the
  pods that exist, so a pod deleted before then holds nothing anywhere.
- `tensor-fusion.ai/pending-owned-workload: <workload>` (the webhook's request) makes the pod the
  controlling owner of that TensorFusionWorkload in its namespace. The annotation stays: whether
  the request is met is read from the workload's ownerReferences (the original removes it, one more
  write per bare pod that nothing reads). With `pending-owned-workload-spec` (a bare local pod: the
  webhook writes no workload for it) the workload is created as that annotation says, owned by the
  pod, or brought to it and taken over when one of its name is there; one being deleted is waited
  for (webhook/workloads.py). Without it (a remote client, whose workload the webhook created), a
  workload that does not exist yet is looked for again when it reaches the cache, or in a few
  seconds (a Warning event says so once the pod is older than that).
- Writes per new worker, as few as the protocol allows: none to a pod the webhook admitted (its
  finalizer is already there); a worker without the finalizer gets it in one strategic merge patch
  (no resourceVersion, so the scheduler's Binding does not make it conflict); a bare local pod's
  workload is one create, owned and with our finalizer; a remote client's adoption is one merge
  patch of the workload that also drops its awaiting-pod mark (webhook/workloads.py).
- A remote vGPU client pod (label `tensor-fusion.ai/component=client`) gets its
  TensorFusionConnection: named as the webhook's `TENSOR_FUSION_CONNECTION_NAME` says, for the
  workload of its `selected-workload` annotation, owned (controller) by the pod, so that it goes
  with the pod. A client pod holds no GPU, so it carries no finalizer of ours (a stray one is
  removed); a host port it holds is released when it finishes or goes.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections import OrderedDict
from typing import TYPE_CHECKING

import orjson

from tfusion.api import annotations as tfa
from tfusion.api.accessors import Body, Pod
from tfusion.api.jsontypes import JsonMapping, JsonObject, json_object
from tfusion.api.timestamps import parse_rfc3339
from tfusion.controller.reconcilers.common import FINALIZER, controlled_by
from tfusion.controller.runtime import component_selector
from tfusion.controller.webhook.remote import connection_of
from tfusion.controller.webhook.workloads import AWAITING_POD, WorkloadWriter
from tfusion.kube import resources as r
from tfusion.kube.client import AlreadyExists, KubeError, NotFound
from tfusion.kube.ownership import controller_reference, with_controller
from tfusion.kube.reconciler import Result, ensure_finalizer, set_finalizers

if TYPE_CHECKING:
    from tfusion.controller.allocation import AllocatorService
    from tfusion.controller.runtime import ControllerRuntime

log = logging.getLogger(__name__)

WORKLOAD_RETRY_S = 3.0
#: how soon a bare pod's workload the API server refused (a quota, a namespace being deleted) is tried again
WORKLOAD_REFUSED_RETRY_S = 30.0
#: how often a worker that lost its component label (and so left the informer) is read again
LABEL_RECHECK_S = 30.0
#: pods by the workload their pending-owned-workload annotation names ("namespace/workload")
PENDING_INDEX = "pending-owned-workload"
#: tombstones kept at most (oldest dropped first); each is consumed by the reconcile it wakes
TOMBSTONES_MAX = 10_000


class PodReconciler:
    """See the module docstring. Key: "namespace/name"."""

    def __init__(self, runtime: ControllerRuntime, allocation: AllocatorService) -> None:
        self.runtime = runtime
        self.allocation = allocation
        #: pods whose GPUs this reconciler released (the ledger held some), since the process started
        self.releases = 0
        #: how often a worker out of the informer but still running is read again (tests shorten it)
        self.label_recheck_s = LABEL_RECHECK_S
        #: key -> UID of the last pod deleted from the informer under it (see the module docstring)
        self._tombstones: OrderedDict[str, str] = OrderedDict()
        # a bare pod waits for its workload's arrival in the cache (its own watch stream, which
        # may lag the pods'); the workload's add wakes it at once
        self.controller = runtime.manager.controller("pod") \
            .for_(r.PODS, label_selector=component_selector(runtime.settings)) \
            .watches(r.TENSORFUSIONWORKLOADS, self._adopters) \
            .complete(self)
        self.pods = runtime.informer(r.PODS)
        self.pods.add_index(PENDING_INDEX, _pending_workload)
        self.pods.add_handler(on_delete=lambda obj: self._on_delete(Pod(obj)))
        self.workloads = runtime.informer(r.TENSORFUSIONWORKLOADS)
        #: bare pods' workloads: their creation, and this reconciler's own writes until the cache has them
        self.writer = WorkloadWriter(runtime.client, self.workloads)
        self.connections = runtime.informer(r.TENSORFUSIONCONNECTIONS)

    def _adopters(self, workload: JsonMapping) -> list[str]:
        """The pods still to adopt this workload: those that ask to and are not its controller yet
        (so the workload's own status writes wake no pod)."""
        body = Body(workload)
        return [_key(pod) for pod in map(Body, self.pods.by_index(PENDING_INDEX, _key(body)))
                if not controlled_by(body, pod.uid)]

    def _on_delete(self, pod: Pod) -> None:
        """Remember the UID the deleted key had, and wake the reconciler; nothing is released here."""
        if not pod.uid or not self.runtime.is_leader:
            return
        key = f"{pod.namespace}/{pod.name}"
        self._tombstones[key] = pod.uid
        self._tombstones.move_to_end(key)
        while len(self._tombstones) > TOMBSTONES_MAX:
            self._tombstones.popitem(last=False)
        self.controller.enqueue(key)

    async def reconcile(self, key: str) -> Result | None:
        service = self.allocation
        if await service.wait_ready() is None:
            return None  # not the leader (any more)
        cached = self.pods.get(key)
        if cached is None:
            return await self._absent(service, key)
        pod = Pod(cached)
        tomb = self._tombstones.pop(key, None)
        if tomb and tomb != pod.uid:  # replaced by a pod of the same name
            await self._release(service, tomb, "replaced")
        result = await self._adopt_workload(pod)
        if pod.is_client:
            await self._client(pod)
        if pod.finished or pod.meta.deleting:
            await self._release(service, pod.uid, "finished" if pod.finished else "deleted")
        if pod.is_worker and pod.meta.deleting:
            await ensure_finalizer(self.runtime.client, r.PODS, pod, FINALIZER, _released_already)
        if pod.is_worker and not pod.meta.deleting and FINALIZER not in pod.meta.finalizers:
            await self._add_finalizer(pod)
        return result

    async def _add_finalizer(self, pod: Pod) -> None:
        """Our finalizer on a live worker: a strategic merge patch, which adds it to the pod's set
        without a resourceVersion, so the Binding written meanwhile does not make it conflict (a PUT
        on the cached version would, for nearly every new pod)."""
        # the UID precondition: a pod created again under this name is not this pod
        meta: JsonObject = {"finalizers": [FINALIZER], "uid": pod.uid}
        try:
            await self.runtime.client.patch(r.PODS, pod.name, {"metadata": meta}, namespace=pod.namespace,
                                            patch_type="strategic")
        except NotFound:
            pass

    async def _absent(self, service: AllocatorService, key: str) -> Result | None:
        """The key has no cached pod: release what the ledger and the tombstone say it held, once
        the API server confirms that the pod no longer runs (see the module docstring)."""
        namespace, _, name = key.partition("/")
        uids = set(service.held_by(namespace, name))
        tomb = self._tombstones.get(key)
        if tomb:
            uids.add(tomb)
        if not uids:
            return None
        try:
            found = Pod(await self.runtime.client.get(r.PODS, name, namespace=namespace))
        except NotFound:
            found = None
        running = found is not None and found.uid in uids and not (found.finished or found.meta.deleting)
        for uid in sorted(uids):
            if not (running and found is not None and uid == found.uid):
                await self._release(service, uid, "vanished")
        if running and found is not None:
            self.runtime.events.warning(found, "WorkerLabelRemoved", f"left the pods labelled "
                                        f"{component_selector(self.runtime.settings)} while it runs; what it "
                                        "holds stays held until it finishes or is deleted")
            return Result(requeue_after=self.label_recheck_s)
        self._tombstones.pop(key, None)
        if found is not None and found.uid in uids and FINALIZER in found.meta.finalizers:
            await self._drop_finalizer(found)  # out of our informer: we would not see its deletion again
        return None

    async def _release(self, service: AllocatorService, uid: str, reason: str) -> None:
        if await service.release(uid, reason):
            self.releases += 1
            log.info("pod %s: released what it held (%s)", uid, reason)

    async def _drop_finalizer(self, pod: Pod) -> None:
        finalizers = [f for f in pod.meta.finalizers if f != FINALIZER]
        try:  # a patch, not a PUT of the cached pod, which lacks what the cache does not keep
            await set_finalizers(self.runtime.client, r.PODS, pod, finalizers)
        except NotFound:
            pass

    async def _client(self, pod: Pod) -> None:
        """A client pod's connection (see the module docstring)."""
        if FINALIZER in pod.meta.finalizers:
            await self._drop_finalizer(pod)
        name = connection_of(pod)
        namespace = pod.namespace
        if not name or pod.meta.deleting or self.connections.get(f"{namespace}/{name}"):
            return
        workload = pod.meta.annotation(tfa.SELECTED_WORKLOAD) or ""
        labels = {tfa.WORKLOAD: workload} if workload and len(workload) <= 63 else {}
        connection = {
            "apiVersion": r.TENSORFUSIONCONNECTIONS.api_version, "kind": r.TENSORFUSIONCONNECTIONS.kind,
            "metadata": {"name": name, "namespace": namespace, "labels": labels,
                         "ownerReferences": [controller_reference(pod, r.PODS)]},
            "spec": {"workloadName": workload, "clientPod": pod.name}}
        try:
            await self.runtime.client.create(r.TENSORFUSIONCONNECTIONS, connection, namespace=namespace)
        except AlreadyExists:
            return
        self.runtime.events.normal(pod, "ConnectionCreated", f"TensorFusionConnection {name} created for "
                                   f"workload {workload}")

    async def _adopt_workload(self, pod: Pod) -> Result | None:
        """The pod made the controlling owner of the workload its pending-owned-workload annotation
        names. With the webhook's pending-owned-workload-spec (a bare local pod): the workload
        created so, or brought up to that spec and taken over when one of its name is there. Else
        (a remote client's workload, which the webhook created): one write that also drops the
        workload's awaiting-pod mark (its pod exists now) and, for a workload created before the
        webhook stamped it, adds our finalizer. Nothing is written once the workload names the pod
        as its controller."""
        workload_name = pod.meta.annotation(tfa.PENDING_OWNED_WORKLOAD)
        if not workload_name:
            return None
        namespace = pod.namespace
        workload = self.writer.current(f"{namespace}/{workload_name}")
        if workload is not None and controlled_by(Body(workload), pod.uid):
            return None
        spec = pod.meta.annotation(tfa.PENDING_OWNED_WORKLOAD_SPEC)
        if spec is not None:
            return None if pod.meta.deleting else await self._create_workload(pod, workload_name, spec)
        if workload is None:
            if _age_s(pod) > WORKLOAD_RETRY_S:  # not the cache's lag behind a pod just admitted
                self.runtime.events.warning(pod, "WorkloadNotFound", f"TensorFusionWorkload {workload_name} "
                                            f"does not exist (yet); it is to be owned by this pod")
            return Result(requeue_after=WORKLOAD_RETRY_S)
        owner = controller_reference(pod, r.PODS)
        meta = Body(workload).meta
        refs = meta.owner_references
        if owner not in refs:
            patch: JsonObject = {"resourceVersion": meta.resource_version,
                                 "ownerReferences": [*with_controller(refs, json_object(owner))],
                                 "annotations": {AWAITING_POD: None}}
            if FINALIZER not in meta.finalizers and not meta.deleting:
                patch["finalizers"] = [*meta.finalizers, FINALIZER]
            await self.runtime.client.patch(r.TENSORFUSIONWORKLOADS, workload_name, {"metadata": patch},
                                            namespace=namespace)
        return None

    async def _create_workload(self, pod: Pod, name: str, spec: str) -> Result | None:
        """The workload the webhook decided on (`spec`: pending-owned-workload-spec), owned by the
        pod from the start; a refusal is the pod's Warning event, tried again in a while."""
        try:
            desired = owned_workload(pod, name, spec)
            await self.writer.ensure(desired)
        except ValueError as exc:
            self.runtime.events.warning(pod, "WorkloadNotCreated", f"{tfa.PENDING_OWNED_WORKLOAD_SPEC}: {exc}")
            return None
        except KubeError as exc:
            if exc.code >= 500:
                raise
            self.runtime.events.warning(pod, "WorkloadNotCreated", f"TensorFusionWorkload {name} was refused: {exc}")
            return Result(requeue_after=WORKLOAD_REFUSED_RETRY_S)
        return None


def owned_workload(pod: Pod, name: str, spec: str) -> JsonObject:
    """The TensorFusionWorkload `name` of a bare pod, from the webhook's pending-owned-workload-spec
    (labels, annotations, spec), controlled by the pod; ValueError when the annotation is not that."""
    try:
        found = orjson.loads(spec)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc})") from None
    parts = found if isinstance(found, dict) else {}
    if not all(isinstance(parts.get(k), dict) for k in ("labels", "annotations", "spec")):
        raise ValueError("not an object of labels, annotations and spec")
    owner = json_object(controller_reference(pod, r.PODS))
    meta: JsonObject = {"name": name, "namespace": pod.namespace, "labels": parts["labels"],
                        "annotations": parts["annotations"], "ownerReferences": [owner]}
    return {"apiVersion": r.TENSORFUSIONWORKLOADS.api_version, "kind": r.TENSORFUSIONWORKLOADS.kind,
            "metadata": meta, "spec": parts["spec"]}


def _key(obj: Body) -> str:
    return f"{obj.namespace}/{obj.name}"


def _pending_workload(raw: JsonMapping) -> list[str]:
    """"namespace/workload" of the workload a pod asks to own (the PENDING_INDEX)."""
    pod = Body(raw)
    name = pod.meta.annotation(tfa.PENDING_OWNED_WORKLOAD)
    return [f"{pod.namespace}/{name}"] if name else []


def _age_s(pod: Pod) -> float:
    try:
        created = parse_rfc3339(pod.meta.creation_timestamp)
    except ValueError:
        return float("inf")
    return (dt.datetime.now(dt.UTC) - created).total_seconds()


async def _released_already(_pod: object) -> bool:
    """The finalizer's cleanup: `reconcile` released the deleting pod just before, so it may go."""
    return True

