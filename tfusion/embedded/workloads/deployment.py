"""The Deployment controller of `--role=all`: one ReplicaSet per pod template, rolled out as kube does.

Why it exists: users try TensorFusion with a Deployment, and `kubectl rollout status` reads what
this writes. One ReplicaSet per pod template, named `<deployment>-<hash>` and labelled
`pod-template-hash=<hash>`. The hash is the first 32 bits of the SHA-256 of the template's JSON
(keys sorted; the collision count appended when there is one), written in decimal and then
spelled with kube's safe alphabet as kube does with its FNV hash, so names look like kube's but do
not match them. Recreate scales the old ReplicaSets to 0, waits for their pods to be gone, then
scales the new one; RollingUpdate follows maxSurge / maxUnavailable, counting available pods, as
kube's rolling updater does. The newest ReplicaSet carries the revision annotation
`deployment.kubernetes.io/revision` (copied to the Deployment); old ones beyond
revisionHistoryLimit are deleted. Status: replicas, updated, ready, available and unavailable
replicas, observedGeneration and the Available / Progressing conditions (ProgressDeadlineExceeded
when progressDeadlineSeconds pass without progress).
"""

from __future__ import annotations

import copy
import hashlib
import math
import time

import orjson

from tfusion.api.accessors import Body, section
from tfusion.api.jsontypes import JsonMapping, JsonObject, json_copy, json_object
from tfusion.api.timestamps import rfc3339
from tfusion.embedded.workloads.common import (
    Workbench,
    controller_uid,
    created_at,
    is_active,
    replicas_of,
    set_condition,
    since,
    status_int,
)
from tfusion.kube import resources as r
from tfusion.kube.client import AlreadyExists, NotFound
from tfusion.kube.ownership import controller_reference
from tfusion.kube.reconciler import Result

POD_TEMPLATE_HASH = "pod-template-hash"
REVISION = "deployment.kubernetes.io/revision"
_SAFE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def template_hash(template: JsonMapping, collision_count: int = 0) -> str:
    """The `pod-template-hash` of a pod template (see the module docstring for how it is spelled)."""
    raw = orjson.dumps(template, option=orjson.OPT_SORT_KEYS)
    if collision_count:
        raw += str(collision_count).encode()
    value = int.from_bytes(hashlib.sha256(raw).digest()[:4], "big")
    return "".join(_SAFE_ALPHABET[byte % len(_SAFE_ALPHABET)] for byte in str(value).encode())


def _runs_template(rs: Body, template: object) -> bool:
    """Whether the ReplicaSet's pod template, less the hash label it added, is the Deployment's `template`."""
    stripped = copy.deepcopy(dict(section(rs.spec, "template")))
    labels = section(stripped, "metadata", "labels")
    if isinstance(labels, dict):
        labels.pop(POD_TEMPLATE_HASH, None)
    return stripped == template


def revision_of(obj: Body) -> int:
    try:
        return int(obj.meta.annotation(REVISION) or "0")
    except ValueError:
        return 0


def is_recreate(deploy: Body) -> bool:
    return section(deploy.spec, "strategy").get("type") == "Recreate"


def resolve_fenceposts(deployment: Body) -> tuple[int, int]:
    """(maxSurge, maxUnavailable) as pod counts: surge rounds up, unavailable down; never both 0."""
    replicas = replicas_of(deployment)
    if is_recreate(deployment):
        return 0, 0
    rolling = section(deployment.spec, "strategy", "rollingUpdate")

    def count(value: int | str, round_up: bool) -> int:
        if isinstance(value, str) and value.endswith("%"):
            exact = int(value[:-1]) * replicas / 100
            return math.ceil(exact) if round_up else math.floor(exact)
        return int(value)

    surge = count(rolling.get("maxSurge", "25%"), True)
    unavailable = count(rolling.get("maxUnavailable", "25%"), False)
    if surge == 0 and unavailable == 0:
        unavailable = 1
    return surge, unavailable


