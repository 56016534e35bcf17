"""The workload controllers of `--role=all`: what kube-controller-manager does for the workload kinds.

Why it exists: users try TensorFusion with a Deployment or a Job, not a bare pod, and the pod
webhook names a TensorFusionWorkload after the pod's owner chain (ReplicaSet -> Deployment), so
the embedded cluster needs real owners. These are small, level-triggered versions of kube's
controllers, on the Manager's reconciler builder, leader-only as in kube-controller-manager; one
module per kind (`replicaset`, `deployment`, `job` with `indexed`, `cronjob`, `daemonset`,
`statefulset`, with the sets' ControllerRevisions in `revisions` and a StatefulSet's claims in
`claims`) and what they share in `common`. The CronJob controller reads an injectable `wall`
clock (epoch seconds), so tests move time by hand.

Pods are created through the API, so the pod webhook (when registered) mutates them like any pod.
Each controller waits until the pods it created (or deleted) show up in (or leave) its cache
before it acts again — kube's "expectations" — so a lagging cache never doubles the pods.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from tfusion.apiserver.apps import JOB_CONTROLLER_UID
from tfusion.embedded.workloads.common import Workbench, deletion_rank, set_condition
from tfusion.embedded.workloads.cronjob import CronJobController
from tfusion.embedded.workloads.daemonset import DaemonSetController
from tfusion.embedded.workloads.deployment import (
    POD_TEMPLATE_HASH,
    REVISION,
    DeploymentController,
    resolve_fenceposts,
    template_hash,
)
from tfusion.embedded.workloads.job import JobController
from tfusion.embedded.workloads.replicaset import ReplicaSetController
from tfusion.embedded.workloads.statefulset import StatefulSetController
from tfusion.kube.manager import Manager


class WorkloadControllers:
    """Registers the workload controllers with `manager` (leader-only); see the module docstring."""

    def __init__(self, manager: Manager, *, wall: Callable[[], float] = time.time) -> None:
        self.bench = Workbench(manager)
        self.deployments = DeploymentController(self.bench)
        self.replicasets = ReplicaSetController(self.bench)
        self.jobs = JobController(self.bench)
        self.daemonsets = DaemonSetController(self.bench)
        self.statefulsets = StatefulSetController(self.bench)
        self.cronjobs = CronJobController(self.bench, wall=wall)  # wall: epoch seconds (tests move it)


__all__ = ["JOB_CONTROLLER_UID", "POD_TEMPLATE_HASH", "REVISION", "WorkloadControllers", "deletion_rank",
           "resolve_fenceposts", "set_condition", "template_hash"]
