"""A cluster-scoped object has no namespace, whatever a write says (issue 23, item 1).

An older server stored a `metadata.namespace` sent in a PATCH or PUT of a cluster-scoped object as
a second row keyed by that namespace, with the same uid: a ClusterRoleBinding deleted by name still
granted through its hidden twin. Here every served kind is written with every verb that could set
or change metadata.namespace, and afterwards the store must hold exactly one row for the name (none
once deleted); the probe's requests are replayed; and a ghost row written into the SQLite file of a
stopped server is removed, with a warning, when the server starts again.
"""

from __future__ import annotations

import itertools
import logging
import os
import sqlite3
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.apiserver_fixture import ApiServerHandle, apply_crds_sync
from tests.helpers.kubectl import KUBECTL, needs_kubectl
from tfusion.apiserver.resources import VIRTUAL, ResourceInfo

MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
RBAC = "/apis/rbac.authorization.k8s.io/v1"
GPUS = "/apis/tensor-fusion.ai/v1/gpus"
VERBS = ("create", "put", "merge", "json-add", "strategic", "status-merge", "status-put")

FUZZ = settings(
    max_examples=int(os.environ.get("TFUSION_FUZZ_EXAMPLES", "80")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)

_counter = itertools.count()

# a valid object of each stored resource, by storage key; `n` makes names unique per example
_POD_SPEC = {"containers": [{"name": "main", "image": "busybox"}]}
_TEMPLATE = {"metadata": {"labels": {"app": "a"}}, "spec": _POD_SPEC}
SAMPLES: dict[str, Callable[[str], dict[str, Any]]] = {
    "/configmaps": lambda n: {"data": {"k": "v"}},
    "/events": lambda n: {"involvedObject": {"kind": "Pod", "name": "p"}},
    "/namespaces": lambda n: {},
    "/nodes": lambda n: {},
    "/pods": lambda n: {"spec": _POD_SPEC},
    "/secrets": lambda n: {"stringData": {"k": "v"}},
    "/serviceaccounts": lambda n: {},
    "/services": lambda n: {"spec": {"ports": [{"port": 80}]}},
    "admissionregistration.k8s.io/mutatingwebhookconfigurations": lambda n: {},
    "admissionregistration.k8s.io/validatingadmissionpolicies": lambda n: {
        "spec": {"matchConstraints": {"resourceRules": [{"operations": ["CREATE"], "apiGroups": [""],
                                                         "apiVersions": ["v1"], "resources": ["configmaps"]}]},
                 "validations": [{"expression": "true"}]}
    },
    "admissionregistration.k8s.io/validatingadmissionpolicybindings": lambda n: {
        "spec": {"policyName": f"policy-{n}", "validationActions": ["Deny"]}
    },
    "apiextensions.k8s.io/customresourcedefinitions": lambda n: {
        "spec": {
            "group": "scope.example.com",
            "scope": "Cluster",
            "names": {"plural": f"things{n}", "kind": f"Thing{n}"},
            "versions": [{"name": "v1", "served": True, "storage": True,
                          "schema": {"openAPIV3Schema": {"type": "object"}}}],
        }
    },
    "apps/deployments": lambda n: {"spec": {"selector": {"matchLabels": {"app": "a"}}, "template": _TEMPLATE}},
    "apps/replicasets": lambda n: {"spec": {"selector": {"matchLabels": {"app": "a"}}, "template": _TEMPLATE}},
    "apps/daemonsets": lambda n: {"spec": {"selector": {"matchLabels": {"app": "a"}}, "template": _TEMPLATE}},
    "apps/statefulsets": lambda n: {"spec": {"selector": {"matchLabels": {"app": "a"}}, "template": _TEMPLATE,
                                             "serviceName": "s", "replicas": 0}},
    "apps/controllerrevisions": lambda n: {"data": {"spec": {}}, "revision": 1},
    "/persistentvolumeclaims": lambda n: {"spec": {"accessModes": ["ReadWriteOnce"],
                                                   "resources": {"requests": {"storage": "1Gi"}}}},
    "batch/cronjobs": lambda n: {"spec": {"schedule": "0 0 1 1 *", "suspend": True, "jobTemplate": {
        "spec": {"template": {"spec": {**_POD_SPEC, "restartPolicy": "Never"}}}}}},
    "/endpoints": lambda n: {"subsets": []},
    "discovery.k8s.io/endpointslices": lambda n: {"addressType": "IPv4", "endpoints": []},
    "networking.k8s.io/networkpolicies": lambda n: {"spec": {"podSelector": {}}},
    "policy/poddisruptionbudgets": lambda n: {"spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "a"}}}},
    "batch/jobs": lambda n: {
        "spec": {"template": {"spec": {**_POD_SPEC, "restartPolicy": "Never"}}}
    },
    "coordination.k8s.io/leases": lambda n: {},
    "rbac.authorization.k8s.io/clusterrolebindings": lambda n: {
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
        "subjects": [{"kind": "User", "name": "eve", "apiGroup": "rbac.authorization.k8s.io"}],
    },
    "rbac.authorization.k8s.io/clusterroles": lambda n: {"rules": []},
    "rbac.authorization.k8s.io/rolebindings": lambda n: {
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
        "subjects": [{"kind": "User", "name": "eve", "apiGroup": "rbac.authorization.k8s.io"}],
    },
    "rbac.authorization.k8s.io/roles": lambda n: {"rules": []},
    "scheduling.k8s.io/priorityclasses": lambda n: {"value": 10},
    "tensor-fusion.ai/gpunodeclaims": lambda n: {
        "spec": {"gpuDeviceOffered": 1, "tflopsOffered": "100", "vramOffered": "10Gi"}
    },
    "tensor-fusion.ai/gpunodeclasses": lambda n: {"spec": {}},
    "tensor-fusion.ai/gpunodes": lambda n: {"spec": {}},
    "tensor-fusion.ai/gpupools": lambda n: {"spec": {"nodeManagerConfig": {}}},
    "tensor-fusion.ai/gpuresourcequotas": lambda n: {"spec": {}},
    "tensor-fusion.ai/gpus": lambda n: {"spec": {}},
    "tensor-fusion.ai/providerconfigs": lambda n: {"spec": {"vendor": "NVIDIA", "images": {"middleware": "m:1"}}},
    "tensor-fusion.ai/schedulingconfigtemplates": lambda n: {"spec": {"placement": {}}},
    "tensor-fusion.ai/tensorfusionclusters": lambda n: {"spec": {}},
    "tensor-fusion.ai/tensorfusionconnections": lambda n: {"spec": {"clientPod": "p", "workloadName": "w"}},
    "tensor-fusion.ai/tensorfusionworkloads": lambda n: {"spec": {}},
    "tensor-fusion.ai/workloadprofiles": lambda n: {"spec": {}},
}

#: what a write may try to put in metadata.namespace: other namespaces, empty, and wrong types
injected_namespaces = st.one_of(
    st.sampled_from(["hidden", "default", "kube-system", "tensor-fusion-sys", ""]),
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=12),
    st.none(),
    st.integers(min_value=-5, max_value=5),
    st.just(["hidden"]),
    st.just({"name": "hidden"}),
)


def served(apiserver: ApiServerHandle) -> dict[str, ResourceInfo]:
    """Every stored (not request-only) resource the server serves, by storage key (events.k8s.io
    events are the core events, served in another shape: one store, sampled once)."""
    engine = apiserver.server.engine
    assert engine is not None
    infos = apiserver.call(engine.registry.all)
    return {i.storage_key: i for i in infos
            if i.storage_key not in VIRTUAL and i.version == i.storage_version and not i.shares_storage}


def collection(info: ResourceInfo, *, everywhere: bool = False) -> str:
    base = f"/apis/{info.group}/{info.version}" if info.group else "/api/v1"
    scope = "/namespaces/default" if info.namespaced and not everywhere else ""
    return f"{base}{scope}/{info.plural}"


def rows(apiserver: ApiServerHandle, storage_key: str, name: str) -> list[tuple[str, str]]:
    """The store's keys (namespace, name) for `name`: what every read and delete depends on."""
    store = apiserver.server.store
    assert store is not None
    return apiserver.call(lambda: [key for key, _ in store.items(storage_key) if key[1] == name])


def sqlite_rows(apiserver: ApiServerHandle, storage_key: str, name: str) -> list[tuple[str, str]]:
    """The same from the state file's table, after the writes so far are committed."""
    store = apiserver.server.store
    assert store is not None

    def read() -> list[tuple[str, str]]:
        cursor = store._db.execute("SELECT ns, name FROM objects WHERE skey = ? AND name = ?", (storage_key, name))
        return [(ns, n) for ns, n in cursor.fetchall()]

    return apiserver.call(read)


@pytest.fixture
def client(apiserver: ApiServerHandle) -> Iterator[httpx.Client]:
    apply_crds_sync(apiserver)
    with apiserver.sync_http(timeout=30) as http:
        yield http


def test_every_served_kind_has_a_sample(apiserver: ApiServerHandle, client: httpx.Client) -> None:
    """The property test below covers every stored kind: a new kind needs a sample here."""
    assert set(served(apiserver)) == set(SAMPLES)


def _write(http: httpx.Client, info: ResourceInfo, verb: str, name: str, body: dict[str, Any],
           injected: Any) -> httpx.Response:
    url = f"{collection(info)}/{name}"
    if verb == "create":
        created = {**body, "metadata": {"name": name, "namespace": injected}}
        return http.post(collection(info), json=created)
    first = http.post(collection(info), json={**body, "metadata": {"name": name}})
    assert first.status_code == 201, first.text
    if verb in ("put", "status-put"):
        current = first.json()
        current["metadata"]["namespace"] = injected
        return http.put(url if verb == "put" else f"{url}/status", json=current)
    if verb == "status-merge":
        return http.patch(f"{url}/status", content=orjson.dumps({"metadata": {"namespace": injected}}),
                          headers={"content-type": MERGE})
    if verb == "json-add":
        operations = [{"op": "add", "path": "/metadata/namespace", "value": injected}]
        return http.patch(url, content=orjson.dumps(operations), headers={"content-type": JSON_PATCH})
    ctype = MERGE if verb == "merge" else STRATEGIC
    return http.patch(url, content=orjson.dumps({"metadata": {"namespace": injected}}),
                      headers={"content-type": ctype})


def test_every_kind_and_verb_with_a_foreign_namespace(apiserver: ApiServerHandle, client: httpx.Client) -> None:
    """Every pair once, deterministically; the property test below varies the value as well."""
    for kind in sorted(SAMPLES):
        for verb in VERBS:
            _one_write(apiserver, client, kind, verb, "hidden")


@FUZZ
@given(kind=st.sampled_from(sorted(SAMPLES)), verb=st.sampled_from(VERBS), injected=injected_namespaces)
def test_no_write_gives_one_name_two_rows(
    apiserver: ApiServerHandle, client: httpx.Client, kind: str, verb: str, injected: Any
) -> None:
    _one_write(apiserver, client, kind, verb, injected)


def _one_write(apiserver: ApiServerHandle, client: httpx.Client, kind: str, verb: str, injected: Any) -> None:
    """One write that tries to set metadata.namespace; then exactly one row, one listed object, and
    none once it is deleted."""
    info = served(apiserver)[kind]
    n = next(_counter)
    name = f"things{n}.scope.example.com" if kind.endswith("customresourcedefinitions") else f"obj-{n}"
    response = _write(client, info, verb, name, SAMPLES[kind](str(n)), injected)
    assert response.status_code < 500, response.text
    home = ("default" if info.namespaced else "", name)
    stored = rows(apiserver, kind, name)
    if verb != "create" or response.status_code == 201:
        assert stored == [home], (verb, injected, response.status_code, response.text[:300])
    else:
        assert stored == [], (verb, injected, response.text[:300])
        return
    assert sqlite_rows(apiserver, kind, name) == [home]
    listed = [o for o in client.get(collection(info, everywhere=True)).json()["items"]
              if o["metadata"]["name"] == name]
    assert len(listed) == 1
    assert listed[0]["metadata"].get("namespace") == (home[0] or None)
    got = client.get(f"{collection(info)}/{name}")
    assert got.status_code == 200 and got.json()["metadata"].get("namespace") == (home[0] or None)
    deleted = client.delete(f"{collection(info)}/{name}")
    assert deleted.status_code in (200, 202), deleted.text
    if kind != "/namespaces":  # a namespace goes once it is empty; its deletion is not the point here
        assert rows(apiserver, kind, name) == []
        assert client.get(f"{collection(info)}/{name}").status_code == 404


# ------------------------------------------------------------------------------ the probe, replayed
def _eve_may(http: httpx.Client, verb: str, resource: str) -> bool:
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
              "spec": {"user": "eve", "resourceAttributes": {"verb": verb, "resource": resource,
                                                             "namespace": "default"}}}
    response = http.post("/apis/authorization.k8s.io/v1/subjectaccessreviews", json=review)
    assert response.status_code == 201, response.text
    return bool(response.json()["status"]["allowed"])


