"""Hostile input to the controller's and the hypervisor's HTTP edges (issue 11): bodies too large,
too deep, alias bombs, YAML beyond JSON, huge integers, odd methods (CONNECT on the raw /metrics
mount), bodies and request heads that never complete, and a large body being parsed while
/healthz must still answer. Then generated input: a Hypothesis test that posts arbitrary bodies to
every route of both roles' OpenAPI documents, and schemathesis against both documents, asserting
no 5xx (beyond the two that are the original's contract) and no hang.

One stack serves the whole module, as the roles run for real: the embedded API server (HTTPS, in
its own thread), and in a second thread one event loop with a controller (against that API server)
and a local-backend hypervisor with simulated devices. Tests talk to them over loopback HTTP. The
fuzzing strips `command` from the worker schema, so a generated worker never runs a program.
"""

from __future__ import annotations

import socket
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.from_thread
import h11
import httpx
import hypothesis
import pytest
import schemathesis
import yaml
from hypothesis import strategies as st
from litestar import Request, post
from litestar.testing import TestClient
from schemathesis.core.result import Err

from tests.apiserver_fixture import ApiServerHandle, apply_crds_sync
from tests.helpers import no_error_logged_fixture, peak_rss_mb, read_until_closed
from tests.helpers.controller import settings_for as controller_settings
from tests.helpers.refusals import assert_refused, without_worker_commands
from tfusion.controller.role import ControllerRole, build_runtime, configure, serve_runtime
from tfusion.hypervisor import role as hypervisor_role
from tfusion.settings import Settings
from tfusion.web import DEFAULT_MAX_BODY_BYTES, bind_socket, make_app, read_body, serve

SPEC = "sim:1xA100-SXM4-80GB"
MiB = 1024 * 1024
#: a generous bound per request: it detects a hang, it does not measure speed
HANG_S = 5.0
#: 5xx answers that are contracts rather than failures: the hypervisor's not-implemented
#: snapshot/resume (the seed's 501)
#: the 5xx answers the API documents: routes of the original not built yet, and the node scaler
#: without --enable-auto-expander
CONTRACT_5XX = {(501, "not implemented yet"), (503, "node scaler not enabled")}


# --- the stack -----------------------------------------------------------------------------------

@dataclass
class Stack:
    controller: str  # base URLs
    probes: str
    hypervisor: str

    def ports(self) -> dict[str, int]:
        return {name: int(url.rsplit(":", 1)[1]) for name, url in
                (("controller", self.controller), ("probes", self.probes), ("hypervisor", self.hypervisor))}


async def _serve_roles(controller: Settings, hypervisor: Settings, *, task_status: Any) -> None:
    async with anyio.create_task_group() as tg:
        runtime = await build_runtime(controller)
        configure(runtime)
        served: ControllerRole = await tg.start(serve_runtime, runtime)
        port = await tg.start(hypervisor_role.run, hypervisor)
        assert served.address is not None and served.probe_address is not None
        task_status.started((served.address[1], served.probe_address[1], port))
        await anyio.sleep_forever()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("hostile")
    apiserver = ApiServerHandle(root / "state.db", root / "kubeconfig").start()
    try:
        apply_crds_sync(apiserver)
        controller = controller_settings(apiserver, root)
        state = root / "hypervisor"
        hypervisor = Settings.load({"backend": "local", "devices": SPEC, "hypervisor_port": 0, "state_dir": str(state),
                                    "metrics_output_path": str(root / "metrics.log"), "node_name": "hostile-node"},
                                   env={}, roles=("hypervisor",))
        with anyio.from_thread.start_blocking_portal() as portal:
            future, (api, probes, port) = portal.start_task(_serve_roles, controller, hypervisor)
            try:
                yield Stack(f"http://127.0.0.1:{api}", f"http://127.0.0.1:{probes}", f"http://127.0.0.1:{port}")
            finally:
                future.cancel()
    finally:
        apiserver.stop()


no_error_logged = no_error_logged_fixture(autouse=False)


