"""Wrong-typed bodies and headers that used to reach a handler and crash it (500) are the caller's
mistake: a 4xx Status naming the field (issue 23, item 2).

Covers the access reviews (SubjectAccessReview, SelfSubjectAccessReview, LocalSubjectAccessReview,
SelfSubjectRulesReview, SelfSubjectReview), CustomResourceDefinitions with wrong-typed names, versions
and schemas, a non-ASCII bearer token checked before authentication, wrong-typed metadata of stored
kinds, and bodies nested 200,000 levels deep in every decoder a write goes through.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.apiserver_fixture import ApiServerHandle, apply_crds_sync
from tests.helpers import no_error_logged_fixture, with_field

AUTHZ = "/apis/authorization.k8s.io/v1"
SAR = f"{AUTHZ}/subjectaccessreviews"
SSAR = f"{AUTHZ}/selfsubjectaccessreviews"
LSAR = f"{AUTHZ}/namespaces/default/localsubjectaccessreviews"
SSRR = f"{AUTHZ}/selfsubjectrulesreviews"
SSR = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
TOKEN_REVIEW = "/apis/authentication.k8s.io/v1/tokenreviews"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
CMS = "/api/v1/namespaces/default/configmaps"
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
DEPTH = 200_000


no_error_logged = no_error_logged_fixture(autouse=True)

@pytest.fixture
def client(apiserver: ApiServerHandle) -> Iterator[httpx.Client]:
    with apiserver.sync_http(timeout=60) as http:
        yield http


def assert_4xx(response: httpx.Response, codes: tuple[int, ...], *words: str) -> None:
    assert response.status_code in codes, f"{response.status_code}: {response.text[:500]}"
    body = response.json()
    assert body["kind"] == "Status" and body["code"] == response.status_code
    for word in words:
        assert word in response.text, f"{word!r} not in {response.text[:500]}"


def _sar(spec: Any) -> dict[str, Any]:
    return {"kind": "SubjectAccessReview", "apiVersion": "authorization.k8s.io/v1", "spec": spec}


GET_PODS = {"verb": "get", "resource": "pods"}
REVIEW_CASES: list[tuple[str, str, Any, tuple[str, ...]]] = [
    ("SAR spec is a string", SAR, _sar("x"), ("spec", "must be an object")),
    ("SAR spec is a list", SAR, _sar([1]), ("spec",)),
    ("SAR spec is true", SAR, _sar(True), ("spec",)),
    ("SAR resourceAttributes is a list", SAR, _sar({"user": "u", "resourceAttributes": [GET_PODS]}),
     ("spec.resourceAttributes", "must be an object")),
    ("SAR nonResourceAttributes is a string", SAR, _sar({"user": "u", "nonResourceAttributes": "x"}),
     ("spec.nonResourceAttributes",)),
    ("SAR nonResourceAttributes.path is a list", SAR,
     _sar({"user": "u", "nonResourceAttributes": {"verb": "get", "path": ["/x"]}}),
     ("spec.nonResourceAttributes.path", "must be a string")),
    ("SAR extra is a list", SAR, _sar({"user": "u", "extra": ["a"], "resourceAttributes": GET_PODS}),
     ("spec.extra", "must be an object")),
    ("SAR extra value is a string", SAR, _sar({"user": "u", "extra": {"k": "v"}, "resourceAttributes": GET_PODS}),
     ("spec.extra[k]", "list of strings")),
    ("SAR extra value holds a number", SAR,
     _sar({"user": "u", "extra": {"k": [1]}, "resourceAttributes": GET_PODS}), ("spec.extra[k]",)),
    ("SAR uid is a number", SAR, _sar({"user": "u", "uid": 5, "resourceAttributes": GET_PODS}), ("spec.uid",)),
    ("SAR metadata is a string", SAR, {**_sar({"user": "u", "resourceAttributes": GET_PODS}), "metadata": "x"},
     ("metadata", "must be an object")),
    ("SSAR spec is a string", SSAR, {"spec": "x"}, ("spec",)),
    ("SSAR spec is a number", SSAR, {"spec": 5}, ("spec",)),
    ("SSAR resourceAttributes is a list", SSAR, {"spec": {"resourceAttributes": [1]}},
     ("spec.resourceAttributes",)),
    ("LSAR spec is null-free list", LSAR, {"spec": []}, ("spec",)),
    ("LSAR spec is a string", LSAR, {"spec": "x"}, ("spec",)),
    ("LSAR resourceAttributes is a list", LSAR, {"spec": {"user": "u", "resourceAttributes": []}},
     ("spec.resourceAttributes",)),
    ("SSRR spec is a string", SSRR, {"spec": "x"}, ("spec",)),
    ("SSRR metadata is a list", SSRR, {"metadata": [1]}, ("metadata",)),
    ("SSR metadata is a number", SSR, {"metadata": 5}, ("metadata",)),
    ("TokenReview spec is a string", TOKEN_REVIEW, {"spec": "x"}, ("spec",)),
    ("TokenReview token is a list", TOKEN_REVIEW, {"spec": {"token": ["x"]}}, ("spec.token",)),
]


@pytest.mark.parametrize(("path", "body", "words"), [c[1:] for c in REVIEW_CASES], ids=[c[0] for c in REVIEW_CASES])
def test_wrong_typed_reviews_are_4xx(client: httpx.Client, path: str, body: Any, words: tuple[str, ...]) -> None:
    assert_4xx(client.post(path, content=orjson.dumps(body)), (400, 422), *words)


def test_a_well_typed_review_still_answers(client: httpx.Client) -> None:
    review = _sar({"user": "u", "extra": {"k": ["v"]}, "resourceAttributes": GET_PODS})
    response = client.post(SAR, json=review)
    assert response.status_code == 201 and response.json()["status"]["allowed"] is False
    local = client.post(LSAR, json={"spec": {"user": "u", "resourceAttributes": GET_PODS}})
    assert local.status_code == 201
    assert local.json()["spec"]["resourceAttributes"]["namespace"] == "default"


# ------------------------------------------------------------------------------ CRDs
CRD: dict[str, Any] = {
    "metadata": {"name": "things.example.com"},
    "spec": {
        "group": "example.com",
        "scope": "Namespaced",
        "names": {"plural": "things", "kind": "Thing"},
        "versions": [{"name": "v1", "served": True, "storage": True,
                      "schema": {"openAPIV3Schema": {"type": "object",
                                                     "properties": {"spec": {"type": "object"}}}}}],
    },
}


CRD_CASES: list[tuple[str, tuple[Any, ...], Any, str]] = [
    ("names is a string", ("spec", "names"), "x", "spec.names"),
    ("names.plural is a number", ("spec", "names", "plural"), 5, "spec.names.plural"),
    ("names.shortNames is a number", ("spec", "names", "shortNames"), 5, "spec.names.shortNames"),
    ("names.categories is a string", ("spec", "names", "categories"), "all", "spec.names.categories"),
    ("versions is not a list", ("spec", "versions"), {"name": "v1"}, "spec.versions"),
    ("versions is a number", ("spec", "versions"), 5, "spec.versions"),
    ("version name is a number", ("spec", "versions", 0, "name"), 1, "spec.versions[0].name"),
    ("schema is a list", ("spec", "versions", 0, "schema"), [1], "spec.versions[0].schema"),
    ("openAPIV3Schema is a list", ("spec", "versions", 0, "schema", "openAPIV3Schema"), [],
     "spec.versions[0].schema.openAPIV3Schema"),
    ("properties is a string", ("spec", "versions", 0, "schema", "openAPIV3Schema", "properties"), "x",
     "openAPIV3Schema.properties"),
    ("a property is a list", ("spec", "versions", 0, "schema", "openAPIV3Schema", "properties", "spec"), [1],
     "properties[spec]"),
    ("x-kubernetes-validations is a number",
     ("spec", "versions", 0, "schema", "openAPIV3Schema", "x-kubernetes-validations"), 5,
     "x-kubernetes-validations"),
    ("printer columns is a number", ("spec", "versions", 0, "additionalPrinterColumns"), 5,
     "additionalPrinterColumns"),
    ("subresources is a list", ("spec", "versions", 0, "subresources"), ["status"], "subresources"),
]


@pytest.mark.parametrize(("path", "value", "field"), [c[1:] for c in CRD_CASES], ids=[c[0] for c in CRD_CASES])
def test_wrong_typed_crds_are_4xx(client: httpx.Client, path: tuple[Any, ...], value: Any, field: str) -> None:
    assert_4xx(client.post(CRDS, json=with_field(CRD, path, value)), (400, 422), field)
    assert client.get(f"{CRDS}/things.example.com").status_code == 404


def test_wrong_typed_crd_updates_are_4xx(client: httpx.Client) -> None:
    created = client.post(CRDS, json=CRD)
    assert created.status_code == 201, created.text
    for _, path, value, field in CRD_CASES:
        current = client.get(f"{CRDS}/things.example.com").json()
        body = with_field(CRD, path, value)
        body["metadata"] = current["metadata"]
        assert_4xx(client.put(f"{CRDS}/things.example.com", json=body), (400, 422), field)
        patch = with_field(CRD, path, value)["spec"]
        assert_4xx(client.patch(f"{CRDS}/things.example.com", content=orjson.dumps({"spec": patch}),
                                headers={"content-type": MERGE}), (400, 422), field)
    assert client.get("/apis/example.com/v1/namespaces/default/things").status_code == 200


def test_the_tensor_fusion_crds_still_pass_the_shape_check(apiserver: ApiServerHandle) -> None:
    assert len(apply_crds_sync(apiserver)) > 5


# ------------------------------------------------------------------------------ authentication
@pytest.mark.parametrize("header", ["Bearer é.é.é".encode(), "Bearer é.é.é".encode("latin-1"), b"Bearer \xff\xfe",
                                    "Bearer ☃".encode()], ids=["utf-8", "latin-1", "invalid utf-8", "snowman"])
def test_a_non_ascii_bearer_token_is_401(apiserver: ApiServerHandle, header: bytes) -> None:
    with apiserver.sync_http(authenticated=False) as http:
        response = http.get("/api/v1/namespaces", headers={b"authorization": header})
    assert_4xx(response, (401,), "Unauthorized")


# ------------------------------------------------------------------------------ metadata
METADATA_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("labels is a list", {"labels": ["a"]}, "metadata.labels"),
    ("a label value is a number", {"labels": {"a": 1}}, "metadata.labels[a]"),
    ("annotations is a string", {"annotations": "x"}, "metadata.annotations"),
    ("an annotation value is an object", {"annotations": {"a": {}}}, "metadata.annotations[a]"),
    ("name is a number", {"name": 5}, "name"),
    ("namespace is an object", {"namespace": {}}, "metadata.namespace"),
    ("finalizers is a string", {"finalizers": "x"}, "metadata.finalizers"),
    ("ownerReferences holds a string", {"ownerReferences": ["x"]}, "metadata.ownerReferences[0]"),
    ("ownerReference uid is a number", {"ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p",
                                                             "uid": 5}]}, "metadata.ownerReferences[0].uid"),
    ("generateName is a list", {"generateName": ["x"]}, "metadata.generateName"),
    ("deletionGracePeriodSeconds is a string", {"deletionGracePeriodSeconds": "x"},
     "metadata.deletionGracePeriodSeconds"),
]
TARGETS = [CMS, "/apis/rbac.authorization.k8s.io/v1/clusterroles", "/apis/tensor-fusion.ai/v1/gpus"]


@pytest.mark.parametrize(("meta", "field"), [c[1:] for c in METADATA_CASES], ids=[c[0] for c in METADATA_CASES])
def test_wrong_typed_metadata_is_4xx_on_every_write(
    apiserver: ApiServerHandle, client: httpx.Client, meta: dict[str, Any], field: str
) -> None:
    apply_crds_sync(apiserver)
    for url in TARGETS:
        extra: dict[str, Any] = {"spec": {}} if "gpus" in url else {}
        assert client.post(url, json={"metadata": {"name": "t"}, **extra}).status_code == 201
        assert_4xx(client.post(url, json={**extra, "metadata": {"name": "t2", **meta}}), (400, 422), field)
        current = client.get(f"{url}/t").json()
        current["metadata"].update(meta)
        if "name" not in meta:
            assert_4xx(client.put(f"{url}/t", json=current), (400, 422), field)
        for ctype in (MERGE, STRATEGIC) if url == CMS else (MERGE,):
            assert_4xx(client.patch(f"{url}/t", content=orjson.dumps({"metadata": meta}),
                                    headers={"content-type": ctype}), (400, 422), field)
        assert client.delete(f"{url}/t").status_code == 200


# ------------------------------------------------------------------------------ depth
DEEP_ARRAY = b"[" * DEPTH + b"]" * DEPTH
DEEP_OBJECT = b'{"a":' * DEPTH + b"1" + b"}" * DEPTH
DEEP_CASES: list[tuple[str, str, str, bytes, str]] = [
    ("create JSON arrays", "POST", CMS, DEEP_ARRAY, "application/json"),
    ("create JSON objects", "POST", CMS, DEEP_OBJECT, "application/json"),
    ("create YAML flow", "POST", CMS, b"a: " + DEEP_ARRAY, "application/yaml"),
    ("create YAML block sequence", "POST", CMS, b"- " * DEPTH + b"1", "application/yaml"),
    ("replace JSON", "PUT", f"{CMS}/t", DEEP_OBJECT, "application/json"),
    ("replace YAML", "PUT", f"{CMS}/t", b"a: " + DEEP_ARRAY, "application/yaml"),
    ("merge patch", "PATCH", f"{CMS}/t", DEEP_OBJECT, MERGE),
    ("strategic merge patch", "PATCH", f"{CMS}/t", DEEP_OBJECT, STRATEGIC),
    ("JSON patch", "PATCH", f"{CMS}/t", DEEP_ARRAY, JSON_PATCH),
    ("JSON patch value", "PATCH", f"{CMS}/t",
     b'[{"op":"add","path":"/data/x","value":' + DEEP_ARRAY + b"}]", JSON_PATCH),
    ("delete options", "DELETE", f"{CMS}/t", DEEP_OBJECT, "application/json"),
    ("access review", "POST", SAR, DEEP_OBJECT, "application/json"),
    ("token review", "POST", TOKEN_REVIEW, DEEP_OBJECT, "application/json"),
]


@pytest.mark.parametrize(("method", "url", "body", "ctype"), [c[1:] for c in DEEP_CASES],
                         ids=[c[0] for c in DEEP_CASES])
def test_bodies_nested_200000_deep_are_400(
    client: httpx.Client, method: str, url: str, body: bytes, ctype: str
) -> None:
    assert client.post(CMS, json={"metadata": {"name": "t"}}).status_code == 201
    response = client.request(method, url, content=body, headers={"content-type": ctype})
    assert_4xx(response, (400,), "nest")
    assert client.get(f"{CMS}/t").status_code == 200


# ------------------------------------------------------------------------------ generated
_scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**40), max_value=2**40),
                     st.text(max_size=8), st.sampled_from(["get", "pods", "default", "u", "x.y.z"]))
_values = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(
        ["spec", "user", "groups", "uid", "extra", "resourceAttributes", "nonResourceAttributes", "verb",
         "resource", "namespace", "path", "metadata", "names", "plural", "kind", "versions", "name", "schema",
         "openAPIV3Schema", "properties", "items", "type", "x", "k"]), inner, max_size=4)), max_leaves=12)
_REVIEW_PATHS = [SAR, SSAR, LSAR, SSRR, SSR, TOKEN_REVIEW]


@settings(max_examples=int(os.environ.get("TFUSION_FUZZ_EXAMPLES", "60")), deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=_values, spec=_values)
def test_generated_review_and_crd_bodies_never_5xx(client: httpx.Client, body: Any, spec: Any) -> None:
    for path in _REVIEW_PATHS:
        for sent in (body, {"spec": spec}):
            response = client.post(path, content=orjson.dumps(sent))
            assert response.status_code < 500, f"{path} {sent!r}: {response.text[:300]}"
    crd = with_field(CRD, ("spec",), spec if isinstance(spec, dict) else {"names": spec})
    response = client.post(CRDS, json=crd)
    assert response.status_code < 500, f"{crd!r}: {response.text[:300]}"
    if response.status_code == 201:
        client.delete(f"{CRDS}/things.example.com")


FULL_CRD: dict[str, Any] = {
    "metadata": {"name": "things.example.com"},
    "spec": {
        "group": "example.com", "scope": "Cluster", "conversion": {"strategy": "None"},
        "names": {"plural": "things", "kind": "Thing", "singular": "thing", "shortNames": ["th"],
                  "categories": ["all"], "listKind": "ThingList"},
        "versions": [{
            "name": "v1", "served": True, "storage": True, "subresources": {"status": {}},
            "additionalPrinterColumns": [{"name": "A", "type": "string", "jsonPath": ".spec.a"}],
            "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": {
                "type": "object", "properties": {"a": {"type": "string"}, "l": {"type": "array", "items": {
                    "type": "integer"}}},
                "x-kubernetes-validations": [{"rule": "self.a != 'x'"}]}}}},
        }],
    },
}


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if prefix:
        yield prefix
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in children:
        yield from _paths(child, (*prefix, key))


def test_every_field_of_a_crd_with_every_wrong_type_is_never_5xx(client: httpx.Client) -> None:
    """Each field of a full CRD replaced by a value of each other JSON type, on create and on replace."""
    wrong: list[Any] = ["x", 5, 1.5, True, None, [], [1], ["x"], {}, {"a": 1}, [{}]]
    url = f"{CRDS}/things.example.com"
    assert client.post(CRDS, json=FULL_CRD).status_code == 201
    for path in _paths(FULL_CRD):
        for value in wrong:
            crd = with_field(FULL_CRD, path, value)
            current = client.get(url).json()
            crd["metadata"] = {**crd["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]} \
                if isinstance(crd["metadata"], dict) else crd["metadata"]
            response = client.put(url, json=crd)
            assert response.status_code < 500, f"PUT {path}={value!r}: {response.text[:300]}"
            if response.status_code == 200:  # put the full CRD back for the next case
                again = client.get(url).json()
                restored = {**FULL_CRD, "metadata": {**FULL_CRD["metadata"],
                                                     "resourceVersion": again["metadata"]["resourceVersion"]}}
                assert client.put(url, json=restored).status_code == 200
    assert client.delete(url).status_code == 200
    for path in _paths(FULL_CRD):
        for value in wrong:
            crd = with_field(FULL_CRD, path, value)
            response = client.post(CRDS, json=crd)
            assert response.status_code < 500, f"POST {path}={value!r}: {response.text[:300]}"
            if response.status_code == 201:
                client.delete(f"{CRDS}/{response.json()['metadata']['name']}")