class DeploymentController:
    """Registers itself with the bench's Manager (leader-only, as in kube-controller-manager)."""

    def __init__(self, bench: Workbench) -> None:
        self.bench = bench
        self.client = bench.client
        bench.manager.controller("deployment").for_(r.DEPLOYMENTS).owns(r.REPLICASETS).complete(self.reconcile)

    async def reconcile(self, key: str) -> Result | None:
        raw = self.bench.deployments.get(key)
        if raw is None or Body(raw).meta.deleting:
            return None
        deploy = Body(copy.deepcopy(raw))  # _annotate_revision updates its metadata for the status write
        owned = [rs for rs in self.bench.replicasets_of(deploy) if not rs.meta.deleting]
        template = section(deploy.spec, "template")
        new_rs = next((rs for rs in owned if _runs_template(rs, template)), None)
        old = sorted((rs for rs in owned if rs is not new_rs), key=created_at)
        paused = bool(deploy.spec.get("paused"))
        if new_rs is None and not paused:
            created = await self._create_replicaset(deploy, old)
            return Result(requeue=True) if created is None else None  # its add event brings us back
        acted = False
        if new_rs is not None:
            acted = await self._set_revision(deploy, new_rs, old)
            if not acted and not paused:
                roll = self._recreate if is_recreate(deploy) else self._roll
                acted = await roll(deploy, new_rs, old)
            if not acted:
                await self._cleanup(deploy, old)
        status, wait = deployment_status(deploy, new_rs, owned, progressed=acted)
        await self.bench.write_status(r.DEPLOYMENTS, deploy, status)
        return Result(requeue_after=wait) if wait is not None else None

    async def _create_replicaset(self, deploy: Body, old: list[Body]) -> Body | None:
        spec, namespace = deploy.spec, deploy.namespace or None
        collisions = status_int(deploy, "collisionCount")
        template = copy.deepcopy(dict(section(spec, "template")))
        pod_hash = template_hash(template, collisions)
        template.setdefault("metadata", {}).setdefault("labels", {})[POD_TEMPLATE_HASH] = pod_hash
        selector = copy.deepcopy(dict(section(spec, "selector")))
        selector.setdefault("matchLabels", {})[POD_TEMPLATE_HASH] = pod_hash
        revision = max((revision_of(rs) for rs in old), default=0) + 1
        first = self._first_replicas(deploy, old)
        name = f"{deploy.name}-{pod_hash}"
        rs: JsonObject = {
            "apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": dict(template["metadata"]["labels"]), "annotations": {REVISION: str(revision)},
                         "ownerReferences": [json_object(controller_reference(deploy, r.DEPLOYMENTS))]},
            "spec": {"replicas": first, "selector": selector, "template": template,
                     "minReadySeconds": int(spec.get("minReadySeconds") or 0)},
        }
        try:
            created = Body(await self.client.create(r.REPLICASETS, rs, namespace=namespace))
        except AlreadyExists:
            existing = Body(await self.client.get(r.REPLICASETS, name, namespace=namespace))
            if controller_uid(existing) == [deploy.uid] and _runs_template(existing, spec.get("template")):
                return existing  # ours: the cache had not shown it yet
            # another template hashed to this name: the next attempt hashes with a higher collision count
            status = {**deploy.status, "collisionCount": collisions + 1}
            await self.bench.write_status(r.DEPLOYMENTS, deploy, status)
            return None
        self.bench.event(deploy, "ScalingReplicaSet", f"Scaled up replica set {created.name} from 0 to {first}")
        await self._annotate_revision(deploy, revision)
        return created

    @staticmethod
    def _first_replicas(deploy: Body, old: list[Body]) -> int:
        replicas = replicas_of(deploy)
        old_total = sum(replicas_of(rs) for rs in old)
        if is_recreate(deploy):
            return 0 if old_total or any(status_int(rs, "replicas") for rs in old) else replicas
        surge, _ = resolve_fenceposts(deploy)
        return max(0, min(replicas, replicas + surge - old_total))

    async def _set_revision(self, deploy: Body, new_rs: Body, old: list[Body]) -> bool:
        """A template rolled back to reuses its old ReplicaSet, which becomes the newest revision."""
        newest_old = max((revision_of(rs) for rs in old), default=0)
        revision = revision_of(new_rs)
        if revision <= newest_old:
            revision = newest_old + 1
            await self.client.patch(r.REPLICASETS, new_rs.name, {"metadata": {"annotations": {
                REVISION: str(revision)}}}, namespace=new_rs.namespace or None)
            await self._annotate_revision(deploy, revision)
            return True
        await self._annotate_revision(deploy, revision)
        return False

    async def _annotate_revision(self, deploy: Body, revision: int) -> None:
        if deploy.meta.annotation(REVISION) == str(revision):
            return
        updated = Body(await self.client.patch(r.DEPLOYMENTS, deploy.name, {"metadata": {"annotations": {
            REVISION: str(revision)}}}, namespace=deploy.namespace or None))
        meta = deploy.raw.get("metadata")
        if isinstance(meta, dict):  # our deep copy: the status write that follows needs the new resourceVersion
            meta["annotations"] = updated.meta.raw.get("annotations")
            meta["resourceVersion"] = updated.meta.raw.get("resourceVersion")

    async def _scale(self, deploy: Body, rs: Body, replicas: int) -> None:
        before = replicas_of(rs)
        await self.client.patch(r.REPLICASETS, rs.name, {"spec": {"replicas": replicas}},
                                namespace=rs.namespace or None)
        spec = rs.raw.get("spec")
        if isinstance(spec, dict):  # the cached copy reads the new count until the watch event replaces it
            spec["replicas"] = replicas
        direction = "up" if replicas > before else "down"
        self.bench.event(deploy, "ScalingReplicaSet", f"Scaled {direction} replica set {rs.name} "
                                                      f"from {before} to {replicas}")

    async def _recreate(self, deploy: Body, new_rs: Body, old: list[Body]) -> bool:
        running_old = [rs for rs in old if replicas_of(rs) > 0]
        for rs in running_old:
            await self._scale(deploy, rs, 0)
        if running_old:
            return True
        old_pods = [p for rs in old for p in self.bench.pods_of(rs) if is_active(p)]
        if old_pods or any(status_int(rs, "replicas") for rs in old):
            return False  # the old pods must be gone before new ones start
        if replicas_of(new_rs) != replicas_of(deploy):
            await self._scale(deploy, new_rs, replicas_of(deploy))
            return True
        return False

    async def _roll(self, deploy: Body, new_rs: Body, old: list[Body]) -> bool:
        """One step of kube's rolling update: scale the new ReplicaSet up within maxSurge, else the old
        ones down within maxUnavailable (unhealthy pods first)."""
        replicas = replicas_of(deploy)
        surge, max_unavailable = resolve_fenceposts(deploy)
        everything = [new_rs, *old]
        total = sum(replicas_of(rs) for rs in everything)
        new_replicas = replicas_of(new_rs)
        if new_replicas > replicas or (new_replicas < replicas and not any(replicas_of(rs) for rs in old)):
            await self._scale(deploy, new_rs, replicas)
            return True
        if new_replicas < replicas and total < replicas + surge:
            await self._scale(deploy, new_rs, new_replicas + min(replicas + surge - total, replicas - new_replicas))
            return True
        if not any(replicas_of(rs) for rs in old):
            return False
        min_available = replicas - max_unavailable
        new_unavailable = new_replicas - status_int(new_rs, "availableReplicas")
        budget = total - min_available - new_unavailable
        if budget <= 0:
            return False
        acted = False
        for rs in old:  # pods that are not available go first, and do not count against availability
            unhealthy = replicas_of(rs) - status_int(rs, "availableReplicas")
            if budget > 0 and replicas_of(rs) > 0 and unhealthy > 0:
                down = min(budget, unhealthy)
                await self._scale(deploy, rs, replicas_of(rs) - down)
                budget -= down
                acted = True
        if acted:
            return True
        available = sum(status_int(rs, "availableReplicas") for rs in everything)
        to_remove = min(available - min_available, budget)
        for rs in old:
            if to_remove <= 0:
                break
            if replicas_of(rs) > 0:
                down = min(replicas_of(rs), to_remove)
                await self._scale(deploy, rs, replicas_of(rs) - down)
                to_remove -= down
                acted = True
        return acted

    async def _cleanup(self, deploy: Body, old: list[Body]) -> None:
        limit = deploy.spec.get("revisionHistoryLimit")
        limit = 10 if limit is None else int(limit)
        idle = sorted((rs for rs in old if replicas_of(rs) == 0 and status_int(rs, "replicas") == 0),
                      key=revision_of)
        for rs in idle[:max(0, len(idle) - limit)]:
            try:
                await self.client.delete(r.REPLICASETS, rs.name, namespace=rs.namespace or None,
                                         preconditions={"uid": rs.uid})
            except NotFound:
                pass


