"""The ASGI side of the embedded API server's requests: the request (its body read within limits
and decoded once, off the event loop when large), the parsed path target, kube's query parameters
and DeleteOptions as kube-apiserver checks them, and the response senders.

Separate from app.py, which routes a request to the Engine and shapes the answer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import parse_qs

import anyio
import anyio.to_thread
import orjson

from tfusion.api import strconv
from tfusion.apiserver import errors, limits
from tfusion.apiserver.rbac import ADMIN, UserInfo
from tfusion.apiserver.resources import ResourceInfo
from tfusion.web.arrived import first_message

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

JSON = b"application/json"
#: how long a request body may take to arrive in full
BODY_TIMEOUT_S = 60.0
_NOT_DECODED = object()


class ClientGone(Exception):
    """The client disconnected before its request body was complete: nothing to answer."""


async def _receive_body(receive: Receive, timeout: float) -> bytes:
    """The body's messages joined, at most MAX_BODY_BYTES (else 413), within `timeout` (else 408)."""
    chunks: list[bytes] = []
    size = 0
    try:
        with anyio.fail_after(timeout):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise ClientGone
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limits.MAX_BODY_BYTES:
                    raise limits.body_too_large()
                chunks.append(chunk)
                if not message.get("more_body"):
                    break
    except TimeoutError:
        raise errors.ApiError(
            408, "Timeout", f"Timeout: the request body did not arrive in full within {timeout:g}s"
        ) from None
    return b"".join(chunks)


class Request:
    __slots__ = ("_decoded", "body", "headers", "method", "params", "path", "receive", "scope", "user")

    def __init__(self, scope: Scope, receive: Receive) -> None:
        self.scope = scope
        self.receive = receive
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        # bytes that are not UTF-8 cannot name anything we serve or match a token: they become U+FFFD here,
        # before the try that turns errors into a Status, rather than raising
        query = scope.get("query_string", b"").decode("utf-8", "replace")
        self.params = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}
        self.headers = {
            k.decode("latin-1").lower(): v.decode("utf-8", "replace") for k, v in scope.get("headers", ())
        }
        self.body = b""
        self._decoded: Any = _NOT_DECODED
        #: who the request acts as (after impersonation); the admin where the server checks no token
        self.user: UserInfo = ADMIN

    async def read_body(
        self, timeout: float = BODY_TIMEOUT_S, limiter: anyio.CapacityLimiter | None = None
    ) -> bytes:
        """The whole body, at most MAX_BODY_BYTES, arriving within `timeout` seconds (else 413 / 408).

        A large body is decoded here, in a worker thread (at most `limiter` at once), so that `json()`
        does not hold the event loop.
        """
        declared = self.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limits.MAX_BODY_BYTES:
            raise limits.body_too_large(int(declared))
        # a body that arrived with the head is taken without arming the deadline (web/arrived.py)
        message, receive = first_message(self.receive)
        if (message is not None and message["type"] == "http.request" and not message.get("more_body")
                and len(message.get("body", b"")) <= limits.MAX_BODY_BYTES):
            self.body = message.get("body", b"")
        else:
            self.body = await _receive_body(receive, timeout)
        if len(self.body) > limits.THREAD_THRESHOLD:
            self._decoded = await anyio.to_thread.run_sync(self._decode_large, limiter=limiter)
        return self.body

    async def release_large(self) -> None:
        """Drop a large decoded body in a worker thread: freeing a few hundred thousand objects is one
        C call that would otherwise hold the event loop for tens of milliseconds (a stored object
        stays alive in the store and costs nothing here)."""
        if len(self.body) <= limits.THREAD_THRESHOLD or self._decoded is _NOT_DECODED:
            return
        holder = [self._decoded]
        self._decoded = _NOT_DECODED
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(holder.clear)

    def _decode_large(self) -> Any:
        with limits.gc_paused():
            return self._decode_or_error()

    def _decode_or_error(self) -> Any:
        try:
            return self._decode()
        except errors.ApiError as exc:
            # the traceback's frames hold the half-decoded document: let it go here, not on the loop
            exc.__traceback__ = exc.__context__ = exc.__cause__ = None
            return exc

    def json(self) -> Any:
        decoded = self._decoded
        if decoded is _NOT_DECODED:
            decoded = self._decoded = self._decode_or_error()
        if isinstance(decoded, errors.ApiError):
            raise decoded
        return decoded

    def _decode(self) -> Any:
        if not self.body:
            raise errors.bad_request("the request body is empty")
        ctype = self.headers.get("content-type", "application/json").split(";")[0].strip()
        if ctype == "application/vnd.kubernetes.protobuf":
            from tfusion.apiserver import protobuf

            try:
                decoded = protobuf.decode(self.body)
            except protobuf.UnsupportedKind as exc:
                raise errors.ApiError(415, "UnsupportedMediaType", str(exc)) from None
            except protobuf.ProtobufError as exc:
                raise errors.bad_request(f"error decoding protobuf: {exc}") from None
            limits.check_value(decoded, "error decoding protobuf")
            return decoded
        if ctype not in ("application/json", "", "*/*") and not ctype.endswith("+json"):
            if "yaml" in ctype:
                return limits.decode_yaml(self.body)
            raise errors.unsupported_media_type(ctype, ["application/json", "application/yaml"])
        return limits.decode_json(self.body)

    @property
    def wants_table(self) -> bool:
        return "as=Table" in self.headers.get("accept", "")

    @property
    def dry_run(self) -> bool:
        return self.params.get("dryRun") == "All"


