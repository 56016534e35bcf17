"""The DaemonSet controller of `--role=all`: one pod per matching node, rolled to a new template.

Why it exists: our own install tree runs the hypervisor as a DaemonSet, and users apply agents
the same way; on one box the DaemonSet must still get its pod and report it. A node matches when
it carries the template's nodeSelector labels and the template tolerates its NoSchedule and
NoExecute taints. Each pod is bound to its node at creation (`spec.nodeName`), owned by the
DaemonSet, and labelled `controller-revision-hash` with the template's hash; each template is kept
as a ControllerRevision (revisions.py) so `kubectl rollout history`/`undo` work. A rolling update
either deletes old pods while fewer than `rollingUpdate.maxUnavailable` nodes lack an available pod
(the next pass creates their replacement), or, with `maxSurge` > 0 (then kube requires
maxUnavailable 0), first starts the new pod beside the old one on up to maxSurge nodes at a time
and deletes the old pod once the new one has been Ready for `minReadySeconds`; a node whose old
pod is not available gets its new pod at once. `updateStrategy: OnDelete` replaces nothing.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from tfusion.api.accessors import Body, Node, Pod, section, sequence_of_maps
from tfusion.api.jsontypes import JsonMapping, JsonObject, json_copy, json_object
from tfusion.controller.scheduling.nodes import tolerates
from tfusion.embedded.workloads.common import (
    Workbench,
    available_in,
    expectation_key,
    is_active,
    is_ready,
    pod_from_template,
)
from tfusion.embedded.workloads.deployment import template_hash
from tfusion.embedded.workloads.revisions import CONTROLLER_REVISIONS, REVISION_HASH, History
from tfusion.kube import resources as r
from tfusion.kube.client import KubeError
from tfusion.kube.reconciler import Result
from tfusion.kube.resources import ApiResource

DAEMONSETS = ApiResource("apps", "v1", "daemonsets", "DaemonSet", True)
_BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")


def node_matches(template_spec: JsonMapping, node: Node) -> bool:
    """The template's nodeSelector holds on the node and its tolerations cover the node's taints."""
    labels = node.meta.labels
    if any(labels.get(k) != v for k, v in section(template_spec, "nodeSelector").items()):
        return False
    tolerations = sequence_of_maps(template_spec.get("tolerations"))
    return all(any(tolerates(t, taint) for t in tolerations)
               for taint in node.taints if taint.get("effect") in _BLOCKING_EFFECTS)


def _scaled(ds: Body, key: str, default: int | str, desired: int) -> int:
    """A rollingUpdate int-or-percent as a count (a percentage of `desired`, rounded up)."""
    value = section(ds.spec, "updateStrategy", "rollingUpdate").get(key, default)
    if isinstance(value, str) and value.endswith("%"):
        return -(-int(value[:-1]) * desired // 100)
    return int(str(value))


def rolling_budget(ds: Body, desired: int) -> tuple[int, int]:
    """(maxUnavailable, maxSurge) as counts; both 0 would stall, so kube then allows one unavailable."""
    unavailable, surge = _scaled(ds, "maxUnavailable", 1, desired), _scaled(ds, "maxSurge", 0, desired)
    return (1, 0) if unavailable == surge == 0 else (unavailable, surge)


class DaemonSetController:
    """Registers itself with the bench's Manager (leader-only, as in kube-controller-manager)."""

    def __init__(self, bench: Workbench) -> None:
        self.bench = bench
        cache = bench.manager.cache
        self.daemonsets = cache.informer(DAEMONSETS)
        self.nodes = cache.informer(r.NODES)
        self.history = History(bench)
        bench.manager.controller("daemonset").for_(DAEMONSETS).owns(r.PODS).owns(CONTROLLER_REVISIONS) \
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
        await self.history.record(ds, DAEMONSETS, f"{ds.name}-{revision}", revision)
        wanted = sorted(n.name for n in map(Node, self.nodes.list())
                        if node_matches(section(template, "spec"), n))
        pods = bench.pods_of(ds)
        active = [p for p in pods if is_active(p)]
        plan = None
        if bench.expectations.satisfied(wait_key, {p.name for p in pods}):
            plan = Rollout(ds, revision, wanted, active)
            await self._apply(ds, plan)
        in_use = {revision} | {p.meta.labels.get(REVISION_HASH, "") for p in pods}
        await self.history.prune(ds, {f"{ds.name}-{h}" for h in in_use})
        await bench.write_status(DAEMONSETS, ds, daemonset_status(ds, revision, wanted, active))
        if plan is not None and plan.failure is not None:
            return Result(requeue=True)
        return Result(requeue_after=plan.wait) if plan is not None and plan.wait is not None else None

    async def _apply(self, ds: Body, plan: Rollout) -> None:
        if plan.doomed:
            await self.bench.delete_pods(ds, DAEMONSETS, plan.doomed)
        plan.failure = await self._create(ds, plan.revision, plan.create_on)

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


