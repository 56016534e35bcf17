"""The hypervisor's 16 kubelet device plugins against a fake kubelet written here with grpcio: the real
deviceplugin/v1beta1 protocol over real unix sockets. Registration, ListAndWatch (36 devices each, and
their health), Allocate mapped back to the pod through the index encoding and the pod cache, and a
kubelet restart (its sockets deleted, a new kubelet.sock) after which every plugin registers again."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import grpc
import grpc.aio
import pytest

from tests.apiserver_fixture import ApiServerHandle, apply_crds
from tests.helpers import eventually
from tests.helpers.device_plugin import (
    NOT_YET,
    RESOURCES,
    FakeKubelet,
    hypervisor,
    ids,
    pool_and_gpunode,
    worker_pod,
)
from tfusion.hypervisor.deviceplugin import deviceplugin_pb2 as pb
from tfusion.kube.client import KubeClient

pytestmark = pytest.mark.anyio


async def test_device_plugins_with_a_fake_kubelet(apiserver: ApiServerHandle, short_tmp_path: Path) -> None:
    await apply_crds(apiserver)
    kube = await KubeClient.connect(apiserver.kubeconfig)
    plugin_dir = short_tmp_path / "device-plugins"
    plugin_dir.mkdir()
    kubelet = FakeKubelet(plugin_dir)
    await kubelet.start()
    try:
        await pool_and_gpunode(kube)
        async with hypervisor(apiserver, short_tmp_path / "state", plugin_dir) as http:
            async def all_registered() -> bool:
                assert sorted(r.resource_name for r in kubelet.registrations) == sorted(RESOURCES)
                assert len(kubelet.devices) == 16
                return True

            await eventually(all_registered, 20, retry_on=NOT_YET)
            first = {r.resource_name: r for r in kubelet.registrations}
            assert first["tensor-fusion.ai/index_a"].endpoint == "tensor-fusion-index-10.sock"
            assert all(r.version == "v1beta1" and not r.options.pre_start_required
                       and not r.options.get_preferred_allocation_available for r in first.values())
            assert kubelet.devices["tensor-fusion.ai/index_3"] == [(i, "Healthy") for i in ids(3, 36)]

            async def ready() -> bool:
                conditions = {c["name"]: c for c in (await http.get("/readyz")).json()["conditions"]}
                assert conditions["device-plugins"]["ready"] is True, conditions["device-plugins"]
                assert "16 device plugins registered" in conditions["device-plugins"]["message"]
                return True

            await eventually(ready, 20, retry_on=NOT_YET)

            devices = (await http.get("/api/v1/devices")).json()["data"]
            h100 = devices[2]["UUID"]
            await worker_pod(kube, "train-0", 11, h100)  # index 11 = index_1 asked 3 times
            plugin = kubelet.client(kubelet.endpoint("tensor-fusion.ai/index_1"))

            async def allocated() -> pb.AllocateResponse:
                return await plugin.allocate(pb.AllocateRequest(container_requests=[
                    pb.ContainerAllocateRequest(devices_ids=ids(1, 3))]), timeout=10)

            answer = (await allocated()).container_responses[0]
            native = "GPU-" + h100[4:]
            assert dict(answer.envs) == {
                "NVIDIA_VISIBLE_DEVICES": native, "CUDA_VISIBLE_DEVICES": native, "TF_ISOLATION_MODE": "soft",
                "TF_GPU_MEMORY_LIMIT": str(16 * 1024**3), "TF_CUDA_MEMORY_LIMIT": str(16 * 1024**3),
                "TF_CUDA_SM_PERCENT_LIMIT": "21"}
            assert [(d.container_path, d.host_path, d.permissions) for d in answer.devices] == [
                ("/dev/nvidia2", "/dev/nvidia2", "rwm")]
            assert list(answer.mounts) == [] and list(answer.cdi_devices) == []

            # Allocate waits for the pod cache: the request comes before the pod (index 20 = index_2 x 4)
            plugin2 = kubelet.client(kubelet.endpoint("tensor-fusion.ai/index_2"))
            async with anyio.create_task_group() as tg:
                results: list[pb.AllocateResponse] = []

                async def ask() -> None:
                    results.append(await plugin2.allocate(pb.AllocateRequest(container_requests=[
                        pb.ContainerAllocateRequest(devices_ids=ids(2, 4))]), timeout=20))

                tg.start_soon(ask)
                await anyio.sleep(0.5)
                assert results == []
                await worker_pod(kube, "late-0", 20, devices[0]["UUID"], isolation="shared")
            assert dict(results[0].container_responses[0].envs) == {
                "NVIDIA_VISIBLE_DEVICES": "GPU-" + devices[0]["UUID"][4:],
                "CUDA_VISIBLE_DEVICES": "GPU-" + devices[0]["UUID"][4:], "TF_ISOLATION_MODE": "shared"}

            with pytest.raises(grpc.aio.AioRpcError) as too_many:
                await plugin.allocate(pb.AllocateRequest(container_requests=[
                    pb.ContainerAllocateRequest(devices_ids=[*ids(1, 8), "1-9"])]), timeout=5)
            assert too_many.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            with pytest.raises(grpc.aio.AioRpcError) as nobody:  # no pod has index 12: it keeps waiting
                await plugin.allocate(pb.AllocateRequest(container_requests=[
                    pb.ContainerAllocateRequest(devices_ids=ids(1, 4))]), timeout=1)
            assert nobody.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED

            # every GPU unhealthy: every plugin's devices turn Unhealthy (the sim's load file)
            load = {"devices": {str(i): {"healthy": False, "healthMessage": "XID 79"} for i in range(3)}}
            (short_tmp_path / "state" / "sim-load.json").write_text(json.dumps(load))

            async def unhealthy() -> bool:
                assert kubelet.devices["tensor-fusion.ai/index_f"] == [(i, "Unhealthy") for i in ids(15, 36)]
                return True

            await eventually(unhealthy, 20, retry_on=NOT_YET)
            (short_tmp_path / "state" / "sim-load.json").write_text(json.dumps({"devices": {
                str(i): {"healthy": True} for i in range(3)}}))

            async def healthy_again() -> bool:
                assert kubelet.devices["tensor-fusion.ai/index_f"] == [(i, "Healthy") for i in ids(15, 36)]
                return True

            await eventually(healthy_again, 20, retry_on=NOT_YET)

            # the kubelet restarts: sockets gone, a new kubelet.sock; every plugin registers again
            await kubelet.stop()
            kubelet = FakeKubelet(plugin_dir)
            await kubelet.start()
            await eventually(all_registered, 20, retry_on=NOT_YET)
            assert kubelet.devices["tensor-fusion.ai/index_0"] == [(i, "Healthy") for i in ids(0, 36)]
            await worker_pod(kube, "after-0", 1, h100, isolation="hard")
            again = await kubelet.client(kubelet.endpoint("tensor-fusion.ai/index_0")).allocate(
                pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids(0, 1))]))
            assert again.container_responses[0].envs["TF_ISOLATION_MODE"] == "hard"
        assert sorted(p.name for p in plugin_dir.glob("tensor-fusion-index-*.sock")) == []  # removed on stop
    finally:
        await kubelet.stop()
        await kube.close()


async def test_plugins_wait_for_the_kubelet(apiserver: ApiServerHandle, short_tmp_path: Path) -> None:
    await apply_crds(apiserver)
    plugin_dir = short_tmp_path / "device-plugins"
    async with hypervisor(apiserver, short_tmp_path / "state", plugin_dir) as http:
        async def waiting() -> bool:
            conditions = {c["name"]: c for c in (await http.get("/readyz")).json()["conditions"]}
            assert conditions["device-plugins"]["ready"] is False
            assert "waiting for the kubelet's" in conditions["device-plugins"]["message"]
            return True

        await eventually(waiting, 20, retry_on=NOT_YET)
        kubelet = FakeKubelet(plugin_dir)
        await kubelet.start()
        try:
            async def registered() -> bool:
                assert len({r.resource_name for r in kubelet.registrations}) == 16
                return True

            await eventually(registered, 20, retry_on=NOT_YET)
        finally:
            await kubelet.stop()
