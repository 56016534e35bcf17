"""The Kubernetes backend: worker pods on this node, tracked by an informer, and their allocations.

Pods are watched with field selector `spec.nodeName=<node>` and label selector
`tensor-fusion.ai/component=worker`. A pod becomes a `WorkerInfo` through the allocator's request
parser (requests, limits, QoS, isolation) plus its `gpu-ids`, `container-gpus` and
`effective-hard-sm-percent` annotations; its allocation (visible-devices env per vendor, hard SM
percent) is built from those and this node's devices. The scheduler owns placement: this backend
only reads.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import anyio

from tfusion.allocator.request import RequestError, request_from_pod
from tfusion.api import annotations as keys
from tfusion.hypervisor.devices.registry import DeviceRegistry
from tfusion.hypervisor.gpu_report import GpuReporter
from tfusion.hypervisor.workers.allocation import AllocationError, build_allocation
from tfusion.hypervisor.workers.model import (
    STATUS_ALLOCATING,
    STATUS_PENDING,
    STATUS_RUNNING,
    STATUS_TERMINATED,
    Resource,
    RunningInfo,
    WorkerAllocation,
    WorkerInfo,
)
from tfusion.hypervisor.workers.procfs import ProcFS
from tfusion.kube.client import KubeClient
from tfusion.kube.informer import Informer
from tfusion.kube.resources import PODS
from tfusion.settings import Settings
from tfusion.web import Readiness

log = logging.getLogger(__name__)


def worker_status(pod: dict[str, Any]) -> str:
    phase = (pod.get("status") or {}).get("phase", "")
    if phase == "Running":
        return STATUS_RUNNING
    if phase in ("Succeeded", "Failed"):
        return STATUS_TERMINATED
    notes = (pod.get("metadata") or {}).get("annotations") or {}
    return STATUS_ALLOCATING if notes.get(keys.INDEX) else STATUS_PENDING


def _container_gpus(raw: str | None) -> dict[str, list[str]]:
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): [str(u).lower() for u in v] for k, v in data.items() if isinstance(v, list)}


def worker_from_pod(pod: dict[str, Any]) -> WorkerInfo:
    """A worker pod as the hypervisor sees it; unreadable resource annotations are logged and left 0."""
    meta = pod.get("metadata") or {}
    notes = dict(meta.get("annotations") or {})
    labels = dict(meta.get("labels") or {})
    ids = tuple(u.strip().lower() for u in (notes.get(keys.GPU_IDS) or "").split(",") if u.strip())
    requests = limits = Resource()
    qos = notes.get(keys.QOS) or "medium"
    isolation = notes.get(keys.ISOLATION) or "soft"
    try:
        req = request_from_pod(pod, default_pool=notes.get(keys.GPU_POOL) or "default")
    except RequestError as exc:
        log.warning("worker pod %s/%s: %s", meta.get("namespace"), meta.get("name"), exc)
    else:
        requests = Resource(req.tflops_request, req.percent_request / 1000, req.vram_request)
        limits = Resource(req.tflops_limit, req.percent_limit / 1000, req.vram_limit)
        qos, isolation = req.qos, req.isolation
    hard = notes.get(keys.EFFECTIVE_HARD_SM_PERCENT, "")
    return WorkerInfo(
        uid=str(meta.get("uid", "")), namespace=str(meta.get("namespace", "")), name=str(meta.get("name", "")),
        allocated_devices=ids, status=worker_status(pod), qos=qos, isolation=isolation, requests=requests,
        limits=limits, partition_template_id=notes.get(keys.PARTITION_ID, "") if isolation == "partitioned"
        else "", workload_name=labels.get(keys.WORKLOAD, ""), labels=labels, annotations=notes,
        container_gpus=_container_gpus(notes.get(keys.CONTAINER_GPUS)),
        effective_hard_sm_percent=int(hard) if hard.isdigit() else None)


class KubernetesWorkers:
    """Worker pods on this node, from a pod informer."""

    kind = "kubernetes"

    def __init__(self, informer: Informer, registry: DeviceRegistry, procfs: ProcFS | None = None) -> None:
        self.informer = informer
        self.registry = registry
        self.procfs = procfs or ProcFS()

    def _workers(self) -> list[WorkerInfo]:
        return [worker_from_pod(p) for p in self.informer.list()]

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
        result = [self._allocation(w) for w in self._workers()]
        return sorted((a for a in result if a is not None), key=lambda a: (a.worker.namespace, a.worker.name))

    def get(self, worker_id: str) -> WorkerAllocation | None:
        for worker in self._workers():
            if worker.uid == worker_id:
                return self._allocation(worker)
        return None

    def running_info(self, uid: str) -> RunningInfo | None:
        return None

    def worker_for_pid(self, pid: int) -> str | None:
        workers = self._workers()
        uid = self.procfs.pod_uid(pid)
        if uid and any(w.uid == uid for w in workers):
            return uid
        env = self.procfs.environ(pid)
        for worker in workers:
            if env.get("POD_NAME") == worker.name and env.get("POD_NAMESPACE") == worker.namespace:
                return worker.uid
        return None


async def start_kubernetes_workers(settings: Settings, registry: DeviceRegistry, readiness: Readiness, tg: Any,
                                   node: str) -> tuple[KubernetesWorkers, dict[str, Any]]:
    """Connect, start the pod informer and the GPU reporter in `tg`; returns the tracker and the
    TokenReviewer for the HTTP routes."""
    from tfusion.kube.auth import TokenReviewer

    try:
        client = await KubeClient.connect(settings.kube_mode, namespace=settings.pod_namespace or None)
    except ValueError as exc:
        from tfusion.errors import RoleError

        raise RoleError(f"hypervisor: {exc}") from None
    informer = Informer(client, PODS, label_selector=f"{keys.COMPONENT}=worker",
                        field_selector=f"spec.nodeName={node}")
    readiness.set("pod-informer", False, f"listing worker pods on node {node}")

    def count_pods(*_: Any) -> None:
        if informer.synced:
            readiness.set("pod-informer", True, f"{len(informer)} worker pod(s) on node {node}")

    async def mark_synced() -> None:
        await informer.wait_synced()
        count_pods()

    informer.add_handler(on_add=count_pods, on_delete=count_pods)

    async def close_client() -> None:
        try:
            await anyio.sleep_forever()
        finally:
            with anyio.CancelScope(shield=True):
                await client.close()

    tg.start_soon(close_client)
    await tg.start(informer.run)
    tg.start_soon(mark_synced)
    reporter = GpuReporter(client, registry, readiness, node=node, isolation_mode=settings.isolation_mode,
                           isolation_policy=settings.isolation_policy)
    tg.start_soon(reporter.run)
    return KubernetesWorkers(informer, registry), {"reviewer": TokenReviewer(client), "reporter": reporter,
                                                   "client": client}
