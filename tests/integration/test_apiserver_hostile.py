"""Hostile input to the embedded API server: every request here is the caller's mistake (or an
attack) and must get a 4xx Status naming what was wrong — never a 5xx, a hang, or a huge object.

Covers issue 11 for the API server: body and object size limits, bounded JSON/YAML decoding
(depth, alias bombs, tags, long integers), wrong types at fields that used to crash a handler,
label and annotation rules, JSON patches that grow an object, watch timeouts, unknown methods,
authentication of every route but the health checks, slow bodies and silent connections, and
the permissions of the files that hold the secrets.
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest

from tests.apiserver_fixture import ApiServerHandle
from tests.helpers import file_mode, no_error_logged_fixture, peak_rss_mb
from tfusion.apiserver import limits

pytestmark = pytest.mark.anyio

PODS = "/api/v1/namespaces/default/pods"
CMS = "/api/v1/namespaces/default/configmaps"
TOKEN = "/api/v1/namespaces/default/serviceaccounts/default/token"
YAML = "application/yaml"
JSON_PATCH = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"

BILLION_LAUGHS = b"""a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


def pod(name: str = "p", **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }
    body.update(fields)
    return body


def configmap(name: str, **meta: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, **meta}, "data": {"k": "v"}}


def yaml_cm(extra: str) -> bytes:
    return f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: y\ndata:\n{extra}\n".encode()


no_error_logged = no_error_logged_fixture(autouse=True)

@pytest.fixture
async def http(apiserver: ApiServerHandle) -> AsyncIterator[httpx.AsyncClient]:
    async with apiserver.http(timeout=30) as client:
        yield client


def assert_status(response: httpx.Response, codes: tuple[int, ...], *words: str) -> dict[str, Any]:
    """A kube Status with one of `codes`, whose message mentions every word."""
    assert response.status_code in codes, f"{response.status_code}: {response.text[:500]}"
    body: dict[str, Any] = response.json()
    assert body["kind"] == "Status" and body["code"] == response.status_code, body
    text = orjson.dumps(body).decode()
    for word in words:
        assert word in text, f"{word!r} not in {text[:500]}"
    return body


