"""Mutating admission webhooks, called the way kube-apiserver calls them.

For a write the REST layer is about to persist, `run_mutating_webhooks` walks every
MutatingWebhookConfiguration (sorted by name) and every webhook in it (in order), and for each
webhook whose `rules`, `namespaceSelector` and `objectSelector` match the request it POSTs an
AdmissionReview (v1, or v1beta1 if that is all the webhook accepts) over HTTPS, verifying the
server with the webhook's `caBundle`. A JSONPatch in the answer is applied before the next webhook
sees the object; a denial stops the request. Call failures (refused, TLS, timeout, a malformed
answer) obey `failurePolicy`: Fail (the default) rejects the request, Ignore skips the webhook.
`reinvocationPolicy: IfNeeded` webhooks run once more when a later webhook changed the object.

The caller may present a client certificate (`ClientCertificate`), as kube-apiserver does for the
webhooks its AdmissionConfiguration names a kubeconfig user with a client certificate for: the
embedded server presents its own to every webhook (webhooks.py), so a webhook can tell it from a
stranger in the TLS handshake.

Errors come back as `AdmissionError` with the HTTP code, reason and message kube-apiserver uses:
a denial is `admission webhook "<name>" denied the request: <message>` with the webhook's code
(at least 400); a failed call under Fail is 500 InternalError `Internal error occurred: failed
calling webhook "<name>": ...`; an unappliable patch is 500 as well.

Not implemented: `matchConditions` (CEL) are not evaluated (the webhook is called as if they held);
`matchPolicy: Equivalent` matches like Exact, since every resource here is served in one version.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import functools
import logging
import ssl
import tempfile
import uuid
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson

from tfusion.api.selectors import SelectorError, label_selector_from_dict
from tfusion.apiserver.patch import PatchError, json_patch
from tfusion.leanhttp import LeanTransport

__all__ = [
    "AdmissionAttributes",
    "AdmissionError",
    "ClientCertificate",
    "build_admission_review",
    "run_mutating_webhooks",
    "webhook_matches",
]

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_SECONDS = 10
DEFAULT_SERVICE_PORT = 443
_REVIEW_VERSIONS = ("v1", "v1beta1")
_DRY_RUN_SAFE = ("None", "NoneOnDryRun")

ResolveService = Callable[[str, str, int], str]


@dataclass
class AdmissionAttributes:
    """What is being admitted: the request as the REST layer understood it."""

    operation: str  # CREATE | UPDATE | DELETE | CONNECT
    group: str
    version: str
    resource: str  # plural, e.g. "pods"
    subresource: str  # "" or e.g. "status"
    kind: dict[str, str]  # {"group", "version", "kind"}
    namespace: str  # "" for cluster-scoped objects
    name: str
    obj: dict[str, Any] | None
    old_obj: dict[str, Any] | None
    user_info: dict[str, Any]
    dry_run: bool = False
    options: dict[str, Any] | None = field(default=None)  # CreateOptions / UpdateOptions / ...


class AdmissionError(Exception):
    """The request is refused by admission; the REST layer answers a Status with these fields."""

    def __init__(self, code: int, reason: str, message: str):
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message


class _CallFailed(Exception):
    """Internal: a webhook could not be called or answered nonsense; failurePolicy decides."""


# ---------------------------------------------------------------------------------------------
# matching


def _listed(values: Any, wanted: str) -> bool:
    return isinstance(values, list) and ("*" in values or wanted in values)


def _resource_listed(resources: Any, resource: str, subresource: str) -> bool:
    if not isinstance(resources, list):
        return False
    for entry in resources:
        if not isinstance(entry, str):
            continue
        res, _, sub = entry.partition("/")
        if (res == "*" or res == resource) and (sub == "*" or sub == subresource):
            return True
    return False


def _rule_matches(rule: Mapping[str, Any], attrs: AdmissionAttributes) -> bool:
    scope = rule.get("scope") or "*"
    if scope == "Cluster" and attrs.namespace:
        return False
    if scope == "Namespaced" and not attrs.namespace:
        return False
    return (
        _listed(rule.get("operations"), attrs.operation)
        and _listed(rule.get("apiGroups"), attrs.group)
        and _listed(rule.get("apiVersions"), attrs.version)
        and _resource_listed(rule.get("resources"), attrs.resource, attrs.subresource)
    )


def _labels(obj: Mapping[str, Any] | None) -> dict[str, str] | None:
    if obj is None:
        return None
    labels = (obj.get("metadata") or {}).get("labels")
    return labels if isinstance(labels, dict) else {}


def webhook_matches(
    webhook: Mapping[str, Any], attrs: AdmissionAttributes, namespace_labels: Mapping[str, str]
) -> bool:
    """Whether kube-apiserver would call `webhook` for this request (rules and selectors).

    A malformed selector raises SelectorError (the caller treats it as a call failure).
    """
    if not any(_rule_matches(rule, attrs) for rule in webhook.get("rules") or [] if isinstance(rule, Mapping)):
        return False
    name = webhook.get("name", "?")
    object_selector = label_selector_from_dict(
        webhook.get("objectSelector") or {}, field=f"webhook {name!r} objectSelector"
    )
    if not object_selector.empty:
        new, old = _labels(attrs.obj), _labels(attrs.old_obj)
        if not (
            (new is not None and object_selector.matches(new)) or (old is not None and object_selector.matches(old))
        ):
            return False
    namespace_selector = label_selector_from_dict(
        webhook.get("namespaceSelector") or {}, field=f"webhook {name!r} namespaceSelector"
    )
    if namespace_selector.empty:
        return True
    if attrs.group == "" and attrs.resource == "namespaces":
        # a Namespace is judged by its own labels
        own = _labels(attrs.obj) if attrs.obj is not None else _labels(attrs.old_obj)
        return namespace_selector.matches(own or {})
    if not attrs.namespace:
        return True  # cluster-scoped objects are not subject to namespaceSelector
    return namespace_selector.matches(namespace_labels)


# ---------------------------------------------------------------------------------------------
# the AdmissionReview


def build_admission_review(attrs: AdmissionAttributes, review_version: str = "v1") -> dict[str, Any]:
    """The AdmissionReview request kube-apiserver sends for these attributes."""
    resource = {"group": attrs.group, "version": attrs.version, "resource": attrs.resource}
    request: dict[str, Any] = {
        "uid": str(uuid.uuid4()),
        "kind": dict(attrs.kind),
        "resource": resource,
        "requestKind": dict(attrs.kind),
        "requestResource": dict(resource),
        "operation": attrs.operation,
        "userInfo": attrs.user_info,
        "object": attrs.obj,
        "oldObject": attrs.old_obj,
        "dryRun": attrs.dry_run,
        "options": attrs.options,
    }
    if attrs.subresource:
        request["subResource"] = request["requestSubResource"] = attrs.subresource
    if attrs.name:
        request["name"] = attrs.name
    if attrs.namespace:
        request["namespace"] = attrs.namespace
    return {"apiVersion": f"admission.k8s.io/{review_version}", "kind": "AdmissionReview", "request": request}


# ---------------------------------------------------------------------------------------------
# calling one webhook


@dataclass(frozen=True)
class ClientCertificate:
    """The certificate (PEM, with its chain) and key (PEM) presented to webhooks."""

    cert_pem: bytes
    key_pem: bytes


@functools.lru_cache(maxsize=64)
def _tls_context(ca_bundle: str, client: ClientCertificate | None = None) -> ssl.SSLContext:
    if not ca_bundle:
        context = ssl.create_default_context()
    else:
        try:
            pem = base64.b64decode(ca_bundle, validate=True).decode("ascii")
            context = ssl.create_default_context(cadata=pem)
        except (binascii.Error, UnicodeDecodeError, ValueError, ssl.SSLError) as exc:
            raise _CallFailed(f"clientConfig.caBundle is not base64-encoded PEM certificates: {exc}") from None
    if client is not None:
        _load_client(context, client)
    return context


def _load_client(context: ssl.SSLContext, client: ClientCertificate) -> None:
    """`load_cert_chain` reads files only: both go to a private temporary directory for the call."""
    with tempfile.TemporaryDirectory(prefix="tfusion-webhook-client-") as directory:
        cert_file, key_file = Path(directory) / "tls.crt", Path(directory) / "tls.key"
        cert_file.write_bytes(client.cert_pem)
        key_file.touch(mode=0o600)
        key_file.write_bytes(client.key_pem)
        context.load_cert_chain(str(cert_file), str(key_file))


def _target(webhook: Mapping[str, Any], resolve_service: ResolveService) -> tuple[str, str | None]:
    """(URL to POST to, TLS server name to verify when it differs from the URL's host)."""
    config = webhook.get("clientConfig") or {}
    timeout = _timeout_seconds(webhook)
    if config.get("url"):
        url = str(config["url"])
        parts = urlsplit(url)
        if parts.scheme != "https" or not parts.hostname:
            raise _CallFailed(f"clientConfig.url {url!r} must be an https URL")
        separator = "&" if parts.query else "?"
        return f"{url}{separator}timeout={timeout}s", None
    service = config.get("service")
    if not isinstance(service, Mapping) or not service.get("name") or not service.get("namespace"):
        raise _CallFailed("clientConfig needs a url or a service with namespace and name")
    port = int(service.get("port") or DEFAULT_SERVICE_PORT)
    try:
        host = resolve_service(str(service["namespace"]), str(service["name"]), port)
    except Exception as exc:  # whatever the lookup raises, failurePolicy decides
        raise _CallFailed(f"service {service['namespace']}/{service['name']}:{port} not resolvable: {exc}") from None
    path = str(service.get("path") or "/")
    if not path.startswith("/"):
        path = "/" + path
    return f"https://{host}{path}?timeout={timeout}s", f"{service['name']}.{service['namespace']}.svc"


def _timeout_seconds(webhook: Mapping[str, Any]) -> int:
    value = webhook.get("timeoutSeconds")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else DEFAULT_TIMEOUT_SECONDS


def _review_version(webhook: Mapping[str, Any]) -> str:
    accepted = webhook.get("admissionReviewVersions") or ["v1"]
    for version in accepted:
        if version in _REVIEW_VERSIONS:
            return str(version)
    raise _CallFailed(f"webhook accepts no AdmissionReview version this server sends ({accepted}; we send v1, v1beta1)")


#: kept-alive connections per event loop, TLS context, verified server name and address: a webhook
#: is called for every admitted object, and a TLS handshake per call cost more than the call itself
#: (tens of ms on 2 cores), as did httpx's per-request bookkeeping. One transport per TLS context
#: AND verified server name: two services resolved to one address must not share a connection
#: verified for the other's name.
_TRANSPORTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[int, str, str, int], LeanTransport]] = \
    weakref.WeakKeyDictionary()
