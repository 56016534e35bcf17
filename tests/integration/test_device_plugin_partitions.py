"""A partitioned pod through the device plugin (grpcio, a fake kubelet) on the sim backend's A100 MIG
model: Allocate creates the MIG partition at the slot the GPU's status records for the pod and gives
the container the MIG device; /api/v1/devices lists it under its parent; deleting the pod removes it."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from tests.apiserver_fixture import ApiServerHandle, apply_crds
from tests.helpers import eventually
from tests.helpers.device_plugin import NODE, hypervisor, plugin_node
from tfusion.api import annotations as tfa
from tfusion.api import podindex
from tfusion.hypervisor.deviceplugin import deviceplugin_pb2 as pb
from tfusion.hypervisor.devices.sim import sim_partition_uuid
from tfusion.kube.client import KubeClient
from tfusion.kube.resources import GPUS, PODS, PROVIDERCONFIGS

NOT_YET = (AssertionError, KeyError, StopIteration)

pytestmark = pytest.mark.anyio

TEMPLATES = [
    {"id": "nv-80g-1g-10gb", "name": "1g.10gb", "nvmlProfileId": 19, "memoryGigabytes": 10, "computePercent": "14"},
    {"id": "nv-80g-2g-20gb", "name": "2g.20gb", "nvmlProfileId": 14, "memoryGigabytes": 20, "computePercent": "28"}]


async def partitioned_pod(kube: KubeClient, name: str, index: int, gpu: str, template: str) -> dict[str, Any]:
    resource, count = podindex.encode_pod_index(index)
    return await kube.create(PODS, {
        "metadata": {"name": name, "namespace": "default", "labels": {tfa.COMPONENT: "worker"},
                     "annotations": {tfa.GPU_IDS: gpu, tfa.INDEX: str(index), tfa.GPU_POOL: "pool-dp",
                                     tfa.ISOLATION: "partitioned", tfa.PARTITION_ID: template}},
        "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "busybox",
                                                   "resources": {"limits": {resource: str(count)}}}]}})


async def record_slot(kube: KubeClient, gpu: str, pod: dict[str, Any], template: str, start: int, end: int) -> None:
    """What the allocator writes when it places a partitioned pod."""
    uid = pod["metadata"]["uid"]
    await kube.patch(GPUS, gpu, {"status": {"allocatedPartitions": {uid: {
        "templateId": template, "podUid": uid, "podName": pod["metadata"]["name"], "namespace": "default",
        "allocatedAt": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "allocatedSlotStart": start, "allocatedSlotEnd": end}}}}, patch_type="merge", subresource="status")


def ask(k: int, count: int) -> pb.AllocateRequest:
    return pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(
        devices_ids=[f"{k}-{n}" for n in range(1, count + 1)])])


async def test_a_partitioned_pod_gets_its_mig_device(apiserver: ApiServerHandle, short_tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with plugin_node(apiserver, short_tmp_path) as (kube, plugin_dir, kubelet):
        await kube.create(PROVIDERCONFIGS, {"metadata": {"name": "nvidia"}, "spec": {
            "vendor": "NVIDIA", "images": {"middleware": "tensorfusion/middleware"}, "hardwareMetadata": [{
                "model": "A100_SXM_80G", "fullModelName": "NVIDIA A100-SXM4-80GB", "fp16TFlops": "312",
                "partitionTemplateRefs": ["nv-80g-1g-10gb", "nv-80g-2g-20gb"]}],
            "virtualizationTemplates": TEMPLATES}})
        async with hypervisor(apiserver, short_tmp_path / "state", plugin_dir) as http:
            async def registered() -> bool:
                assert len({r.resource_name for r in kubelet.registrations}) == 16
                return True

            await eventually(registered, 20, retry_on=NOT_YET)
            a100 = (await http.get("/api/v1/devices")).json()["data"][0]["UUID"]
            await eventually(lambda: kube.get(GPUS, a100), 20, retry_on=(Exception,))

            # pod index 3 = index_0 asked 3 times; the allocator gave it slot 3 of the A100
            first = await partitioned_pod(kube, "mig-0", 3, a100, "nv-80g-1g-10gb")
            await record_slot(kube, a100, first, "nv-80g-1g-10gb", 3, 4)
            plugin0 = kubelet.client(kubelet.endpoint("tensor-fusion.ai/index_0"))
            answer = (await plugin0.allocate(ask(0, 3), timeout=10)).container_responses[0]
            mig = sim_partition_uuid(a100, 19, 3)
            assert dict(answer.envs) == {"NVIDIA_VISIBLE_DEVICES": mig, "CUDA_VISIBLE_DEVICES": mig,
                                         "TF_ISOLATION_MODE": "partitioned"}
            assert list(answer.devices) == []  # the runtime maps the MIG device from NVIDIA_VISIBLE_DEVICES
            again = (await plugin0.allocate(ask(0, 3), timeout=10)).container_responses[0]
            assert dict(again.envs) == dict(answer.envs)  # the same partition, not a second one

            devices = (await http.get("/api/v1/devices")).json()["data"]
            listed = next(d for d in devices if d["UUID"] == mig)
            assert (listed["ParentUUID"], listed["TotalMemoryBytes"]) == (a100, 10 * 1024**3)
            assert listed["Properties"]["migProfile"] == "1g.10gb" and listed["Properties"]["migSlots"] == "3-4"
            assert [d["ParentUUID"] for d in devices].count("") == 3  # the three GPUs themselves
            assert (await http.get(f"/api/v1/devices/{mig}")).json()["data"]["ParentUUID"] == a100

            # 2g.20gb at slot 2 overlaps the 1g at slot 3: refused with the reason while it is there
            second = await partitioned_pod(kube, "mig-1", 4, a100, "nv-80g-2g-20gb")
            await record_slot(kube, a100, second, "nv-80g-2g-20gb", 2, 4)
            with pytest.raises(grpc.aio.AioRpcError) as overlap:
                await plugin0.allocate(ask(0, 4), timeout=10)
            assert overlap.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "pod default/mig-1" in str(overlap.value.details())
            assert "slots 2-4 for 2g.20gb overlap" in str(overlap.value.details())

            await kube.delete(PODS, "mig-0", namespace="default")

            async def removed() -> bool:
                assert mig not in [d["UUID"] for d in (await http.get("/api/v1/devices")).json()["data"]]
                return True

            await eventually(removed, 20, retry_on=NOT_YET)
            freed = (await plugin0.allocate(ask(0, 4), timeout=10)).container_responses[0]
            assert freed.envs["NVIDIA_VISIBLE_DEVICES"] == sim_partition_uuid(a100, 14, 2)
