"""KubeClient: the one way tfusion talks to a Kubernetes API server (real or embedded).

kr8s provides authentication (kubeconfig, service account, token refresh) and its `call_api`
transport; everything above that is ours: plain-dict objects, pagination, every patch type,
PUT, delete options, a watch that requests bookmarks and a server timeout and has a read timeout,
typed errors that carry the server's Status, and a client-side QPS/burst limit. kr8s's own
`watch()` and `Object.get()` are not used: the first hot-loops on 410 and never times out, the
second polls for two seconds on a miss (see reference/python-stack.md §1.5).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import ssl
import time
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import anyio
import httpx
import kr8s
import kr8s.asyncio
import orjson

from tfusion.api.accessors import Body, items, text
from tfusion.api.jsontypes import JsonMapping, JsonObject
from tfusion.kube.resources import TOKENREVIEWS, ApiResource
from tfusion.leanhttp import LeanTransport

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
#: a path that never exists: handed to kr8s in-cluster so that a stray $KUBECONFIG cannot win
_NO_KUBECONFIG = "/nonexistent/tfusion-in-cluster-kubeconfig"

PATCH_CONTENT_TYPES = {
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "apply": "application/apply-patch+yaml",
}

DEFAULT_SECONDS = 30.0
DEFAULT_TIMEOUT = httpx.Timeout(DEFAULT_SECONDS, connect=10.0)
#: until a watch's answer head has come (its body then streams for as long as the server keeps it)
WATCH_CONNECT_S = 10.0
#: connections kept open to the API server. httpx keeps 20 by default: a controller with more
#: requests in flight (the webhook admits pods concurrently, reconcilers write meanwhile) then
#: closes the extra connections after every request and pays a TLS handshake for the next one.
#: (httpcore scans every pooled connection on each request, so the pool is not made wider still;
#: idle ones are dropped well before the embedded API server's 30 s keep-alive ends)
POOL_LIMITS = httpx.Limits(max_connections=100, max_keepalive_connections=64, keepalive_expiry=20.0)


class _PooledApi(kr8s.asyncio.Api):
    """kr8s's Api whose session keeps as many connections alive as the client uses (the rest of
    the session is built as kr8s 0.20 builds it: its headers, TLS context, timeout and proxy)."""

    async def _create_session(self) -> None:
        headers = {"User-Agent": self.__version__, "content-type": "application/json"}
        if self.auth.token:
            headers["Authorization"] = f"Bearer {self.auth.token}"
        previous: httpx.AsyncClient | None = self._session
        verify: ssl.SSLContext | bool = await self.auth.ssl_context()  # type: ignore[no-untyped-call]
        self._session = httpx.AsyncClient(
            base_url=self.auth.server, headers=headers, verify=verify, timeout=self._timeout,
            follow_redirects=True, proxy=self.auth.proxy, limits=POOL_LIMITS,
        )
        if previous is not None:
            with contextlib.suppress(RuntimeError):
                await previous.aclose()


# --- errors -----------------------------------------------------------------------------------


class Status(TypedDict, total=False):
    """A `Status` object: what the API server answers a failed request with (and what we build
    for a transport failure)."""

    kind: str
    apiVersion: str
    metadata: JsonObject
    status: str
    code: int
    reason: str
    message: str
    details: JsonObject


class KubeError(Exception):
    """The API server refused a request. `status` is its Status object (or one we built for a
    transport failure), `code` the HTTP status, `reason` the Status reason, `message` the
    server's own words."""

    def __init__(self, status: Status, code: int | None = None) -> None:
        self.status: dict[str, Any] = dict(status)
        self.code: int = int(code if code is not None else status.get("code") or 0)
        self.reason: str = str(status.get("reason") or "")
        self.message: str = str(status.get("message") or self.reason or f"HTTP {self.code}")
        super().__init__(f"{self.code} {self.reason}: {self.message}" if self.reason else self.message)


class BadRequest(KubeError):
    """400: the request itself is malformed."""


class Unauthorized(KubeError):
    """401: the credentials were not accepted."""


