"""The webhook's HTTP edge: `POST /mutate-v1-pod`, AdmissionReview admission.k8s.io/v1, typed.

Why a module of its own: the wire format (AdmissionReview request and response as msgspec
Structs) and the Litestar app are shared by the controller's webhook and the benchmark's bare
echo endpoint, so the two are measured with the same edge. A body that is not an AdmissionReview
(bad JSON, wrong apiVersion or kind, no request) is answered 400 with the field that is wrong;
every decision about the pod comes back as an AdmissionReview with HTTP 200.

Every body is untrusted (a caller without the API server's client certificate is refused by the
TLS handshake when client authentication is on, but the edge must not rely on it): nesting too
deep for the decoder, and a pod object that `tfusion.api.documents` refuses (deeper than 100
levels, an integer beyond 64 bits, a number that is not finite) are 400s, never a traceback.
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import orjson
from litestar.handlers import asgi
from litestar.types import HTTPResponseStartEvent, Receive, Scope, Send

from tfusion.api import documents
from tfusion.api.jsontypes import JsonObject
from tfusion.controller.webhook.patch import Op
from tfusion.web import ErrorBody, HttpError, make_app, receive_body
from tfusion.web.arrived import first_message

PATH = "/mutate-v1-pod"
REVIEW_API_VERSION = "admission.k8s.io/v1"
#: a Pod manifest may be up to 3 MiB, as on the embedded API server
MAX_REVIEW_BYTES = 3 * 1024 * 1024 + 64 * 1024


class GroupVersionKind(msgspec.Struct):
    group: str = ""
    version: str = ""
    kind: str = ""


class GroupVersionResource(msgspec.Struct):
    group: str = ""
    version: str = ""
    resource: str = ""


class AdmissionRequest(msgspec.Struct):
    """The fields of `request` the webhook reads; others are accepted and ignored."""

    uid: str
    operation: str
    kind: GroupVersionKind = msgspec.field(default_factory=GroupVersionKind)
    resource: GroupVersionResource = msgspec.field(default_factory=GroupVersionResource)
    subResource: str = ""
    namespace: str = ""
    name: str = ""
    #: the object as sent, undecoded (empty when absent): `pod()` decodes it, and its bytes key the
    #: webhook's memo of pods already mutated
    object: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)
    dryRun: bool = False

    def pod(self) -> JsonObject | None:
        """The object as a JSON document; None when there is none or it is not a JSON object.
        Raises HttpError 400 for a document out of bounds (see the module docstring)."""
        if not self.object:
            return None
        try:
            found = documents.load_json(bytes(self.object))
        except documents.DocumentError as exc:
            raise _out_of_bounds(exc) from None
        return found if isinstance(found, dict) else None


def checked_pod(decoded: object, sent: bytes) -> JsonObject | None:
    """`AdmissionRequest.pod()` for an object already decoded from `sent` (by orjson, as
    `documents.load_json` decodes)."""
    try:
        documents.check_decoded(decoded, sent)
    except documents.DocumentError as exc:
        raise _out_of_bounds(exc) from None
    return decoded if isinstance(decoded, dict) else None


def _out_of_bounds(exc: documents.DocumentError) -> HttpError:
    return HttpError(400, ErrorBody(error=f"request.object: {exc.problem}", field="request.object"))


class AdmissionReview(msgspec.Struct):
    apiVersion: str
    kind: str
    request: AdmissionRequest | None = None


class AdmissionStatus(msgspec.Struct, omit_defaults=True):
    code: int
    message: str
    status: str = "Failure"
    reason: str = ""


class AdmissionResponse(msgspec.Struct, omit_defaults=True):
    uid: str
    allowed: bool
    patchType: str | None = None
    patch: str | None = None
    status: AdmissionStatus | None = None
    warnings: list[str] | None = None


class AdmissionReviewAnswer(msgspec.Struct):
    response: AdmissionResponse
    apiVersion: str = REVIEW_API_VERSION
    kind: str = "AdmissionReview"


_decoder = msgspec.json.Decoder(AdmissionReview)
_encoder = msgspec.json.Encoder()


def encode_patch(patch_ops: list[Op]) -> str:
    """An RFC 6902 patch as AdmissionResponse.patch carries it (base64 of its JSON)."""
    return base64.b64encode(orjson.dumps(patch_ops)).decode()


def allowed(uid: str, patch: str = "") -> AdmissionResponse:
    """Allowed, with `patch` (from `encode_patch`) when there is anything to change."""
    if not patch:
        return AdmissionResponse(uid=uid, allowed=True)
    return AdmissionResponse(uid=uid, allowed=True, patchType="JSONPatch", patch=patch)


def denied(uid: str, code: int, message: str) -> AdmissionResponse:
    reason = "BadRequest" if code == 400 else "InternalError" if code >= 500 else ""
    return AdmissionResponse(uid=uid, allowed=False, status=AdmissionStatus(code=code, message=message, reason=reason))


def decode_review(body: bytes) -> AdmissionRequest:
    try:
        review = _decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise HttpError(400, ErrorBody(error=f"not an AdmissionReview: {exc}", field="body")) from None
    except msgspec.DecodeError as exc:
        raise HttpError(400, ErrorBody(error=f"not JSON: {exc}", field="body")) from None
    except RecursionError:  # msgspec gives up on nesting deeper than the interpreter's recursion limit
        raise HttpError(400, ErrorBody(error="not an AdmissionReview: nested too deep", field="body")) from None
    if review.apiVersion != REVIEW_API_VERSION or review.kind != "AdmissionReview":
        raise HttpError(400, ErrorBody(error=f"expected apiVersion {REVIEW_API_VERSION}, kind AdmissionReview; got "
                                             f"{review.apiVersion!r}, {review.kind!r}", field="apiVersion"))
    if review.request is None:
        raise HttpError(400, ErrorBody(error="the AdmissionReview has no request", field="request"))
    return review.request


Reviewer = Callable[[AdmissionRequest], Awaitable[AdmissionResponse]]


#: the scope key under which the direct route hands Litestar what it raised (see `webhook_app`)
_FAILED = "tfusion.webhook.failed"


def webhook_app(review: Reviewer, *, title: str = "tfusion pod webhook") -> Any:
    """The ASGI app serving `review` on POST /mutate-v1-pod.

    The route speaks ASGI itself, and a POST to it does not go through Litestar at all: Litestar's
    request and response objects cost about 0.1 ms a review and its router and middleware another
    0.04 ms (measured, more than a review answered from the memo), and this route needs none of
    them. Everything else (other paths and methods, the lifespan) is the Litestar app's, and so
    are the route's refusals: what the direct route raises before it answers is raised again by
    the Litestar route (`_FAILED` in the scope), so that make_app's exception handlers answer it
    (an HttpError as its JSON ErrorBody, anything else as a logged 500); 405 for another method
    names POST in `Allow`."""

    async def answer(scope: Scope, receive: Receive) -> bytes:
        body = await _review_body(scope, receive)
        return _encoder.encode(AdmissionReviewAnswer(response=await review(decode_review(body))))

    @asgi(PATH)
    async def mutate(scope: Scope, receive: Receive, send: Send) -> None:
        failed = scope.get(_FAILED)  # our own key, set by `edge`
        if isinstance(failed, BaseException):
            raise failed
        if scope.get("method") != "POST":
            raise HttpError(405, ErrorBody(error=f"{scope.get('method')} is not allowed on {PATH}; allowed: POST",
                                           allowed=["POST"]), headers={"Allow": "POST"})
        await _send_answer(send, await answer(scope, receive))

    app = make_app([mutate], title=title)

    async def edge(scope: Any, receive: Receive, send: Send) -> None:  # Any: uvicorn's plain dict
        if scope["type"] != "http" or scope.get("method") != "POST" or scope.get("path") != PATH:
            await app(scope, receive, send)
            return
        try:
            payload = await answer(scope, receive)
        except Exception as exc:  # answered by the Litestar route, as if raised there
            failing: Any = {**scope, _FAILED: exc}
            await app(failing, receive, send)
            return
        await _send_answer(send, payload)

    return edge


async def _send_answer(send: Send, payload: bytes) -> None:
    start: HTTPResponseStartEvent = {"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"application/json"), (b"content-length", b"%d" % len(payload))]}
    await send(start)
    await send({"type": "http.response.body", "body": payload, "more_body": False})


#: a body this small, arrived whole, is taken as it is (`_review_body`)
_SMALL_BODY = 256 * 1024


async def _review_body(scope: Scope, receive: Receive) -> bytes:
    """The review's body, as `receive_body` reads it. A review of a few KiB has arrived by the
    time the route runs: then its one message is taken as it is, without receive_body's deadline
    (tfusion/web/arrived.py). Otherwise, or when anything is out of the ordinary, receive_body
    reads it, starting with what has already been received."""
    declared = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"content-length"), "")
    message, rest = first_message(receive)
    if message is not None:
        body = message.get("body", b"") if message.get("type") == "http.request" else None
        if (isinstance(body, bytes) and not message.get("more_body", False) and len(body) <= _SMALL_BODY
                and (not declared or (declared.isdigit() and int(declared) <= MAX_REVIEW_BYTES))):
            return body
    return await receive_body(rest, limit=MAX_REVIEW_BYTES, declared=declared, target=f"POST {PATH}")
