"""Shared HTTP plumbing for the controller, the hypervisor and the embedded API server: uvicorn
servers we can run inside an anyio task group (no signal capture of their own), health/readiness
bookkeeping, the Prometheus mount for a role's own registry, and the one HTTP edge of the
controller's and the hypervisor's Litestar apps (`make_app`).

The edge exists so that a client of either role meets one error contract: every non-2xx answer is
JSON `ErrorBody` (`{"error": "<message>"}` plus optional structured fields), whether a handler
refused the call (`HttpError`), Litestar's routing or validation did (404, 405 with `Allow`, 400
naming the parameter), or a bug did (500, logged with its traceback). `/readyz`'s 503 keeps its own
body: probes read its conditions. The OpenAPI document declares these error bodies, and
`raw_body` documents request bodies that a handler reads as raw bytes (a YAML manifest, a body
whose fields it checks one by one to name them in its errors).

Bounded input, before it is buffered: each route declares the body it takes (`request_max_body_size`,
else `DEFAULT_MAX_BODY_BYTES`); a declared Content-Length over it is refused with 413 before any
of the body is read, a chunked body as soon as it passes the limit. `read_body` reads a body within
that limit and `BODY_TIMEOUT_S` (413 / 408), `decode_body` / `decode_json_body` parse a large one
in a worker thread (one at a time per event loop, the collector paused) so that the event loop
(and with it the leader's Lease renewal) keeps running; a large body with a declared length is
received into an anonymous mapping, and `json_answer` sends a large answer in pieces.
Every JSON body is refused with 400 when it nests deeper than `MAX_JSON_DEPTH` (`json_depth_problem`,
a scan without recursion, before any decoder sees it): the routes that read their body themselves
get it from `decode_body`, the routes whose body Litestar parses from the app's before-request hook,
which also holds integer query and path parameters to Go's `strconv.ParseInt` grammar. `serve`
refuses a request line over `MAX_URL_BYTES` (414) or a request head over `MAX_HEAD_BYTES` (431)
while it arrives, closes a connection whose request head does not arrive within
`HEAD_TIMEOUT_S`, and an idle keep-alive connection after `KEEP_ALIVE_S`; after large bodies it
hands freed heap memory back to the system (`MemoryTrimmer`). Only GET and HEAD reach the raw
/metrics mount; other methods get a clean 405.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import itertools
import logging
import math
import mmap
import operator
import os
import re
import socket
import threading
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Annotated, Any, TypeVar, get_args
from urllib.parse import parse_qsl, unquote, urlencode

import anyio
import anyio.to_thread
import httptools
import msgspec
import prometheus_client
import uvicorn
from anyio.abc import TaskStatus
from litestar import Litestar, MediaType, Request, Response, get
from litestar.di import Provide
from litestar.exceptions import HTTPException, MethodNotAllowedException, NotFoundException, ValidationException
from litestar.handlers import HTTPRouteHandler, asgi
from litestar.openapi import OpenAPIConfig, ResponseSpec
from litestar.openapi.spec import Operation, Reference
from litestar.params import Body
from litestar.response import Stream
from litestar.types import Receive, Scope, Send
from litestar.utils.scope.state import ScopeState
from msgspec import UNSET, UnsetType
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from tfusion.api.documents import MAX_DEPTH, collector_paused
from tfusion.api.strconv import INT64_ALLOWED, IntegerError, parse_int64
from tfusion.settings import parse_listen

log = logging.getLogger(__name__)

#: request bodies a route takes unless it sets `request_max_body_size` (most routes take none)
DEFAULT_MAX_BODY_BYTES = 64 * 1024
#: how long a request body may take to arrive in full (else 408)
BODY_TIMEOUT_S = 30.0
#: how long a connection may take to send a complete request head (else it is closed)
HEAD_TIMEOUT_S = 30.0
#: how long an idle keep-alive connection stays open (uvicorn's default, written down)
KEEP_ALIVE_S = 5
#: what a refusal of a method the HTTP parser does not know offers instead
PARSER_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
#: bodies larger than this are parsed in a worker thread, off the event loop
THREAD_ABOVE_BYTES = 256 * 1024
#: the largest request head (request line and headers) a server reads, Go's http.DefaultMaxHeaderBytes
#: as kube-apiserver has it; a larger one is refused with 431 as it arrives, never buffered whole
MAX_HEAD_BYTES = 1024 * 1024
#: the longest request target (path and query): the most the HTTP parser's URL splitter takes (it
#: counts in 16 bits); a longer one is refused with 414 as it arrives
MAX_URL_BYTES = 65535
#: objects and arrays in a JSON body may nest this deep (the bound of every document tfusion reads)
MAX_JSON_DEPTH = MAX_DEPTH
_T = TypeVar("_T")


class Server(uvicorn.Server):
    """uvicorn without its own signal handlers: tfusion owns SIGINT/SIGTERM (see roles.py)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def bind_socket(listen: str) -> socket.socket:
    """Bind now, so a port clash is reported at start-up and `:0` yields a known port."""
    host, port = parse_listen(listen)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto IPPROTO_TCP (not 0) so asyncio sets TCP_NODELAY on accepted connections; without it
    # every two-write response waits ~40 ms for the client's delayed ACK
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {listen}: {exc.strerror}") from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


#: how a server words the refusals its HTTP parser makes before any app sees the request:
#: (status, message, the methods allowed for a 405) -> a JSON body
ParserRefusal = Callable[[int, str, Sequence[str]], bytes]


