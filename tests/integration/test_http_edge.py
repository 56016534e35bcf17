"""The one HTTP edge of the controller and the hypervisor (`tfusion.web.make_app`): every non-2xx
answer is `{"error": ...}` JSON (404 for an unknown route, 405 with `Allow`, 400 naming the bad
parameter, 500 with a logged traceback), and both roles' OpenAPI documents declare their request
and response bodies. The roles are served for real (the hypervisor with the local backend, the
controller against the embedded API server); the edge cases that no route of ours produces on
purpose (a handler that raises, a typed parameter) run on an in-process app built by the same
`make_app`. Also: the hypervisor's token routes take `Bearer <token>` and the raw token."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from litestar import get, post
from litestar.testing import AsyncTestClient
from prometheus_client.parser import text_string_to_metric_families

from tests.apiserver_fixture import ApiServerHandle, apply_crds
from tests.helpers.controller import controllers, settings_for, start_controller
from tests.helpers.kube_hypervisor import kube_hypervisor
from tfusion.api import annotations as tfa
from tfusion.hypervisor import role as hypervisor_role
from tfusion.kube.auth import bearer_token
from tfusion.kube.client import KubeClient
from tfusion.kube.resources import GPUNODES, GPUPOOLS, PODS, SERVICEACCOUNTS
from tfusion.settings import Settings
from tfusion.web import ErrorBody, HttpError, make_app

pytestmark = pytest.mark.anyio

SPEC = "sim:1xA100-SXM4-80GB"
NODE = "edge-node"


@asynccontextmanager
async def local_hypervisor(state: Path) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings.load({"backend": "local", "devices": SPEC, "hypervisor_port": 0, "state_dir": str(state),
                              "metrics_output_path": str(state / "metrics.log"), "node_name": NODE},
                             env={}, roles=("hypervisor",))
    async with anyio.create_task_group() as tg:
        port = await tg.start(hypervisor_role.run, settings)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            yield client
        tg.cancel_scope.cancel()


def edge_hypervisor(apiserver: ApiServerHandle, state: Path) -> AbstractAsyncContextManager[httpx.AsyncClient]:
    return kube_hypervisor(apiserver, state, node=NODE, devices=SPEC)


def assert_error(response: httpx.Response, status: int, *fragments: str) -> dict[str, Any]:
    """`response` is `status` with an ErrorBody JSON whose message holds every fragment."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json"), response.headers
    body = response.json()
    assert isinstance(body, dict) and isinstance(body.get("error"), str) and body["error"], body
    assert set(body) <= {"error", "field", "allowed", "free", "reasons"}, body
    for fragment in fragments:
        assert fragment in body["error"], (fragment, body)
    return body


def assert_not_allowed(response: httpx.Response, *allowed: str) -> None:
    body = assert_error(response, 405, "not allowed")
    methods = {m.strip() for m in response.headers["allow"].split(",")}
    assert set(allowed) <= methods, methods
    assert set(body["allowed"]) == methods


# --- OpenAPI ---------------------------------------------------------------------------------------

