"""The DaemonSet controller of `--role=all`: one pod per matching node, replaced one at a time on change.

Why it exists: our own install tree runs the hypervisor as a DaemonSet, and users apply agents
the same way; on one box the DaemonSet must still get its pod and report it. A node matches when
it carries the template's nodeSelector labels and the template tolerates its NoSchedule and
NoExecute taints. Each pod is bound to its node at creation (`spec.nodeName`), owned by the
DaemonSet, and labelled `controller-revision-hash` with the template's hash; pods of an older
template are deleted while fewer than `rollingUpdate.maxUnavailable` (default 1) nodes lack a ready
pod, and the next pass creates their replacement. `updateStrategy: OnDelete` replaces nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from tfusion.api.accessors import Body, Node, Pod, section, sequence_of_maps
from tfusion.api.jsontypes import JsonMapping, JsonObject, json_copy, json_object
from tfusion.controller.scheduling.nodes import tolerates
from tfusion.embedded.workloads.common import (
    Workbench,
    expectation_key,
    is_active,
    is_ready,
    pod_from_template,
)
from tfusion.embedded.workloads.deployment import template_hash
from tfusion.kube import resources as r
from tfusion.kube.client import KubeError
from tfusion.kube.reconciler import Result
from tfusion.kube.resources import ApiResource

DAEMONSETS = ApiResource("apps", "v1", "daemonsets", "DaemonSet", True)
REVISION_HASH = "controller-revision-hash"
_BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")


def node_matches(template_spec: JsonMapping, node: Node) -> bool:
    """The template's nodeSelector holds on the node and its tolerations cover the node's taints."""
    labels = node.meta.labels
    if any(labels.get(k) != v for k, v in section(template_spec, "nodeSelector").items()):
        return False
    tolerations = sequence_of_maps(template_spec.get("tolerations"))
    return all(any(tolerates(t, taint) for t in tolerations)
               for taint in node.taints if taint.get("effect") in _BLOCKING_EFFECTS)


def max_unavailable(ds: Body, desired: int) -> int:
    """rollingUpdate.maxUnavailable as a count (a percentage rounds up, at least 1)."""
    value = section(ds.spec, "updateStrategy", "rollingUpdate").get("maxUnavailable", 1)
    if isinstance(value, str) and value.endswith("%"):
        return max(1, -(-int(value[:-1]) * desired // 100))
    return max(1, int(str(value)))


class DaemonSetController:
    """Registers itself with the bench's Manager (leader-only, as in kube-controller-manager)."""

    def __init__(self, bench: Workbench) -> None:
        self.bench = bench
        cache = bench.manager.cache
        self.daemonsets = cache.informer(DAEMONSETS)
        self.nodes = cache.informer(r.NODES)
        bench.manager.controller("daemonset").for_(DAEMONSETS).owns(r.PODS) \
            .watches(r.NODES, self._all_daemonsets).complete(self.reconcile)

    def _all_daemonsets(self, _node: JsonMapping) -> list[str]:
        """A node that comes, goes or changes may change where every DaemonSet wants a pod."""
        return [f"{ds.namespace}/{ds.name}" for ds in map(Body, self.daemonsets.list())]

    async def reconcile(self, key: str) -> Result | None:
        bench = self.bench
        raw = self.daemonsets.get(key)
        wait_key = f"{DAEMONSETS.plural}/{key}"
        if raw is None:
            bench.expectations.forget(wait_key)
            return None
        ds = Body(raw)
        if ds.meta.deleting:
            return None
        template = section(ds.spec, "template")
        revision = template_hash(template)
        wanted = sorted(n.name for n in map(Node, self.nodes.list())
                        if node_matches(section(template, "spec"), n))
        pods = bench.pods_of(ds)
        active = [p for p in pods if is_active(p)]
        failure = None
        if bench.expectations.satisfied(wait_key, {p.name for p in pods}):
            failure = await self._sync(ds, revision, wanted, active)
        await bench.write_status(DAEMONSETS, ds, daemonset_status(ds, revision, wanted, active))
        return Result(requeue=True) if failure is not None else None

    async def _sync(self, ds: Body, revision: str, wanted: list[str], active: list[Pod]) -> str | None:
        """Delete pods on nodes that no longer match (and extras), roll old ones, create the missing."""
        by_node: dict[str, list[Pod]] = {}
        for pod in active:
            by_node.setdefault(pod.node_name, []).append(pod)
        doomed = [p for node, pods in by_node.items() if node not in wanted for p in pods]
        for pods in by_node.values():
            doomed += sorted(pods, key=lambda p: (not is_ready(p), p.meta.creation_timestamp))[1:]
        doomed += self._to_roll(ds, revision, wanted, by_node)
        if doomed:
            await self.bench.delete_pods(ds, DAEMONSETS, doomed)
        missing = [node for node in wanted if node not in by_node]
        return await self._create(ds, revision, missing)

    @staticmethod
    def _to_roll(ds: Body, revision: str, wanted: Sequence[str], by_node: dict[str, list[Pod]]) -> list[Pod]:
        """Old-template pods to delete now, keeping at most maxUnavailable nodes without a ready pod."""
        if section(ds.spec, "updateStrategy").get("type") == "OnDelete":
            return []
        current = {node: pods[0] for node, pods in by_node.items() if node in wanted and pods}
        unavailable = sum(1 for node in wanted if node not in current or not is_ready(current[node]))
        old = [p for p in current.values() if p.meta.labels.get(REVISION_HASH) != revision]
        old.sort(key=lambda p: is_ready(p))  # the not-ready ones cost no availability
        budget = max_unavailable(ds, len(wanted)) - unavailable
        return [p for p in old if not is_ready(p)] + [p for p in old if is_ready(p)][:max(0, budget)]

    async def _create(self, ds: Body, revision: str, nodes: Sequence[str]) -> str | None:
        created: list[str] = []
        failure = None
        for node in nodes:
            body = daemon_pod(ds, revision, node)
            try:
                pod = Body(await self.bench.client.create(r.PODS, body, namespace=ds.namespace or None))
            except KubeError as exc:
                failure = f"Error creating: {exc}"
                self.bench.event(ds, "FailedCreate", failure, warning=True)
                break
            created.append(pod.name)
            self.bench.event(ds, "SuccessfulCreate", f"Created pod: {pod.name}")
        self.bench.expectations.expect(expectation_key(DAEMONSETS, ds), created=created)
        return failure