def error_body_refusal(status: int, message: str, allowed: Sequence[str]) -> bytes:
    """The controller's and the hypervisor's words: an ErrorBody."""
    return msgspec.json.encode(ErrorBody(error=message, allowed=list(allowed)) if allowed else ErrorBody(error=message))


_STATUS_REASONS = {400: "BadRequest", 405: "MethodNotAllowed", 413: "RequestEntityTooLarge"}


def kube_status_refusal(status: int, message: str, allowed: Sequence[str]) -> bytes:
    """The embedded API server's words: a metav1.Status, as its handlers answer (kube has no reason
    for 414 and 431: the empty, unknown one)."""
    return msgspec.json.encode({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                "message": message, "reason": _STATUS_REASONS.get(status, ""), "code": status})


class _HeadRefused(Exception):
    """Raised from a parser callback to stop parsing a request head that is refused."""


def _with_head_timeout(seconds: float, refusal: ParserRefusal = error_body_refusal) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol (its C parser: the edge serves about twice the requests a core
    that its pure-Python h11 one does) with bounds on each request head, as Go's `http.Server`
    gives kube-apiserver: a deadline (`ReadHeaderTimeout`) and a size (`MaxHeaderBytes`).

    The deadline: uvicorn closes a keep-alive connection that idles after a response, but one that
    never sends a complete head (opened and left silent, or fed a header a byte at a time) would
    stay open for ever, and enough of them exhaust the process's file descriptors. The body has its
    own deadline (`read_body`, the API server's app).

    The size: httptools gathers a header's value (and uvicorn the URL) in memory until it ends, by
    repeated concatenation, so a head of hundreds of MiB would cost that much memory and quadratic
    time. The bytes that arrive while a head is incomplete are counted here, and the request is
    refused (414 for the URL, 431 for the head) as soon as they pass the limit."""

    class HeadDeadlineProtocol(HttpToolsProtocol):
        _head_timer: asyncio.TimerHandle | None = None
        _head_deadline = 0.0
        _awaiting_head = False
        #: no request body in progress: what arrives is (the start of) a request head
        _in_head = True
        _head_bytes = 0
        _url_bytes = 0

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm_head_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            self._url_bytes = 0
            super().on_message_begin()

        def on_url(self, url: bytes) -> None:
            self._url_bytes += len(url)
            if self._url_bytes > MAX_URL_BYTES:
                raise _HeadRefused()
            super().on_url(url)

        def on_headers_complete(self) -> None:
            self._awaiting_head = False
            self._in_head = False
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            # what follows is the next request's head (counted from the next read on: a read
            # that holds the end of one request and the start of another is not counted twice)
            self._in_head, self._head_bytes = True, 0
            super().on_message_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            # idle again (no pipelined request started): the next request gets its own deadline
            if self.cycle is None or self.cycle.response_complete:
                self._arm_head_timer()

        def _arm_head_timer(self) -> None:
            # a deadline moved per request and one timer per connection that checks it when due,
            # rather than a timer made and cancelled for every request
            self._head_deadline = self.loop.time() + seconds
            self._awaiting_head = True
            if self._head_timer is None:
                self._head_timer = self.loop.call_at(self._head_deadline, self._head_due)

        def _head_due(self) -> None:
            self._head_timer = None
            if not self._awaiting_head:  # a request is in progress (a long watch, say): the next arms
                return
            if self.loop.time() < self._head_deadline:
                self._head_timer = self.loop.call_at(self._head_deadline, self._head_due)
            elif not self.transport.is_closing():
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            self._unset_keepalive_if_required()
            if self._in_head:
                room = MAX_HEAD_BYTES - self._head_bytes
                if len(data) > room:
                    # feed up to the limit: the head may end within it, and the rest is its body
                    if not self._feed(data[:room]):
                        return
                    if self._in_head:
                        self._refuse(431, f"the request head (request line and headers) is larger than "
                                          f"{MAX_HEAD_BYTES} bytes")
                        return
                    data = data[room:]
                else:
                    self._head_bytes += len(data)
            self._feed(data)

        def _feed(self, data: bytes) -> bool:
            """uvicorn's own parsing, but its refusals keep the server's error contract (JSON, and
            405 for a method the parser does not know, as for one a route does not take); False
            when the connection is refused or upgraded."""
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserInvalidMethodError:
                method = data.split(b" ", 1)[0][:32].decode("ascii", "replace")
                self._refuse(405, f"{method!r} is not an HTTP method this server knows; allowed: "
                                  f"{', '.join(PARSER_METHODS)}", allowed=PARSER_METHODS)
                return False
            except httptools.HttpParserError as exc:
                if self._url_bytes > MAX_URL_BYTES:
                    self._refuse(414, f"the request target (path and query) is longer than {MAX_URL_BYTES} bytes")
                else:
                    self._refuse(400, f"not a valid HTTP/1.1 request: {exc}")
                return False
            except httptools.HttpParserUpgrade:
                if self._should_upgrade():
                    self.handle_websocket_upgrade()
                else:
                    self._unsupported_upgrade_warning()
                return False
            return True

        def _refuse(self, status: int, message: str, *, allowed: Sequence[str] = ()) -> None:
            if self.transport.is_closing():
                return
            payload = refusal(status, message, allowed)
            head = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}", "content-type: application/json",
                    f"content-length: {len(payload)}", "connection: close"]
            if allowed:
                head.append(f"allow: {', '.join(allowed)}")
            self.transport.write("\r\n".join(head).encode("ascii") + b"\r\n\r\n" + payload)
            self.transport.close()

    return HeadDeadlineProtocol


async def serve(app: Any, sock: socket.socket, *, ssl_certfile: str | None = None,
                ssl_keyfile: str | None = None, uvicorn_options: dict[str, Any] | None = None,
                head_timeout: float = HEAD_TIMEOUT_S, keep_alive: int = KEEP_ALIVE_S,
                refusal: ParserRefusal = error_body_refusal,
                task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
    """Serve `app` on an already bound socket until cancelled; open streams never block shutdown.

    A connection is closed when its request head takes longer than `head_timeout` or it idles
    `keep_alive` seconds between requests. `refusal` words what the HTTP parser refuses (a head
    too large, a method it does not know). `uvicorn_options` go to uvicorn.Config as they are and
    win over these (e.g. `http`, `timeout_keep_alive`)."""
    options: dict[str, Any] = {"http": _with_head_timeout(head_timeout, refusal), "timeout_keep_alive": keep_alive,
                               **(uvicorn_options or {})}
    config = uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False,
                            ssl_certfile=ssl_certfile, ssl_keyfile=ssl_keyfile,
                            timeout_graceful_shutdown=1, **options)
    server = Server(config)
    done = anyio.Event()
    # uvicorn must run its own shutdown (lifespan included) rather than be cancelled mid-way, so it
    # runs shielded and stops through should_exit; the scope is cancelled only if that overruns.
    server_scope = anyio.CancelScope(shield=True)

    async def run_server() -> None:
        try:
            with server_scope:
                await server.serve([sock])
        finally:
            done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(run_server)
        tg.start_soon(MEMORY_TRIMMER.run)
        while not server.started:
            if done.is_set():
                raise OSError(f"HTTP server on {sock.getsockname()} failed to start")
            await anyio.sleep(0.01)
        task_status.started()
        try:
            await done.wait()
        finally:
            # Not force_exit yet: uvicorn skips the app's lifespan shutdown when forced. Open streams
            # (watches) are cut by timeout_graceful_shutdown.
            server.should_exit = True
            with anyio.CancelScope(shield=True), anyio.move_on_after(2.5):
                await done.wait()
            server.force_exit = True
            server_scope.cancel()
            tg.cancel_scope.cancel()


class MemoryTrimmer:
    """Hands freed heap memory back to the system after large requests.

    Why: glibc keeps what a process frees in its heaps for reuse, and after a large block is
    freed it raises its threshold for serving allocations from fresh mappings, so the memory of a
    burst of large bodies (parsed in worker threads, which get arenas of their own) stays resident
    after the burst, for good. `malloc_trim(0)` returns the free pages of every arena.

    When: once a burst is over, not during it (a trim walks every arena with its lock held, which
    stalls the event loop's own allocations on a heap of hundreds of MiB): `quiet` seconds after
    the last large body was read or decoded (`note_large_body`), and once more `quiet` seconds
    later for what was still being answered then; or after the resident size grew by `growth`
    bytes since the last trim with no large body noted (a burst on a route that reads its body
    some other way). In a worker thread (ctypes releases the GIL). A no-op where the C library has
    no malloc_trim."""

    def __init__(self, *, quiet: float = 2.0, growth: int = 16 * 1024 * 1024) -> None:
        self.quiet, self.growth = quiet, growth
        self.trims = 0
        self._pending = 0  # trims still owed to the last burst
        self._last_large = 0.0
        self._baseline = 0
        self._lock = threading.Lock()
        self._trim: Callable[[int], int] | None = None
        libc = ctypes.util.find_library("c")
        with contextlib.suppress(OSError, AttributeError):
            self._trim = ctypes.CDLL(libc).malloc_trim if libc else None

    def note_large_body(self) -> None:
        self._pending, self._last_large = 2, time.monotonic()

    async def run(self) -> None:
        """Until cancelled; every server runs one, and they share the work (one trim per occasion)."""
        if self._trim is None:
            return
        while True:
            await anyio.sleep(self.quiet)
            if self._due() and self._lock.acquire(blocking=False):
                try:
                    await anyio.to_thread.run_sync(self.trim_now)
                finally:
                    self._lock.release()

    def _due(self) -> bool:
        if time.monotonic() - self._last_large < self.quiet:
            return False
        return self._pending > 0 or _resident_bytes() > self._baseline + self.growth

    def trim_now(self) -> None:
        self._pending = max(0, self._pending - 1)
        if self._pending:  # the next one `quiet` seconds from now
            self._last_large = time.monotonic()
        if self._trim is not None:
            self._trim(0)
            self.trims += 1
        self._baseline = _resident_bytes()


def _resident_bytes() -> int:
    """This process's resident memory now (0 where /proc is not there)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


MEMORY_TRIMMER = MemoryTrimmer()


class Readiness:
    """Named readiness conditions; /readyz is 200 only when every one is true, and lists them all."""

    def __init__(self) -> None:
        self._conditions: dict[str, tuple[bool, str]] = {}

    def set(self, name: str, ready: bool, message: str = "") -> None:
        self._conditions[name] = (ready, message)

    @property
    def ready(self) -> bool:
        return bool(self._conditions) and all(ok for ok, _ in self._conditions.values())

    def body(self) -> dict[str, Any]:
        return {
            "status": "ready" if self.ready else "not ready",
            "conditions": [{"name": name, "ready": ok, "message": msg}
                           for name, (ok, msg) in sorted(self._conditions.items())],
        }


def health_handlers(readiness: Readiness) -> list[Any]:
    @get("/healthz", include_in_schema=False, sync_to_thread=False)
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @get("/readyz", include_in_schema=False, sync_to_thread=False)
    def readyz() -> Response[dict[str, Any]]:
        return Response(readiness.body(), status_code=200 if readiness.ready else 503)

    return [healthz, readyz]


_METRICS_METHODS = ("GET", "HEAD")


def metrics_handler(registry: prometheus_client.CollectorRegistry) -> Any:
    metrics_app = prometheus_client.make_asgi_app(registry=registry)

    @asgi("/metrics", is_mount=True, include_in_schema=False)
    async def metrics(scope: Scope, receive: Receive, send: Send) -> None:
        # a raw mount sees every method; prometheus_client would answer CONNECT with a 200, which
        # a client takes for an accepted tunnel, and the body that follows crashes the response
        method = str(scope.get("method", "GET"))
        if method not in _METRICS_METHODS:
            allowed = list(_METRICS_METHODS)
            refusal = error_response(405, ErrorBody(error=f"{method} is not allowed on {scope['path']}; allowed: "
                                                          f"{', '.join(allowed)}", allowed=allowed),
                                     headers={"Allow": ", ".join(allowed)})
            await refusal.to_asgi_response(app=None, request=Request(scope, receive))(scope, receive, send)
            return
        await metrics_app(scope, receive, send)

    return metrics


# --- the HTTP edge of the controller and the hypervisor ----------------------------------------

class ErrorBody(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True):
    """Every non-2xx body of the controller's and the hypervisor's API (except /readyz's 503)."""

    error: Annotated[str, msgspec.Meta(description="What went wrong, in words a user can act on")]
    field: Annotated[str, msgspec.Meta(description="The request field or parameter that is wrong")] | UnsetType = UNSET
    allowed: Annotated[list[str], msgspec.Meta(description="405: the methods this path accepts")] | UnsetType = UNSET


class HttpError(Exception):
    """A refusal with its HTTP status and body; raised by handlers, answered by the edge."""

    def __init__(self, status: int, body: ErrorBody | str, *, headers: Mapping[str, str] | None = None) -> None:
        self.body = body if isinstance(body, ErrorBody) else ErrorBody(error=body)
        super().__init__(self.body.error)
        self.status = status
        self.headers = dict(headers or {})


def error_response(status: int, body: ErrorBody | str, *,
                   headers: Mapping[str, str] | None = None) -> Response[ErrorBody]:
    """The one way to answer a non-2xx status."""
    content = body if isinstance(body, ErrorBody) else ErrorBody(error=body)
    return Response(content, status_code=status, headers=dict(headers or {}), media_type=MediaType.JSON)


def error_responses(descriptions: Mapping[int, str], model: type[ErrorBody] = ErrorBody) -> dict[int, ResponseSpec]:
    """`responses=` for a route decorator: each listed status documented with `model` as its body."""
    return {status: ResponseSpec(model, description=text, generate_examples=False)
            for status, text in descriptions.items()}


def raw_body(model: type[msgspec.Struct], media_types: Sequence[str] = (MediaType.JSON,), *,
             description: str) -> dict[str, Any]:
    """Route-decorator keywords that document `model` as the request body of a handler that reads
    the raw bytes itself (`await request.body()`), under each of `media_types`.

    Litestar documents a body only from a `data` parameter, which would also make it parse the body
    and answer with its own validation messages. A provider that declares `data` but that the
    handler never asks for is documented and never run; the operation class adds the other media
    types."""

    def documented_body(data: Any) -> None:
        raise AssertionError("documentation only: the handler reads the raw body")

    # set at run time: the annotation names `model`, which a postponed (string) annotation cannot
    documented_body.__annotations__ = {
        "data": Annotated[model, Body(media_type=media_types[0], description=description)], "return": None}

    @dataclass
    class RawBodyOperation(Operation):
        def __post_init__(self) -> None:
            if self.request_body is not None and not isinstance(self.request_body, Reference):
                self.request_body.description = description
                first = self.request_body.content[media_types[0]]
                for media_type in media_types[1:]:
                    self.request_body.content[media_type] = first

    return {"dependencies": {"documented_body": Provide(documented_body, sync_to_thread=False)},
            "operation_class": RawBodyOperation}


# --- request bodies --------------------------------------------------------------------------------

def body_limit(request: Request[Any, Any, Any]) -> float:
    """The route's `request_max_body_size` (the app's DEFAULT_MAX_BODY_BYTES unless it sets one)."""
    return request.route_handler.resolve_request_max_body_size() or math.inf


def _too_large(request: Request[Any, Any, Any], limit: float, size: int | None) -> HttpError:
    return _body_too_large(f"{request.method} {request.url.path}", limit, size)


def _body_too_large(target: str, limit: float, size: int | None) -> HttpError:
    got = f" (Content-Length {size})" if size is not None else ""
    return HttpError(413, f"request body too large{got}: {target} takes at most {limit:.0f} bytes",
                     headers={"Connection": "close"})


#: a request body: bytes, or for a large one with a declared length the anonymous mapping it was
#: received into (see `_receive`)
BodyBuffer = bytes | mmap.mmap


async def read_body(request: Request[Any, Any, Any], *, timeout: float = BODY_TIMEOUT_S) -> bytes:
    """The whole body, within the route's limit (else 413) and arriving within `timeout` (else 408)."""
    return _as_bytes(await _read(request, timeout))


async def receive_body(receive: Receive, *, limit: float, declared: str, target: str,
                       timeout: float = BODY_TIMEOUT_S) -> bytes:
    """`read_body` for a raw ASGI route: `declared` is its Content-Length ("" if none), `target`
    its method and path (named in a 413)."""
    return _as_bytes(await _receive(receive, limit=limit, declared=declared, target=target, timeout=timeout))


def _as_bytes(body: BodyBuffer) -> bytes:
    return body if isinstance(body, bytes) else body[:]


def _read(request: Request[Any, Any, Any], timeout: float) -> Awaitable[BodyBuffer]:
    return _receive(request.receive, limit=body_limit(request), timeout=timeout,
                    declared=request.headers.get("content-length", ""), target=f"{request.method} {request.url.path}")


async def _receive(receive: Receive, *, limit: float, declared: str, target: str, timeout: float) -> BodyBuffer:
    """The body; one over THREAD_ABOVE_BYTES that declares its length is received into an anonymous
    mapping of that size: it is written once as it arrives (a buffer grown chunk by chunk is copied
    at each growth, and chunks joined at the end are copied once more, tens of MiB at a time on the
    event loop), it is not zero-filled first, and its memory goes back to the system the moment
    the last reference to it goes (a heap buffer that large stays in the allocator's arenas)."""
    # a declared length over the limit is refused before a byte of the body is read; one that
    # arrives without (chunked) as soon as it passes the limit
    if declared.isdigit() and int(declared) > limit:
        raise _body_too_large(target, limit, int(declared))
    expected = int(declared) if declared.isdigit() else 0
    mapped = mmap.mmap(-1, expected) if expected > THREAD_ABOVE_BYTES else None
    chunks: list[bytes] = []
    size = 0
    with anyio.move_on_after(timeout) as deadline:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":  # nobody is left to read an answer
                raise HttpError(400, "the client disconnected before its request body was complete")
            chunk: bytes = message.get("body", b"")  # type: ignore[assignment]
            if size + len(chunk) > limit:
                raise _body_too_large(target, limit, None)
            if mapped is None:
                chunks.append(chunk)
            elif chunk:  # the HTTP parser delivers no more than the declared length
                mapped[size:size + len(chunk)] = chunk
            size += len(chunk)
            if not message.get("more_body", False):
                break
    if deadline.cancelled_caught:
        raise HttpError(408, f"the request body did not arrive in full within {timeout:g}s",
                        headers={"Connection": "close"})
    if size > THREAD_ABOVE_BYTES:
        MEMORY_TRIMMER.note_large_body()
    if mapped is None:
        return b"".join(chunks)
    if size != expected:
        raise HttpError(400, f"the request body has {size} bytes, not the {expected} of its Content-Length")
    return mapped


async def decode_body(request: Request[Any, Any, Any], decode: Callable[[bytes], _T], *,
                      timeout: float = BODY_TIMEOUT_S) -> _T:
    """`decode(read_body(request))`, in a worker thread when the body is over THREAD_ABOVE_BYTES:
    parsing a few MiB of YAML takes long enough to delay every other task of the process. A JSON
    body that nests deeper than MAX_JSON_DEPTH is refused (400) before `decode` sees it."""
    body = await _read(request, timeout)
    if len(body) <= THREAD_ABOVE_BYTES:
        return _decode_without_collections(decode, _as_bytes(body))
    try:
        return await anyio.to_thread.run_sync(_decode_copy, decode, body, limiter=_large_decodes())
    finally:
        del body
        MEMORY_TRIMMER.note_large_body()  # freed now: worth a trim


def _decode_copy(decode: Callable[[bytes], _T], body: BodyBuffer) -> _T:
    return _decode_without_collections(decode, _as_bytes(body))


async def decode_json_body(request: Request[Any, Any, Any], decode: Callable[[BodyBuffer], _T], *,
                           timeout: float = BODY_TIMEOUT_S) -> _T:
    """`decode(body)` for a msgspec decoding of the JSON body (a Decoder's `decode`, or a function
    that calls one): the body within the route's limit and at most MAX_JSON_DEPTH deep, decoded
    in a worker thread when large, straight from the buffer it arrived in (msgspec.Raw fields refer
    to it rather than copy it). msgspec's refusals become 400s naming the field at fault."""
    body = await _read(request, timeout)
    if len(body) <= THREAD_ABOVE_BYTES:
        return _decode_json(decode, body)
    try:
        return await anyio.to_thread.run_sync(_decode_json, decode, body, limiter=_large_decodes())
    finally:
        del body
        MEMORY_TRIMMER.note_large_body()


#: an answer larger than this is encoded in a worker thread and sent in pieces of this size
ANSWER_PIECE_BYTES = 256 * 1024
_ANSWER_ENCODER = msgspec.json.Encoder()


async def json_answer(value: Any) -> Response[Any]:
    """`value` as a 200 JSON answer, for a route whose answers may be tens of MiB (the extender's
    filter returns the Node objects it was sent): encoded in a worker thread and sent in pieces of
    ANSWER_PIECE_BYTES with its Content-Length. Handed to the transport whole, what the socket
    does not take at once is copied into asyncio's write buffer in one go, which (with the memory
    it faults in) held the event loop for 100-200 ms per answer."""
    payload = await anyio.to_thread.run_sync(_ANSWER_ENCODER.encode, value, limiter=_large_decodes())
    if len(payload) <= ANSWER_PIECE_BYTES:
        return Response(payload, media_type=MediaType.JSON)

    async def pieces() -> AsyncIterator[bytes]:
        view = memoryview(payload)
        for start in range(0, len(payload), ANSWER_PIECE_BYTES):
            yield bytes(view[start:start + ANSWER_PIECE_BYTES])

    return Stream(pieces(), media_type=MediaType.JSON, headers={"content-length": str(len(payload))})


_LARGE_DECODES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, anyio.CapacityLimiter] = \
    weakref.WeakKeyDictionary()


def _large_decodes() -> anyio.CapacityLimiter:
    """One large body decoded at a time per event loop. Each worker thread that parses holds the
    GIL for a switch interval (5 ms) in turn, so with ten parsing at once the event loop would
    wait ten intervals for every step of every other request (a /healthz took a second); with
    one, at most one interval."""
    loop = asyncio.get_running_loop()
    limiter = _LARGE_DECODES.get(loop)
    if limiter is None:
        limiter = _LARGE_DECODES[loop] = anyio.CapacityLimiter(1)
    return limiter


_ERROR_PATH = re.compile(r" - at `\$\.?([^`]*)`$")


def _decode_json(decode: Callable[[BodyBuffer], _T], body: BodyBuffer) -> _T:
    _refuse_deep_json(body)
    try:
        with collector_paused():  # see _decode_without_collections
            return decode(body)
    except msgspec.ValidationError as exc:
        where = _ERROR_PATH.search(str(exc))
        field = where.group(1) if where else ""
        missing = re.search(r"required field `([^`]+)`", str(exc))
        if missing:
            field = f"{field}.{missing.group(1)}" if field else missing.group(1)
        raise HttpError(400, ErrorBody(error=f"request body: {exc}", field=field) if field
                        else ErrorBody(error=f"request body: {exc}")) from None
    except msgspec.DecodeError as exc:
        raise HttpError(400, f"request body is not valid JSON: {exc}") from None


def _decode_without_collections(decode: Callable[[bytes], _T], body: bytes) -> _T:
    # the many objects a large document allocates would trigger full garbage collections, which
    # hold the GIL (and so the event loop) for 100 ms or more: see documents.collector_paused
    _refuse_deep_json(body)
    if len(body) <= THREAD_ABOVE_BYTES:
        return decode(body)
    with collector_paused():
        return decode(body)


def _refuse_deep_json(body: BodyBuffer) -> None:
    problem = json_depth_problem(body, yield_gil=len(body) > THREAD_ABOVE_BYTES)
    if problem is not None:
        raise HttpError(400, ErrorBody(error=f"request body: {problem}", field="body"))


#: bytes scanned per step: a step holds the GIL for about a millisecond at worst (a body of brackets)
_DEPTH_STEP = 64 * 1024
#: brackets to depth steps: an opening one counts 2, a closing one 0 (the running sum minus the
#: count of brackets is the depth)
_BRACKET_STEPS = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")
#: every byte but quotes and brackets, dropped first: what is left of a step is a few KiB at most
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'"[]{}')
_JSON_SPACE = re.compile(rb"[ \t\r\n]*")
_ESCAPE = re.compile(rb"\\.", re.DOTALL)


