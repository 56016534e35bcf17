"""What the Deployment, ReplicaSet and Job controllers share: reading pods and owners, and making pods.

Why it exists: all three keep pods (or ReplicaSets) that carry a controller ownerReference to them,
so finding what an owner owns, building a pod from a template, ranking pods for deletion,
writing conditions and kube's "expectations" (wait until our own creates and deletes show up in
the cache before acting again, so a lagging cache never doubles the pods) are written once here.
`Workbench` holds the client, the informers and the expectations the three controllers share.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from typing import NotRequired, TypedDict

from tfusion.api.accessors import Body, Pod, section
from tfusion.api.jsontypes import JsonMapping, JsonObject, json_copy, json_object
from tfusion.api.timestamps import parse_rfc3339
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient, KubeError, NotFound
from tfusion.kube.informer import Informer
from tfusion.kube.manager import Manager
from tfusion.kube.ownership import controller_reference
from tfusion.kube.resources import ApiResource

OWNER_INDEX = "workloads:controller-uid"
#: at most this many pods are created or deleted by one reconcile (kube's burstReplicas)
BURST = 500
#: how long a controller waits for its own creates/deletes to reach its cache before it acts anyway
EXPECTATION_TIMEOUT_S = 30.0


def controller_uid(obj: Body) -> list[str]:
    """The uid of the object's controlling owner (the owner index's key)."""
    return [str(ref["uid"]) for ref in obj.meta.owner_references if ref.get("controller") and ref.get("uid")]


class WorkloadCondition(TypedDict):
    """A workload condition as these controllers write it (Deployments' also carry lastUpdateTime)."""
    type: str
    status: str
    reason: str
    message: str
    lastTransitionTime: str
    lastUpdateTime: NotRequired[str]


def is_active(pod: Pod) -> bool:
    return not pod.finished and not pod.meta.deleting


def is_ready(pod: Pod) -> bool:
    ready = pod.condition("Ready")
    return pod.phase == "Running" and ready is not None and ready.get("status") == "True"


def since(stamp: object) -> float | None:
    """The epoch seconds of an RFC 3339 stamp; None when absent or malformed."""
    try:
        return parse_rfc3339(str(stamp)).timestamp()
    except (TypeError, ValueError):
        return None


def available_in(pod: Pod, min_ready_s: int, now: float) -> float | None:
    """0 when the pod is available (ready for min_ready_s), else seconds until it is (None: not ready)."""
    if not is_ready(pod):
        return None
    if min_ready_s <= 0:
        return 0.0
    ready = pod.condition("Ready")
    stamp = since(ready.get("lastTransitionTime")) if ready is not None else None
    return 0.0 if stamp is None else max(0.0, stamp + min_ready_s - now)


def pod_from_template(owner: Body, resource: ApiResource) -> JsonObject:
    """A pod of `owner` (generateName `<owner>-`), as kube's controllers build one from its `spec.template`."""
    template = section(owner.spec, "template")
    template_meta = section(template, "metadata")
    meta: JsonObject = {"generateName": f"{owner.name}-", "namespace": owner.namespace or None,
                        "labels": json_object(section(template_meta, "labels")),
                        "ownerReferences": [json_object(controller_reference(owner, resource))]}
    for field in ("annotations", "finalizers"):
        if template_meta.get(field):
            meta[field] = json_copy(template_meta[field])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": json_object(section(template, "spec"))}


def deletion_rank(pod: Pod) -> tuple[int, int, int, float]:
    """Sort key, first deleted first: unscheduled, pending, not ready, then the newest."""
    phase_rank = {"Pending": 0, "Unknown": 1, "Running": 2}.get(pod.phase, 0)
    return (1 if pod.node_name else 0, phase_rank, 1 if is_ready(pod) else 0, -created_at(pod))


def replicas_of(obj: Body) -> int:
    """`spec.replicas`, 1 when unset (the API server's default)."""
    value = obj.spec.get("replicas")
    return 1 if value is None else int(value)


def status_int(obj: Body, key: str) -> int:
    return int(obj.status.get(key) or 0)


def created_at(obj: Body) -> float:
    return since(obj.meta.creation_timestamp) or 0.0


def set_condition(conditions: Sequence[JsonMapping], kind: str, status: str, reason: str, message: str,
                  now: str, *, update_time: bool = False) -> list[JsonObject]:
    """Replace the condition of `kind`; lastTransitionTime moves only when the status changes."""
    old = next((c for c in conditions if c.get("type") == kind), None)
    changed = old is None or old.get("status") != status
    moved = now if old is None or changed else _stamp(old, "lastTransitionTime", now)
    condition: WorkloadCondition = {"type": kind, "status": status, "reason": reason, "message": message,
                            "lastTransitionTime": moved}
    if update_time:
        unchanged = old is not None and not changed and old.get("reason") == reason and old.get("message") == message
        condition["lastUpdateTime"] = _stamp(old, "lastUpdateTime", now) if old is not None and unchanged else now
    return [json_object(c) for c in conditions if c.get("type") != kind] + [json_object(condition)]


def _stamp(condition: JsonMapping, key: str, default: str) -> str:
    """A condition's time stamp as written (the default where it has none)."""
    value = condition.get(key, default)
    return value if isinstance(value, str) else default


class Expectations:
    """Pods a controller created or deleted that its cache has not shown yet, per owner key."""

    def __init__(self) -> None:
        self._pending: dict[str, tuple[set[str], set[str], float]] = {}

    def expect(self, key: str, created: Iterable[str] = (), deleted: Iterable[str] = ()) -> None:
        creates, deletes = set(created), set(deleted)
        if creates or deletes:
            self._pending[key] = (creates, deletes, time.monotonic() + EXPECTATION_TIMEOUT_S)

    def satisfied(self, key: str, present: set[str]) -> bool:
        entry = self._pending.get(key)
        if entry is None:
            return True
        creates, deletes, deadline = entry
        creates -= present
        deletes &= present
        if (creates or deletes) and time.monotonic() < deadline:
            return False
        del self._pending[key]
        return True

    def forget(self, key: str) -> None:
        self._pending.pop(key, None)


class Workbench:
    """The client, informers and expectations the three controllers share, and their pod writes."""

    def __init__(self, manager: Manager) -> None:
        self.manager = manager
        self.client: KubeClient = manager.client
        cache = manager.cache
        self.deployments = cache.informer(r.DEPLOYMENTS)
        self.replicasets = cache.informer(r.REPLICASETS)
        self.jobs = cache.informer(r.JOBS)
        # the shared pod informer (the simulated kubelet's and the controller's too): always filtered
        self.pods = cache.informer(r.PODS)
        for informer in (self.pods, self.replicasets):
            informer.add_index(OWNER_INDEX, lambda obj: controller_uid(Body(obj)))
        self.expectations = Expectations()

    @staticmethod
    def _owned(informer: Informer, owner: Body) -> Iterator[Body]:
        owned = map(Body, informer.by_index(OWNER_INDEX, owner.uid))
        return (obj for obj in owned if obj.namespace == owner.namespace)

    def pods_of(self, owner: Body) -> list[Pod]:
        return [Pod(obj.raw) for obj in self._owned(self.pods, owner)]

    def replicasets_of(self, owner: Body) -> list[Body]:
        return list(self._owned(self.replicasets, owner))

    def event(self, obj: Body, reason: str, message: str, *, warning: bool = False) -> None:
        if self.manager.events is None:
            return
        if warning:
            self.manager.recorder.warning(obj, reason, message)
        else:
            self.manager.recorder.normal(obj, reason, message)

    async def write_status(self, resource: ApiResource, obj: Body, status: JsonObject) -> None:
        if status == obj.status:
            return
        body: JsonMapping = {**obj.raw, "status": status}
        try:
            await self.client.replace(resource, body, subresource="status")
        except NotFound:
            pass  # deleted meanwhile

    async def create_pods(self, owner: Body, resource: ApiResource, count: int) -> str | None:
        """Create `count` pods from the owner's template; the error message of the first failed create
        (then it stops)."""
        created: list[str] = []
        failure = None
        for _ in range(min(count, BURST)):
            try:
                pod = Body(await self.client.create(r.PODS, pod_from_template(owner, resource),
                                                    namespace=owner.namespace or None))
            except KubeError as exc:
                failure = f"Error creating: {exc}"
                self.event(owner, "FailedCreate", failure, warning=True)
                break
            created.append(pod.name)
            self.event(owner, "SuccessfulCreate", f"Created pod: {pod.name}")
        self.expectations.expect(expectation_key(resource, owner), created=created)
        return failure

    async def delete_pods(self, owner: Body, resource: ApiResource, pods: Sequence[Pod]) -> None:
        deleted = []
        for pod in pods[:BURST]:
            try:
                await self.client.delete(r.PODS, pod.name, namespace=pod.namespace or None,
                                         preconditions={"uid": pod.uid})
            except NotFound:
                continue
            deleted.append(pod.name)
            self.event(owner, "SuccessfulDelete", f"Deleted pod: {pod.name}")
        self.expectations.expect(expectation_key(resource, owner), deleted=deleted)


def expectation_key(resource: ApiResource, owner: Body) -> str:
    return f"{resource.plural}/{owner.namespace}/{owner.name}"