_MAX_TRANSPORTS_PER_LOOP = 16
#: an idle connection is dropped before the 5 s after which common webhook servers (uvicorn, ours)
#: close it
_IDLE_SECONDS = 4.0


def _transport(url: str, context: ssl.SSLContext, server_name: str | None) -> tuple[LeanTransport, str]:
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port or 443
    name = server_name or host
    transports = _TRANSPORTS.setdefault(asyncio.get_running_loop(), {})
    key = (id(context), name, host, port)  # contexts are cached per caBundle, so the id is stable
    transport = transports.get(key)
    if transport is None:
        if len(transports) >= _MAX_TRANSPORTS_PER_LOOP:  # caBundles rotated many times: start over
            for old in transports.values():
                old.close()
            transports.clear()
        transport = transports[key] = LeanTransport(host, port, "", context, name, idle_seconds=_IDLE_SECONDS)
    target = parts.path or "/"
    return transport, f"{target}?{parts.query}" if parts.query else target


async def _post(url: str, body: bytes, context: ssl.SSLContext, server_name: str | None, timeout: int) -> Any:
    transport, target = _transport(url, context, server_name)
    try:
        # an AdmissionReview may be sent again when its kept-alive connection closed before any
        # answer: webhooks are called with sideEffects None/NoneOnDryRun, and kube retries too
        status, answer = await transport.send("POST", target, body, "application/json", timeout, repeatable=True)
    except TimeoutError:
        raise _CallFailed(f'failed to call webhook: Post "{url}": context deadline exceeded') from None
    except (OSError, ConnectionError, ValueError, asyncio.IncompleteReadError) as exc:
        raise _CallFailed(f'failed to call webhook: Post "{url}": {exc or type(exc).__name__}') from None
    if status != 200:
        raise _CallFailed(f"received status code {status} from {url}: {answer[:200].decode(errors='replace')}")
    try:
        return orjson.loads(answer)
    except orjson.JSONDecodeError:
        raise _CallFailed(f"response from {url} is not JSON") from None


