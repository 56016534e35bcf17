"""The store holds objects as their encoded JSON (issue 33, item 4).

Each entry keeps the exact bytes and the few fields lists, selectors, watches and the garbage
collector read; only the most recently touched `DECODED_KEPT` entries keep a decoded dict. These
tests check that nothing observable changed: the bytes are the object, a dropped dict decodes back
to the same object, selectors read from the kept fields decide exactly as on the decoded object,
the watch history is bounded by bytes (a resume from before it, or a watcher that falls further
behind than it, gets 410), and a snapshot restores every object byte for byte.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import orjson
import pytest

from tfusion.api.selectors import FieldSelector, LabelSelector, parse_field_selector, parse_label_selector
from tfusion.apiserver.resources import Registry
from tfusion.apiserver.store import DECODED_KEPT, Entry, Selection, Store, copy_json
from tfusion.apiserver.watch import WatchRequest, serve_watch

PODS = "/pods"
CMS = "/configmaps"
NODES = ["node-a", "node-b", "node-c"]


def pod(i: int, rng: random.Random) -> dict[str, Any]:
    """A pod whose selectable fields vary: absent, strings, and the odd non-string values JSON allows."""
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox"}]}
    node = rng.choice([*NODES, None, True, 7, {"nested": "x"}])
    if node is not None:
        spec["nodeName"] = node
    if rng.random() < 0.5:
        spec["schedulerName"] = rng.choice(["default-scheduler", "tensor-fusion"])
    obj: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Pod", "spec": spec,
        "metadata": {"name": f"pod-{i:04d}", "namespace": rng.choice(["default", "team-a"]),
                     "uid": f"uid-{i}", "labels": {"app": rng.choice(["web", "db"]), "tier": str(i % 3)},
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs",
                                          "uid": f"owner-{i % 4}"}]},
    }
    if rng.random() < 0.7:
        obj["status"] = {"phase": rng.choice(["Pending", "Running", "Succeeded"])}
    if rng.random() < 0.2:
        del obj["metadata"]["labels"]
    return obj


def filled(count: int, seed: int = 1) -> tuple[Store, list[dict[str, Any]]]:
    rng = random.Random(seed)
    store = Store(":memory:", 100_000)
    objects = [pod(i, rng) for i in range(count)]
    for obj in objects:
        store.put(PODS, copy_json(obj), None)
    return store, objects


def decoded_count(store: Store) -> int:
    return sum(entry.decoded for _, entry in store.items(PODS))


def test_an_entry_is_its_exact_encoding_and_decodes_back_to_the_object() -> None:
    store, objects = filled(50)
    for obj in objects:
        entry = store.get(PODS, obj["metadata"]["namespace"], obj["metadata"]["name"])
        assert entry is not None
        expected = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(entry.rv)}}
        assert entry.raw == orjson.dumps(expected)
        assert entry.obj == expected == entry.copy()
        assert (entry.namespace, entry.name, entry.uid) == (obj["metadata"]["namespace"], obj["metadata"]["name"],
                                                           obj["metadata"]["uid"])
        assert entry.labels == obj["metadata"].get("labels")
        assert entry.api_version == "v1"
        assert entry.owners == ((obj["metadata"]["ownerReferences"][0]["uid"], "apps/v1", "ReplicaSet"),)


def test_a_copy_is_private_and_the_kept_dict_is_the_stored_object() -> None:
    store, _ = filled(3)
    entry = next(entry for _, entry in store.items(PODS))
    mine = entry.copy()
    mine["metadata"]["labels"] = {"changed": "yes"}
    assert entry.obj["metadata"].get("labels") != {"changed": "yes"}
    assert orjson.loads(entry.raw) == entry.obj


def test_only_the_most_recently_touched_entries_stay_decoded() -> None:
    store, _ = filled(DECODED_KEPT + 300)
    assert decoded_count(store) <= DECODED_KEPT
    entries = [entry for _, entry in store.items(PODS)]
    oldest = min(entries, key=lambda entry: entry.rv)
    assert not oldest.decoded  # written first, touched least recently
    obj = oldest.obj  # decoded again from its bytes, and now among the recent ones
    assert oldest.decoded and obj == orjson.loads(oldest.raw)
    assert decoded_count(store) <= DECODED_KEPT


def test_a_store_opened_from_its_file_keeps_no_object_decoded(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    store = Store(path, 100)
    rng = random.Random(2)
    for i in range(20):
        store.put(PODS, pod(i, rng), None)
    written = {key: (entry.raw, entry.rv) for key, entry in store.items(PODS)}
    store.close()
    reopened = Store(path, 100)
    assert {key: (entry.raw, entry.rv) for key, entry in reopened.items(PODS)} == written
    assert decoded_count(reopened) == 0
    reopened.close()


LABEL_SELECTORS = ["", "app=web", "app!=web", "tier in (0,2)", "!app", "app,tier notin (1)"]
FIELD_SELECTORS = [
    "", "spec.nodeName=node-a", "spec.nodeName!=node-b", "spec.nodeName=", "spec.nodeName=true",
    "spec.nodeName=7", "status.phase=Running", "status.phase!=Pending,spec.nodeName=node-c",
    "spec.schedulerName=tensor-fusion", "metadata.name=pod-0003", "metadata.namespace=team-a",
    "metadata.namespace!=default,status.phase=", "spec.containers=",  # the last is not indexed: decodes
]


def _decoded_decision(labels: LabelSelector | None, fields: FieldSelector | None, obj: dict[str, Any]) -> bool:
    """How the server decided before the store kept encoded objects: on the decoded object."""
    if labels is not None and not labels.matches(obj["metadata"].get("labels") or {}):
        return False
    return fields is None or fields.matches(obj)


@pytest.fixture(scope="module")
def varied_pods() -> Store:
    store, _ = filled(300, seed=3)
    return store


@pytest.mark.parametrize("field_text", FIELD_SELECTORS)
@pytest.mark.parametrize("label_text", LABEL_SELECTORS)
def test_selectors_on_kept_fields_decide_as_on_the_decoded_object(
    varied_pods: Store, label_text: str, field_text: str
) -> None:
    store = varied_pods
    labels = parse_label_selector(label_text) if label_text else None
    fields = parse_field_selector(field_text) if field_text else None
    selection = Selection(labels, fields)
    entries = [entry for _, entry in store.items(PODS)]
    chosen = [entry.name for entry in entries if selection.matches(entry)]
    expected = [entry.name for entry in entries if _decoded_decision(labels, fields, orjson.loads(entry.raw))]
    assert chosen == expected


def test_selecting_on_indexed_fields_decodes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    written = Store(path, 10)
    rng = random.Random(4)
    for i in range(200):
        written.put(PODS, pod(i, rng), None)
    written.close()
    loaded = Store(path, 10)
    selection = Selection(parse_label_selector("app=web"),
                          parse_field_selector("spec.nodeName=node-a,status.phase!=Pending,metadata.namespace=default"))
    kept = [entry for _, entry in loaded.items(PODS) if selection.matches(entry)]
    assert kept
    assert decoded_count(loaded) == 0
    loaded.close()


def cm(name: str, size: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "default"},
            "data": {"k": "x" * size}}


def test_the_watch_history_is_bounded_by_bytes_and_a_resume_from_before_it_is_refused() -> None:
    store = Store(":memory:", 10_000, history_bytes=50_000)
    first_rv = store.rv
    for i in range(100):
        store.put(CMS, cm(f"cm-{i}", 1000), None)
    assert store.log_bytes <= 50_000
    assert store.log_bytes == sum(event.size for event in store.log)
    assert len(store.log) < 100  # the byte bound, not the count, decided
    assert store.events_since(CMS, first_rv) is None  # 410: that part of the history is gone
    kept = store.events_since(CMS, store.log_start)
    assert kept is not None and [event.rv for event in kept] == list(range(store.log_start + 1, store.rv + 1))


class _Client:
    """The ASGI side of one watch request: collects what the server sends, never disconnects."""

    def __init__(self) -> None:
        self.body = b""
        self.ended = asyncio.Event()

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            self.body += message.get("body", b"")
            if not message.get("more_body"):
                self.ended.set()

    async def receive(self) -> dict[str, Any]:
        await asyncio.Event().wait()  # the client never goes away
        raise AssertionError("unreachable")

    def events(self) -> list[dict[str, Any]]:
        return [orjson.loads(line) for line in self.body.splitlines() if line]


async def _watch_while_writing(writes: int, size: int) -> list[dict[str, Any]]:
    store = Store(":memory:", 10_000, history_bytes=40_000)
    info = Registry().get("", "v1", "configmaps")
    assert info is not None
    request = WatchRequest(info, "default", resource_version=str(store.rv), label_selector=None,
                           field_selector=None, timeout_s=2, bookmarks=False)
    client = _Client()
    watch = asyncio.ensure_future(serve_watch(store, request, client.send, client.receive,
                                              bookmark_interval=60, headers=[]))
    await asyncio.sleep(0.05)  # the watch is subscribed and waiting
    for i in range(writes):  # all in one turn of the loop: the watcher reads none of them in between
        store.put(CMS, cm(f"cm-{i}", size), None)
    await store.durable()
    await asyncio.wait_for(client.ended.wait(), 5)
    await watch
    store.close()
    return client.events()


def test_a_watcher_that_falls_behind_the_history_gets_410_gone() -> None:
    events = asyncio.run(_watch_while_writing(writes=100, size=1000))
    assert events[-1]["type"] == "ERROR"
    assert events[-1]["object"]["code"] == 410
    assert all(event["type"] == "ADDED" for event in events[:-1])


def test_a_watcher_that_keeps_up_sees_every_event() -> None:
    events = asyncio.run(_watch_while_writing(writes=10, size=100))
    assert [event["type"] for event in events] == ["ADDED"] * 10
    assert [event["object"]["metadata"]["name"] for event in events] == [f"cm-{i}" for i in range(10)]


def test_a_snapshot_restores_every_object_exactly(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db", 100)
    rng = random.Random(5)
    for i in range(30):
        store.put(PODS, pod(i, rng), None)
    victim = store.get(PODS, *next(key for key, _ in store.items(PODS)))
    assert victim is not None
    store.remove(PODS, victim)
    before = {key: (entry.raw, entry.rv, entry.labels, entry.fields, entry.owners) for key, entry in store.items(PODS)}
    rv = store.rv
    copy = asyncio.run(store.snapshot())
    store.close()
    restored_path = tmp_path / "restored.db"
    restored_path.write_bytes(copy)
    restored = Store(restored_path, 100)
    assert restored.rv == rv
    assert {key: (entry.raw, entry.rv, entry.labels, entry.fields, entry.owners)
            for key, entry in restored.items(PODS)} == before
    for _, entry in restored.items(PODS):
        assert entry.obj == orjson.loads(entry.raw)
    restored.close()


def test_a_dry_run_entry_is_indexed_like_a_stored_one() -> None:
    obj = pod(1, random.Random(6))
    entry = Entry(obj, orjson.dumps(obj), 5)
    assert (entry.namespace, entry.name, entry.rv) == (obj["metadata"]["namespace"], "pod-0001", 5)
    assert entry.obj is obj