def json_depth_problem(body: bytes | bytearray | mmap.mmap, max_depth: int = MAX_JSON_DEPTH, *,
                       yield_gil: bool = False) -> str | None:
    """What is wrong when a JSON text nests objects and arrays deeper than `max_depth`, else None.

    Without recursion and without decoding: the text is scanned in steps of `_DEPTH_STEP` bytes,
    each step with bytes operations (escapes dropped, strings cut out at the quotes, the brackets
    left turned into a running depth by `itertools.accumulate`); `yield_gil` (in a worker thread)
    lets the event loop run between steps. A text that does not start as a JSON object or array is not
    JSON for this purpose (YAML has its own reader with its own bounds); a malformed one may be
    misjudged here, and its decoder refuses it anyway."""
    first = _JSON_SPACE.match(body)
    offset = first.end() if first else 0
    if offset >= len(body) or body[offset] not in b"[{":
        return None
    if isinstance(body, bytes | bytearray) and len(body) <= _DEPTH_STEP and \
            body.count(b"[") + body.count(b"{") <= max_depth:
        return None
    view = memoryview(body)
    depth, in_string, escaped = 0, False, False
    for start in range(offset, len(body), _DEPTH_STEP):
        step = bytes(view[start:start + _DEPTH_STEP])
        if escaped:  # the previous step ended with a backslash: it escapes this step's first byte
            step = step[1:]
        trailing = len(step) - len(step.rstrip(b"\\"))
        escaped = trailing % 2 == 1
        if escaped:
            step = step[:-1]
        if b"\\" in step:  # an escape and what it escapes (an escaped quote ends no string)
            step = _ESCAPE.sub(b"", step)
        kept = step.translate(None, _NOT_STRUCTURE)
        if in_string:  # the step starts inside a string: up to its closing quote is not structure
            close = kept.find(b'"')
            in_string = close < 0
            kept = b"" if in_string else kept[close + 1:]
        # two quotes with no bracket between them open and close a string, or close one and open
        # the next: dropping them leaves what is inside strings the same (and most strings go)
        pieces = kept.replace(b'""', b"").split(b'"')
        outside = b"".join(pieces[0::2])
        in_string = in_string or len(pieces) % 2 == 0
        brackets = outside.translate(_BRACKET_STEPS)
        opens = brackets.count(2)
        if depth + opens > max_depth:
            deepest = max(map(operator.sub, itertools.accumulate(brackets), itertools.count(1 - depth)))
            if deepest > max_depth:
                return f"nested more than {max_depth} levels deep"
        depth += 2 * opens - len(brackets)
        if yield_gil:
            # hand the GIL over between steps: a thread that keeps it until the interpreter asks
            # (every 5 ms) makes the event loop wait that long after each of its system calls
            time.sleep(0)
    return None


