"""Object names as kube-apiserver validates them: a DNS subdomain for most kinds, a DNS label for
a few, a path segment for events.

It sits in `api/` because two writers check names before an object exists: the embedded API
server on every create, and the controller's admission webhook, which names a
TensorFusionWorkload after the pod and must refuse a name the API server would refuse.
Each check returns causes in kube's StatusCause shape (field, reason, message).
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["LABEL_MSG", "SUBDOMAIN_MSG", "Cause", "DNS1123_LABEL", "forbidden", "invalid_value", "required",
           "validate_name"]

Cause = tuple[str, str, str]  # (field path, reason, message)

_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_PATH_SEGMENT_BAD = ("/", "%")

SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used "
    "for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
    "start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for "
    "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)

#: resources whose names are DNS labels rather than subdomains
LABEL_NAMED = {"/namespaces", "/services"}
#: resources whose names only need to be valid path segments (everything else is a DNS subdomain,
#: ConfigMaps, Secrets, ServiceAccounts and Leases included, as kube-apiserver validates them)
PATH_NAMED = {"/events", "events.k8s.io/events"}


def invalid_value(field: str, value: Any, why: str) -> Cause:
    return field, "FieldValueInvalid", f"Invalid value: {_quote(value)}: {why}"


def required(field: str, why: str = "") -> Cause:
    return field, "FieldValueRequired", "Required value" + (f": {why}" if why else "")


def forbidden(field: str, why: str) -> Cause:
    return field, "FieldValueForbidden", f"Forbidden: {why}"


def _quote(value: Any) -> str:
    if isinstance(value, str):
        return '"' + value.replace('"', '\\"') + '"'
    return str(value)


def validate_name(storage_key: str, name: str) -> list[Cause]:
    if storage_key in PATH_NAMED:
        if name in (".", "..") or any(c in name for c in _PATH_SEGMENT_BAD):
            return [invalid_value("metadata.name", name, "may not contain '/' or '%' and may not be '.' or '..'")]
        return []
    if storage_key in LABEL_NAMED:
        if len(name) > 63 or not DNS1123_LABEL.fullmatch(name):
            return [
                invalid_value(
                    "metadata.name", name, LABEL_MSG if len(name) <= 63 else "must be no more than 63 characters"
                )
            ]
        return []
    if len(name) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(name):
        return [
            invalid_value(
                "metadata.name", name, SUBDOMAIN_MSG if len(name) <= 253 else "must be no more than 253 characters"
            )
        ]
    return []
