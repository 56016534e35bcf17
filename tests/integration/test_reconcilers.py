"""The controller's reconcilers (tfusion/controller/reconcilers) in-process against the embedded API
server over real HTTP, with real objects: a TensorFusionCluster makes its pools; a labelled Node
gets a GPUNode that runs while its GPUs report and goes Unknown when they stop; pool and node
capacity follow the GPUs and the bound pods; worker pods are released exactly once behind their
finalizer; workloads and quotas show what their pods use; a hand-edited GPU status is found,
counted, reported and repaired; and all of it keeps working across a lost and regained Lease."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

from tests.apiserver_fixture import apply_crds
from tests.helpers import eventually
from tests.helpers.controller import controllers, kube_client, settings_for, start_controller
from tests.helpers.leases import steal_lease
from tfusion.api import annotations as tfa
from tfusion.api.accessors import Pod
from tfusion.api.timestamps import rfc3339
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient, NotFound
from tfusion.kube.leader import LEASE_NAME

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parents[2]
POOL = "gpu-pool"
SELECTOR = {"nodeSelectorTerms": [{"matchExpressions": [
    {"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}]}]}


def fast(apiserver: Any, tmp_path: Path, **changes: Any) -> Any:
    return settings_for(apiserver, tmp_path, **{"gpu_node_report_grace": 2.0, "drift_check_interval": 0.3,
                                                **changes})


async def get(kube: KubeClient, resource: r.ApiResource, name: str, namespace: str | None = None) -> Any:
    try:
        return await kube.get(resource, name, namespace=namespace)
    except NotFound:
        return None


async def status(kube: KubeClient, resource: r.ApiResource, name: str, namespace: str | None = None) -> dict[str, Any]:
    found = await get(kube, resource, name, namespace)
    return dict((found or {}).get("status") or {})


async def create_selecting_pool(kube: KubeClient, name: str = POOL, **spec: Any) -> None:
    await kube.create(r.GPUPOOLS, {"metadata": {"name": name}, "spec": {
        "nodeManagerConfig": {"nodeSelector": SELECTOR}, **spec}})


async def create_node(kube: KubeClient, name: str, *, gpu: bool = True, unschedulable: bool = False) -> None:
    labels = {"kubernetes.io/hostname": name, **({"nvidia.com/gpu.present": "true"} if gpu else {})}
    await kube.create(r.NODES, {"metadata": {"name": name, "labels": labels},
                                "spec": {"unschedulable": unschedulable}})


async def report_gpu(kube: KubeClient, name: str, node: str, *, tflops: str = "100", vram: str = "40Gi",
                     pool: str = POOL) -> None:
    """What the hypervisor writes: the GPU of the node, stamped last-sync now, phase Pending."""
    if await get(kube, r.GPUS, name) is None:
        await kube.create(r.GPUS, {"metadata": {"name": name, "labels": {tfa.GPU_POOL: pool, tfa.MANAGED_BY: node},
                                                "annotations": {tfa.LAST_SYNC: rfc3339()}}})
        await kube.patch(r.GPUS, name, {"status": {
            "phase": "Pending", "vendor": "NVIDIA", "gpuModel": "A100_SXM_40G", "uuid": f"GPU-{name}", "index": 0,
            "message": "managed", "usedBy": "tensor-fusion", "isolationMode": "soft",
            "nodeSelector": {"kubernetes.io/hostname": node},
            "capacity": {"tflops": tflops, "vram": vram}, "available": {"tflops": tflops, "vram": vram}}},
            subresource="status")
    else:
        await kube.patch(r.GPUS, name, {"metadata": {"annotations": {tfa.LAST_SYNC: rfc3339()}}})


def bound_worker(name: str, node: str, gpus: list[str], *, tflops: str, vram: str, namespace: str = "default",
                 workload: str | None = None) -> dict[str, Any]:
    notes = {tfa.GPU_POOL: POOL, tfa.TFLOPS_REQUEST: tflops, tfa.VRAM_REQUEST: vram, tfa.TFLOPS_LIMIT: tflops,
             tfa.VRAM_LIMIT: vram, tfa.GPU_COUNT: str(len(gpus)), tfa.GPU_IDS: ",".join(gpus)}
    return {"metadata": {"name": name, "namespace": namespace, "annotations": notes,
                         "labels": {tfa.COMPONENT: "worker", tfa.WORKLOAD: workload or name}},
            "spec": {"nodeName": node, "schedulerName": "tensor-fusion-scheduler",
                     "containers": [{"name": "w", "image": "worker"}]}}


async def events_for(kube: KubeClient, name: str, namespace: str = "default") -> list[tuple[str, str, str]]:
    return [(e.get("type"), e.get("reason"), e.get("message")) for e in await kube.list(r.EVENTS, namespace=namespace)
            if e["involvedObject"].get("name") == name]


async def has_event(kube: KubeClient, name: str, reason: str, namespace: str = "default") -> bool:
    return any(found == reason for _, found, _ in await events_for(kube, name, namespace))


# --- TensorFusionCluster -> GPUPools ----------------------------------------------------------------

async def test_cluster_makes_its_pools_and_sums_them_up(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    sample = yaml.safe_load((REPO / "deploy/samples/tensorfusioncluster.yaml").read_text())
    sample["metadata"]["labels"] = {"team": "ml"}
    sample["spec"]["gpuPools"].append({"name": "spare", "isDefault": True, "specTemplate": {
        "nodeManagerConfig": {"nodeSelector": SELECTOR}}})
    async with kube_client(apiserver) as kube, controllers() as tg:
        await start_controller(tg, fast(apiserver, tmp_path))
        cluster = await kube.create(r.TENSORFUSIONCLUSTERS, sample)

        async def pools() -> Any:
            found = [await get(kube, r.GPUPOOLS, n) for n in ("example-shared", "example-spare")]
            return found if all(found) else None

        shared, spare = await eventually(pools, what="the cluster's two GPUPools")
        assert shared["metadata"]["labels"] == {"team": "ml", tfa.MANAGED_BY: "example"}
        assert shared["metadata"]["annotations"][tfa.IS_DEFAULT_POOL] == "false"
        assert spare["metadata"]["annotations"][tfa.IS_DEFAULT_POOL] == "true"
        owner = shared["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == \
            ("TensorFusionCluster", "example", cluster["metadata"]["uid"], True)
        assert shared["spec"]["capacityConfig"]["oversubscription"]["tflopsOversellRatio"] == 2000

        async def running() -> Any:
            found = await status(kube, r.TENSORFUSIONCLUSTERS, "example")
            return found if found.get("phase") == "Running" else None

        summed = await eventually(running, what="the cluster Running once its (empty) pools are")
        assert summed["totalPools"] == 2 and summed["readyGPUPools"] == ["example-shared", "example-spare"]
        assert summed["totalNodes"] == 0 and summed["totalTFlops"] == "0"
        assert {c["type"]: c["status"] for c in summed["conditions"]} == {"Ready": "True", "GPUPoolReady": "True"}
        settled = (await kube.get(r.GPUPOOLS, "example-shared"))["metadata"]["resourceVersion"]

        # a spec edit on the pool is put back; a user's label stays
        await kube.patch(r.GPUPOOLS, "example-shared", {"metadata": {"labels": {"mine": "yes"}},
                                                        "spec": {"defaultUsingLocalGPU": False}})

        async def put_back() -> bool:
            pool = await kube.get(r.GPUPOOLS, "example-shared")
            return "defaultUsingLocalGPU" not in pool["spec"] and pool["metadata"]["labels"].get("mine") == "yes"

        await eventually(put_back, what="the pool's spec put back from the cluster")
        assert (await kube.get(r.GPUPOOLS, "example-shared"))["metadata"]["resourceVersion"] != settled

        # a pool the cluster no longer lists is deleted
        current = await kube.get(r.TENSORFUSIONCLUSTERS, "example")
        current["spec"]["gpuPools"] = current["spec"]["gpuPools"][:1]
        await kube.replace(r.TENSORFUSIONCLUSTERS, current)
        await eventually(lambda: _gone(kube, r.GPUPOOLS, "example-spare"), what="the unlisted pool deleted")

        # deleting the cluster: Destroying until its pools are gone, then gone itself
        await kube.delete(r.TENSORFUSIONCLUSTERS, "example")
        await eventually(lambda: _gone(kube, r.GPUPOOLS, "example-shared"), what="the pools deleted with it")
        await eventually(lambda: _gone(kube, r.TENSORFUSIONCLUSTERS, "example"), what="the cluster gone")


async def _gone(kube: KubeClient, resource: r.ApiResource, name: str, namespace: str | None = None) -> bool:
    return await get(kube, resource, name, namespace) is None


# --- Node -> GPUNode, phases, capacity, pods, quota ---------------------------------------------------

async def test_gpunode_lifecycle_capacity_and_pod_release(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube, controllers() as tg:
        await create_selecting_pool(kube, capacityConfig={"oversubscription": {
            "tflopsOversellRatio": 300, "vramExpandToHostMem": 0, "vramExpandToHostDisk": 0}})
        await create_node(kube, "gpu-1")
        await create_node(kube, "cpu-1", gpu=False)
        await create_node(kube, "cordoned", unschedulable=True)
        ctl = await start_controller(tg, fast(apiserver, tmp_path))

        gpunode = await eventually(lambda: get(kube, r.GPUNODES, "gpu-1"), what="the GPUNode of the GPU node")
        labels = gpunode["metadata"]["labels"]
        assert labels[tfa.MANAGED_BY] == POOL and labels[f"{tfa.POOL_LABEL_PREFIX}{POOL}"] == "true"
        assert labels[tfa.HARDWARE_VENDOR] == "NVIDIA"
        assert gpunode["metadata"]["ownerReferences"][0]["name"] == POOL
        assert gpunode["spec"]["manageMode"] == "AutoSelect"
        async def pending() -> Any:  # the phase is a second write (status), right after the create
            return (await status(kube, r.GPUNODES, "gpu-1")).get("phase") == "Pending"

        await eventually(pending, what="the new GPUNode Pending")
        assert await get(kube, r.GPUNODES, "cpu-1") is None, "no pool selects a node without GPUs"
        assert await get(kube, r.GPUNODES, "cordoned") is None, "unschedulable nodes are skipped"
        async def node_labelled() -> bool:  # the pool reconciler labels the Node on its own pass
            labels = (await kube.get(r.NODES, "gpu-1"))["metadata"].get("labels") or {}
            return bool(labels.get(tfa.NODE_SELECTOR_HASH)) and labels.get(tfa.HARDWARE_VENDOR) == "NVIDIA"

        await eventually(node_labelled, what="the Node labelled by its pool")

        # the hypervisor reports two GPUs, then stamps them as its heartbeat: the node runs, its GPUs
        # become schedulable
        await report_gpu(kube, "gpu-1a", "gpu-1", tflops="100", vram="40Gi")
        await report_gpu(kube, "gpu-1b", "gpu-1", tflops="200", vram="80Gi")
        heartbeat = anyio.CancelScope()

        async def beat() -> None:
            with heartbeat:
                while True:
                    await anyio.sleep(0.5)
                    for name in ("gpu-1a", "gpu-1b"):
                        await report_gpu(kube, name, "gpu-1")

        tg.start_soon(beat)

        async def node_running() -> Any:
            found = await status(kube, r.GPUNODES, "gpu-1")
            return found if found.get("phase") == "Running" and found.get("totalGPUs") == 2 else None

        running = await eventually(node_running, what="the GPUNode Running with 2 GPUs")
        assert running["totalTFlops"] == "300" and running["totalVRAM"] == "120Gi"
        assert running["virtualTFlops"] == "900", "oversold 3x"
        assert {c["type"]: c["status"] for c in running["conditions"]}["HypervisorReporting"] == "True"
        await eventually(lambda: _phase_is(kube, "gpu-1a", "Running"), what="gpu-1a Running")
        await eventually(lambda: _phase_is(kube, "gpu-1b", "Running"), what="gpu-1b Running")

        async def pool_totals(available: str) -> Any:
            found = await status(kube, r.GPUPOOLS, POOL)
            return found if found.get("availableTFlops") == available and found.get("phase") == "Running" else None

        pool = await eventually(lambda: pool_totals("300"), what="the pool summing its GPUs")
        assert (pool["totalTFlops"], pool["totalVRAM"], pool["totalGPUs"], pool["totalNodes"], pool["readyNodes"]) \
            == ("300", "120Gi", 2, 1, 1)
        assert pool["availableVRAM"] == "120Gi" and pool["virtualTFlops"] == "900"

        # a bound worker: available drops by exactly its request; the pod holds our finalizer
        pod = await kube.create(r.PODS, bound_worker("w1", "gpu-1", ["gpu-1b"], tflops="30", vram="8Gi"))
        async def pool_with_the_pod() -> Any:  # available and the app count arrive in separate writes
            found = await pool_totals("270")
            return found if found and found.get("runningAppsCnt") == 1 else None

        pool = await eventually(pool_with_the_pod, what="pool available minus the pod's request")
        assert pool["availableVRAM"] == "112Gi"
        node_status = await status(kube, r.GPUNODES, "gpu-1")
        assert node_status["totalGPUPods"] == 1
        assert [p["uid"] for p in node_status["allocatedPods"]["gpu-1b"]] == [pod["metadata"]["uid"]]
        assert node_status["virtualAvailableTFlops"] == "870"

        async def finalized() -> bool:
            found = await get(kube, r.PODS, "w1", "default")
            return tfa.FINALIZER in ((found or {}).get("metadata") or {}).get("finalizers", [])

        await eventually(finalized, what="the worker's finalizer")
        # its pod index is held (as the webhook would have assigned it) until it is released
        assignments = ctl.runtime.assignments
        assert assignments is not None and assignments.indexes is not None
        assert ctl.runtime.reconcilers is not None
        assert ctl.runtime.allocation is not None and assignments.release_pod in ctl.runtime.allocation.release_hooks
        assignments.indexes.occupy(pod["metadata"]["uid"], 5, "default/w1")

        # deleting it releases its GPUs and its index once, then the finalizer goes and the pod with it
        await kube.delete(r.PODS, "w1", namespace="default")
        await eventually(lambda: pool_totals("300"), what="pool available restored")
        await eventually(lambda: _gone(kube, r.PODS, "w1", "default"), what="the pod gone once released")
        assert ctl.runtime.reconcilers.pod.releases == 1
        assert pod["metadata"]["uid"] not in assignments.indexes.held()
        # a finished worker is released too (and keeps its finalizer until deleted)
        await kube.create(r.PODS, bound_worker("w2", "gpu-1", ["gpu-1a"], tflops="50", vram="4Gi"))
        await eventually(lambda: pool_totals("250"), what="w2 counted")
        await kube.patch(r.PODS, "w2", {"status": {"phase": "Succeeded"}}, namespace="default", subresource="status")
        await eventually(lambda: pool_totals("300"), what="a finished worker released")
        assert ctl.runtime.reconcilers.pod.releases == 2

        # reports stop: after the grace the node is Unknown, with a condition and an event
        heartbeat.cancel()
        async def unknown() -> Any:
            found = await status(kube, r.GPUNODES, "gpu-1")
            return found if found.get("phase") == "Unknown" else None

        stale = await eventually(unknown, what="the GPUNode Unknown after the grace")
        reporting = {c["type"]: c for c in stale["conditions"]}["HypervisorReporting"]
        assert (reporting["status"], reporting["reason"]) == ("False", "ReportsStopped")
        await eventually(lambda: has_event(kube, "gpu-1", "HypervisorNotReporting"), what="the Warning event")
        await eventually(lambda: _phase_is(kube, "gpu-1a", "Pending"), what="its GPUs unschedulable")
        await eventually(lambda: _pool_phase(kube, "Updating"), what="the pool Updating while a node is not Running")
        # and back when they report again
        await report_gpu(kube, "gpu-1a", "gpu-1")
        await eventually(node_running, what="Running again once reports resume")

        # membership is stable: a pool that sorts first takes new nodes, not this one
        await create_selecting_pool(kube, "a-first")
        await create_node(kube, "gpu-3")
        newcomer = await eventually(lambda: get(kube, r.GPUNODES, "gpu-3"), what="the new node's GPUNode")
        assert newcomer["metadata"]["labels"][tfa.MANAGED_BY] == "a-first"
        assert (await kube.get(r.GPUNODES, "gpu-1"))["metadata"]["labels"][tfa.MANAGED_BY] == POOL

        # a Node no pool selects any more loses its GPUNode
        await kube.patch(r.NODES, "gpu-1", {"metadata": {"labels": {"nvidia.com/gpu.present": "false"}}})
        await eventually(lambda: _gone(kube, r.GPUNODES, "gpu-1"), what="the GPUNode of an unselected node deleted")
        await eventually(lambda: _pool_phase(kube, "Running"), what="an empty pool")


async def _phase_is(kube: KubeClient, gpu: str, phase: str) -> bool:
    return (await status(kube, r.GPUS, gpu)).get("phase") == phase


async def _pool_phase(kube: KubeClient, phase: str) -> bool:
    return (await status(kube, r.GPUPOOLS, POOL)).get("phase") == phase


async def test_a_deleted_pool_waits_for_its_gpunodes(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube, controllers() as tg:
        await create_selecting_pool(kube)
        await create_node(kube, "gpu-1")
        await start_controller(tg, fast(apiserver, tmp_path))
        await eventually(lambda: get(kube, r.GPUNODES, "gpu-1"), what="the GPUNode")

        async def finalized() -> bool:
            found = await get(kube, r.GPUPOOLS, POOL)
            return tfa.FINALIZER in ((found or {}).get("metadata") or {}).get("finalizers", [])

        await eventually(finalized, what="the pool's finalizer")
        await kube.delete(r.GPUPOOLS, POOL)
        await eventually(lambda: _gone(kube, r.GPUNODES, "gpu-1"), what="its GPUNode deleted")
        await eventually(lambda: _gone(kube, r.GPUPOOLS, POOL), what="then the pool itself")


async def test_only_nodes_the_gpu_node_selector_matches_get_gpunodes(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube, controllers() as tg:
        # a pool that selects every Node with a hostname: the selector keeps it to the GPU nodes
        await kube.create(r.GPUPOOLS, {"metadata": {"name": POOL}, "spec": {"nodeManagerConfig": {"nodeSelector": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "Exists"}]}]}}}})
        await create_node(kube, "cpu-1", gpu=False)
        await create_node(kube, "gpu-1")
        await start_controller(tg, fast(apiserver, tmp_path,
                                        initial_gpu_node_label_selector="nvidia.com/gpu.present=true"))
        await eventually(lambda: get(kube, r.GPUNODES, "gpu-1"), what="the GPU node's GPUNode")
        # the pool selects it too, so the Node reconciler has handled both Nodes by the time a
        # third one, created after them, has its GPUNode
        await create_node(kube, "gpu-2")
        await eventually(lambda: get(kube, r.GPUNODES, "gpu-2"), what="the GPUNode of a GPU node created later")
        assert await get(kube, r.GPUNODES, "cpu-1") is None, "the selector does not match a CPU node"

        # a Node that stops matching loses its GPUNode, one that starts matching gets one
        await kube.patch(r.NODES, "gpu-1", {"metadata": {"labels": {"nvidia.com/gpu.present": "false"}}})
        await kube.patch(r.NODES, "cpu-1", {"metadata": {"labels": {"nvidia.com/gpu.present": "true"}}})
        await eventually(lambda: _gone(kube, r.GPUNODES, "gpu-1"), what="the GPUNode of a Node no longer matched")
        await eventually(lambda: get(kube, r.GPUNODES, "cpu-1"), what="the GPUNode of a Node now matched")


# --- quota, workload -----------------------------------------------------------------------------

async def test_quota_follows_pods_and_alert_flips_at_the_threshold(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube, controllers() as tg:
        await kube.create(r.NAMESPACES, {"metadata": {"name": "team"}})
        await create_selecting_pool(kube)
        await create_node(kube, "gpu-1")
        await report_gpu(kube, "gpu-1a", "gpu-1", tflops="100", vram="40Gi")
        await kube.create(r.GPURESOURCEQUOTAS, {"metadata": {"name": "budget", "namespace": "team"}, "spec": {
            "total": {"requests": {"tflops": "100", "vram": "40Gi"}, "limits": {"tflops": "200", "vram": "80Gi"},
                      "maxWorkers": 10, "alertThresholdPercent": 50}}})
        await kube.create(r.TENSORFUSIONWORKLOADS, {"metadata": {"name": "train", "namespace": "team"}, "spec": {}})
        ctl = await start_controller(tg, fast(apiserver, tmp_path, gpu_node_report_grace=300.0))

        async def quota(workers: int) -> Any:
            found = await status(kube, r.GPURESOURCEQUOTAS, "budget", "team")
            return found if (found.get("used") or {}).get("workers") == workers else None

        first = bound_worker("w1", "gpu-1", ["gpu-1a"], tflops="30", vram="8Gi", namespace="team", workload="train")
        first["metadata"]["annotations"][tfa.PENDING_OWNED_WORKLOAD] = "train"
        pod = await kube.create(r.PODS, first)
        used = await eventually(lambda: quota(1), what="the quota counting w1")
        assert used["used"]["requests"] == {"tflops": "30", "vram": "8Gi"}
        assert used["used"]["limits"] == {"tflops": "30", "vram": "8Gi"}
        assert used["availablePercent"] == {"requests.tflops": "70.00", "requests.vram": "80.00",
                                            "limits.tflops": "85.00", "limits.vram": "90.00", "workers": "90.00"}
        assert used["conditions"][0]["status"] == "True"

        # the pod becomes the workload's controller; the workload counts it once the kubelet runs it
        async def owned() -> Any:
            workload = await kube.get(r.TENSORFUSIONWORKLOADS, "train", namespace="team")
            refs = workload["metadata"].get("ownerReferences") or []
            return workload if [(o["kind"], o["uid"], o["controller"]) for o in refs] == \
                [("Pod", pod["metadata"]["uid"], True)] else None

        await eventually(owned, what="the pod owning its workload")
        # the request stays on the pod: the workload's owner reference says it is met
        notes = (await kube.get(r.PODS, "w1", namespace="team"))["metadata"]["annotations"]
        assert notes[tfa.PENDING_OWNED_WORKLOAD] == "train"
        pending = await eventually(lambda: _workload_status(kube, "Pending", 1), what="one worker, not ready")
        assert pending["readyWorkers"] == 0
        await kube.patch(r.PODS, "w1", {"status": {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True"}]}}, namespace="team", subresource="status")
        ready = await eventually(lambda: _workload_status(kube, "Running", 1), what="the workload Running")
        assert ready["readyWorkers"] == 1 and ready["conditions"][0]["type"] == "Ready" and \
            ready["conditions"][0]["status"] == "True"

        # a second pod takes requests.tflops to 60 %, past the 50 % threshold: the alert is on
        await kube.create(r.PODS, bound_worker("w2", "gpu-1", ["gpu-1a"], tflops="30", vram="4Gi",
                                               namespace="team", workload="train"))
        alert = await eventually(lambda: quota(2), what="the quota counting w2")
        ready_condition = alert["conditions"][0]
        assert (ready_condition["status"], ready_condition["reason"]) == ("False", "AlertThresholdReached")
        assert "tflops requests: true" in ready_condition["message"] and "vram requests: false" in \
            ready_condition["message"], "each resource paired with its own flag"
        await eventually(lambda: has_event(kube, "budget", "QuotaAlertThresholdReached", "team"),
                         what="the alert event")

        async def two_workers() -> bool:  # the workload reconciler counts on its own, after the quota's
            return (await status(kube, r.TENSORFUSIONWORKLOADS, "train", "team")).get("workerCount") == 2

        await eventually(two_workers, what="the workload counting w2")

        # and off again when a pod goes
        await kube.delete(r.PODS, "w2", namespace="team")
        back = await eventually(lambda: quota(1), what="the quota after w2 went")
        assert back["conditions"][0]["status"] == "True"
        await eventually(lambda: has_event(kube, "budget", "QuotaCapacitySufficient", "team"), what="the all-clear")
        assert ctl.runtime.reconcilers is not None


async def _workload_status(kube: KubeClient, phase: str, workers: int) -> Any:
    found = await status(kube, r.TENSORFUSIONWORKLOADS, "train", "team")
    return found if found.get("phase") == phase and found.get("workerCount") == workers else None


# --- drift ------------------------------------------------------------------------------------------

async def test_a_hand_edited_gpu_status_is_counted_reported_and_repaired(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube, controllers() as tg:
        await create_selecting_pool(kube)
        await create_node(kube, "gpu-1")
        await report_gpu(kube, "gpu-1a", "gpu-1", tflops="100", vram="40Gi")
        await kube.create(r.PODS, bound_worker("w1", "gpu-1", ["gpu-1a"], tflops="20", vram="4Gi"))
        ctl = await start_controller(tg, fast(apiserver, tmp_path, gpu_node_report_grace=300.0))
        expected = {"tflops": "80", "vram": "36Gi"}

        async def available_is(wanted: dict[str, str]) -> bool:
            return (await status(kube, r.GPUS, "gpu-1a")).get("available") == wanted

        await eventually(lambda: available_is(expected), what="the ledger written")
        await eventually(lambda: _drift_view(ctl), what="a first audit in /api/allocation")
        assert (await _drift_view(ctl))["total"]["gpu-status"] == 0, "nothing drifted yet"

        await kube.patch(r.GPUS, "gpu-1a", {"status": {"available": {"tflops": "100", "vram": "40Gi"}}},
                         subresource="status")
        await eventually(lambda: available_is(expected), what="the hand edit repaired from the ledger")
        await eventually(lambda: has_event(kube, "gpu-1a", "DriftDetected"), what="the drift event on the GPU")
        reasons = [m for _, reason, m in await events_for(kube, "gpu-1a") if reason == "DriftDetected"]
        assert "rewritten from the ledger" in reasons[0]

        async def counted() -> Any:
            view = await _drift_view(ctl)
            return view if view and view["total"]["gpu-status"] == 1 else None

        view = await eventually(counted, what="the drift counted in /api/allocation")
        recent = [(f["kind"], f["object"], f["repair"]) for f in view["recent"]]
        assert recent == [("gpu-status", "GPU/gpu-1a", "rewritten from the ledger")]
        metrics = (await ctl.http.get("/metrics")).text
        assert 'tfusion_drift_total{kind="gpu-status"} 1.0' in metrics
        assert view["audits"] >= 1


def test_a_gpu_status_finding_names_the_fields_that_differ() -> None:
    """A status whose runningApps differ is not reported as an `available` that equals the
    ledger's (seen at 100,000 pods: "status.available X but the ledger says X")."""
    from tfusion.controller.reconcilers.drift import _status_difference

    available = {"tflops": "50", "vram": "40Gi"}
    app = {"name": "w1", "namespace": "ns", "count": 1}
    assert _status_difference((available, []), (available, [app])) == \
        "status.runningApps lists 0 app(s), not the 1 the ledger holds"
    assert _status_difference(({"tflops": "100", "vram": "40Gi"}, [app]), (available, [app])) == \
        "status.available {'tflops': '100', 'vram': '40Gi'} but the ledger says {'tflops': '50', 'vram': '40Gi'}"
    assert "; status.runningApps" in _status_difference(({}, []), (available, [app]))


