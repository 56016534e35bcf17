"""The PodResources client against real grpc.aio servers on unix sockets: what the kubelet assigned comes
back exactly, the fields we do not declare are skipped, and every way the kubelet can fail to answer
(an error status, no socket, nobody listening, no answer) becomes a PodResourcesError naming the socket."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import grpc.aio
import pytest

from tfusion.hypervisor.deviceplugin import podresources_pb2 as pb
from tfusion.hypervisor.deviceplugin.podresources import (
    AssignedDevices,
    PodResourcesError,
    list_assigned_devices,
    pod_resources_handler,
)
from tfusion.hypervisor.deviceplugin.rpc import Context, method_types, unix_target

pytestmark = pytest.mark.anyio

ASSIGNED = [
    AssignedDevices("default", "trainer", "main", "nvidia.com/gpu", ("GPU-aaaa", "GPU-bbbb")),
    AssignedDevices("default", "trainer", "main", "tensor-fusion.ai/index_3", ("3",)),
    AssignedDevices("default", "trainer", "sidecar", "example.com/nic", ("nic0",)),
    AssignedDevices("ml", "infer-0", "server", "nvidia.com/gpu", ("GPU-cccc",)),
    AssignedDevices("ml", "infer-1", "server", "nvidia.com/gpu", ()),
]


@asynccontextmanager
async def kubelet(socket: Path, *handlers: grpc.GenericRpcHandler) -> AsyncIterator[None]:
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(handlers)
    assert server.add_insecure_port(unix_target(str(socket))) != 0
    await server.start()
    try:
        yield
    finally:
        await server.stop(grace=0)


RawList = Callable[[pb.ListPodResourcesRequest, Context], Awaitable[bytes]]


def raw_list_handler(behaviour: RawList) -> grpc.GenericRpcHandler:
    """`List` served by a behaviour that writes the response bytes itself (or aborts)."""
    path, request_cls, _, _ = method_types("PodResourcesLister", "List", pb)
    service = path.split("/")[1]
    handler = grpc.unary_unary_rpc_method_handler(behaviour, request_deserializer=request_cls.FromString,
                                                  response_serializer=lambda raw: raw)
    return grpc.method_handlers_generic_handler(service, {"List": handler})


def test_method_path_and_field_numbers_on_the_wire() -> None:
    assert method_types("PodResourcesLister", "List", pb) == (
        "/v1.PodResourcesLister/List", pb.ListPodResourcesRequest, pb.ListPodResourcesResponse, False)
    answer = pb.ListPodResourcesResponse(pod_resources=[pb.PodResources(
        name="p", namespace="n", containers=[pb.ContainerResources(
            name="c", devices=[pb.ContainerDevices(resource_name="r", device_ids=["a", "b"])])])])
    assert answer.SerializeToString() == (b"\x0a\x16" b"\x0a\x01p\x12\x01n\x1a\x0e"
                                          b"\x0a\x01c\x12\x09" b"\x0a\x01r\x12\x01a\x12\x01b")


async def test_lists_every_container_device_group(tmp_path: Path) -> None:
    async def assigned() -> list[AssignedDevices]:
        return ASSIGNED

    socket = tmp_path / "kubelet.sock"
    async with kubelet(socket, pod_resources_handler(assigned)):
        assert await list_assigned_devices(socket) == ASSIGNED
        assert await list_assigned_devices(str(socket), timeout=5) == ASSIGNED


async def test_an_empty_node_lists_nothing(tmp_path: Path) -> None:
    async def nothing() -> list[AssignedDevices]:
        return []

    socket = tmp_path / "kubelet.sock"
    async with kubelet(socket, pod_resources_handler(nothing)):
        assert await list_assigned_devices(socket) == []


async def test_fields_we_do_not_declare_are_skipped(tmp_path: Path) -> None:
    # what a real kubelet adds: topology (field 3) on the devices, cpu_ids (field 3, packed) on the container
    devices = pb.ContainerDevices.FromString(
        pb.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=["GPU-1"]).SerializeToString()
        + b"\x1a\x04\x0a\x02\x08\x01")
    with_cpus = pb.ContainerResources.FromString(
        pb.ContainerResources(name="main", devices=[devices]).SerializeToString() + b"\x1a\x02\x02\x03")
    no_devices = pb.ContainerResources.FromString(pb.ContainerResources(name="idle").SerializeToString()
                                                  + b"\x1a\x01\x04")
    answer = pb.ListPodResourcesResponse(pod_resources=[
        pb.PodResources(name="gpu-pod", namespace="default", containers=[with_cpus, no_devices]),
        pb.PodResources(name="plain", namespace="kube-system")])
    wire = answer.SerializeToString()
    assert b"\x1a\x04\x0a\x02\x08\x01" in wire and b"\x1a\x02\x02\x03" in wire  # they do travel

    async def list_raw(request: pb.ListPodResourcesRequest, context: Context) -> bytes:
        return wire

    socket = tmp_path / "kubelet.sock"
    async with kubelet(socket, raw_list_handler(list_raw)):
        assert await list_assigned_devices(socket) == [
            AssignedDevices("default", "gpu-pod", "main", "nvidia.com/gpu", ("GPU-1",))]


async def test_an_error_status_names_the_socket_status_and_details(tmp_path: Path) -> None:
    async def refuse(request: pb.ListPodResourcesRequest, context: Context) -> bytes:
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, "not for this client")
        raise AssertionError("abort returned")

    socket = tmp_path / "kubelet.sock"
    async with kubelet(socket, raw_list_handler(refuse)):
        with pytest.raises(PodResourcesError) as caught:
            await list_assigned_devices(socket, timeout=5)
    assert caught.value.code is grpc.StatusCode.PERMISSION_DENIED
    assert caught.value.socket_path == str(socket)
    assert str(socket) in str(caught.value)
    assert "PERMISSION_DENIED" in str(caught.value) and "not for this client" in str(caught.value)


async def test_a_kubelet_without_the_api_is_unimplemented(tmp_path: Path) -> None:
    socket = tmp_path / "kubelet.sock"
    async with kubelet(socket):
        with pytest.raises(PodResourcesError) as caught:
            await list_assigned_devices(socket, timeout=5)
    assert caught.value.code is grpc.StatusCode.UNIMPLEMENTED
    assert str(socket) in str(caught.value) and "UNIMPLEMENTED" in str(caught.value)


async def test_a_missing_socket(tmp_path: Path) -> None:
    socket = tmp_path / "absent" / "kubelet.sock"
    with pytest.raises(PodResourcesError) as caught:
        await list_assigned_devices(socket, timeout=0.5)
    assert caught.value.code is None
    assert str(socket) in str(caught.value) and "does not exist" in str(caught.value)


async def test_a_socket_nobody_listens_on_is_unavailable(tmp_path: Path) -> None:
    socket = tmp_path / "kubelet.sock"
    socket.write_bytes(b"")  # left behind, like a stopped kubelet's socket file
    with pytest.raises(PodResourcesError) as caught:
        await list_assigned_devices(socket, timeout=5)
    assert caught.value.code is grpc.StatusCode.UNAVAILABLE
    assert str(socket) in str(caught.value) and "UNAVAILABLE" in str(caught.value)


async def test_a_kubelet_that_never_answers_times_out(tmp_path: Path) -> None:
    async def hang() -> list[AssignedDevices]:
        await asyncio.Event().wait()
        return []

    socket = tmp_path / "kubelet.sock"
    async with kubelet(socket, pod_resources_handler(hang)):
        with pytest.raises(PodResourcesError) as caught:
            await list_assigned_devices(socket, timeout=0.5)
    assert caught.value.code is grpc.StatusCode.DEADLINE_EXCEEDED
    assert str(socket) in str(caught.value) and "DEADLINE_EXCEEDED" in str(caught.value)


async def test_a_socket_that_accepts_but_never_speaks_times_out(tmp_path: Path) -> None:
    connections: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)

    socket = tmp_path / "kubelet.sock"
    server = await asyncio.start_unix_server(hold, path=str(socket))
    try:
        with pytest.raises(PodResourcesError) as caught:
            await list_assigned_devices(socket, timeout=0.5)
    finally:
        for writer in connections:
            writer.close()
        server.close()
        await server.wait_closed()
    assert str(socket) in str(caught.value)
