"""The `apiserver` pytest fixture: a fresh embedded Kubernetes API server per test, over real HTTP.

Usage (the fixture is registered for every test through tests/conftest.py):

    @pytest.mark.anyio
    async def test_something(apiserver):
        api = await kr8s.asyncio.api(kubeconfig=apiserver.kubeconfig)
        async with apiserver.http() as http:   # httpx on apiserver.url, with the admin token
            ...
        await apply_crds(apiserver)            # only if the test needs the tensor-fusion.ai kinds

    def test_cli(apiserver):                   # sync tests work too (e.g. kubectl in a subprocess)
        subprocess.run(["kubectl", "--kubeconfig", apiserver.kubeconfig, "get", "ns"], check=True)

The server runs in a background thread with its own event loop, so any test event loop (or none)
can talk to it. It listens on 127.0.0.1 with a free port, HTTPS (a self-signed certificate whose
CA is in the kubeconfig and in `.ssl_context`), state in a tmp SQLite file.
Every request but /version and the health checks needs the admin bearer token (`.token`; it is in
the kubeconfig, and `.headers` / `.http()` / `.sync_http()` send it). What kube-apiserver and
kube-controller-manager create at start exists (namespaces default, kube-system, kube-public,
kube-node-lease and tensor-fusion-sys, a `default` ServiceAccount in each namespace, the
system-node-critical and system-cluster-critical PriorityClasses); nothing else is applied (no
CRDs: see apply_crds below).

Semantics worth knowing: metadata.generation is kept for CRDs and custom resources only (as in
kube 1.32); a pod without finalizers is removed at once on DELETE (no kubelet confirms graceful
deletion); watch events are delivered once a write is committed, before or with its response.

Handle (`ApiServerHandle`):
- `.url`, `.kubeconfig` (path of a kubeconfig file, namespace "default"), `.state` (SQLite path),
  `.token` (the admin bearer token), `.headers` (the Authorization header with it),
  `.ssl_context` (trusts the server's certificate), `.http(**kwargs)` / `.sync_http(**kwargs)`:
  httpx clients on `.url` that trust it and send the token (`authenticated=False`: no token);
  `.server` (the EmbeddedApiServer; touch it only through the methods below);
- `.close_watches()`: end every open watch stream (clients see a clean end and must re-watch);
- `.compact()`: drop the watch event log, so a watch from an older resourceVersion gets 410;
- `.restart()`: stop and serve again from the same state file on the same port;
- `.call(fn)`: run a plain function on the server's loop and return its result;
- `.stop()`: stop it early and wait until it has (the fixture stops it anyway).
For a server of your own (another history size, a second server), use
`ApiServerHandle(state_path, kubeconfig_path, watch_history=N).start()` and `.stop()` it.
Bookmarks are sent every `BOOKMARK_INTERVAL_S` (1 s) to watches that allow them.

At teardown the fixture tells the server to stop and does not wait: uvicorn's graceful shutdown
polls every 0.1 s twice (about 0.19 s), which over some 500 tests is more than a minute of a run.
The server finishes stopping in its own thread while the next tests run; a teardown waits for the
oldest only when more than `MAX_STOPPING` are still stopping, and the end of the session waits for all.
What uvicorn logs while it finishes (a connection a test left half-open makes it wait out its
graceful-shutdown timeout and log an ERROR) belongs to the finished test, which no longer reads its
logs, so it is dropped rather than charged to whichever test runs then.

The `kube` fixture is a tfusion KubeClient (no client-side rate limit) on that server; a test
module that needs a namespace first overrides it with a fixture of the same name that asks for
this one and creates it.

`apply_crds(handle)` (async) / `apply_crds_sync(handle)` POST every CRD from
`tfusion.api.crds.all_crds()` and wait until each kind is served.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from tfusion.apiserver.embedded import EmbeddedApiServer
from tfusion.kube.client import KubeClient

T = TypeVar("T")
BOOKMARK_INTERVAL_S = 1.0
#: the thread name of a server the fixture has let go (see the module docstring)
STOPPING = "apiserver (stopping)"


class _NotFromStoppingServers(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.threadName != STOPPING


logging.getLogger("uvicorn.error").addFilter(_NotFromStoppingServers())


class ApiServerHandle:
    """An EmbeddedApiServer running in its own thread and event loop."""

    def __init__(self, state: Path, kubeconfig: Path, *, watch_history: int = 10000, **options: Any) -> None:
        """`options` go to EmbeddedApiServer (e.g. head_timeout, body_timeout, keep_alive)."""
        self.state = state
        self.kubeconfig = str(kubeconfig)
        self.server = EmbeddedApiServer(
            state,
            listen="127.0.0.1:0",
            watch_history=watch_history,
            kubeconfig_path=kubeconfig,
            bookmark_interval=BOOKMARK_INTERVAL_S,
            **options,
        )
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._ready: Future[None] = Future()
        self._thread = threading.Thread(target=self._main, name="apiserver", daemon=True)

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def token(self) -> str:
        assert self.server.token is not None, "the server has not started"
        return self.server.token

    @property
    def headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.token}"}

    @property
    def ssl_context(self) -> ssl.SSLContext:
        """Trusts the server's self-signed certificate (the CA of the kubeconfig)."""
        assert self.server.ca_pem is not None, "the server has not started"
        return ssl.create_default_context(cadata=self.server.ca_pem.decode())

    def http(self, *, authenticated: bool = True, **kwargs: Any) -> httpx.AsyncClient:
        """An async httpx client on this server, sending the admin token unless `authenticated=False`."""
        kwargs.setdefault("timeout", 10)
        headers = self.headers if authenticated else {}
        return httpx.AsyncClient(base_url=self.url, headers=headers, verify=self.ssl_context, **kwargs)

    def sync_http(self, *, authenticated: bool = True, **kwargs: Any) -> httpx.Client:
        kwargs.setdefault("timeout", 10)
        headers = self.headers if authenticated else {}
        return httpx.Client(base_url=self.url, headers=headers, verify=self.ssl_context, **kwargs)

    def start(self) -> ApiServerHandle:
        self._thread.start()
        self._ready.result(timeout=30)
        return self

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve())
        except BaseException as exc:
            if not self._ready.done():
                self._ready.set_exception(exc)
        finally:
            self._loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        async with self.server:
            self._ready.set_result(None)
            await self._stop.wait()

    def _run(self, coro_fn: Callable[[], Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro_fn(), self._loop).result(timeout=60)

    def call(self, fn: Callable[[], T]) -> T:
        async def wrapper() -> T:
            return fn()

        result: T = self._run(wrapper)
        return result

    def close_watches(self) -> None:
        self.call(self.server.close_watches)

    def compact(self) -> None:
        self.call(self.server.compact)

    def restart(self) -> None:
        self._run(self.server.restart)

    def stop(self, *, wait: bool = True) -> None:
        """Stop serving; with `wait=False` return at once and leave the rest to `join()`."""
        if not wait:
            self._thread.name = STOPPING
        if self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        if wait:
            self.join()

    def join(self) -> None:
        """Wait until a stopped server has closed its port and state file."""
        self._thread.join(timeout=30)
        assert not self._thread.is_alive(), "the embedded API server did not stop within 30 s"


#: servers the fixture has told to stop and not yet waited for, oldest first
_stopping: list[ApiServerHandle] = []
#: how many may be stopping at once: enough that a run of short tests never waits (0.19 s each)
MAX_STOPPING = 8


def _join_stopping(keep: int = 0) -> None:
    while len(_stopping) > keep:
        _stopping.pop(0).join()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _join_stopping()


@pytest.fixture
def apiserver(tmp_path: Path) -> Iterator[ApiServerHandle]:
    handle = ApiServerHandle(tmp_path / "state.db", tmp_path / "kubeconfig").start()
    try:
        yield handle
    finally:
        handle.stop(wait=False)
        _stopping.append(handle)
        _join_stopping(keep=MAX_STOPPING)


@pytest.fixture
async def kube(apiserver: ApiServerHandle) -> AsyncIterator[KubeClient]:
    client = await KubeClient.connect(apiserver.kubeconfig, qps=0)
    yield client
    await client.close()


def _crd_objects() -> list[dict[str, Any]]:
    from tfusion.api.crds import all_crds

    return [dict(crd) for crd in all_crds()]


def _crd_path(crd: dict[str, Any]) -> str:
    spec = crd["spec"]
    version = next(v["name"] for v in spec["versions"] if v.get("served", True))
    return f"/apis/{spec['group']}/{version}/{spec['names']['plural']}"


def apply_crds_sync(handle: ApiServerHandle, crds: list[dict[str, Any]] | None = None) -> list[str]:
    """POST each CRD (PUT when it exists) and wait until its kind answers a list; returns the plurals."""
    crds = _crd_objects() if crds is None else crds
    plurals = []
    with handle.sync_http() as client:
        for crd in crds:
            url = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
            response = client.post(url, json=crd)
            if response.status_code == 409:
                current = client.get(f"{url}/{crd['metadata']['name']}").json()
                body = {
                    **crd,
                    "metadata": {**crd["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]},
                }
                response = client.put(f"{url}/{crd['metadata']['name']}", json=body)
            response.raise_for_status()
            plurals.append(crd["spec"]["names"]["plural"])
        deadline = time.monotonic() + 5
        for crd in crds:
            while client.get(_crd_path(crd)).status_code != 200:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"CRD {crd['metadata']['name']} not served after 5 s")
                time.sleep(0.02)
    return plurals


async def apply_crds(handle: ApiServerHandle, crds: list[dict[str, Any]] | None = None) -> list[str]:
    """Async form of apply_crds_sync (runs it in a worker thread)."""
    import anyio.to_thread

    return await anyio.to_thread.run_sync(lambda: apply_crds_sync(handle, crds))
