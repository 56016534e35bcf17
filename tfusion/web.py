"""Shared HTTP plumbing for the controller, the hypervisor and the embedded API server: uvicorn
servers we can run inside an anyio task group (no signal capture of their own), health/readiness
bookkeeping, and the Prometheus mount for a role's own registry.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Iterator
from typing import Any

import anyio
import prometheus_client
import uvicorn
from anyio.abc import TaskStatus
from litestar import Litestar, Response, get
from litestar.handlers import asgi
from litestar.types import Receive, Scope, Send

from tfusion.settings import parse_listen

log = logging.getLogger(__name__)


class Server(uvicorn.Server):
    """uvicorn without its own signal handlers: tfusion owns SIGINT/SIGTERM (see roles.py)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def bind_socket(listen: str) -> socket.socket:
    """Bind now, so a port clash is reported at start-up and `:0` yields a known port."""
    host, port = parse_listen(listen)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto IPPROTO_TCP (not 0) so asyncio sets TCP_NODELAY on accepted connections; without it
    # every two-write response waits ~40 ms for the client's delayed ACK
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {listen}: {exc.strerror}") from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


async def serve(app: Any, sock: socket.socket, *, ssl_certfile: str | None = None,
                ssl_keyfile: str | None = None,
                task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
    """Serve `app` on an already bound socket until cancelled; open streams never block shutdown."""
    config = uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False,
                            ssl_certfile=ssl_certfile, ssl_keyfile=ssl_keyfile,
                            timeout_graceful_shutdown=1)
    server = Server(config)
    done = anyio.Event()
    # uvicorn must run its own shutdown (lifespan included) rather than be cancelled mid-way, so it
    # runs shielded and stops through should_exit; the scope is cancelled only if that overruns.
    server_scope = anyio.CancelScope(shield=True)

    async def run_server() -> None:
        try:
            with server_scope:
                await server.serve([sock])
        finally:
            done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(run_server)
        while not server.started:
            if done.is_set():
                raise OSError(f"HTTP server on {sock.getsockname()} failed to start")
            await anyio.sleep(0.01)
        task_status.started()
        try:
            await done.wait()
        finally:
            # Not force_exit yet: uvicorn skips the app's lifespan shutdown when forced. Open streams
            # (watches) are cut by timeout_graceful_shutdown.
            server.should_exit = True
            with anyio.CancelScope(shield=True), anyio.move_on_after(2.5):
                await done.wait()
            server.force_exit = True
            server_scope.cancel()


class Readiness:
    """Named readiness conditions; /readyz is 200 only when every one is true, and lists them all."""

    def __init__(self) -> None:
        self._conditions: dict[str, tuple[bool, str]] = {}

    def set(self, name: str, ready: bool, message: str = "") -> None:
        self._conditions[name] = (ready, message)

    @property
    def ready(self) -> bool:
        return bool(self._conditions) and all(ok for ok, _ in self._conditions.values())

    def body(self) -> dict[str, Any]:
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
    def readyz() -> Response[dict[str, Any]]:
        return Response(readiness.body(), status_code=200 if readiness.ready else 503)

    return [healthz, readyz]


def metrics_handler(registry: prometheus_client.CollectorRegistry) -> Any:
    metrics_app = prometheus_client.make_asgi_app(registry=registry)

    @asgi("/metrics", is_mount=True, include_in_schema=False)
    async def metrics(scope: Scope, receive: Receive, send: Send) -> None:
        await metrics_app(scope, receive, send)

    return metrics


def make_app(handlers: list[Any], *, title: str, **kwargs: Any) -> Litestar:
    from litestar.openapi import OpenAPIConfig

    # logging_config=None: tfusion configures logging once in cli.py; Litestar must not reconfigure it.
    kwargs.setdefault("logging_config", None)
    return Litestar(handlers, openapi_config=OpenAPIConfig(title=title, version="1"), **kwargs)
