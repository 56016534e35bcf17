"""The 16 kubelet device plugins: how a worker pod's container gets its GPUs from the kubelet.

Why: a worker pod asks for `tensor-fusion.ai/index_<k>: c` (the webhook's encoding of its pod index
N = 8k + c, 1..128; `tfusion.api.podindex.encode_pod_index`), and the kubelet starts it only when
a device plugin offers that resource and, on `Allocate`, says what the container gets. The count
the kubelet allocates is the only thing that tells the plugin which pod it is serving, so:

- one gRPC `deviceplugin/v1beta1` server per resource `index_0` … `index_f`, each on its own unix
  socket `tensor-fusion-index-<k>.sock` (k decimal, as upstream) in `--device-plugin-dir`, a stale
  socket removed first. A socket is 0600 (only root, the kubelet, may connect: `Allocate` answers any
  pod's devices); the directory is created 0700 when missing, and the kubelet's own is left alone;
- each registers with the kubelet (`kubelet.sock` there: version v1beta1, its socket's file name as
  endpoint, no PreStartContainer, no preferred allocation). A watch every second re-creates a
  plugin whose socket is gone and registers again — which is what a kubelet restart looks like (it
  deletes the sockets in the directory) — and registers every plugin again when `kubelet.sock` is
  a new file. Until the kubelet's socket exists, the plugins wait for it;
- `ListAndWatch` sends 36 devices `<k>-1` … `<k>-36`, Healthy while the node has a healthy GPU
  (Unhealthy otherwise), and again whenever that changes. Why 36, as upstream, and not 8: the
  kubelet keeps a running container's devices allocated, and pods holding `index_<k>` with counts
  1, 2, … 8 (distinct pod indices, so each count at most once) may run on one node together, which
  needs 1 + 2 + … + 8 = 36 of them; with 8, a pod asking `index_0: 1` next to one holding
  `index_0: 8` would be refused admission;
- `Allocate`: for each container request, `len(devices_ids)` is c, so N = 8k + c; the plugin waits
  (up to 10 minutes, as upstream) for the pod cache to show a worker pod on this node annotated
  `tensor-fusion.ai/index=N` that is not running yet and has its `gpu-ids`, and answers its
  allocation: `NVIDIA_VISIBLE_DEVICES` and `CUDA_VISIBLE_DEVICES` (its GPUs' UUIDs), the limit
  variables (`TF_ISOLATION_MODE`; for soft and hard `TF_GPU_MEMORY_LIMIT`, `TF_CUDA_MEMORY_LIMIT`,
  `TF_CUDA_SM_PERCENT_LIMIT`), its device nodes (`rwm`), and no mounts or CDI devices (the soft
  limiter's shared memory reaches the pod through the webhook's hostPath volume; the NVML backend
  has no vendor libraries to mount). A pod annotated `isolation: partitioned` first gets its MIG
  partition made (`tfusion.hypervisor.partitions.Partitioner`), and the container is given the MIG
  device (`NVIDIA_VISIBLE_DEVICES=MIG-...`) instead of the whole GPU.

Readiness: `device-plugins` is true once all 16 are registered with the current kubelet.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import NoReturn, Protocol

import anyio
import grpc
import grpc.aio

from tfusion.api import annotations as keys
from tfusion.api import podindex
from tfusion.hypervisor.deviceplugin import deviceplugin_pb2 as pb
from tfusion.hypervisor.deviceplugin.rpc import (
    API_VERSION,
    KUBELET_SOCKET,
    Context,
    RegistrationClient,
    device_plugin_handler,
    unix_target,
)
from tfusion.hypervisor.devices.model import DeviceInfo
from tfusion.hypervisor.devices.registry import DeviceChanges, DeviceRegistry
from tfusion.hypervisor.partitions import Partitioner
from tfusion.hypervisor.private import private_directory, private_socket
from tfusion.hypervisor.workers.allocation import AllocationError, build_allocation
from tfusion.hypervisor.workers.model import WorkerAllocation, WorkerInfo
from tfusion.web import Readiness

log = logging.getLogger(__name__)

#: 1 + 2 + ... + 8: every count of one index resource can be held at once on a node (module docstring)
DEVICES_PER_RESOURCE = keys.INDEX_DEVICES_PER_RESOURCE
SOCKET_NAME = "tensor-fusion-index-{}.sock"
WATCH_INTERVAL_S = 1.0
ALLOCATE_WAIT_S = 600.0
REGISTER_TIMEOUT_S = 5.0
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"


class IndexedPods(Protocol):
    """The pod cache as the plugins need it (KubernetesWorkers)."""

    node: str

    def worker_with_index(self, index: int) -> WorkerInfo | None:
        """The worker pod on this node annotated with pod index `index`, not running yet, with its GPUs."""
        ...


def container_response(allocation: WorkerAllocation) -> pb.ContainerAllocateResponse:
    devices = [pb.DeviceSpec(container_path=spec["guestPath"], host_path=spec["hostPath"],
                             permissions=spec.get("permissions", "rwm")) for spec in allocation.device_specs]
    return pb.ContainerAllocateResponse(envs=dict(allocation.envs), devices=devices)


class IndexPlugin:
    """One resource `index_<k>`: its server, its socket and its registration."""

    def __init__(self, k: int, directory: Path, owner: DevicePlugins) -> None:
        self.k = k
        self.resource_name = podindex.index_resource(k)
        self.socket = directory / SOCKET_NAME.format(k)
        self.owner = owner
        self.server: grpc.aio.Server | None = None
        self.registered_with: tuple[int, int] | None = None  # kubelet.sock's (inode, ctime) we registered with

    # --- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        await self.stop()
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
        server = grpc.aio.server()
        server.add_generic_rpc_handlers([device_plugin_handler(self)])
        if server.add_insecure_port(unix_target(str(self.socket))) == 0:
            raise OSError(f"cannot listen on {self.socket}")
        await server.start()
        self.server = server
        private_socket(self.socket)
        self.registered_with = None

    async def stop(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            await server.stop(grace=0)

    async def register(self, kubelet_socket: Path) -> None:
        async with grpc.aio.insecure_channel(unix_target(str(kubelet_socket))) as channel:
            await RegistrationClient(channel).register(pb.RegisterRequest(
                version=API_VERSION, endpoint=self.socket.name, resource_name=self.resource_name,
                options=pb.DevicePluginOptions(pre_start_required=False,
                                               get_preferred_allocation_available=False)),
                timeout=REGISTER_TIMEOUT_S)

    # --- the DevicePlugin service ------------------------------------------------------------------

    def devices(self) -> pb.ListAndWatchResponse:
        health = HEALTHY if self.owner.healthy() else UNHEALTHY
        return pb.ListAndWatchResponse(devices=[pb.Device(ID=f"{self.k}-{n}", health=health)
                                                for n in range(1, DEVICES_PER_RESOURCE + 1)])

    async def get_device_plugin_options(self, request: pb.Empty, context: Context) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=False)

    async def list_and_watch(self, request: pb.Empty, context: Context) -> AsyncIterator[pb.ListAndWatchResponse]:
        while True:
            changed = self.owner.health_changed
            yield self.devices()
            await changed.wait()

    async def get_preferred_allocation(self, request: pb.PreferredAllocationRequest,
                                       context: Context) -> pb.PreferredAllocationResponse:
        return pb.PreferredAllocationResponse(container_responses=[
            pb.ContainerPreferredAllocationResponse(deviceIDs=list(c.available_deviceIDs)[:c.allocation_size])
            for c in request.container_requests])

    async def pre_start_container(self, request: pb.PreStartContainerRequest,
                                  context: Context) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()

    async def allocate(self, request: pb.AllocateRequest, context: Context) -> pb.AllocateResponse:
        responses = []
        for container in request.container_requests:
            count = len(container.devices_ids)
            try:
                index = podindex.decode_pod_index(self.resource_name, count)
            except ValueError as exc:
                await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            allocation = await self.owner.allocation_for(index)
            if isinstance(allocation, str):
                await _abort(context, grpc.StatusCode.FAILED_PRECONDITION, allocation)
            worker = allocation.worker
            log.info("device plugin %s: pod index %d is %s/%s; allocated %s", self.resource_name, index,
                     worker.namespace, worker.name, ", ".join(d.uuid for d in allocation.devices))
            responses.append(container_response(allocation))
        return pb.AllocateResponse(container_responses=responses)


async def _abort(context: Context, code: grpc.StatusCode, message: str) -> NoReturn:
    log.warning("device plugin Allocate refused: %s", message)
    await context.abort(code, message)
    raise AssertionError("unreachable: abort raises")


class DevicePlugins:
    """All 16 plugins, kept registered with the kubelet (see the module docstring)."""

    def __init__(self, directory: Path, pods: IndexedPods, registry: DeviceRegistry, *,
                 readiness: Readiness | None = None, allocate_wait: float = ALLOCATE_WAIT_S,
                 watch_interval: float = WATCH_INTERVAL_S, poll: float = 0.1,
                 bare_process_env: bool = True, clock: Callable[[], float] = anyio.current_time,
                 partitioner: Partitioner | None = None,
                 admit: Callable[[WorkerInfo], str | None] | None = None) -> None:
        self.directory = directory
        #: a last check of a worker before its devices are handed out (the dynamic isolation policy's)
        self.admit = admit
        self.pods = pods
        self.registry = registry
        self.readiness = readiness
        self.allocate_wait = allocate_wait
        self.watch_interval = watch_interval
        self.poll = poll
        self.bare_process_env = bare_process_env
        self.clock = clock
        self.partitioner = partitioner
        self.plugins = [IndexPlugin(k, directory, self) for k in range(keys.INDEX_RESOURCES)]
        self.health_changed = anyio.Event()
        self._healthy = False
        self.registrations = 0
        registry.subscribe(self._on_devices)
        self._set_ready(False, f"waiting for the kubelet's {directory / KUBELET_SOCKET}")

    # --- health ------------------------------------------------------------------------------------

    def healthy(self) -> bool:
        return any(d.healthy for d in self.registry.devices())

    async def _on_devices(self, changes: DeviceChanges) -> None:
        now = self.healthy()
        if now != self._healthy:
            self._healthy = now
            changed, self.health_changed = self.health_changed, anyio.Event()
            changed.set()

    # --- Allocate ----------------------------------------------------------------------------------

    async def allocation_for(self, index: int) -> WorkerAllocation | str:
        """The allocation of the pod with `index`, waiting for the cache; a message when there is none."""
        deadline = self.clock() + self.allocate_wait
        while True:
            worker = self.pods.worker_with_index(index)
            if worker is not None:
                refused = self.admit(worker) if self.admit is not None else None
                if refused:
                    return refused
                known = {d.uuid: d for d in self.registry.devices()}
                partitions: tuple[DeviceInfo, ...] = ()
                if worker.isolation == keys.ISOLATION_PARTITIONED and self.partitioner is not None:
                    made = await self.partitioner.ensure(worker)
                    if isinstance(made, str):
                        return made
                    partitions = made
                try:
                    return build_allocation(worker, known, bare_process=self.bare_process_env, partitions=partitions)
                except AllocationError as exc:
                    return str(exc)
            if self.clock() >= deadline:
                return (f"no worker pod on node {self.pods.node} with annotation {keys.INDEX}={index} and its "
                        f"{keys.GPU_IDS} appeared within {self.allocate_wait:g}s")
            await anyio.sleep(self.poll)

    # --- registration ------------------------------------------------------------------------------

    def _set_ready(self, ready: bool, message: str) -> None:
        if self.readiness is not None:
            self.readiness.set("device-plugins", ready, message)

    async def reconcile(self) -> None:
        """One pass of the watch: serve every plugin, register those the current kubelet does not know."""
        kubelet = self.directory / KUBELET_SOCKET
        try:
            stat = os.stat(kubelet)
        except FileNotFoundError:
            self._set_ready(False, f"waiting for the kubelet's {kubelet}")
            return
        identity = (stat.st_ino, stat.st_ctime_ns)
        errors = []
        for plugin in self.plugins:
            try:
                if plugin.server is None or not plugin.socket.exists():
                    await plugin.start()
                if plugin.registered_with != identity:
                    await plugin.register(kubelet)
                    plugin.registered_with = identity
                    self.registrations += 1
                    log.info("device plugin %s registered with the kubelet (%s)", plugin.resource_name,
                             plugin.socket)
            except (grpc.aio.AioRpcError, OSError) as exc:
                errors.append(f"{plugin.resource_name}: {_rpc_message(exc)}")
        if errors:
            self._set_ready(False, "; ".join(errors))
        else:
            self._set_ready(True, f"{len(self.plugins)} device plugins registered with {kubelet}")

    async def run(self) -> None:
        """Keep the plugins served and registered until cancelled; then stop them and remove their sockets."""
        self._healthy = self.healthy()
        private_directory(self.directory)  # only when missing: the kubelet's own directory is left as it is
        try:
            while True:
                await self.reconcile()
                await anyio.sleep(self.watch_interval)
        finally:
            with anyio.CancelScope(shield=True):
                for plugin in self.plugins:
                    await plugin.stop()
                    with contextlib.suppress(FileNotFoundError):
                        plugin.socket.unlink()


def _rpc_message(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return str(exc)