class Target:
    """A resource path: which resource, namespace, object name and subresource."""

    __slots__ = ("info", "name", "namespace", "subresource", "watch")

    def __init__(self, info: ResourceInfo, namespace: str | None, name: str, subresource: str, watch: bool) -> None:
        self.info, self.namespace, self.name, self.subresource, self.watch = info, namespace, name, subresource, watch


#: the longest timeout Go can hold (a time.Duration is int64 nanoseconds): a larger timeoutSeconds,
#: up to int64's maximum, is taken and means this
MAX_TIMEOUT_S = strconv.INT64_MAX // 1_000_000_000


def int_param(params: dict[str, str], key: str) -> int | None:
    """An integer query parameter as kube-apiserver reads it (strconv.ParseInt(s, 10, 64)); None when
    absent or empty; anything else Go refuses is a 400 naming the parameter, the value and the grammar."""
    text = params.get(key)
    if not text:
        return None
    try:
        return strconv.parse_int64(text)
    except strconv.IntegerError as exc:
        raise errors.bad_request(
            f"invalid {key} {text[:100]!r}: {exc.reason}; allowed: {strconv.INT64_ALLOWED}"
        ) from None


def list_options(params: dict[str, str]) -> int:
    """The limit of a list; like kube, which decodes all of ListOptions for a list or a deletecollection,
    the parameters only a watch uses must be well-formed too."""
    watch_timeout(params)
    resource_version(params)
    return int_param(params, "limit") or 0


def resource_version(params: dict[str, str]) -> str | None:
    """resourceVersion, where given: a uint64 in decimal, as the storage layer parses it."""
    text = params.get("resourceVersion") or None
    if text is not None:
        try:
            strconv.parse_uint64(text)
        except strconv.IntegerError as exc:
            raise errors.bad_request(
                f"invalid resourceVersion {text[:100]!r}: {exc.reason}; allowed: {strconv.UINT64_ALLOWED}"
            ) from None
    return text


def watch_timeout(params: dict[str, str]) -> float | None:
    """timeoutSeconds is an int64 in kube; a negative one would end the watch at once by accident, so
    it is refused (kube takes it); the largest values are capped at what Go's timers can hold."""
    value = int_param(params, "timeoutSeconds")
    if value is None:
        return None
    if value < 0:
        raise errors.bad_request(
            f"invalid timeoutSeconds {params['timeoutSeconds']!r}: must be a non-negative whole number of seconds"
        )
    return float(min(value, MAX_TIMEOUT_S))


_DELETE_OPTION_TYPES: dict[str, tuple[type, ...]] = {
    "preconditions": (dict,),
    "propagationPolicy": (str,),
    "orphanDependents": (bool,),
    "dryRun": (list,),
}


_TYPE_NAMES = {dict: "an object", str: "a string", bool: "a boolean", list: "a list"}


def check_delete_options(options: dict[str, Any]) -> None:
    """DeleteOptions fields of the wrong type are the caller's mistake: 400 naming the field."""
    for key, types in _DELETE_OPTION_TYPES.items():
        value = options.get(key)
        if value is not None and not isinstance(value, types):
            raise errors.bad_request(
                f"DeleteOptions.{key}: {_brief(value)} is not {_TYPE_NAMES[types[0]]}"
            )
    preconditions = options.get("preconditions") or {}
    for key in ("uid", "resourceVersion"):
        value = preconditions.get(key)
        if value is not None and not isinstance(value, str):
            raise errors.bad_request(f"DeleteOptions.preconditions.{key}: {_brief(value)} is not a string")
    grace = options.get("gracePeriodSeconds")
    if grace is not None and (
        not isinstance(grace, int) or isinstance(grace, bool) or not 0 <= grace <= strconv.INT64_MAX
    ):
        # a JSON integer, as Go decodes an int64 field: not a string, a fraction or a boolean
        raise errors.bad_request(
            f"DeleteOptions.gracePeriodSeconds: {_brief(grace)} is not an integer from 0 to {strconv.INT64_MAX}"
        )


def _brief(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


async def respond(send: Send, code: int, body: Any, headers: Mapping[str, str] | None = None) -> None:
    await send_bytes(send, code, orjson.dumps(body), extra=headers)


async def send_bytes(send: Send, code: int, body: bytes, content_type: bytes = JSON,
                     extra: Mapping[str, str] | None = None) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    if extra:
        headers += [(name.lower().encode(), value.encode()) for name, value in extra.items()]
    await send({"type": "http.response.start", "status": code, "headers": headers})
    await send({"type": "http.response.body", "body": body})