# ------------------------------------------------------------------------------------------- decoding
CREATE_CASES: list[tuple[str, str, bytes, str, tuple[int, ...], tuple[str, ...]]] = [
    ("spec is a string", PODS, orjson.dumps(pod(spec="x")), "application/json", (400, 422), ("spec",)),
    ("containers is a number", PODS, orjson.dumps(pod(spec={"containers": 5})), "application/json", (400, 422),
     ("spec.containers",)),
    ("container is a string", PODS, orjson.dumps(pod(spec={"containers": ["x"]})), "application/json", (400, 422),
     ("spec.containers[0]",)),
    ("metadata is a list", PODS, orjson.dumps({"metadata": [], "spec": {}}), "application/json", (400, 422),
     ("metadata",)),
    ("JSON nested 150 deep", CMS, b'{"metadata":{"name":"deep"},"x":' + b"[" * 150 + b"]" * 150 + b"}",
     "application/json", (400,), ("nested",)),
    ("JSON nested 5000 deep", CMS, b"[" * 5000 + b"]" * 5000, "application/json", (400,), ("nested",)),
    ("JSON 5000-digit integer", CMS, b'{"metadata":{"name":"n"},"x":' + b"9" * 5000 + b"}", "application/json",
     (400,), ("number",)),
    ("YAML billion laughs", CMS, BILLION_LAUGHS, YAML, (400,), ("expands",)),
    ("YAML self-referencing alias", CMS, b"metadata: &m {name: loop, x: *m}\n", YAML, (400,), ("alias",)),
    ("YAML !!binary", CMS, yaml_cm("  k: !!binary aGVsbG8="), YAML, (400,), ("binary",)),
    ("YAML !!set", CMS, yaml_cm("  k: !!set {a, b}"), YAML, (400,), ("set",)),
    ("YAML python tag", CMS, yaml_cm("  k: !!python/object/apply:os.system [echo]"), YAML, (400,), ("python",)),
    ("YAML 5000-digit integer", CMS, yaml_cm("  k: " + "9" * 5000), YAML, (400,), ("64 bits",)),
    ("YAML nested 150 deep", CMS, yaml_cm("  k: " + "[" * 150 + "]" * 150), YAML, (400,), ("nested",)),
    ("YAML two documents", CMS, yaml_cm("  k: v") + b"---\na: 1\n", YAML, (400,), ("YAML",)),
    ("YAML .nan", CMS, b"metadata: {name: n}\nx: .nan\n", YAML, (400,), ("nan",)),
    ("YAML larger than a stored object", CMS, yaml_cm("  k: " + "x" * (limits.MAX_OBJECT_BYTES + 10)), YAML,
     (413,), ("RequestEntityTooLarge", str(limits.MAX_OBJECT_BYTES))),
    ("label key with two slashes", CMS, orjson.dumps(configmap("l1", labels={"a/b/c": "x"})), "application/json",
     (422,), ("metadata.labels", "a/b/c")),
    ("64-character label value", CMS, orjson.dumps(configmap("l2", labels={"k": "v" * 64})), "application/json",
     (422,), ("metadata.labels",)),
    ("label value with a space", CMS, orjson.dumps(configmap("l3", labels={"k": "a b"})), "application/json",
     (422,), ("metadata.labels",)),
    ("64-character label name", CMS, orjson.dumps(configmap("l4", labels={"x" * 64: "v"})), "application/json",
     (422,), ("metadata.labels",)),
    ("upper-case label prefix", CMS, orjson.dumps(configmap("l5", labels={"Example.com/k": "v"})),
     "application/json", (422,), ("metadata.labels", "prefix")),
    ("annotation key with two slashes", CMS, orjson.dumps(configmap("a1", annotations={"a/b/c": "x"})),
     "application/json", (422,), ("metadata.annotations",)),
    ("300 KB of annotations", CMS, orjson.dumps(configmap("a2", annotations={"big": "x" * 300_000})),
     "application/json", (422,), ("metadata.annotations", "262144")),
    ("Binding target is a number", f"{PODS}/victim/binding", b'{"target":5}', "application/json", (400, 422),
     ("target",)),
    ("Binding target name is a list", f"{PODS}/victim/binding", b'{"target":{"name":[1]}}', "application/json",
     (400, 422), ("target.name",)),
    ("TokenRequest spec is a number", TOKEN, b'{"spec":5}', "application/json", (400, 422), ("spec",)),
    ("TokenRequest lifetime beyond 2^32 s", TOKEN, b'{"spec":{"expirationSeconds":99999999999999999}}',
     "application/json", (422,), ("spec.expirationSeconds",)),
    ("TokenRequest boundObjectRef is a string", TOKEN, b'{"spec":{"boundObjectRef":"x"}}', "application/json",
     (400, 422), ("spec.boundObjectRef",)),
    ("TokenRequest audiences is a string", TOKEN, b'{"spec":{"audiences":"x"}}', "application/json",
     (400, 422), ("spec.audiences",)),
    ("TokenReview spec is a list", "/apis/authentication.k8s.io/v1/tokenreviews", b'{"spec":[]}',
     "application/json", (400, 422), ("spec",)),
]


@pytest.mark.parametrize(
    ("path", "body", "content_type", "codes", "words"),
    [case[1:] for case in CREATE_CASES],
    ids=[case[0] for case in CREATE_CASES],
)
async def test_bad_create_bodies_are_4xx(
    http: httpx.AsyncClient, path: str, body: bytes, content_type: str, codes: tuple[int, ...], words: tuple[str, ...]
) -> None:
    if "victim" in path:
        assert (await http.post(PODS, json=pod("victim"))).status_code == 201
    started = time.monotonic()
    response = await http.post(path, content=body, headers={"content-type": content_type})
    assert_status(response, codes, *words)
    assert time.monotonic() - started < 10  # no multi-second expansion: an alias bomb is refused up front


