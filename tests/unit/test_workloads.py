"""Pure parts of the --role=all workload controllers: template hashes, rolling-update fenceposts,
which pods a ReplicaSet deletes first, and conditions."""

from __future__ import annotations

from typing import Any

from tfusion.api.accessors import Body, Pod
from tfusion.api.jsontypes import JsonObject
from tfusion.embedded.workloads import deletion_rank, resolve_fenceposts, set_condition, template_hash

TEMPLATE: JsonObject = {"metadata": {"labels": {"app": "web"}},
                        "spec": {"containers": [{"name": "m", "image": "busybox"}]}}


def test_template_hash_is_stable_and_name_safe() -> None:
    first = template_hash(TEMPLATE)
    assert first == template_hash({"spec": TEMPLATE["spec"], "metadata": TEMPLATE["metadata"]})  # key order
    assert first != template_hash(TEMPLATE, 1)  # a collision count gives another name
    other = {**TEMPLATE, "spec": {"containers": [{"name": "m", "image": "busybox:2"}]}}
    assert first != template_hash(other)
    assert first.isalnum() and first == first.lower() and not set("aeiou013") & set(first)


def deploy(replicas: int, strategy: dict[str, Any]) -> Body:
    return Body({"spec": {"replicas": replicas, "strategy": strategy}})


def test_fenceposts_round_surge_up_and_unavailable_down() -> None:
    rolling = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}}
    assert resolve_fenceposts(deploy(10, rolling)) == (3, 2)
    assert resolve_fenceposts(deploy(1, rolling)) == (1, 0)
    assert resolve_fenceposts(deploy(3, {"type": "RollingUpdate", "rollingUpdate": {
        "maxSurge": 0, "maxUnavailable": "10%"}})) == (0, 1)  # never both 0
    assert resolve_fenceposts(deploy(3, {"type": "Recreate"})) == (0, 0)


def pod(name: str, created: str, *, node: bool = True, phase: str = "Running", ready: bool = True) -> dict[str, Any]:
    return {"metadata": {"name": name, "creationTimestamp": created},
            "spec": {"nodeName": "n"} if node else {},
            "status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def test_deletion_order() -> None:
    pods = [pod("old-ready", "2026-01-01T00:00:00Z"), pod("new-ready", "2026-01-02T00:00:00Z"),
            pod("not-ready", "2026-01-01T00:00:00Z", ready=False),
            pod("pending", "2026-01-01T00:00:00Z", phase="Pending", ready=False),
            pod("unscheduled", "2026-01-01T00:00:00Z", node=False, phase="Pending", ready=False)]
    order = [p.name for p in sorted((Pod(p) for p in pods), key=deletion_rank)]
    assert order == ["unscheduled", "pending", "not-ready", "new-ready", "old-ready"]


def test_condition_transition_time_moves_only_on_a_status_change() -> None:
    first = set_condition([], "Available", "True", "A", "m", "t1", update_time=True)
    same = set_condition(first, "Available", "True", "A", "m", "t2", update_time=True)
    assert same[0]["lastTransitionTime"] == "t1" and same[0]["lastUpdateTime"] == "t1"
    flipped = set_condition(same, "Available", "False", "B", "m", "t3", update_time=True)
    assert flipped[0]["lastTransitionTime"] == "t3" and flipped[0]["lastUpdateTime"] == "t3"
