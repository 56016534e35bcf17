"""The hypervisor's 16 kubelet device plugins against a fake kubelet written here with grpcio: the real
deviceplugin/v1beta1 protocol over real unix sockets. Registration, ListAndWatch (36 devices each, and
their health), Allocate mapped back to the pod through the index encoding and the pod cache, and a
kubelet restart (its sockets deleted, a new kubelet.sock) after which every plugin registers again."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import anyio
import grpc
import grpc.aio
import httpx
import pytest

from tests.apiserver_fixture import ApiServerHandle, apply_crds
from tfusion.api import annotations
from tfusion.hypervisor import role
from tfusion.hypervisor.deviceplugin import deviceplugin_pb2 as pb
from tfusion.hypervisor.deviceplugin.rpc import (
    Context,
    DevicePluginClient,
    registration_handler,
    unix_target,
)
from tfusion.kube.client import KubeClient
from tfusion.kube.resources import GPUNODES, GPUPOOLS, PODS
from tfusion.settings import Settings

pytestmark = pytest.mark.anyio

NODE = "gpu-node-dp"
SPEC = "sim:2xA100-SXM4-80GB,1xH100-SXM5-80GB"
RESOURCES = [f"tensor-fusion.ai/index_{k:x}" for k in range(16)]


class FakeKubelet:
    """The kubelet's side: a Registration server on kubelet.sock that, like the kubelet, opens a
    ListAndWatch stream to every plugin that registers and remembers the last device list."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.registrations: list[pb.RegisterRequest] = []
        self.devices: dict[str, list[tuple[str, str]]] = {}
        self._server: grpc.aio.Server | None = None
        self._watches: list[asyncio.Task[None]] = []
        self._channels: list[grpc.aio.Channel] = []

    async def start(self) -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers([registration_handler(self._register)])
        server.add_insecure_port(unix_target(str(self.directory / "kubelet.sock")))
        await server.start()
        self._server = server

    async def _register(self, request: pb.RegisterRequest, context: Context) -> pb.Empty:
        self.registrations.append(request)
        self._watches.append(asyncio.create_task(self._watch(request.resource_name, request.endpoint)))
        return pb.Empty()

    async def _watch(self, resource: str, endpoint: str) -> None:
        with suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
            async for answer in self.client(endpoint).list_and_watch():
                self.devices[resource] = [(d.ID, d.health) for d in answer.devices]

    def client(self, endpoint: str) -> DevicePluginClient:
        channel = grpc.aio.insecure_channel(unix_target(str(self.directory / endpoint)))
        self._channels.append(channel)
        return DevicePluginClient(channel)

    def endpoint(self, resource: str) -> str:
        return next(r.endpoint for r in reversed(self.registrations) if r.resource_name == resource)

    async def stop(self) -> None:
        """What a kubelet restart does to the directory: its server goes and every socket is removed."""
        for task in self._watches:
            task.cancel()
        for channel in self._channels:
            await channel.close()
        self._watches, self._channels = [], []
        if self._server is not None:
            await self._server.stop(grace=0)
        for sock in self.directory.glob("*.sock"):
            sock.unlink()
        self.devices.clear()


async def eventually(check: Any, timeout: float = 20.0) -> Any:
    with anyio.fail_after(timeout):
        while True:
            try:
                return await check()
            except (AssertionError, KeyError, StopIteration):
                await anyio.sleep(0.1)


@asynccontextmanager
async def hypervisor(apiserver: ApiServerHandle, state: Path, plugin_dir: Path) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings.load({"backend": "kubernetes", "devices": SPEC, "hypervisor_port": 0, "node_name": NODE,
                              "kube": apiserver.kubeconfig, "state_dir": str(state), "shm_root": str(state / "shm"),
                              "device_plugin_dir": str(plugin_dir),
                              "metrics_output_path": str(state / "metrics.log")}, env={}, roles=("hypervisor",))
    async with anyio.create_task_group() as tg:
        port = await tg.start(role.run, settings)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            yield http
        tg.cancel_scope.cancel()


