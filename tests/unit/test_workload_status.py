"""The status the embedded ReplicaSet, Deployment and Job controllers write, from their owned objects
read through the typed views (pure functions: no API server needed)."""

from __future__ import annotations

import time
from typing import Any

from tfusion.api.accessors import Body, Pod, items, text
from tfusion.api.jsontypes import JsonObject, JsonValue
from tfusion.api.timestamps import rfc3339
from tfusion.embedded.workloads.common import pod_from_template
from tfusion.embedded.workloads.deployment import deployment_status
from tfusion.embedded.workloads.job import job_failure
from tfusion.embedded.workloads.replicaset import replicaset_status
from tfusion.kube import resources as r

TEMPLATE: JsonObject = {"metadata": {"labels": {"app": "web"}, "annotations": {"note": "x"}},
            "spec": {"containers": [{"name": "m", "image": "busybox"}]}}


def ready_pod(name: str, ready_since: float | None, labels: dict[str, str] | None = None) -> Pod:
    conditions: list[JsonValue] = [] if ready_since is None else [
        {"type": "Ready", "status": "True", "lastTransitionTime": rfc3339(ready_since)}]
    return Pod({"metadata": {"name": name, "labels": labels if labels is not None else {"app": "web"}},
                "status": {"phase": "Running", "conditions": conditions}})


def test_a_pod_from_a_template_belongs_to_its_owner_and_shares_nothing_with_it() -> None:
    owner = Body({"metadata": {"name": "web-abc", "namespace": "ns", "uid": "u1"}, "spec": {"template": TEMPLATE}})
    pod = Pod(pod_from_template(owner, r.REPLICASETS))
    assert pod.meta.raw["generateName"] == "web-abc-" and pod.namespace == "ns"
    assert pod.meta.labels == {"app": "web"} and pod.meta.annotations == {"note": "x"}
    assert pod.meta.owner_references == [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-abc",
                                          "uid": "u1", "controller": True, "blockOwnerDeletion": True}]
    items(pod.spec, "containers")[0]["image"] = "changed"
    labels = pod.meta.raw["labels"]
    assert isinstance(labels, dict)
    labels["app"] = "changed"
    assert text(items(TEMPLATE, "spec", "containers")[0], "image") == "busybox"
    assert text(TEMPLATE, "metadata", "labels", "app") == "web"


def test_replicaset_status_counts_ready_available_and_labelled_pods() -> None:
    now = time.time()
    rs = Body({"metadata": {"generation": 3},
               "spec": {"minReadySeconds": 60, "template": {"metadata": {"labels": {"app": "web"}}}}})
    pods = [ready_pod("long-ready", now - 600), ready_pod("just-ready", now - 10),
            ready_pod("not-ready", None), ready_pod("relabelled", now - 600, {"app": "other"})]
    status, wait = replicaset_status(rs, pods, None)
    assert status["replicas"] == 4 and status["readyReplicas"] == 3 and status["availableReplicas"] == 2
    assert status["fullyLabeledReplicas"] == 3 and status["observedGeneration"] == 3
    assert wait is not None and 40 < wait <= 50  # the just-ready pod becomes available then
    assert "conditions" not in status


def test_a_failed_create_is_a_replica_failure_until_creates_succeed_again() -> None:
    rs = Body({"spec": {}, "status": {}})
    failing, _ = replicaset_status(rs, [], "Error creating: quota")
    assert [(c["type"], c["reason"], c["message"]) for c in Body({"status": failing}).conditions] == [
        ("ReplicaFailure", "FailedCreate", "Error creating: quota")]
    healed, _ = replicaset_status(Body({"spec": {}, "status": failing}), [], None)
    assert "conditions" not in healed


def deployment(status: dict[str, Any], **spec: Any) -> Body:
    return Body({"metadata": {"name": "web", "generation": 2}, "spec": {"replicas": 2, **spec}, "status": status})


def test_a_deployment_without_progress_past_its_deadline_says_so() -> None:
    stale = rfc3339(time.time() - 120)
    progressing = {"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated", "message": "m",
                   "lastUpdateTime": stale, "lastTransitionTime": stale}
    counts = {"replicas": 2, "updatedReplicas": 2, "readyReplicas": 0, "availableReplicas": 0}
    rs = Body({"metadata": {"name": "web-1"}, "status": {"replicas": 2, "readyReplicas": 0, "availableReplicas": 0}})
    waiting = deployment({**counts, "conditions": [progressing]}, progressDeadlineSeconds=600)
    status, wait = deployment_status(waiting, rs, [rs], progressed=False)
    assert wait is not None and 470 < wait <= 480
    late = deployment({**counts, "conditions": [progressing]}, progressDeadlineSeconds=60)
    status, wait = deployment_status(late, rs, [rs], progressed=False)
    by_type = {c["type"]: c for c in Body({"status": status}).conditions}
    progress = by_type["Progressing"]
    assert progress["status"] == "False" and progress["reason"] == "ProgressDeadlineExceeded"
    assert by_type["Available"]["status"] == "False" and status["unavailableReplicas"] == 2 and wait is None
    assert status["observedGeneration"] == 2


def test_a_job_fails_past_its_backoff_limit_or_its_deadline() -> None:
    job = Body({"spec": {"backoffLimit": 2, "activeDeadlineSeconds": 30}})
    assert job_failure(job, 1000.0, 2, 1010.0) is None
    assert job_failure(job, 1000.0, 3, 1010.0) == ("BackoffLimitExceeded",
                                                   "Job has reached the specified backoff limit")
    assert job_failure(job, 1000.0, 0, 1030.0) == ("DeadlineExceeded",
                                                   "Job was active longer than specified deadline")
    assert job_failure(Body({"spec": {}}), None, 6, 1e9) is None  # backoffLimit defaults to 6, no deadline