def resolve(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """Follow `$ref` (and a single-item allOf, as Litestar writes a described $ref)."""
    while True:
        if "$ref" in schema:
            schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
        elif len(schema.get("allOf", [])) == 1:
            schema = schema["allOf"][0]
        else:
            return schema


def assert_schema_not_empty(doc: dict[str, Any], schema: dict[str, Any], where: str) -> None:
    target = resolve(doc, schema)
    if target.get("type") == "array":  # a list of typed items (the extender's HostPriorityList)
        assert_schema_not_empty(doc, target["items"], f"{where} items")
        return
    assert target.get("properties") or target.get("oneOf") or target.get("anyOf"), (where, target)
    for option in target.get("oneOf", []) + target.get("anyOf", []):
        assert resolve(doc, option).get("properties"), (where, option)


def operations(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(method.upper(), path, op) for path, item in doc["paths"].items()
            for method, op in item.items() if method in ("get", "post", "put", "patch", "delete")]


def check_openapi(doc: dict[str, Any], *, bodies: dict[str, tuple[str, ...]],
                  text_plain: frozenset[str] = frozenset(), text_success: frozenset[str] = frozenset()) -> None:
    """Every operation documents a non-empty 2xx body (501-only stubs: a 501 ErrorBody) and an
    ErrorBody for each error; `bodies` names the POST routes with a request body (and its media
    types); the other POST routes declare none. `text_plain` routes answer text, errors included
    (the original's clients read them as text): every documented answer is a text/plain string.
    `text_success` routes answer a text/plain string on success and an ErrorBody otherwise."""
    assert not {"/healthz", "/readyz", "/metrics"} & set(doc["paths"]), "probes and metrics stay out of the schema"
    for method, path, op in operations(doc):
        where = f"{method} {path}"
        responses = op["responses"]
        if path in text_plain:
            assert {"200", "401", "500", "503"} <= set(responses), (where, responses)
            for code, response in responses.items():
                assert response["content"]["text/plain"]["schema"] == {"type": "string"}, (where, code)
            continue
        successes = {code: r for code, r in responses.items() if code.startswith("2")}
        if not successes:
            assert set(responses) >= {"501"}, (where, responses)
        for code, response in responses.items():
            content = response.get("content") or {}
            if path in text_success and code.startswith("2"):
                assert content["text/plain"]["schema"] == {"type": "string"}, (where, code)
                continue
            assert "application/json" in content, (where, code, response)
            schema = content["application/json"]["schema"]
            assert_schema_not_empty(doc, schema, f"{where} {code}")
            if not code.startswith("2"):
                assert "error" in resolve(doc, schema)["properties"], (where, code)
        if "500" not in responses:
            raise AssertionError(f"{where} does not document its 500 body")
        if method == "POST" and path in bodies:
            request_body = op.get("requestBody")
            assert request_body, f"{where} declares no request body"
            assert set(bodies[path]) <= set(request_body["content"]), (where, request_body["content"].keys())
            for media in request_body["content"].values():
                assert_schema_not_empty(doc, media["schema"], f"{where} request body")
        elif method == "POST":
            assert "requestBody" not in op, f"{where} takes no body but documents one"
    assert {path for path in bodies} <= set(doc["paths"])


# --- the hypervisor -------------------------------------------------------------------------------

async def test_hypervisor_errors_are_json(tmp_path: Path) -> None:
    async with local_hypervisor(tmp_path) as http:
        assert_error(await http.get("/api/v1/nothing"), 404, "no route GET /api/v1/nothing")
        assert_error(await http.get("/nothing/at/all"), 404)
        assert_not_allowed(await http.put("/api/v1/devices"), "GET")
        assert_not_allowed(await http.delete("/api/v1/limiter"), "GET")
        assert_not_allowed(await http.get("/api/v1/trap"), "POST")
        assert_not_allowed(await http.post("/healthz"), "GET")
        missing = assert_error(await http.post("/api/v1/process", params={"container_name": "main"}), 400,
                               "container_pid")
        assert missing["field"] == "container_pid"
        bad_pid = assert_error(await http.post("/api/v1/process", params={"container_name": "main",
                                                                          "container_pid": "x1"}), 400, "'x1'")
        assert bad_pid["field"] == "container_pid"
        assert_error(await http.post("/api/v1/workers", content=b"{nope"), 400, "not valid JSON")
        assert_error(await http.post("/api/v1/workers/nope/snapshot"), 404, "worker not found")
        assert_error(await http.get("/schema/nothing"), 404)
        assert_error(await http.get("/schema/nothing.json"), 404)
        # /readyz keeps its own 503 body, and a healthy one is untouched
        assert (await http.get("/readyz")).json()["status"] == "ready"


async def test_metrics_answer_in_the_format_and_encoding_asked(tmp_path: Path) -> None:
    """/metrics, written off the event loop, answers as prometheus_client's handler does: the text
    format by default, OpenMetrics when asked, gzipped when allowed, only the `name[]` families
    asked for, no body to HEAD."""
    async with local_hypervisor(tmp_path) as http:
        plain = await http.get("/metrics", headers={"Accept-Encoding": "identity"})
        assert plain.status_code == 200 and plain.headers["content-type"].startswith("text/plain")
        assert "content-encoding" not in plain.headers
        names = {family.name for family in text_string_to_metric_families(plain.text)}
        assert "tfusion_gpu_healthy" in names and len(names) > 5
        zipped = await http.get("/metrics", headers={"Accept-Encoding": "gzip"})
        assert zipped.headers["content-encoding"] == "gzip" and "# TYPE" in zipped.text
        open_metrics = await http.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
        assert open_metrics.headers["content-type"].startswith("application/openmetrics-text")
        assert open_metrics.text.rstrip().endswith("# EOF")
        some = await http.get("/metrics", params={"name[]": "tfusion_gpu_healthy"})
        assert {family.name for family in text_string_to_metric_families(some.text)} == {"tfusion_gpu_healthy"}
        head = await http.head("/metrics")
        assert head.status_code == 200 and head.content == b""


async def test_hypervisor_openapi_documents_every_body(tmp_path: Path) -> None:
    async with local_hypervisor(tmp_path) as http:
        doc = (await http.get("/schema/openapi.json")).json()
    check_openapi(doc, bodies={"/api/v1/workers": ("application/json",)})
    schemas = doc["components"]["schemas"]
    assert {"UUID", "Model", "Healthy", "VirtualizationCapabilities"} <= set(schemas["Device"]["properties"])
    assert {"WorkerInfo", "DeviceInfos", "Envs"} <= set(schemas["WorkerAllocation"]["properties"])
    assert {"name", "gpuIds", "gpuCount", "workingDir"} <= set(schemas["WorkerCreateRequest"]["properties"])
    pod = doc["paths"]["/api/v1/pod"]["get"]
    assert {p["name"] for p in pod["parameters"]} == {"container_name", "authorization"}


async def test_local_worker_routes_answer_405_with_allow_in_kubernetes_mode(
        apiserver: ApiServerHandle, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with edge_hypervisor(apiserver, tmp_path) as http:
        refused = await http.post("/api/v1/workers", json={"name": "w"})
        body = assert_error(refused, 405, "--backend=local")
        # the route does not exist in Kubernetes mode: Allow, `allowed` and the document agree
        assert {m.strip() for m in refused.headers["allow"].split(",")} == set(body["allowed"]) == {"GET", "OPTIONS"}
        assert_error(await http.delete("/api/v1/workers/some-uid"), 405, "delete the pod")


def test_bearer_token_accepts_bearer_and_the_raw_token() -> None:
    assert bearer_token("Bearer abc.def.ghi") == "abc.def.ghi"
    assert bearer_token("bearer  abc.def.ghi ") == "abc.def.ghi"
    assert bearer_token("abc.def.ghi") == "abc.def.ghi"
    assert bearer_token("  abc.def.ghi  ") == "abc.def.ghi"
    for refused in ("", "   ", "Bearer", "Bearer   ", "Basic abc", "Token abc"):
        assert bearer_token(refused) is None, refused


async def test_token_routes_accept_the_raw_token(apiserver: ApiServerHandle, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    client = await KubeClient.connect(apiserver.kubeconfig)
    try:
        pool = await client.create(GPUPOOLS, {"metadata": {"name": "pool-a"}, "spec": {"nodeManagerConfig": {}}})
        await client.create(GPUNODES, {"metadata": {"name": NODE, "ownerReferences": [{
            "apiVersion": "tensor-fusion.ai/v1", "kind": "GPUPool", "name": "pool-a",
            "uid": pool["metadata"]["uid"], "controller": True}]}, "spec": {}})
        try:
            await client.create(SERVICEACCOUNTS, {"metadata": {"name": "default", "namespace": "default"}})
        except Exception:  # the API server may have created it itself
            pass
        async with edge_hypervisor(apiserver, tmp_path) as http:
            device = (await http.get("/api/v1/devices")).json()["data"][0]["UUID"]
            pod = await client.create(PODS, {
                "metadata": {"name": "infer-0", "namespace": "default",
                             "labels": {tfa.COMPONENT: "worker"},
                             "annotations": {tfa.GPU_IDS: device, tfa.GPU_POOL: "pool-a",
                                             tfa.TFLOPS_LIMIT: "100", tfa.VRAM_LIMIT: "8Gi"}},
                "spec": {"nodeName": NODE, "serviceAccountName": "default",
                         "containers": [{"name": "main", "image": "busybox"}]}})
            token = await client.request_token("default", "default",
                                               bound_pod={"name": "infer-0", "uid": pod["metadata"]["uid"]})
            with anyio.fail_after(10):
                while not (await http.get("/api/v1/workers")).json()["data"]:
                    await anyio.sleep(0.1)
            answers = {}
            for header in (f"Bearer {token}", token):
                answer = await http.get("/api/v1/pod", params={"container_name": "main"},
                                        headers={"Authorization": header})
                assert answer.status_code == 200, (header[:10], answer.text)
                answers[header == token] = answer.json()
            assert answers[True] == answers[False] and answers[True]["data"]["pod_name"] == "infer-0"
            raw_process = await http.post("/api/v1/process", params={"container_name": "main", "container_pid": "42"},
                                          headers={"Authorization": token})
            assert raw_process.status_code == 200 and raw_process.json()["success"] is False, raw_process.text
            assert_error(await http.get("/api/v1/pod", params={"container_name": "main"},
                                        headers={"Authorization": f"Basic {token}"}), 401,
                         "'Bearer <service-account token>' or the raw token")
            assert_error(await http.get("/api/v1/pod", params={"container_name": "main"},
                                        headers={"Authorization": "not-a-jwt"}), 401, "unauthorized: invalid")
    finally:
        await client.close()


# --- the controller -------------------------------------------------------------------------------

async def test_controller_errors_and_openapi(apiserver: ApiServerHandle, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with controllers() as tg:
        ctl = await start_controller(tg, settings_for(apiserver, tmp_path))
        http = ctl.http
        assert_error(await http.get("/api/nothing"), 404, "no route GET /api/nothing")
        assert_not_allowed(await http.post("/api/config"), "GET")
        assert_not_allowed(await http.get("/api/simulate-schedule"), "POST")
        assert_not_allowed(await http.delete("/api/allocation"), "GET")
        assert_error(await http.post("/api/simulate-schedule", content=b"- just\n- a list\n"), 400)
        other_scheduler = b"apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {schedulerName: default-scheduler}\n"
        foreign = assert_error(await http.post("/api/simulate-schedule", content=other_scheduler), 400,
                               "spec.schedulerName", "'default-scheduler'", "'tensor-fusion-scheduler'")
        assert foreign["field"] == "spec.schedulerName", foreign
        assert (await http.get("/api/config")).json().keys() == {"config"}
        doc = (await http.get("/schema/openapi.json")).json()
        await ctl.stop()
    check_openapi(doc, bodies={"/api/simulate-schedule": ("application/json", "application/yaml"),
                               **{f"/scheduler/{verb}": ("application/json",)
                                  for verb in ("filter", "prioritize", "bind", "preempt")}},
                  text_plain=frozenset({"/api/assign-index", "/api/assign-host-port"}),
                  text_success=frozenset({"/api/connection"}))
    schemas = doc["components"]["schemas"]
    assert set(schemas["AllocationView"]["properties"]) == {"gpuStore", "nodeWorkerStore", "allocation",
                                                            "gpuToWorkerMap", "drift"}
    assert "config" in schemas["ConfigBody"]["properties"]
    assert "gpuSchedulerState" in schemas["SimulateScheduleResult"]["properties"]


# --- the edge itself, on an in-process app ----------------------------------------------------------

@get("/boom", sync_to_thread=False)
def boom() -> ErrorBody:
    raise RuntimeError("the disk caught fire")


@get("/items/{index:int}", sync_to_thread=False)
def item(index: int, limit: int, colour: str = "red") -> ErrorBody:
    if index == 0:
        raise HttpError(409, ErrorBody(error="item 0 is taken", field="index"))
    return ErrorBody(error=f"{index} {limit} {colour}")


@post("/echo", status_code=200, sync_to_thread=False)
def echo(data: ErrorBody) -> ErrorBody:
    return data


async def test_unexpected_exception_is_500_json_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    async with AsyncTestClient(make_app([boom, item, echo], title="edge")) as client:
        with caplog.at_level(logging.ERROR, logger="tfusion.web"):
            response = await client.get("/boom")
    assert response.status_code == 500
    assert response.json() == {"error": "internal error: RuntimeError: the disk caught fire"}
    logged = [r for r in caplog.records if r.name == "tfusion.web" and r.exc_info]
    assert logged and "GET /boom" in logged[0].getMessage()
    assert logged[0].exc_info is not None and isinstance(logged[0].exc_info[1], RuntimeError)


async def test_validation_errors_name_the_parameter() -> None:
    async with AsyncTestClient(make_app([boom, item, echo], title="edge")) as client:
        wrong_type = (await client.get("/items/3", params={"limit": "many"}))
        assert wrong_type.status_code == 400
        assert wrong_type.json()["field"] == "limit" and "query parameter 'limit'" in wrong_type.json()["error"]
        missing = await client.get("/items/3")
        assert missing.status_code == 400 and missing.json()["field"] == "limit", missing.text
        bad_field = await client.post("/echo", json={"error": 5})
        assert bad_field.status_code == 400 and bad_field.json()["field"] == "error", bad_field.text
        not_json = await client.post("/echo", content=b"{")
        assert not_json.status_code == 400 and not_json.json()["error"].startswith("bad request to POST /echo")
        refused = await client.get("/items/0", params={"limit": "1"})
        assert (refused.status_code, refused.json()) == (409, {"error": "item 0 is taken", "field": "index"})
        assert (await client.get("/items/2", params={"limit": "1"})).json() == {"error": "2 1 red"}
        not_allowed = await client.delete("/echo")
        assert not_allowed.status_code == 405 and "POST" in not_allowed.headers["allow"]
        assert not_allowed.json()["allowed"] == [m.strip() for m in not_allowed.headers["allow"].split(",")]
        doc = (await client.get("/schema/openapi.json")).json()
    responses = doc["paths"]["/items/{index}"]["get"]["responses"]
    assert responses["400"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorBody"}
    assert "500" in doc["paths"]["/boom"]["get"]["responses"] and "400" not in doc["paths"]["/boom"]["get"]["responses"]