class Rollout:
    """One pass's decisions: the pods to delete and the nodes to create a pod on (see the module docstring)."""

    def __init__(self, ds: Body, revision: str, wanted: list[str], active: list[Pod]) -> None:
        self.revision = revision
        self.min_ready = int(ds.spec.get("minReadySeconds") or 0)
        self.now = time.time()
        self.wait: float | None = None  # seconds until a ready pod becomes available
        self.failure: str | None = None
        self.max_unavailable, self.max_surge = rolling_budget(ds, len(wanted))
        by_node: dict[str, list[Pod]] = {}
        for pod in active:
            by_node.setdefault(pod.node_name, []).append(pod)
        self.doomed = [p for node, pods in by_node.items() if node not in wanted for p in pods]
        kept: dict[str, list[Pod]] = {}
        for node in wanted:
            extra = self._extras(by_node.get(node, []))
            self.doomed += extra
            kept[node] = [p for p in by_node.get(node, []) if p not in extra]
        self.create_on = [node for node in wanted if not kept[node]]
        if section(ds.spec, "updateStrategy").get("type") != "OnDelete":
            self._roll(kept)

    def available(self, pod: Pod) -> bool:
        left = available_in(pod, self.min_ready, self.now)
        if left is not None and left > 0:
            self.wait = left if self.wait is None else min(self.wait, left)
        return left == 0

    def _is_new(self, pod: Pod) -> bool:
        return pod.meta.labels.get(REVISION_HASH) == self.revision

    def _extras(self, pods: list[Pod]) -> list[Pod]:
        """Pods beyond what a node may run: one, or while surging the oldest new and oldest old pod,
        the old one only until the new one is available (or at once when the old one is not ready)."""
        oldest_first = sorted(pods, key=lambda p: (not is_ready(p), p.meta.creation_timestamp))
        if self.max_surge == 0:
            return oldest_first[1:]
        new = next((p for p in oldest_first if self._is_new(p)), None)
        old = next((p for p in oldest_first if not self._is_new(p)), None)
        extra = [p for p in oldest_first if p is not new and p is not old]
        if new is not None and old is not None and (not is_ready(old) or self.available(new)):
            extra.append(old)
        return extra

    def _roll(self, kept: dict[str, list[Pod]]) -> None:
        if self.max_surge > 0:
            self._surge(kept)
            return
        current = {node: pods[0] for node, pods in kept.items() if pods}
        unavailable = sum(1 for node in kept if node not in current or not self.available(current[node]))
        old = [p for p in current.values() if not self._is_new(p)]
        budget = max(0, self.max_unavailable - unavailable)
        # an old pod that is not available costs nothing to replace
        self.doomed += [p for p in old if not self.available(p)] + [p for p in old if self.available(p)][:budget]

    def _surge(self, kept: dict[str, list[Pod]]) -> None:
        """Old available pods get a new pod beside them, at most maxSurge at a time; old pods that
        are not available get theirs at once."""
        candidates, surging = [], 0
        for node, pods in kept.items():
            new = next((p for p in pods if self._is_new(p)), None)
            old = next((p for p in pods if not self._is_new(p)), None)
            if old is None or old in self.doomed:
                continue
            if new is not None:
                surging += 0 if self.available(new) else 1
            elif self.available(old):
                candidates.append(node)
            else:
                self.create_on.append(node)
        self.create_on += candidates[:max(0, self.max_surge - surging)]


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


__all__ = ["DAEMONSETS", "REVISION_HASH", "DaemonSetController", "Rollout", "daemonset_status", "node_matches",
           "rolling_budget"]
