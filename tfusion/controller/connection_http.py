"""`GET /api/connection?name=&namespace=`: a remote vGPU client asks where its worker is.

Why here, on every replica: the client library in a client pod calls the URL the webhook put in
`TENSOR_FUSION_OPERATOR_GET_CONNECTION_URL` through the controller's Service, so whichever replica
it reaches must answer, leader or not. Each replica has the TensorFusionConnections in its shared
informer, so the answer comes from the cache:

1. `Authorization: Bearer <token>`: a TokenReview (through the same `TokenReviewer` and cache as
   the index and host-port routes) must find a token bound to a pod (401 otherwise: no token, a
   token the API server refuses, or one not bound to a pod);
2. 404 when the connection does not exist; 401 when the token's pod is not the connection's owner
   (its client pod);
3. 200 `text/plain` with `status.connectionURL` at once when the connection is Running;
4. otherwise the request waits, up to `--connection-wait` (default 5 minutes), for the informer to
   show it Running (200), deleted (404) or for the informer's watch to break (503: retry); 504
   when the wait runs out. The waiters are a registry keyed by connection, woken by the one
   informer's events: there is no watch per request. A client that disconnects while waiting
   takes its waiter with it at once (the disconnect is read from the ASGI receive channel).

`DISABLE_CONNECTION_AUTH=true` skips 1 and the owner check of 2, as the original allows.
Errors are JSON `{"error": …, "field"?: …}`, like the original's; the URL is text.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Annotated, Any

import anyio
from litestar import MediaType, Request, Response, get
from litestar.handlers import HTTPRouteHandler
from litestar.params import Parameter
from prometheus_client import Counter, Gauge

from tfusion.api.accessors import Body
from tfusion.kube import resources as r
from tfusion.kube.auth import AUTH_FIELD, ReviewedToken, TokenReviewer, Unauthenticated, authenticate
from tfusion.kube.client import KubeError
from tfusion.kube.informer import Informer
from tfusion.web import ErrorBody, HttpError, error_responses

if TYPE_CHECKING:
    from tfusion.controller.runtime import ControllerRuntime
    from tfusion.controller.scheduling.assignments import Assignments

log = logging.getLogger(__name__)

PATH = "/api/connection"
#: how long a request waits for the connection cache's first list before answering 503
SYNC_WAIT_S = 5.0
#: TokenReviews in flight at once from this route: a thousand clients starting together (a Job's
#: pods) wait their turn in memory instead of holding a thousand API requests open at once
MAX_CONCURRENT_REVIEWS = 32
POD_KIND = "Pod"


def connection_url_of(conn: Body | None) -> str:
    """The URL of a connection that is ready (Running with a URL), else ""."""
    if conn is None or conn.phase != "Running":
        return ""
    return str(conn.status.get("connectionURL") or "")


def client_pod_uids(conn: Body) -> set[str]:
    """The UIDs of the pods that own the connection (its client pod)."""
    return {str(ref.get("uid")) for ref in conn.meta.owner_references if ref.get("kind") == POD_KIND and ref.get("uid")}


class Waiter:
    """One request waiting for one connection."""

    __slots__ = ("broken", "event")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.broken = False


class ConnectionWaiters:
    """Requests waiting per connection key, woken by the shared connection informer."""

    def __init__(self, informer: Informer) -> None:
        self.informer = informer
        self._waiting: dict[str, set[Waiter]] = {}
        # the informer delivers raw objects: each is read through the view from here on
        informer.add_handler(on_add=lambda obj: self._changed(Body(obj)),
                             on_update=lambda _, new: self._changed(Body(new)),
                             on_delete=lambda obj: self._changed(Body(obj)))
        informer.error_listeners.append(self._broken)

    def __len__(self) -> int:
        return sum(len(waiters) for waiters in self._waiting.values())

    def add(self, key: str) -> Waiter:
        waiter = Waiter()
        self._waiting.setdefault(key, set()).add(waiter)
        return waiter

    def remove(self, key: str, waiter: Waiter) -> None:
        waiters = self._waiting.get(key)
        if waiters is not None:
            waiters.discard(waiter)
            if not waiters:
                del self._waiting[key]

    def _changed(self, conn: Body) -> None:
        for waiter in self._waiting.get(f"{conn.namespace}/{conn.name}", ()):
            waiter.event.set()

    def _broken(self, error: KubeError) -> None:
        if self._waiting:
            log.warning("connection watch broke (%s): %d waiting request(s) answered 503", error, len(self))
        for waiters in self._waiting.values():
            for waiter in waiters:
                waiter.broken = True
                waiter.event.set()


class ConnectionRoute:
    """The route's state: the waiter registry, the token reviewer, the wait and the metrics."""

    def __init__(self, runtime: ControllerRuntime, assignments: Assignments, *, wait: float | None = None) -> None:
        self.runtime = runtime
        self.wait = runtime.settings.connection_wait if wait is None else wait
        self.auth = not runtime.settings.disable_connection_auth
        self.informer = runtime.informer(r.TENSORFUSIONCONNECTIONS)
        self.waiters = ConnectionWaiters(self.informer)
        shared = assignments.reviewer
        self.reviewer: TokenReviewer | None = shared or (
            TokenReviewer(runtime.manager.client) if runtime.manager.has_client else None)
        self._reviews = anyio.Semaphore(MAX_CONCURRENT_REVIEWS)
        self.answers = Counter("tfusion_connection_requests_total", "GET /api/connection answers by status",
                               ["code"], registry=runtime.registry)
        Gauge("tfusion_connection_waiters", "GET /api/connection requests waiting for their worker",
              registry=runtime.registry).set_function(lambda: len(self.waiters))

    def attach(self) -> ConnectionRoute:
        if not self.auth:
            log.warning("DISABLE_CONNECTION_AUTH=true: GET %s answers any caller about any connection", PATH)
        self.runtime.routes.append(connection_handler(self))
        return self

    async def authenticate(self, header: str | None) -> ReviewedToken | None:
        """The token's pod (None when authentication is off); 401/503 as `kube.auth` words them."""
        if not self.auth:
            return None
        try:
            async with self._reviews:
                return await authenticate(self.reviewer, header, pod_bound=True)
        except Unauthenticated as exc:
            raise HttpError(exc.status, ErrorBody(error=exc.message, field=AUTH_FIELD)) from None

    @staticmethod
    def authorize(identity: ReviewedToken | None, conn: Body, key: str) -> None:
        if identity is not None and identity.pod_uid not in client_pod_uids(conn):
            raise HttpError(401, ErrorBody(error=f"unauthorized: the token belongs to pod {identity.namespace}/"
                                                 f"{identity.pod_name}, not to the client pod of connection {key}",
                                           field=AUTH_FIELD))

    async def synced(self) -> None:
        if self.informer.synced:
            return
        with anyio.move_on_after(SYNC_WAIT_S):
            await self.informer.wait_synced()
            return
        raise HttpError(503, "the controller has not listed the TensorFusionConnections yet; retry")

    async def answer(self, request: Request[Any, Any, Any]) -> Response[Any]:
        try:
            url = await self._url(request)
        except HttpError as exc:
            self.answers.labels(str(exc.status)).inc()
            raise
        self.answers.labels("200").inc()
        return Response(url, media_type=MediaType.TEXT)

    async def _url(self, request: Request[Any, Any, Any]) -> str:
        name = request.query_params.get("name") or ""
        namespace = request.query_params.get("namespace") or ""
        for field, value in (("name", name), ("namespace", namespace)):
            if not value:
                raise HttpError(400, ErrorBody(error=f"query parameter {field} is required: the "
                                                     f"TensorFusionConnection's {field}", field=field))
        identity = await self.authenticate(request.headers.get("authorization"))
        await self.synced()
        key = f"{namespace}/{name}"
        conn = self._cached(key)
        if conn is None:
            raise HttpError(404, "connection not found")
        self.authorize(identity, conn, key)
        return connection_url_of(conn) or await self._wait(key, request)

    def _cached(self, key: str) -> Body | None:
        found = self.informer.get(key)
        return Body(found) if found is not None else None

    async def _wait(self, key: str, request: Request[Any, Any, Any]) -> str:
        waiter = self.waiters.add(key)
        outcome = "timeout"
        gone = anyio.Event()
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_until_disconnect, request, tg.cancel_scope, gone)
                with anyio.move_on_after(self.wait):
                    outcome = await self._ready_or_gone(key, waiter)
                tg.cancel_scope.cancel()
        finally:
            self.waiters.remove(key, waiter)
        if gone.is_set():  # nobody reads this answer; 499 only counts it (nginx's "client closed request")
            raise HttpError(499, "the client disconnected while waiting")
        url = connection_url_of(self._cached(key))
        if url:
            return url
        if outcome == "broken":
            raise HttpError(503, "connection watch closed: the controller lost its watch of TensorFusionConnections; "
                                 "retry")
        if outcome == "gone":
            raise HttpError(404, "connection not found")
        raise HttpError(504, f"timeout waiting for connection to become ready ({self.wait:g}s)")

    async def _ready_or_gone(self, key: str, waiter: Waiter) -> str:
        while True:
            waiter.event = anyio.Event()  # before reading the cache: a change after it wakes us
            conn = self._cached(key)
            if conn is None:
                return "gone"
            if connection_url_of(conn):
                return "ready"
            await waiter.event.wait()
            if waiter.broken:
                return "broken"