async def test_the_audit_adopts_a_missing_allocation_and_releases_an_orphan(apiserver: Any, tmp_path: Path) -> None:
    """The ledger and the pods disagree behind the feed's back (a bug, or a missed event): the
    audit adopts a live worker the ledger lost, releases what the ledger holds for a pod that does
    not exist, counts both and reports them."""
    from tfusion.allocator import request_from_pod

    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube, controllers() as tg:
        await create_selecting_pool(kube)
        await create_node(kube, "gpu-1")
        await report_gpu(kube, "gpu-1a", "gpu-1", tflops="100", vram="40Gi")
        w1 = await kube.create(r.PODS, bound_worker("w1", "gpu-1", ["gpu-1a"], tflops="20", vram="4Gi"))
        # the periodic audit waits its interval before its first run: it stays out of this test
        ctl = await start_controller(tg, fast(apiserver, tmp_path, gpu_node_report_grace=300.0,
                                              drift_check_interval=3600.0))
        service, reconcilers = ctl.service, ctl.runtime.reconcilers
        assert reconcilers is not None

        async def holds_w1() -> bool:
            return service.allocator is not None and service.allocator.has_allocation(w1["metadata"]["uid"])

        await eventually(holds_w1, what="w1 recovered")

        async def quiet() -> bool:  # the pod reconciler's finalizer is the last write to w1
            found = await get(kube, r.PODS, "w1", "default")
            return tfa.FINALIZER in ((found or {}).get("metadata") or {}).get("finalizers", [])

        await eventually(quiet, what="w1 finalized")
        await anyio.sleep(1.0)  # let that update reach the allocator's feed first
        allocator = service.allocator
        assert allocator is not None
        allocator.rollback(w1["metadata"]["uid"])  # the ledger loses a live worker
        ghost = bound_worker("ghost", "gpu-1", ["gpu-1a"], tflops="10", vram="2Gi")
        ghost["metadata"]["uid"] = "00000000-0000-0000-0000-00000000dead"
        assert allocator.restore([(request_from_pod(Pod(ghost), default_pool=POOL), ("gpu-1a",))]) == []
        view = await reconcilers.drift.audit_once()
        assert view is not None
        kinds = sorted(f["kind"] for f in view["findings"])
        assert kinds == ["missing-allocation", "orphan-allocation"], view["findings"]
        assert allocator.has_allocation(w1["metadata"]["uid"]), "adopted from its annotations"
        assert not allocator.has_allocation("00000000-0000-0000-0000-00000000dead"), "the orphan released"
        repaired = await reconcilers.drift.audit_once()
        assert repaired is not None and repaired["findings"] == [], "repaired: nothing left"
        metrics = (await ctl.http.get("/metrics")).text
        assert 'tfusion_drift_total{kind="missing-allocation"} 1.0' in metrics
        assert 'tfusion_drift_total{kind="orphan-allocation"} 1.0' in metrics
        await eventually(lambda: has_event(kube, "w1", "DriftDetected"), what="the event on the adopted pod")


