"""The store keeps one row per object, whatever a caller's dict says (issue 23, item 1, defence in depth).

The Engine already drops a namespace sent for a cluster-scoped object; these tests call Store.put
directly, as the bootstrap code and the subresource handlers do, to show the store itself cannot be
made to hold a second row for one object or one uid.
"""

from __future__ import annotations

from typing import Any

import pytest

from tfusion.apiserver.errors import ApiError
from tfusion.apiserver.resources import Registry
from tfusion.apiserver.store import Store

CRB = "rbac.authorization.k8s.io/clusterrolebindings"
CMS = "/configmaps"


def binding(name: str, uid: str, **meta: Any) -> dict[str, Any]:
    return {"kind": "ClusterRoleBinding", "metadata": {"name": name, "uid": uid, **meta}}


@pytest.fixture
def store() -> Store:
    store = Store(":memory:", 10)
    store.cluster_scoped = Registry().cluster_scoped
    return store


def keys(store: Store, storage_key: str) -> list[tuple[str, str]]:
    return [key for key, _ in store.items(storage_key)]


def test_an_update_is_stored_where_the_old_object_is(store: Store) -> None:
    old = store.put(CRB, binding("b", "u1"), None)
    moved = binding("renamed", "u2", namespace="hidden")
    entry = store.put(CRB, moved, old)
    assert keys(store, CRB) == [("", "b")]
    assert entry.obj["metadata"]["name"] == "b" and entry.obj["metadata"]["uid"] == "u1"
    assert "namespace" not in entry.obj["metadata"]


def test_a_namespaced_update_keeps_its_namespace(store: Store) -> None:
    old = store.put(CMS, {"metadata": {"name": "c", "namespace": "default", "uid": "u1"}}, None)
    store.put(CMS, {"metadata": {"name": "c", "namespace": "kube-system", "uid": "u1"}}, old)
    assert keys(store, CMS) == [("default", "c")]


def test_a_cluster_scoped_create_ignores_a_namespace(store: Store) -> None:
    entry = store.put(CRB, binding("b", "u1", namespace="hidden"), None)
    assert keys(store, CRB) == [("", "b")]
    assert "namespace" not in entry.obj["metadata"]


def test_a_second_create_of_one_name_or_uid_is_refused(store: Store) -> None:
    store.put(CRB, binding("b", "u1"), None)
    with pytest.raises(ApiError) as same_name:
        store.put(CRB, binding("b", "u2", namespace="hidden"), None)
    assert same_name.value.code == 409
    with pytest.raises(ApiError) as same_uid:
        store.put(CMS, {"metadata": {"name": "other", "namespace": "default", "uid": "u1"}}, None)
    assert same_uid.value.code == 409 and "u1" in same_uid.value.message
    assert keys(store, CRB) == [("", "b")] and keys(store, CMS) == []


def test_a_uid_is_free_again_once_its_object_is_removed(store: Store) -> None:
    entry = store.put(CRB, binding("b", "u1"), None)
    store.remove(CRB, entry)
    store.put(CRB, binding("b", "u1"), None)
    assert keys(store, CRB) == [("", "b")]
