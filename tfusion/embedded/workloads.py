"""The Deployment, ReplicaSet and Job controllers of `--role=all`: what kube-controller-manager does for them.

Users try TensorFusion with a Deployment or a Job, not a bare pod, and the pod webhook names a
TensorFusionWorkload after the pod's owner chain (ReplicaSet -> Deployment), so the embedded
cluster needs real owners. These are small, level-triggered versions of kube's controllers, on the
Manager's reconciler builder, leader-only as in kube-controller-manager:

- **ReplicaSet** keeps `spec.replicas` active pods (generateName `<rs>-`, the template's labels
  and annotations, a controller ownerReference with blockOwnerDeletion). Extra pods go
  unscheduled first, then pending, then not ready, then the newest. Status is counted from its pods.
- **Deployment** keeps one ReplicaSet per pod template, named `<deployment>-<hash>` and labelled
  `pod-template-hash=<hash>`. The hash is the first 32 bits of the SHA-256 of the template's JSON
  (keys sorted; the collision count appended when there is one), written in decimal and then
  spelled with kube's safe alphabet as kube does with its FNV hash, so names look like kube's but
  do not match them. Recreate scales the old ReplicaSets to 0, waits for their pods to be gone,
  then scales the new one; RollingUpdate follows maxSurge / maxUnavailable, counting available
  pods, as kube's rolling updater does. The newest ReplicaSet carries the revision annotation
  `deployment.kubernetes.io/revision` (copied to the Deployment); old ones beyond
  revisionHistoryLimit are deleted. Status: replicas, updated, ready, available and unavailable
  replicas, observedGeneration and the Available / Progressing conditions (ProgressDeadlineExceeded
  when progressDeadlineSeconds pass without progress), which is what `kubectl rollout status` reads.
- **Job** (NonIndexed) runs up to `parallelism` pods until `completions` succeeded; failed pods
  (and container restarts under restartPolicy OnFailure) count against backoffLimit, then the Job
  fails (conditions FailureTarget and Failed, reason BackoffLimitExceeded); activeDeadlineSeconds
  fails it with DeadlineExceeded; success sets SuccessCriteriaMet and Complete. startTime,
  completionTime, active, ready, succeeded and failed are in its status. `suspend` stops its pods.

Pods are created through the API, so the pod webhook (when registered) mutates them like any pod.
Each controller waits until the pods it created (or deleted) show up in (or leave) its cache
before it acts again — kube's "expectations" — so a lagging cache never doubles the pods.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import math
import time
from collections.abc import Iterable
from typing import Any

import orjson

from tfusion.api.timestamps import parse_rfc3339, rfc3339
from tfusion.apiserver.apps import JOB_CONTROLLER_UID
from tfusion.kube import resources as r
from tfusion.kube.client import AlreadyExists, KubeClient, KubeError, NotFound
from tfusion.kube.informer import Informer
from tfusion.kube.manager import Manager
from tfusion.kube.reconciler import Result
from tfusion.kube.resources import Resource

log = logging.getLogger(__name__)

Obj = dict[str, Any]
POD_TEMPLATE_HASH = "pod-template-hash"
REVISION = "deployment.kubernetes.io/revision"
OWNER_INDEX = "workloads:controller-uid"
#: at most this many pods are created or deleted by one reconcile (kube's burstReplicas)
BURST = 500
#: how long a controller waits for its own creates/deletes to reach its cache before it acts anyway
EXPECTATION_TIMEOUT_S = 30.0
FINISHED = ("Succeeded", "Failed")
_SAFE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


# --- small helpers ------------------------------------------------------------------------------------


def _meta(obj: Obj) -> Obj:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _key(obj: Obj) -> str:
    meta = _meta(obj)
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def controller_uid(obj: Obj) -> list[str]:
    """Index function: the uid of the object's controlling owner."""
    return [str(ref["uid"]) for ref in _meta(obj).get("ownerReferences") or []
            if isinstance(ref, dict) and ref.get("controller") and ref.get("uid")]


