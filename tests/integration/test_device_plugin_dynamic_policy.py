"""The hypervisor with --isolation-policy=dynamic, its device plugins against the fake kubelet
(tests/helpers/device_plugin.py): it reports the policy on its GPUs (`status.isolationPolicy`) and its
Allocate refuses a pod whose mode differs from the device's other worker, naming both modes."""

from __future__ import annotations

from pathlib import Path

import grpc
import grpc.aio
import pytest

from tests.apiserver_fixture import ApiServerHandle, apply_crds
from tests.helpers import eventually
from tests.helpers.device_plugin import NOT_YET, hypervisor, ids, plugin_node, worker_pod
from tfusion.hypervisor.deviceplugin import deviceplugin_pb2 as pb
from tfusion.kube.resources import GPUS

pytestmark = pytest.mark.anyio


async def test_allocate_refuses_a_second_mode_on_a_device(apiserver: ApiServerHandle, short_tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with plugin_node(apiserver, short_tmp_path) as (kube, plugin_dir, kubelet), \
            hypervisor(apiserver, short_tmp_path / "state", plugin_dir, extra={"isolation_policy": "dynamic"}) as http:
        async def registered() -> bool:
            assert len(kubelet.devices) == 16
            return True

        await eventually(registered, 20, retry_on=NOT_YET)

        async def reported() -> list[str]:
            gpus = await kube.list(GPUS)
            policies = [(g.get("status") or {}).get("isolationPolicy", "") for g in gpus]
            return policies if gpus and all(policies) else []

        assert set(await eventually(reported, 20, what="GPUs reported")) == {"Dynamic"}
        device = (await http.get("/api/v1/devices")).json()["data"][0]["UUID"]
        await worker_pod(kube, "soft-0", 1, device, isolation="soft")
        first = kubelet.client(kubelet.endpoint("tensor-fusion.ai/index_0"))
        answer = await first.allocate(pb.AllocateRequest(container_requests=[
            pb.ContainerAllocateRequest(devices_ids=ids(0, 1))]), timeout=10)
        assert answer.container_responses[0].envs["TF_ISOLATION_MODE"] == "soft"

        await worker_pod(kube, "hard-0", 2, device, isolation="hard")
        second = kubelet.client(kubelet.endpoint("tensor-fusion.ai/index_0"))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await second.allocate(pb.AllocateRequest(container_requests=[
                pb.ContainerAllocateRequest(devices_ids=ids(0, 2))]), timeout=10)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert refused.value.details() == (
            f"worker default/hard-0: device {device.lower()} runs soft isolation (default/soft-0) under the "
            "dynamic isolation policy; the pod asks hard")