# --- hostile bodies ------------------------------------------------------------------------------

def alias_bomb(levels: int = 9, width: int = 9) -> bytes:
    """~440 bytes that expand to width**levels scalars."""
    lines = [b'a0: &a0 ["lol"]']
    for level in range(1, levels):
        refs = b",".join(b"*a%d" % (level - 1) for _ in range(width))
        lines.append(b"a%d: &a%d [%s]" % (level, level, refs))
    return b"\n".join(lines) + b"\n"


def deep_block_yaml(depth: int) -> bytes:
    return b"".join(b"  " * i + b"k:\n" for i in range(depth)) + b"  " * depth + b"v\n"


POD_YAML = b"apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  schedulerName: tensor-fusion-scheduler\n"

SIMULATE_CASES: dict[str, tuple[bytes, int, str]] = {
    "deep JSON beyond orjson's limit": (b"[" * 5000 + b"]" * 5000, 400, "levels deep"),
    "deep JSON within orjson's limit": (b"[" * 300 + b"]" * 300, 400, "levels deep"),
    "deep flow YAML": (b"a: " + b"[" * 5000 + b"]" * 5000, 400, "nesting depth"),
    "deep block YAML": (deep_block_yaml(150), 400, "levels deep"),
    "YAML alias bomb": (alias_bomb(), 400, "expands"),
    "self-referencing alias": (b"spec: &s\n  containers: *s\n", 400, "refers to the node that contains it"),
    "!!binary": (POD_YAML + b"  overhead: !!binary aGVsbG8=\n", 400, "binary"),
    "!!set": (POD_YAML + b"  nodeSelector: !!set {a, b}\n", 400, "set"),
    "!!python/object": (b"spec: !!python/object:os.system {}\n", 400, "python/object"),
    "a local tag": (b"spec: !pod {}\n", 400, "!pod"),
    "5,000-digit integer in YAML": (POD_YAML + b"  priority: " + b"7" * 5000 + b"\n", 400, "64 bits"),
    "5,000-digit integer in JSON": (b'{"spec": {"priority": ' + b"7" * 5000 + b"}}", 400, "too large"),
    "integer beyond 64 bits in YAML": (POD_YAML + b"  priority: 18446744073709551616\n", 400, "64 bits"),
    "NaN in YAML": (POD_YAML + b"  priority: .nan\n", 400, "finite"),
    "not UTF-8": (b"\xff\xfe\x00\x01", 400, "UTF-8"),
    "over 3 MiB": (b"#" * (3 * MiB + 1), 413, "at most 3145728 bytes"),
}