_MISSING_PARAMETER = re.compile(r"parameter '([^']+)'")


def _problem_text(problem: Mapping[str, Any]) -> tuple[str, str]:
    """(field, text) of one of Litestar's validation problems."""
    key = str(problem.get("key") or "")
    source = problem.get("source")
    source_name = str(getattr(source, "value", source) or "body")
    message = str(problem.get("message") or "is invalid")
    if source_name == "body":
        if key in ("", "data"):  # "data" is the whole body
            return "", f"request body: {message}"
        return key, f"request body field {key!r}: {message}"
    return key, f"{source_name} parameter {key!r}: {message}"


def _validation_error(request: Request[Any, Any, Any], exc: ValidationException) -> Response[ErrorBody]:
    problems = [p for p in exc.extra if isinstance(p, Mapping)] if isinstance(exc.extra, list) else []
    if not problems:
        missing = _MISSING_PARAMETER.search(str(exc.detail))
        text = f"invalid request to {request.method} {request.url.path}: {exc.detail}"
        return error_response(400, ErrorBody(error=text, field=missing.group(1)) if missing else text)
    named = [_problem_text(p) for p in problems]
    text = "; ".join(t for _, t in named)
    field = named[0][0]
    return error_response(400, ErrorBody(error=text, field=field) if field else text)


