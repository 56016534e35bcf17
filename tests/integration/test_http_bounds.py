"""The edge's bounds on what a client may send (issue 23): a request head over MAX_HEAD_BYTES is
431 and a request target over MAX_URL_BYTES 414, refused while they arrive (a 64 MiB header is
never read, let alone buffered); a body over its route's limit is 413 before it is read (declared)
or as soon as it passes the limit (chunked); a JSON body nested too deep is 400 on every kind of
route (one that Litestar parses, one that reads its body itself), never a RecursionError; integer
parameters follow Go's strconv.ParseInt. The same parser refusals on the embedded API server are
kube Status objects.

An app built by `make_app` is served by `serve` on a real socket, as the roles serve theirs.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import urllib.parse
from collections.abc import Iterator
from typing import Any

import anyio
import anyio.from_thread
import httpx
import msgspec
import pytest
from litestar import Request, get, post

from tests.apiserver_fixture import ApiServerHandle
from tests.helpers import read_until_closed
from tfusion.web import (
    DEFAULT_MAX_BODY_BYTES,
    MAX_HEAD_BYTES,
    MAX_URL_BYTES,
    bind_socket,
    decode_body,
    decode_json_body,
    make_app,
    serve,
)

MiB = 1024 * 1024
HANG_S = 10.0


class Item(msgspec.Struct):
    name: str
    tags: list[Any] = []


_item_decoder = msgspec.json.Decoder(Item)


@post("/parsed", status_code=200, sync_to_thread=False)
def parsed(data: dict[str, Any]) -> dict[str, int]:
    return {"keys": len(data)}


@post("/typed", status_code=200, request_max_body_size=4 * MiB)
async def typed(request: Request[Any, Any, Any]) -> dict[str, int]:
    item = await decode_json_body(request, _item_decoder.decode)
    return {"tags": len(item.tags)}


@post("/raw", status_code=200, request_max_body_size=4 * MiB)
async def raw(request: Request[Any, Any, Any]) -> dict[str, int]:
    return {"bytes": len(await decode_body(request, bytes))}


@get("/count/{index:int}", sync_to_thread=False)
def count(index: int, limit: int, page: int | None = None) -> dict[str, int | None]:
    return {"index": index, "limit": limit, "page": page}


@get("/hello", sync_to_thread=False)
def hello() -> dict[str, str]:
    return {"hello": "world"}


@pytest.fixture(scope="module")
def server() -> Iterator[int]:
    sock = bind_socket("127.0.0.1:0")
    port = int(sock.getsockname()[1])
    app = make_app([parsed, typed, raw, count, hello], title="bounds")
    with anyio.from_thread.start_blocking_portal() as portal:
        future, _ = portal.start_task(lambda task_status: serve(app, sock, task_status=task_status))
        try:
            yield port
        finally:
            future.cancel()
    sock.close()


def exchange(port: int, request: bytes, *, then: bytes = b"", repeat: int = 0) -> tuple[bytes, int]:
    """Send `request`, then `then` up to `repeat` times while the server reads; (what it answered
    before closing, how many bytes it took from us)."""
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=HANG_S) as sock:
        try:
            sock.sendall(request)
            sent += len(request)
            for _ in range(repeat):
                sock.sendall(then)
                sent += len(then)
        except OSError:  # refused and closed while we were still sending
            pass
        return read_until_closed(sock, HANG_S), sent


def status_and_body(answer: bytes) -> tuple[int, dict[str, Any]]:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 "), answer[:300]
    assert b"content-type: application/json" in head.lower(), head
    return int(head.split()[1]), json.loads(body)


# --- request heads ---------------------------------------------------------------------------------

def test_a_header_over_the_limit_is_431(server: int) -> None:
    header = b"x-big: " + b"a" * (MAX_HEAD_BYTES + 10)
    answer, _ = exchange(server, b"GET /hello HTTP/1.1\r\nhost: x\r\n" + header + b"\r\n\r\n")
    status, body = status_and_body(answer)
    assert status == 431 and f"larger than {MAX_HEAD_BYTES} bytes" in body["error"], body


def test_a_64_mib_header_is_refused_without_being_read(server: int) -> None:
    """The server stops reading at the limit: a client can push only what the socket buffers hold
    past it, never the 64 MiB."""
    _, sent = exchange(server, b"GET /hello HTTP/1.1\r\nhost: x\r\nx-big: ", then=b"a" * MiB, repeat=64)
    assert sent < 32 * MiB, f"the server read {sent} bytes of one header"


def test_many_headers_over_the_limit_are_431(server: int) -> None:
    headers = b"".join(b"x-h%07d: %s\r\n" % (i, b"v" * 100) for i in range(MAX_HEAD_BYTES // 100))
    status, _ = status_and_body(exchange(server, b"GET /hello HTTP/1.1\r\nhost: x\r\n" + headers + b"\r\n")[0])
    assert status == 431


def test_a_large_head_within_the_limit_is_served(server: int) -> None:
    big = b"a" * (MAX_HEAD_BYTES - 4096)
    answer, _ = exchange(server, b"GET /hello HTTP/1.1\r\nhost: x\r\nconnection: close\r\nx-big: " + big + b"\r\n\r\n")
    assert status_and_body(answer) == (200, {"hello": "world"})


def test_a_url_over_the_limit_is_414(server: int) -> None:
    path = b"/hello?q=" + b"a" * MAX_URL_BYTES
    status, body = status_and_body(exchange(server, b"GET " + path + b" HTTP/1.1\r\nhost: x\r\n\r\n")[0])
    assert status == 414 and f"longer than {MAX_URL_BYTES} bytes" in body["error"], body
    # sent a byte at a time in pieces, the same
    with socket.create_connection(("127.0.0.1", server), timeout=HANG_S) as sock:
        sock.sendall(b"GET /hello?q=")
        try:
            for _ in range(MAX_URL_BYTES // 4096 + 2):
                sock.sendall(b"b" * 4096)
        except OSError:
            pass
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 414"), answer[:200]


def test_a_url_at_the_limit_is_served(server: int) -> None:
    path = b"/hello?q=" + b"a" * (MAX_URL_BYTES - len(b"/hello?q="))
    answer, _ = exchange(server, b"GET " + path + b" HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    assert status_and_body(answer) == (200, {"hello": "world"})


def test_keep_alive_requests_each_get_the_whole_head_allowance(server: int) -> None:
    """The count starts again for each request on a kept-alive connection."""
    half = b"a" * (MAX_HEAD_BYTES // 2)
    request = b"GET /hello HTTP/1.1\r\nhost: x\r\nx-big: " + half + b"\r\n\r\n"
    with httpx.Client(base_url=f"http://127.0.0.1:{server}", timeout=HANG_S) as http:
        for _ in range(3):
            assert http.get("/hello", headers={"x-big": half.decode()}).status_code == 200
    answer, _ = exchange(server, request * 3 + b"GET /hello HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    assert answer.count(b"HTTP/1.1 200") == 4, answer[:500]


# --- bodies ----------------------------------------------------------------------------------------

def test_a_declared_body_over_the_limit_is_413_before_it_is_read(server: int) -> None:
    for path, limit in (("/parsed", DEFAULT_MAX_BODY_BYTES), ("/typed", 4 * MiB), ("/raw", 4 * MiB)):
        head = (f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                f"content-length: {64 * MiB}\r\n\r\n")
        answer, _ = exchange(server, head.encode())  # and not a byte of the body: the answer comes anyway
        status, body = status_and_body(answer)
        assert status == 413 and f"takes at most {limit} bytes" in body["error"], (path, body)


def test_a_chunked_body_is_cut_off_at_the_limit(server: int) -> None:
    head = b"POST /typed HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
    piece = b"%x\r\n" % MiB + b" " * MiB + b"\r\n"
    answer, sent = exchange(server, head, then=piece, repeat=64)
    status, body = status_and_body(answer)
    assert status == 413 and "takes at most 4194304 bytes" in body["error"], body
    assert sent < 32 * MiB, sent


DEEP = b'{"name": "x", "tags": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"


@pytest.mark.parametrize("path", ["/parsed", "/typed", "/raw"])
@pytest.mark.parametrize("depth", [101, 5000])
def test_deep_json_is_400_on_every_kind_of_route(server: int, path: str, depth: int) -> None:
    body = b'{"name": "x", "tags": ' + b"[" * depth + b"]" * depth + b"}"
    with httpx.Client(base_url=f"http://127.0.0.1:{server}", timeout=HANG_S) as http:
        answer = http.post(path, content=body, headers={"content-type": "application/json"})
        assert answer.status_code == 400, answer.text[:300]
        assert "nested more than 100 levels deep" in answer.json()["error"]
        within = b'{"name": "x", "tags": ' + b"[" * 98 + b"]" * 98 + b"}"
        assert answer.status_code == 400 and http.post(path, content=within).status_code == 200


def test_a_200000_deep_body_is_400_not_a_recursion_error(server: int) -> None:
    with httpx.Client(base_url=f"http://127.0.0.1:{server}", timeout=HANG_S) as http:
        for path in ("/typed", "/raw"):
            answer = http.post(path, content=DEEP)
            assert answer.status_code == 400 and "levels deep" in answer.json()["error"], answer.text[:300]


def test_a_typed_body_names_the_field_at_fault(server: int) -> None:
    with httpx.Client(base_url=f"http://127.0.0.1:{server}", timeout=HANG_S) as http:
        wrong = http.post("/typed", json={"name": "x", "tags": 5})
        assert wrong.status_code == 400 and wrong.json()["field"] == "tags", wrong.text
        missing = http.post("/typed", json={"tags": []})
        assert missing.status_code == 400 and missing.json()["field"] == "name", missing.text
        broken = http.post("/typed", content=b'{"name": ')
        assert broken.status_code == 400 and "not valid JSON" in broken.json()["error"], broken.text
        large = http.post("/typed", json={"name": "x", "tags": list(range(100_000))})  # over the thread threshold
        assert large.json() == {"tags": 100_000}


# --- integer parameters ----------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "expected"), [("10", 10), ("+5", 5), ("007", 7), ("-3", -3)])
def test_integer_query_parameters_read_as_go_reads_them(server: int, value: str, expected: int) -> None:
    with httpx.Client(base_url=f"http://127.0.0.1:{server}", timeout=HANG_S) as http:
        answer = http.get("/count/1", params={"limit": value, "page": value})
    assert answer.json() == {"index": 1, "limit": expected, "page": expected}, answer.text


@pytest.mark.parametrize("value", ["1_0", "1e3", "5.0", " 5", "\u0663", "9223372036854775808", "0x10", ""])
def test_integer_parameters_beyond_go_are_400_naming_them(server: int, value: str) -> None:
    with httpx.Client(base_url=f"http://127.0.0.1:{server}", timeout=HANG_S) as http:
        answer = http.get("/count/1", params={"limit": "1", "page": value})
        assert answer.status_code == 400, answer.text
        body = answer.json()
        assert body["field"] == "page" and repr(value) in body["error"] and "decimal digits" in body["error"], body
        if value.strip():
            in_path = http.get(f"/count/{value}", params={"limit": "1"})
            assert in_path.status_code in (400, 404), in_path.text
            assert in_path.status_code == 404 or "path parameter 'index'" in in_path.json()["error"]


def test_integer_path_parameters_refuse_underscores(server: int) -> None:
    with httpx.Client(base_url=f"http://127.0.0.1:{server}", timeout=HANG_S) as http:
        assert http.get("/count/+7", params={"limit": "1"}).json()["index"] == 7
        refused = http.get("/count/1_0", params={"limit": "1"})
    assert refused.status_code == 400 and refused.json()["field"] == "index", refused.text


# --- the embedded API server words the parser's refusals as kube does -------------------------------

def tls_exchange(apiserver: ApiServerHandle, request: bytes) -> tuple[int, dict[str, Any]]:
    """One request to the API server over TLS on a plain socket (httpx refuses URLs this long)."""
    host, port = urllib.parse.urlsplit(apiserver.url).hostname or "", urllib.parse.urlsplit(apiserver.url).port
    with socket.create_connection((host, port or 443), timeout=HANG_S) as plain, \
            apiserver.ssl_context.wrap_socket(plain, server_hostname=host) as sock:
        try:
            sock.sendall(request)
        except OSError:
            pass
        received = b""
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 "), received[:300]
    return int(head.split()[1]), json.loads(body)


def test_the_api_server_answers_head_refusals_with_kube_status(apiserver: ApiServerHandle) -> None:
    auth = f"authorization: Bearer {apiserver.token}\r\n".encode()
    status, body = tls_exchange(apiserver, b"GET /api/v1/namespaces/default/configmaps?labelSelector="
                                + b"a" * MAX_URL_BYTES + b" HTTP/1.1\r\nhost: x\r\n" + auth + b"\r\n")
    assert (status, body["kind"], body["code"], body["status"]) == (414, "Status", 414, "Failure"), body
    status, body = tls_exchange(apiserver, b"GET /api/v1/namespaces HTTP/1.1\r\nhost: x\r\n" + auth
                                + b"x-big: " + b"a" * MAX_HEAD_BYTES + b"\r\n\r\n")
    assert (status, body["kind"], body["code"]) == (431, "Status", 431), body
    status, body = tls_exchange(apiserver, b"BREW /api/v1/namespaces HTTP/1.1\r\nhost: x\r\n" + auth + b"\r\n")
    assert (status, body["kind"], body["reason"]) == (405, "Status", "MethodNotAllowed"), body
    with apiserver.sync_http(timeout=HANG_S) as http:  # and it goes on serving
        assert http.get("/api/v1/namespaces/default").status_code == 200


def test_a_stranger_is_answered_before_sending_the_body(apiserver: ApiServerHandle) -> None:
    """A stranger's 64 MiB body gets its 401 after the first MiB: the API server authenticates
    before it waits for, or reads, the rest."""
    host, port = urllib.parse.urlsplit(apiserver.url).hostname or "", urllib.parse.urlsplit(apiserver.url).port
    with socket.create_connection((host, port or 443), timeout=HANG_S) as plain, \
            apiserver.ssl_context.wrap_socket(plain, server_hostname=host) as sock:
        sock.sendall(b"POST /api/v1/namespaces/default/configmaps HTTP/1.1\r\nhost: x\r\n"
                     b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % (64 * MiB) + b" " * MiB)
        answer = b""
        while b"\r\n\r\n" not in answer:  # recv times out (and fails the test) after HANG_S of silence
            chunk = sock.recv(65536)
            assert chunk, f"closed without an answer; received {answer[:300]!r}"
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 401 "), answer[:300]


def test_concurrent_oversized_heads_leave_the_server_answering(server: int) -> None:
    """Three huge headers at once (the issue's probe) and a normal request right after."""
    results: list[int] = []

    def attack() -> None:
        results.append(exchange(server, b"GET /hello HTTP/1.1\r\nhost: x\r\nx-big: ", then=b"a" * MiB, repeat=64)[1])

    threads = [threading.Thread(target=attack) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(sent < 32 * MiB for sent in results), results
    with httpx.Client(base_url=f"http://127.0.0.1:{server}", timeout=HANG_S) as http:
        assert http.get("/hello").json() == {"hello": "world"}
