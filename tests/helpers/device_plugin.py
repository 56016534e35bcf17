"""A fake kubelet for the device plugins, a hypervisor that registers with it, and the worker pods and
device IDs its Allocate is asked about."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import httpx

from tests.apiserver_fixture import ApiServerHandle
from tests.helpers.kube_hypervisor import kube_hypervisor
from tfusion.api import annotations as tfa
from tfusion.api import podindex
from tfusion.hypervisor.deviceplugin import deviceplugin_pb2 as pb
from tfusion.hypervisor.deviceplugin.rpc import (
    Context,
    DevicePluginClient,
    registration_handler,
    unix_target,
)
from tfusion.kube.client import KubeClient
from tfusion.kube.resources import GPUNODES, GPUPOOLS, PODS

NODE = "gpu-node-dp"


SPEC = "sim:2xA100-SXM4-80GB,1xH100-SXM5-80GB"


RESOURCES = [f"tensor-fusion.ai/index_{k:x}" for k in range(16)]


#: what a check raises while the hypervisor has not caught up yet
NOT_YET = (AssertionError, KeyError, StopIteration)


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


def hypervisor(apiserver: ApiServerHandle, state: Path, plugin_dir: Path,
               extra: dict[str, object] | None = None) -> AbstractAsyncContextManager[httpx.AsyncClient]:
    """A hypervisor on this module's node whose device plugins serve in `plugin_dir` (`extra`: more settings)."""
    return kube_hypervisor(apiserver, state, node=NODE, devices=SPEC, plugin_dir=plugin_dir, extra=extra)


async def worker_pod(kube: KubeClient, name: str, index: int, gpu: str, isolation: str = "soft") -> dict[str, Any]:
    resource, count = podindex.encode_pod_index(index)
    return await kube.create(PODS, {
        "metadata": {"name": name, "namespace": "default", "labels": {tfa.COMPONENT: "worker"},
                     "annotations": {tfa.GPU_IDS: gpu, tfa.INDEX: str(index),
                                     tfa.ISOLATION: isolation, tfa.GPU_POOL: "pool-dp",
                                     tfa.TFLOPS_REQUEST: "100", tfa.VRAM_REQUEST: "8Gi",
                                     tfa.TFLOPS_LIMIT: "200", tfa.VRAM_LIMIT: "16Gi"}},
        "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "busybox",
                                                   "resources": {"limits": {resource: str(count)}}}]}})


def ids(k: int, count: int) -> list[str]:
    return [f"{k}-{n}" for n in range(1, count + 1)]


async def pool_and_gpunode(kube: KubeClient) -> None:
    """The GPUPool `pool-dp` and the GPUNode NODE it owns, which the hypervisor under test reports into."""
    pool = await kube.create(GPUPOOLS, {"metadata": {"name": "pool-dp"}, "spec": {"nodeManagerConfig": {}}})
    await kube.create(GPUNODES, {"metadata": {"name": NODE, "ownerReferences": [{
        "apiVersion": "tensor-fusion.ai/v1", "kind": "GPUPool", "name": "pool-dp",
        "uid": pool["metadata"]["uid"], "controller": True}]}, "spec": {}})


@asynccontextmanager
async def plugin_node(apiserver: ApiServerHandle, tmp: Path) -> AsyncIterator[tuple[KubeClient, Path, FakeKubelet]]:
    """A client of the API server, the node's device-plugin directory with a FakeKubelet serving it,
    and the pool and GPUNode the hypervisor under test reports into; all stopped and closed after."""
    kube = await KubeClient.connect(apiserver.kubeconfig)
    plugin_dir = tmp / "device-plugins"
    plugin_dir.mkdir()
    kubelet = FakeKubelet(plugin_dir)
    await kubelet.start()
    try:
        await pool_and_gpunode(kube)
        yield kube, plugin_dir, kubelet
    finally:
        await kubelet.stop()
        await kube.close()