def _http_exception(request: Request[Any, Any, Any], exc: HTTPException) -> Response[ErrorBody]:
    method, path = request.method, request.url.path
    headers = dict(exc.headers or {})
    if exc.status_code >= 500:
        log.error("%s %s failed: %s", method, path, exc.detail, exc_info=exc)
    if isinstance(exc, NotFoundException) and exc.detail == HTTPStatus.NOT_FOUND.phrase:
        return error_response(404, f"no route {method} {path}; the routes are listed in /schema/openapi.json")
    if isinstance(exc, MethodNotAllowedException):
        allowed = [m.strip() for m in str(headers.get("allow", "")).split(",") if m.strip()]
        return error_response(405, ErrorBody(error=f"{method} is not allowed on {path}; allowed: "
                                                   f"{', '.join(allowed) or 'none'}", allowed=allowed),
                              headers=headers)
    if exc.status_code == 500:
        return error_response(500, f"internal error: {type(exc).__name__}: {exc.detail}", headers=headers)
    if exc.status_code == 413:  # Litestar's own limit, on a route that parses its body itself
        return error_response(413, _too_large(request, body_limit(request), None).body, headers=headers)
    if exc.status_code == 400:
        # e.g. a body that is not valid JSON: Litestar's detail alone ("Input data was truncated") says too little
        return error_response(400, f"bad request to {method} {path}: {exc.detail}", headers=headers)
    return error_response(exc.status_code, str(exc.detail), headers=headers)