def owner_reference(owner: Obj, resource: Resource) -> Obj:
    meta = _meta(owner)
    return {"apiVersion": resource.api_version, "kind": resource.kind, "name": meta["name"], "uid": meta["uid"],
            "controller": True, "blockOwnerDeletion": True}


def is_active(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") not in FINISHED and not _meta(pod).get("deletionTimestamp")


def _condition(obj: Obj, kind: str) -> Obj | None:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == kind), None)


def is_ready(pod: Obj) -> bool:
    ready = _condition(pod, "Ready") or {}
    return (pod.get("status") or {}).get("phase") == "Running" and ready.get("status") == "True"


def _since(stamp: Any) -> float | None:
    try:
        return parse_rfc3339(str(stamp)).timestamp()
    except (TypeError, ValueError):
        return None


def available_in(pod: Obj, min_ready_s: int, now: float) -> float | None:
    """0 when the pod is available (ready for min_ready_s), else seconds until it is (None: not ready)."""
    if not is_ready(pod):
        return None
    if min_ready_s <= 0:
        return 0.0
    ready = _condition(pod, "Ready") or {}
    since = _since(ready.get("lastTransitionTime"))
    return 0.0 if since is None else max(0.0, since + min_ready_s - now)


def pod_from_template(owner: Obj, resource: Resource, template: Obj) -> Obj:
    """A pod of `owner` (generateName `<owner>-`), as kube's controllers build one from a template."""
    template_meta = template.get("metadata") or {}
    meta: Obj = {"generateName": f"{_meta(owner)['name']}-", "namespace": _meta(owner).get("namespace"),
                 "labels": dict(template_meta.get("labels") or {}),
                 "ownerReferences": [owner_reference(owner, resource)]}
    for field in ("annotations", "finalizers"):
        if template_meta.get(field):
            meta[field] = copy.deepcopy(template_meta[field])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": copy.deepcopy(template.get("spec") or {})}


def deletion_rank(pod: Obj) -> tuple[int, int, int, float]:
    """Sort key, first deleted first: unscheduled, pending, not ready, then the newest."""
    status = pod.get("status") or {}
    phase_rank = {"Pending": 0, "Unknown": 1, "Running": 2}.get(str(status.get("phase")), 0)
    created = _since(_meta(pod).get("creationTimestamp")) or 0.0
    return (1 if (pod.get("spec") or {}).get("nodeName") else 0, phase_rank, 1 if is_ready(pod) else 0, -created)


def template_hash(template: Obj, collision_count: int = 0) -> str:
    raw = orjson.dumps(template, option=orjson.OPT_SORT_KEYS)
    if collision_count:
        raw += str(collision_count).encode()
    value = int.from_bytes(hashlib.sha256(raw).digest()[:4], "big")
    return "".join(_SAFE_ALPHABET[byte % len(_SAFE_ALPHABET)] for byte in str(value).encode())


def _without_hash(template: Obj) -> Obj:
    stripped = copy.deepcopy(template)
    labels = (stripped.get("metadata") or {}).get("labels")
    if isinstance(labels, dict):
        labels.pop(POD_TEMPLATE_HASH, None)
    return stripped


def _replicas(obj: Obj) -> int:
    value = (obj.get("spec") or {}).get("replicas")
    return 1 if value is None else int(value)


def _status_int(obj: Obj, key: str) -> int:
    return int((obj.get("status") or {}).get(key) or 0)


def _revision(obj: Obj) -> int:
    try:
        return int((_meta(obj).get("annotations") or {}).get(REVISION, "0"))
    except ValueError:
        return 0


def _created(obj: Obj) -> float:
    return _since(_meta(obj).get("creationTimestamp")) or 0.0


def set_condition(conditions: list[Obj], kind: str, status: str, reason: str, message: str, now: str, *,
                  update_time: bool = False) -> list[Obj]:
    """Replace the condition of `kind`; lastTransitionTime moves only when the status changes."""
    old = next((c for c in conditions if c.get("type") == kind), None)
    condition: Obj = {"type": kind, "status": status, "reason": reason, "message": message}
    changed = old is None or old.get("status") != status
    condition["lastTransitionTime"] = now if changed else old.get("lastTransitionTime", now)  # type: ignore[union-attr]
    if update_time:
        unchanged = old is not None and not changed and old.get("reason") == reason and old.get("message") == message
        condition["lastUpdateTime"] = old.get("lastUpdateTime", now) if unchanged else now  # type: ignore[union-attr]
    return [c for c in conditions if c.get("type") != kind] + [condition]