async def test_valid_labels_and_yaml_still_work(http: httpx.AsyncClient) -> None:
    """The rules refuse only what kube refuses."""
    labels = {"example.com/Name_1.x": "", "k": "A-b_c.9", "x" * 63: "v" * 63}
    created = await http.post(CMS, json=configmap("fine", labels=labels, annotations={"Example.com/Ann": "x" * 1000}))
    assert created.status_code == 201, created.text
    document = b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: yaml-ok}\ndata: &d {a: '1'}\nbinaryData: {}\n"
    document += b"x: {<<: *d, b: '2'}\ny: 2024-01-01\n"
    created = await http.post(CMS, content=document, headers={"content-type": YAML})
    assert created.status_code == 201, created.text
    assert created.json()["data"] == {"a": "1"}


async def test_body_over_3_mib_is_413(http: httpx.AsyncClient) -> None:
    body = orjson.dumps({"metadata": {"name": "big"}, "data": {"k": "x" * (limits.MAX_BODY_BYTES + 10)}})
    assert_status(await http.post(CMS, content=body), (413,), "RequestEntityTooLarge", str(limits.MAX_BODY_BYTES))

    async def chunks() -> AsyncIterator[bytes]:  # no content-length: the limit applies while reading
        for _ in range(4):
            yield b"x" * (1024 * 1024)

    assert_status(await http.post(CMS, content=chunks()), (413,), "RequestEntityTooLarge")


async def test_object_over_1_5_mib_is_413(http: httpx.AsyncClient) -> None:
    body = {"metadata": {"name": "huge"}, "data": {"k": "x" * (limits.MAX_OBJECT_BYTES + 10)}}
    assert_status(await http.post(CMS, json=body), (413,), "RequestEntityTooLarge", "too large")
    assert (await http.get(f"{CMS}/huge")).status_code == 404


async def test_patches_with_wrong_types_or_growth_are_refused(http: httpx.AsyncClient) -> None:
    assert (await http.post(PODS, json=pod("patched"))).status_code == 201
    wrong = await http.patch(
        f"{PODS}/patched", content=b'{"spec":{"containers":"x"}}', headers={"content-type": STRATEGIC}
    )
    assert_status(wrong, (400, 422), "spec.containers")
    ops = [{"op": "add", "path": "/data", "value": {"a": "x" * 1700}}]
    ops += [{"op": "copy", "from": "/data", "path": f"/data/c{i}"} for i in range(14)]
    assert (await http.post(CMS, json={"metadata": {"name": "grows"}})).status_code == 201
    grown = await http.patch(f"{CMS}/grows", content=orjson.dumps(ops), headers={"content-type": JSON_PATCH})
    assert_status(grown, (413, 422), "too large")
    nested = [{"op": "add", "path": "/data", "value": {"x": {}}}]
    nested += [{"op": "copy", "from": "/data", "path": "/data" + "/x" * (i + 1)} for i in range(12)]
    deep = await http.patch(f"{CMS}/grows", content=orjson.dumps(nested), headers={"content-type": JSON_PATCH})
    assert deep.status_code in (400, 413, 422), deep.text
    deep_patch = await http.patch(f"{CMS}/grows", content=b"[" * 150 + b"]" * 150,
                                  headers={"content-type": JSON_PATCH})
    assert_status(deep_patch, (400,), "error decoding", "nested more than 100 levels deep")
    merge_bad = await http.patch(f"{CMS}/grows", content=b'{"metadata":{"labels":{"a/b/c":"x"}}}',
                                 headers={"content-type": MERGE})
    assert_status(merge_bad, (422,), "metadata.labels")
    current = (await http.get(f"{CMS}/grows")).json()
    assert "data" not in current and "labels" not in current["metadata"]


async def test_delete_options_of_the_wrong_type_are_400(http: httpx.AsyncClient) -> None:
    assert (await http.post(CMS, json={"metadata": {"name": "doomed"}})).status_code == 201
    for body in (b'{"preconditions":"x"}', b'{"preconditions":{"uid":5}}', b'{"gracePeriodSeconds":"soon"}',
                 b'{"propagationPolicy":7}', b"[]"):
        response = await http.request("DELETE", f"{CMS}/doomed", content=body)
        assert_status(response, (400, 422))
    assert (await http.get(f"{CMS}/doomed")).status_code == 200