def daemon_pod(ds: Body, revision: str, node: str) -> JsonObject:
    """The DaemonSet's pod for `node`: its template, bound to the node, labelled with the revision."""
    pod = pod_from_template(ds, DAEMONSETS)
    meta = section(pod, "metadata")
    labels = json_object(section(meta, "labels"))
    labels[REVISION_HASH] = revision
    pod["metadata"] = {**json_object(meta), "labels": labels}
    pod["spec"] = {**json_object(section(pod, "spec")), "nodeName": node}
    return pod


def daemonset_status(ds: Body, revision: str, wanted: list[str], active: list[Pod]) -> JsonObject:
    on_wanted = [p for p in active if p.node_name in wanted]
    scheduled = {p.node_name for p in on_wanted}
    ready = {p.node_name for p in on_wanted if is_ready(p)}
    updated = {p.node_name for p in on_wanted if p.meta.labels.get(REVISION_HASH) == revision}
    generation = json_copy(ds.meta.raw.get("generation", ds.status.get("observedGeneration", 0)))
    return {"desiredNumberScheduled": len(wanted), "currentNumberScheduled": len(scheduled),
            "numberMisscheduled": len({p.node_name for p in active} - set(wanted)),
            "numberReady": len(ready), "updatedNumberScheduled": len(updated),
            "numberAvailable": len(ready), "numberUnavailable": len(wanted) - len(ready),
            "observedGeneration": generation}


__all__ = ["DAEMONSETS", "REVISION_HASH", "DaemonSetController", "daemonset_status", "node_matches"]
