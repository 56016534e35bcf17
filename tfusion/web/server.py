"""The uvicorn servers of the controller, the hypervisor and the embedded API server, which we run
inside an anyio task group (no signal capture of their own), with bounds on each request head.

`serve` refuses a request line over `MAX_URL_BYTES` (414) or a request head over `MAX_HEAD_BYTES`
(431) while it arrives, closes a connection whose request head does not arrive within
`HEAD_TIMEOUT_S`, and an idle keep-alive connection after `KEEP_ALIVE_S`; after large bodies it
hands freed heap memory back to the system (`MemoryTrimmer`, tfusion.web.memory). What its HTTP
parser refuses is worded by the server that runs it (`error_body_refusal`, `kube_status_refusal`).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable, Iterable, Iterator, Sequence
from http import HTTPStatus
from typing import Any, cast

import anyio
import anyio.to_thread
import httptools
import msgspec
import uvicorn
from anyio.abc import TaskStatus
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from tfusion.settings import parse_listen
from tfusion.web.errors import ErrorBody
from tfusion.web.memory import MEMORY_TRIMMER

#: how long a connection may take to send a complete request head (else it is closed)
HEAD_TIMEOUT_S = 30.0
#: how long an idle keep-alive connection stays open (uvicorn's default, written down)
KEEP_ALIVE_S = 5
#: what a refusal of a method the HTTP parser does not know offers instead
PARSER_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
#: the largest request head (request line and headers) a server reads, Go's http.DefaultMaxHeaderBytes
#: as kube-apiserver has it; a larger one is refused with 431 as it arrives, never buffered whole
MAX_HEAD_BYTES = 1024 * 1024
#: the longest request target (path and query): the most the HTTP parser's URL splitter takes (it
#: counts in 16 bits); a longer one is refused with 414 as it arrives
MAX_URL_BYTES = 65535


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


class _CoalescedWrites:
    """A transport that sends a response's head together with what follows it. uvicorn writes the
    head and the body of a response apart, one after the other: over TLS each write is a record and
    a send(2) of its own, and those writes were ~7 % of the embedded API server's CPU while it
    scheduled pods. The head is held until the next write, which sends both at once (the same turn
    of the event loop, so no answer waits); a head with nothing after it in that turn (a watch's,
    a 204) leaves at the end of the turn. Everything else is the transport's own; `close` sends what
    is held first (as do `writelines` and `write_eof`)."""

    __slots__ = ("_head", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._head: bytes | None = None

    def write(self, data: bytes) -> None:
        head = self._head
        if head is not None:
            self._head = None
            self._transport.write(head + data)
        elif data.startswith(b"HTTP/1.1 "):
            self._head = data
            self._loop.call_soon(self._flush)
        else:
            self._transport.write(data)

    def _flush(self) -> None:
        head, self._head = self._head, None
        if head is not None and not self._transport.is_closing():
            self._transport.write(head)

    def writelines(self, chunks: Iterable[bytes]) -> None:
        self.write(b"".join(chunks))

    def write_eof(self) -> None:
        self._flush()
        self._transport.write_eof()

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


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
            # the wrapper is the transport as far as uvicorn goes (it forwards everything else)
            super().connection_made(cast(asyncio.Transport, _CoalescedWrites(transport, self.loop)))
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
                elif self._get_upgrade() == b"websocket":
                    self._unsupported_upgrade_warning()
                # another upgrade (SPDY: kubectl's exec fallback) is served as the plain request it also is
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
    # proxy_headers off: no tfusion server sits behind a proxy, and with it on a local client could
    # name another address and scheme in X-Forwarded-For/-Proto (it also costs a step per request)
    config = uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False, proxy_headers=False,
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