@pytest.mark.parametrize("timeout", ["nan", "1e309", "-1", "inf", "soon"])
async def test_watch_with_an_unusable_timeout_is_400(http: httpx.AsyncClient, timeout: str) -> None:
    with anyio.fail_after(10):
        response = await http.get(CMS, params={"watch": "true", "timeoutSeconds": timeout})
    assert_status(response, (400,), "timeoutSeconds")


@pytest.mark.parametrize("version", ["abc", "-1", "1.5", "99999999999999999999999"])
async def test_watch_from_an_unusable_resource_version_is_400(http: httpx.AsyncClient, version: str) -> None:
    with anyio.fail_after(10):
        response = await http.get(CMS, params={"watch": "true", "resourceVersion": version})
    assert_status(response, (400,), "resourceVersion")


@pytest.mark.parametrize("path", ["/metrics", "/api/v1/pods", PODS, "/healthz"])
async def test_unknown_methods_are_405(apiserver: ApiServerHandle, path: str) -> None:
    # raw bytes: HTTP clients treat CONNECT as a proxy request
    response = await anyio.to_thread.run_sync(lambda: raw_request(apiserver, f"CONNECT {path} HTTP/1.1", True))
    assert response.split(b"\r\n", 1)[0].split(b" ")[1] == b"405", response[:200]
    async with apiserver.http() as client:
        assert_status(await client.request("TRACE", path), (405,), "TRACE")


# ------------------------------------------------------------------------------------------- auth
@pytest.mark.parametrize("path", ["/api", "/apis", "/api/v1/namespaces", "/openapi/v2", "/openapi/v3", CMS])
async def test_anonymous_requests_are_401(apiserver: ApiServerHandle, path: str) -> None:
    async with apiserver.http(authenticated=False) as anonymous:
        assert_status(await anonymous.get(path), (401,), "Unauthorized")
        assert_status(await anonymous.get(path, headers={"authorization": "Bearer forged"}), (401,))
        assert_status(await anonymous.get(path, headers={"authorization": f"Basic {apiserver.token}"}), (401,))


@pytest.mark.parametrize("path", ["/version", "/healthz", "/livez", "/readyz"])
async def test_health_and_version_stay_open(apiserver: ApiServerHandle, path: str) -> None:
    async with apiserver.http(authenticated=False) as anonymous:
        assert (await anonymous.get(path)).status_code == 200


async def test_service_account_tokens_authenticate_on_loopback(apiserver: ApiServerHandle) -> None:
    async with apiserver.http() as admin:
        issued = await admin.post(TOKEN, json={"spec": {}})
        assert issued.status_code == 201, issued.text
        sa_token = issued.json()["status"]["token"]
    async with apiserver.http(authenticated=False) as client:
        # authenticated (not 401), and RBAC gives a bare ServiceAccount discovery only (403 here)
        as_sa = await client.get("/api/v1/namespaces", headers={"authorization": f"Bearer {sa_token}"})
        assert as_sa.status_code == 403 and as_sa.json()["reason"] == "Forbidden"
        assert (await client.get("/apis", headers={"authorization": f"Bearer {sa_token}"})).status_code == 200


def _assert_private(state_dir: Path) -> None:
    assert file_mode(state_dir) == 0o700
    for name in ("state.db", "kubeconfig", "state.db.key", "state.db.crt"):
        assert file_mode(state_dir / name) == 0o600, name
    for path in state_dir.iterdir():  # the -wal file, and -shm where SQLite makes one, too
        assert file_mode(path) == 0o600, path


