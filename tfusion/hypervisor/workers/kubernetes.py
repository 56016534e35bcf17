"""The Kubernetes backend: worker pods on this node, tracked from the shared pod informer, and their allocations.

Pods are asked of the Manager's cache with field selector `spec.nodeName=<node>` and label
selector `tensor-fusion.ai/component=worker` (in `--role=all` the shared informer holds every
pod, so this backend filters by its node index and the label). Each pod is parsed once, when its
informer event arrives, into a cached `WorkerInfo`; HTTP calls and scrapes read the cache.
A pod becomes a `WorkerInfo` through the allocator's request
parser (requests, limits, QoS, isolation) plus its `gpu-ids`, `container-gpus` and
`effective-hard-sm-percent` annotations; its allocation (visible-devices env per vendor, hard SM
percent) is built from those and this node's devices. The scheduler owns placement: this backend
only reads.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from tfusion.allocator.request import RequestError, request_from_pod
from tfusion.api import annotations as keys
from tfusion.api.accessors import Pod, section
from tfusion.api.jsontypes import JsonMapping
from tfusion.hypervisor.devices.registry import DeviceRegistry
from tfusion.hypervisor.gpu_report import GpuReporter
from tfusion.hypervisor.partitions import Partitioner, slot_from_gpu
from tfusion.hypervisor.workers.allocation import AllocationError, build_allocation
from tfusion.hypervisor.workers.model import (
    STATUS_ALLOCATING,
    STATUS_PENDING,
    STATUS_RUNNING,
    STATUS_TERMINATED,
    RunningInfo,
    WorkerAllocation,
    WorkerAmounts,
    WorkerInfo,
)
from tfusion.hypervisor.workers.procfs import ProcFS
from tfusion.kube.client import KubeError, NotFound, object_key
from tfusion.kube.informer import Informer, node_name_index
from tfusion.kube.manager import Manager
from tfusion.kube.resources import GPUS, PODS, PROVIDERCONFIGS
from tfusion.settings import Settings
from tfusion.web import Readiness

log = logging.getLogger(__name__)


def worker_status(pod: Pod) -> str:
    phase = pod.phase
    if phase == "Running":
        return STATUS_RUNNING
    if pod.finished:
        return STATUS_TERMINATED
    return STATUS_ALLOCATING if pod.meta.annotation(keys.INDEX) else STATUS_PENDING


def _container_gpus(notes: dict[str, str], on_error: Callable[[keys.AnnotationError], object]) -> dict[str, list[str]]:
    none: dict[str, tuple[str, ...]] = {}
    by_container = keys.parse_present(notes.get(keys.CONTAINER_GPUS), keys.parse_container_gpus, none,
                                      on_error=on_error)
    return {container: list(gpus) for container, gpus in by_container.items()}


def _id_of(value: object) -> int | None:
    """A user or group id as a securityContext gives it (a non-negative int), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def pod_identity(pod: Pod) -> tuple[int | None, int | None]:
    """(user, group) every container of the pod runs as / has, from the pod's and each container's
    securityContext (a container's own setting wins); None where the pod does not say or its
    containers differ. The group is the fsGroup (the kubelet gives it to every container), else a
    runAsGroup all containers share."""
    pod_context = section(pod.spec, "securityContext")
    containers = pod.containers
    if not containers:
        return None, None

    def common(key: str) -> int | None:
        values = set()
        for container in containers:
            own = _id_of(section(container, "securityContext").get(key))
            values.add(own if own is not None else _id_of(pod_context.get(key)))
        return values.pop() if len(values) == 1 else None

    group = _id_of(pod_context.get("fsGroup"))
    return common("runAsUser"), group if group is not None else common("runAsGroup")


