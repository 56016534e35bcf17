"""The private parts of third-party libraries tfusion overrides or reads, checked against the
installed versions, so that an upgrade that moves one fails here rather than silently in production.

Each library is pinned (kr8s exactly, uvicorn and httptools below their next minor release); these
tests are what a pin bump has to pass. The hooks:

- kr8s: `Api._create_session` (overridden by `tfusion.kube.client._PooledApi` for a wider pool),
  `Api._session`, `Api._timeout`, `Api._construct_url` and the `KubeAuth` fields the lean transport
  reads (`tfusion/leanhttp.py`);
- uvicorn: `HttpToolsProtocol`, which `tfusion.web` subclasses for the request-head bounds (the
  callbacks it extends, the helpers and attributes it reads, and `data_received`, which it
  replaces), `RequestResponseCycle.response_complete`, and `Server.capture_signals` (replaced so
  that tfusion owns the signals);
- httptools: the parser errors `tfusion.web` tells apart.

Where we replace a library method rather than extend it, the test holds a digest of the library's
source: our copy must be compared with theirs whenever it changes."""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import socket
from collections.abc import Callable
from typing import Any

import httptools
import httpx
import kr8s.asyncio
import pytest
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState

from tfusion.kube.client import POOL_LIMITS, KubeClient, _PooledApi
from tfusion.web import Server, _with_head_timeout

pytestmark = pytest.mark.anyio

#: sha256 of the library source our replacement copies. On a mismatch, read the new source, bring
#: our copy in line (tfusion/kube/client.py, tfusion/web/server.py) and record the new digest here.
REPLACED_SOURCES: dict[str, tuple[Callable[..., Any], str]] = {
    "kr8s Api._create_session (tfusion.kube.client._PooledApi)":
        (kr8s.asyncio.Api._create_session, "cfab20a4aab0747d904232d11df378112f5beecb353c42dded3dabda6b99d6dd"),
    "uvicorn HttpToolsProtocol.data_received (tfusion.web HeadDeadlineProtocol)":
        (HttpToolsProtocol.data_received, "010a7ae59a5d3b1a5e7326ce246878568629d126a076d8af5ba10cab040fae43"),
}


@pytest.mark.parametrize("name", sorted(REPLACED_SOURCES))
def test_replaced_library_methods_are_unchanged(name: str) -> None:
    function, digest = REPLACED_SOURCES[name]
    source = inspect.getsource(function)
    assert hashlib.sha256(source.encode()).hexdigest() == digest, f"{name} changed upstream:\n{source}"


# --- kr8s ----------------------------------------------------------------------------------------


def test_kr8s_hooks_have_the_signatures_we_use() -> None:
    api = kr8s.asyncio.Api
    assert inspect.iscoroutinefunction(api._create_session)
    assert list(inspect.signature(api._create_session).parameters) == ["self"]
    assert list(inspect.signature(_PooledApi._create_session).parameters) == ["self"]
    assert list(inspect.signature(api._construct_url).parameters) == ["self", "version", "base", "namespace", "url"]
    # how KubeClient._lean_request calls it: a core and a grouped resource, namespaced or not
    bare = api.__new__(api)
    assert api._construct_url(bare, "v1", "", "ns", "pods/a") == "/api/v1/namespaces/ns/pods/a"
    assert api._construct_url(bare, "tensor-fusion.ai/v1", "", None, "gpus") == "/apis/tensor-fusion.ai/v1/gpus"


async def test_a_connected_client_uses_our_session_and_the_auth_fields_we_read(apiserver: Any) -> None:
    client = await KubeClient.connect(apiserver.kubeconfig, qps=0)
    try:
        assert type(client.api) is _PooledApi
        session = client.api._session
        assert isinstance(session, httpx.AsyncClient)
        # our override ran: kr8s's own session keeps httpx's default of 20 idle connections.
        # (httpx has no public reader of a client's limits; this reads its connection pool)
        pool = session._transport._pool  # type: ignore[attr-defined]
        assert pool._max_keepalive_connections == POOL_LIMITS.max_keepalive_connections
        assert pool._max_connections == POOL_LIMITS.max_connections
        assert session.timeout == httpx.Timeout(client.api._timeout)
        assert isinstance(client.api.__version__, str)  # our session's User-Agent, as kr8s sends it
        auth = client.api.auth
        assert auth.token == apiserver.token and str(auth.server) == apiserver.url
        assert auth.proxy is None and auth.tls_server_name is None
        assert client.lean is not None  # built from those fields
        await client.request("GET", path="namespaces/default")
        assert client.lean.sent >= 1
    finally:
        await client.close()


# --- uvicorn and httptools -------------------------------------------------------------------------

#: what HeadDeadlineProtocol extends with super() (these must stay callbacks uvicorn or httptools call)
EXTENDED = ("connection_made", "connection_lost", "on_message_begin", "on_url", "on_headers_complete",
            "on_message_complete", "on_response_complete", "data_received")
#: the helpers it calls as uvicorn's own data_received does
CALLED = ("_unset_keepalive_if_required", "_should_upgrade", "handle_websocket_upgrade",
          "_unsupported_upgrade_warning", "_get_upgrade")


