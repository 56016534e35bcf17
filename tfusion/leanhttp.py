"""A lean HTTP/1.1 client for small requests on kept-alive connections: KubeClient's
non-streaming requests, and the embedded API server's calls to admission webhooks.

Why: every write the controller makes (a workload for an admitted pod, a Binding, a status, a
finalizer) is one small request, and through kr8s and httpx each costs about a millisecond of the
process's CPU, several times the API server's own work for it; with hundreds of pods a second
that client cost is what bounds the controller. This writes the request on a kept-alive
connection with the kr8s connection's server, bearer token and TLS settings, and reads a
Content-Length or chunked answer: a few dozen microseconds.

Watches take a connection of their own and read the chunked stream line by line (`stream`):
through httpx each read of a watch went through an anyio timeout scope and TLS stream, and h11's
parser, a few percent of the controller's CPU while pods are being scheduled.

kr8s stays in charge of everything else: reading the kubeconfig or the in-cluster account,
refreshing credentials. The lean path is used only when kr8s authenticates with
a bearer token; a 401 is handed back to the caller to retry through kr8s, which re-reads the token
(the lean path then takes the new one). A request that fails on a kept-alive connection before any
answer arrives is retried once on a fresh connection when it is safe to repeat (GET, PUT, DELETE);
otherwise, as with any transport failure, the caller gets the error.

The embedded API server calls admission webhooks the same way (no token; an AdmissionReview may be
sent again, as kube-apiserver retries webhook calls): httpx's per-request bookkeeping there cost
more CPU than the API server's own work for the admitted object.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

#: idle connections kept, and for how long: dropped well before the embedded API server's 30 s
#: keep-alive ends, so a request never races the server's close
MAX_IDLE = 64
IDLE_SECONDS = 20.0
_REPEATABLE = frozenset({"GET", "PUT", "DELETE"})

Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class Stale(Exception):
    """A kept-alive connection failed before any answer arrived (the server may have closed it)."""


class LeanTransport:
    """Kept-alive HTTP/1.1 connections to one server (the API server with a bearer token; the API
    server's webhook calls without one). `idle_seconds`: how long an idle connection is reused,
    shorter than the server's own keep-alive."""

    def __init__(self, host: str, port: int, prefix: str, tls: ssl.SSLContext | None, server_name: str,
                 token: str = "", *, idle_seconds: float = IDLE_SECONDS) -> None:
        self.host, self.port, self.prefix, self.tls, self.server_name = host, port, prefix, tls, server_name
        self.token = token
        self.idle_seconds = idle_seconds
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter, float]] = []
        #: requests answered here, and those handed back (a 401) to go through kr8s
        self.sent = 0
        self.handed_back = 0

    @classmethod
    async def for_api(cls, api: Any) -> LeanTransport | None:
        """For a kr8s Api that authenticates with a bearer token over http(s); None otherwise."""
        auth = getattr(api, "auth", None)
        token, server = getattr(auth, "token", None), str(getattr(auth, "server", "") or "")
        if auth is None or not token or not server or getattr(auth, "proxy", None):
            return None
        url = urlsplit(server)
        if url.scheme not in ("http", "https") or not url.hostname:
            return None
        tls: ssl.SSLContext | None = None
        if url.scheme == "https":
            verify = await auth.ssl_context()
            tls = verify if isinstance(verify, ssl.SSLContext) else ssl.create_default_context()
        port = url.port or (443 if url.scheme == "https" else 80)
        server_name = str(getattr(auth, "tls_server_name", None) or url.hostname)
        return cls(url.hostname, port, url.path.rstrip("/"), tls, server_name, str(token))

    def target(self, path: str, params: dict[str, str] | None) -> str:
        return f"{self.prefix}{path}?{urlencode(params)}" if params else f"{self.prefix}{path}"

    def _head(self, method: str, target: str) -> str:
        auth = f"Authorization: Bearer {self.token}\r\n" if self.token else ""
        return (f"{method} {target} HTTP/1.1\r\nHost: {self.server_name}\r\n{auth}"
                f"Accept: application/json\r\nUser-Agent: tfusion\r\n")

    async def send(self, method: str, target: str, body: bytes | None, content_type: str,
                   timeout: float, *, repeatable: bool | None = None) -> tuple[int, bytes]:
        """(status, body). Raises OSError, ConnectionError, TimeoutError, asyncio.IncompleteReadError
        or ValueError when no usable answer came. `repeatable` (default: GET, PUT, DELETE): whether a
        request whose kept-alive connection failed before an answer may be sent again."""
        head = self._head(method, target)
        if body is not None:
            head += f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
        request = (head + "\r\n").encode() + (body or b"")
        async with asyncio.timeout(timeout):  # raises TimeoutError, as anyio's scope did, for less CPU
            try:
                return await self._exchange(request, reuse=True)
            except Stale:
                if not (method in _REPEATABLE if repeatable is None else repeatable):
                    raise ConnectionError("the kept-alive connection closed before an answer came") from None
                return await self._exchange(request, reuse=False)

    async def _exchange(self, request: bytes, *, reuse: bool) -> tuple[int, bytes]:
        reader, writer, reused = await self._connection(reuse)
        try:
            writer.write(request)
            try:
                first = await reader.readline()
            except (ConnectionError, OSError):
                if reused:
                    raise Stale() from None
                raise
            if not first and reused:
                raise Stale()
            status, answer, keep = await _read_response(first, reader)
        except BaseException:
            writer.close()
            raise
        self.sent += 1
        if keep and len(self._idle) < MAX_IDLE:
            self._idle.append((reader, writer, time.monotonic()))
        else:
            writer.close()
        return status, answer

    async def stream(self, target: str, connect_timeout: float, read_timeout: float) -> Streamed:
        """A GET whose answer is read as it comes (a watch), on a connection of its own that
        `Streamed.close` closes. Raises as `send` does when no answer head came within
        `connect_timeout`; a `Streamed` that is not 200 carries its whole (short) body."""
        async with asyncio.timeout(connect_timeout):
            reader, writer, _ = await self._connection(reuse=False)
            try:
                writer.write((self._head("GET", target) + "\r\n").encode())
                head = await _read_head(await reader.readline(), reader)
                streamed = Streamed(head, reader, writer, read_timeout)
                if head.status != 200:
                    streamed.body = await _read_body(head, reader)
                    writer.close()
            except BaseException:
                writer.close()
                raise
        self.sent += 1
        return streamed

    async def _connection(self, reuse: bool) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bool]:
        now = time.monotonic()
        while reuse and self._idle:
            reader, writer, since = self._idle.pop()
            if now - since < self.idle_seconds and not writer.is_closing() and not reader.at_eof():
                return reader, writer, True
            writer.close()
        reader, writer = await asyncio.open_connection(self.host, self.port, ssl=self.tls,
                                                       server_hostname=self.server_name if self.tls else None)
        return reader, writer, False

    def close(self) -> None:
        for _reader, writer, _since in self._idle:
            writer.close()
        self._idle.clear()


