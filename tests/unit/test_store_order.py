"""The store's key order, which list pages start from by binary search (issue 33, item 4).

A page must return exactly what sorting every object of the resource and skipping to the continue
key returned: the same objects, in the same order, with the same remaining count, whatever order
the objects were created and deleted in, within one namespace or across all, and after a restart.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from tfusion.api.selectors import parse_label_selector
from tfusion.apiserver.objects import Engine, decode_continue
from tfusion.apiserver.resources import Registry
from tfusion.apiserver.store import Entry, Store

CMS = "/configmaps"
# namespaces that share a prefix: a namespace's range must stop before the next one
NAMESPACES = ["a", "a-b", "ab", "b"]


def configmap(namespace: str, name: str, colour: str) -> dict[str, Any]:
    return {"kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace, "labels": {"colour": colour}}}


def fill(store: Store, count: int, seed: int) -> None:
    rng = random.Random(seed)
    names = [(ns, f"cm-{i:03d}") for ns in NAMESPACES for i in range(count)]
    rng.shuffle(names)
    for ns, name in names:
        store.put(CMS, configmap(ns, name, rng.choice(["red", "blue"])), None)
    for ns, name in rng.sample(names, len(names) // 3):
        entry = store.get(CMS, ns, name)
        assert entry is not None
        store.remove(CMS, entry)


def ordered_keys(store: Store, namespace: str | None, after: tuple[str, str] | None = None) -> list[tuple[str, str]]:
    order, first, end = store.ordered(CMS, namespace, after)
    return order[first:end]


def expected_keys(store: Store, namespace: str | None, after: tuple[str, str] | None = None) -> list[tuple[str, str]]:
    keys = sorted(key for key, _ in store.items(CMS, namespace))
    return [key for key in keys if after is None or key > after]


@pytest.mark.parametrize("namespace", [None, *NAMESPACES, "a-", "zz"])
def test_the_kept_order_is_the_sorted_keys_of_the_namespace(namespace: str | None) -> None:
    store = Store(":memory:", 10)
    fill(store, 40, seed=1)
    assert ordered_keys(store, namespace) == expected_keys(store, namespace)
    for after in [("a", "cm-010"), ("a-b", "cm-039"), ("a-b", "zzz"), ("", ""), ("ab", "cm-000")]:
        assert ordered_keys(store, namespace, after) == expected_keys(store, namespace, after)


def test_a_reopened_store_keeps_the_order(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db", 10)
    fill(store, 25, seed=2)
    before = ordered_keys(store, None)
    store.close()
    reopened = Store(tmp_path / "state.db", 10)
    try:
        assert ordered_keys(reopened, None) == before == expected_keys(reopened, None)
    finally:
        reopened.close()


def test_a_paged_list_returns_what_a_sorted_scan_returns() -> None:
    store = Store(":memory:", 10)
    registry = Registry()
    store.cluster_scoped = registry.cluster_scoped
    fill(store, 30, seed=3)
    info = registry.get("", "v1", "configmaps")
    assert info is not None
    engine = Engine(store, registry)
    red = parse_label_selector("colour=red")
    for namespace in (None, "a", "a-b"):
        for selector in (None, red):
            wanted = [
                entry for key, entry in sorted(store.items(CMS, namespace), key=lambda kv: kv[0])
                if selector is None or selector.matches(entry.obj["metadata"]["labels"])
            ]
            got: list[Entry] = []
            token = ""
            while True:
                page, token, remaining = engine.list(info, namespace, label_selector=selector, limit=7,
                                                     continue_token=token)
                got.extend(page)
                if not token:
                    assert remaining == 0
                    break
                last = decode_continue(token)
                assert last == (page[-1].obj["metadata"]["namespace"], page[-1].obj["metadata"]["name"])
                after = len(expected_keys(store, namespace, last))
                if selector is None:  # the objects of the scope after the page's last
                    assert remaining == after
                else:  # counted from the next match on, before selectors, as before issue 33
                    assert 0 < remaining <= after
            assert [e.obj["metadata"]["name"] for e in got] == [e.obj["metadata"]["name"] for e in wanted]
            assert got == wanted
