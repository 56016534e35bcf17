"""Generated bodies against the embedded API server: whatever a client sends, the answer is never 5xx.

Hypothesis builds random JSON values, deeply nested ones, and valid objects with one field swapped
for a value of another type, and sends them to create, replace and patch pods, a custom resource
(TensorFusionWorkload, validated by its CRD schema) and TokenRequests. A 5xx is a bug: a caller's
mistake must come back as a 4xx Status naming what was wrong.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.apiserver_fixture import ApiServerHandle, apply_crds_sync
from tests.helpers import with_field

PODS = "/api/v1/namespaces/default/pods"
WORKLOADS = "/apis/tensor-fusion.ai/v1/namespaces/default/tensorfusionworkloads"
TOKEN = "/api/v1/namespaces/default/serviceaccounts/default/token"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"
PATCH_TYPES = ["application/merge-patch+json", "application/json-patch+json", "application/strategic-merge-patch+json"]

FUZZ = settings(
    max_examples=int(os.environ.get("TFUSION_FUZZ_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
    st.sampled_from(["", "x", "-", "a/b/c", "0", "True", "Pod", "default", "main"]),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=20,
)


@st.composite
def deep_values(draw: st.DrawFn) -> Any:
    depth = draw(st.integers(min_value=1, max_value=300))
    value: Any = draw(scalars)
    for _ in range(depth):
        value = [value] if draw(st.booleans()) else {"k": value}
    return value


def valid_pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "x"}, "annotations": {"a": "b"}, "finalizers": []},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "resources": {"limits": {"cpu": "1"}, "requests": {"memory": "1Mi"}},
                    "ports": [{"containerPort": 80}],
                    "env": [{"name": "A", "value": "1"}],
                    "volumeMounts": [{"name": "v", "mountPath": "/v"}],
                }
            ],
            "volumes": [{"name": "v", "emptyDir": {}}],
            "tolerations": [{"key": "k", "operator": "Exists"}],
            "nodeSelector": {"disk": "ssd"},
        },
        "status": {"phase": "Pending", "conditions": [{"type": "Ready", "status": "False"}]},
    }


def valid_workload(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "tensor-fusion.ai/v1",
        "kind": "TensorFusionWorkload",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "poolName": "pool",
            "qos": "high",
            "gpuCount": 1,
            "resources": {"requests": {"tflops": "1", "vram": "1Gi"}, "limits": {"tflops": "2", "vram": "1Gi"}},
        },
    }


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every path into a JSON value (keys and list indexes)."""
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from paths(item, (*prefix, index))


@st.composite
def mutated(draw: st.DrawFn, base: dict[str, Any]) -> Any:
    """`base` with the value at one of its paths swapped for a random (or deep) value."""
    path = draw(st.sampled_from(list(paths(base))))
    return with_field(base, path, draw(st.one_of(json_values, deep_values())))


bodies_for_pods = st.one_of(json_values, deep_values(), mutated(valid_pod("fuzz")))
bodies_for_workloads = st.one_of(json_values, deep_values(), mutated(valid_workload("fuzz")))
token_requests = st.one_of(
    json_values,
    mutated({"spec": {"audiences": ["a"], "expirationSeconds": 3600,
                      "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "target", "uid": "u"}}}),
)


def encode(body: Any) -> bytes:
    """stdlib json: unlike orjson it writes integers beyond 64 bits and nesting beyond 254 levels."""
    return json.dumps(body).encode()


def assert_no_5xx(response: httpx.Response, body: Any) -> None:
    assert response.status_code < 500, f"{response.status_code} for {encode(body)[:400]!r}: {response.text[:400]}"


@pytest.fixture
def client(apiserver: ApiServerHandle) -> Iterator[httpx.Client]:
    apply_crds_sync(apiserver)
    with apiserver.sync_http(timeout=30) as http:
        assert http.post(PODS, json=valid_pod("target")).status_code == 201
        created = http.post(WORKLOADS, json=valid_workload("target"))
        assert created.status_code == 201, created.text
        yield http


def _send_everywhere(http: httpx.Client, collection: str, body: Any) -> None:
    raw = encode(body)
    json_headers = {"content-type": "application/json"}
    assert_no_5xx(http.post(collection, content=raw, headers=json_headers), body)
    assert_no_5xx(http.put(f"{collection}/target", content=raw, headers=json_headers), body)
    for patch_type in PATCH_TYPES:
        assert_no_5xx(http.patch(f"{collection}/target", content=raw, headers={"content-type": patch_type}), body)
    assert_no_5xx(http.patch(f"{collection}/target/status", content=raw, headers={"content-type": PATCH_TYPES[0]}),
                  body)
    # whatever was stored must still print: kubectl asks for a Table
    assert_no_5xx(http.get(collection, headers={"accept": TABLE}), body)


@FUZZ
@given(body=bodies_for_pods)
def test_generated_pod_bodies_never_5xx(client: httpx.Client, body: Any) -> None:
    _send_everywhere(client, PODS, body)
    assert_no_5xx(client.post(f"{PODS}/target/binding", content=encode(body)), body)
    assert_no_5xx(client.post(f"{PODS}/target/eviction", content=encode(body)), body)
    # whatever happened, the target pod is still there (or is recreated) for the next example
    if client.get(f"{PODS}/target").status_code == 404:
        client.post(PODS, json=valid_pod("target"))


@FUZZ
@given(body=bodies_for_workloads)
def test_generated_custom_resource_bodies_never_5xx(client: httpx.Client, body: Any) -> None:
    _send_everywhere(client, WORKLOADS, body)


@FUZZ
@given(body=token_requests)
def test_generated_token_requests_never_5xx(client: httpx.Client, body: Any) -> None:
    assert_no_5xx(client.post(TOKEN, content=encode(body)), body)
    review = {"spec": body} if not isinstance(body, dict) else body
    assert_no_5xx(client.post("/apis/authentication.k8s.io/v1/tokenreviews", content=encode(review)), body)


@FUZZ
@given(body=json_values, policy=st.sampled_from(["", "Orphan", "Background", "Foreground", "x"]))
def test_generated_delete_options_never_5xx(client: httpx.Client, body: Any, policy: str) -> None:
    params = {"propagationPolicy": policy} if policy else {}
    response = client.request("DELETE", f"{PODS}/target", content=encode(body), params=params)
    assert_no_5xx(response, body)
    if client.get(f"{PODS}/target").status_code == 404:
        client.post(PODS, json=valid_pod("target"))