class Forbidden(KubeError):
    """403: authenticated, but not allowed."""


class NotFound(KubeError):
    """404: no such object (or resource)."""


class Conflict(KubeError):
    """409: the object changed since it was read (stale resourceVersion or precondition)."""


class AlreadyExists(Conflict):
    """409 AlreadyExists: create of a name that is taken."""


class Gone(KubeError):
    """410: the resourceVersion is older than the server's history; re-list."""


class Invalid(KubeError):
    """422: the object failed validation; `status["details"]["causes"]` names the fields."""


class ServerError(KubeError):
    """5xx, 429, or no answer at all (connection refused, reset, timeout): worth retrying."""


_BY_CODE: dict[int, type[KubeError]] = {
    400: BadRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict, 410: Gone,
    422: Invalid, 429: ServerError,
}


def error_from_status(status: Status | str | None, code: int) -> KubeError:
    """The typed error for an HTTP status code and its (possibly missing) Status body."""
    if not isinstance(status, Mapping):
        text = status if isinstance(status, str) else ""
        status = {"kind": "Status", "status": "Failure", "code": code, "message": text or f"HTTP {code}"}
    if code == 409 and status.get("reason") == "AlreadyExists":
        return AlreadyExists(status, code)
    cls = _BY_CODE.get(code) or (ServerError if code >= 500 or code == 0 else KubeError)
    return cls(status, code)


def transport_error(exc: BaseException) -> ServerError:
    return ServerError({"kind": "Status", "status": "Failure", "code": 0, "reason": "ServiceUnavailable",
                        "message": f"no answer from the API server: {type(exc).__name__}: {exc}"}, 0)


def _json_or_text(content: bytes) -> Any:
    try:
        return orjson.loads(content)
    except orjson.JSONDecodeError:
        return content[:500].decode(errors="replace")


#: a body decoder that may leave out or transform parts of the JSON (kube/transforms.py
#: `PrunedDecoder.page`); it raises ValueError for a body not of the shape it knows
BodyDecoder = Callable[[bytes], Any]
#: a watch line's decoder into the event's type and object (`PrunedDecoder.event`)
EventDecoder = Callable[[str | bytes], tuple[str, Any]]


def decode_event(line: str | bytes) -> tuple[str, Any]:
    """A watch line's type and object as the server sent them."""
    event = orjson.loads(line)
    return (str(event.get("type") or ""), event.get("object")) if isinstance(event, dict) else ("", None)


def _decoded(method: str, url: str, content: bytes, decode: BodyDecoder | None = None) -> Any:
    if not content:
        return {}
    try:
        return orjson.loads(content) if decode is None else decode(content)
    except ValueError:
        raise ServerError({"kind": "Status", "code": 0, "reason": "InternalError",
                           "message": f"{method} {url}: the API server answered with non-JSON: "
                                      f"{content[:200]!r}"}, 0) from None


def _from_kr8s(exc: kr8s.ServerError) -> KubeError:
    response = exc.response
    code = response.status_code if response is not None else 0
    body: Any = exc.status
    if response is not None:
        try:
            body = orjson.loads(response.content)
        except (orjson.JSONDecodeError, httpx.ResponseNotRead):
            body = response.text if response.is_closed else exc.status
    return error_from_status(body, code)


# --- rate limit -------------------------------------------------------------------------------


class TokenBucket:
    """A token bucket: `rate` tokens a second, at most `burst` saved up. Callers that find it
    empty sleep until their token is due (reservation style, so waiters are served in order)."""

    def __init__(self, rate: float, burst: int, *, clock: Any = time.monotonic) -> None:
        self.rate = float(rate)
        self.burst = max(1, int(burst))
        self._clock = clock
        self._tokens = float(self.burst)
        self._last = clock()

    def reserve(self) -> float:
        """Take a token; return how long to wait before using it (0 when one was there)."""
        if self.rate <= 0:
            return 0.0
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.rate)
        self._last = now
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate

    async def acquire(self) -> None:
        delay = self.reserve()
        if delay > 0:
            await anyio.sleep(delay)