async def _until_disconnect(request: Request[Any, Any, Any], scope: anyio.CancelScope, gone: anyio.Event) -> None:
    """Cancel `scope` when the client goes away (the ASGI receive channel says http.disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            gone.set()
            scope.cancel()
            return


_ERRORS = error_responses({
    400: "name or namespace missing", 401: "no token, a refused token, or not the connection's client pod",
    404: "no such TensorFusionConnection", 500: "a bug", 503: "the controller's watch broke, or the token could "
    "not be reviewed; retry", 504: "the worker was not Running within --connection-wait"})


def connection_handler(route: ConnectionRoute) -> HTTPRouteHandler:
    @get(PATH, media_type=MediaType.TEXT, responses=_ERRORS,
         summary="The worker address (text/plain) of a remote vGPU connection, waiting for it to be ready")
    async def connection(request: Request[Any, Any, Any],
                         name: Annotated[str, Parameter(description="the TensorFusionConnection's name",
                                                        min_length=1)],
                         namespace: Annotated[str, Parameter(description="the TensorFusionConnection's namespace",
                                                             min_length=1)]) -> Response[str]:
        # name and namespace are declared so that the document says they are required (Litestar
        # refuses a request without them with a 400 naming the parameter); `answer` reads them itself
        return await route.answer(request)

    return connection


def attach_connection_route(runtime: ControllerRuntime, assignments: Assignments) -> ConnectionRoute:
    """Serve GET /api/connection on this replica (every replica: call it in configure())."""
    return ConnectionRoute(runtime, assignments).attach()
