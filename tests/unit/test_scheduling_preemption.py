"""The controller's preemption rules that need no server: when an eviction protection ends, which
budgets select a pod, and which pods count as one gang (tfusion/controller/scheduling/preemption.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from tfusion.api import annotations as tfa
from tfusion.api.accessors import Pod
from tfusion.controller.eviction import protected_until, selects
from tfusion.controller.scheduling.preemption import gang_index

CREATED = "2026-12-02T06:00:00Z"


def pod(notes: dict[str, str] | None = None, labels: dict[str, str] | None = None, **spec: Any) -> Pod:
    return Pod({"metadata": {"name": "p", "namespace": "ml", "uid": "u", "creationTimestamp": CREATED,
                             "annotations": notes or {}, "labels": labels or {}}, "spec": spec})


def test_protection_lasts_from_creation_for_its_duration() -> None:
    created = datetime(2026, 12, 2, 6, tzinfo=UTC)
    assert protected_until(pod()) is None
    assert protected_until(pod({tfa.EVICTION_PROTECTION: "1h30m"})) == created + timedelta(minutes=90)
    assert protected_until(pod({tfa.EVICTION_PROTECTION: "0"})) == created  # over at once
    forever = datetime.max.replace(tzinfo=UTC)
    assert protected_until(pod({tfa.EVICTION_PROTECTION: "soon"})) == forever  # unreadable: never evicted


def test_a_budget_selects_pods_of_its_namespace_by_labels() -> None:
    def budget(selector: Any, namespace: str = "ml") -> dict[str, Any]:
        return {"metadata": {"name": "b", "namespace": namespace}, "spec": {"selector": selector}}

    train = pod(labels={"app": "train"})
    assert selects(budget({"matchLabels": {"app": "train"}}), train)
    assert not selects(budget({"matchLabels": {"app": "serve"}}), train)
    assert not selects(budget({"matchLabels": {"app": "train"}}, "other"), train)
    assert selects(budget({}), train)  # policy/v1: an empty selector selects the whole namespace
    assert not selects(budget({"matchLabels": "app=train"}), train)  # unreadable: selects nothing


def test_only_bound_running_gang_members_are_indexed() -> None:
    member = {tfa.GANG_GROUP_KEY: "ml/train"}
    assert gang_index(pod(member, nodeName="n1").raw) == ["ml/train"]
    assert gang_index(pod(member).raw) == []  # pending: not a member that could be preempted
    assert gang_index(pod(nodeName="n1").raw) == []
