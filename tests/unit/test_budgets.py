"""A PodDisruptionBudget's arithmetic (tfusion/apiserver/budgets.py) as kube's disruption controller
counts it: an integer minAvailable over the selected pods, percentages and maxUnavailable over the
pods' controllers' scale (a Deployment through its ReplicaSets, each controller once), unmanaged
pods left out, an unscaled controller a sync failure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from tfusion.apiserver.budgets import budget_numbers, budget_status, scale_from

STORED: dict[tuple[str, str], dict[str, Any]] = {
    ("Deployment", "web"): {"metadata": {"name": "web", "uid": "d1"}, "spec": {"replicas": 6}},
    ("ReplicaSet", "web-old"): {"metadata": {"name": "web-old", "uid": "rs1", "ownerReferences": [
        {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": "d1", "controller": True}]},
        "spec": {"replicas": 2}},
    ("ReplicaSet", "web-new"): {"metadata": {"name": "web-new", "uid": "rs2", "ownerReferences": [
        {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": "d1", "controller": True}]},
        "spec": {"replicas": 4}},
    ("ReplicaSet", "lone"): {"metadata": {"name": "lone", "uid": "rs3"}, "spec": {"replicas": 3}},
    ("StatefulSet", "db"): {"metadata": {"name": "db", "uid": "s1"}, "spec": {}},  # replicas unset: 1
}


def lookup(kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
    return STORED.get((kind, name))


SCALE_OF = scale_from(lookup)


def pod(name: str, owner: str | None = None, *, ready: bool = True) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "default"}
    if owner is not None:
        kind, _, owner_name = owner.partition("/")
        uid = STORED[(kind, owner_name)]["metadata"]["uid"] if (kind, owner_name) in STORED else "gone"
        meta["ownerReferences"] = [{"apiVersion": "apps/v1" if kind != "Job" else "batch/v1", "kind": kind,
                                    "name": owner_name, "uid": uid, "controller": True}]
    condition = {"type": "Ready", "status": "True" if ready else "False"}
    return {"metadata": meta, "status": {"phase": "Running", "conditions": [condition]}}


def budget(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "b", "generation": 1}, "spec": spec}


DEPLOYMENT_PODS = [pod("a", "ReplicaSet/web-old"), pod("b", "ReplicaSet/web-new"), pod("c", "ReplicaSet/web-new")]


@pytest.mark.parametrize(("spec", "pods", "expected", "desired"), [
    ({"minAvailable": 2}, DEPLOYMENT_PODS, 3, 2),  # an integer: the pods there are
    ({"minAvailable": "50%"}, DEPLOYMENT_PODS, 6, 3),  # the Deployment's 6, counted once for both ReplicaSets
    ({"maxUnavailable": 1}, DEPLOYMENT_PODS, 6, 5),
    ({"maxUnavailable": "10%"}, DEPLOYMENT_PODS, 6, 5),  # 0.6 rounds up to 1
    ({"minAvailable": "100%"}, [pod("x", "ReplicaSet/lone")], 3, 3),
    ({"maxUnavailable": 0}, [pod("d", "StatefulSet/db")], 1, 1),
    ({"maxUnavailable": 1}, [pod("bare"), pod("x", "ReplicaSet/lone")], 3, 2),  # the bare pod is not expected
    ({"maxUnavailable": 5}, [pod("x", "ReplicaSet/lone")], 3, 0),  # never below 0
])
def test_expected_and_desired(spec: dict[str, Any], pods: list[dict[str, Any]], expected: int, desired: int) -> None:
    found_expected, found_desired, _, failure = budget_numbers(budget(**spec), pods, SCALE_OF)
    assert (found_expected, found_desired, failure) == (expected, desired, None)


def test_unmanaged_pods_are_named() -> None:
    _, _, unmanaged, _ = budget_numbers(budget(maxUnavailable=1), [pod("bare"), pod("x", "ReplicaSet/lone")],
                                        SCALE_OF)
    assert unmanaged == ["bare"]


@pytest.mark.parametrize("owner", ["Job/train", "DaemonSet/agent", "ReplicaSet/missing"])
def test_a_controller_without_a_known_scale_allows_no_disruption(owner: str) -> None:
    pods = [pod("p", owner), pod("q", "ReplicaSet/lone")]
    status = budget_status(budget(maxUnavailable=1), pods, SCALE_OF)
    assert status["disruptionsAllowed"] == 0
    condition = status["conditions"][0]
    assert (condition["type"], condition["status"], condition["reason"], condition["message"]) == \
        ("DisruptionAllowed", "False", "SyncFailed", 'found no controllers for pod "p"')


def test_a_reference_whose_uid_differs_is_not_that_controller() -> None:
    stale = pod("p", "ReplicaSet/lone")
    stale["metadata"]["ownerReferences"][0]["uid"] = "an-older-lone"
    assert budget_numbers(budget(maxUnavailable=1), [stale], SCALE_OF)[3] == 'found no controllers for pod "p"'


def test_status_counts_the_healthy_pods_and_keeps_the_transition_time() -> None:
    pods = [*DEPLOYMENT_PODS[:2], pod("c", "ReplicaSet/web-new", ready=False)]
    status = budget_status(budget(minAvailable=1), pods, SCALE_OF)
    assert (status["currentHealthy"], status["desiredHealthy"], status["expectedPods"],
            status["disruptionsAllowed"]) == (2, 1, 3, 1)
    assert status["conditions"][0]["reason"] == "SufficientPods"
    earlier = {**budget(minAvailable=1), "status": {"conditions": [
        {**status["conditions"][0], "lastTransitionTime": "2020-01-01T00:00:00Z"}]}}
    again = budget_status(earlier, pods, SCALE_OF)
    assert again["conditions"][0]["lastTransitionTime"] == "2020-01-01T00:00:00Z"
    blocked = budget_status(earlier, pods[:1], SCALE_OF)  # one healthy pod left: the status flips
    assert blocked["conditions"][0]["reason"] == "InsufficientPods"
    assert blocked["conditions"][0]["lastTransitionTime"] != "2020-01-01T00:00:00Z"