def worker_from_pod(pod: Pod) -> WorkerInfo:
    """A worker pod as the hypervisor sees it; unreadable annotations are logged and read as absent."""
    meta = pod.meta
    notes = dict(meta.annotations)
    labels = dict(meta.labels)

    def warn(exc: Exception) -> None:
        log.warning("worker pod %s/%s: %s", meta.namespace, meta.name, exc)

    no_ids: tuple[str, ...] = ()
    ids = keys.parse_present(notes.get(keys.GPU_IDS), keys.parse_gpu_ids, no_ids, on_error=warn)
    requests = limits = WorkerAmounts()
    qos = notes.get(keys.QOS) or "medium"
    isolation = notes.get(keys.ISOLATION) or keys.DEFAULT_ISOLATION
    try:
        req = request_from_pod(pod, default_pool=notes.get(keys.GPU_POOL) or "default")
    except RequestError as exc:
        warn(exc)
    else:
        requests = WorkerAmounts(req.tflops_request, req.percent_request / 1000, req.vram_request)
        limits = WorkerAmounts(req.tflops_limit, req.percent_limit / 1000, req.vram_limit)
        qos, isolation = req.qos, req.isolation
    hard = keys.parse_present(notes.get(keys.EFFECTIVE_HARD_SM_PERCENT), keys.parse_effective_hard_sm_percent,
                              None, on_error=warn)
    user, group = pod_identity(pod)
    return WorkerInfo(
        uid=meta.uid, namespace=meta.namespace, name=meta.name,
        allocated_devices=ids, status=worker_status(pod), qos=qos, isolation=isolation, requests=requests,
        limits=limits, partition_template_id=notes.get(keys.PARTITION_ID, "")
        if isolation == keys.ISOLATION_PARTITIONED else "", workload_name=labels.get(keys.WORKLOAD, ""),
        labels=labels, annotations=notes, container_gpus=_container_gpus(notes, warn),
        effective_hard_sm_percent=hard, run_as_user=user, shared_group=group)


class KubernetesWorkers:
    """Worker pods on this node, parsed on informer events (see the module docstring)."""

    kind = "kubernetes"

    def __init__(self, informer: Informer, registry: DeviceRegistry, node: str, procfs: ProcFS | None = None,
                 on_gone: Callable[[str], object] | None = None,
                 on_finished: Callable[[str], object] | None = None,
                 on_running_partitioned: Callable[[WorkerInfo], object] | None = None) -> None:
        self.informer = informer
        self.registry = registry
        self.node = node
        self.procfs = procfs or ProcFS()
        self.on_gone = on_gone  # called with a pod UID when it is deleted or leaves the node
        self.on_finished = on_finished  # called with a pod UID when it has finished (Succeeded or Failed)
        self.on_running_partitioned = on_running_partitioned  # a running pod that holds a partition
        self._workers: dict[str, WorkerInfo] = {}  # pod key -> parsed worker
        informer.add_index("node", node_name_index)
        informer.add_handler(on_add=self._on_pod, on_update=self._on_pod_update, on_delete=self._on_pod_delete)

    def _is_ours(self, pod: Pod) -> bool:
        return pod.node_name == self.node and pod.is_worker

    def _on_pod(self, raw: JsonMapping) -> None:
        pod = Pod(raw)
        key = object_key(raw)
        if self._is_ours(pod):
            worker = self._workers[key] = worker_from_pod(pod)
            if worker.status == STATUS_TERMINATED and self.on_finished is not None:
                self.on_finished(worker.uid)
            elif (worker.status == STATUS_RUNNING and worker.isolation == keys.ISOLATION_PARTITIONED
                  and self.on_running_partitioned is not None):
                self.on_running_partitioned(worker)
        else:
            self._forget(key)

    def _on_pod_update(self, old: JsonMapping | None, new: JsonMapping) -> None:
        self._on_pod(new)

    def _on_pod_delete(self, pod: JsonMapping) -> None:
        self._forget(object_key(pod))

    def _forget(self, key: str) -> None:
        gone = self._workers.pop(key, None)
        if gone is not None and self.on_gone is not None:
            self.on_gone(gone.uid)

    def __len__(self) -> int:
        return len(self._workers)

    def _current(self) -> list[WorkerInfo]:
        return list(self._workers.values())

    def _allocation(self, worker: WorkerInfo) -> WorkerAllocation | None:
        if not worker.allocated_devices or worker.status == STATUS_TERMINATED:
            return None
        known = {d.uuid: d for d in self.registry.devices()}
        try:
            return build_allocation(worker, known)
        except AllocationError as exc:
            log.warning("%s", exc)
            return None

    def allocations(self) -> list[WorkerAllocation]:
        result = [self._allocation(w) for w in self._current()]
        return sorted((a for a in result if a is not None), key=lambda a: (a.worker.namespace, a.worker.name))

    def get(self, worker_id: str) -> WorkerAllocation | None:
        for worker in self._current():
            if worker.uid == worker_id:
                return self._allocation(worker)
        return None

    def running_info(self, uid: str) -> RunningInfo | None:
        return None

    def worker_with_index(self, index: int) -> WorkerInfo | None:
        """The pod the device plugin's Allocate is for: annotated with pod index `index`, not running
        yet (DeviceAllocating) and with its gpu-ids, so a reused index never finds an older pod."""
        for worker in self._current():
            if worker.status != STATUS_ALLOCATING or not worker.allocated_devices:
                continue
            try:
                if keys.parse_pod_index(worker.annotations.get(keys.INDEX, "")) == index:
                    return worker
            except keys.AnnotationError:
                continue
        return None

    def tracks(self, uid: str) -> bool:
        return any(w.uid == uid and w.status != STATUS_TERMINATED for w in self._current())

    def worker_for_pid(self, pid: int) -> str | None:
        workers = self._current()
        uid = self.procfs.pod_uid(pid)
        if uid and any(w.uid == uid for w in workers):
            return uid
        env = self.procfs.environ(pid)
        for worker in workers:
            if env.get("POD_NAME") == worker.name and env.get("POD_NAMESPACE") == worker.namespace:
                return worker.uid
        return None


