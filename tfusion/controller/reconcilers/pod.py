"""Worker pod reconciler: what a worker holds is released exactly once, and only then does its finalizer go.

- A worker pod (label `tensor-fusion.ai/component=worker`) gets the finalizer
  `tensor-fusion.ai/finalizer` while it lives.
- When it finishes (Succeeded/Failed), is being deleted, or vanishes without us seeing its
  deletion, its GPUs are released through the allocator (`release_pod(uid, reason)`) and every
  release hook runs (its pod index and host port: `release_hooks`, see below) — once per pod UID:
  a UID released before is not released again. A deleted pod's finalizer is removed after that.
- `tensor-fusion.ai/pending-owned-workload: <workload>` (the webhook's request) makes the pod the
  controlling owner of that TensorFusionWorkload in its namespace; the annotation is then removed.
  A workload that does not exist yet is looked for again in a few seconds (a Warning event says so).
- A remote vGPU client pod (label `tensor-fusion.ai/component=client`) gets its
  TensorFusionConnection: named as the webhook's `TENSOR_FUSION_CONNECTION_NAME` says, for the
  workload of its `selected-workload` annotation, owned (controller) by the pod, so that it goes
  with the pod. A client pod holds no GPU, so it carries no finalizer of ours (a stray one is removed).

Release hooks: `PodReconciler.release_hooks` holds the index and host-port allocators' release
(`Assignments.release_pod`, wired by `register_reconcilers`): each is `async def hook(pod) ->
None`, called once per released pod (a hook that raises keeps the finalizer and retries the pod,
hooks must therefore be idempotent).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from tfusion.api import annotations as tfa
from tfusion.controller.reconcilers.common import (
    FINALIZER,
    Obj,
    annotations_of,
    labels_of,
    meta,
    name_of,
    status_of,
)
from tfusion.controller.role import component_selector
from tfusion.controller.webhook.remote import connection_of
from tfusion.kube import resources as r
from tfusion.kube.client import AlreadyExists, NotFound, object_key
from tfusion.kube.reconciler import Result, ensure_finalizer

if TYPE_CHECKING:
    from tfusion.controller.role import ControllerRuntime

log = logging.getLogger(__name__)

FINISHED = ("Succeeded", "Failed")
WORKLOAD_RETRY_S = 3.0

ReleaseHook = Callable[[Obj], Awaitable[None]]


def is_worker(pod: Obj) -> bool:
    return labels_of(pod).get(tfa.COMPONENT) == tfa.COMPONENT_WORKER


def is_client(pod: Obj) -> bool:
    return labels_of(pod).get(tfa.COMPONENT) == tfa.COMPONENT_CLIENT


class PodReconciler:
    """See the module docstring. Key: "namespace/name"."""

    def __init__(self, runtime: ControllerRuntime) -> None:
        self.runtime = runtime
        self.release_hooks: list[ReleaseHook] = []
        #: key -> UID of the worker pods seen, so that one that vanishes is still released by UID
        self._seen: dict[str, str] = {}
        #: UIDs already released (forgotten once the pod is gone)
        self._released: set[str] = set()
        self.releases = 0
        self.controller = runtime.manager.controller("pod") \
            .for_(r.PODS, label_selector=component_selector(runtime.settings)).complete(self)
        self.pods = runtime.informer(r.PODS)
        self.workloads = runtime.informer(r.TENSORFUSIONWORKLOADS)
        self.connections = runtime.informer(r.TENSORFUSIONCONNECTIONS)

    async def reconcile(self, key: str) -> Result | None:
        service = self.runtime.allocation
        if service is None or await service.wait_ready() is None:
            return None  # not the leader (any more)
        pod = self.pods.get(key)
        if pod is None:
            uid = self._seen.pop(key, "")
            await self._release_once(uid, None, "vanished")
            self._released.discard(uid)
            return None
        result = await self._adopt_workload(pod)
        if is_client(pod):
            await self._client(pod)
            return result
        if not is_worker(pod):
            return result
        uid = str(meta(pod).get("uid") or "")
        old_uid = self._seen.get(key)
        if old_uid and old_uid != uid:  # replaced by a pod of the same name
            await self._release_once(old_uid, None, "replaced")
            self._released.discard(old_uid)
        self._seen[key] = uid
        if status_of(pod).get("phase") in FINISHED:
            await self._release_once(uid, pod, "finished")
        elif meta(pod).get("deletionTimestamp"):
            await self._release_once(uid, pod, "deleted")
        await ensure_finalizer(self.runtime.client, r.PODS, pod, FINALIZER, self._cleanup)
        return result

    async def _client(self, pod: Obj) -> None:
        """A client pod's connection (see the module docstring)."""
        finalizers = list(meta(pod).get("finalizers") or [])
        if FINALIZER in finalizers:
            finalizers.remove(FINALIZER)
            await self.runtime.client.replace(r.PODS, {**pod, "metadata": {**meta(pod), "finalizers": finalizers}},
                                              namespace=meta(pod).get("namespace"))
        name = connection_of(pod)
        namespace = str(meta(pod).get("namespace") or "")
        if not name or meta(pod).get("deletionTimestamp") or self.connections.get(f"{namespace}/{name}"):
            return
        workload = annotations_of(pod).get(tfa.SELECTED_WORKLOAD, "")
        labels = {tfa.WORKLOAD: workload} if workload and len(workload) <= 63 else {}
        connection = {
            "apiVersion": r.TENSORFUSIONCONNECTIONS.api_version, "kind": r.TENSORFUSIONCONNECTIONS.kind,
            "metadata": {"name": name, "namespace": namespace, "labels": labels, "ownerReferences": [
                {"apiVersion": "v1", "kind": "Pod", "name": name_of(pod), "uid": str(meta(pod).get("uid") or ""),
                 "controller": True, "blockOwnerDeletion": True}]},
            "spec": {"workloadName": workload, "clientPod": name_of(pod)}}
        try:
            await self.runtime.client.create(r.TENSORFUSIONCONNECTIONS, connection, namespace=namespace)
        except AlreadyExists:
            return
        self.runtime.events.normal(pod, "ConnectionCreated", f"TensorFusionConnection {name} created for "
                                   f"workload {workload}")

    async def _cleanup(self, pod: Obj) -> bool:
        await self._release_once(str(meta(pod).get("uid") or ""), pod, "deleted")
        return True

    async def _release_once(self, uid: str, pod: Obj | None, reason: str) -> None:
        """Release the pod's GPUs and run the hooks, unless this UID was released before."""
        if not uid or uid in self._released:
            return
        service = self.runtime.allocation
        assert service is not None
        if pod is not None:
            for hook in self.release_hooks:
                await hook(pod)  # raises: retried, not marked released
        if service.release_pod(uid, reason):
            log.info("worker pod %s (%s): released its GPUs (%s)", object_key(pod) if pod else uid, uid, reason)
        self._released.add(uid)
        self.releases += 1

    async def _adopt_workload(self, pod: Obj) -> Result | None:
        workload_name = annotations_of(pod).get(tfa.PENDING_OWNED_WORKLOAD)
        if not workload_name:
            return None
        namespace = str(meta(pod).get("namespace") or "")
        workload = self.workloads.get(f"{namespace}/{workload_name}")
        if workload is None:
            self.runtime.events.warning(pod, "WorkloadNotFound", f"TensorFusionWorkload {workload_name} does not "
                                        f"exist (yet); it is to be owned by this pod")
            return Result(requeue_after=WORKLOAD_RETRY_S)
        owner = {"apiVersion": "v1", "kind": "Pod", "name": name_of(pod), "uid": str(meta(pod).get("uid") or ""),
                 "controller": True, "blockOwnerDeletion": True}
        owners = [o for o in meta(workload).get("ownerReferences") or [] if not o.get("controller")]
        if owner not in (meta(workload).get("ownerReferences") or []):
            await self.runtime.client.replace(r.TENSORFUSIONWORKLOADS, {
                **workload, "metadata": {**meta(workload), "ownerReferences": [*owners, owner]}}, namespace=namespace)
        try:
            await self.runtime.client.patch(r.PODS, name_of(pod), {"metadata": {"annotations": {
                tfa.PENDING_OWNED_WORKLOAD: None}}}, namespace=namespace)
        except NotFound:
            pass
        return None