def _check_response(answer: Any, review_version: str, uid: str) -> Mapping[str, Any]:
    expected = f"admission.k8s.io/{review_version}"
    if not isinstance(answer, Mapping):
        raise _CallFailed("the webhook answered something other than an AdmissionReview object")
    if answer.get("apiVersion") != expected or answer.get("kind") != "AdmissionReview":
        raise _CallFailed(
            f"expected webhook response of {expected}, Kind=AdmissionReview, "
            f"got {answer.get('apiVersion')}, Kind={answer.get('kind')}"
        )
    response = answer.get("response")
    if not isinstance(response, Mapping):
        raise _CallFailed("webhook response was absent")
    if response.get("uid") != uid:
        raise _CallFailed(f"expected response.uid={uid!r}, got {response.get('uid')!r}")
    if not isinstance(response.get("allowed"), bool):
        raise _CallFailed("webhook response.allowed must be true or false")
    return response


def _denial(name: str, response: Mapping[str, Any]) -> AdmissionError:
    raw_status = response.get("status")
    status: Mapping[str, Any] = raw_status if isinstance(raw_status, Mapping) else {}
    code = status.get("code")
    code = code if isinstance(code, int) and code >= 400 else 400
    reason = str(status.get("reason") or "")
    denied = f'admission webhook "{name}" denied the request'
    if status.get("message"):
        message = f"{denied}: {status['message']}"
    elif reason:
        message = f"{denied}: {reason}"
    else:
        message = f"{denied} without explanation"
    return AdmissionError(code, reason, message)