async def worker_pod(kube: KubeClient, name: str, index: int, gpu: str, isolation: str = "soft") -> dict[str, Any]:
    resource, count = annotations.encode_pod_index(index)
    return await kube.create(PODS, {
        "metadata": {"name": name, "namespace": "default", "labels": {annotations.COMPONENT: "worker"},
                     "annotations": {annotations.GPU_IDS: gpu, annotations.INDEX: str(index),
                                     annotations.ISOLATION: isolation, annotations.GPU_POOL: "pool-dp",
                                     annotations.TFLOPS_REQUEST: "100", annotations.VRAM_REQUEST: "8Gi",
                                     annotations.TFLOPS_LIMIT: "200", annotations.VRAM_LIMIT: "16Gi"}},
        "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "busybox",
                                                   "resources": {"limits": {resource: str(count)}}}]}})


def ids(k: int, count: int) -> list[str]:
    return [f"{k}-{n}" for n in range(1, count + 1)]


async def test_device_plugins_with_a_fake_kubelet(apiserver: ApiServerHandle, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    kube = await KubeClient.connect(apiserver.kubeconfig)
    plugin_dir = tmp_path / "device-plugins"
    plugin_dir.mkdir()
    kubelet = FakeKubelet(plugin_dir)
    await kubelet.start()
    try:
        pool = await kube.create(GPUPOOLS, {"metadata": {"name": "pool-dp"}, "spec": {"nodeManagerConfig": {}}})
        await kube.create(GPUNODES, {"metadata": {"name": NODE, "ownerReferences": [{
            "apiVersion": "tensor-fusion.ai/v1", "kind": "GPUPool", "name": "pool-dp",
            "uid": pool["metadata"]["uid"], "controller": True}]}, "spec": {}})
        async with hypervisor(apiserver, tmp_path / "state", plugin_dir) as http:
            async def all_registered() -> None:
                assert sorted(r.resource_name for r in kubelet.registrations) == sorted(RESOURCES)
                assert len(kubelet.devices) == 16

            await eventually(all_registered)
            first = {r.resource_name: r for r in kubelet.registrations}
            assert first["tensor-fusion.ai/index_a"].endpoint == "tensor-fusion-index-10.sock"
            assert all(r.version == "v1beta1" and not r.options.pre_start_required
                       and not r.options.get_preferred_allocation_available for r in first.values())
            assert kubelet.devices["tensor-fusion.ai/index_3"] == [(i, "Healthy") for i in ids(3, 36)]

            async def ready() -> None:
                conditions = {c["name"]: c for c in (await http.get("/readyz")).json()["conditions"]}
                assert conditions["device-plugins"]["ready"] is True, conditions["device-plugins"]
                assert "16 device plugins registered" in conditions["device-plugins"]["message"]

            await eventually(ready)

            devices = (await http.get("/api/v1/devices")).json()["data"]
            h100 = devices[2]["UUID"]
            await worker_pod(kube, "train-0", 11, h100)  # index 11 = index_1 asked 3 times
            plugin = kubelet.client(kubelet.endpoint("tensor-fusion.ai/index_1"))

            async def allocated() -> pb.AllocateResponse:
                return await plugin.allocate(pb.AllocateRequest(container_requests=[
                    pb.ContainerAllocateRequest(devices_ids=ids(1, 3))]), timeout=10)

            answer = (await allocated()).container_responses[0]
            native = "GPU-" + h100[4:]
            assert dict(answer.envs) == {
                "NVIDIA_VISIBLE_DEVICES": native, "CUDA_VISIBLE_DEVICES": native, "TF_ISOLATION_MODE": "soft",
                "TF_GPU_MEMORY_LIMIT": str(16 * 1024**3), "TF_CUDA_MEMORY_LIMIT": str(16 * 1024**3),
                "TF_CUDA_SM_PERCENT_LIMIT": "21"}
            assert [(d.container_path, d.host_path, d.permissions) for d in answer.devices] == [
                ("/dev/nvidia2", "/dev/nvidia2", "rwm")]
            assert list(answer.mounts) == [] and list(answer.cdi_devices) == []

            # Allocate waits for the pod cache: the request comes before the pod (index 20 = index_2 x 4)
            plugin2 = kubelet.client(kubelet.endpoint("tensor-fusion.ai/index_2"))
            async with anyio.create_task_group() as tg:
                results: list[pb.AllocateResponse] = []

                async def ask() -> None:
                    results.append(await plugin2.allocate(pb.AllocateRequest(container_requests=[
                        pb.ContainerAllocateRequest(devices_ids=ids(2, 4))]), timeout=20))

                tg.start_soon(ask)
                await anyio.sleep(0.5)
                assert results == []
                await worker_pod(kube, "late-0", 20, devices[0]["UUID"], isolation="shared")
            assert dict(results[0].container_responses[0].envs) == {
                "NVIDIA_VISIBLE_DEVICES": "GPU-" + devices[0]["UUID"][4:],
                "CUDA_VISIBLE_DEVICES": "GPU-" + devices[0]["UUID"][4:], "TF_ISOLATION_MODE": "shared"}

            with pytest.raises(grpc.aio.AioRpcError) as too_many:
                await plugin.allocate(pb.AllocateRequest(container_requests=[
                    pb.ContainerAllocateRequest(devices_ids=[*ids(1, 8), "1-9"])]), timeout=5)
            assert too_many.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            with pytest.raises(grpc.aio.AioRpcError) as nobody:  # no pod has index 12: it keeps waiting
                await plugin.allocate(pb.AllocateRequest(container_requests=[
                    pb.ContainerAllocateRequest(devices_ids=ids(1, 4))]), timeout=1)
            assert nobody.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED

            # every GPU unhealthy: every plugin's devices turn Unhealthy (the sim's load file)
            load = {"devices": {str(i): {"healthy": False, "healthMessage": "XID 79"} for i in range(3)}}
            (tmp_path / "state" / "sim-load.json").write_text(json.dumps(load))

            async def unhealthy() -> None:
                assert kubelet.devices["tensor-fusion.ai/index_f"] == [(i, "Unhealthy") for i in ids(15, 36)]

            await eventually(unhealthy)
            (tmp_path / "state" / "sim-load.json").write_text(json.dumps({"devices": {
                str(i): {"healthy": True} for i in range(3)}}))

            async def healthy_again() -> None:
                assert kubelet.devices["tensor-fusion.ai/index_f"] == [(i, "Healthy") for i in ids(15, 36)]

            await eventually(healthy_again)

            # the kubelet restarts: sockets gone, a new kubelet.sock; every plugin registers again
            await kubelet.stop()
            kubelet = FakeKubelet(plugin_dir)
            await kubelet.start()
            await eventually(all_registered)
            assert kubelet.devices["tensor-fusion.ai/index_0"] == [(i, "Healthy") for i in ids(0, 36)]
            await worker_pod(kube, "after-0", 1, h100, isolation="hard")
            again = await kubelet.client(kubelet.endpoint("tensor-fusion.ai/index_0")).allocate(
                pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids(0, 1))]))
            assert again.container_responses[0].envs["TF_ISOLATION_MODE"] == "hard"
        assert sorted(p.name for p in plugin_dir.glob("tensor-fusion-index-*.sock")) == []  # removed on stop
    finally:
        await kubelet.stop()
        await kube.close()


async def test_plugins_wait_for_the_kubelet(apiserver: ApiServerHandle, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    plugin_dir = tmp_path / "device-plugins"
    async with hypervisor(apiserver, tmp_path / "state", plugin_dir) as http:
        async def waiting() -> None:
            conditions = {c["name"]: c for c in (await http.get("/readyz")).json()["conditions"]}
            assert conditions["device-plugins"]["ready"] is False
            assert "waiting for the kubelet's" in conditions["device-plugins"]["message"]

        await eventually(waiting)
        kubelet = FakeKubelet(plugin_dir)
        await kubelet.start()
        try:
            async def registered() -> None:
                assert len({r.resource_name for r in kubelet.registrations}) == 16

            await eventually(registered)
        finally:
            await kubelet.stop()
