"""`EmbeddedApiServer`: the whole API server (store, engine, garbage collector, HTTP) as one start/stop object.

The role and the test fixture both use it. Every request needs a bearer token (the admin token
in the kubeconfig it writes, or a ServiceAccount token), except /version, /healthz, /livez and
/readyz, as in kube: loopback is no exception, since any local process can reach it; and RBAC
(rbac.py) authorizes every request, the admin token being a member of system:masters. It serves
HTTPS with a self-signed certificate on every address, loopback included, because client-go
(kubectl) sends a bearer token only over TLS. It writes a kubeconfig (token and CA) for kubectl
and kr8s, and offers fault injection for tests: closing every watch stream, compacting the watch
event log, and restarting on the same state file and port.
"""

from __future__ import annotations

import asyncio
import logging
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import TaskStatus

from tfusion.api.documents import freeze_long_lived
from tfusion.apiserver import rbac, security, seed
from tfusion.apiserver.app import ApiApp
from tfusion.apiserver.asgi import BODY_TIMEOUT_S
from tfusion.apiserver.gc import GarbageCollector
from tfusion.apiserver.objects import Engine
from tfusion.apiserver.resources import Registry
from tfusion.apiserver.reviews import Reviews
from tfusion.apiserver.services import Services
from tfusion.apiserver.store import Store
from tfusion.apiserver.tokens import TokenAuthority
from tfusion.settings import parse_listen
from tfusion.web import bind_socket, kube_status_refusal, serve

if TYPE_CHECKING:
    from tfusion.apiserver.webhooks import PodCreateHold

log = logging.getLogger(__name__)
#: a request head must arrive within this long of the connection opening (or the last response)
HEAD_TIMEOUT_S = 30.0
#: an idle keep-alive connection is closed after this long
KEEP_ALIVE_S = 30


