"""A soft worker resized in place reaches the limiter without a restart: the controller's
WorkerResizer patches the pod's annotations and adjusts the ledger, and the hypervisor (Kubernetes
backend, simulated GPUs, embedded API server) writes the new `mem_limit` and `up_limit` into the
same shared-memory file (same inode) the worker's limiter already has mapped."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import pytest

from tests.apiserver_fixture import ApiServerHandle, apply_crds
from tests.helpers import eventually
from tests.helpers.controller import controllers, kube_client, settings_for, start_controller
from tests.helpers.soft_isolation import NODE, hypervisor, setup_node
from tfusion.allocator.request import Resources
from tfusion.api import annotations as tfa
from tfusion.api.accessors import Pod
from tfusion.controller.autoscaler.resize import WorkerResizer
from tfusion.hypervisor.shm import layout
from tfusion.hypervisor.shm.state import DeviceSnapshot, SharedState
from tfusion.kube.client import NotFound
from tfusion.kube.resources import GPUS, PODS

pytestmark = pytest.mark.anyio

GI = 1 << 30
H100_SLOT = 2  # the third simulated device of soft_isolation.SPEC


def read_slot(path: Path, slot: int) -> tuple[int, DeviceSnapshot]:
    """(inode, the slot's fields) of a shared-memory file, read as the limiter would: mapped, no
    ownership or mode change."""
    fd = os.open(path, os.O_RDWR)
    try:
        inode = os.fstat(fd).st_ino
        mapping = mmap.mmap(fd, layout.FILE_SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    state = SharedState(path, mapping)
    try:
        return inode, state.device(slot)
    finally:
        state.close()


async def test_soft_worker_limits_change_in_the_same_shared_memory(apiserver: ApiServerHandle,
                                                                   tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube:
        await setup_node(kube)
        async with hypervisor(apiserver, tmp_path / "node") as http, controllers() as tg:
            h100 = (await http.get("/api/v1/devices")).json()["data"][H100_SLOT]["UUID"]

            async def reported() -> bool:
                gpu = await kube.get(GPUS, h100.lower())
                return bool((gpu.get("status") or {}).get("capacity"))

            await eventually(reported, 15, what="the hypervisor's GPU objects", retry_on=(NotFound,))
            ctl = await start_controller(tg, settings_for(apiserver, tmp_path))
            raw = await kube.create(PODS, {
                "metadata": {"name": "soft-0", "namespace": "default", "labels": {tfa.COMPONENT: "worker"},
                             "annotations": {tfa.GPU_IDS: h100.lower(), tfa.GPU_POOL: "pool-soft",
                                             tfa.ISOLATION: "soft",
                                             tfa.TFLOPS_REQUEST: "100", tfa.VRAM_REQUEST: "8Gi",
                                             tfa.TFLOPS_LIMIT: "200", tfa.VRAM_LIMIT: "16Gi"}},
                "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "busybox"}]}})
            pod = Pod(raw)
            shm = tmp_path / "node" / "shm" / "default" / "soft-0" / "shm"

            def first_limits() -> tuple[int, DeviceSnapshot] | None:
                inode, device = read_slot(shm, H100_SLOT)
                return (inode, device) if device.mem_limit == 16 * GI else None

            inode, device = await eventually(first_limits, 15, what="the worker's shared memory",
                                             retry_on=(FileNotFoundError, ValueError, OSError))
            assert device.up_limit == 21  # ceil(200 / 989 TFLOPS * 100)

            def adopted() -> bool:
                allocator = ctl.service.allocator
                return allocator is not None and pod.uid in allocator.allocations(committed_only=True)

            await eventually(adopted, 15, what="the controller's allocator holds the worker")
            outcome = await WorkerResizer(ctl.runtime, ctl.service).resize(
                pod, Resources(tflops=40_000, vram=3 * GI), Resources(tflops=99_000, vram=4 * GI), reason="test")
            assert outcome.applied, outcome

            def resized() -> DeviceSnapshot | None:
                now_inode, now = read_slot(shm, H100_SLOT)
                assert now_inode == inode, "the file was recreated"
                return now if now.mem_limit == 4 * GI else None

            after = await eventually(resized, 15, what="the new limits in the same file", retry_on=(AssertionError,))
            assert after.up_limit == 11  # ceil(99 / 989 TFLOPS * 100)
            assert after.uuid == device.uuid and after.is_active
            worker = (await http.get("/api/v1/workers")).json()["data"]
            assert [w["WorkerInfo"]["WorkerUID"] for w in worker] == [pod.uid]