@pytest.mark.parametrize("case", SIMULATE_CASES, ids=list(SIMULATE_CASES))
def test_simulate_schedule_refuses_hostile_bodies(stack: Stack, no_error_logged: None, case: str) -> None:
    body, status, fragment = SIMULATE_CASES[case]
    with httpx.Client(base_url=stack.controller, timeout=HANG_S) as http:
        assert_refused(http.post("/api/simulate-schedule", content=body), status, fragment)
        # the same without Content-Length (chunked): the limit holds on the bytes that arrive
        chunked = http.post("/api/simulate-schedule", content=iter([body[: len(body) // 2], body[len(body) // 2:]]))
        assert_refused(chunked, status, fragment)


WORKER_CASES: dict[str, tuple[bytes, int, str]] = {
    "deep JSON beyond orjson's limit": (b'{"name": ' + b"[" * 100000 + b"]" * 100000 + b"}", 400, "levels deep"),
    "deep JSON within orjson's limit": (b'{"name": "w", "labels": ' + b"[" * 200 + b"]" * 200 + b"}", 400,
                                        "levels deep"),
    "5,000-digit integer": (b'{"name": "w", "gpuCount": ' + b"9" * 5000 + b"}", 400, "too large"),
    "YAML is not JSON": (b"name: w\n", 400, "not valid JSON"),
    "over 1 MiB": (b'{"name": "' + b"w" * MiB + b'"}', 413, "at most 1048576 bytes"),
}


@pytest.mark.parametrize("case", WORKER_CASES, ids=list(WORKER_CASES))
def test_hypervisor_worker_creation_refuses_hostile_bodies(stack: Stack, no_error_logged: None, case: str) -> None:
    body, status, fragment = WORKER_CASES[case]
    with httpx.Client(base_url=stack.hypervisor, timeout=HANG_S) as http:
        assert_refused(http.post("/api/v1/workers", content=body, headers={"content-type": "application/json"}),
                       status, fragment)


# --- odd methods ---------------------------------------------------------------------------------

def raw_request(port: int, method: str, target: str, body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
    """One request over a plain socket, parsed with h11 (httpx will not send CONNECT to a path)."""
    conn = h11.Connection(h11.CLIENT)
    headers = [("host", "127.0.0.1"), ("connection", "close"), ("content-length", str(len(body)))]
    with socket.create_connection(("127.0.0.1", port), timeout=HANG_S) as sock:
        head = conn.send(h11.Request(method=method, target=target, headers=headers))
        sock.sendall(head + conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage()))
        response: h11.Response | None = None
        chunks: list[bytes] = []
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(sock.recv(65536))
            elif isinstance(event, h11.Response):
                response = event
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                break
    assert response is not None
    return response.status_code, {k.decode(): v.decode() for k, v in response.headers}, b"".join(chunks)


ODD_METHODS = ["CONNECT", "TRACE", "PROPFIND", "BREW"]


@pytest.mark.parametrize("method", ODD_METHODS)
@pytest.mark.parametrize(("server", "path"), [
    ("controller", "/metrics"), ("controller", "/healthz"), ("controller", "/api/allocation"),
    ("controller", "/api/simulate-schedule"), ("probes", "/readyz"),
    ("hypervisor", "/metrics"), ("hypervisor", "/metrics/"), ("hypervisor", "/api/v1/workers"),
])
def test_unknown_methods_get_a_clean_405(stack: Stack, no_error_logged: None, method: str, server: str,
                                         path: str) -> None:
    status, headers, body = raw_request(stack.ports()[server], method, path)
    assert status == 405, body
    assert headers["content-type"].startswith("application/json") and b'"error"' in body, (headers, body)
    allowed = {m.strip() for m in headers["allow"].split(",")}
    assert allowed and method not in allowed, allowed


def test_metrics_still_serves_get_and_head(stack: Stack) -> None:
    for server in ("controller", "hypervisor"):
        port = stack.ports()[server]
        status, _, body = raw_request(port, "GET", "/metrics")
        assert status == 200 and b"# HELP" in body
        assert raw_request(port, "HEAD", "/metrics")[0] == 200


# --- a big body does not stall the process -------------------------------------------------------

def big_pod_yaml(size: int) -> bytes:
    """A Pod manifest of about `size` bytes of YAML: many small annotations (the slow case to parse)."""
    count = size // 62  # each annotation is a 61-byte line
    annotations = {f"example.com/note-{i:07d}": "v" * 30 for i in range(count)}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "big", "namespace": "default",
                                                            "annotations": annotations},
           "spec": {"schedulerName": "tensor-fusion-scheduler", "containers": [{"name": "main", "image": "x"}]}}
    return yaml.safe_dump(pod, width=1000).encode()


def test_healthz_answers_while_a_large_body_is_parsed(stack: Stack, no_error_logged: None) -> None:
    body = big_pod_yaml(3 * MiB - 4096)
    assert 2.9 * MiB < len(body) <= 3 * MiB
    times: dict[str, float] = {}
    answer: list[bytes] = []

    def simulate() -> None:
        """Upload the whole body, note when it is sent, then wait for the answer."""
        with socket.create_connection(("127.0.0.1", stack.ports()["controller"])) as sock:
            sock.sendall(b"POST /api/simulate-schedule HTTP/1.1\r\nhost: x\r\nconnection: close\r\n"
                         b"content-length: %d\r\n\r\n" % len(body) + body)
            times["uploaded"] = time.monotonic()
            answer.append(read_until_closed(sock, 60))
            times["answered"] = time.monotonic()

    worker = threading.Thread(target=simulate)
    health: list[tuple[float, int]] = []
    with httpx.Client(base_url=stack.controller, timeout=60) as http:
        worker.start()
        while "answered" not in times:
            status = http.get("/healthz").status_code
            health.append((time.monotonic(), status))
    worker.join()
    assert answer[0].startswith(b"HTTP/1.1 200") or answer[0].startswith(b"HTTP/1.1 4"), answer[0][:200]
    # /healthz answered many times between the end of the upload and the answer, i.e. while the
    # body was parsed; a parse on the event loop would let at most the one in flight through
    during_parse = [status for at, status in health if times["uploaded"] < at < times["answered"]]
    assert during_parse.count(200) >= 3, (len(health), during_parse)


# --- bodies and request heads that never complete ------------------------------------------------

@post("/slow", status_code=200)
async def slow_route(request: Request[Any, Any, Any]) -> dict[str, int]:
    return {"bytes": len(await read_body(request, timeout=0.5))}


@pytest.fixture
def slow_server() -> Iterator[int]:
    """An app on the shared edge (make_app + serve), with short deadlines."""
    sock = bind_socket("127.0.0.1:0")
    port = int(sock.getsockname()[1])
    with anyio.from_thread.start_blocking_portal() as portal:
        future, _ = portal.start_task(lambda task_status: serve(make_app([slow_route], title="slow"), sock,
                                                                 head_timeout=0.5, keep_alive=1,
                                                                 task_status=task_status))
        try:
            yield port
        finally:
            future.cancel()
    sock.close()


def test_a_body_that_never_completes_gets_408(slow_server: int) -> None:
    with socket.create_connection(("127.0.0.1", slow_server)) as sock:
        sock.sendall(b"POST /slow HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\nonly part of it")
        answer = read_until_closed(sock, HANG_S)
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert b"did not arrive in full within 0.5s" in answer


def test_a_request_head_that_never_completes_is_closed(slow_server: int) -> None:
    with socket.create_connection(("127.0.0.1", slow_server)) as sock:
        sock.sendall(b"POST /slow HTTP/1.1\r\nhost: x\r\n")  # and nothing more
        assert read_until_closed(sock, HANG_S) == b""
    with socket.create_connection(("127.0.0.1", slow_server)) as sock:  # nothing at all
        assert read_until_closed(sock, HANG_S) == b""


def test_an_idle_keep_alive_connection_is_closed(slow_server: int) -> None:
    with socket.create_connection(("127.0.0.1", slow_server)) as sock:
        sock.sendall(b"POST /slow HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\nok")
        answer = read_until_closed(sock, HANG_S)
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b'{"bytes":2}'), answer


@post("/parsed", status_code=200, sync_to_thread=False)
def parsed_route(data: dict[str, str]) -> dict[str, int]:
    return {"keys": len(data)}


def test_a_route_that_lets_litestar_parse_its_body_has_the_default_limit() -> None:
    with TestClient(make_app([parsed_route], title="parsed")) as client:
        assert client.post("/parsed", json={"a": "b"}).json() == {"keys": 1}
        refused = client.post("/parsed", json={"a": "b" * DEFAULT_MAX_BODY_BYTES})
        assert refused.status_code == 413, refused.text
        assert f"POST /parsed takes at most {DEFAULT_MAX_BODY_BYTES} bytes" in refused.json()["error"]


# --- generated input: every route of both OpenAPI documents --------------------------------------

def openapi(base_url: str) -> dict[str, Any]:
    with httpx.Client(base_url=base_url, timeout=HANG_S) as http:
        document: dict[str, Any] = http.get("/schema/openapi.json").json()
    return document


def operations(document: dict[str, Any]) -> list[tuple[str, str]]:
    return sorted((method.upper(), path) for path, item in document["paths"].items() for method in item
                  if method in ("get", "post", "put", "patch", "delete"))


def concrete_path(path: str, value: str) -> str:
    """`path` with each `{param}` replaced by `value` (URL-quoted)."""
    quoted = urllib.parse.quote(value, safe="")
    parts = [quoted if part.startswith("{") and part.endswith("}") else part for part in path.split("/")]
    return "/".join(parts)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(
        st.text(max_size=12).filter(lambda key: key not in ("command", "env", "workingDir")), children, max_size=5),
    max_leaves=30)