class EmbeddedApiServer:
    def __init__(
        self,
        state: str | Path,
        *,
        listen: str = "127.0.0.1:0",
        watch_history: int = 10000,
        kubeconfig_path: str | Path | None = None,
        bookmark_interval: float = 60.0,
        tls: bool | None = None,
        head_timeout: float = HEAD_TIMEOUT_S,
        body_timeout: float = BODY_TIMEOUT_S,
        keep_alive: int = KEEP_ALIVE_S,
        pod_create_hold: PodCreateHold | None = None,
    ) -> None:
        self.state = Path(state)
        self.host, self.port = parse_listen(listen)
        # HTTPS on loopback too: kubectl (client-go) sends a bearer token only over TLS
        self.tls = True if tls is None else tls
        self.watch_history = watch_history
        self.kubeconfig_path = Path(kubeconfig_path) if kubeconfig_path else None
        self.bookmark_interval = bookmark_interval
        self.head_timeout, self.body_timeout, self.keep_alive = head_timeout, body_timeout, keep_alive
        self.pod_create_hold = pod_create_hold
        self.token: str | None = None
        self.ca_pem: bytes | None = None
        self.store: Store | None = None
        self.engine: Engine | None = None
        self._restart_requested: anyio.Event | None = None
        self._serving = anyio.Event()
        self._task: asyncio.Task[None] | None = None
        #: true once the server has served (start-up failures happen before)
        self.started = False
        #: requests RBAC refused since start (every one is also logged as a warning)
        self.forbidden_count = 0

    # ------------------------------------------------------------------------------ properties
    @property
    def url(self) -> str:
        return security.server_url(self.host, self.port, self.tls)

    def kubeconfig(self, namespace: str = "default") -> dict[str, Any]:
        return security.kubeconfig(self.url, token=self.token, ca_pem=self.ca_pem, namespace=namespace)

    # ------------------------------------------------------------------------------ lifecycle
    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled (restarting in place when asked); `task_status.started()` once serving."""
        first = True
        while True:
            self._restart_requested = anyio.Event()
            await self._serve_once(self._restart_requested, task_status if first else None)
            first = False

    async def __aenter__(self) -> EmbeddedApiServer:
        """Serve in a background task of the current (asyncio) event loop until __aexit__."""
        started: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def background() -> None:
            try:
                async with anyio.create_task_group() as tg:
                    await tg.start(self.run)
                    started.set_result(None)
            except BaseException as exc:
                if not started.done():
                    started.set_exception(exc)
                    return
                raise

        self._task = asyncio.ensure_future(background())
        await started
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with anyio.CancelScope(shield=True):
            await asyncio.gather(task, return_exceptions=True)

    async def restart(self) -> None:
        """Stop serving, close the state file, and serve again from it on the same port."""
        if self._restart_requested is None:
            raise RuntimeError("the API server is not running")
        self._serving = anyio.Event()
        self._restart_requested.set()
        await self._serving.wait()

    def close_watches(self) -> None:
        """End every open watch stream (clients see a clean end of stream and re-watch)."""
        if self.store is not None:
            self.store.close_watches()

    def compact(self) -> None:
        """Drop the watch event log: watches from any earlier resourceVersion now get 410 Expired."""
        if self.store is not None:
            self.store.compact()

    # ------------------------------------------------------------------------------ internals
    def _log_forbidden(self, denied: rbac.Attributes) -> None:
        """Every RBAC denial is a warning: in --role=all a 403 means a shipped ClusterRole lacks a rule."""
        self.forbidden_count += 1
        if denied.resource_request:
            what = (f"{denied.verb} {denied.resource}{'/' + denied.subresource if denied.subresource else ''}"
                    f" (API group {denied.api_group!r}, namespace {denied.namespace or '-'},"
                    f" name {denied.name or '-'})")
        else:
            what = f"{denied.verb} {denied.path}"
        if denied.user.name.startswith("system:serviceaccount:") and "tensor-fusion" in denied.user.name:
            log.error("RBAC DENIED %s: %s; the RBAC deploy/ ships lacks this rule (deploy/base/*/rbac.yaml and "
                      "tfusion/embedded/rbac.yaml)", denied.user.name, what)
        else:
            log.warning("RBAC DENIED %s: %s", denied.user.name, what)

    async def _serve_once(self, stop: anyio.Event, task_status: TaskStatus[None] | None) -> None:
        store = Store(self.state, self.watch_history)
        try:
            app, gc, certfile, keyfile = self._build(store)
            freeze_long_lived()  # the state just loaded lives as long as the server: out of the GC's walks
            sock = bind_socket(f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}")
        except BaseException:
            store.close()
            raise
        self.port = sock.getsockname()[1]
        app.server_address = f"{self.host}:{self.port}"
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(gc.run)
                await tg.start(partial(serve, app, sock, ssl_certfile=certfile, ssl_keyfile=keyfile,
                                       head_timeout=self.head_timeout, keep_alive=self.keep_alive,
                                       refusal=kube_status_refusal))
                try:
                    if self.kubeconfig_path is not None:
                        security.write_kubeconfig(self.kubeconfig_path, self.kubeconfig())
                    if task_status is not None:
                        task_status.started()
                    self.started = True
                    self._serving.set()
                    await stop.wait()
                finally:
                    # end watch streams first, so uvicorn's graceful shutdown has nothing to wait for
                    store.close_watches()
                    tg.cancel_scope.cancel()
        finally:
            sock.close()
            store.close()

    def _build(self, store: Store) -> tuple[ApiApp, GarbageCollector, str | None, str | None]:
        registry = Registry()
        engine = Engine(store, registry)
        seed.bootstrap(engine)
        rbac.bootstrap_policy(store)
        authorizer = rbac.Authorizer(store)

        def authority() -> TokenAuthority:
            # generating an RSA key takes a while: only when a token is first issued or checked
            key = store.get_meta("sa.key")
            loaded = TokenAuthority.load_or_create(key)
            if key is None:
                store.set_meta("sa.key", loaded.private_key_pem)
            return loaded

        services = Services(engine, authority)
        from tfusion.apiserver.webhooks import Webhooks

        engine.admit = Webhooks(engine, self.pod_create_hold).admit
        certfile = keyfile = None
        token = store.get_meta("admin.token")
        if token is None:
            token = security.new_token().encode()
            store.set_meta("admin.token", token)
        self.token = token.decode()
        if self.tls:
            cert, key = store.get_meta("tls.crt"), store.get_meta("tls.key")
            if cert is None or key is None:
                cert, key = security.self_signed(self.host)
                store.set_meta("tls.crt", cert)
                store.set_meta("tls.key", key)
            self.ca_pem = cert
            base = self.state.parent / (self.state.name + ".tls")
            security.write_private(base.with_suffix(".crt"), cert)
            security.write_private(base.with_suffix(".key"), key)
            certfile, keyfile = str(base.with_suffix(".crt")), str(base.with_suffix(".key"))

        def authenticate(token: str) -> rbac.UserInfo | None:
            status = services.review(token)
            return rbac.UserInfo.from_review(status["user"]) if status.get("authenticated") else None

        app = ApiApp(
            engine,
            token=self.token,
            bookmark_interval=self.bookmark_interval,
            authenticate=authenticate,
            body_timeout=self.body_timeout,
            special={**services.handlers(), **Reviews(authorizer).handlers()},
            authorizer=authorizer,
        )
        app.on_forbidden = self._log_forbidden
        self.store, self.engine = store, engine
        return app, GarbageCollector(engine), certfile, keyfile