def _http_error(_: Request[Any, Any, Any], exc: HttpError) -> Response[ErrorBody]:
    return error_response(exc.status, exc.body, headers=exc.headers)


def _unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[ErrorBody]:
    log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(500, f"internal error: {type(exc).__name__}: {exc}")


async def _json_errors_only(response: Response[Any]) -> Response[Any]:
    """After-request net for the framework's own non-JSON error pages (e.g. /schema/<unknown>).
    A coroutine: Litestar runs a plain function hook in a worker thread, a thread hop per request."""
    status = response.status_code or 200
    # None: the handler's media type, JSON for every handler of ours
    media_type = getattr(response.media_type, "value", response.media_type) or MediaType.JSON.value
    if status < 400 or str(media_type).startswith(MediaType.JSON.value):
        return response
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "error"
    return error_response(status, f"{phrase} (HTTP {status})")


EXCEPTION_HANDLERS: dict[type[Exception], Any] = {
    HttpError: _http_error, ValidationException: _validation_error, HTTPException: _http_exception,
    Exception: _unexpected}

_COMMON_ERRORS = {500: "A bug: the message names the exception; the traceback is in the log"}
_VALIDATION_ERRORS = {400: "A query or path parameter or the body is invalid; `field` names it"}
_BODY_ERRORS = {408: "The request body did not arrive in full in time",
                413: "The request body is larger than this route takes"}
