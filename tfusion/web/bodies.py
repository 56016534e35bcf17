"""Request bodies, bounded before they are buffered, and large answers.

Each route declares the body it takes (`request_max_body_size`, else `DEFAULT_MAX_BODY_BYTES`); a
declared Content-Length over it is refused with 413 before any of the body is read, a chunked body
as soon as it passes the limit. `read_body` reads a body within that limit and `BODY_TIMEOUT_S`
(413 / 408), `decode_body` / `decode_json_body` parse a large one in a worker thread (one at a
time per event loop, the collector paused) so that the event loop (and with it the leader's Lease
renewal) keeps running; a large body with a declared length is received into an anonymous
mapping, and `json_answer` sends a large answer in pieces. A JSON body that nests deeper than
`MAX_JSON_DEPTH` is refused with 400 (`json_depth_problem`) before any decoder sees it: the routes
that read their body themselves get it from `decode_body`, the routes whose body Litestar parses
from the app's before-request hook (tfusion.web.app).
"""

from __future__ import annotations

import asyncio
import mmap
import re
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import msgspec
from litestar import MediaType, Request, Response
from litestar.response import Stream
from litestar.types import Receive

from tfusion.api.documents import collector_paused
from tfusion.web.depth import json_depth_problem
from tfusion.web.errors import ErrorBody, HttpError, _body_too_large, body_limit
from tfusion.web.memory import MEMORY_TRIMMER

#: request bodies a route takes unless it sets `request_max_body_size` (most routes take none)
DEFAULT_MAX_BODY_BYTES = 64 * 1024
#: how long a request body may take to arrive in full (else 408)
BODY_TIMEOUT_S = 30.0
#: bodies larger than this are parsed in a worker thread, off the event loop
THREAD_ABOVE_BYTES = 256 * 1024
_T = TypeVar("_T")


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
