"""Kubernetes `metav1.Status` errors, raised anywhere in request handling and rendered once.

kube-apiserver clients (kr8s, kubectl, client-go) branch on `reason` and `code`, so every failure
the embedded server reports carries the same reason, code and wording that kube-apiserver uses.
"""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """A request failed; `status()` is the metav1.Status body that goes on the wire."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        *,
        details: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        self.headers = headers or {}

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body


def qualified(plural: str, group: str) -> str:
    return f"{plural}.{group}" if group else plural


def _details(name: str, group: str, kind: str) -> dict[str, Any]:
    details: dict[str, Any] = {"kind": kind}
    if name:
        details["name"] = name
    if group:
        details["group"] = group
    return details


def not_found(plural: str, group: str, name: str) -> ApiError:
    return ApiError(
        404, "NotFound", f'{qualified(plural, group)} "{name}" not found', details=_details(name, group, plural)
    )


def already_exists(plural: str, group: str, name: str) -> ApiError:
    return ApiError(
        409,
        "AlreadyExists",
        f'{qualified(plural, group)} "{name}" already exists',
        details=_details(name, group, plural),
    )


def conflict(plural: str, group: str, name: str, why: str | None = None) -> ApiError:
    why = why or "the object has been modified; please apply your changes to the latest version and try again"
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {qualified(plural, group)} "{name}": {why}',
        details=_details(name, group, plural),
    )


def invalid(kind: str, group: str, name: str, causes: list[tuple[str, str, str]]) -> ApiError:
    """422 Invalid; each cause is (field path, reason such as FieldValueInvalid, message)."""
    qualified_kind = f"{kind}.{group}" if group else kind
    texts = [f"{field}: {message}" if field else message for field, _, message in causes]
    summary = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    details = _details(name, group, kind)
    details["causes"] = [{"reason": reason, "message": message, "field": field} for field, reason, message in causes]
    return ApiError(422, "Invalid", f'{qualified_kind} "{name}" is invalid: {summary}', details=details)


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def forbidden(plural: str, group: str, name: str, why: str) -> ApiError:
    return ApiError(
        403,
        "Forbidden",
        f'{qualified(plural, group)} "{name}" is forbidden: {why}',
        details=_details(name, group, plural),
    )


def method_not_allowed(method: str) -> ApiError:
    return ApiError(
        405, "MethodNotAllowed", f"the server does not allow this method on the requested resource ({method})"
    )


def unsupported_media_type(content_type: str, allowed: list[str]) -> ApiError:
    return ApiError(
        415,
        "UnsupportedMediaType",
        f"the body of the request was in an unknown format - accepted media types include: "
        f"{', '.join(allowed)} (got {content_type or 'none'!r})",
    )


def expired(message: str) -> ApiError:
    return ApiError(410, "Expired", message)


def gone(message: str) -> ApiError:
    return ApiError(410, "Gone", message)


def unauthorized() -> ApiError:
    return ApiError(401, "Unauthorized", "Unauthorized")


def not_found_path(path: str) -> ApiError:
    return ApiError(
        404,
        "NotFound",
        f"the server could not find the requested resource ({path})",
        details={"causes": [{"reason": "UnexpectedServerResponse", "message": "404 page not found"}]},
    )