#: handler parameters that Litestar injects rather than parses from the request (nothing to validate)
_INJECTED = {"request", "state", "scope", "headers", "cookies", "query", "body"}


def _document_errors(app: Litestar) -> None:
    """Declare ErrorBody for 500 on every documented route, and for 400 where Litestar validates."""
    for route in app.routes:
        for handler in getattr(route, "route_handlers", ()):
            if not isinstance(handler, HTTPRouteHandler) or not handler.resolve_include_in_schema():
                continue
            defaults = dict(_COMMON_ERRORS)
            signature = handler.parsed_fn_signature.parameters
            if any(name not in _INJECTED for name in signature) or "documented_body" in (handler.dependencies or {}):
                defaults.update(_VALIDATION_ERRORS)
            if "documented_body" in (handler.dependencies or {}):
                defaults.update(_BODY_ERRORS)
            handler.responses = {**error_responses(defaults), **(handler.responses or {})}


# --- before any handler runs: bodies Litestar parses, integers as Go reads them --------------------

def parse_go_int(text: str) -> int | None:
    """`text` as Go's strconv.ParseInt(text, 10, 64) reads it (tfusion.api.strconv), else None."""
    try:
        return parse_int64(text)
    except IntegerError:
        return None


@dataclass(frozen=True)
class _IntParameters:
    """A handler's integer parameters: the query keys, and its path templates that hold `{x:int}`
    (as segments)."""

    query: frozenset[str]
    paths: tuple[tuple[str, ...], ...]


