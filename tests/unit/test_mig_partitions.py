"""The sim backend's MIG model (NVIDIA's slot geometry, overlap refusal, stable UUIDs), the template
resolution of a pod's partition-id, and the partitioner's create/reuse/rollback/release rules."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tests.helpers import eventually
from tfusion.hypervisor.devices.partitions import (
    MIG_MODELS,
    PartitionError,
    PartitionProfile,
    canonical,
    mig_family,
)
from tfusion.hypervisor.devices.registry import DeviceRegistry
from tfusion.hypervisor.devices.sim import SimBackend, sim_partition_uuid
from tfusion.hypervisor.partitions import Partitioner, resolve_profile, slot_from_gpu
from tfusion.hypervisor.workers.model import WorkerInfo

pytestmark = pytest.mark.anyio

SPEC = "sim:1xA100-SXM4-80GB,1xA100-SXM4-40GB,1xH100-SXM5-80GB,1xL4"


@pytest.fixture
async def sim() -> SimBackend:
    backend = SimBackend(SPEC, "mig-node")
    await backend.open()
    return backend


def geometry(family: str) -> dict[str, tuple[int, int, tuple[int, ...]]]:
    return {s.name: (s.profile_id, s.size, s.starts) for s in MIG_MODELS[family]}


def test_profiles_have_nvidias_slot_geometry() -> None:
    assert geometry("a100-80gb") == {
        "1g.10gb": (19, 1, (0, 1, 2, 3, 4, 5, 6)), "1g.20gb": (15, 2, (0, 2, 4, 6)), "2g.20gb": (14, 2, (0, 2, 4)),
        "3g.40gb": (9, 4, (0, 4)), "4g.40gb": (5, 4, (0,)), "7g.80gb": (0, 8, (0,))}
    assert set(geometry("a100-40gb")) == {"1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"}
    assert geometry("a100-40gb")["1g.10gb"] == (15, 2, (0, 2, 4, 6))  # the 40 GB card's double-memory 1g
    assert geometry("h100-80gb") == geometry("a100-80gb")
    assert [mig_family(m) for m in ("NVIDIA A100-SXM4-80GB", "NVIDIA A100-PCIE-40GB", "NVIDIA H100 80GB HBM3",
                                    "NVIDIA L4")] == ["a100-80gb", "a100-40gb", "h100-80gb", None]


async def test_discovery_says_which_devices_partition(sim: SimBackend) -> None:
    caps = [(d.model, d.capabilities.supports_partitioning, d.capabilities.max_partitions)
            for d in await sim.discover()]
    assert caps == [("NVIDIA A100-SXM4-80GB", True, 7), ("NVIDIA A100-SXM4-40GB", True, 7),
                    ("NVIDIA H100 80GB HBM3", True, 7), ("NVIDIA L4", False, 0)]


async def test_seven_1g_slices_fill_an_a100_then_nothing_fits(sim: SimBackend) -> None:
    gpu = sim.uuids()[0]
    made = [await sim.create_partition(gpu, PartitionProfile("1g.10gb", 19), None) for _ in range(7)]
    assert [(p.slot_start, p.slot_end) for p in made] == [(i, i + 1) for i in range(7)]
    assert len({p.uuid for p in made}) == 7 and all(p.uuid.startswith("MIG-") for p in made)
    with pytest.raises(PartitionError, match=r"no free placement for 1g\.10gb"):
        await sim.create_partition(gpu, PartitionProfile("1g.10gb"), None)
    assert [p.uuid for p in await sim.list_partitions(gpu)] == [p.uuid for p in made]


async def test_placements_are_refused_where_the_hardware_refuses_them(sim: SimBackend) -> None:
    gpu = sim.uuids()[0]
    one = await sim.create_partition(gpu, PartitionProfile("1g.10gb", 19), 3)
    assert (one.slot_start, one.slot_end, one.memory_bytes) == (3, 4, 10 * 1024**3)
    with pytest.raises(PartitionError, match=r"slots 2-4 for 2g.20gb overlap .*1g.10gb@3"):
        await sim.create_partition(gpu, PartitionProfile("2g.20gb"), 2)
    with pytest.raises(PartitionError, match="cannot start at slot 1; allowed start slots: 0, 2, 4"):
        await sim.create_partition(gpu, PartitionProfile("2g.20gb"), 1)
    with pytest.raises(PartitionError, match=r"3g\.40gb cannot start at slot 2"):
        await sim.create_partition(gpu, PartitionProfile("3g.40gb"), 2)
    # 3g.40gb left: only slot 4 (0-3 holds the 1g at slot 3)
    three = await sim.create_partition(gpu, PartitionProfile("3g.40gb"), None)
    assert (three.slot_start, three.slot_end) == (4, 8)
    with pytest.raises(PartitionError, match=r"no free placement for 7g\.80gb"):
        await sim.create_partition(gpu, PartitionProfile("7g.80gb", 0), None)
    await sim.remove_partition(gpu, one.uuid)
    await sim.remove_partition(gpu, one.uuid)  # already gone: no error
    two = await sim.create_partition(gpu, PartitionProfile("mig-2g-20gb"), 2)  # the freed slot
    assert (two.profile_name, two.profile_id, two.slot_start) == ("2g.20gb", 14, 2)


async def test_partition_uuids_are_stable(sim: SimBackend) -> None:
    gpu = sim.uuids()[2]
    first = await sim.create_partition(gpu, PartitionProfile("4g.40gb"), 0)
    assert first.uuid == sim_partition_uuid(gpu, 5, 0)
    await sim.remove_partition(gpu, first.uuid)
    again = SimBackend(SPEC, "mig-node")
    assert (await again.create_partition(gpu, PartitionProfile("4g.40gb"), 0)).uuid == first.uuid
    assert sim_partition_uuid(gpu, 5, 0) != sim_partition_uuid(sim.uuids()[0], 5, 0)


async def test_unknown_profiles_and_models_are_explained(sim: SimBackend) -> None:
    with pytest.raises(PartitionError, match=r"has no MIG profile 2g.20gb; its profiles: 1g.5gb, 1g.10gb"):
        await sim.create_partition(sim.uuids()[1], PartitionProfile("2g.20gb"), None)  # a 40 GB card
    with pytest.raises(PartitionError, match=r"NVIDIA L4.* does not support MIG partitions"):
        await sim.create_partition(sim.uuids()[3], PartitionProfile("1g.10gb"), None)
    with pytest.raises(PartitionError, match="no simulated GPU 'gpu-nope'"):
        await sim.list_partitions("gpu-nope")


PROVIDER: dict[str, Any] = {
    "hardwareMetadata": [
        {"model": "A100_SXM_80G", "fullModelName": "NVIDIA A100-SXM4-80GB", "fp16TFlops": "312",
         "partitionTemplateRefs": ["nv-80g-1g-10gb", "nv-80g-2g-20gb"]},
        {"model": "A100_SXM_40G", "fullModelName": "NVIDIA A100-SXM4-40GB", "fp16TFlops": "312",
         "partitionTemplateRefs": ["nv-40g-1g-5gb", "nv-40g-2g-10gb"]},
        {"model": "H100_SXM_80G", "fullModelName": "NVIDIA H100 80GB HBM3", "fp16TFlops": "989",
         "partitionTemplateRefs": ["nv-h100-2g-20gb"]}],
    "virtualizationTemplates": [
        {"id": "nv-80g-1g-10gb", "name": "1g.10gb", "nvmlProfileId": 19, "memoryGigabytes": 10,
         "computePercent": "14.28"},
        {"id": "nv-80g-2g-20gb", "name": "2g.20gb", "nvmlProfileId": 14, "memoryGigabytes": 20,
         "computePercent": "28.57"},
        {"id": "nv-40g-1g-5gb", "name": "1g.5gb", "nvmlProfileId": 19, "memoryGigabytes": 5,
         "computePercent": "14.28"},
        {"id": "nv-40g-2g-10gb", "name": "2g.10gb", "nvmlProfileId": 14, "memoryGigabytes": 10,
         "computePercent": "28.57"},
        {"id": "nv-h100-2g-20gb", "name": "2g.20gb", "nvmlProfileId": 14, "memoryGigabytes": 20,
         "computePercent": "28.57"}]}


def test_partition_ids_resolve_as_the_original_resolves_them() -> None:
    a100 = "NVIDIA A100-SXM4-80GB"
    assert resolve_profile("mig-1g-10gb", a100, [PROVIDER]) == PartitionProfile("1g.10gb", 19)
    assert resolve_profile("NV-80G-1G-10GB", a100, [PROVIDER]) == PartitionProfile("1g.10gb", 19)
    assert resolve_profile("1g.10gb", "A100_SXM_80G", [PROVIDER]) == PartitionProfile("1g.10gb", 19)
    # two cards that share NVML profile 14, each through its own template
    assert resolve_profile("2g.10gb", "NVIDIA A100-SXM4-40GB", [PROVIDER]).nvml_profile_id == 14
    assert resolve_profile("2g.20gb", "NVIDIA H100 80GB HBM3", [PROVIDER]).nvml_profile_id == 14
    # a template of another model is not this model's: passed through as it is
    assert resolve_profile("nv-40g-1g-5gb", a100, [PROVIDER]) == PartitionProfile("nv-40g-1g-5gb")
    assert resolve_profile("19", a100, []) == PartitionProfile("19", 19)
    assert [canonical(n) for n in ("MIG 1g.10gb", "mig-1g_10gb", " 3g/40gb-- ")] == ["1g-10gb", "1g-10gb", "3g-40gb"]


def test_slot_from_gpu_status() -> None:
    gpu = {"status": {"allocatedPartitions": {"uid-1": {"templateId": "x", "allocatedSlotStart": 4,
                                                        "allocatedSlotEnd": 8}, "uid-2": {"templateId": "y"}}}}
    assert [slot_from_gpu(gpu, u) for u in ("uid-1", "uid-2", "uid-3")] == [4, None, None]
    assert slot_from_gpu({}, "uid-1") is None


def worker(uid: str, gpu: str, partition_id: str = "nv-80g-2g-20gb") -> WorkerInfo:
    return WorkerInfo(uid=uid, namespace="ns", name=f"pod-{uid}", allocated_devices=(gpu,),
                      isolation="partitioned", partition_template_id=partition_id)


async def test_partitioner_creates_once_rolls_back_and_releases(sim: SimBackend) -> None:
    registry = DeviceRegistry(sim)
    await registry.discover()
    gpu = sim.uuids()[0]
    slots = {("a", gpu): 2, ("b", gpu): 2}

    async def slot_of(uid: str, gpu_uuid: str) -> int | None:
        return slots.get((uid, gpu_uuid))

    async def templates() -> list[dict[str, Any]]:
        return [PROVIDER]

    parts = Partitioner(sim, registry, slot_of=slot_of, templates=templates)
    made = await parts.ensure(worker("a", gpu))
    assert not isinstance(made, str)
    (device,) = made
    assert device.uuid == sim_partition_uuid(gpu, 14, 2) and device.parent_uuid == gpu
    assert device.to_wire()["ParentUUID"] == gpu and device.to_wire()["UUID"] == device.uuid
    assert device.total_memory_bytes == 20 * 1024**3 and device.max_tflops == pytest.approx(312 * 2 / 8)
    assert await parts.ensure(worker("a", gpu)) == made  # idempotent: no second partition
    assert len(await sim.list_partitions(gpu)) == 1
    refused = await parts.ensure(worker("b", gpu, "nv-80g-1g-10gb"))  # 1g at slot 2: held by pod a
    assert isinstance(refused, str) and "pod ns/pod-b" in refused and "overlap" in refused
    assert await parts.ensure(worker("c", gpu, "")) == (
        "pod ns/pod-c: isolation is partitioned but the pod has no tensor-fusion.ai/partition-id annotation "
        "naming its template")
    assert [d.uuid for d in parts.devices()] == [device.uuid]
    parts.gone("a")
    await parts.release("a")
    assert await sim.list_partitions(gpu) == [] and parts.devices() == []
    assert not isinstance(await parts.ensure(worker("b", gpu, "nv-80g-1g-10gb")), str)  # slot 2 is free now


async def test_partitioner_takes_over_a_partition_made_before_a_restart(sim: SimBackend) -> None:
    registry = DeviceRegistry(sim)
    await registry.discover()
    gpu = sim.uuids()[0]
    before = await sim.create_partition(gpu, PartitionProfile("3g.40gb", 9), 4)

    async def slot_of(uid: str, gpu_uuid: str) -> int | None:
        return 4

    parts = Partitioner(sim, registry, slot_of=slot_of)
    made = await parts.ensure(worker("a", gpu, "3g.40gb"))
    assert not isinstance(made, str) and [d.uuid for d in made] == [before.uuid]
    assert len(await sim.list_partitions(gpu)) == 1


async def test_a_failure_on_a_later_gpu_removes_what_the_call_made(sim: SimBackend) -> None:
    registry = DeviceRegistry(sim)
    await registry.discover()
    a100, l4 = sim.uuids()[0], sim.uuids()[3]
    parts = Partitioner(sim, registry)
    two_gpus = worker("a", a100, "1g.10gb").replace(allocated_devices=(a100, l4))
    refused = await parts.ensure(two_gpus)
    assert isinstance(refused, str) and "does not support MIG partitions" in refused
    assert await sim.list_partitions(a100) == [] and parts.devices() == []


async def test_a_pod_running_before_a_restart_is_adopted_and_its_partition_removed_when_it_goes(
        sim: SimBackend) -> None:
    registry = DeviceRegistry(sim)
    await registry.discover()
    gpu = sim.uuids()[0]
    before = await sim.create_partition(gpu, PartitionProfile("1g.10gb", 19), 5)
    other = await sim.create_partition(gpu, PartitionProfile("1g.10gb", 19), 6)  # another pod's, untouched

    async def slot_of(uid: str, gpu_uuid: str) -> int | None:
        return 5 if uid == "a" else None

    parts = Partitioner(sim, registry, slot_of=slot_of)
    async with anyio.create_task_group() as tg:
        tg.start_soon(parts.run)
        parts.adopt(worker("a", gpu, "1g.10gb"))
        parts.adopt(worker("b", gpu, "1g.10gb"))  # no slot recorded: nothing to take over
        await eventually(lambda: [d.uuid for d in parts.devices()] == [before.uuid], 5)
        parts.gone("a")

        async def only_other_left() -> bool:
            return [p.uuid for p in await sim.list_partitions(gpu)] == [other.uuid]

        await eventually(only_other_left, 5)
        assert parts.devices() == []
        tg.cancel_scope.cancel()