# --- results ----------------------------------------------------------------------------------


@dataclass
class ObjectList:
    """A complete (all pages) list: the objects and the list's resourceVersion to watch from."""

    items: list[dict[str, Any]] = field(default_factory=list)
    resource_version: str = ""

    def __iter__(self) -> Any:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


WatchEvent = tuple[str, dict[str, Any]]


# --- the client -------------------------------------------------------------------------------


#: ids of the KubeClients opened and not yet closed in this process (`tfusion_kube_clients`)
_OPEN_CLIENTS: set[int] = set()


def live_clients() -> int:
    """How many KubeClients this process has open: one per process is the design (the Manager's)."""
    return len(_OPEN_CLIENTS)


class KubeClient:
    """Plain-dict CRUD, list and watch against one API server. Objects are the JSON the server
    sends; nothing is wrapped. Every request passes the QPS/burst limiter."""

    def __init__(self, api: Any, *, namespace: str = "default", qps: float = 50.0, burst: int = 100) -> None:
        self.api = api
        self.namespace = namespace
        self.limiter = TokenBucket(qps, burst)
        #: the fast path for small requests (tfusion/leanhttp.py); set by `connect` when kr8s uses a token
        self.lean: LeanTransport | None = None
        _OPEN_CLIENTS.add(id(self))

    @classmethod
    async def connect(cls, kube: str, *, namespace: str | None = None, qps: float = 50.0,
                      burst: int = 100, service_account_dir: str = SERVICE_ACCOUNT_DIR) -> KubeClient:
        """`kube` is a kubeconfig path or "in-cluster". In-cluster, pass the pod's namespace:
        kr8s 0.20.15 reports "default" there (its issue #741). kr8s finds the API server from
        KUBERNETES_SERVICE_HOST/PORT and reads the token and CA from `service_account_dir`."""
        if kube == "in-cluster":
            if not Path(service_account_dir).is_dir():
                raise ValueError(f"--kube=in-cluster: no service account at {service_account_dir}; "
                                 "run inside a pod or pass a kubeconfig path")
            kwargs: dict[str, Any] = {"kubeconfig": _NO_KUBECONFIG, "serviceaccount": service_account_dir}
        else:
            path = Path(kube).expanduser()
            if not path.is_file():
                raise ValueError(f"--kube={kube!r}: no kubeconfig file there; expected a kubeconfig path, "
                                 "'in-cluster' or 'embedded'")
            kwargs = {"kubeconfig": str(path)}
        try:
            # Our own Api object, not kr8s.asyncio.api()'s per-loop cached one: roles in one process
            # each close their client on shutdown, and a shared session would cut the others' watches.
            # kr8s asks the server's /version here, so an unreachable server fails now.
            api = await _PooledApi(namespace=namespace, bypass_factory=True, **kwargs)
        except kr8s.ServerError as exc:
            raise _from_kr8s(exc) from None
        except (httpx.TransportError, kr8s.APITimeoutError, OSError) as exc:
            raise transport_error(exc) from None
        except (KeyError, TypeError, ValueError) as exc:  # kr8s reading a malformed kubeconfig
            raise ValueError(f"--kube={kube!r}: the kubeconfig cannot be used: {type(exc).__name__}: {exc}") from None
        client = cls(api, namespace=namespace or api.namespace or "default", qps=qps, burst=burst)
        client.lean = await LeanTransport.for_api(api)
        return client

    async def close(self) -> None:
        _OPEN_CLIENTS.discard(id(self))
        if self.lean is not None:
            self.lean.close()
        session = getattr(self.api, "_session", None)
        if session is not None:
            await session.aclose()

    # --- raw requests ---------------------------------------------------------------------------

    async def request(self, method: str, resource: ApiResource | None = None, *, path: str = "",
                      namespace: str | None = None, params: Mapping[str, str] | None = None,
                      body: Any = None, content_type: str = "application/json",
                      timeout: httpx.Timeout | float | None = None, decode: BodyDecoder | None = None) -> Any:
        """One request; returns the decoded JSON body (through `decode` when given). `path` follows
        the resource's plural ("name", "name/status"), or is the whole path after the group-version
        when `resource` is None (then `version` is "v1")."""
        version = resource.api_version if resource else "v1"
        url = f"{resource.plural}/{path}".rstrip("/") if resource else path
        kwargs: dict[str, Any] = {"timeout": timeout if timeout is not None else DEFAULT_TIMEOUT}
        if params:
            kwargs["params"] = dict(params)
        if body is not None:
            if isinstance(body, str):
                body = body.encode()
            kwargs["content"] = body if isinstance(body, bytes) else orjson.dumps(body)
            kwargs["headers"] = {"Content-Type": content_type}
        await self.limiter.acquire()
        if self.lean is not None:
            answer = await self._lean_request(method, version, namespace, url, params, kwargs.get("content"),
                                              content_type, kwargs["timeout"])
            if answer is not None:
                return _decoded(method, url, answer, decode)
        try:
            async with self.api.call_api(method, version=version, namespace=namespace, url=url,
                                         **kwargs) as response:
                content = response.content
        except kr8s.ServerError as exc:
            raise _from_kr8s(exc) from None
        except (httpx.TransportError, kr8s.APITimeoutError, OSError) as exc:
            raise transport_error(exc) from None
        if self.lean is not None and self.api.auth.token:
            self.lean.token = str(self.api.auth.token)  # kr8s may have re-read it (a 401 came back)
        return _decoded(method, url, content, decode)

    async def _lean_request(self, method: str, version: str, namespace: str | None, url: str,
                            params: Mapping[str, str] | None, body: bytes | None, content_type: str,
                            timeout: httpx.Timeout | float) -> bytes | None:
        """The request on the lean transport: the answer's body, or None for kr8s to do it (a 401)."""
        assert self.lean is not None
        target = self.lean.target(self.api._construct_url(version, "", namespace, url), dict(params or {}))
        seconds = (timeout.read if isinstance(timeout, httpx.Timeout) else timeout) or DEFAULT_SECONDS
        try:
            status, content = await self.lean.send(method, target, body, content_type, seconds)
        except (OSError, ConnectionError, TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
            raise transport_error(exc) from None
        if status == 401:
            self.lean.handed_back += 1
            return None
        if status >= 400:
            raise error_from_status(_json_or_text(content), status)
        return content

    def _ns(self, resource: ApiResource, namespace: str | None, own_namespace: str = "") -> str | None:
        """Where a request goes: the namespace asked for, else the object's own, else the client's."""
        if not resource.namespaced:
            return None
        return namespace or own_namespace or self.namespace

    # --- CRUD -----------------------------------------------------------------------------------

    async def get(self, resource: ApiResource, name: str, *, namespace: str | None = None,
                  subresource: str | None = None) -> dict[str, Any]:
        path = f"{name}/{subresource}" if subresource else name
        result: dict[str, Any] = await self.request("GET", resource, path=path,
                                                    namespace=self._ns(resource, namespace))
        return result

    async def list(self, resource: ApiResource, *, namespace: str | None = None,
                   label_selector: str | None = None, field_selector: str | None = None,
                   limit: int = 500) -> ObjectList:
        """Every page, following `continue`. `namespace=None` lists across all namespaces."""
        result = ObjectList()
        async for page in self.list_pages(resource, namespace=namespace, label_selector=label_selector,
                                          field_selector=field_selector, limit=limit):
            result.items.extend(page.items)
            result.resource_version = page.resource_version
        return result

    async def list_pages(self, resource: ApiResource, *, namespace: str | None = None,
                         label_selector: str | None = None, field_selector: str | None = None,
                         limit: int = 500, decode: BodyDecoder | None = None) -> AsyncGenerator[ObjectList, None]:
        """The list one page at a time, following `continue`: a caller that is done with a page
        before asking for the next never holds the whole list (100,000 decoded pods are a few GB).
        Every page carries the list's resourceVersion so far; the last one's is the list's.
        `decode` decodes each page's body (an informer's, which leaves out what it drops)."""
        params: dict[str, str] = {"limit": str(limit)}
        if label_selector:
            params["labelSelector"] = label_selector
        if field_selector:
            params["fieldSelector"] = field_selector
        ns = namespace if resource.namespaced else None
        while True:
            page = await self.request("GET", resource, namespace=ns, params=params, decode=decode)
            token = text(page, "metadata", "continue")
            yield ObjectList(items(page, "items"), Body(page).meta.resource_version)
            if not token:
                return
            params["continue"] = token

    async def create(self, resource: ApiResource, obj: Mapping[str, Any], *, namespace: str | None = None,
                     params: Mapping[str, str] | None = None) -> dict[str, Any]:
        body = _with_type(resource, obj)
        ns = self._ns(resource, namespace, Body(obj).namespace)
        result: dict[str, Any] = await self.request("POST", resource, namespace=ns, body=body, params=params)
        return result

    async def replace(self, resource: ApiResource, obj: Mapping[str, Any], *, namespace: str | None = None,
                      subresource: str | None = None) -> dict[str, Any]:
        """PUT: conditioned on `metadata.resourceVersion` when the object carries one (409 if stale)."""
        name = Body(obj).name
        if not name:
            raise ValueError("replace: the object has no metadata.name")
        path = f"{name}/{subresource}" if subresource else name
        result: dict[str, Any] = await self.request("PUT", resource, path=path,
                                                    namespace=self._ns(resource, namespace, Body(obj).namespace),
                                                    body=_with_type(resource, obj))
        return result

    async def patch(self, resource: ApiResource, name: str, patch: Any, *, namespace: str | None = None,
                    patch_type: str = "merge", subresource: str | None = None,
                    field_manager: str | None = None, force: bool = False) -> dict[str, Any]:
        """`patch_type` is merge, json (a list of operations), strategic or apply."""
        if patch_type not in PATCH_CONTENT_TYPES:
            raise ValueError(f"patch_type {patch_type!r}: expected one of {', '.join(PATCH_CONTENT_TYPES)}")
        params: dict[str, str] = {}
        if field_manager or patch_type == "apply":
            params["fieldManager"] = field_manager or "tfusion"
        if force:
            params["force"] = "true"
        path = f"{name}/{subresource}" if subresource else name
        result: dict[str, Any] = await self.request("PATCH", resource, path=path,
                                                    namespace=self._ns(resource, namespace),
                                                    params=params, body=patch,
                                                    content_type=PATCH_CONTENT_TYPES[patch_type])
        return result

    async def delete(self, resource: ApiResource, name: str, *, namespace: str | None = None,
                     propagation_policy: str | None = None, preconditions: Mapping[str, str] | None = None,
                     grace_period_seconds: int | None = None) -> dict[str, Any]:
        """Returns what the server returns: the object (still there with a deletionTimestamp while
        finalizers remain) or a Status."""
        options: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if propagation_policy:
            options["propagationPolicy"] = propagation_policy
        if preconditions:
            options["preconditions"] = dict(preconditions)
        if grace_period_seconds is not None:
            options["gracePeriodSeconds"] = grace_period_seconds
        result: dict[str, Any] = await self.request("DELETE", resource, path=name,
                                                    namespace=self._ns(resource, namespace), body=options)
        return result

    # --- watch ----------------------------------------------------------------------------------

    async def watch(self, resource: ApiResource, *, namespace: str | None = None,
                    label_selector: str | None = None, field_selector: str | None = None,
                    resource_version: str | None = None, timeout_seconds: int = 290,
                    read_timeout: float | None = None, allow_bookmarks: bool = True,
                    decode: EventDecoder = decode_event) -> AsyncGenerator[WatchEvent, None]:
        """Yield (type, object) until the server ends the stream (normal after `timeout_seconds`).
        An ERROR event raises its typed error (`Gone` for 410); no data for `read_timeout`
        seconds (default timeout_seconds + 30) raises ServerError. Close it with
        `contextlib.aclosing` when leaving early. `decode` turns each line into (type, object)."""
        params: dict[str, str] = {"watch": "true", "timeoutSeconds": str(int(timeout_seconds))}
        if allow_bookmarks:
            params["allowWatchBookmarks"] = "true"
        if resource_version:
            params["resourceVersion"] = resource_version
        if label_selector:
            params["labelSelector"] = label_selector
        if field_selector:
            params["fieldSelector"] = field_selector
        read_seconds = read_timeout if read_timeout else timeout_seconds + 30.0
        ns = namespace if resource.namespaced else None
        await self.limiter.acquire()
        try:
            async with contextlib.aclosing(self._watch_lines(resource, ns, params, read_seconds)) as lines:
                async for line in lines:
                    kind, obj = decode(line)
                    if kind == "ERROR":  # obj is the server's Status
                        raise error_from_status(obj, int(obj.get("code") or 500) if isinstance(obj, dict) else 500)
                    yield kind, obj if isinstance(obj, dict) else {}
        except kr8s.ServerError as exc:
            raise _from_kr8s(exc) from None
        except (httpx.TransportError, kr8s.APITimeoutError, OSError) as exc:
            raise transport_error(exc) from None

    async def _watch_lines(self, resource: ApiResource, namespace: str | None, params: dict[str, str],
                           read_seconds: float) -> AsyncGenerator[str | bytes, None]:
        """A watch's lines: on the lean transport (a connection of its own), or through kr8s when
        there is none or it was refused the token (401, the token then re-read)."""
        if self.lean is not None:
            url = self.api._construct_url(resource.api_version, "", namespace, resource.plural)
            streamed = await self.lean.stream(self.lean.target(url, params), WATCH_CONNECT_S, read_seconds)
            try:
                if streamed.head.status == 200:
                    async for line in streamed.lines():
                        yield line
                    return
                if streamed.head.status != 401:
                    raise error_from_status(_json_or_text(streamed.body), streamed.head.status)
                self.lean.handed_back += 1
            finally:
                streamed.close()
        timeout = httpx.Timeout(WATCH_CONNECT_S, read=read_seconds)
        async with self.api.call_api("GET", version=resource.api_version, namespace=namespace,
                                     url=resource.plural, params=params, stream=True, timeout=timeout) as response:
            if self.lean is not None and self.api.auth.token:
                self.lean.token = str(self.api.auth.token)  # kr8s may have re-read it (a 401 came back)
            async for text_line in response.aiter_lines():
                if text_line.strip():
                    yield text_line

    # --- helpers ----------------------------------------------------------------------------------

    async def create_token_review(self, token: str,
                                  audiences: builtins.list[str] | None = None) -> dict[str, Any]:
        spec: dict[str, Any] = {"token": token}
        if audiences:
            spec["audiences"] = audiences
        return await self.create(TOKENREVIEWS, {"metadata": {}, "spec": spec})

    async def request_token(self, namespace: str, service_account: str, *,
                            bound_pod: Mapping[str, str] | None = None, expiration_seconds: int | None = None,
                            audiences: builtins.list[str] | None = None) -> str:
        """TokenRequest: a service-account token, optionally bound to a pod ({name, uid})."""
        spec: dict[str, Any] = {}
        if audiences:
            spec["audiences"] = audiences
        if expiration_seconds is not None:
            spec["expirationSeconds"] = expiration_seconds
        if bound_pod:
            spec["boundObjectRef"] = {"kind": "Pod", "apiVersion": "v1", **bound_pod}
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
        result = await self.request("POST", None, path=f"serviceaccounts/{service_account}/token",
                                    namespace=namespace, body=body)
        return text(result, "status", "token")


def _with_type(resource: ApiResource, obj: Mapping[str, Any]) -> dict[str, Any]:
    body = dict(obj)
    body.setdefault("apiVersion", resource.api_version)
    body.setdefault("kind", resource.kind)
    return body


def object_key(obj: JsonMapping) -> str:
    """"namespace/name", or "name" for cluster-scoped objects (client-go's MetaNamespaceKey)."""
    meta = Body(obj).meta
    return f"{meta.namespace}/{meta.name}" if meta.namespace else meta.name