_INT_PARAMETERS: dict[int, _IntParameters] = {}


def _is_int(annotation: Any) -> bool:
    if annotation is int:
        return True
    options = get_args(annotation)
    return int in options and all(option is int or option is type(None) for option in options)


def _int_parameters(handler: HTTPRouteHandler) -> _IntParameters:
    known = _INT_PARAMETERS.get(id(handler))
    if known is not None:
        return known
    paths = tuple(tuple(path.strip("/").split("/")) for path in handler.paths if ":int}" in path)
    in_path = {segment[1:].split(":", 1)[0] for path in paths for segment in path if segment.endswith(":int}")}
    dependencies = set(handler.resolve_dependencies())
    query = set()
    for name, field in handler.parsed_fn_signature.parameters.items():
        if name in in_path or name in dependencies or name in _INJECTED or not _is_int(field.annotation):
            continue
        kwarg = field.kwarg_definition
        if getattr(kwarg, "header", None) or getattr(kwarg, "cookie", None):
            continue
        query.add(str(getattr(kwarg, "query", None) or name))
    known = _INT_PARAMETERS[id(handler)] = _IntParameters(frozenset(query), paths)
    return known


def _not_go_int(where: str, name: str, value: str) -> HttpError:
    return HttpError(400, ErrorBody(error=f"{where} parameter {name!r}: {value[:100]!r} is not an integer; allowed: "
                                          f"{INT64_ALLOWED}", field=name))


def _check_int_query(request: Request[Any, Any, Any], keys: frozenset[str]) -> None:
    """Litestar reads an integer query parameter with Python's rules (it takes `1e3`, `5.0` and
    numbers beyond 64 bits, refuses `+5` and `007`); Go's grammar decides here, and a value Go
    takes reaches the handler in the spelling Litestar takes."""
    raw: bytes = request.scope.get("query_string", b"")
    if not raw:
        return
    pairs = parse_qsl(raw.decode("latin-1"), keep_blank_values=True)
    changed = False
    for index, (key, value) in enumerate(pairs):
        if key in keys:
            number = parse_go_int(value)
            if number is None:
                raise _not_go_int("query", key, value)
            if str(number) != value:
                pairs[index], changed = (key, str(number)), True
    if changed:
        request.scope["query_string"] = urlencode(pairs).encode("latin-1")


def _check_int_path(request: Request[Any, Any, Any], paths: tuple[tuple[str, ...], ...]) -> None:
    """Litestar reads `{x:int}` with Python's int() (which takes `1_0` and other scripts' digits)."""
    segments = str(request.scope.get("path", "")).strip("/").split("/")
    for template in paths:
        if len(template) != len(segments):
            continue
        for pattern, value in zip(template, segments, strict=True):
            if pattern.endswith(":int}") and parse_go_int(unquote(value)) is None:
                raise _not_go_int("path", pattern[1:].split(":", 1)[0], value)


async def _bounded_request(request: Request[Any, Any, Any]) -> None:
    """The app-wide before-request hook: integer parameters as Go reads them, and for a handler
    whose body Litestar parses (a `data` parameter), the body read here within the route's limit
    and refused when it nests too deep (msgspec has no depth limit of its own: a deep body would
    be a RecursionError, a 500); Litestar then parses the body read here."""
    handler = request.route_handler
    ints = _int_parameters(handler)
    if ints.query:
        _check_int_query(request, ints.query)
    if ints.paths:
        _check_int_path(request, ints.paths)
    if "data" in handler.parsed_fn_signature.parameters:
        body = await read_body(request)
        _refuse_deep_json(body)
        ScopeState.from_scope(request.scope).body = body


def make_app(handlers: list[Any], *, title: str, **kwargs: Any) -> Litestar:
    """The Litestar app of a role, with the shared error edge and OpenAPI document."""
    handlers_by_type = {**EXCEPTION_HANDLERS, **kwargs.pop("exception_handlers", {})}
    # logging_config=None: tfusion configures logging once in cli.py; Litestar must not reconfigure it.
    kwargs.setdefault("logging_config", None)
    kwargs.setdefault("request_max_body_size", DEFAULT_MAX_BODY_BYTES)
    app = Litestar(handlers, openapi_config=OpenAPIConfig(title=title, version="1"),
                   exception_handlers=handlers_by_type, after_request=_json_errors_only,
                   before_request=_bounded_request, **kwargs)
    _document_errors(app)
    return app