def _ghost_eve(http: httpx.Client) -> None:
    binding = {"metadata": {"name": "ghost-eve"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
               "subjects": [{"kind": "User", "name": "eve", "apiGroup": "rbac.authorization.k8s.io"}]}
    assert http.post(f"{RBAC}/clusterrolebindings", json=binding).status_code == 201


@pytest.mark.parametrize("how", ["merge", "json-add", "put"])
def test_probe_ghost_clusterrolebinding_is_gone_after_delete(
    apiserver: ApiServerHandle, client: httpx.Client, how: str
) -> None:
    url = f"{RBAC}/clusterrolebindings/ghost-eve"
    _ghost_eve(client)
    assert _eve_may(client, "delete", "secrets")
    if how == "merge":
        response = client.patch(url, content=b'{"metadata":{"namespace":"hidden"}}', headers={"content-type": MERGE})
    elif how == "json-add":
        response = client.patch(url, content=b'[{"op":"add","path":"/metadata/namespace","value":"hidden"}]',
                                headers={"content-type": JSON_PATCH})
    else:
        current = client.get(url).json()
        current["metadata"]["namespace"] = "hidden"
        response = client.put(url, json=current)
    assert response.status_code == 200, response.text
    assert "namespace" not in response.json()["metadata"]
    assert rows(apiserver, "rbac.authorization.k8s.io/clusterrolebindings", "ghost-eve") == [("", "ghost-eve")]
    apiserver.restart()
    assert rows(apiserver, "rbac.authorization.k8s.io/clusterrolebindings", "ghost-eve") == [("", "ghost-eve")]
    assert client.delete(url).status_code == 200
    assert not _eve_may(client, "delete", "secrets")
    assert rows(apiserver, "rbac.authorization.k8s.io/clusterrolebindings", "ghost-eve") == []
    apiserver.restart()
    assert not _eve_may(client, "delete", "secrets")


def test_probe_collection_delete_by_field_selector_removes_the_binding(
    apiserver: ApiServerHandle, client: httpx.Client
) -> None:
    _ghost_eve(client)
    patched = client.patch(f"{RBAC}/clusterrolebindings/ghost-eve", content=b'{"metadata":{"namespace":"hidden"}}',
                           headers={"content-type": MERGE})
    assert patched.status_code == 200
    removed = client.delete(f"{RBAC}/clusterrolebindings", params={"fieldSelector": "metadata.name=ghost-eve"})
    assert removed.status_code == 200 and len(removed.json()["items"]) == 1
    assert not _eve_may(client, "delete", "secrets")
    assert rows(apiserver, "rbac.authorization.k8s.io/clusterrolebindings", "ghost-eve") == []


def test_probe_ghost_gpu_and_webhook_configuration(apiserver: ApiServerHandle, client: httpx.Client) -> None:
    webhooks = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
    for url in (GPUS, webhooks):
        assert client.post(url, json={"metadata": {"name": "ghost"}, **({"spec": {}} if url == GPUS else {})}
                           ).status_code == 201
        patched = client.patch(f"{url}/ghost", content=b'{"metadata":{"namespace":"hidden"}}',
                               headers={"content-type": MERGE})
        assert patched.status_code == 200, patched.text
        assert [o["metadata"]["name"] for o in client.get(url).json()["items"]] == ["ghost"]
        assert client.delete(f"{url}/ghost").status_code == 200
        assert client.get(url).json()["items"] == []


def test_namespaced_object_cannot_be_patched_into_another_namespace(client: httpx.Client) -> None:
    url = "/api/v1/namespaces/default/configmaps"
    assert client.post(url, json={"metadata": {"name": "c"}}).status_code == 201
    for ctype in (MERGE, STRATEGIC):
        moved = client.patch(f"{url}/c", content=b'{"metadata":{"namespace":"kube-system"}}',
                             headers={"content-type": ctype})
        assert moved.status_code == 400 and "does not match the namespace" in moved.text
    assert client.get("/api/v1/namespaces/kube-system/configmaps/c").status_code == 404
    same = client.patch(f"{url}/c", content=b'{"metadata":{"namespace":"default","labels":{"a":"b"}}}',
                        headers={"content-type": MERGE})
    assert same.status_code == 200 and same.json()["metadata"]["namespace"] == "default"


# ------------------------------------------------------------------------------ repair at start
def test_ghost_rows_left_in_the_state_file_are_removed_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = tmp_path / "state.db"
    handle = ApiServerHandle(state, tmp_path / "kubeconfig").start()
    try:
        apply_crds_sync(handle)
        _ghost_eve_admin(handle)
        with handle.sync_http() as http:
            assert http.post(GPUS, json={"metadata": {"name": "gpu-0"}, "spec": {}}).status_code == 201
            assert http.post("/api/v1/namespaces/default/configmaps",
                             json={"metadata": {"name": "keep"}}).status_code == 201
    finally:
        handle.stop()
    # what an earlier version left: copies of cluster-scoped rows under a namespace (one of them alone)
    db = sqlite3.connect(state)
    try:
        for skey, name, ns in (("rbac.authorization.k8s.io/clusterrolebindings", "ghost-eve", "hidden"),
                               ("tensor-fusion.ai/gpus", "gpu-0", "hidden")):
            data = db.execute("SELECT rv, data FROM objects WHERE skey = ? AND ns = '' AND name = ?",
                              (skey, name)).fetchone()
            obj = orjson.loads(data[1])
            obj["metadata"]["namespace"] = ns
            db.execute("INSERT INTO objects (skey, ns, name, rv, data) VALUES (?, ?, ?, ?, ?)",
                       (skey, ns, name, data[0], orjson.dumps(obj)))
        # an orphan: the cluster-scoped row was deleted, its hidden twin kept granting
        db.execute("DELETE FROM objects WHERE skey = ? AND ns = '' AND name = ?",
                   ("rbac.authorization.k8s.io/clusterrolebindings", "ghost-eve"))
        db.commit()
    finally:
        db.close()
    caplog.set_level(logging.WARNING, logger="tfusion.apiserver.seed")
    handle = ApiServerHandle(state, tmp_path / "kubeconfig").start()
    try:
        assert rows(handle, "rbac.authorization.k8s.io/clusterrolebindings", "ghost-eve") == []
        assert rows(handle, "tensor-fusion.ai/gpus", "gpu-0") == [("", "gpu-0")]
        assert sqlite_rows(handle, "tensor-fusion.ai/gpus", "gpu-0") == [("", "gpu-0")]
        assert rows(handle, "/configmaps", "keep") == [("default", "keep")]
        with handle.sync_http() as http:
            assert not _eve_may(http, "delete", "secrets")
            assert [o["metadata"]["name"] for o in http.get(GPUS).json()["items"]] == ["gpu-0"]
            assert http.get(f"{GPUS}/gpu-0").status_code == 200
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
                  and r.name == "tfusion.apiserver.seed"]
        assert any("ghost-eve" in m and "hidden" in m for m in warned), warned
        assert any("gpu-0" in m and "hidden" in m for m in warned), warned
    finally:
        handle.stop()


