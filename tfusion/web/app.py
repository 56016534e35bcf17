"""The Litestar app of the controller and of the hypervisor (`make_app`): the error edge
(tfusion.web.errors), health/readiness bookkeeping, the Prometheus mount for a role's own registry,
and the app-wide before-request hook.

The hook reads the body of a route whose body Litestar parses within the route's limit and refuses
it when it nests too deep, and holds integer query and path parameters to Go's `strconv.ParseInt`
grammar. Only GET and HEAD reach the raw /metrics mount; other methods get a clean 405.
"""

from __future__ import annotations

import gzip
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypedDict, get_args
from urllib.parse import parse_qs, parse_qsl, unquote, urlencode

import anyio
import prometheus_client
from litestar import Litestar, Request, Response, get
from litestar.handlers import HTTPRouteHandler, asgi
from litestar.openapi import OpenAPIConfig
from litestar.types import HTTPResponseBodyEvent, HTTPResponseStartEvent, Receive, Scope, Send
from litestar.utils.scope.state import ScopeState
from prometheus_client import exposition
from prometheus_client.metrics_core import Metric

from tfusion.api.strconv import INT64_ALLOWED, IntegerError, parse_int64
from tfusion.web.bodies import DEFAULT_MAX_BODY_BYTES, _refuse_deep_json, read_body
from tfusion.web.errors import (
    _INJECTED,
    EXCEPTION_HANDLERS,
    ErrorBody,
    HttpError,
    _document_errors,
    _json_errors_only,
    error_response,
)


class ReadinessCondition(TypedDict):
    name: str
    ready: bool
    message: str


class ReadinessBody(TypedDict):
    """What /readyz answers: "ready" or "not ready", and every condition."""

    status: str
    conditions: list[ReadinessCondition]


class Readiness:
    """Named readiness conditions; /readyz is 200 only when every one is true, and lists them all."""

    def __init__(self) -> None:
        self._conditions: dict[str, tuple[bool, str]] = {}

    def set(self, name: str, ready: bool, message: str = "") -> None:
        self._conditions[name] = (ready, message)

    def holds(self, name: str) -> bool:
        """The condition `name` is set and true."""
        return self._conditions.get(name, (False, ""))[0]

    @property
    def ready(self) -> bool:
        return bool(self._conditions) and all(ok for ok, _ in self._conditions.values())

    def body(self) -> ReadinessBody:
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
    def readyz() -> Response[ReadinessBody]:
        return Response(readiness.body(), status_code=200 if readiness.ready else 503)

    return [healthz, readyz]


_METRICS_METHODS = ("GET", "HEAD")


class _Collected:
    """Families collected already, as the encoders take them (anything with `collect()`)."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def _exposition(families: list[Metric], accept: str, accept_encoding: str) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """The scrape's body and headers, in the format `accept` asks (text or OpenMetrics), gzipped
    when `accept_encoding` allows, as prometheus_client's own handler answers."""
    encoder, content_type = exposition.choose_encoder(accept)
    body = encoder(_Collected(families))
    headers = [(b"content-type", content_type.encode())]
    if exposition.gzip_accepted(accept_encoding):
        body = gzip.compress(body)
        headers.append((b"content-encoding", b"gzip"))
    return body, headers


def _header(scope: Scope, name: bytes) -> str:
    return ",".join(value.decode("latin-1") for key, value in scope.get("headers", ()) if key.lower() == name)


def metrics_handler(registry: prometheus_client.CollectorRegistry,
                    prepare: Callable[[], Awaitable[None]] | None = None) -> Any:
    """GET /metrics. The families are collected on the event loop (collectors read the process's
    state, which only the loop changes) and written out in a worker thread: a controller billing
    100,000 workers answers about 100 MB, 20 s of formatting, which on the loop stopped its Lease
    renewals (measured: the leader lost the Lease at every scrape). `prepare`, awaited first, makes
    what collecting then only reads (the controller's families of its last tick, in a thread)."""

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
        names = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("name[]")
        source = registry.restricted_registry(names) if names else registry
        if prepare is not None:
            await prepare()
        families = list(source.collect())  # no await since `prepare`: what it made is still current
        body, headers = await anyio.to_thread.run_sync(_exposition, families, _header(scope, b"accept"),
                                                       _header(scope, b"accept-encoding"))
        start: HTTPResponseStartEvent = {"type": "http.response.start", "status": 200, "headers": headers}
        await send(start)
        end: HTTPResponseBodyEvent = {"type": "http.response.body", "body": b"" if method == "HEAD" else body,
                                      "more_body": False}
        await send(end)

    return metrics



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
