"""CustomResourceDefinitions on the embedded API server: serving, schema validation, defaulting, pruning,
status split, printer columns, and deletion."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import kr8s
import kr8s.asyncio
import pytest
from kr8s.asyncio.objects import new_class

from tests.apiserver_fixture import apply_crds

pytestmark = pytest.mark.anyio

CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
WIDGETS = "/apis/example.com/v1/namespaces/default/widgets"
MERGE = {"content-type": "application/merge-patch+json"}
TABLE = {"accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"}

WIDGET_SCHEMA = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "required": ["size"],
            "properties": {
                "size": {"type": "integer", "minimum": 1},
                "color": {"type": "string", "enum": ["red", "blue"], "default": "red"},
                "port": {"x-kubernetes-int-or-string": True},
                "parts": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name"],
                        "properties": {"name": {"type": "string"}, "count": {"type": "integer", "default": 1}},
                    },
                },
                "nested": {
                    "type": "object",
                    "properties": {"deep": {"type": "object", "properties": {"flag": {"type": "boolean"}}}},
                },
            },
        },
        "status": {"type": "object", "properties": {"phase": {"type": "string"}, "ready": {"type": "integer"}}},
    },
}


def widget_crd(**version_extra: Any) -> dict[str, Any]:
    version = {
        "name": "v1",
        "served": True,
        "storage": True,
        "schema": {"openAPIV3Schema": WIDGET_SCHEMA},
        "subresources": {"status": {}},
        "additionalPrinterColumns": [
            {"name": "Size", "type": "integer", "jsonPath": ".spec.size"},
            {"name": "Color", "type": "string", "jsonPath": ".spec.color"},
            {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ],
    }
    version.update(version_extra)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wd"]},
            "versions": [version],
        },
    }


@pytest.fixture
async def http(apiserver: Any) -> AsyncIterator[httpx.AsyncClient]:
    async with apiserver.http(timeout=10) as client:
        yield client


@pytest.fixture
async def widgets(http: httpx.AsyncClient) -> None:
    response = await http.post(CRDS, json=widget_crd())
    assert response.status_code == 201, response.text


async def test_crd_is_served_within_a_second_with_status(http: httpx.AsyncClient) -> None:
    created = await http.post(CRDS, json=widget_crd())
    assert created.status_code == 201
    with anyio.fail_after(1):
        while (await http.get("/apis/example.com/v1")).status_code != 200:
            await anyio.sleep(0.01)
    resources = {r["name"]: r for r in (await http.get("/apis/example.com/v1")).json()["resources"]}
    assert resources["widgets"]["kind"] == "Widget" and resources["widgets"]["namespaced"] is True
    assert resources["widgets"]["shortNames"] == ["wd"] and "widgets/status" in resources
    groups = {g["name"] for g in (await http.get("/apis")).json()["groups"]}
    assert "example.com" in groups
    status = (await http.get(f"{CRDS}/widgets.example.com")).json()["status"]
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert conditions == {"Established": "True", "NamesAccepted": "True"}
    assert status["acceptedNames"]["kind"] == "Widget" and status["storedVersions"] == ["v1"]
    assert (await http.get(WIDGETS)).json()["items"] == []


async def test_invalid_crd_is_rejected(http: httpx.AsyncClient) -> None:
    bad = widget_crd()
    bad["metadata"]["name"] = "wrong.example.com"
    response = await http.post(CRDS, json=bad)
    assert response.status_code == 422
    assert any(c["field"] == "metadata.name" for c in response.json()["details"]["causes"])


async def test_schema_validation_names_fields(http: httpx.AsyncClient, widgets: None) -> None:
    body = {
        "apiVersion": "example.com/v1",
        "kind": "Widget",
        "metadata": {"name": "bad"},
        "spec": {"size": "big", "color": "green", "parts": [{"count": 2}], "nested": {"deep": {"flag": "yes"}}},
    }
    response = await http.post(WIDGETS, json=body)
    assert response.status_code == 422
    status = response.json()
    assert status["reason"] == "Invalid" and status["details"]["kind"] == "Widget"
    fields = {c["field"] for c in status["details"]["causes"]}
    assert {"spec.size", "spec.color", "spec.parts[0].name", "spec.nested.deep.flag"} <= fields
    assert status["message"].startswith('Widget.example.com "bad" is invalid: ')
    assert "spec.color" in status["message"] and '"green"' in status["message"]
    missing = await http.post(WIDGETS, json={"metadata": {"name": "m"}, "spec": {}})
    assert missing.status_code == 422
    assert [c["field"] for c in missing.json()["details"]["causes"]] == ["spec.size"]
    for port in (8080, "http"):
        ok = await http.post(WIDGETS, json={"metadata": {"generateName": "p-"}, "spec": {"size": 1, "port": port}})
        assert ok.status_code == 201, ok.text
    wrong_port = await http.post(WIDGETS, json={"metadata": {"name": "wp"}, "spec": {"size": 1, "port": 1.5}})
    assert wrong_port.status_code == 422


async def test_defaults_and_pruning(http: httpx.AsyncClient, widgets: None) -> None:
    created = await http.post(
        WIDGETS,
        json={
            "metadata": {"name": "d"},
            "spec": {"size": 2, "parts": [{"name": "a"}], "unknown": "dropped"},
            "extra": 1,
        },
    )
    assert created.status_code == 201, created.text
    spec = created.json()["spec"]
    assert spec == {"size": 2, "color": "red", "parts": [{"name": "a", "count": 1}]}
    assert "extra" not in created.json()
    invalid_update = await http.patch(f"{WIDGETS}/d", content=b'{"spec":{"size":0}}', headers=MERGE)
    assert invalid_update.status_code == 422
    assert invalid_update.json()["details"]["causes"][0]["field"] == "spec.size"


async def test_custom_resource_status_and_generation(apiserver: Any, widgets: None) -> None:
    api = await kr8s.asyncio.api(kubeconfig=apiserver.kubeconfig)
    widget_class = new_class("Widget.example.com/v1", namespaced=True, plural="widgets")
    widget = widget_class(
        {"metadata": {"name": "w", "namespace": "default"}, "spec": {"size": 1}, "status": {"phase": "Ignored"}},
        api=api,
    )
    await widget.create()
    assert "status" not in widget.raw and widget.raw["metadata"]["generation"] == 1
    await widget.patch({"status": {"phase": "Ready", "ready": 1}}, subresource="status")
    assert widget.raw["status"]["phase"] == "Ready" and widget.raw["metadata"]["generation"] == 1
    await widget.patch({"spec": {"size": 3}, "status": {"phase": "Lost"}})
    assert widget.raw["spec"]["size"] == 3 and widget.raw["status"]["phase"] == "Ready"
    assert widget.raw["metadata"]["generation"] == 2
    await widget.patch({"metadata": {"labels": {"a": "b"}}})
    assert widget.raw["metadata"]["generation"] == 2
    with pytest.raises(kr8s.ServerError) as info:
        await widget.patch({"status": {"ready": "many"}}, subresource="status")
    assert info.value.response is not None and info.value.response.status_code == 422


async def test_a_write_checks_what_its_schema_never_saw(http: httpx.AsyncClient, widgets: None) -> None:
    # an update skips the parts equal to the stored object only when that object was validated against
    # the schema in force: one stored before its CRD changed is checked whole
    assert (await http.post(WIDGETS, json={"metadata": {"name": "before"}, "spec": {"size": 5}})).status_code == 201
    crd = (await http.get(f"{CRDS}/widgets.example.com")).json()
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["size"]["maximum"] = 3
    assert (await http.put(f"{CRDS}/widgets.example.com", json=crd)).status_code == 200
    status = b'{"status":{"phase":"Up"}}'
    refused = await http.patch(f"{WIDGETS}/before/status", content=status, headers=MERGE)
    assert refused.status_code == 422, refused.text
    assert [c["field"] for c in refused.json()["details"]["causes"]] == ["spec.size"]
    assert (await http.post(WIDGETS, json={"metadata": {"name": "after"}, "spec": {"size": 2}})).status_code == 201
    assert (await http.patch(f"{WIDGETS}/after/status", content=status, headers=MERGE)).status_code == 200
    wrong = await http.patch(f"{WIDGETS}/after/status", content=b'{"status":{"ready":"x"}}', headers=MERGE)
    assert wrong.status_code == 422 and [c["field"] for c in wrong.json()["details"]["causes"]] == ["status.ready"]


async def test_strict_field_validation(http: httpx.AsyncClient, widgets: None) -> None:
    body = {"metadata": {"name": "strict"}, "spec": {"size": 1, "bogus": True}}
    refused = await http.post(WIDGETS, params={"fieldValidation": "Strict"}, json=body)
    assert refused.status_code == 400 and refused.json()["reason"] == "BadRequest"
    assert 'strict decoding error: unknown field "spec.bogus"' in refused.json()["message"]
    accepted = await http.post(WIDGETS, params={"fieldValidation": "Ignore"}, json=body)
    assert accepted.status_code == 201 and "bogus" not in accepted.json()["spec"]


async def test_strategic_merge_on_custom_resource_is_415(http: httpx.AsyncClient, widgets: None) -> None:
    await http.post(WIDGETS, json={"metadata": {"name": "s"}, "spec": {"size": 1}})
    response = await http.patch(
        f"{WIDGETS}/s",
        content=b'{"spec":{"size":2}}',
        headers={"content-type": "application/strategic-merge-patch+json"},
    )
    assert response.status_code == 415 and response.json()["reason"] == "UnsupportedMediaType"


async def test_printer_columns_table(http: httpx.AsyncClient, widgets: None) -> None:
    await http.post(WIDGETS, json={"metadata": {"name": "t"}, "spec": {"size": 5, "color": "blue"}})
    await http.patch(f"{WIDGETS}/t/status", content=b'{"status":{"phase":"Ready"}}', headers=MERGE)
    table = (await http.get(WIDGETS, headers=TABLE)).json()
    assert table["kind"] == "Table"
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "Size", "Color", "Phase", "Age"]
    cells = table["rows"][0]["cells"]
    assert cells[:4] == ["t", 5, "blue", "Ready"] and cells[4].endswith("s")
    single = (await http.get(f"{WIDGETS}/t", headers=TABLE)).json()
    assert single["kind"] == "Table" and single["rows"][0]["cells"][0] == "t"


async def test_deleting_crd_removes_kind_and_objects(http: httpx.AsyncClient, widgets: None) -> None:
    await http.post(WIDGETS, json={"metadata": {"name": "x"}, "spec": {"size": 1}})
    assert (await http.delete(f"{CRDS}/widgets.example.com")).status_code == 200
    with anyio.fail_after(2):
        while (await http.get("/apis/example.com/v1")).status_code != 404:
            await anyio.sleep(0.02)
    assert (await http.get(WIDGETS)).status_code == 404
    assert (await http.post(CRDS, json=widget_crd())).status_code == 201
    assert (await http.get(WIDGETS)).json()["items"] == []


async def test_tensor_fusion_crds(apiserver: Any, http: httpx.AsyncClient) -> None:
    plurals = await apply_crds(apiserver)
    assert {"gpus", "gpupools", "gpunodes", "tensorfusionworkloads"} <= set(plurals)
    pools = "/apis/tensor-fusion.ai/v1/gpupools"
    bad = await http.post(
        pools,
        json={
            "apiVersion": "tensor-fusion.ai/v1",
            "kind": "GPUPool",
            "metadata": {"name": "x"},
            "spec": {"nodeManagerConfig": {"provisioningMode": "Magic"}},
        },
    )
    assert bad.status_code == 422
    assert bad.json()["message"].startswith(
        'GPUPool.tensor-fusion.ai "x" is invalid: spec.nodeManagerConfig.provisioningMode: Unsupported value: "Magic"'
    )
    good = await http.post(pools, json={"metadata": {"name": "pool"}, "spec": {"nodeManagerConfig": {}}})
    assert good.status_code == 201, good.text
    assert good.json()["spec"]["nodeManagerConfig"]["provisioningMode"] == "AutoSelect"
    table = (await http.get(pools, headers=TABLE)).json()
    names = [c["name"] for c in table["columnDefinitions"]]
    assert names[:3] == ["Name", "Phase", "TFlops Oversubscription"] and "Mode" in names
    assert json.dumps(table["rows"][0]["cells"]).count("AutoSelect") == 1
