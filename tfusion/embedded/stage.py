"""The embedded stage of `tfusion --role=all`: bootstrap the API server, then run the simulated kubelet
and the node farm that boots the simulated cloud provider's instances as further Nodes.

roles.py calls `launch_stage` right after the embedded API server serves (or first, when only
`--simulate-kubelet` asks for it) and before the controller and hypervisor. It decides the devices
(with the simulated fallback, devices.py) and starts `run`, whose `task_status.started(StageInfo)`
comes once the CRDs are served, the defaults exist and the Node is registered; the controller's
Node reconciler then creates its GPUNode where a pool selects it, and the hypervisor reports its
GPUs once it exists (it waits for it in the shared cache). Once every role serves,
`Stage.announce` prints the startup summary.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass

import anyio
from anyio.abc import TaskGroup, TaskStatus

from tfusion.api.accessors import GpuPool, Node
from tfusion.api.annotations import INDEX_DEVICES_PER_RESOURCE
from tfusion.embedded.bootstrap import BootstrapReport, bootstrap
from tfusion.embedded.crd_install import CrdInstallError
from tfusion.embedded.defaults import DefaultsError
from tfusion.embedded.devices import DevicePlan, DevicePlanError, plan_devices
from tfusion.embedded.disruption import DisruptionController
from tfusion.embedded.endpoints import EndpointsController
from tfusion.embedded.kubelet import SimulatedKubelet
from tfusion.embedded.node_farm import SimulatedNodeFarm
from tfusion.embedded.volumes import VolumeBinder
from tfusion.embedded.workloads import WorkloadControllers
from tfusion.errors import RoleError
from tfusion.hypervisor.devices.gpu_info import GpuInfoTable, HardwareMetadataError
from tfusion.kube.client import KubeError
from tfusion.kube.manager import Manager
from tfusion.settings import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StageInfo:
    """What the stage did, for the startup summary."""

    bootstrap: BootstrapReport | None
    node: Node | None
    pool: str | None


async def run(settings: Settings, plan: DevicePlan, manager: Manager, *, bootstrap_server: bool,
              task_status: TaskStatus[StageInfo] = anyio.TASK_STATUS_IGNORED) -> None:
    """`bootstrap_server` says the Manager's API server is our embedded one. The simulated
    kubelet registers its pod controller with the Manager, which runs it."""
    client = manager.client
    report = None
    if bootstrap_server:
        try:
            report = await bootstrap(client, settings)
        except (CrdInstallError, DefaultsError, KubeError) as exc:
            raise RoleError(f"embedded bootstrap failed: {exc}") from None
    if not settings.runs_simulated_kubelet:
        task_status.started(StageInfo(report, None, None))
        await anyio.sleep_forever()
    index_devices = INDEX_DEVICES_PER_RESOURCE if settings.has_role("hypervisor") else 0  # device plugins' resources
    kubelet = SimulatedKubelet(manager, settings.resolved_node_name, plan, index_devices=index_devices)
    if bootstrap_server:  # the simulated provider's instances become Nodes (node_farm.py)
        manager.add(_node_farm(settings, manager, index_devices).run, leader_only=False, name="simulated node farm")
    WorkloadControllers(manager)  # Deployments, ReplicaSets, Jobs, CronJobs, DaemonSets, StatefulSets (workloads/)
    EndpointsController(manager)  # Services with selectors get Endpoints and an EndpointSlice (endpoints.py)
    DisruptionController(manager)  # PodDisruptionBudgets count their healthy pods (disruption.py)
    VolumeBinder(manager)  # PersistentVolumeClaims are Bound at once: no storage to provision (volumes.py)
    async with anyio.create_task_group() as tg:
        try:
            node = await tg.start(kubelet.run)
        except KubeError as exc:
            raise RoleError(f"simulated kubelet: registering node {kubelet.node_name} failed: {exc}") from None
        task_status.started(StageInfo(report, node, await _pool_selecting(manager, node)))


def _node_farm(settings: Settings, manager: Manager, index_devices: int) -> SimulatedNodeFarm:
    try:
        table = GpuInfoTable.from_metadata(settings.hardware_metadata)
    except HardwareMetadataError as exc:
        raise RoleError(str(exc)) from None
    return SimulatedNodeFarm(manager, settings.operator_namespace, table=table, isolation_mode=settings.isolation_mode,
                             isolation_policy=settings.resolved_hypervisor_isolation_policy,
                             index_devices=index_devices)


async def _pool_selecting(manager: Manager, node: Node) -> str | None:
    """The pool the Node reconciler puts the node in, for the summary (None: none selects it)."""
    from tfusion.controller.reconcilers.nodeselector import select_pool
    from tfusion.kube.resources import GPUPOOLS

    try:
        return select_pool(map(GpuPool, await manager.client.list(GPUPOOLS)), node)
    except KubeError:
        return None


@dataclass
class Stage:
    """What `launch_stage` did: the settings the other roles get (devices resolved), and for the summary."""

    settings: Settings
    plan: DevicePlan | None = None
    info: StageInfo | None = None

    def announce(self, started: Mapping[str, object]) -> None:
        """Print the startup summary (only when the embedded stage runs: a newcomer's `--role=all`)."""
        if self.info is None:
            return
        from tfusion.embedded.summary import startup_summary

        print(startup_summary(self.settings, started, self.plan, self.info), flush=True)


async def launch_stage(tg: TaskGroup, settings: Settings, *, roles: Collection[str], embedded: bool,
                       manager: Manager) -> Stage:
    """Decide the devices and start the embedded stage in `tg` where this process needs them.
    `embedded`: the API server is our embedded one (settings.kube already points at its kubeconfig)."""
    wants_stage = embedded or settings.runs_simulated_kubelet
    wants_fallback = ("hypervisor" in roles and settings.devices.strip() == "auto"
                      and bool(settings.resolved_sim_devices_fallback))
    if not (wants_stage or wants_fallback):
        return Stage(settings)
    if "hypervisor" not in roles:
        # No devices in this process (e.g. --role=controller --kube=embedded): nothing to probe.
        plan = DevicePlan(settings.devices, (), "none", "no hypervisor in this process")
    else:
        try:
            plan = await plan_devices(settings)
        except DevicePlanError as exc:
            raise RoleError(str(exc)) from None
    settings = settings.replace(devices=plan.spec)
    if not wants_stage:
        return Stage(settings, plan)
    info = await tg.start(_run_stage, settings, plan, manager, embedded)
    return Stage(settings, plan, info)


async def _run_stage(settings: Settings, plan: DevicePlan, manager: Manager, embedded: bool, *,
                     task_status: TaskStatus[StageInfo] = anyio.TASK_STATUS_IGNORED) -> None:
    await run(settings, plan, manager, bootstrap_server=embedded, task_status=task_status)
