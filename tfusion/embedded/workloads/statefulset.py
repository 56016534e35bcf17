"""The StatefulSet controller of `--role=all`: ordinal pods started in order and stopped in reverse.

Why it exists: distributed training and inference servers are often StatefulSets (stable names,
ordered start), and the pod webhook already names a workload after a StatefulSet owner. Pods are
named `<set>-0` .. `<set>-N-1`, with hostname and subdomain (`spec.serviceName`) set and the labels
`statefulset.kubernetes.io/pod-name`, `apps.kubernetes.io/pod-index` and `controller-revision-hash`
(the name of the template's ControllerRevision, revisions.py: `status.updateRevision`, and
`status.currentRevision` until every pod runs it, so `kubectl rollout history`/`undo` work).
Under the default `podManagementPolicy: OrderedReady` the next ordinal is created only when every
lower one is Running and Ready, scale-down deletes the highest ordinal first and waits for it to be
gone, and a template change replaces pods from the highest ordinal down, one at a time
(`Parallel` creates and deletes without waiting). A failed or succeeded pod is deleted and made
again under the same name. Each pod's `volumeClaimTemplates` claims are made before it (claims.py).
"""

from __future__ import annotations

import re

from tfusion.api.accessors import Body, Pod, section
from tfusion.api.jsontypes import JsonObject, json_copy, json_object
from tfusion.embedded.workloads.claims import SetClaims, mount_claims
from tfusion.embedded.workloads.common import Workbench, expectation_key, is_ready, pod_from_template, replicas_of
from tfusion.embedded.workloads.deployment import template_hash
from tfusion.embedded.workloads.revisions import CONTROLLER_REVISIONS, REVISION_HASH, History
from tfusion.kube import resources as r
from tfusion.kube.client import AlreadyExists, KubeError
from tfusion.kube.reconciler import Result
from tfusion.kube.resources import ApiResource

STATEFULSETS = ApiResource("apps", "v1", "statefulsets", "StatefulSet", True)
POD_NAME = "statefulset.kubernetes.io/pod-name"
POD_INDEX = "apps.kubernetes.io/pod-index"


def ordinal_of(set_name: str, pod: Pod) -> int | None:
    """The ordinal of `<set>-<n>`; None for a pod not so named."""
    match = re.fullmatch(re.escape(set_name) + r"-(0|[1-9][0-9]*)", pod.name)
    return int(match.group(1)) if match else None


def stateful_pod(sts: Body, revision: str, ordinal: int) -> JsonObject:
    """Pod `<set>-<ordinal>` from the template, with its stable hostname and identity labels."""
    pod = pod_from_template(sts, STATEFULSETS)
    name = f"{sts.name}-{ordinal}"
    meta = json_object(section(pod, "metadata"))
    meta.pop("generateName", None)
    labels = json_object(section(meta, "labels"))
    labels.update({POD_NAME: name, POD_INDEX: str(ordinal), REVISION_HASH: revision})
    pod["metadata"] = {**meta, "name": name, "labels": labels}
    spec = json_object(section(pod, "spec"))
    spec["hostname"] = name
    service = sts.spec.get("serviceName")
    if service:
        spec["subdomain"] = json_copy(service)
    mount_claims(sts, ordinal, spec)
    pod["spec"] = spec
    return pod


