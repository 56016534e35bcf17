"""DETECT_IN_USED_GPUS through the hypervisor role against the embedded API server: GPUs the
kubelet handed to another device plugin's pods are marked in `status.usedBy`, and given back.

The kubelet is the one part played here: its device-manager checkpoint is a file the test writes,
and its PodResources API a real gRPC server on the unix socket where the kubelet serves it."""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import grpc.aio
import httpx
import pytest

from tests.apiserver_fixture import ApiServerHandle, apply_crds
from tests.helpers.kube_hypervisor import NODE, SPEC, create_pool_and_node
from tfusion.allocator import gpu_from_object
from tfusion.api.accessors import Gpu
from tfusion.hypervisor import role
from tfusion.hypervisor.deviceplugin.podresources import AssignedDevices, pod_resources_handler
from tfusion.hypervisor.deviceplugin.rpc import unix_target
from tfusion.kube.client import KubeClient
from tfusion.kube.resources import GPUS, PROVIDERCONFIGS
from tfusion.settings import Settings

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def detecting_hypervisor(apiserver: ApiServerHandle, short_tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    plugins = short_tmp_path / "kubelet" / "device-plugins"
    plugins.mkdir(parents=True)
    settings = Settings.load({"backend": "kubernetes", "devices": SPEC, "hypervisor_port": 0, "node_name": NODE,
                              "kube": apiserver.kubeconfig, "state_dir": str(short_tmp_path / "state"),
                              "shm_root": str(short_tmp_path / "shm"), "device_plugin_dir": str(plugins),
                              "metrics_output_path": str(short_tmp_path / "metrics.log")},
                             env={"DETECT_IN_USED_GPUS": "true"}, roles=("hypervisor",))
    async with anyio.create_task_group() as tg:
        port = await tg.start(role.run, settings)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            yield http
        tg.cancel_scope.cancel()


def write_checkpoint(short_tmp_path: Path, entries: list[tuple[str, list[str]]]) -> None:
    """What the kubelet's device manager writes (kubelet 1.20+ layout), atomically as it does."""
    data = {"Data": {"PodDeviceEntries": [
        {"PodUID": f"pod-{n}", "ContainerName": "main", "ResourceName": resource, "DeviceIDs": {"0": ids}}
        for n, (resource, ids) in enumerate(entries)], "RegisteredDevices": {}}, "Checksum": 0}
    path = short_tmp_path / "kubelet" / "device-plugins" / "kubelet_internal_checkpoint"
    part = path.with_suffix(".part")
    part.write_text(json.dumps(data))
    part.replace(path)


def dead_socket(path: Path) -> None:
    """A socket file nothing listens on (a kubelet that died), whether or not grpc removed its own."""
    if path.exists():
        return
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))


async def used_by(kube: KubeClient) -> dict[str, str]:
    return {g["metadata"]["name"]: (g.get("status") or {}).get("usedBy", "") for g in (await kube.list(GPUS)).items}


async def until(check: Any, what: str, timeout: float = 15.0) -> Any:
    last: Any = None
    try:
        with anyio.fail_after(timeout):
            while not (last := await check()):
                await anyio.sleep(0.1)
    except TimeoutError:
        pytest.fail(f"timed out waiting for {what}; last {last!r}")
    return last


