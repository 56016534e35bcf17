"""The raw ASGI application: Kubernetes REST paths → Engine calls → JSON (or Table) responses.

The request, its query parameters and the response senders are in asgi.py; this module routes.

No web framework: kube paths are parsed by hand (a handful of shapes), bodies are decoded with
orjson, and stored objects are sent as the JSON bytes the store already holds, which keeps the
per-request cost low enough for thousands of writes per second on one core.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.to_thread
import orjson

from tfusion.apiserver import applying, discovery, errors, managedfields, openapi_pb, podstreams, rbac, tables
from tfusion.apiserver.asgi import (
    BODY_TIMEOUT_S,
    ClientGone,
    Receive,
    Request,
    Scope,
    Send,
    Target,
    check_delete_options,
    int_param,
    list_options,
    resource_version,
    respond,
    send_bytes,
    watch_timeout,
)
from tfusion.apiserver.conversion import stored_field_selector, to_served
from tfusion.apiserver.errors import ApiError
from tfusion.apiserver.objects import Engine
from tfusion.apiserver.rbac import ADMIN, Authorizer, UserInfo
from tfusion.apiserver.resources import ResourceInfo
from tfusion.apiserver.store import Entry
from tfusion.apiserver.watch import WatchRequest, serve_watch

log = logging.getLogger(__name__)

_PUBLIC = {"/version", "/healthz", "/livez", "/readyz"}
#: where `tfusion state backup` reads a running server's state (not a Kubernetes path: kube has none like it)
STATE_BACKUP_PATH = "/tfusion/state/backup"
#: what kube-apiserver serves; anything else (CONNECT, TRACE, ...) is 405 before routing
_METHODS = {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}

class ApiApp:
    """ASGI entry point; `special` handlers serve the POST-only parts that are not object storage."""

    def __init__(
        self,
        engine: Engine,
        *,
        token: str | None = None,
        server_address: str = "127.0.0.1:6443",
        bookmark_interval: float = 60.0,
        authenticate: Callable[[str], UserInfo | None] | None = None,
        body_timeout: float = BODY_TIMEOUT_S,
        special: dict[tuple[str, str], Callable[[Request, Target], Awaitable[tuple[int, Any]]]] | None = None,
        authorizer: Authorizer | None = None,
    ) -> None:
        self.engine = engine
        self.token = token
        self.server_address = server_address
        self.bookmark_interval = bookmark_interval
        self.authenticate = authenticate
        #: RBAC (rbac.py); None: every authenticated request is allowed
        self.authorizer = authorizer
        #: called with each request RBAC denied to a user outside system:masters (for loud logs)
        self.on_forbidden: Callable[[rbac.Attributes], None] | None = None
        self.body_timeout = body_timeout
        self._decode_limiter: anyio.CapacityLimiter | None = None
        #: (storage key, subresource or "create") -> handler, for binding/eviction/token/tokenreview
        self.special = special or {}
        self._openapi_documents = discovery.OpenApiDocuments()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "websocket":  # kubectl exec/attach/port-forward: refused before the handshake
            await podstreams.websocket(self._http, scope, receive, send)
        elif kind == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            if self.token is not None and request.path.rstrip("/") not in _PUBLIC:
                request.user = self._check_auth(request)
                if self.authorizer is not None:
                    self._authorize(request, self.authorizer)
            if request.method not in _METHODS:
                raise errors.method_not_allowed(request.method)
            token = rbac.CURRENT_USER.set(request.user)
            try:
                await self._route(request, send)
            finally:
                rbac.CURRENT_USER.reset(token)
        except ClientGone:
            return
        except ApiError as exc:
            await respond(send, exc.code, exc.status(), exc.headers)
        except Exception as exc:  # a bug: answer 500 with the reason, keep serving
            log.exception("internal error on %s %s", request.method, request.path)
            await respond(
                send, 500, errors.ApiError(500, "InternalError", f"Internal error occurred: {exc!r}").status()
            )
        finally:
            await request.release_large()

    def _large_decodes(self) -> anyio.CapacityLimiter:
        """At most two large bodies are decoded at once: each costs a core and up to ~100 MB."""
        if self._decode_limiter is None:
            self._decode_limiter = anyio.CapacityLimiter(2)  # made on first use: it needs the event loop
        return self._decode_limiter

    def _check_auth(self, request: Request) -> UserInfo:
        header = request.headers.get("authorization", "")
        if header.startswith("Bearer "):
            presented = header[7:].strip()
            assert self.token is not None
            # bytes: compare_digest refuses str with non-ASCII characters (a TypeError, so a 500)
            if hmac.compare_digest(presented.encode(), self.token.encode()):
                return ADMIN
            if self.authenticate is not None:
                user = self.authenticate(presented)
                if user is not None:
                    return user
        raise errors.unauthorized()

    def _authorize(self, request: Request, authorizer: Authorizer) -> None:
        """RBAC for the request (after impersonation, which is checked first); a denial is kube's 403."""
        headers = request.headers
        if "impersonate-user" in headers or "impersonate-group" in headers or "impersonate-uid" in headers:
            asked = rbac.impersonation_headers(request.scope.get("headers", ())) or {}
            request.user = rbac.impersonate(authorizer, request.user, asked)
        user = request.user
        if user.is_master:
            return
        attributes = rbac.request_attributes(user, request.method, request.path, request.params)
        try:
            authorizer.check(attributes)
            escalation = rbac.escalation_verb(f"{attributes.api_group}/{attributes.resource}")
            if escalation and attributes.verb in ("create", "update", "patch"):
                # stricter than kube, which also allows a role that grants no more than the writer holds
                authorizer.check(rbac.Attributes(
                    user, escalation, True, api_group=attributes.api_group, resource=attributes.resource,
                    namespace=attributes.namespace, name=attributes.name))
        except ApiError:
            if self.on_forbidden is not None:
                self.on_forbidden(attributes)
            raise

    # ------------------------------------------------------------------------------ routing
    async def _route(self, request: Request, send: Send) -> None:
        path = request.path
        parts = [p for p in path.split("/") if p]
        if not parts:
            await respond(
                send, 200, {"paths": ["/api", "/api/v1", "/apis", "/openapi/v2", "/openapi/v3", "/version", "/healthz"]}
            )
            return
        head = parts[0]
        if head in ("healthz", "livez", "readyz") and len(parts) == 1:
            await send_bytes(send, 200, b"ok", b"text/plain")
            return
        if head == "version" and len(parts) == 1:
            await respond(send, 200, discovery.VERSION)
            return
        if path.rstrip("/") == STATE_BACKUP_PATH:
            await self._state_backup(request, send)
            return
        if head == "openapi":
            await self._openapi(parts, send, openapi_pb.wants_protobuf(request.headers.get("accept", "")))
            return
        registry = self.engine.registry
        if head == "api":
            if len(parts) == 1:
                await respond(send, 200, discovery.api_versions(self.server_address))
                return
            group, version, rest = "", parts[1], parts[2:]
        elif head == "apis":
            if len(parts) == 1:
                await respond(send, 200, discovery.api_group_list(registry.groups()))
                return
            group = parts[1]
            if len(parts) == 2:
                versions = registry.groups().get(group)
                if not versions:
                    raise errors.not_found_path(path)
                await respond(send, 200, discovery.api_group(group, versions))
                return
            version, rest = parts[2], parts[3:]
        else:
            raise errors.not_found_path(path)
        if not rest:
            infos = registry.in_group_version(group, version)
            if not infos:
                raise errors.not_found_path(path)
            gv = f"{group}/{version}" if group else version
            await respond(send, 200, discovery.resource_list(gv, infos))
            return
        stream = podstreams.match(group, version, rest)
        if stream is not None:  # pods/log, exec, attach, portforward: no container runs to serve them
            raise podstreams.refusal(self.engine, request.method, stream, request.params)
        target = self._target(group, version, rest, path)
        await self._dispatch(request, target, send)

    async def _state_backup(self, request: Request, send: Send) -> None:
        """The state file's committed content, for `tfusion state backup` while the server runs (the
        server holds the file's lock, so no other process can read it). Administrators only: the file
        holds the signing key, the admin token and the TLS key, more than any RBAC rule could grant."""
        if not request.user.is_master:
            raise errors.ApiError(403, "Forbidden", f"{request.path} is for the administrator "
                                  "(the kubeconfig the embedded API server writes) only")
        if request.method != "GET":
            raise errors.method_not_allowed(request.method)
        await send_bytes(send, 200, await self.engine.store.snapshot(), b"application/vnd.sqlite3")

    def _target(self, group: str, version: str, rest: list[str], path: str) -> Target:
        registry = self.engine.registry
        watch = False
        if rest[0] == "watch":
            watch, rest = True, rest[1:]
            if not rest:
                raise errors.not_found_path(path)
        namespace: str | None = None
        if rest[0] == "namespaces" and len(rest) >= 3:
            info = registry.get(group, version, rest[2])
            if info is not None and info.namespaced:
                namespace, rest = rest[1], rest[2:]
        info = registry.get(group, version, rest[0])
        if info is None:
            raise errors.not_found_path(path)
        if info.namespaced and namespace is None and len(rest) > 1:
            raise errors.not_found_path(path)
        name = rest[1] if len(rest) > 1 else ""
        subresource = rest[2] if len(rest) > 2 else ""
        if len(rest) > 3 or (subresource and subresource not in info.subresources):
            raise errors.not_found_path(path)
        return Target(info, namespace, name, subresource, watch)

    async def _dispatch(self, request: Request, target: Target, send: Send) -> None:
        method = request.method
        info = target.info
        engine = self.engine
        ns = target.namespace or ""
        params = request.params
        if target.subresource == "scale":
            await self._scale(request, target, send)
            return
        if target.subresource and target.subresource != "status":
            if method != "POST":
                raise errors.method_not_allowed(method)
            handler = self.special.get((info.storage_key, target.subresource))
            if handler is None:
                raise errors.method_not_allowed(method)
            await request.read_body(self.body_timeout, self._large_decodes())
            code, body = await handler(request, target)
            await self.engine.store.durable()
            await respond(send, code, body)
            return
        if method == "GET":
            if target.watch or params.get("watch") in ("true", "1"):
                await self._watch(request, target, send)
            elif target.name:
                self._check_verb(info, "get", method)
                entry = engine.get(info, ns if info.namespaced else "", target.name)
                await self._send_object(request, send, info, entry, 200)
            else:
                self._check_verb(info, "list", method)
                await self._list(request, target, send)
            return
        if method == "POST":
            if target.name:
                raise errors.method_not_allowed(method)
            self._check_verb(info, "create", method)
            await request.read_body(self.body_timeout, self._large_decodes())
            handler = self.special.get((info.storage_key, "create"))
            if handler is not None:
                code, body = await handler(request, target)
                await self.engine.store.durable()
                await respond(send, code, body)
                return
            entry = await engine.create(
                info, ns, request.json(), dry_run=request.dry_run, field_validation=params.get("fieldValidation", ""),
                tracking=self._tracking(request, target, "CreateOptions"),
            )
            await self._send_object(request, send, info, entry, 201)
            return
        if method == "PUT":
            if not target.name:
                raise errors.method_not_allowed(method)
            self._check_verb(info, "update", method)
            await request.read_body(self.body_timeout, self._large_decodes())
            entry = await engine.update(
                info,
                ns,
                target.name,
                request.json(),
                subresource=target.subresource,
                dry_run=request.dry_run,
                field_validation=params.get("fieldValidation", ""),
                tracking=self._tracking(request, target, "UpdateOptions"),
            )
            await self._send_object(request, send, info, entry, 200)
            return
        if method == "PATCH":
            if not target.name:
                raise errors.method_not_allowed(method)
            self._check_verb(info, "patch", method)
            await request.read_body(self.body_timeout, self._large_decodes())
            ctype = request.headers.get("content-type", "")
            is_apply = ctype.split(";")[0].strip().lower() == "application/apply-patch+yaml"
            tracking = self._tracking(request, target, "PatchOptions", apply=is_apply)
            if is_apply:  # server-side apply (applying.py); the body is YAML or JSON
                entry, created = await applying.apply(
                    engine, info, ns, target.name, request.json, tracking, force=params.get("force") == "true",
                    subresource=target.subresource, dry_run=request.dry_run,
                    field_validation=params.get("fieldValidation", ""),
                )
                await self._send_object(request, send, info, entry, 201 if created else 200)
                return
            entry = await engine.patch(
                info,
                ns,
                target.name,
                request.json,
                ctype,
                subresource=target.subresource,
                dry_run=request.dry_run,
                field_validation=params.get("fieldValidation", ""),
                tracking=tracking,
            )
            await self._send_object(request, send, info, entry, 200)
            return
        if method == "DELETE":
            if target.subresource:
                raise errors.method_not_allowed(method)
            await request.read_body(self.body_timeout, self._large_decodes())
            options = self._delete_options(request)
            if target.name:
                self._check_verb(info, "delete", method)
                entry = engine.delete(info, ns, target.name, options, dry_run=request.dry_run)
                await self._send_object(request, send, info, entry, 200)
            else:
                self._check_verb(info, "deletecollection", method)
                await self._delete_collection(request, target, options, send)
            return
        raise errors.method_not_allowed(method)

    async def _scale(self, request: Request, target: Target, send: Send) -> None:
        """GET, PUT and PATCH of a Deployment's or ReplicaSet's /scale (scale.py)."""
        from tfusion.apiserver import scale

        info, ns, method = target.info, target.namespace or "", request.method
        if method == "GET":
            self._check_verb(info, "get", method)
            body = scale.get(self.engine, info, ns, target.name)
        elif method in ("PUT", "PATCH"):
            self._check_verb(info, "update" if method == "PUT" else "patch", method)
            await request.read_body(self.body_timeout, self._large_decodes())
            if method == "PUT":
                body = await scale.update(self.engine, info, ns, target.name, request.json(), dry_run=request.dry_run)
            else:
                body = await scale.patch(self.engine, info, ns, target.name, request.json,
                                         request.headers.get("content-type", ""), dry_run=request.dry_run)
            await self.engine.store.durable()
        else:
            raise errors.method_not_allowed(method)
        await respond(send, 200, body)

    @staticmethod
    def _tracking(
        request: Request, target: Target, options_kind: str, *, apply: bool = False
    ) -> managedfields.Tracking:
        """Whose write this is, for metadata.managedFields (fieldManager, else the User-Agent)."""
        return managedfields.for_request(request.params, request.headers.get("user-agent", ""),
                                         target.info.api_version, target.subresource, options_kind, apply=apply)

    @staticmethod
    def _check_verb(info: ResourceInfo, verb: str, method: str) -> None:
        if verb not in info.verbs:
            raise errors.method_not_allowed(method)

    @staticmethod
    def _delete_options(request: Request) -> dict[str, Any]:
        options: dict[str, Any] = {}
        if request.body.strip():
            body = request.json()
            if not isinstance(body, dict):
                raise errors.bad_request("DeleteOptions must be a JSON object")
            options.update(body)
        for key in ("propagationPolicy", "orphanDependents"):
            if key in request.params:
                value: Any = request.params[key]
                if key == "orphanDependents":
                    value = value == "true"
                options[key] = value
        grace = int_param(request.params, "gracePeriodSeconds")
        if grace is not None:
            options["gracePeriodSeconds"] = grace
        check_delete_options(options)
        return options

    # ------------------------------------------------------------------------------ reads
    def _selectors(self, request: Request, info: ResourceInfo) -> tuple[Any, Any]:
        from tfusion.api.selectors import SelectorError, parse_field_selector, parse_label_selector

        label_text = request.params.get("labelSelector", "")
        field_text = request.params.get("fieldSelector", "")
        try:
            labels = parse_label_selector(label_text) if label_text else None
            fields = parse_field_selector(field_text) if field_text else None
        except SelectorError as exc:
            raise errors.bad_request(f"unable to parse requirement: {exc}") from None
        return labels, stored_field_selector(info, fields)  # a served shape's field names, as stored

    async def _list(self, request: Request, target: Target, send: Send) -> None:
        info = target.info
        labels, fields = self._selectors(request, target.info)
        limit = list_options(request.params)
        rv = self.engine.store.rv
        entries, token, remaining = self.engine.list(
            info,
            target.namespace if info.namespaced else None,
            label_selector=labels,
            field_selector=fields,
            limit=max(limit, 0),
            continue_token=request.params.get("continue", ""),
        )
        list_meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if token:
            list_meta["continue"] = token
            list_meta["remainingItemCount"] = remaining
        if request.wants_table:
            objects = [_versioned(info, e) for e in entries]
            await respond(
                send,
                200,
                tables.table(
                    info, objects, list_meta=list_meta, include_object=request.params.get("includeObject", "Metadata")
                ),
            )
            return
        head = orjson.dumps({"kind": info.list_kind, "apiVersion": info.api_version, "metadata": list_meta})
        # the stored JSON of each item as it is, the whole body assembled in one copy
        parts = [head[:-1] + b',"items":[']
        served = info.api_version
        for entry in entries:
            parts.append(entry.raw if entry.api_version == served else orjson.dumps(_versioned(info, entry)))
            parts.append(b",")
        if entries:
            parts.pop()
        parts.append(b"]}")
        await send_bytes(send, 200, b"".join(parts))

    async def _watch(self, request: Request, target: Target, send: Send) -> None:
        info = target.info
        self._check_verb(info, "watch", request.method)
        labels, fields = self._selectors(request, target.info)
        if target.name:  # legacy /watch/<resource>/<name>
            from tfusion.api.selectors import parse_field_selector

            fields = parse_field_selector(f"metadata.name={target.name}")
        rv = resource_version(request.params)
        timeout = watch_timeout(request.params)
        int_param(request.params, "limit")
        initial_events = {"true": True, "false": False}.get(request.params.get("sendInitialEvents", ""))
        if initial_events and request.params.get("allowWatchBookmarks") != "true":
            raise errors.invalid(
                "ListOptions",
                "meta.k8s.io",
                "",
                [
                    (
                        "allowWatchBookmarks",
                        "FieldValueForbidden",
                        "Forbidden: sendInitialEvents requires setting allowWatchBookmarks=true",
                    )
                ],
            )
        watch = WatchRequest(
            info,
            target.namespace if info.namespaced else None,
            resource_version=rv,
            label_selector=labels,
            field_selector=fields,
            timeout_s=timeout,
            bookmarks=request.params.get("allowWatchBookmarks") == "true",
            as_table=request.wants_table,
            include_object=request.params.get("includeObject", "Metadata"),
            initial_events=initial_events,
        )
        await serve_watch(
            self.engine.store, watch, send, request.receive, bookmark_interval=self.bookmark_interval, headers=[]
        )

    async def _send_object(self, request: Request, send: Send, info: ResourceInfo, entry: Entry, code: int) -> None:
        await self.engine.store.durable()  # a write is answered once it is in the state file
        if request.wants_table:
            await respond(
                send,
                code,
                tables.table(
                    info,
                    [_versioned(info, entry)],
                    list_meta={"resourceVersion": str(entry.rv)},
                    include_object=request.params.get("includeObject", "Metadata"),
                ),
            )
            return
        if entry.api_version == info.api_version:
            await send_bytes(send, code, entry.raw)
        else:
            await respond(send, code, _versioned(info, entry))

    async def _delete_collection(self, request: Request, target: Target, options: dict[str, Any], send: Send) -> None:
        info = target.info
        labels, fields = self._selectors(request, target.info)
        list_options(request.params)
        entries, _, _ = self.engine.list(
            info, target.namespace if info.namespaced else None, label_selector=labels, field_selector=fields
        )
        deleted = []
        for entry in entries:
            try:
                result = self.engine.delete(info, entry.namespace, entry.name, options, dry_run=request.dry_run)
            except ApiError as exc:
                if exc.code == 404:
                    continue
                raise
            deleted.append(_versioned(info, result))
        await self.engine.store.durable()
        await respond(
            send,
            200,
            {
                "kind": info.list_kind,
                "apiVersion": info.api_version,
                "metadata": {"resourceVersion": str(self.engine.store.rv)},
                "items": deleted,
            },
        )

    # ------------------------------------------------------------------------------ openapi
    async def _openapi(self, parts: list[str], send: Send, protobuf: bool = False) -> None:
        protobuf = protobuf and parts[1:] == ["v2"]  # kubectl's v2 download (openapi_pb.py)
        served = self.engine.registry.all()
        # off the event loop: a first request reads the Kubernetes definitions and builds the documents
        body = await anyio.to_thread.run_sync(self._openapi_documents.answer, parts[1:], served, protobuf)
        if body is None:
            raise errors.not_found_path("/" + "/".join(parts))
        await send_bytes(send, 200, body, openapi_pb.CONTENT_TYPE if protobuf else b"application/json")


def _versioned(info: ResourceInfo, entry: Entry) -> dict[str, Any]:
    if entry.api_version == info.api_version:
        return entry.obj
    return to_served(info, entry.obj)
