"""The webhook reads only a pod's own controller, and only of the kinds Kubernetes makes pod
controllers (ReplicaSet, StatefulSet, Job): the controller's RBAC grants nothing on Deployments,
CronJobs or DaemonSets (tfusion/controller/rbac_needs.py), so a pod owned by one of those directly
is named after it without a lookup."""

from __future__ import annotations

from typing import Any

import pytest

from tfusion.api.accessors import Pod
from tfusion.controller.webhook.workloads import OwnerResolver
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient

pytestmark = pytest.mark.anyio
NS = "default"


def pod_owned_by(kind: str, api_version: str, name: str, uid: str) -> Pod:
    return Pod({"metadata": {"name": f"{name}-x", "namespace": NS, "ownerReferences": [
        {"apiVersion": api_version, "kind": kind, "name": name, "uid": uid, "controller": True}]}})


@pytest.mark.parametrize(("kind", "api_version"), [("Deployment", "apps/v1"), ("CronJob", "batch/v1"),
                                                   ("DaemonSet", "apps/v1")])
async def test_an_owner_that_is_not_a_pod_controller_is_not_read(kube: KubeClient, kind: str,
                                                                  api_version: str) -> None:
    resolver = OwnerResolver(kube)
    owner = await resolver.resolve(pod_owned_by(kind, api_version, "train", "u-1"), NS)
    assert owner.workload_name == "train"
    assert owner.reference is not None and owner.reference["kind"] == kind
    assert resolver.lookups == 0
    assert await resolver.claim_grey_release(owner, NS, "abc", 2) is not None, "no counter to keep: admitted"


async def test_a_job_is_read_and_names_its_cronjob(kube: KubeClient) -> None:
    template = {"spec": {"restartPolicy": "Never", "containers": [{"name": "a", "image": "busybox"}]}}
    cronjob = await kube.create(r.CRONJOBS, {"metadata": {"name": "nightly", "namespace": NS}, "spec": {
        "schedule": "0 3 * * *", "suspend": True, "jobTemplate": {"spec": {"template": template}}}}, namespace=NS)
    job: dict[str, Any] = await kube.create(r.JOBS, {"metadata": {
        "name": "nightly-1", "namespace": NS,
        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "CronJob", "name": "nightly",
                             "uid": cronjob["metadata"]["uid"], "controller": True}]},
        "spec": {"template": template}}, namespace=NS)
    resolver = OwnerResolver(kube)
    owner = await resolver.resolve(pod_owned_by("Job", "batch/v1", "nightly-1", job["metadata"]["uid"]), NS)
    assert (owner.workload_name, resolver.lookups) == ("nightly", 1)
    assert owner.reference is not None and owner.reference["kind"] == "CronJob"
    assert await resolver.claim_grey_release(owner, NS, "abc", 1) is not None
    assert await resolver.claim_grey_release(owner, NS, "abc", 1) is None, "the Job's counter reached 1"
