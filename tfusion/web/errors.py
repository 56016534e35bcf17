"""The one error contract of the controller's and the hypervisor's HTTP edge (`make_app` installs it).

The edge exists so that a client of either role meets one error contract: every non-2xx answer is
JSON `ErrorBody` (`{"error": "<message>"}` plus optional structured fields), whether a handler
refused the call (`HttpError`), Litestar's routing or validation did (404, 405 with `Allow`, 400
naming the parameter), or a bug did (500, logged with its traceback). `/readyz`'s 503 keeps its own
body: probes read its conditions. The OpenAPI document declares these error bodies, and
`raw_body` documents request bodies that a handler reads as raw bytes (a YAML manifest, a body
whose fields it checks one by one to name them in its errors). A body over its route's limit is
refused here too (413, `body_limit`), whether Litestar or `tfusion.web.bodies` finds it.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Annotated, Any

import msgspec
from litestar import Litestar, MediaType, Request, Response
from litestar.di import Provide
from litestar.exceptions import HTTPException, MethodNotAllowedException, NotFoundException, ValidationException
from litestar.handlers import HTTPRouteHandler
from litestar.openapi import ResponseSpec
from litestar.openapi.spec import Operation, Reference
from litestar.params import Body
from msgspec import UNSET, UnsetType

#: the name the edge has always logged under (tests and log filters select it)
log = logging.getLogger("tfusion.web")


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



# --- a body over its route's limit ----------------------------------------------------------------

def body_limit(request: Request[Any, Any, Any]) -> float:
    """The route's `request_max_body_size` (the app's DEFAULT_MAX_BODY_BYTES unless it sets one)."""
    return request.route_handler.resolve_request_max_body_size() or math.inf


def _too_large(request: Request[Any, Any, Any], limit: float, size: int | None) -> HttpError:
    return _body_too_large(f"{request.method} {request.url.path}", limit, size)


def _body_too_large(target: str, limit: float, size: int | None) -> HttpError:
    got = f" (Content-Length {size})" if size is not None else ""
    return HttpError(413, f"request body too large{got}: {target} takes at most {limit:.0f} bytes",
                     headers={"Connection": "close"})



_MISSING_PARAMETER = re.compile(r"parameter '([^']+)'")


def _problem_text(problem: Mapping[str, object]) -> tuple[str, str]:
    """(field, text) of one of Litestar's validation problems (each value is only turned into text)."""
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