def deployment_status(deploy: Body, new_rs: Body | None, owned: list[Body], *,
                      progressed: bool) -> tuple[JsonObject, float | None]:
    """The status counted from the owned ReplicaSets, and how long until the progress deadline."""
    spec, old_status = deploy.spec, deploy.status
    wanted = replicas_of(deploy)
    counted = {
        "replicas": sum(status_int(rs, "replicas") for rs in owned),
        "updatedReplicas": status_int(new_rs, "replicas") if new_rs else 0,
        "readyReplicas": sum(status_int(rs, "readyReplicas") for rs in owned),
        "availableReplicas": sum(status_int(rs, "availableReplicas") for rs in owned),
    }
    status: JsonObject = {"observedGeneration": json_copy(deploy.meta.raw.get("generation", 1)), **counted,
                          "unavailableReplicas": max(0, wanted - counted["availableReplicas"])}
    if old_status.get("collisionCount"):
        status["collisionCount"] = old_status["collisionCount"]
    now = rfc3339()
    _, max_unavailable = resolve_fenceposts(deploy)
    if counted["availableReplicas"] >= wanted - max_unavailable:
        conditions = set_condition(deploy.conditions, "Available", "True", "MinimumReplicasAvailable",
                                   "Deployment has minimum availability.", now, update_time=True)
    else:
        conditions = set_condition(deploy.conditions, "Available", "False", "MinimumReplicasUnavailable",
                                   "Deployment does not have minimum availability.", now, update_time=True)
    name = new_rs.name if new_rs else deploy.name
    complete = counted["updatedReplicas"] == wanted and counted["replicas"] == wanted \
        and counted["availableReplicas"] == wanted
    moved = progressed or any(count != old_status.get(k) for k, count in counted.items())
    current = deploy.condition("Progressing")
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
        started = since(current.get("lastUpdateTime")) or time.time()
        left = started + int(deadline) - time.time()
        if left <= 0:
            conditions = set_condition(conditions, "Progressing", "False", "ProgressDeadlineExceeded",
                                       f'ReplicaSet "{name}" has timed out progressing.', now, update_time=True)
        else:
            wait = left
    status["conditions"] = list(conditions)
    return status, wait
