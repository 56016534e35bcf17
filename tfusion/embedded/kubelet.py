"""A simulated kubelet for this machine's node, so that pods bound to it run (on paper) without a cluster.

What a kubelet tells the API server, and nothing it does to a machine (no containers are started):
- registers the Node: labels `kubernetes.io/hostname`, `kubernetes.io/os`, `kubernetes.io/arch`,
  and, where the machine has GPUs, NVIDIA GPU-feature-discovery's `nvidia.com/gpu.present=true`,
  `nvidia.com/gpu.count` and (one model only) `nvidia.com/gpu.product`; status with this host's
  CPU, memory and disk as capacity and allocatable, 110 pods, and — when this process runs the
  hypervisor, whose device plugins a real kubelet would list — its 16 index resources
  `tensor-fusion.ai/index_0` … `index_f` with 36 each (what ListAndWatch reports), a Ready condition, address
  127.0.0.1 and node info. An existing Node keeps everything but those labels and its status
  (a cordon or a taint the user set stays);
- renews the node Lease `kube-node-lease/<node>` every 10 s and the Node status every minute;
- moves pods bound to the node (`spec.nodeName`) from Pending to Running: phase, conditions,
  pod IP and host IP 127.0.0.1, start time, running container statuses (init containers completed);
- plays a container exit where the pod asks for one (our own annotations, for Jobs in --role=all):
  `tfusion.dev/simulate-exit-after: "2s"` makes the containers exit that long after they started,
  with `tfusion.dev/simulate-exit-code` (default 0); restartPolicy Never then gives phase Succeeded
  (code 0) or Failed, OnFailure restarts them on a non-zero code, Always restarts them (restartCount
  counts up). Without the annotation a pod runs until deleted;
- finishes deletions: a pod with a deletionTimestamp gets its containers terminated (exit 0) and
  phase Succeeded, then, once no finalizer is left, a DELETE with gracePeriodSeconds=0 (kube-apiserver
  keeps a gracefully deleted pod until the kubelet does that; the embedded server removes a pod
  without finalizers at once, and one with finalizers when the last is removed, so there that DELETE
  usually finds nothing, which is fine).
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TypedDict

import anyio
from anyio.abc import TaskStatus

from tfusion import __version__
from tfusion.api import annotations as ann
from tfusion.api import podindex
from tfusion.api.accessors import Node, Pod, section, text
from tfusion.api.annotations import now_rfc3339
from tfusion.api.durations import parse_duration
from tfusion.api.jsontypes import JsonMapping, JsonObject, JsonValue, json_object
from tfusion.api.quantity import Quantity
from tfusion.api.timestamps import parse_rfc3339
from tfusion.embedded.devices import DevicePlan
from tfusion.kube import resources as r
from tfusion.kube.client import AlreadyExists, Conflict, KubeClient, KubeError, NotFound
from tfusion.kube.informer import node_name_index
from tfusion.kube.leader import micro_time
from tfusion.kube.manager import Manager
from tfusion.kube.reconciler import Result

log = logging.getLogger(__name__)

LEASE_NAMESPACE = "kube-node-lease"
LEASE_DURATION_S = 40
LEASE_RENEW_S = 10.0
STATUS_REPORT_S = 60.0
MAX_PODS = "110"
NODE_IP = "127.0.0.1"
KUBELET_VERSION = "v1.32.0"
#: the node labels this kubelet owns (GPU feature discovery's); others on the Node are the user's
GPU_LABELS = ("nvidia.com/gpu.present", "nvidia.com/gpu.count", "nvidia.com/gpu.product")


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def _memory_kib() -> int:
    for line in _read("/proc/meminfo").splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1])
    return 0


def _disk_kib() -> int:
    try:
        return shutil.disk_usage(tempfile.gettempdir()).total // 1024
    except OSError:
        return 0


def _kib_quantity(kib: int) -> str:
    """KiB in the canonical form Kubernetes prints ("24684084Ki", but "16Gi" and "0")."""
    return str(Quantity.from_int(kib * 1024, "BinarySI"))


def _arch() -> str:
    machine = platform.machine().lower()
    return {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm"}.get(machine, machine or "unknown")


def node_labels(node_name: str, plan: DevicePlan) -> dict[str, str | None]:
    """The labels this kubelet sets (None removes a GPU label the machine no longer earns)."""
    labels: dict[str, str | None] = {
        "kubernetes.io/hostname": node_name, "kubernetes.io/os": platform.system().lower() or "linux",
        "kubernetes.io/arch": _arch(), **dict.fromkeys(GPU_LABELS),
    }
    if plan.count:
        labels["nvidia.com/gpu.present"] = "true"
        labels["nvidia.com/gpu.count"] = str(plan.count)
        models = {d.model for d in plan.devices}
        if len(models) == 1:
            labels["nvidia.com/gpu.product"] = next(iter(models)).replace(" ", "-")
    return labels


class NodeCondition(TypedDict):
    """One of the four conditions a healthy kubelet reports on its Node."""
    type: str
    status: str
    reason: str
    message: str
    lastHeartbeatTime: str
    lastTransitionTime: str


class NodeAddress(TypedDict):
    type: str
    address: str


class NodeStatus(TypedDict):
    """The Node status this kubelet writes (every field, every time)."""
    capacity: dict[str, str]
    allocatable: dict[str, str]
    conditions: list[NodeCondition]
    addresses: list[NodeAddress]
    daemonEndpoints: dict[str, dict[str, int]]
    nodeInfo: dict[str, str]


def node_status(node_name: str, old: Node | None = None, *, index_devices: int = 0,
                machine: Mapping[str, str] | None = None) -> NodeStatus:
    """The Node status a healthy kubelet reports now (lastTransitionTime kept while unchanged);
    `index_devices` > 0 adds the hypervisor's 16 index resources with that many devices each;
    `machine` replaces this host's capacities (a simulated cloud instance's cpu and memory)."""
    cpu = str(os.cpu_count() or 1)
    resources: dict[str, str] = {"cpu": cpu, "memory": _kib_quantity(_memory_kib()), "pods": MAX_PODS,
                 "ephemeral-storage": _kib_quantity(_disk_kib()), **(machine or {})}
    if index_devices > 0:
        resources.update(dict.fromkeys(podindex.index_resource_names(), str(index_devices)))
    now = now_rfc3339()
    previous = {c.get("type"): c for c in old.conditions} if old is not None else {}

    def condition(kind: str, status: str, reason: str, message: str) -> NodeCondition:
        before = previous.get(kind)
        kept = before is not None and before.get("status") == status
        since = text(before, "lastTransitionTime") if before is not None and kept else None
        return {"type": kind, "status": status, "reason": reason, "message": message,
                "lastHeartbeatTime": now, "lastTransitionTime": since or now}

    return {
        "capacity": resources, "allocatable": dict(resources),
        "conditions": [
            condition("MemoryPressure", "False", "KubeletHasSufficientMemory",
                      "kubelet has sufficient memory available"),
            condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            condition("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
            condition("Ready", "True", "KubeletReady", "kubelet is posting ready status (tfusion simulated kubelet)"),
        ],
        "addresses": [{"type": "InternalIP", "address": NODE_IP}, {"type": "Hostname", "address": node_name}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
        "nodeInfo": {
            "machineID": _read("/etc/machine-id"), "systemUUID": _read("/sys/class/dmi/id/product_uuid"),
            "bootID": _read("/proc/sys/kernel/random/boot_id"), "kernelVersion": platform.release(),
            "osImage": _os_image(), "containerRuntimeVersion": f"tfusion-sim://{__version__}",
            "kubeletVersion": KUBELET_VERSION, "kubeProxyVersion": "",
            "operatingSystem": platform.system().lower() or "linux", "architecture": _arch(),
        },
    }


def _os_image() -> str:
    for line in _read("/etc/os-release").splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.split("=", 1)[1].strip('"')
    return platform.platform()


# --- pods ---------------------------------------------------------------------------------------


def _container_id(pod_uid: str, container: str) -> str:
    return "sim://" + hashlib.sha256(f"{pod_uid}/{container}".encode()).hexdigest()[:32]


def _set_conditions(old: Sequence[JsonMapping], wanted: dict[str, str], now: str) -> list[JsonValue]:
    by_type = {c.get("type"): json_object(c) for c in old}
    for kind, status in wanted.items():
        condition = by_type.get(kind) or {"type": kind}
        if condition.get("status") != status:
            condition["lastTransitionTime"] = now
        condition["status"] = status
        condition.setdefault("lastProbeTime", None)
        by_type[kind] = condition
    order = ["PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled"]

    def rank(condition: JsonObject) -> int:
        kind = text(condition, "type")
        return order.index(kind) if kind in order else len(order)
    ranked: list[JsonValue] = [*sorted(by_type.values(), key=rank)]
    return ranked


def running_status(pod: Pod) -> JsonObject:
    """The status of `pod` once this kubelet has "started" it."""
    now = now_rfc3339()
    uid = pod.uid
    status = json_object(pod.status)
    started = text(status, "startTime") or now
    status.update(
        phase="Running", hostIP=NODE_IP, hostIPs=[{"ip": NODE_IP}], podIP=NODE_IP, podIPs=[{"ip": NODE_IP}],
        startTime=started,
        conditions=_set_conditions(pod.conditions, {
            "PodReadyToStartContainers": "True", "Initialized": "True", "Ready": "True",
            "ContainersReady": "True", "PodScheduled": "True"}, now),
        containerStatuses=[{
            "name": c["name"], "image": c.get("image", ""), "imageID": c.get("image", ""),
            "containerID": _container_id(uid, c["name"]), "ready": True, "started": True, "restartCount": 0,
            "state": {"running": {"startedAt": started}}} for c in pod.containers],
    )
    if pod.init_containers:
        status["initContainerStatuses"] = [{
            "name": c["name"], "image": c.get("image", ""), "imageID": c.get("image", ""),
            "containerID": _container_id(uid, c["name"]), "ready": True, "restartCount": 0,
            "state": {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": started,
                                     "finishedAt": started}}} for c in pod.init_containers]
    return status


def terminated_status(pod: Pod, exit_code: int = 0) -> JsonObject:
    """The status of `pod` once this kubelet has "stopped" its containers (all exited with `exit_code`)."""
    now = now_rfc3339()
    status = json_object(pod.status)
    started = text(status, "startTime") or now
    containers: list[JsonValue] = []
    for c in pod.containers:
        containers.append({
            "name": c["name"], "image": c.get("image", ""), "imageID": c.get("image", ""),
            "containerID": _container_id(pod.uid, c["name"]), "ready": False,
            "started": False, "restartCount": 0,
            "state": {"terminated": {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error",
                                     "startedAt": started, "finishedAt": now}}})
    status.update(phase="Succeeded" if exit_code == 0 else "Failed", startTime=started, containerStatuses=containers,
                  conditions=_set_conditions(pod.conditions, {
                      "PodReadyToStartContainers": "False", "Ready": "False", "ContainersReady": "False"}, now))
    return status


def simulated_exit(pod: Pod) -> tuple[float, int] | None:
    """(seconds after start, exit code) from the simulate-exit annotations; None without (or bad) ones."""
    after = pod.meta.annotation(ann.SIMULATE_EXIT_AFTER)
    if after is None:
        return None
    try:
        code = pod.meta.annotation(ann.SIMULATE_EXIT_CODE)
        return parse_duration(after), int("0" if code is None else code)
    except ValueError:
        log.warning("pod %s: ignoring %s=%r / %s: expected a duration such as 2s and an integer exit code",
                    pod.name, ann.SIMULATE_EXIT_AFTER, after, ann.SIMULATE_EXIT_CODE)
        return None


def restarted_status(pod: Pod, exit_code: int) -> JsonObject:
    """The status after the containers exited and the restartPolicy started them again."""
    now = now_rfc3339()
    status = json_object(pod.status)
    containers: list[JsonValue] = []
    for container in pod.container_statuses:
        before = section(container, "state", "running")
        containers.append({**json_object(container), "restartCount": int(container.get("restartCount") or 0) + 1,
                           "state": {"running": {"startedAt": now}},
                           "lastState": {"terminated": {"exitCode": exit_code, "startedAt": before.get("startedAt"),
                                                        "finishedAt": now,
                                                        "reason": "Completed" if exit_code == 0 else "Error"}}})
    status["containerStatuses"] = containers
    return status


def _is_running(pod: Pod) -> bool:
    names = [c["name"] for c in pod.containers]
    reported = [c.get("name") for c in pod.container_statuses if "running" in section(c, "state")]
    return pod.phase == "Running" and reported == names


# --- the kubelet --------------------------------------------------------------------------------


async def delete_node(client: KubeClient, node_name: str) -> None:
    """Delete a Node and its Lease for good (a terminated machine; gone already is fine). Cancel its
    kubelet's `run` first: a running kubelet registers a deleted Node again."""
    for resource, namespace in ((r.LEASES, LEASE_NAMESPACE), (r.NODES, None)):
        try:
            await client.delete(resource, node_name, namespace=namespace)
        except NotFound:
            pass