@dataclass(slots=True)
class Head:
    """An answer's status line and the headers that frame its body."""

    status: int
    length: int | None
    chunked: bool
    keep: bool


class Streamed:
    """A streamed answer: its head, and for a 200 its body's lines as they arrive (`lines`)."""

    def __init__(self, head: Head, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 read_timeout: float) -> None:
        self.head, self.reader, self.writer, self.read_timeout = head, reader, writer, read_timeout
        self.body = b""

    async def lines(self) -> AsyncGenerator[bytes, None]:
        """Each non-empty line of the body until it ends; TimeoutError when nothing came for
        `read_timeout` seconds. The timeout covers each read alone: a consumer that takes its
        time with a line is never cancelled by it."""
        pending = b""
        while True:
            async with asyncio.timeout(self.read_timeout):
                data = await self._next()
            if not data:
                if pending.strip():
                    yield pending
                return
            *complete, pending = (pending + data).split(b"\n")
            for line in complete:
                if line.strip():
                    yield line

    async def _next(self) -> bytes:
        """The next piece of the body (b"" at its end); ConnectionError when the stream breaks off
        or is not HTTP's chunked framing."""
        try:
            return await self._read()
        except asyncio.IncompleteReadError:
            raise ConnectionError("the stream ended inside a chunk") from None
        except ValueError as exc:  # a chunk size that is not hexadecimal
            raise ConnectionError(f"the stream is not chunked as HTTP/1.1 says: {exc}") from None

    async def _read(self) -> bytes:
        head, reader = self.head, self.reader
        if head.chunked:
            return await _chunk(reader)
        if head.length is not None:
            data = await reader.read(head.length)
            head.length -= len(data)
            return data
        return await reader.read(65536)

    def close(self) -> None:
        self.writer.close()


async def _read_response(status_line: bytes, reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    head = await _read_head(status_line, reader)
    return head.status, await _read_body(head, reader), head.keep


async def _read_head(status_line: bytes, reader: asyncio.StreamReader) -> Head:
    parts = status_line.split()
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
        raise ConnectionError(f"not an HTTP/1.1 answer: {status_line[:100]!r}")
    status = int(parts[1])
    length: int | None = None
    chunked, keep = False, parts[0] == b"HTTP/1.1"
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        name, _, value = line.partition(b":")
        name, value = name.strip().lower(), value.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding" and b"chunked" in value:
            chunked = True
        elif name == b"connection":
            keep = value != b"close"
        elif name == b"content-encoding" and value not in (b"identity", b""):
            raise ConnectionError(f"unexpected content encoding {value!r}")
    if status in (204, 304) or status < 200:
        length, chunked = 0, False  # no body, whatever the headers say (RFC 9112 §6.3)
    return Head(status, length, chunked, keep)


async def _read_body(head: Head, reader: asyncio.StreamReader) -> bytes:
    if head.chunked:
        body = bytearray()
        while chunk := await _chunk(reader):
            body += chunk
        return bytes(body)
    if head.length is None:
        head.keep = False
        return await reader.read()
    return await reader.readexactly(head.length)


async def _chunk(reader: asyncio.StreamReader) -> bytes:
    """The next chunk of a chunked body; b"" at the last one, whose trailer is read too."""
    size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
    if size == 0:
        while (await reader.readline()) not in (b"\r\n", b"\n", b""):
            pass
        return b""
    data = await reader.readexactly(size)
    await reader.readexactly(2)
    return data