def test_uvicorn_protocol_has_the_methods_we_extend_and_call() -> None:
    for name in EXTENDED + CALLED:
        assert callable(getattr(HttpToolsProtocol, name, None)), f"HttpToolsProtocol.{name} is gone"
    assert list(inspect.signature(HttpToolsProtocol.on_url).parameters) == ["self", "url"]
    assert list(inspect.signature(HttpToolsProtocol.data_received).parameters) == ["self", "data"]
    for name in CALLED:
        assert list(inspect.signature(getattr(HttpToolsProtocol, name)).parameters) == ["self"]
    assert issubclass(httptools.HttpParserInvalidMethodError, httptools.HttpParserError)
    assert issubclass(httptools.HttpParserUpgrade, Exception)


def test_our_own_protocol_names_do_not_shadow_uvicorn_ones() -> None:
    """A name uvicorn took up later (a `_refuse` of its own, say) would be silently replaced by ours."""
    ours = set(vars(_with_head_timeout(1.0))) - {"__module__", "__qualname__", "__doc__", "__firstlineno__",
                                                 "__static_attributes__", "__annotations__"}
    assert ours - set(EXTENDED) == {"_head_timer", "_head_deadline", "_awaiting_head", "_in_head", "_head_bytes",
                                    "_url_bytes", "_arm_head_timer", "_head_due", "_feed", "_refuse"}
    config = uvicorn.Config(_answer_ok, lifespan="off", log_level="warning")
    loop = asyncio.new_event_loop()
    try:
        theirs = set(dir(HttpToolsProtocol)) | set(vars(HttpToolsProtocol(config, ServerState(), {}, _loop=loop)))
    finally:
        loop.close()
    assert not (ours - set(EXTENDED)) & theirs


def test_uvicorn_server_still_takes_signals_through_the_hook_we_replace() -> None:
    assert "self.capture_signals()" in inspect.getsource(uvicorn.Server.serve)
    assert Server.capture_signals is not uvicorn.Server.capture_signals
    server = Server(uvicorn.Config(_answer_ok))
    assert (server.started, server.should_exit, server.force_exit) == (False, False, False)


async def _answer_ok(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    message = await receive()
    body = message["body"]
    headers = [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _connected(app: Any) -> tuple[Any, asyncio.Transport, asyncio.StreamReader, asyncio.StreamWriter]:
    """`app` served through our protocol on one end of a socket pair: the protocol, the real
    transport under it, and the other end's streams."""
    config = uvicorn.Config(app, lifespan="off", log_level="warning")
    protocol_class: Any = _with_head_timeout(30.0)
    protocol = protocol_class(config=config, server_state=ServerState(), app_state={})
    ours, theirs = socket.socketpair()
    transport, _ = await asyncio.get_running_loop().connect_accepted_socket(lambda: protocol, ours)
    reader, writer = await asyncio.open_connection(sock=theirs)
    return protocol, transport, reader, writer


async def test_our_protocol_sees_the_request_state_it_reads() -> None:
    """A request through HeadDeadlineProtocol on a real socket: the instance attributes it reads
    (loop, transport, parser, flow, cycle and the cycle's more_body/response_complete) hold what it
    expects, and the head deadline is armed again once the response is complete."""
    protocol, _, reader, writer = await _connected(_answer_ok)
    try:
        assert protocol.loop is asyncio.get_running_loop() and protocol.parser is not None
        assert protocol.transport is not None and protocol.flow is not None and protocol._awaiting_head
        writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
        await reader.readuntil(b"hello")
        cycle = protocol.cycle
        assert isinstance(cycle, RequestResponseCycle)
        assert cycle.more_body is False and cycle.response_complete is True
        assert protocol._awaiting_head and protocol._in_head and protocol._head_timer is not None
    finally:
        writer.close()
        protocol.transport.close()


async def test_a_response_leaves_in_one_write_and_close_sends_what_is_pending() -> None:
    """uvicorn writes a response's head and body apart; through our protocol they reach the real
    transport as one write (one TLS record, one send), and a response that closes its connection
    still arrives whole before the end of the stream."""
    protocol, transport, reader, writer = await _connected(_answer_ok)
    writes: list[bytes] = []
    real_write = transport.write

    def counted(data: bytes | bytearray | memoryview[Any]) -> None:
        writes.append(bytes(data))
        real_write(data)

    transport.write = counted  # type: ignore[method-assign]
    try:
        writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
        await reader.readuntil(b"hello")
        assert len(writes) == 1 and writes[0].startswith(b"HTTP/1.1 200 OK") and writes[0].endswith(b"hello")
        writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 3\r\n\r\nbye")
        assert (await reader.read()).endswith(b"\r\n\r\nbye")  # whole, then the end of the stream
        assert len(writes) == 2
    finally:
        writer.close()
        protocol.transport.close()


async def test_a_streamed_head_leaves_before_its_body_exists() -> None:
    """A head with no body in the same turn (a watch's) is not held back until the first event."""
    go_on = asyncio.Event()

    async def stream(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"transfer-encoding", b"chunked")]})
        await go_on.wait()
        await send({"type": "http.response.body", "body": b"event", "more_body": False})

    protocol, _, reader, writer = await _connected(stream)
    try:
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 200 OK")
        go_on.set()
        assert (await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 5)).endswith(b"event\r\n0\r\n\r\n")
    finally:
        writer.close()
        protocol.transport.close()
