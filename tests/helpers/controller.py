"""An in-process controller on the embedded API server (settings, start and stop)
and the GPU, pool and worker-pod objects controller tests create."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx

from tfusion.api import annotations as tfa
from tfusion.controller.allocation import AllocatorService
from tfusion.controller.role import ControllerRole, build_runtime, configure, serve_runtime
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient
from tfusion.settings import Settings

POOL = "pool-a"


SCHEDULER = "tensor-fusion-scheduler"


def settings_for(apiserver: Any, tmp_path: Path, **changes: Any) -> Settings:
    base = Settings(roles=("controller",), kube=str(apiserver.kubeconfig), controller_listen="127.0.0.1:0",
                    health_probe_listen="127.0.0.1:0", webhook_listen="127.0.0.1:0",
                    dynamic_config=str(tmp_path / "config.yaml"), leader_elect=False, sync_interval=0.2,
                    leader_lease_duration=2.0, leader_renew_deadline=1.5, leader_retry_period=0.2,
                    operator_namespace="tf-ops")
    return base.replace(**changes)


@contextlib.asynccontextmanager
async def kube_client(apiserver: Any) -> AsyncIterator[KubeClient]:
    client = await KubeClient.connect(str(apiserver.kubeconfig), namespace="default")
    try:
        yield client
    finally:
        await client.close()


def service_of(runtime: ControllerRole) -> AllocatorService:
    found = [getattr(t, "__self__", None) for t in runtime.leader_tasks]
    services = [s for s in found if isinstance(s, AllocatorService)]
    assert len(services) == 1, "configure() attaches exactly one AllocatorService"
    return services[0]


class Controller:
    """One controller runtime served in the background of a test's task group; `stop()` ends it
    (as SIGTERM would: the Lease is released, the server closed)."""

    def __init__(self, runtime: ControllerRole, scope: anyio.CancelScope, finished: anyio.Event) -> None:
        assert runtime.address is not None
        self.runtime = runtime
        self.http = httpx.AsyncClient(base_url=f"http://127.0.0.1:{runtime.address[1]}", timeout=10)
        self._scope = scope
        self._finished = finished

    @property
    def service(self) -> AllocatorService:
        return service_of(self.runtime)

    async def stop(self) -> None:
        await self.http.aclose()
        self._scope.cancel()
        with anyio.fail_after(10):
            await self._finished.wait()


async def start_controller(tg: Any, settings: Settings, *,
                           prepare: Callable[[ControllerRole], None] = configure) -> Controller:
    runtime = await build_runtime(settings)
    prepare(runtime)
    scope = anyio.CancelScope()
    finished = anyio.Event()

    async def run(*, task_status: Any) -> None:
        try:
            with scope:
                await serve_runtime(runtime, task_status=task_status)
        finally:
            finished.set()

    await tg.start(run)
    return Controller(runtime, scope, finished)


@contextlib.asynccontextmanager
async def controllers() -> AsyncIterator[Any]:
    """A task group for controllers; whatever is still running at the end is stopped."""
    async with anyio.create_task_group() as tg:
        yield tg
        tg.cancel_scope.cancel()


async def create_gpu(kube: KubeClient, name: str, node: str, *, tflops: str = "100", vram: str = "40Gi",
                     index: int = 0, model: str = "A100_SXM_40G") -> None:
    await kube.create(r.GPUS, {"metadata": {"name": name, "labels": {tfa.GPU_POOL: POOL, tfa.MANAGED_BY: node}}})
    await kube.patch(r.GPUS, name, {"status": {
        "phase": "Running", "vendor": "NVIDIA", "gpuModel": model, "uuid": f"GPU-{name}", "index": index,
        "message": "managed", "usedBy": "tensor-fusion", "isolationMode": "soft",
        "nodeSelector": {"kubernetes.io/hostname": node},
        "capacity": {"tflops": tflops, "vram": vram}, "available": {"tflops": tflops, "vram": vram},
    }}, subresource="status")


async def create_pool(kube: KubeClient, *, mode: str | None = None,
                      oversubscription: dict[str, int] | None = None) -> None:
    spec: dict[str, Any] = {"nodeManagerConfig": {}}
    if oversubscription is not None:
        spec["capacityConfig"] = {"oversubscription": oversubscription}
    if mode is not None:
        await kube.create(r.SCHEDULINGCONFIGTEMPLATES, {"metadata": {"name": "placement"},
                                                        "spec": {"placement": {"mode": mode}}})
        spec["schedulingConfigTemplate"] = "placement"
    await kube.create(r.GPUPOOLS, {"metadata": {"name": POOL}, "spec": spec})


def worker(name: str, node: str | None, gpus: list[str], *, tflops: str, vram: str,
           component: str = "worker") -> dict[str, Any]:
    notes = {tfa.GPU_POOL: POOL, tfa.TFLOPS_REQUEST: tflops, tfa.VRAM_REQUEST: vram,
             tfa.TFLOPS_LIMIT: tflops, tfa.VRAM_LIMIT: vram, tfa.GPU_COUNT: str(len(gpus)),
             tfa.GPU_IDS: ",".join(gpus)}
    spec: dict[str, Any] = {"schedulerName": SCHEDULER, "containers": [{"name": "w", "image": "worker"}]}
    if node is not None:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "namespace": "default", "annotations": notes,
                         "labels": {tfa.COMPONENT: component, tfa.WORKLOAD: name}}, "spec": spec}


def probe_pod(*, tflops: str = "10", vram: str = "4Gi", scheduler: str = SCHEDULER) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "probe", "namespace": "default", "annotations": {
                tfa.GPU_POOL: POOL, tfa.TFLOPS_REQUEST: tflops, tfa.VRAM_REQUEST: vram}},
            "spec": {"schedulerName": scheduler, "containers": [{"name": "c", "image": "app"}]}}


async def gpu_available(kube: KubeClient, name: str) -> dict[str, str]:
    return dict(((await kube.get(r.GPUS, name)).get("status") or {}).get("available") or {})