def _apply_patch(name: str, obj: dict[str, Any], response: Mapping[str, Any], *, owned: bool) -> dict[str, Any]:
    """The object the webhook's patch makes: a copy, or with `owned` `obj` itself, patched in place (a
    failing patch fails the request, so a half-patched object is never used)."""
    raw = response.get("patch")
    if not raw:
        return obj
    patch_type = response.get("patchType")
    if patch_type != "JSONPatch":
        raise AdmissionError(
            500,
            "InternalError",
            f'Internal error occurred: webhook "{name}": unsupported patchType {patch_type!r}',
        )
    try:
        ops = orjson.loads(base64.b64decode(raw, validate=True))
        patched = json_patch(obj, ops, owned=owned, ops_owned=True)  # decoded just now, held by nobody
    except (binascii.Error, ValueError, orjson.JSONDecodeError, PatchError) as exc:
        raise AdmissionError(
            500,
            "InternalError",
            f'Internal error occurred: webhook "{name}" returned an invalid patch: {exc}',
        ) from None
    if not isinstance(patched, dict):
        raise AdmissionError(
            500,
            "InternalError",
            f'Internal error occurred: webhook "{name}" patched the object into a non-object',
        )
    return patched


async def _call(
    webhook: Mapping[str, Any],
    attrs: AdmissionAttributes,
    resolve_service: ResolveService,
    client: ClientCertificate | None = None,
) -> Mapping[str, Any]:
    """POST the review to one webhook; returns its checked `response`. Raises _CallFailed."""
    version = _review_version(webhook)
    context = _tls_context(str((webhook.get("clientConfig") or {}).get("caBundle") or ""), client)
    url, server_name = _target(webhook, resolve_service)
    review = build_admission_review(attrs, version)
    answer = await _post(url, orjson.dumps(review), context, server_name, _timeout_seconds(webhook))
    return _check_response(answer, version, review["request"]["uid"])


# ---------------------------------------------------------------------------------------------
# the chain


