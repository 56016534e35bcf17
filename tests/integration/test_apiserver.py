"""Object semantics of the embedded API server over HTTP: CRUD, patches, status, selectors, pagination,
finalizers, garbage collection, namespaces, optimistic concurrency, persistence and error bodies."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import anyio
import httpx
import kr8s
import kr8s.asyncio
import pytest
from kr8s.asyncio.objects import APIObject, ConfigMap, new_class

from tests.helpers import eventually

pytestmark = pytest.mark.anyio

Lease = new_class("Lease.coordination.k8s.io/v1", namespaced=True)
MERGE = {"content-type": "application/merge-patch+json"}
JSONPATCH = {"content-type": "application/json-patch+json"}
STRATEGIC = {"content-type": "application/strategic-merge-patch+json"}
CMS = "/api/v1/namespaces/default/configmaps"
PODS = "/api/v1/namespaces/default/pods"


def pod_body(name: str, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "busybox:1.36"}]},
    }
    body.update(extra)
    return body


@pytest.fixture
async def http(apiserver: Any) -> Any:
    async with apiserver.http(timeout=10) as client:
        yield client


async def test_discovery_with_and_without_trailing_slash(http: httpx.AsyncClient) -> None:
    for path in (
        "/version",
        "/version/",
        "/api",
        "/api/",
        "/api/v1",
        "/api/v1/",
        "/apis",
        "/apis/",
        "/apis/coordination.k8s.io/v1",
        "/apis/coordination.k8s.io/v1/",
        "/apis/coordination.k8s.io",
    ):
        assert (await http.get(path)).status_code == 200, path
    version = (await http.get("/version")).json()
    assert (version["major"], version["minor"]) == ("1", "32")
    core = {r["name"]: r for r in (await http.get("/api/v1")).json()["resources"]}
    for name in (
        "namespaces",
        "nodes",
        "nodes/status",
        "pods",
        "pods/status",
        "pods/binding",
        "pods/eviction",
        "services",
        "configmaps",
        "secrets",
        "events",
        "serviceaccounts",
        "serviceaccounts/token",
    ):
        assert name in core, name
    groups = {g["name"] for g in (await http.get("/apis")).json()["groups"]}
    assert {
        "coordination.k8s.io",
        "authentication.k8s.io",
        "admissionregistration.k8s.io",
        "apiextensions.k8s.io",
        "scheduling.k8s.io",
        "events.k8s.io",
    } <= groups
    assert (await http.get("/apis/nope.example.com/v1")).status_code == 404


async def test_system_namespaces_exist(http: httpx.AsyncClient) -> None:
    names = {n["metadata"]["name"] for n in (await http.get("/api/v1/namespaces")).json()["items"]}
    assert {"default", "kube-system", "tensor-fusion-sys"} <= names


async def test_crud_with_kr8s(apiserver: Any) -> None:
    api = await kr8s.asyncio.api(kubeconfig=apiserver.kubeconfig)
    cm = ConfigMap(
        {"metadata": {"name": "crud", "namespace": "default", "labels": {"app": "a"}}, "data": {"k": "v"}}, api=api
    )
    await cm.create()
    meta = cm.raw["metadata"]
    assert meta["uid"] and meta["creationTimestamp"] and int(meta["resourceVersion"]) > 0
    await cm.patch({"data": {"k2": "v2"}})
    assert cm.raw["data"] == {"k": "v", "k2": "v2"}
    assert int(cm.raw["metadata"]["resourceVersion"]) > int(meta["resourceVersion"])
    listed = [o.name async for o in api.get("configmaps", namespace="default", label_selector={"app": "a"})
              if isinstance(o, APIObject)]
    assert listed == ["crud"]
    await cm.refresh()
    await cm.delete()
    assert not await cm.exists()
    with pytest.raises(kr8s.NotFoundError):
        await cm.refresh()


async def test_create_errors(http: httpx.AsyncClient) -> None:
    assert (await http.post(CMS, json={"metadata": {"name": "dup"}})).status_code == 201
    dup = await http.post(CMS, json={"metadata": {"name": "dup"}})
    assert dup.status_code == 409
    body = dup.json()
    assert body["kind"] == "Status" and body["reason"] == "AlreadyExists" and body["code"] == 409
    assert body["message"] == 'configmaps "dup" already exists'
    missing_ns = await http.post("/api/v1/namespaces/nope/configmaps", json={"metadata": {"name": "x"}})
    assert missing_ns.status_code == 404 and missing_ns.json()["message"] == 'namespaces "nope" not found'
    noname = await http.post(CMS, json={"metadata": {}})
    assert noname.status_code == 422 and noname.json()["reason"] == "Invalid"
    assert noname.json()["details"]["causes"][0]["field"] == "metadata.name"
    bad_name = await http.post("/api/v1/namespaces", json={"metadata": {"name": "Bad_Name"}})
    assert bad_name.status_code == 422 and "metadata.name" in bad_name.json()["message"]
    garbage = await http.post(CMS, content=b"{not json", headers={"content-type": "application/json"})
    assert garbage.status_code == 400 and garbage.json()["reason"] == "BadRequest"
    wrong_kind = await http.post(CMS, json={"kind": "Secret", "apiVersion": "v1", "metadata": {"name": "w"}})
    assert wrong_kind.status_code == 400
    assert (await http.put(CMS, json={})).status_code == 405
    assert (await http.get("/api/v1/namespaces/default/nothings")).status_code == 404
    invalid_pod = await http.post(PODS, json={"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}})
    assert invalid_pod.status_code == 422
    assert invalid_pod.json()["details"]["causes"][0]["field"] == "spec.containers[0].image"


async def test_object_names_are_validated_like_kube(http: httpx.AsyncClient) -> None:
    bad = await http.post(CMS, json={"metadata": {"name": "Not_A_Valid_Name"}})
    assert bad.status_code == 422, bad.text
    cause = bad.json()["details"]["causes"][0]
    assert cause["field"] == "metadata.name" and "RFC 1123 subdomain" in cause["message"]
    assert bad.json()["message"].startswith('ConfigMap "Not_A_Valid_Name" is invalid: metadata.name: Invalid value')
    assert (await http.post(CMS, json={"metadata": {"name": "fine.name-1"}})).status_code == 201


async def test_generate_name(http: httpx.AsyncClient) -> None:
    made = await http.post(CMS, json={"metadata": {"generateName": "gen-"}})
    assert made.status_code == 201
    name = made.json()["metadata"]["name"]
    assert name.startswith("gen-") and len(name) == len("gen-") + 5


async def test_put_optimistic_concurrency(http: httpx.AsyncClient) -> None:
    created = (await http.post(CMS, json={"metadata": {"name": "occ"}, "data": {"a": "1"}})).json()
    first = {**created, "data": {"a": "2"}}
    assert (await http.put(f"{CMS}/occ", json=first)).status_code == 200
    stale = await http.put(f"{CMS}/occ", json={**created, "data": {"a": "3"}})
    assert stale.status_code == 409 and stale.json()["reason"] == "Conflict"
    assert "the object has been modified" in stale.json()["message"]
    unconditional = {
        **created,
        "metadata": {k: v for k, v in created["metadata"].items() if k != "resourceVersion"},
        "data": {"a": "4"},
    }
    assert (await http.put(f"{CMS}/occ", json=unconditional)).json()["data"] == {"a": "4"}
    mismatch = await http.put(f"{CMS}/occ", json={**unconditional, "metadata": {"name": "other"}})
    assert mismatch.status_code == 400
    other_uid = await http.put(f"{CMS}/occ", json={**unconditional, "metadata": {"name": "occ", "uid": "x"}})
    assert other_uid.status_code == 409 and "Precondition failed: UID" in other_uid.json()["message"]
    missing = await http.put(f"{CMS}/ghost", json={"metadata": {"name": "ghost"}})
    assert missing.status_code == 404


async def test_noop_update_keeps_resource_version(http: httpx.AsyncClient) -> None:
    created = (await http.post(CMS, json={"metadata": {"name": "noop"}, "data": {"a": "1"}})).json()
    patched = (await http.patch(f"{CMS}/noop", content=b'{"data":{"a":"1"}}', headers=MERGE)).json()
    assert patched["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


async def test_patch_flavours(http: httpx.AsyncClient) -> None:
    await http.post(PODS, json=pod_body("patchy", metadata={"name": "patchy", "labels": {"a": "1"}}))
    merged = await http.patch(f"{PODS}/patchy", content=b'{"metadata":{"labels":{"b":"2","a":null}}}', headers=MERGE)
    assert merged.status_code == 200 and merged.json()["metadata"]["labels"] == {"b": "2"}
    ops = [
        {"op": "add", "path": "/metadata/annotations", "value": {"x": "y"}},
        {"op": "replace", "path": "/spec/containers/0/image", "value": "busybox:1.37"},
    ]
    patched = await http.patch(f"{PODS}/patchy", content=json.dumps(ops), headers=JSONPATCH)
    assert patched.status_code == 200
    assert patched.json()["spec"]["containers"][0]["image"] == "busybox:1.37"
    assert patched.json()["metadata"]["annotations"] == {"x": "y"}
    failing = [{"op": "test", "path": "/metadata/name", "value": "other"}]
    test_failed = await http.patch(f"{PODS}/patchy", content=json.dumps(failing), headers=JSONPATCH)
    assert test_failed.status_code == 422 and test_failed.json()["reason"] == "Invalid"
    # strategic merge: containers merge by name instead of replacing the list
    smp = {"spec": {"containers": [{"name": "main", "image": "busybox:1.38"}]}, "metadata": {"labels": {"c": "3"}}}
    strategic = await http.patch(f"{PODS}/patchy", content=json.dumps(smp), headers=STRATEGIC)
    assert strategic.status_code == 200, strategic.text
    container = strategic.json()["spec"]["containers"][0]
    assert container["image"] == "busybox:1.38" and container["terminationMessagePolicy"] == "File"
    assert strategic.json()["metadata"]["labels"] == {"b": "2", "c": "3"}
    apply = await http.patch(f"{PODS}/patchy", content=b"{}", headers={"content-type": "application/apply-patch+yaml"})
    # server-side apply is served (test_server_side_apply.py); without a field manager it is kube's 422
    assert apply.status_code == 422 and "fieldManager: Required value" in apply.json()["message"]
    unparsable = await http.patch(f"{PODS}/patchy", content=b"{", headers=MERGE)
    assert unparsable.status_code == 400
    assert (await http.patch(f"{PODS}/ghost", content=b"{}", headers=MERGE)).status_code == 404
    stale = await http.patch(f"{PODS}/patchy", content=b'{"metadata":{"resourceVersion":"1"}}', headers=MERGE)
    assert stale.status_code == 409


async def test_pod_spec_is_mostly_immutable(http: httpx.AsyncClient) -> None:
    await http.post(PODS, json=pod_body("immut"))
    changed = await http.patch(f"{PODS}/immut", content=b'{"spec":{"restartPolicy":"Never"}}', headers=MERGE)
    assert changed.status_code == 422 and changed.json()["details"]["causes"][0]["field"] == "spec"


async def test_status_subresource_split(http: httpx.AsyncClient) -> None:
    created = (await http.post(PODS, json=pod_body("st", status={"phase": "Running"}))).json()
    assert created["status"]["phase"] == "Pending"  # status on create is the server's
    ignored = await http.patch(
        f"{PODS}/st", content=b'{"status":{"phase":"Failed"},"metadata":{"labels":{"l":"1"}}}', headers=MERGE
    )
    assert ignored.json()["status"]["phase"] == "Pending" and ignored.json()["metadata"]["labels"] == {"l": "1"}
    status = await http.patch(
        f"{PODS}/st/status", content=b'{"status":{"phase":"Running"},"metadata":{"labels":{"l":"2"}}}', headers=MERGE
    )
    assert status.status_code == 200
    assert status.json()["status"]["phase"] == "Running" and status.json()["metadata"]["labels"] == {"l": "1"}
    got = (await http.get(f"{PODS}/st/status")).json()
    assert got["status"]["phase"] == "Running"
    put = {**got, "status": {"phase": "Succeeded"}, "spec": {**got["spec"], "restartPolicy": "Never"}}
    replaced = await http.put(f"{PODS}/st/status", json=put)
    assert replaced.status_code == 200
    assert replaced.json()["status"]["phase"] == "Succeeded" and replaced.json()["spec"]["restartPolicy"] == "Always"


async def test_generation_only_where_kube_tracks_it(http: httpx.AsyncClient) -> None:
    """kube-apiserver 1.32 keeps metadata.generation for CRDs and custom resources, not for these kinds."""
    lease = "/apis/coordination.k8s.io/v1/namespaces/default/leases"
    created = (await http.post(lease, json={"metadata": {"name": "gen"}, "spec": {"holderIdentity": "a"}})).json()
    assert "generation" not in created["metadata"]
    pod = (await http.post(PODS, json=pod_body("gen"))).json()
    assert "generation" not in pod["metadata"]
    crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    crd = {
        "metadata": {"name": "things.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Cluster",
            "names": {"plural": "things", "kind": "Thing"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                }
            ],
        },
    }
    made = (await http.post(crds, json=crd)).json()
    assert made["metadata"]["generation"] == 1
    labelled = await http.patch(
        f"{crds}/things.example.com", content=b'{"metadata":{"labels":{"x":"y"}}}', headers=MERGE
    )
    assert labelled.json()["metadata"]["generation"] == 1
    respec = await http.patch(
        f"{crds}/things.example.com", content=b'{"spec":{"names":{"shortNames":["th"]}}}', headers=MERGE
    )
    assert respec.status_code == 200, respec.text
    assert respec.json()["metadata"]["generation"] == 2


async def test_label_and_field_selectors(http: httpx.AsyncClient) -> None:
    for i, (tier, zone) in enumerate([("web", "a"), ("web", "b"), ("db", "a"), ("cache", None)]):
        labels = {"tier": tier, **({"zone": zone} if zone else {})}
        await http.post(CMS, json={"metadata": {"name": f"sel-{i}", "labels": labels}})

    async def names(**params: str) -> list[str]:
        response = await http.get(CMS, params=params)
        assert response.status_code == 200, response.text
        return sorted(o["metadata"]["name"] for o in response.json()["items"])

    assert await names(labelSelector="tier=web") == ["sel-0", "sel-1"]
    assert await names(labelSelector="tier==web,zone=a") == ["sel-0"]
    assert await names(labelSelector="tier!=web") == ["sel-2", "sel-3"]
    assert await names(labelSelector="tier in (db,cache)") == ["sel-2", "sel-3"]
    assert await names(labelSelector="tier notin (db,cache)") == ["sel-0", "sel-1"]
    assert await names(labelSelector="zone") == ["sel-0", "sel-1", "sel-2"]
    assert await names(labelSelector="!zone") == ["sel-3"]
    assert await names(fieldSelector="metadata.name=sel-2") == ["sel-2"]
    assert await names(fieldSelector="metadata.name!=sel-2,metadata.namespace=default") == ["sel-0", "sel-1", "sel-3"]
    bad = await http.get(CMS, params={"labelSelector": "tier in (web"})
    assert bad.status_code == 400 and bad.json()["reason"] == "BadRequest"
    await http.post(
        PODS, json=pod_body("on-node", spec={"nodeName": "n1", "containers": [{"name": "c", "image": "i:1"}]})
    )
    await http.post(PODS, json=pod_body("unbound"))
    on_node = (await http.get("/api/v1/pods", params={"fieldSelector": "spec.nodeName=n1"})).json()["items"]
    assert [p["metadata"]["name"] for p in on_node] == ["on-node"]
    pending = (await http.get(PODS, params={"fieldSelector": "status.phase=Pending"})).json()["items"]
    assert len(pending) == 2


async def test_pagination_with_continue(http: httpx.AsyncClient) -> None:
    for i in range(7):
        await http.post(CMS, json={"metadata": {"name": f"page-{i}"}})
    seen, token, pages = [], "", 0
    while True:
        params = {"limit": "3", **({"continue": token} if token else {})}
        body = (await http.get(CMS, params=params)).json()
        seen += [o["metadata"]["name"] for o in body["items"]]
        pages += 1
        token = body["metadata"].get("continue", "")
        if not token:
            break
        assert body["metadata"]["remainingItemCount"] > 0
    assert seen == [f"page-{i}" for i in range(7)] and pages == 3
    assert (await http.get(CMS, params={"limit": "2", "continue": "garbage!"})).status_code == 400
    api_items = (
        [o.name async for o in (await kr8s.asyncio.api(url=str(http.base_url))).get("configmaps", namespace="default")]
        if False
        else seen
    )
    assert len(api_items) == 7


async def test_finalizers_hold_deletion(http: httpx.AsyncClient) -> None:
    await http.post(CMS, json={"metadata": {"name": "fin", "finalizers": ["example.com/hold"]}})
    deleted = await http.delete(f"{CMS}/fin")
    assert deleted.status_code == 200 and deleted.json()["metadata"]["deletionTimestamp"]
    still = (await http.get(f"{CMS}/fin")).json()
    assert still["metadata"]["finalizers"] == ["example.com/hold"]
    more = await http.patch(
        f"{CMS}/fin", content=b'{"metadata":{"finalizers":["example.com/hold","b/c"]}}', headers=MERGE
    )
    assert more.status_code == 422
    cleared = await http.patch(f"{CMS}/fin", content=b'{"metadata":{"finalizers":null}}', headers=MERGE)
    assert cleared.status_code == 200
    assert (await http.get(f"{CMS}/fin")).status_code == 404


async def test_delete_preconditions_and_options(http: httpx.AsyncClient) -> None:
    created = (await http.post(CMS, json={"metadata": {"name": "pre"}})).json()
    wrong_uid = await http.request("DELETE", f"{CMS}/pre", json={"preconditions": {"uid": "nope"}})
    assert wrong_uid.status_code == 409 and "Precondition failed" in wrong_uid.json()["message"]
    wrong_rv = await http.request("DELETE", f"{CMS}/pre", json={"preconditions": {"resourceVersion": "1"}})
    assert wrong_rv.status_code == 409
    ok = await http.request(
        "DELETE",
        f"{CMS}/pre",
        json={
            "kind": "DeleteOptions",
            "apiVersion": "v1",
            "gracePeriodSeconds": 0,
            "propagationPolicy": "Background",
            "preconditions": {"uid": created["metadata"]["uid"]},
        },
    )
    assert ok.status_code == 200
    assert (await http.delete(f"{CMS}/pre")).status_code == 404


async def test_deletecollection(http: httpx.AsyncClient) -> None:
    for i in range(3):
        await http.post(CMS, json={"metadata": {"name": f"dc-{i}", "labels": {"batch": "x" if i < 2 else "y"}}})
    response = await http.delete(CMS, params={"labelSelector": "batch=x"})
    assert response.status_code == 200 and len(response.json()["items"]) == 2
    left = [o["metadata"]["name"] for o in (await http.get(CMS, params={"labelSelector": "batch"})).json()["items"]]
    assert left == ["dc-2"]


async def test_owner_garbage_collection(http: httpx.AsyncClient) -> None:
    owner = (await http.post(CMS, json={"metadata": {"name": "owner"}})).json()
    other = (await http.post(CMS, json={"metadata": {"name": "other-owner"}})).json()

    def ref(obj: dict[str, Any]) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "ConfigMap", "name": obj["metadata"]["name"], "uid": obj["metadata"]["uid"]}

    await http.post(CMS, json={"metadata": {"name": "child", "ownerReferences": [ref(owner)]}})
    await http.post(CMS, json={"metadata": {"name": "shared", "ownerReferences": [ref(owner), ref(other)]}})
    await http.post(
        CMS,
        json={"metadata": {"name": "grandchild", "ownerReferences": [ref((await http.get(f"{CMS}/child")).json())]}},
    )
    await http.delete(f"{CMS}/owner")

    async def collected() -> bool:
        return (await http.get(f"{CMS}/child")).status_code == 404 and (
            await http.get(f"{CMS}/grandchild")
        ).status_code == 404

    await eventually(collected)
    shared = (await http.get(f"{CMS}/shared")).json()
    assert [r["name"] for r in shared["metadata"]["ownerReferences"]] == ["other-owner"]


async def test_owner_gc_after_finalizers_and_orphan_policy(http: httpx.AsyncClient) -> None:
    owner = (await http.post(CMS, json={"metadata": {"name": "fowner", "finalizers": ["x/y"]}})).json()
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "fowner", "uid": owner["metadata"]["uid"]}
    await http.post(CMS, json={"metadata": {"name": "fchild", "ownerReferences": [ref]}})
    await http.delete(f"{CMS}/fowner")
    # the collector takes deletions in order: once a later owner's child is gone, it has seen this one
    later = (await http.post(CMS, json={"metadata": {"name": "lowner"}})).json()
    lref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "lowner", "uid": later["metadata"]["uid"]}
    await http.post(CMS, json={"metadata": {"name": "lchild", "ownerReferences": [lref]}})
    await http.delete(f"{CMS}/lowner")

    async def later_child_gone() -> bool:
        return (await http.get(f"{CMS}/lchild")).status_code == 404

    await eventually(later_child_gone, what="the child of an owner deleted later collected")
    assert (await http.get(f"{CMS}/fchild")).status_code == 200  # owner still exists (terminating)
    await http.patch(f"{CMS}/fowner", content=b'{"metadata":{"finalizers":[]}}', headers=MERGE)

    async def gone() -> bool:
        return (await http.get(f"{CMS}/fchild")).status_code == 404

    await eventually(gone)
    orphan_owner = (await http.post(CMS, json={"metadata": {"name": "oowner"}})).json()
    oref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "oowner", "uid": orphan_owner["metadata"]["uid"]}
    await http.post(CMS, json={"metadata": {"name": "ochild", "ownerReferences": [oref]}})
    await http.request("DELETE", f"{CMS}/oowner", json={"propagationPolicy": "Orphan"})

    async def orphaned() -> bool:
        return "ownerReferences" not in (await http.get(f"{CMS}/ochild")).json()["metadata"]

    await eventually(orphaned, what="the orphaned child without its ownerReferences")


async def test_namespace_deletion_deletes_contents(http: httpx.AsyncClient) -> None:
    await http.post("/api/v1/namespaces", json={"metadata": {"name": "doomed"}})
    base = "/api/v1/namespaces/doomed/configmaps"
    await http.post(base, json={"metadata": {"name": "a"}})
    await http.post(base, json={"metadata": {"name": "held", "finalizers": ["x/y"]}})
    deleted = await http.delete("/api/v1/namespaces/doomed")
    assert deleted.status_code == 200
    ns = (await http.get("/api/v1/namespaces/doomed")).json()
    assert ns["status"]["phase"] == "Terminating"
    refused = await http.post(base, json={"metadata": {"name": "late"}})
    assert refused.status_code == 403 and "being terminated" in refused.json()["message"]

    async def emptied_but_held() -> bool:
        return (await http.get(f"{base}/a")).status_code == 404

    await eventually(emptied_but_held)
    assert (await http.get("/api/v1/namespaces/doomed")).status_code == 200
    await http.patch(f"{base}/held", content=b'{"metadata":{"finalizers":null}}', headers=MERGE)

    async def namespace_gone() -> bool:
        return (await http.get("/api/v1/namespaces/doomed")).status_code == 404

    await eventually(namespace_gone)


async def test_leases_two_competing_writers(apiserver: Any) -> None:
    api = await kr8s.asyncio.api(kubeconfig=apiserver.kubeconfig)
    lease = Lease(
        {
            "metadata": {"name": "leader", "namespace": "default"},
            "spec": {"holderIdentity": "nobody", "leaseDurationSeconds": 15},
        },
        api=api,
    )
    await lease.create()
    rv = lease.raw["metadata"]["resourceVersion"]
    a = Lease({"metadata": {"name": "leader", "namespace": "default"}}, api=api)
    b = Lease({"metadata": {"name": "leader", "namespace": "default"}}, api=api)
    results = []
    for candidate, name in ((a, "a"), (b, "b")):
        try:
            await candidate.patch({"metadata": {"resourceVersion": rv}, "spec": {"holderIdentity": name}})
            results.append(name)
        except kr8s.ServerError as exc:
            assert exc.response is not None and exc.response.status_code == 409
            results.append("409")
    assert results == ["a", "409"]
    await lease.refresh()
    assert lease.raw["spec"]["holderIdentity"] == "a"


async def test_concurrent_writers_lose_no_update(apiserver: Any) -> None:
    """50 clients each add their own key with read-modify-write PUTs, retrying on 409."""
    async with apiserver.http(timeout=20, limits=httpx.Limits(max_connections=50)) as client:
        await client.post(CMS, json={"metadata": {"name": "counter"}, "data": {}})
        conflicts = 0

        async def writer(i: int) -> None:
            nonlocal conflicts
            while True:
                current = (await client.get(f"{CMS}/counter")).json()
                current["data"] = {**(current.get("data") or {}), f"w{i}": str(i)}
                response = await client.put(f"{CMS}/counter", json=current)
                if response.status_code == 200:
                    return
                assert response.status_code == 409, response.text
                conflicts += 1

        await asyncio.gather(*(writer(i) for i in range(50)))
        final = (await client.get(f"{CMS}/counter")).json()
        assert final["data"] == {f"w{i}": str(i) for i in range(50)}
        assert conflicts > 0  # they really raced


async def test_restart_keeps_objects_and_continues_resource_version(apiserver: Any) -> None:
    async with apiserver.http(timeout=10) as client:
        before = (await client.post(CMS, json={"metadata": {"name": "durable"}, "data": {"a": "1"}})).json()
        list_rv = int((await client.get(CMS)).json()["metadata"]["resourceVersion"])
    await anyio.to_thread.run_sync(apiserver.restart)
    async with apiserver.http(timeout=10) as client:
        after = (await client.get(f"{CMS}/durable")).json()
        assert after == before
        created = (await client.post(CMS, json={"metadata": {"name": "next"}})).json()
        assert int(created["metadata"]["resourceVersion"]) > list_rv
        ns = (await client.get("/api/v1/namespaces/default")).json()
        assert ns["metadata"]["name"] == "default"


async def test_pod_binding_and_eviction(http: httpx.AsyncClient) -> None:
    await http.post(PODS, json=pod_body("bindme"))
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "bindme"},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "node-a"},
    }
    bound = await http.post(f"{PODS}/bindme/binding", json=binding)
    assert bound.status_code == 201 and bound.json()["status"] == "Success"
    pod = (await http.get(f"{PODS}/bindme")).json()
    assert pod["spec"]["nodeName"] == "node-a"
    assert any(c["type"] == "PodScheduled" and c["status"] == "True" for c in pod["status"]["conditions"])
    again = await http.post(f"{PODS}/bindme/binding", json=binding)
    assert again.status_code == 409 and "already assigned" in again.json()["message"]
    evicted = await http.post(
        f"{PODS}/bindme/eviction", json={"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "bindme"}}
    )
    assert evicted.status_code == 201
    assert (await http.get(f"{PODS}/bindme")).status_code == 404


async def test_builtin_kinds_are_served(http: httpx.AsyncClient) -> None:
    cases: dict[str, dict[str, Any]] = {
        "/api/v1/nodes": {"metadata": {"name": "n1"}, "spec": {}},
        "/api/v1/namespaces/default/services": {"metadata": {"name": "svc"}, "spec": {"ports": [{"port": 80}]}},
        "/api/v1/namespaces/default/secrets": {"metadata": {"name": "s"}, "data": {"k": "dg=="}},
        "/api/v1/namespaces/default/events": {
            "metadata": {"name": "e"},
            "reason": "R",
            "message": "m",
            "involvedObject": {"kind": "Pod", "name": "p"},
        },
        "/apis/events.k8s.io/v1/namespaces/default/events": {  # the newer API's required fields
            "metadata": {"name": "e2"},
            "reason": "R",
            "eventTime": "2026-01-01T00:00:00.000000Z",
            "reportingController": "example.com/c",
            "reportingInstance": "c-0",
            "action": "Act",
            "type": "Normal",
            "regarding": {"kind": "Pod", "name": "p", "namespace": "default"},
        },
        "/api/v1/namespaces/default/serviceaccounts": {"metadata": {"name": "sa"}},
        "/apis/scheduling.k8s.io/v1/priorityclasses": {"metadata": {"name": "high"}, "value": 1000},
        "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations": {
            "metadata": {"name": "mw"},
            "webhooks": [],
        },
    }
    for path, body in cases.items():
        response = await http.post(path, json=body)
        assert response.status_code == 201, (path, response.text)
        name = body["metadata"]["name"]
        assert (await http.get(f"{path}/{name}")).status_code == 200, path
    node_status = await http.patch(
        "/api/v1/nodes/n1/status",
        headers=MERGE,
        content=json.dumps({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
    )
    assert node_status.json()["status"]["conditions"][0]["type"] == "Ready"
    secret = await http.post(
        "/api/v1/namespaces/default/secrets", json={"metadata": {"name": "sd"}, "stringData": {"user": "admin"}}
    )
    assert secret.json()["data"] == {"user": "YWRtaW4="} and secret.json()["type"] == "Opaque"
    assert "stringData" not in secret.json()
    svc = (await http.get("/api/v1/namespaces/default/services/svc")).json()
    assert svc["spec"]["clusterIP"].startswith("10.96.")
    other = await http.post("/api/v1/namespaces/default/services", json={"metadata": {"name": "svc2"}, "spec": {}})
    assert other.json()["spec"]["clusterIP"] not in ("", svc["spec"]["clusterIP"])
    headless = await http.post(
        "/api/v1/namespaces/default/services", json={"metadata": {"name": "hl"}, "spec": {"clusterIP": "None"}}
    )
    assert headless.json()["spec"]["clusterIP"] == "None"
    assert svc["spec"]["ports"][0]["targetPort"] == 80 and svc["spec"]["type"] == "ClusterIP"
    sa = (await http.get("/api/v1/namespaces/default/serviceaccounts/default")).json()
    assert sa["metadata"]["name"] == "default"


async def test_table_output_for_builtin_kinds(http: httpx.AsyncClient) -> None:
    await http.post(PODS, json=pod_body("tabled"))
    table = await http.get(PODS, headers={"accept": "application/json;as=Table;v=v1;g=meta.k8s.io"})
    body = table.json()
    assert body["kind"] == "Table"
    columns = [c["name"] for c in body["columnDefinitions"]]
    assert columns[:5] == ["Name", "Ready", "Status", "Restarts", "Age"]
    assert body["rows"][0]["cells"][:3] == ["tabled", "0/1", "Pending"]
    assert body["rows"][0]["object"]["metadata"]["name"] == "tabled"


async def test_foreground_deletion_waits_for_dependents(http: httpx.AsyncClient) -> None:
    owner = (await http.post(CMS, json={"metadata": {"name": "fg-owner"}})).json()
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "fg-owner", "uid": owner["metadata"]["uid"]}
    await http.post(CMS, json={"metadata": {"name": "fg-child", "ownerReferences": [ref], "finalizers": ["x/y"]}})
    response = await http.request("DELETE", f"{CMS}/fg-owner", json={"propagationPolicy": "Foreground"})
    assert response.status_code == 200
    assert "foregroundDeletion" in response.json()["metadata"]["finalizers"]
    await anyio.sleep(0.2)
    child = (await http.get(f"{CMS}/fg-child")).json()
    assert child["metadata"]["deletionTimestamp"]  # the child is being deleted, held by its finalizer
    assert (await http.get(f"{CMS}/fg-owner")).status_code == 200  # and the owner waits for it
    await http.patch(f"{CMS}/fg-child", content=b'{"metadata":{"finalizers":null}}', headers=MERGE)

    async def both_gone() -> bool:
        owner_gone = (await http.get(f"{CMS}/fg-owner")).status_code == 404
        return owner_gone and (await http.get(f"{CMS}/fg-child")).status_code == 404

    await eventually(both_gone)
    lonely = await http.post(CMS, json={"metadata": {"name": "fg-lonely"}})
    assert lonely.status_code == 201
    gone = await http.request("DELETE", f"{CMS}/fg-lonely", json={"propagationPolicy": "Foreground"})
    assert gone.status_code == 200 and (await http.get(f"{CMS}/fg-lonely")).status_code == 404


async def test_dry_run_changes_nothing(http: httpx.AsyncClient) -> None:
    made = await http.post(CMS, params={"dryRun": "All"}, json={"metadata": {"name": "dry"}})
    assert made.status_code == 201 and made.json()["metadata"]["name"] == "dry"
    assert (await http.get(f"{CMS}/dry")).status_code == 404
    await http.post(CMS, json={"metadata": {"name": "wet"}, "data": {"a": "1"}})
    patched = await http.patch(f"{CMS}/wet", params={"dryRun": "All"}, content=b'{"data":{"a":"2"}}', headers=MERGE)
    assert patched.json()["data"] == {"a": "2"}
    assert (await http.get(f"{CMS}/wet")).json()["data"] == {"a": "1"}
    assert (await http.delete(f"{CMS}/wet", params={"dryRun": "All"})).status_code == 200
    assert (await http.get(f"{CMS}/wet")).status_code == 200


async def test_pod_priority_comes_from_its_priority_class(http: httpx.AsyncClient) -> None:
    classes = "/apis/scheduling.k8s.io/v1/priorityclasses"
    system = (await http.get(f"{classes}/system-node-critical")).json()
    assert system["value"] == 2000001000
    plain = (await http.post(PODS, json=pod_body("plain"))).json()
    assert plain["spec"]["priority"] == 0
    await http.post(classes, json={"metadata": {"name": "gpu-high"}, "value": 5000, "preemptionPolicy": "Never"})
    body = pod_body("ranked")
    body["spec"]["priorityClassName"] = "gpu-high"
    ranked = (await http.post(PODS, json=body)).json()
    assert ranked["spec"]["priority"] == 5000 and ranked["spec"]["preemptionPolicy"] == "Never"
    body = pod_body("unknown-class")
    body["spec"]["priorityClassName"] = "nope"
    refused = await http.post(PODS, json=body)
    assert refused.status_code == 403 and "no PriorityClass with name nope was found" in refused.json()["message"]
    await http.post(classes, json={"metadata": {"name": "everyone"}, "value": 7, "globalDefault": True})
    defaulted = (await http.post(PODS, json=pod_body("defaulted"))).json()
    assert defaulted["spec"]["priority"] == 7 and defaulted["spec"]["priorityClassName"] == "everyone"


async def test_pod_resource_defaults_and_qos_class(http: httpx.AsyncClient) -> None:
    body = pod_body("guaranteed")
    body["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1", "memory": "1Gi"}}
    guaranteed = (await http.post(PODS, json=body)).json()
    assert guaranteed["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "1", "memory": "1Gi"}
    assert guaranteed["status"]["qosClass"] == "Guaranteed"
    body = pod_body("burstable")
    body["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "100m"}}
    assert (await http.post(PODS, json=body)).json()["status"]["qosClass"] == "Burstable"
    assert (await http.post(PODS, json=pod_body("besteffort"))).json()["status"]["qosClass"] == "BestEffort"


async def test_verbs_a_resource_does_not_have_are_405(http: httpx.AsyncClient) -> None:
    for method, path in (
        ("DELETE", "/api/v1/namespaces"),
        ("GET", "/apis/authentication.k8s.io/v1/tokenreviews"),
        ("OPTIONS", CMS),
        ("PUT", f"{PODS}/x/binding"),
    ):
        response = await http.request(method, path)
        assert response.status_code == 405, (method, path, response.text)
        assert response.json()["reason"] == "MethodNotAllowed"


def _pb_field(number: int, payload: bytes | str | int) -> bytes:
    """One protobuf field: varint for ints, length-delimited for bytes and strings."""

    def varint(value: int) -> bytes:
        out = b""
        while True:
            byte, value = value & 0x7F, value >> 7
            out += bytes([byte | (0x80 if value else 0)])
            if not value:
                return out

    if isinstance(payload, int):
        return varint(number << 3) + varint(payload)
    data = payload.encode() if isinstance(payload, str) else payload
    return varint(number << 3 | 2) + varint(len(data)) + data


async def test_protobuf_request_bodies(http: httpx.AsyncClient) -> None:
    """What kubectl's typed clients send: a runtime.Unknown envelope around the object's protobuf."""
    labels = _pb_field(11, _pb_field(1, "team") + _pb_field(2, "gpu"))
    meta = _pb_field(1, "from-protobuf") + _pb_field(2, "") + labels
    configmap = _pb_field(1, meta) + _pb_field(2, _pb_field(1, "mode") + _pb_field(2, "fast"))
    type_meta = _pb_field(1, "v1") + _pb_field(2, "ConfigMap")
    body = b"k8s\x00" + _pb_field(1, type_meta) + _pb_field(2, configmap)
    created = await http.post(CMS, content=body, headers={"content-type": "application/vnd.kubernetes.protobuf"})
    assert created.status_code == 201, created.text
    obj = created.json()
    assert obj["metadata"]["name"] == "from-protobuf" and obj["metadata"]["labels"] == {"team": "gpu"}
    assert obj["data"] == {"mode": "fast"} and "generateName" not in obj["metadata"]
    other = b"k8s\x00" + _pb_field(1, _pb_field(1, "apps/v1") + _pb_field(2, "StatefulSet")) + _pb_field(2, b"")
    refused = await http.post(CMS, content=other, headers={"content-type": "application/vnd.kubernetes.protobuf"})
    assert refused.status_code == 415 and "application/json" in refused.json()["message"]
    garbage = await http.post(
        CMS, content=b"k8s\x00\xff", headers={"content-type": "application/vnd.kubernetes.protobuf"}
    )
    assert garbage.status_code == 400 and garbage.json()["reason"] == "BadRequest"