def register_kubernetes_workers(settings: Settings, manager: Manager, registry: DeviceRegistry,
                                readiness: Readiness, node: str) -> tuple[KubernetesWorkers, dict[str, Any]]:
    """Register the worker tracker and the GPU reporter on the process's Manager; returns the
    tracker and the TokenReviewer for the HTTP routes."""
    from tfusion.kube.auth import TokenReviewer

    informer = manager.cache.informer(PODS, label_selector=f"{keys.COMPONENT}={keys.COMPONENT_WORKER}",
                                      field_selector=f"spec.nodeName={node}")
    reviewer = TokenReviewer(manager.client)
    partitioner = kubernetes_partitioner(manager, registry)

    def pod_gone(uid: str) -> None:
        reviewer.forget_pod(uid)  # a cached token review ends with its pod: deleted, or no longer on this node
        partitioner.gone(uid)

    workers = KubernetesWorkers(informer, registry, node, on_gone=pod_gone, on_finished=partitioner.gone,
                                on_running_partitioned=partitioner.adopt)
    readiness.set("pod-informer", False, f"listing worker pods on node {node}")

    def count_pods(*_: Any) -> None:
        if informer.synced:
            readiness.set("pod-informer", True, f"{len(workers)} worker pod(s) on node {node}")

    async def mark_synced() -> None:
        await informer.wait_synced()
        count_pods()

    informer.add_handler(on_add=count_pods, on_delete=count_pods)
    manager.add(mark_synced, leader_only=False, name="hypervisor pod-informer readiness")
    reporter = GpuReporter(manager, registry, readiness, node=node, isolation_mode=settings.isolation_mode,
                           isolation_policy=settings.resolved_hypervisor_isolation_policy)
    manager.add(reporter.run, leader_only=False, name="hypervisor GPU reporter")
    return workers, {"reviewer": reviewer, "reporter": reporter, "partitioner": partitioner}


def kubernetes_partitioner(manager: Manager, registry: DeviceRegistry) -> Partitioner:
    """The partitioner with the pod's slot from its GPU object and the templates of the ProviderConfigs."""
    client = manager.client

    async def slot_of(pod_uid: str, gpu_uuid: str) -> int | None:
        try:
            return slot_from_gpu(await client.get(GPUS, gpu_uuid), pod_uid)
        except NotFound:
            return None

    async def templates() -> list[Mapping[str, Any]]:
        try:
            return [section(config, "spec") for config in await client.list(PROVIDERCONFIGS)]
        except KubeError as exc:
            log.warning("cannot list ProviderConfigs for partition templates (%s); using partition-id as the "
                        "profile name", exc)
            return []

    return Partitioner(registry.backend, registry, slot_of=slot_of, templates=templates)