async def _drift_view(ctl: Any) -> Any:
    return (await ctl.http.get("/api/allocation")).json().get("drift")



# --- leadership, kubectl ------------------------------------------------------------------------------

async def test_reconcilers_work_again_after_the_lease_is_lost_and_regained(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube, controllers() as tg:
        await create_selecting_pool(kube)
        await create_node(kube, "gpu-1")
        await report_gpu(kube, "gpu-1a", "gpu-1")
        await kube.create(r.PODS, bound_worker("w1", "gpu-1", ["gpu-1a"], tflops="20", vram="4Gi"))
        settings = fast(apiserver, tmp_path, leader_elect=True, pod_name="r1", gpu_node_report_grace=300.0)
        ctl = await start_controller(tg, settings)
        manager = ctl.runtime.manager

        async def has_finalizer(name: str) -> bool:
            found = await get(kube, r.PODS, name, "default")
            return tfa.FINALIZER in ((found or {}).get("metadata") or {}).get("finalizers", [])

        await eventually(lambda: get(kube, r.GPUNODES, "gpu-1"), what="the first GPUNode, first term")
        await eventually(lambda: has_finalizer("w1"), what="the worker's finalizer, first term")

        await steal_lease(kube, LEASE_NAME, "intruder", namespace="tf-ops", duration_s=3)
        await eventually(lambda: _not_leading(manager), what="the replica following")

        # while it follows: a new GPU node, a deleted worker, a hand edit; nothing happens to them
        await create_node(kube, "gpu-2")
        await kube.delete(r.PODS, "w1", namespace="default")
        await kube.patch(r.GPUS, "gpu-1a", {"status": {"available": {"tflops": "1", "vram": "1Gi"}}},
                         subresource="status")
        assert await get(kube, r.GPUNODES, "gpu-2") is None
        assert await has_finalizer("w1"), "no release while following"

        async def leads_again() -> bool:
            return manager.is_leader and manager.terms == 2

        await eventually(leads_again, timeout=20, what="a second leadership term")
        await eventually(lambda: get(kube, r.GPUNODES, "gpu-2"), what="the node added meanwhile gets its GPUNode")
        await eventually(lambda: _gone(kube, r.PODS, "w1", "default"), what="the deleted worker released")

        async def full() -> bool:
            return (await status(kube, r.GPUS, "gpu-1a")).get("available") == {"tflops": "100", "vram": "40Gi"}

        await eventually(full, what="the edited GPU status back to the ledger (w1 released)")
        await eventually(lambda: _pool_available(kube, "100"), what="the pool's status in the new term")
        await kube.patch(r.GPUS, "gpu-1a", {"status": {"available": {"tflops": "5", "vram": "1Gi"}}},
                         subresource="status")
        await eventually(full, what="a hand edit repaired in the second term")
        await eventually(lambda: _drift_counted(ctl), what="and counted by the drift audit")
        attached = ctl.runtime.reconcilers
        assert attached is not None
        running = [c.controller.name for c in (attached.cluster, attached.pool, attached.node, attached.gpunode,
                                               attached.pod, attached.workload) if c.controller.running]
        assert sorted(running) == ["gpunode", "gpupool", "node", "pod", "tensorfusioncluster",
                                   "tensorfusionworkload"]


async def _not_leading(manager: Any) -> bool:
    return not manager.is_leader


async def _pool_available(kube: KubeClient, tflops: str) -> bool:
    return (await status(kube, r.GPUPOOLS, POOL)).get("availableTFlops") == tflops


async def _drift_counted(ctl: Any) -> bool:
    view = await _drift_view(ctl)
    return bool(view and view["total"]["gpu-status"] >= 1)


def test_kubectl_shows_phases_and_numbers(apiserver: Any, tmp_path: Path) -> None:
    """`kubectl get gpupools,gpunodes,tfc` with the printer columns, on what the reconcilers wrote."""
    kubectl = Path("/usr/bin/kubectl")
    if not kubectl.exists():
        pytest.skip("kubectl is not installed")

    async def scenario() -> None:
        await apply_crds(apiserver)
        async with kube_client(apiserver) as kube, controllers() as tg:
            pool = {"name": "pool", "isDefault": True,
                    "specTemplate": {"nodeManagerConfig": {"nodeSelector": SELECTOR}}}
            await kube.create(r.TENSORFUSIONCLUSTERS, {"metadata": {"name": "demo"}, "spec": {"gpuPools": [pool]}})
            await create_node(kube, "gpu-1")
            await start_controller(tg, fast(apiserver, tmp_path, gpu_node_report_grace=300.0))
            await eventually(lambda: get(kube, r.GPUNODES, "gpu-1"), what="the GPUNode")
            await report_gpu(kube, "gpu-1a", "gpu-1", tflops="312", vram="80Gi", pool="demo-pool")

            async def cluster_counts() -> bool:
                found = await status(kube, r.TENSORFUSIONCLUSTERS, "demo")
                return found.get("phase") == "Running" and found.get("totalGPUs") == 1

            await eventually(cluster_counts, what="the cluster Running with its GPU")

    anyio.run(scenario)
    out = subprocess.run([str(kubectl), "--kubeconfig", str(apiserver.kubeconfig), "--cache-dir",
                          str(tmp_path / "cache"), "get", "gpupools,gpunodes,tfc"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line.split() for line in out.stdout.splitlines() if line and not line.startswith("NAME")}
    assert rows["gpupool.tensor-fusion.ai/demo-pool"][1] == "Running"
    assert "312" in rows["gpupool.tensor-fusion.ai/demo-pool"] and "80Gi" in rows["gpupool.tensor-fusion.ai/demo-pool"]
    assert rows["gpunode.tensor-fusion.ai/gpu-1"][1] == "Running"
    assert rows["gpunode.tensor-fusion.ai/gpu-1"][2:4] == ["312", "80Gi"]
    assert rows["tensorfusioncluster.tensor-fusion.ai/demo"][1:3] == ["Running", "1"]


# --- with a real hypervisor -------------------------------------------------------------------------

async def test_a_real_hypervisor_runs_its_node_and_the_audit_compares_its_workers(
        apiserver: Any, tmp_path: Path) -> None:
    """The hypervisor (Kubernetes backend, simulated devices) reports the GPUs of the GPUNode the
    Node reconciler created; the node runs; a worker the ledger places on that node (its GPU is
    there) but that is bound elsewhere is missing from the hypervisor's list: drift, reported on
    the GPUNode."""
    from tfusion.hypervisor import role as hypervisor_role
    from tfusion.settings import Settings

    await apply_crds(apiserver)
    node = "hv-node"
    hv_settings = Settings.load({"backend": "kubernetes", "devices": "sim:2xA100-SXM4-80GB", "hypervisor_port": 0,
                                 "node_name": node, "kube": str(apiserver.kubeconfig), "state_dir": str(tmp_path),
                                 "metrics_output_path": str(tmp_path / "metrics.log")}, env={}, roles=("hypervisor",))
    async with kube_client(apiserver) as kube, controllers() as tg:
        await create_selecting_pool(kube)
        await create_node(kube, node)
        await kube.patch(r.NODES, node, {"status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}]}},
                         subresource="status")
        port = await tg.start(hypervisor_role.run, hv_settings)
        ctl = await start_controller(tg, fast(apiserver, tmp_path, gpu_node_report_grace=300.0, hypervisor_port=port))

        async def running() -> Any:
            found = await status(kube, r.GPUNODES, node)
            return found if found.get("phase") == "Running" and found.get("totalGPUs") == 2 else None

        reported = await eventually(running, timeout=20, what="the hypervisor's node Running with its 2 GPUs")
        assert reported["totalVRAM"] == "160Gi" and reported["hypervisorStatus"]["hypervisorState"] == "Reporting"
        gpus = sorted(g["metadata"]["name"] for g in await kube.list(r.GPUS))

        async def all_running() -> bool:
            return all([await _phase_is(kube, gpu, "Running") for gpu in gpus])

        await eventually(all_running, what="the reported GPUs schedulable")

        # a worker bound to another node than its GPU's: the ledger places it with its GPU, on this
        # node; this node's hypervisor follows the pods bound here and never sees it
        stray = await kube.create(r.PODS, bound_worker("stray", "elsewhere", [gpus[0]], tflops="1", vram="1Gi"))

        async def in_ledger() -> bool:
            placed = (await ctl.http.get("/api/allocation")).json()["nodeWorkerStore"]
            return bool(placed == {node: {"default/stray": True}})

        await eventually(in_ledger, what="the ledger placing the stray worker on the GPU's node")
        listed = (await httpx_get(f"http://127.0.0.1:{port}/api/v1/workers"))["data"]
        assert stray["metadata"]["uid"] not in [w["WorkerInfo"]["WorkerUID"] for w in listed]
        view = await eventually(lambda: _drift_kind(ctl, "hypervisor-workers"), timeout=20,
                                what="the hypervisor's list found to disagree with the ledger")
        assert any(f["kind"] == "hypervisor-workers" and stray["metadata"]["uid"] in f["message"]
                   for f in view["recent"])
        await eventually(lambda: has_event(kube, node, "DriftDetected"), what="the event on the GPUNode")


async def httpx_get(url: str) -> Any:
    import httpx

    async with httpx.AsyncClient(timeout=5) as http:
        return (await http.get(url)).json()


async def _drift_kind(ctl: Any, kind: str) -> Any:
    view = await _drift_view(ctl)
    return view if view and view["total"][kind] >= 1 else None