bodies = st.one_of(json_values.map(lambda v: httpx.Request("POST", "http://x", json=v).content),
                   st.binary(max_size=200), st.text(max_size=200).map(str.encode))


def assert_no_server_error(response: httpx.Response | Any, elapsed: float, what: str) -> None:
    status = response.status_code
    assert elapsed < HANG_S, f"{what} took {elapsed:.1f} s"
    if status >= 500:
        error = response.json().get("error", "")
        assert any(status == code and text in error for code, text in CONTRACT_5XX), (what, status, response.text)


@pytest.mark.parametrize("server", ["controller", "hypervisor"])
def test_generated_bodies_never_get_a_5xx(stack: Stack, no_error_logged: None, server: str) -> None:
    base_url = getattr(stack, server)
    routes = operations(openapi(base_url))
    assert len(routes) >= 3
    with httpx.Client(base_url=base_url, timeout=HANG_S * 2) as http:

        @hypothesis.settings(max_examples=20, derandomize=True, deadline=None, database=None,
                             suppress_health_check=list(hypothesis.HealthCheck))
        @hypothesis.given(route=st.sampled_from(routes), body=bodies, param=st.text(min_size=1, max_size=30),
                          content_type=st.sampled_from(["application/json", "application/yaml", "text/plain", ""]))
        def post_anything(route: tuple[str, str], body: bytes, param: str, content_type: str) -> None:
            method, path = route
            started = time.monotonic()
            response = http.request(method, concrete_path(path, param), content=body,
                                    headers={"content-type": content_type} if content_type else {})
            assert_no_server_error(response, time.monotonic() - started, f"{method} {path} {body[:80]!r}")

        post_anything()


