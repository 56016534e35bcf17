"""x-kubernetes-validations (CEL) on the embedded API server, over HTTP: create, PUT, merge and JSON
patch, the status subresource, transition rules, CRDs whose rules do not compile, and the rules of
the tensor-fusion.ai CRDs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from tests.apiserver_fixture import ApiServerHandle, apply_crds
from tests.helpers.widgets import widget_crd as shared_widget_crd

pytestmark = pytest.mark.anyio

CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
WIDGETS = "/apis/example.com/v1/namespaces/default/widgets"
MERGE = {"content-type": "application/merge-patch+json"}
JSON_PATCH = {"content-type": "application/json-patch+json"}
GANG_RULE = "!has(self.gang) || self.gang.minMembers <= self.replicas"

WIDGET_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "x-kubernetes-validations": [{"rule": GANG_RULE}],
            "properties": {
                "replicas": {"type": "integer"},
                "gang": {"type": "object", "properties": {"minMembers": {"type": "integer"}}},
                "zone": {
                    "type": "string",
                    "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "zone is immutable"}],
                },
            },
        },
        "status": {
            "type": "object",
            "properties": {"ready": {"type": "integer"}},
            "x-kubernetes-validations": [
                {"rule": "self.ready >= 0", "message": "ready may not be negative", "fieldPath": ".ready"}
            ],
        },
    },
}


def widget_crd(schema: dict[str, Any]) -> dict[str, Any]:
    return shared_widget_crd(schema, subresources={"status": {}})


def widget(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": name}, "spec": spec}


@pytest.fixture
async def client(apiserver: ApiServerHandle) -> AsyncIterator[httpx.AsyncClient]:
    await apply_crds(apiserver, [widget_crd(WIDGET_SCHEMA)])
    async with apiserver.http() as http:
        yield http


def assert_refused(response: httpx.Response, field: str, message: str, name: str) -> None:
    assert response.status_code == 422, response.text
    status = response.json()
    assert status["reason"] == "Invalid"
    assert status["details"]["causes"] == [{"reason": "FieldValueInvalid", "field": field, "message": message}]
    assert status["message"] == f'Widget.example.com "{name}" is invalid: {field}: {message}'


GANG_MESSAGE = f'Invalid value: "object": failed rule: {GANG_RULE}'


async def test_create_checks_the_rule(client: httpx.AsyncClient) -> None:
    ok = await client.post(WIDGETS, json=widget("fits", {"replicas": 3, "gang": {"minMembers": 2}}))
    assert ok.status_code == 201, ok.text
    refused = await client.post(WIDGETS, json=widget("too-big", {"replicas": 1, "gang": {"minMembers": 2}}))
    assert_refused(refused, "spec", GANG_MESSAGE, "too-big")
    assert (await client.get(f"{WIDGETS}/too-big")).status_code == 404


async def test_put_merge_patch_and_json_patch_check_the_rule(client: httpx.AsyncClient) -> None:
    created = await client.post(WIDGETS, json=widget("w", {"replicas": 3, "gang": {"minMembers": 2}}))
    assert created.status_code == 201
    merge = await client.patch(f"{WIDGETS}/w", headers=MERGE, json={"spec": {"replicas": 1}})
    assert_refused(merge, "spec", GANG_MESSAGE, "w")
    ops = [{"op": "replace", "path": "/spec/gang/minMembers", "value": 5}]
    assert_refused(await client.patch(f"{WIDGETS}/w", headers=JSON_PATCH, json=ops), "spec", GANG_MESSAGE, "w")
    body = created.json()
    body["spec"]["replicas"] = 1
    assert_refused(await client.put(f"{WIDGETS}/w", json=body), "spec", GANG_MESSAGE, "w")
    fine = await client.patch(f"{WIDGETS}/w", headers=MERGE, json={"spec": {"replicas": 2}})
    assert fine.status_code == 200 and fine.json()["spec"]["replicas"] == 2


async def test_status_update_checks_status_rules(client: httpx.AsyncClient) -> None:
    assert (await client.post(WIDGETS, json=widget("s", {"replicas": 1}))).status_code == 201
    ok = await client.patch(f"{WIDGETS}/s/status", headers=MERGE, json={"status": {"ready": 1}})
    assert ok.status_code == 200, ok.text
    refused = await client.patch(f"{WIDGETS}/s/status", headers=MERGE, json={"status": {"ready": -1}})
    assert_refused(refused, "status.ready", 'Invalid value: "object": ready may not be negative', "s")
    current = (await client.get(f"{WIDGETS}/s")).json()
    current["status"] = {"ready": -2}
    put = await client.put(f"{WIDGETS}/s/status", json=current)
    assert_refused(put, "status.ready", 'Invalid value: "object": ready may not be negative', "s")
    assert (await client.get(f"{WIDGETS}/s")).json()["status"] == {"ready": 1}


async def test_transition_rule_makes_a_field_immutable(client: httpx.AsyncClient) -> None:
    assert (await client.post(WIDGETS, json=widget("z", {"replicas": 1, "zone": "a"}))).status_code == 201
    refused = await client.patch(f"{WIDGETS}/z", headers=MERGE, json={"spec": {"zone": "b"}})
    assert_refused(refused, "spec.zone", 'Invalid value: "b": zone is immutable', "z")
    same = await client.patch(f"{WIDGETS}/z", headers=MERGE, json={"spec": {"zone": "a", "replicas": 2}})
    assert same.status_code == 200, same.text


async def test_crd_whose_rule_does_not_compile_is_refused(apiserver: ApiServerHandle) -> None:
    schema = {
        "type": "object",
        "properties": {"spec": {"type": "object", "x-kubernetes-validations": [{"rule": "self.replicas <="}]}},
    }
    async with apiserver.http() as http:
        response = await http.post(CRDS, json=widget_crd(schema))
        assert response.status_code == 422, response.text
        status = response.json()
        [cause] = status["details"]["causes"]
        assert cause["field"] == "spec.validation.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule"
        assert cause["message"].startswith('Invalid value: "self.replicas <=": compilation failed: syntax error')
        assert status["message"].startswith(
            'CustomResourceDefinition.apiextensions.k8s.io "widgets.example.com" is invalid: '
            "spec.validation.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule"
        )
        assert (await http.get(f"{CRDS}/widgets.example.com")).status_code == 404


async def test_crd_update_with_a_rule_that_does_not_compile_is_refused(client: httpx.AsyncClient) -> None:
    current = (await client.get(f"{CRDS}/widgets.example.com")).json()
    current["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["x-kubernetes-validations"] = [
        {"rule": "replicas > 0"}
    ]
    response = await client.put(f"{CRDS}/widgets.example.com", json=current)
    assert response.status_code == 422, response.text
    assert "undeclared reference to 'replicas'" in response.json()["details"]["causes"][0]["message"]


# ------------------------------------------------------------------------------ tensor-fusion.ai CRDs
def _spec_rules(kind: str) -> list[dict[str, Any]]:
    from tfusion.api.crds import all_crds

    generated: list[Any] = all_crds()
    crd = next(c for c in generated if c["spec"]["names"]["kind"] == kind)
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    found: list[dict[str, Any]] = schema["properties"]["spec"].get("x-kubernetes-validations") or []
    return found


@pytest.mark.parametrize(
    ("kind", "plural"), [("TensorFusionWorkload", "tensorfusionworkloads"), ("WorkloadProfile", "workloadprofiles")]
)
async def test_tensor_fusion_gang_members_may_not_exceed_replicas(
    apiserver: ApiServerHandle, kind: str, plural: str
) -> None:
    spec_rules = [r for r in _spec_rules(kind) if "minMembers <= self.replicas" in r.get("rule", "")]
    if not spec_rules:
        pytest.skip(f"the {kind} CRD has no gangScheduling.minMembers <= replicas rule on .spec yet")
    await apply_crds(apiserver)
    url = f"/apis/tensor-fusion.ai/v1/namespaces/default/{plural}"
    body: dict[str, Any] = {
        "apiVersion": "tensor-fusion.ai/v1",
        "kind": kind,
        "metadata": {"name": "gang"},
        "spec": {"replicas": 2, "gangScheduling": {"minMembers": 3}},
    }
    async with apiserver.http() as http:
        response = await http.post(url, json=body)
        assert response.status_code == 422, response.text
        [cause] = response.json()["details"]["causes"]
        expected = spec_rules[0].get("message") or f"failed rule: {spec_rules[0]['rule']}"
        assert cause == {
            "reason": "FieldValueInvalid",
            "field": "spec",
            "message": f'Invalid value: "object": {expected}',
        }
        accepted = await http.post(url, json={**body, "spec": {"replicas": 3, "gangScheduling": {"minMembers": 3}}})
        assert accepted.status_code == 201, accepted.text