class StatefulSetController:
    """Registers itself with the bench's Manager (leader-only, as in kube-controller-manager)."""

    def __init__(self, bench: Workbench) -> None:
        self.bench = bench
        self.statefulsets = bench.manager.cache.informer(STATEFULSETS)
        self.history = History(bench)
        self.claims = SetClaims(bench, STATEFULSETS)
        bench.manager.controller("statefulset").for_(STATEFULSETS).owns(r.PODS).owns(CONTROLLER_REVISIONS) \
            .complete(self.reconcile)

    async def reconcile(self, key: str) -> Result | None:
        bench = self.bench
        raw = self.statefulsets.get(key)
        wait_key = f"{STATEFULSETS.plural}/{key}"
        if raw is None:
            bench.expectations.forget(wait_key)
            return None
        sts = Body(raw)
        if sts.meta.deleting:
            return None
        name = f"{sts.name}-{template_hash(section(sts.spec, 'template'))}"
        revision = await self.history.record(sts, STATEFULSETS, name, name)
        pods = bench.pods_of(sts)
        failure = None
        if bench.expectations.satisfied(wait_key, {p.name for p in pods}):
            failure = await self._sync(sts, revision, pods)
        status = statefulset_status(sts, revision, pods)
        in_use = {revision, str(status["currentRevision"])} | {p.meta.labels.get(REVISION_HASH, "") for p in pods}
        await self.history.prune(sts, in_use)
        await bench.write_status(STATEFULSETS, sts, status)
        return Result(requeue=True) if failure is not None else None

    async def _sync(self, sts: Body, revision: str, pods: list[Pod]) -> str | None:
        """One step toward `replicas` pods of the current template (see the module docstring)."""
        ordered = sts.spec.get("podManagementPolicy") != "Parallel"
        by_ordinal = {n: p for p in pods if (n := ordinal_of(sts.name, p)) is not None}
        finished = [p for p in by_ordinal.values() if p.finished and not p.meta.deleting]
        if finished:
            await self.bench.delete_pods(sts, STATEFULSETS, finished)
            return None
        replicas = replicas_of(sts)
        await self.claims.keep_owners(sts, by_ordinal.items(), replicas)
        for ordinal in range(replicas):
            pod = by_ordinal.get(ordinal)
            if pod is None:
                failure = await self._create(sts, revision, ordinal)
                if failure is not None or ordered:
                    return failure
            elif ordered and (pod.meta.deleting or not is_ready(pod)):
                return None
        extra = sorted((n for n in by_ordinal if n >= replicas), reverse=True)
        if ordered and any(by_ordinal[n].meta.deleting for n in by_ordinal):
            return None  # one pod at a time: wait until the one going is gone
        doomed = [by_ordinal[n] for n in extra if not by_ordinal[n].meta.deleting]
        if not doomed:
            doomed = self._to_update(sts, revision, by_ordinal, replicas)
        if doomed:
            await self.bench.delete_pods(sts, STATEFULSETS, doomed[:1] if ordered else doomed)
        return None

    @staticmethod
    def _to_update(sts: Body, revision: str, by_ordinal: dict[int, Pod], replicas: int) -> list[Pod]:
        """RollingUpdate: the highest ordinal (at or above the partition) still on an old template."""
        strategy = section(sts.spec, "updateStrategy")
        if strategy.get("type") == "OnDelete":
            return []
        partition = int(section(strategy, "rollingUpdate").get("partition") or 0)
        return [by_ordinal[n] for n in sorted(by_ordinal, reverse=True)
                if partition <= n < replicas and by_ordinal[n].meta.labels.get(REVISION_HASH) != revision][:1]

    async def _create(self, sts: Body, revision: str, ordinal: int) -> str | None:
        failure = await self.claims.create(sts, ordinal)
        if failure is not None:
            return failure
        try:
            pod = Body(await self.bench.client.create(r.PODS, stateful_pod(sts, revision, ordinal),
                                                      namespace=sts.namespace or None))
        except AlreadyExists:
            return None  # not ours yet in the cache, or a stranger's: the next pass sees it
        except KubeError as exc:
            failure = f"create Pod {sts.name}-{ordinal} in StatefulSet {sts.name} failed error: {exc}"
            self.bench.event(sts, "FailedCreate", failure, warning=True)
            return failure
        self.bench.event(sts, "SuccessfulCreate", f"create Pod {pod.name} in StatefulSet {sts.name} successful")
        self.bench.expectations.expect(expectation_key(STATEFULSETS, sts), created=[pod.name])
        return None


def statefulset_status(sts: Body, revision: str, pods: list[Pod]) -> JsonObject:
    """replicas (pods that exist), ready, current and updated replicas, and the two revisions."""
    live = [p for p in pods if ordinal_of(sts.name, p) is not None and not p.meta.deleting]
    update_revision = revision
    updated = [p for p in live if p.meta.labels.get(REVISION_HASH) == revision]
    current_revision = str(sts.status.get("currentRevision") or update_revision)
    if len(updated) == len(live) == replicas_of(sts):
        current_revision = update_revision
    ready = sum(1 for p in live if is_ready(p))
    generation = json_copy(sts.meta.raw.get("generation", sts.status.get("observedGeneration", 0)))
    return {"replicas": len(live), "readyReplicas": ready, "availableReplicas": ready,
            "currentReplicas": sum(1 for p in live if p.meta.labels.get(REVISION_HASH) == current_revision),
            "updatedReplicas": len(updated), "currentRevision": current_revision,
            "updateRevision": update_revision, "observedGeneration": generation,
            "collisionCount": json_copy(sts.status.get("collisionCount", 0))}


__all__ = ["POD_INDEX", "POD_NAME", "STATEFULSETS", "StatefulSetController", "ordinal_of", "statefulset_status"]