@pytest.mark.parametrize("server", ["controller", "hypervisor"])
def test_schemathesis_finds_no_server_error(stack: Stack, no_error_logged: None, server: str) -> None:
    base_url = getattr(stack, server)
    document = openapi(base_url)
    schema = schemathesis.openapi.from_dict(without_worker_commands(document) if server == "hypervisor" else document)
    checked = 0
    calls: list[int] = []
    for result in schema.get_all_operations():
        assert not isinstance(result, Err), f"schemathesis cannot read an operation: {result.err()}"
        operation = result.ok()
        strategy = operation.as_strategy()

        @hypothesis.settings(max_examples=20, derandomize=True, deadline=None, database=None,
                             suppress_health_check=list(hypothesis.HealthCheck))
        @hypothesis.given(case=strategy)
        def call(case: Any) -> None:
            started = time.monotonic()
            response = case.call(base_url=base_url, timeout=HANG_S * 2)
            calls.append(response.status_code)
            assert_no_server_error(response, time.monotonic() - started, f"{case.method} {case.formatted_path}")

        call()
        checked += 1
    assert checked == len(operations(document))
    assert len(calls) >= 5 * checked, f"only {len(calls)} requests for {checked} operations"


@pytest.fixture(scope="module", autouse=True)
def rss_at_start(stack: Stack) -> float:
    """The process's peak RSS before this module's hostile inputs, once its servers (in-process)
    have started: their start-up is not an input's cost."""
    return peak_rss_mb()


def test_the_hostile_inputs_left_no_rss_jump(rss_at_start: float) -> None:
    """Runs last in this module: no input above may have cost 100 MB (a bomb expanded, a body
    kept): the issue's bound on memory."""
    grown = peak_rss_mb() - rss_at_start
    assert grown < 100, f"peak RSS grew by {grown:.0f} MB over this module's hostile inputs"
