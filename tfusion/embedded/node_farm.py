"""The simulated cloud's machines: in `--role=all`, every instance the simulated provider launched
becomes a Node with simulated GPUs once its boot delay has passed, and goes when it is terminated.

Why here: the provider runs in the controller, which may not import the embedded stage or the
hypervisor (import-linter), so it only writes instance records (ConfigMaps labelled
`tensor-fusion.ai/simulated-instance=true` in the operator namespace, see
`controller/provisioning/providers/simulated.py`). This farm, on the admin Manager, watches them
and plays each booted instance's kubelet and hypervisor:
- a `SimulatedKubelet` registers the Node with the record's labels (the claim's, among them
  `tensor-fusion.ai/node-provisioner`), the cloud's well-known labels (instance type, zone,
  capacity type) and the instance type's cpu and memory, and runs the pods bound to it;
- a `GpuReporter` over the simulated devices `sim:<count>x<model>` creates the node's GPU objects
  and keeps their last-sync fresh once the controller has made the node's GPUNode.
Each node gets a Manager (and a connection) of its own, so that stopping a node stops its
informers, controllers and reporter and nothing else. A deleted record (a terminated instance)
stops the node and deletes the Node and its Lease. Records outlive a restart, as cloud VMs do:
after one, every record whose boot time has passed is booted again, and Nodes of records deleted
meanwhile are deleted.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio
from anyio.abc import TaskGroup

from tfusion.api import annotations as tfa
from tfusion.api.accessors import Body
from tfusion.api.jsontypes import JsonMapping
from tfusion.controller.provisioning.providers.simulated import (
    SIMULATED_INSTANCE,
    SimulatedInstance,
    SimulatedInstanceError,
    simulated_instance,
)
from tfusion.embedded.devices import DevicePlan
from tfusion.embedded.kubelet import SimulatedKubelet, delete_node
from tfusion.hypervisor.devices import DeviceBackendError, open_backend
from tfusion.hypervisor.devices.gpu_info import GpuInfoTable
from tfusion.hypervisor.devices.registry import DeviceRegistry
from tfusion.hypervisor.gpu_report import GpuReporter
from tfusion.kube import resources as r
from tfusion.kube.client import KubeError
from tfusion.kube.manager import Manager
from tfusion.web import Readiness

log = logging.getLogger(__name__)

#: the longest the farm sleeps before it looks at the wall clock again (a clock that jumps)
RECHECK_S = 30.0
#: after a failed boot (the API server refused, say), this long before the next try
BOOT_RETRY_S = 5.0
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
ZONE_LABEL = "topology.kubernetes.io/zone"
CAPACITY_TYPE_LABEL = "karpenter.sh/capacity-type"

NodeManagerFactory = Callable[[str], Awaitable[Manager]]


def node_labels(instance: SimulatedInstance) -> dict[str, str]:
    """The Node's labels: the claim's, then the ones a cloud's kubelet sets (Karpenter's capacity
    type is lower case: on-demand, spot)."""
    capacity = "on-demand" if instance.capacity_type == "OnDemand" else instance.capacity_type.lower()
    return {**instance.node_labels, SIMULATED_INSTANCE: "true", tfa.NODE_PROVISIONER: instance.claim,
            INSTANCE_TYPE_LABEL: instance.instance_type, ZONE_LABEL: instance.zone, CAPACITY_TYPE_LABEL: capacity}


@dataclass
class _Booted:
    """A node the farm runs (or is booting, or stopping)."""

    instance: SimulatedInstance
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    retiring: bool = False
    running: bool = False  # the Node is registered


class SimulatedNodeFarm:
    """See the module docstring. `wall`: epoch seconds, compared with the records' `bootAt`;
    `node_manager`: makes the Manager of one node (default: a new connection with the admin
    Manager's settings)."""

    def __init__(self, manager: Manager, namespace: str, *, table: GpuInfoTable, isolation_mode: str,
                 isolation_policy: str, index_devices: int = 0, wall: Callable[[], float] = time.time,
                 node_manager: NodeManagerFactory | None = None) -> None:
        self.client = manager.client
        self.clock = manager.clock
        self.namespace = namespace
        self.table = table
        self.isolation_mode = isolation_mode
        self.isolation_policy = isolation_policy
        self.index_devices = index_devices
        self.wall = wall
        self._node_manager = node_manager or self._connect_like(manager)
        self.records = manager.cache.informer(r.CONFIGMAPS, namespace=namespace,
                                              label_selector=f"{SIMULATED_INSTANCE}=true")
        self.records.add_handler(on_add=self._changed, on_update=self._changed, on_delete=self._changed)
        self._nodes: dict[str, _Booted] = {}  # instance id -> its node
        #: instance id -> bootAt of the records whose boot time has not come (as of the last look)
        self.pending: dict[str, float] = {}
        self._unreadable: set[tuple[str, str]] = set()  # (name, resourceVersion) already warned about
        self._wake = anyio.Event()

    @staticmethod
    def _connect_like(manager: Manager) -> NodeManagerFactory:
        async def connect(node: str) -> Manager:
            return await Manager.connect(manager.settings, clock=manager.clock, identity=f"simulated-node-{node}")
        return connect

    @property
    def running(self) -> dict[str, str]:
        """Instance id -> node name of the nodes registered now."""
        return {iid: b.instance.node_name for iid, b in self._nodes.items() if b.running and not b.retiring}

    def recheck(self) -> None:
        """Look at the records and the wall clock now (a test that moved its clock says so)."""
        self._wake.set()

    def _changed(self, *_: object) -> None:
        self._wake.set()

    async def run(self) -> None:
        await self.records.wait_synced()
        await self._delete_strays()
        async with anyio.create_task_group() as tg:
            while True:
                self._wake = anyio.Event()
                wait = self._converge(tg)
                with self.clock.move_on_after(min(wait, RECHECK_S)):
                    await self._wake.wait()

    # --- converging ---------------------------------------------------------------------------------

    def _wanted(self) -> dict[str, SimulatedInstance]:
        wanted = {}
        for raw in self.records.list():
            try:
                found = simulated_instance(raw)
            except SimulatedInstanceError as exc:
                self._warn_once(raw, str(exc))
                continue
            wanted[found.instance_id] = found
        return wanted

    def _warn_once(self, raw: JsonMapping, message: str) -> None:
        body = Body(raw)
        seen = (body.name, body.meta.resource_version or "")
        if seen not in self._unreadable:
            self._unreadable.add(seen)
            log.warning("%s; no node boots for it", message)

    def _converge(self, tg: TaskGroup) -> float:
        """Start the nodes due, stop the ones whose record is gone; seconds until the next boot."""
        wanted = self._wanted()
        for iid, booted in self._nodes.items():
            if iid not in wanted and not booted.retiring:
                booted.retiring = True
                booted.scope.cancel()
        now = self.wall()
        self.pending = {}
        for iid, instance in wanted.items():
            if iid in self._nodes:
                continue  # running, or the old node of a re-created record still stopping
            if instance.boot_at <= now:
                booted = self._nodes[iid] = _Booted(instance)
                tg.start_soon(self._serve, booted)
            else:
                self.pending[iid] = instance.boot_at
        return min(self.pending.values(), default=math.inf) - now

    async def _serve(self, booted: _Booted) -> None:
        instance = booted.instance
        try:
            with booted.scope:
                failed = False
                try:
                    await self._run_node(booted)
                except* (KubeError, DeviceBackendError, OSError, ValueError) as group:
                    failed = True
                    log.warning("simulated instance %s: node %s failed: %s; trying again in %.0f s",
                                instance.instance_id, instance.node_name,
                                "; ".join(map(str, group.exceptions)), BOOT_RETRY_S)
                if failed:
                    await self.clock.sleep(BOOT_RETRY_S)
            if booted.retiring:
                with anyio.CancelScope(shield=True):
                    await self._delete_node(instance.node_name)
        finally:
            self._nodes.pop(instance.instance_id, None)
            self._wake.set()

    async def _run_node(self, booted: _Booted) -> None:
        """Boot one instance and serve it until cancelled."""
        instance = booted.instance
        node = instance.node_name
        backend = await open_backend(instance.device_spec, node_name=node, table=self.table)
        try:
            registry = DeviceRegistry(backend, self.table)
            found = await registry.discover()
            plan = DevicePlan(instance.device_spec, found.current, backend.name,
                              f"simulated instance {instance.instance_id}")
            manager = await self._node_manager(node)
            kubelet = SimulatedKubelet(manager, node, plan, index_devices=self.index_devices,
                                       labels=node_labels(instance),
                                       machine={"cpu": instance.cpu, "memory": instance.memory})
            reporter = GpuReporter(manager, registry, Readiness(), node=node, isolation_mode=self.isolation_mode,
                                   isolation_policy=self.isolation_policy)
            manager.add(reporter.run, leader_only=False, name=f"GPU reporter of simulated node {node}")
            async with anyio.create_task_group() as tg:
                await tg.start(manager.run)
                await tg.start(kubelet.run)
                booted.running = True
                log.info("simulated instance %s (%s) booted as node %s: %s", instance.instance_id,
                         instance.instance_type, node, plan.describe())
        finally:
            booted.running = False
            with anyio.CancelScope(shield=True):
                await backend.close()

    async def _delete_node(self, node: str) -> None:
        """The instance is terminated: its Node and Lease go (its kubelet has stopped)."""
        try:
            await delete_node(self.client, node)
        except KubeError as exc:
            log.warning("terminated simulated instance: deleting node %s failed: %s", node, exc)
            return
        log.info("simulated node %s is gone (its instance was terminated)", node)

    async def _delete_strays(self) -> None:
        """Nodes of instances terminated while this process was down."""
        keep = {found.node_name for found in self._wanted().values()}
        try:
            nodes = await self.client.list(r.NODES, label_selector=f"{SIMULATED_INSTANCE}=true")
        except KubeError as exc:
            log.warning("listing simulated nodes failed: %s", exc)
            return
        for node in nodes:
            name = Body(node).name
            if name not in keep:
                await self._delete_node(name)