def _ghost_eve_admin(handle: ApiServerHandle) -> None:
    with handle.sync_http() as http:
        _ghost_eve(http)
        assert _eve_may(http, "delete", "secrets")


@needs_kubectl
def test_probe_with_kubectl(apiserver: ApiServerHandle, client: httpx.Client, tmp_path: Path) -> None:
    """The probe as an operator would run it: kubectl patches the binding, deletes it, asks can-i."""
    base = [KUBECTL, "--kubeconfig", apiserver.kubeconfig, "--cache-dir", str(tmp_path / "cache")]

    def kubectl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*base, *args], capture_output=True, text=True, timeout=60)

    _ghost_eve(client)
    assert kubectl("auth", "can-i", "delete", "secrets", "--as", "eve").stdout.strip() == "yes"
    patched = kubectl("patch", "clusterrolebinding", "ghost-eve", "--type", "merge",
                      "-p", '{"metadata":{"namespace":"hidden"}}')
    assert patched.returncode == 0, patched.stderr
    assert kubectl("delete", "clusterrolebinding", "ghost-eve").returncode == 0
    denied = kubectl("auth", "can-i", "delete", "secrets", "--as", "eve")
    assert denied.stdout.strip() == "no", denied.stdout + denied.stderr
    assert kubectl("get", "clusterrolebindings", "-A", "-o", "name").stdout.count("ghost-eve") == 0
