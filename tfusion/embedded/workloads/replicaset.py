"""The ReplicaSet controller of `--role=all`: keep `spec.replicas` active pods, count them in status.

Why it exists: a Deployment's pods belong to its ReplicaSets, and the pod webhook names a
TensorFusionWorkload after that owner chain, so the embedded cluster needs kube's ReplicaSet
behaviour: pods with generateName `<rs>-`, the template's labels and annotations, a controller
ownerReference with blockOwnerDeletion. Extra pods go unscheduled first, then pending, then not
ready, then the newest.
"""

from __future__ import annotations

import time

from tfusion.api.accessors import Body, Pod, section
from tfusion.api.jsontypes import JsonObject, json_copy, json_object
from tfusion.api.timestamps import rfc3339
from tfusion.embedded.workloads.common import (
    Workbench,
    available_in,
    deletion_rank,
    is_active,
    is_ready,
    replicas_of,
    set_condition,
)
from tfusion.kube import resources as r
from tfusion.kube.reconciler import Result


class ReplicaSetController:
    """Registers itself with the bench's Manager (leader-only, as in kube-controller-manager)."""

    def __init__(self, bench: Workbench) -> None:
        self.bench = bench
        bench.manager.controller("replicaset").for_(r.REPLICASETS).owns(r.PODS).complete(self.reconcile)

    async def reconcile(self, key: str) -> Result | None:
        bench = self.bench
        raw = bench.replicasets.get(key)
        expectation_key = f"{r.REPLICASETS.plural}/{key}"
        if raw is None:
            bench.expectations.forget(expectation_key)
            return None
        rs = Body(raw)
        if rs.meta.deleting:
            return None  # the garbage collector takes its pods
        pods = bench.pods_of(rs)
        active = [p for p in pods if is_active(p)]
        failure = None
        if bench.expectations.satisfied(expectation_key, {p.name for p in pods}):
            diff = len(active) - replicas_of(rs)
            if diff < 0:
                failure = await bench.create_pods(rs, r.REPLICASETS, -diff)
            elif diff > 0:
                await bench.delete_pods(rs, r.REPLICASETS, sorted(active, key=deletion_rank)[:diff])
        status, wait = replicaset_status(rs, active, failure)
        await bench.write_status(r.REPLICASETS, rs, status)
        if failure is not None:
            return Result(requeue=True)  # retried with backoff, as kube retries a failed create
        return Result(requeue_after=wait) if wait is not None else None


def replicaset_status(rs: Body, active: list[Pod], failure: str | None) -> tuple[JsonObject, float | None]:
    """The status counted from the active pods, and how long until one of them becomes available."""
    min_ready = int(rs.spec.get("minReadySeconds") or 0)
    now = time.time()
    template_labels = section(rs.spec, "template", "metadata", "labels")
    ready = available = labelled = 0
    wait: float | None = None
    for pod in active:
        labels = pod.meta.labels
        labelled += all(labels.get(k) == v for k, v in template_labels.items())
        if is_ready(pod):
            ready += 1
        remaining = available_in(pod, min_ready, now)
        if remaining == 0:
            available += 1
        elif remaining is not None:
            wait = remaining if wait is None else min(wait, remaining)
    old_status = rs.status
    generation = json_copy(rs.meta.raw.get("generation", old_status.get("observedGeneration", 0)))
    status: JsonObject = {"replicas": len(active), "fullyLabeledReplicas": labelled, "readyReplicas": ready,
                              "availableReplicas": available, "observedGeneration": generation}
    kept = [c for c in rs.conditions if c.get("type") != "ReplicaFailure"]
    conditions = set_condition(kept, "ReplicaFailure", "True", "FailedCreate", failure, rfc3339()) \
        if failure is not None else [json_object(c) for c in kept]
    if conditions:
        status["conditions"] = list(conditions)
    return status, wait