async def test_gpus_held_by_the_nvidia_plugin_are_marked_and_given_back(
        apiserver: ApiServerHandle, kube: KubeClient, short_tmp_path: Path) -> None:
    await apply_crds(apiserver)
    await create_pool_and_node(kube)
    async with detecting_hypervisor(apiserver, short_tmp_path) as http:
        uuids = [d["UUID"] for d in (await http.get("/api/v1/devices")).json()["data"]]
        first, second, third = uuids

        async def reported() -> bool:
            return set((await used_by(kube)).values()) == {"tensor-fusion"} and len(await used_by(kube)) == 3

        await until(reported, "the three GPUs reported, used by tensor-fusion")
        # someone marked the third GPU by hand: no detector wrote that, so none takes it back
        await kube.patch(GPUS, third, {"status": {"usedBy": "reserved-by-ops"}}, subresource="status")

        # a native pod got the first GPU (its ID as the NVIDIA plugin writes it), a HAMi-style
        # share of the second, and a worker its tfusion index
        write_checkpoint(short_tmp_path, [("nvidia.com/gpu", [first.upper()]),
                                          ("nvidia.com/gpu", [f"{second.upper()}-1"]),
                                          ("tensor-fusion.ai/index_0", ["0-1"])])
        expected = {first: "nvidia-device-plugin", second: "3rd-party-device-plugin", third: "reserved-by-ops"}

        async def marked() -> bool:
            return await used_by(kube) == expected

        await until(marked, "the held GPUs marked")
        held = await kube.get(GPUS, first)
        assert gpu_from_object(Gpu(held)).used_by == "nvidia-device-plugin"  # what the allocator leaves alone

        # the native pod ends: the kubelet's record drops it, the GPU is tfusion's again
        write_checkpoint(short_tmp_path, [("nvidia.com/gpu", [f"{second.upper()}-1"])])

        async def given_back() -> bool:
            return await used_by(kube) == {**expected, first: "tensor-fusion"}

        await until(given_back, "the released GPU given back")


async def test_the_pod_resources_api_is_the_truth_and_a_dead_one_changes_nothing(
        apiserver: ApiServerHandle, kube: KubeClient, short_tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    await apply_crds(apiserver)
    await create_pool_and_node(kube)
    await kube.create(PROVIDERCONFIGS, {"metadata": {"name": "npu-provider"}, "spec": {
        "vendor": "Example", "images": {"middleware": "m", "remoteClient": "c", "remoteWorker": "w"},
        "devicePluginDetection": {"resourceNamePrefixes": ["example.com/accel"], "usedBySystemName": "accel-plugin"}}})
    answer: list[AssignedDevices] = []

    async def kubelet_list() -> list[AssignedDevices]:
        return list(answer)

    socket_dir = short_tmp_path / "kubelet" / "pod-resources"
    socket_dir.mkdir(parents=True)
    server = grpc.aio.server()
    server.add_generic_rpc_handlers([pod_resources_handler(kubelet_list)])
    server.add_insecure_port(unix_target(str(socket_dir / "kubelet.sock")))
    await server.start()
    try:
        async with detecting_hypervisor(apiserver, short_tmp_path) as http:
            uuids = [d["UUID"] for d in (await http.get("/api/v1/devices")).json()["data"]]

            async def reported() -> bool:
                return len(await used_by(kube)) == 3

            await until(reported, "the three GPUs reported")
            # the checkpoint names the first GPU, the PodResources API the second (via the
            # ProviderConfig's resource): the API wins
            answer.append(AssignedDevices(namespace="default", pod="native", container="main",
                                          resource="example.com/accel", device_ids=(uuids[1].upper(),)))
            write_checkpoint(short_tmp_path, [("nvidia.com/gpu", [uuids[0]])])  # a rewrite starts a pass

            async def marked() -> bool:
                return await used_by(kube) == {uuids[0]: "tensor-fusion", uuids[1]: "accel-plugin",
                                               uuids[2]: "tensor-fusion"}

            await until(marked, "the GPU the PodResources API names marked, not the checkpoint's")

            # the API stops answering: the pass is skipped and says why; the mark stays
            await server.stop(None)
            dead_socket(socket_dir / "kubelet.sock")
            answer.clear()
            with caplog.at_level(logging.WARNING, logger="tfusion.hypervisor.external_plugins"):
                write_checkpoint(short_tmp_path, [])

                async def skipped() -> bool:
                    return any("not checked this time" in r.getMessage() and "kubelet.sock" in r.getMessage()
                               for r in caplog.records)

                await until(skipped, "the skipped pass in the log")
            assert (await used_by(kube))[uuids[1]] == "accel-plugin"
    finally:
        await server.stop(None)


async def test_without_kubernetes_there_is_nothing_to_mark(short_tmp_path: Path) -> None:
    settings = Settings.load({"backend": "local", "devices": SPEC, "hypervisor_port": 0, "node_name": NODE,
                              "state_dir": str(short_tmp_path / "state")}, env={"DETECT_IN_USED_GPUS": "true"},
                             roles=("hypervisor",))
    with pytest.raises(role.HypervisorError, match=r"DETECT_IN_USED_GPUS=true .* only --backend=kubernetes"):
        await role.run(settings)