async def test_secrets_on_disk_are_private(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    handle = ApiServerHandle(state_dir / "state.db", state_dir / "kubeconfig").start()
    try:
        async with handle.http() as client:  # a write, so the WAL holds data
            assert (await client.post(CMS, json={"metadata": {"name": "w"}})).status_code == 201
        _assert_private(state_dir)
    finally:
        handle.stop()
    # an older run left them readable by everyone: tightened at start
    for path in [state_dir, *state_dir.iterdir()]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    handle = ApiServerHandle(state_dir / "state.db", state_dir / "kubeconfig").start()
    try:
        _assert_private(state_dir)
    finally:
        handle.stop()


# ------------------------------------------------------------------------------------------- time
def _tls_socket(handle: ApiServerHandle) -> ssl.SSLSocket:
    host, port = handle.url.removeprefix("https://").rsplit(":", 1)
    raw = socket.create_connection((host, int(port)), timeout=20)
    return handle.ssl_context.wrap_socket(raw, server_hostname=host)


def raw_request(handle: ApiServerHandle, request_line: str, authenticated: bool, body: bytes = b"") -> bytes:
    """Send one request as raw bytes and read until the server closes or answers."""
    auth = f"Authorization: Bearer {handle.token}\r\n" if authenticated else ""
    with _tls_socket(handle) as sock:
        sock.sendall(f"{request_line}\r\nHost: x\r\n{auth}Connection: close\r\n\r\n".encode() + body)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


@pytest.fixture
def impatient(tmp_path: Path) -> Any:
    handle = ApiServerHandle(
        tmp_path / "state.db", tmp_path / "kubeconfig", head_timeout=0.5, body_timeout=0.5, keep_alive=1
    ).start()
    yield handle
    handle.stop()


def test_a_body_that_never_completes_gets_408(impatient: ApiServerHandle) -> None:
    with _tls_socket(impatient) as sock:
        head = (
            f"POST {CMS} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {impatient.token}\r\n"
            "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
        )
        sock.sendall(head.encode() + b'{"metadata":')
        answer = b""
        while b'"code":408' not in answer and (chunk := sock.recv(65536)):
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b'"reason":"Timeout"' in answer


@pytest.mark.parametrize(
    "sent",
    [b"", b"GET /version HTTP/1.1\r\nHost: x\r\n", b"GET /version HTTP/1.1\r\nHost: x\r\n\r\n"],
    ids=["silent", "half a head", "idle after a response"],
)
def test_a_connection_without_a_request_head_is_closed(impatient: ApiServerHandle, sent: bytes) -> None:
    with _tls_socket(impatient) as sock:
        sock.sendall(sent)
        sock.settimeout(15)
        try:
            if sent.endswith(b"\r\n\r\n"):
                answer = b""
                while b"gitVersion" not in answer:
                    answer += sock.recv(65536)
            assert sock.recv(65536) == b""  # the server closed it
        except ssl.SSLError:
            pass  # closed without a TLS close_notify: closed all the same
        except TimeoutError:
            pytest.fail("the server kept a connection without a request head open")


async def test_healthz_answers_while_a_large_body_is_parsed(apiserver: ApiServerHandle) -> None:
    """A large body is decoded in a worker thread: the event loop keeps serving meanwhile."""
    items = [{"name": f"item-{i}", "value": i, "nested": {"a": [1, 2, 3]}} for i in range(40_000)]
    document = orjson.dumps({"metadata": {"name": "bulky"}, "data": {"k": "v"}, "extra": items})
    assert limits.THREAD_THRESHOLD < len(document) <= limits.MAX_BODY_BYTES
    answered: list[int] = []
    async with apiserver.http(timeout=60) as client, anyio.create_task_group() as tg:
        big: list[httpx.Response] = []

        async def post_big() -> None:
            big.append(await client.post(CMS, content=document))

        tg.start_soon(post_big)
        while not big:
            answered.append((await client.get("/healthz")).status_code)
            await anyio.sleep(0.001)
    assert answered and set(answered) == {200}
    assert big[0].status_code in (201, 413), big[0].text[:300]


@pytest.fixture(scope="module", autouse=True)
def rss_at_start() -> float:
    """The process's peak RSS before this module's hostile inputs (the servers run in-process)."""
    return peak_rss_mb()


def test_the_hostile_inputs_left_no_rss_jump(rss_at_start: float) -> None:
    """Runs last in this module: no input above may have cost 100 MB (a bomb expanded, a body
    kept): the issue's bound on memory."""
    grown = peak_rss_mb() - rss_at_start
    assert grown < 100, f"peak RSS grew by {grown:.0f} MB over this module's hostile inputs"
