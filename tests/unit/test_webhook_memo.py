"""The webhook memo's bookkeeping (tfusion/controller/webhook/memo.py) and the informer generation
it is keyed on: what holds an answer, what a status write does, what the byte bound evicts."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.helpers.mutate_inputs import BARE, OWNER, ctx, tf_pod
from tfusion.api.accessors import Body, Pod
from tfusion.controller.webhook import memo as memo_module
from tfusion.controller.webhook.memo import Remembered, ReviewMemo, State, keeps
from tfusion.controller.webhook.mutate import Owner, Plan, analyse
from tfusion.kube.informer import _beyond_status

CONFIG: dict[str, Any] = {}
STATE = State((1, 2, 3), CONFIG)


def plan(**notes: str) -> Plan:
    found = analyse(Pod(tf_pod({**BARE, **notes})), ctx(), OWNER)
    assert found is not None
    return found


def entry(patch: str = "p" * 10, *, state: State = STATE, owner: Owner = OWNER,
          gpu_reads: dict[str, object] | None = None) -> Remembered:
    return Remembered(state=state, owner=owner, plan=plan(), gpu_reads=gpu_reads or {},
                      patches={1: patch})


def no_gpus(model: str) -> object:
    return None


def keep(memo: ReviewMemo, key: tuple[bytes, str], remembered: Remembered) -> None:
    """Remembered for good: the first time a key is seen, the memo only marks it."""
    memo.remember(key, remembered)
    memo.remember(key, remembered)


def test_a_key_is_kept_from_its_second_time() -> None:
    memo = ReviewMemo()
    first = entry()
    memo.remember((b"a", "ns"), first)
    assert (b"a", "ns") not in memo and memo.get((b"a", "ns"), STATE, OWNER, no_gpus) is None
    memo.add_patch((b"a", "ns"), first, 2, "q")  # not kept: not counted either
    assert 2 not in first.patches
    memo.remember((b"a", "other"), entry())  # another namespace is another key
    second = entry()
    memo.remember((b"a", "ns"), second)
    assert memo.get((b"a", "ns"), STATE, OWNER, no_gpus) is second and len(memo) == 1
    replaced = entry()
    memo.remember((b"a", "ns"), replaced)  # a kept key takes a new answer at once
    assert memo.get((b"a", "ns"), STATE, OWNER, no_gpus) is replaced


def test_first_sightings_are_forgotten_past_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memo_module, "MAX_MARKS", 4)
    memo = ReviewMemo()
    for key in (b"a", b"b", b"c", b"d", b"e"):  # a and b fill one half, c and d the next: a and b go
        memo.remember((key, "ns"), entry())
    memo.remember((b"a", "ns"), entry())
    memo.remember((b"d", "ns"), entry())
    assert (b"a", "ns") not in memo, "a's mark was forgotten: this was its first time again"
    assert (b"d", "ns") in memo


def test_an_answer_holds_for_the_same_state_owner_and_gpu_capacities() -> None:
    memo = ReviewMemo()
    keep(memo, (b"{}", "ns"), entry(gpu_reads={"H100": {"tflops": "900"}}))
    capacity = {"H100": {"tflops": "900"}}.get
    assert memo.get((b"{}", "ns"), STATE, OWNER, capacity) is not None
    assert memo.get((b"{}", "other"), STATE, OWNER, capacity) is None, "the namespace is part of the key"
    assert memo.get((b"{}", "ns"), State((1, 2, 4), CONFIG), OWNER, capacity) is None, "an informer moved"
    assert memo.get((b"{}", "ns"), State((1, 2, 3), {}), OWNER, capacity) is None, "the config was reloaded"
    assert memo.get((b"{}", "ns"), STATE, Owner(workload_name="q"), capacity) is None, "another owner"
    assert memo.get((b"{}", "ns"), STATE, OWNER, {"H100": {"tflops": "990"}}.get) is None, "the capacity changed"
    assert (memo.hits, memo.misses) == (1, 5)


def test_the_byte_bound_evicts_the_least_recently_used() -> None:
    memo = ReviewMemo(max_bytes=25)
    keep(memo, (b"a", "ns"), entry())
    keep(memo, (b"b", "ns"), entry())
    assert memo.get((b"a", "ns"), STATE, OWNER, no_gpus) is not None  # a is now the most recent
    keep(memo, (b"c", "ns"), entry())
    assert (b"a", "ns") in memo and (b"c", "ns") in memo and (b"b", "ns") not in memo
    old = memo.get((b"a", "ns"), STATE, OWNER, no_gpus)
    assert old is not None
    memo.add_patch((b"a", "ns"), old, 2, "q" * 10)  # over the bound: the other entry goes
    assert len(memo) == 1 and old.patches[2] == "q" * 10
    evicted = entry()
    memo.add_patch((b"gone", "ns"), evicted, 2, "x" * 100)  # not (or no longer) in the memo: not counted
    assert 2 not in evicted.patches and len(memo) == 1


def test_per_pod_claims_are_not_kept() -> None:
    assert keeps(plan(), OWNER, pod_named=True)
    assert not keeps(plan(), Owner(workload_name="pod-x1y2z"), pod_named=False), "a random workload name"
    ported = plan()
    ported.host_port = object()  # type: ignore[assignment]
    assert not keeps(ported, OWNER, pod_named=True)
    grey = plan()
    grey.enabled_replicas = 2
    assert not keeps(grey, OWNER, pod_named=True)


def test_status_writes_are_not_changes_beyond_status() -> None:
    pool: dict[str, Any] = {"apiVersion": "tensor-fusion.ai/v1", "kind": "GPUPool",
            "metadata": {"name": "p", "resourceVersion": "1", "annotations": {"a": "1"}}, "spec": {"x": 1}}
    written = copy.deepcopy(pool)
    written["metadata"]["resourceVersion"] = "2"
    written["status"] = {"phase": "Running"}
    assert not _beyond_status(Body(pool), Body(written)), "a first status and a new resourceVersion"
    for change in ({"spec": {"x": 2}}, {"metadata": {**pool["metadata"], "annotations": {"a": "2"}}},
                   {"metadata": {**pool["metadata"], "finalizers": ["f"]}}, {"data": {"k": "v"}}):
        assert _beyond_status(Body(pool), Body({**pool, **change})), change


def test_only_named_pods_without_a_controller_are_shared_by_shape() -> None:
    import msgspec
    import orjson

    from tfusion.controller.webhook.server import AdmissionRequest
    from tfusion.controller.webhook.service import SHAPE_NAME, _shared_name

    def name_of(meta: dict[str, Any]) -> str:
        raw = msgspec.Raw(orjson.dumps({"metadata": meta}))
        return _shared_name(AdmissionRequest(uid="u", operation="CREATE", object=raw), meta)

    assert name_of({"name": "solo"}) == "solo"
    assert name_of({"name": "solo", "ownerReferences": [{"kind": "X", "name": "x", "controller": False}]}) == "solo"
    owned = {"name": "solo", "ownerReferences": [{"kind": "ReplicaSet", "name": "rs", "controller": True}]}
    assert name_of(owned) == ""
    assert name_of({"generateName": "solo-"}) == "", "no name: its workload's is made up per pod"
    assert name_of({"name": 5}) == ""
    assert name_of({"name": "solo", "labels": {"x": SHAPE_NAME}}) == "", "the placeholder in the pod: not shared"