@dataclass
class _Invocation:
    webhook: Mapping[str, Any]
    reinvoke: bool
    changed_since: bool = False


async def run_mutating_webhooks(
    configurations: Sequence[Mapping[str, Any]],
    attributes: AdmissionAttributes,
    *,
    namespace_labels: Mapping[str, str],
    resolve_service: ResolveService,
    warnings: list[str] | None = None,
    client: ClientCertificate | None = None,
) -> dict[str, Any]:
    """Run every matching mutating webhook over attributes.obj; returns the (patched) object. The
    caller hands attributes.obj over: the first webhook's patch is applied to it in place.

    `resolve_service(namespace, name, port)` maps a service reference to "host:port".
    Webhook warnings are appended to `warnings` when given; `client` is presented to every
    webhook that asks for a client certificate. Raises AdmissionError.
    With no object (DELETE, CONNECT) webhooks see `object: null` and the result is {}.
    """
    obj: dict[str, Any] = attributes.obj if attributes.obj is not None else {}
    invoked: list[_Invocation] = []
    for config in sorted(configurations, key=lambda c: str((c.get("metadata") or {}).get("name", ""))):
        for webhook in config.get("webhooks") or []:
            if not isinstance(webhook, Mapping):
                continue
            attrs = _with_object(attributes, obj)
            # the object before a patch is only needed to tell whether an earlier webhook should see
            # it again; the first one called patches the caller's object in place (the copy of a pod
            # was about 8 % of a create's cost)
            new_obj = await _run_one(webhook, attrs, namespace_labels, resolve_service, warnings, client,
                                     owned=not invoked)
            if new_obj is None:
                continue
            if invoked and new_obj != obj:
                for earlier in invoked:
                    earlier.changed_since = True
            obj = new_obj
            invoked.append(_Invocation(webhook, webhook.get("reinvocationPolicy") == "IfNeeded"))
    for call in invoked:
        if call.reinvoke and call.changed_since:
            again = await _run_one(
                call.webhook, _with_object(attributes, obj), namespace_labels, resolve_service, warnings, client,
                owned=False,
            )
            obj = obj if again is None else again
    return obj


def _with_object(attributes: AdmissionAttributes, obj: dict[str, Any]) -> AdmissionAttributes:
    return dataclasses.replace(attributes, obj=obj if attributes.obj is not None else None)


async def _run_one(
    webhook: Mapping[str, Any],
    attrs: AdmissionAttributes,
    namespace_labels: Mapping[str, str],
    resolve_service: ResolveService,
    warnings: list[str] | None,
    client: ClientCertificate | None = None,
    *,
    owned: bool,
) -> dict[str, Any] | None:
    """Call one webhook if it matches; the resulting object, or None if it was not called (`owned`: see
    `_apply_patch`)."""
    name = str(webhook.get("name", ""))
    ignore_failures = webhook.get("failurePolicy") == "Ignore"
    try:
        if not webhook_matches(webhook, attrs, namespace_labels):
            return None
    except SelectorError as exc:
        _call_failed(name, ignore_failures, str(exc))
        return None
    if attrs.dry_run and webhook.get("sideEffects") not in _DRY_RUN_SAFE:
        raise AdmissionError(400, "BadRequest", f'admission webhook "{name}" does not support dry run')
    try:
        response = await _call(webhook, attrs, resolve_service, client)
    except _CallFailed as exc:
        _call_failed(name, ignore_failures, str(exc))
        return None
    if warnings is not None:
        warnings.extend(str(w) for w in response.get("warnings") or [] if isinstance(w, str))
    if not response["allowed"]:
        raise _denial(name, response)
    current = attrs.obj if attrs.obj is not None else {}
    return _apply_patch(name, current, response, owned=owned)


def _call_failed(name: str, ignore: bool, detail: str) -> None:
    """Log and carry on under failurePolicy Ignore; raise the 500 kube-apiserver gives under Fail."""
    message = f'failed calling webhook "{name}": {detail}'
    if ignore:
        log.warning("%s (failurePolicy Ignore: continuing)", message)
        return
    raise AdmissionError(500, "InternalError", f"Internal error occurred: {message}")