class SimulatedKubelet:
    """Registers one Node and plays its kubelet (see the module docstring). `labels` and `machine`
    (capacities such as cpu and memory) describe a simulated cloud instance rather than this host."""

    def __init__(self, manager: Manager, node_name: str, plan: DevicePlan, *, index_devices: int = 0,
                 labels: Mapping[str, str] | None = None, machine: Mapping[str, str] | None = None) -> None:
        self.client: KubeClient = manager.client
        self.node_name = node_name
        self.plan = plan
        #: devices per index resource the hypervisor's device plugins offer (0: no hypervisor here)
        self.index_devices = index_devices
        self.labels = dict(labels or {})
        self.machine = dict(machine or {})
        self.node = Node({})
        # the shared pod informer (in --role=all it holds every pod: reconcile_pod keeps to this node's)
        self.controller = manager.controller("simulated-kubelet").for_(
            r.PODS, field_selector=f"spec.nodeName={node_name}").with_workers(2).on_every_replica() \
            .complete(self.reconcile_pod)
        assert self.controller.primary is not None
        self.pods = self.controller.primary
        self.pods.add_index("node", node_name_index)

    # --- node and lease ---------------------------------------------------------------------------

    async def register(self) -> Node:
        """Create the Node, or bring our labels and its status up to date; returns the Node."""
        labels = {**node_labels(self.node_name, self.plan), **self.labels}
        try:
            node = await self.client.get(r.NODES, self.node_name)
        except NotFound:
            try:
                node = await self.client.create(r.NODES, {
                    "apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": self.node_name, "labels": {k: v for k, v in labels.items() if v is not None}},
                    "spec": {}})
                log.info("registered node %s (%s)", self.node_name, self.plan.describe())
            except AlreadyExists:
                node = await self.client.get(r.NODES, self.node_name)
        current = Node(node).meta.labels
        changes = {k: v for k, v in labels.items() if current.get(k) != v and (v is not None or k in current)}
        if changes:
            node = await self.client.patch(r.NODES, self.node_name, {"metadata": {"labels": changes}})
        return await self.report_status(Node(node))

    async def report_status(self, node: Node | None = None) -> Node:
        status = node_status(self.node_name, node if node is not None else self.node,
                             index_devices=self.index_devices, machine=self.machine)
        self.node = Node(await self.client.patch(r.NODES, self.node_name, {"status": status}, subresource="status"))
        return self.node

    async def renew_lease(self) -> None:
        now = micro_time()
        try:
            await self.client.patch(r.LEASES, self.node_name, {"spec": {"renewTime": now,
                                                                        "holderIdentity": self.node_name}},
                                    namespace=LEASE_NAMESPACE)
            return
        except NotFound:
            pass
        owner = {"apiVersion": "v1", "kind": "Node", "name": self.node_name, "uid": self.node.uid}
        try:
            await self.client.create(r.LEASES, {
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.node_name, "namespace": LEASE_NAMESPACE, "ownerReferences": [owner]},
                "spec": {"holderIdentity": self.node_name, "leaseDurationSeconds": LEASE_DURATION_S,
                         "renewTime": now}}, namespace=LEASE_NAMESPACE)
        except AlreadyExists:
            pass

    async def _every(self, interval: float, what: str, step: Callable[[], Awaitable[object]]) -> None:
        while True:
            await anyio.sleep(interval)
            try:
                await step()
            except KubeError as exc:
                log.warning("simulated kubelet %s: %s failed: %s", self.node_name, what, exc)
                if exc.code == 404 and what == "node status":
                    await self._reregister()

    async def _reregister(self) -> None:
        log.warning("node %s was deleted; registering it again", self.node_name)
        try:
            await self.register()
        except KubeError as exc:
            log.warning("registering node %s failed: %s", self.node_name, exc)

    # --- pods -------------------------------------------------------------------------------------

    async def reconcile_pod(self, key: str) -> Result | None:
        raw = self.pods.get(key)
        if raw is None or Pod(raw).node_name != self.node_name:
            return None
        pod = Pod(raw)
        try:
            if pod.meta.deleting:
                await self._finish_deletion(pod)
            elif not pod.finished and not _is_running(pod):
                await self._write_status(pod, running_status(pod))
                log.info("pod %s is Running on node %s", key, self.node_name)
            elif not pod.finished:
                return await self._simulate_exit(pod)
        except (Conflict, NotFound):
            return Result(requeue=True)  # changed or gone meanwhile: look again at the newest version
        return None

    async def _simulate_exit(self, pod: Pod) -> Result | None:
        """The simulate-exit annotations: exit once the time is up; the restartPolicy decides what follows."""
        planned = simulated_exit(pod)
        if planned is None:
            return None
        after, code = planned
        starts = [text(c, "state", "running", "startedAt") for c in pod.container_statuses]
        try:
            started = max(parse_rfc3339(s).timestamp() for s in starts if s)
        except ValueError:
            started = time.time()
        left = started + after - time.time()
        if left > 0:
            return Result(requeue_after=left)
        policy = pod.restart_policy
        if policy == "Never" or (policy == "OnFailure" and code == 0):
            await self._write_status(pod, terminated_status(pod, code))
        else:
            await self._write_status(pod, restarted_status(pod, code))
        return None

    async def _write_status(self, pod: Pod, status: JsonObject) -> None:
        await self.client.replace(r.PODS, {**pod.raw, "status": status}, subresource="status")

    async def _finish_deletion(self, pod: Pod) -> None:
        if not pod.finished:
            await self._write_status(pod, terminated_status(pod))
            log.info("pod %s/%s stopped on node %s", pod.namespace, pod.name, self.node_name)
            return  # the status write brings the pod back here, newer
        if pod.meta.finalizers:
            return  # the server removes it when the last finalizer goes
        await self.client.delete(r.PODS, pod.name, namespace=pod.namespace or None, grace_period_seconds=0,
                                 preconditions={"uid": pod.uid})

    # --- running ----------------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[Node] = anyio.TASK_STATUS_IGNORED) -> None:
        """Register, then run until cancelled; `task_status.started(node)` once registered (the
        controller's Node reconciler creates its GPUNode where a pool selects it)."""
        node = await self.register()
        await self.renew_lease()
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._every, LEASE_RENEW_S, "lease renewal", self.renew_lease)
            tg.start_soon(self._every, STATUS_REPORT_S, "node status", self.report_status)
            task_status.started(node)
