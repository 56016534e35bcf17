"""A fake kubelet for the device plugins and a hypervisor that registers with it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path

import anyio
import grpc
import grpc.aio
import httpx

from tests.apiserver_fixture import ApiServerHandle
from tfusion.hypervisor import role
from tfusion.hypervisor.deviceplugin import deviceplugin_pb2 as pb
from tfusion.hypervisor.deviceplugin.rpc import (
    Context,
    DevicePluginClient,
    registration_handler,
    unix_target,
)
from tfusion.settings import Settings

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