def resolve_fenceposts(deployment: Obj) -> tuple[int, int]:
    """(maxSurge, maxUnavailable) as pod counts: surge rounds up, unavailable down; never both 0."""
    spec = deployment.get("spec") or {}
    replicas = _replicas(deployment)
    strategy = spec.get("strategy") or {}
    if strategy.get("type") == "Recreate":
        return 0, 0
    rolling = strategy.get("rollingUpdate") or {}

    def count(value: Any, round_up: bool) -> int:
        if isinstance(value, str) and value.endswith("%"):
            exact = int(value[:-1]) * replicas / 100
            return math.ceil(exact) if round_up else math.floor(exact)
        return int(value)

    surge = count(rolling.get("maxSurge", "25%"), True)
    unavailable = count(rolling.get("maxUnavailable", "25%"), False)
    if surge == 0 and unavailable == 0:
        unavailable = 1
    return surge, unavailable


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


# --- the controllers ----------------------------------------------------------------------------------


class WorkloadControllers:
    """Registers the three controllers with `manager` (leader-only); see the module docstring."""

    def __init__(self, manager: Manager) -> None:
        self.manager = manager
        self.client: KubeClient = manager.client
        deployments = manager.controller("deployment").for_(r.DEPLOYMENTS).owns(r.REPLICASETS) \
            .complete(self.reconcile_deployment)
        replicasets = manager.controller("replicaset").for_(r.REPLICASETS).owns(r.PODS) \
            .complete(self.reconcile_replicaset)
        jobs = manager.controller("job").for_(r.JOBS).owns(r.PODS).complete(self.reconcile_job)
        # `is not None`: an empty Informer is falsy (it has a length)
        assert deployments.primary is not None and replicasets.primary is not None and jobs.primary is not None
        self.deployments: Informer = deployments.primary
        self.replicasets: Informer = replicasets.primary
        self.jobs: Informer = jobs.primary
        # the shared pod informer (the simulated kubelet's and the controller's too): always filtered
        self.pods: Informer = manager.cache.informer(r.PODS)
        self.pods.add_index(OWNER_INDEX, controller_uid)
        self.replicasets.add_index(OWNER_INDEX, controller_uid)
        self.expectations = Expectations()

    def _owned(self, informer: Informer, owner: Obj) -> list[Obj]:
        uid = str(_meta(owner).get("uid", ""))
        namespace = _meta(owner).get("namespace")
        return [obj for obj in informer.by_index(OWNER_INDEX, uid) if _meta(obj).get("namespace") == namespace]

    def _event(self, obj: Obj, reason: str, message: str, *, warning: bool = False) -> None:
        if self.manager.events is None:
            return
        if warning:
            self.manager.recorder.warning(obj, reason, message)
        else:
            self.manager.recorder.normal(obj, reason, message)

    async def _write_status(self, resource: Resource, obj: Obj, status: Obj) -> None:
        if status == (obj.get("status") or {}):
            return
        try:
            await self.client.replace(resource, {**obj, "status": status}, subresource="status")
        except NotFound:
            pass  # deleted meanwhile

    # --- pods of an owner ---------------------------------------------------------------------------

    async def _create_pods(self, owner: Obj, resource: Resource, template: Obj, count: int) -> str | None:
        """Create `count` pods; the error message of the first failed create (then it stops)."""
        created: list[str] = []
        failure = None
        for _ in range(min(count, BURST)):
            try:
                pod = await self.client.create(r.PODS, pod_from_template(owner, resource, template),
                                               namespace=_meta(owner).get("namespace"))
            except KubeError as exc:
                failure = f"Error creating: {exc}"
                self._event(owner, "FailedCreate", failure, warning=True)
                break
            created.append(_meta(pod)["name"])
            self._event(owner, "SuccessfulCreate", f"Created pod: {_meta(pod)['name']}")
        self.expectations.expect(f"{resource.plural}/{_key(owner)}", created=created)
        return failure

    async def _delete_pods(self, owner: Obj, resource: Resource, pods: list[Obj]) -> None:
        deleted = []
        for pod in pods[:BURST]:
            meta = _meta(pod)
            try:
                await self.client.delete(r.PODS, meta["name"], namespace=meta.get("namespace"),
                                         preconditions={"uid": meta["uid"]})
            except NotFound:
                continue
            deleted.append(meta["name"])
            self._event(owner, "SuccessfulDelete", f"Deleted pod: {meta['name']}")
        self.expectations.expect(f"{resource.plural}/{_key(owner)}", deleted=deleted)

    # --- ReplicaSet ---------------------------------------------------------------------------------

    async def reconcile_replicaset(self, key: str) -> Result | None:
        rs = self.replicasets.get(key)
        expectation_key = f"{r.REPLICASETS.plural}/{key}"
        if rs is None:
            self.expectations.forget(expectation_key)
            return None
        if _meta(rs).get("deletionTimestamp"):
            return None  # the garbage collector takes its pods
        pods = self._owned(self.pods, rs)
        active = [p for p in pods if is_active(p)]
        failure = None
        if self.expectations.satisfied(expectation_key, {_meta(p)["name"] for p in pods}):
            diff = len(active) - _replicas(rs)
            template = (rs.get("spec") or {}).get("template") or {}
            if diff < 0:
                failure = await self._create_pods(rs, r.REPLICASETS, template, -diff)
            elif diff > 0:
                await self._delete_pods(rs, r.REPLICASETS, sorted(active, key=deletion_rank)[:diff])
        status, wait = self._replicaset_status(rs, active, failure)
        await self._write_status(r.REPLICASETS, rs, status)
        if failure is not None:
            return Result(requeue=True)  # retried with backoff, as kube retries a failed create
        return Result(requeue_after=wait) if wait is not None else None

    def _replicaset_status(self, rs: Obj, active: list[Obj], failure: str | None) -> tuple[Obj, float | None]:
        spec = rs.get("spec") or {}
        min_ready = int(spec.get("minReadySeconds") or 0)
        now = time.time()
        template_labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
        ready = available = labelled = 0
        wait: float | None = None
        for pod in active:
            labels = _meta(pod).get("labels") or {}
            labelled += all(labels.get(k) == v for k, v in template_labels.items())
            if is_ready(pod):
                ready += 1
            remaining = available_in(pod, min_ready, now)
            if remaining == 0:
                available += 1
            elif remaining is not None:
                wait = remaining if wait is None else min(wait, remaining)
        old_status = rs.get("status") or {}
        status: Obj = {"replicas": len(active), "fullyLabeledReplicas": labelled, "readyReplicas": ready,
                       "availableReplicas": available,
                       "observedGeneration": _meta(rs).get("generation", old_status.get("observedGeneration", 0))}
        conditions = [c for c in old_status.get("conditions") or [] if c.get("type") != "ReplicaFailure"]
        if failure is not None:
            conditions = set_condition(conditions, "ReplicaFailure", "True", "FailedCreate", failure, rfc3339())
        if conditions:
            status["conditions"] = conditions
        return status, wait

    # --- Deployment ---------------------------------------------------------------------------------

    async def reconcile_deployment(self, key: str) -> Result | None:
        deploy = self.deployments.get(key)
        if deploy is None or _meta(deploy).get("deletionTimestamp"):
            return None
        deploy = copy.deepcopy(deploy)
        owned = [rs for rs in self._owned(self.replicasets, deploy) if not _meta(rs).get("deletionTimestamp")]
        template = (deploy.get("spec") or {}).get("template") or {}
        new_rs = next((rs for rs in owned
                       if _without_hash((rs.get("spec") or {}).get("template") or {}) == template), None)
        old = sorted((rs for rs in owned if rs is not new_rs), key=_created)
        paused = bool((deploy.get("spec") or {}).get("paused"))
        if new_rs is None and not paused:
            created = await self._create_replicaset(deploy, old)
            return Result(requeue=True) if created is None else None  # its add event brings us back
        acted = False
        if new_rs is not None:
            acted = await self._set_revision(deploy, new_rs, old)
            if not acted and not paused:
                if ((deploy.get("spec") or {}).get("strategy") or {}).get("type") == "Recreate":
                    acted = await self._recreate(deploy, new_rs, old)
                else:
                    acted = await self._roll(deploy, new_rs, old)
            if not acted:
                await self._cleanup(deploy, old)
        status, wait = self._deployment_status(deploy, new_rs, owned, progressed=acted)
        await self._write_status(r.DEPLOYMENTS, deploy, status)
        return Result(requeue_after=wait) if wait is not None else None

    async def _create_replicaset(self, deploy: Obj, old: list[Obj]) -> Obj | None:
        meta, spec = _meta(deploy), deploy.get("spec") or {}
        collisions = _status_int(deploy, "collisionCount")
        template = copy.deepcopy(spec.get("template") or {})
        pod_hash = template_hash(template, collisions)
        template.setdefault("metadata", {}).setdefault("labels", {})[POD_TEMPLATE_HASH] = pod_hash
        selector = copy.deepcopy(spec.get("selector") or {})
        selector.setdefault("matchLabels", {})[POD_TEMPLATE_HASH] = pod_hash
        revision = max((_revision(rs) for rs in old), default=0) + 1
        first = self._first_replicas(deploy, old)
        rs: Obj = {
            "apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": f"{meta['name']}-{pod_hash}", "namespace": meta.get("namespace"),
                         "labels": dict(template["metadata"]["labels"]), "annotations": {REVISION: str(revision)},
                         "ownerReferences": [owner_reference(deploy, r.DEPLOYMENTS)]},
            "spec": {"replicas": first, "selector": selector, "template": template,
                     "minReadySeconds": int(spec.get("minReadySeconds") or 0)},
        }
        try:
            created = await self.client.create(r.REPLICASETS, rs, namespace=meta.get("namespace"))
        except AlreadyExists:
            existing = await self.client.get(r.REPLICASETS, f"{meta['name']}-{pod_hash}",
                                             namespace=meta.get("namespace"))
            if controller_uid(existing) == [meta["uid"]] and \
                    _without_hash((existing.get("spec") or {}).get("template") or {}) == spec.get("template"):
                return existing  # ours: the cache had not shown it yet
            # another template hashed to this name: the next attempt hashes with a higher collision count
            status = {**(deploy.get("status") or {}), "collisionCount": collisions + 1}
            await self._write_status(r.DEPLOYMENTS, deploy, status)
            return None
        self._event(deploy, "ScalingReplicaSet",
                    f"Scaled up replica set {_meta(created)['name']} from 0 to {first}")
        await self._annotate_revision(deploy, revision)
        return created

    @staticmethod
    def _first_replicas(deploy: Obj, old: list[Obj]) -> int:
        replicas = _replicas(deploy)
        old_total = sum(_replicas(rs) for rs in old)
        if ((deploy.get("spec") or {}).get("strategy") or {}).get("type") == "Recreate":
            return 0 if old_total or any(_status_int(rs, "replicas") for rs in old) else replicas
        surge, _ = resolve_fenceposts(deploy)
        return max(0, min(replicas, replicas + surge - old_total))

    async def _set_revision(self, deploy: Obj, new_rs: Obj, old: list[Obj]) -> bool:
        """A template rolled back to reuses its old ReplicaSet, which becomes the newest revision."""
        newest_old = max((_revision(rs) for rs in old), default=0)
        revision = _revision(new_rs)
        if revision <= newest_old:
            revision = newest_old + 1
            meta = _meta(new_rs)
            await self.client.patch(r.REPLICASETS, meta["name"], {"metadata": {"annotations": {
                REVISION: str(revision)}}}, namespace=meta.get("namespace"))
            await self._annotate_revision(deploy, revision)
            return True
        await self._annotate_revision(deploy, revision)
        return False

    async def _annotate_revision(self, deploy: Obj, revision: int) -> None:
        meta = _meta(deploy)
        if (meta.get("annotations") or {}).get(REVISION) == str(revision):
            return
        updated = await self.client.patch(r.DEPLOYMENTS, meta["name"], {"metadata": {"annotations": {
            REVISION: str(revision)}}}, namespace=meta.get("namespace"))
        meta["annotations"] = _meta(updated).get("annotations")
        meta["resourceVersion"] = _meta(updated).get("resourceVersion")

    async def _scale(self, deploy: Obj, rs: Obj, replicas: int) -> None:
        meta = _meta(rs)
        before = _replicas(rs)
        await self.client.patch(r.REPLICASETS, meta["name"], {"spec": {"replicas": replicas}},
                                namespace=meta.get("namespace"))
        rs.setdefault("spec", {})["replicas"] = replicas
        direction = "up" if replicas > before else "down"
        self._event(deploy, "ScalingReplicaSet", f"Scaled {direction} replica set {meta['name']} "
                                                 f"from {before} to {replicas}")

    async def _recreate(self, deploy: Obj, new_rs: Obj, old: list[Obj]) -> bool:
        running_old = [rs for rs in old if _replicas(rs) > 0]
        for rs in running_old:
            await self._scale(deploy, rs, 0)
        if running_old:
            return True
        old_pods = [p for rs in old for p in self._owned(self.pods, rs) if is_active(p)]
        if old_pods or any(_status_int(rs, "replicas") for rs in old):
            return False  # the old pods must be gone before new ones start
        if _replicas(new_rs) != _replicas(deploy):
            await self._scale(deploy, new_rs, _replicas(deploy))
            return True
        return False

    async def _roll(self, deploy: Obj, new_rs: Obj, old: list[Obj]) -> bool:
        """One step of kube's rolling update: scale the new ReplicaSet up within maxSurge, else the old
        ones down within maxUnavailable (unhealthy pods first)."""
        replicas = _replicas(deploy)
        surge, max_unavailable = resolve_fenceposts(deploy)
        everything = [new_rs, *old]
        total = sum(_replicas(rs) for rs in everything)
        new_replicas = _replicas(new_rs)
        if new_replicas > replicas or (new_replicas < replicas and not any(_replicas(rs) for rs in old)):
            await self._scale(deploy, new_rs, replicas)
            return True
        if new_replicas < replicas and total < replicas + surge:
            await self._scale(deploy, new_rs, new_replicas + min(replicas + surge - total, replicas - new_replicas))
            return True
        if not any(_replicas(rs) for rs in old):
            return False
        min_available = replicas - max_unavailable
        new_unavailable = new_replicas - _status_int(new_rs, "availableReplicas")
        budget = total - min_available - new_unavailable
        if budget <= 0:
            return False
        acted = False
        for rs in old:  # pods that are not available go first, and do not count against availability
            unhealthy = _replicas(rs) - _status_int(rs, "availableReplicas")
            if budget > 0 and _replicas(rs) > 0 and unhealthy > 0:
                down = min(budget, unhealthy)
                await self._scale(deploy, rs, _replicas(rs) - down)
                budget -= down
                acted = True
        if acted:
            return True
        available = sum(_status_int(rs, "availableReplicas") for rs in everything)
        to_remove = min(available - min_available, budget)
        for rs in old:
            if to_remove <= 0:
                break
            if _replicas(rs) > 0:
                down = min(_replicas(rs), to_remove)
                await self._scale(deploy, rs, _replicas(rs) - down)
                to_remove -= down
                acted = True
        return acted

    async def _cleanup(self, deploy: Obj, old: list[Obj]) -> None:
        limit = (deploy.get("spec") or {}).get("revisionHistoryLimit")
        limit = 10 if limit is None else int(limit)
        idle = sorted((rs for rs in old if _replicas(rs) == 0 and _status_int(rs, "replicas") == 0), key=_revision)
        for rs in idle[:max(0, len(idle) - limit)]:
            try:
                await self.client.delete(r.REPLICASETS, _meta(rs)["name"], namespace=_meta(rs).get("namespace"),
                                         preconditions={"uid": _meta(rs)["uid"]})
            except NotFound:
                pass

    def _deployment_status(self, deploy: Obj, new_rs: Obj | None, owned: list[Obj], *,
                           progressed: bool) -> tuple[Obj, float | None]:
        spec, old_status = deploy.get("spec") or {}, deploy.get("status") or {}
        wanted = _replicas(deploy)
        status: Obj = {
            "observedGeneration": _meta(deploy).get("generation", 1),
            "replicas": sum(_status_int(rs, "replicas") for rs in owned),
            "updatedReplicas": _status_int(new_rs, "replicas") if new_rs else 0,
            "readyReplicas": sum(_status_int(rs, "readyReplicas") for rs in owned),
            "availableReplicas": sum(_status_int(rs, "availableReplicas") for rs in owned),
        }
        status["unavailableReplicas"] = max(0, wanted - status["availableReplicas"])
        if old_status.get("collisionCount"):
            status["collisionCount"] = old_status["collisionCount"]
        now = rfc3339()
        conditions = list(old_status.get("conditions") or [])
        _, max_unavailable = resolve_fenceposts(deploy)
        if status["availableReplicas"] >= wanted - max_unavailable:
            conditions = set_condition(conditions, "Available", "True", "MinimumReplicasAvailable",
                                       "Deployment has minimum availability.", now, update_time=True)
        else:
            conditions = set_condition(conditions, "Available", "False", "MinimumReplicasUnavailable",
                                       "Deployment does not have minimum availability.", now, update_time=True)
        name = _meta(new_rs)["name"] if new_rs else _meta(deploy)["name"]
        complete = status["updatedReplicas"] == wanted and status["replicas"] == wanted \
            and status["availableReplicas"] == wanted
        counts = ("replicas", "updatedReplicas", "readyReplicas", "availableReplicas")
        moved = progressed or any(status[k] != old_status.get(k) for k in counts)
        current = _condition(deploy, "Progressing")
        deadline = spec.get("progressDeadlineSeconds")
        wait: float | None = None
        if spec.get("paused"):
            conditions = set_condition(conditions, "Progressing", "Unknown", "DeploymentPaused",
                                       "Deployment is paused", now, update_time=True)
        elif complete:
            conditions = set_condition(conditions, "Progressing", "True", "NewReplicaSetAvailable",
                                       f'ReplicaSet "{name}" has successfully progressed.', now, update_time=True)
        elif moved or current is None or current.get("reason") == "NewReplicaSetAvailable":
            conditions = set_condition(conditions, "Progressing", "True", "ReplicaSetUpdated",
                                       f'ReplicaSet "{name}" is progressing.', now, update_time=True)
            wait = float(deadline) if deadline is not None else None
        elif deadline is not None and current.get("reason") != "ProgressDeadlineExceeded":
            since = _since(current.get("lastUpdateTime")) or time.time()
            left = since + int(deadline) - time.time()
            if left <= 0:
                conditions = set_condition(conditions, "Progressing", "False", "ProgressDeadlineExceeded",
                                           f'ReplicaSet "{name}" has timed out progressing.', now, update_time=True)
            else:
                wait = left
        status["conditions"] = conditions
        return status, wait

    # --- Job ----------------------------------------------------------------------------------------

    async def reconcile_job(self, key: str) -> Result | None:
        job = self.jobs.get(key)
        expectation_key = f"{r.JOBS.plural}/{key}"
        if job is None:
            self.expectations.forget(expectation_key)
            return None
        if _meta(job).get("deletionTimestamp"):
            return None
        pods = self._owned(self.pods, job)
        active = [p for p in pods if is_active(p)]
        status = copy.deepcopy(job.get("status") or {})
        finished = _condition(job, "Complete") or _condition(job, "Failed")
        spec = job.get("spec") or {}
        now_s, now = time.time(), rfc3339()
        succeeded = max(_status_int(job, "succeeded"), sum(1 for p in pods if _phase(p) == "Succeeded"))
        failed_pods = sum(1 for p in pods if _phase(p) == "Failed")
        restarts = sum(_restarts(p) for p in active) if _restart_policy(job) == "OnFailure" else 0
        failed = max(_status_int(job, "failed"), failed_pods)
        result: Result | None = None
        if finished is not None and finished.get("status") == "True":
            if active:
                await self._delete_pods(job, r.JOBS, active)
        elif spec.get("suspend"):
            status["conditions"] = set_condition(status.get("conditions") or [], "Suspended", "True",
                                                 "JobSuspended", "Job suspended", now)
            if active:
                await self._delete_pods(job, r.JOBS, active)
        else:
            status.setdefault("startTime", now)
            if _condition(job, "Suspended"):
                status["conditions"] = set_condition(status.get("conditions") or [], "Suspended", "False",
                                                     "JobResumed", "Job resumed", now)
            failure = self._job_failure(job, status, failed + restarts, now_s)
            completions = spec.get("completions")
            done = succeeded >= completions if completions is not None else succeeded > 0 and not active
            if failure is not None:
                reason, message = failure
                status["conditions"] = self._finish(status, "FailureTarget", "Failed", reason, message, now)
                await self._delete_pods(job, r.JOBS, active)
                self._event(job, reason, message, warning=True)
            elif done:
                status["conditions"] = self._finish(status, "SuccessCriteriaMet", "Complete", "CompletionsReached",
                                                    "Reached expected number of succeeded pods", now)
                status["completionTime"] = now
                await self._delete_pods(job, r.JOBS, active)
                self._event(job, "Completed", "Job completed")
            elif self.expectations.satisfied(expectation_key, {_meta(p)["name"] for p in pods}):
                result = await self._run_job_pods(job, active, succeeded)
            deadline = spec.get("activeDeadlineSeconds")
            if failure is None and not done and deadline is not None:
                started = _since(status.get("startTime")) or now_s
                result = Result(requeue_after=max(0.1, started + int(deadline) - now_s))
        status.update(active=len(active), ready=sum(1 for p in active if is_ready(p)), succeeded=succeeded,
                      failed=failed)
        status.setdefault("uncountedTerminatedPods", {})
        await self._write_status(r.JOBS, job, status)
        return result

    def _job_failure(self, job: Obj, status: Obj, failures: int, now_s: float) -> tuple[str, str] | None:
        spec = job.get("spec") or {}
        backoff_limit = int(spec.get("backoffLimit", 6))
        if failures > backoff_limit:
            return "BackoffLimitExceeded", "Job has reached the specified backoff limit"
        deadline = spec.get("activeDeadlineSeconds")
        started = _since(status.get("startTime"))
        if deadline is not None and started is not None and now_s - started >= int(deadline):
            return "DeadlineExceeded", "Job was active longer than specified deadline"
        return None

    @staticmethod
    def _finish(status: Obj, target: str, final: str, reason: str, message: str, now: str) -> list[Obj]:
        conditions = set_condition(status.get("conditions") or [], target, "True", reason, message, now)
        return set_condition(conditions, final, "True", reason, message, now)

    async def _run_job_pods(self, job: Obj, active: list[Obj], succeeded: int) -> Result | None:
        spec = job.get("spec") or {}
        parallelism = int(spec.get("parallelism", 1))
        completions = spec.get("completions")
        if completions is None:
            wanted = parallelism if succeeded == 0 else 0
        else:
            wanted = min(parallelism, int(completions) - succeeded)
        wanted = max(0, wanted)
        if len(active) < wanted:
            failure = await self._create_pods(job, r.JOBS, spec.get("template") or {}, wanted - len(active))
            if failure is not None:
                return Result(requeue=True)
        elif len(active) > wanted:
            await self._delete_pods(job, r.JOBS, sorted(active, key=deletion_rank)[:len(active) - wanted])
        return None


def _phase(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("phase") or "")


def _restarts(pod: Obj) -> int:
    return sum(int(c.get("restartCount") or 0) for c in (pod.get("status") or {}).get("containerStatuses") or [])


def _restart_policy(job: Obj) -> str:
    return str((((job.get("spec") or {}).get("template") or {}).get("spec") or {}).get("restartPolicy") or "")


__all__ = ["JOB_CONTROLLER_UID", "POD_TEMPLATE_HASH", "REVISION", "WorkloadControllers", "template_hash"]
