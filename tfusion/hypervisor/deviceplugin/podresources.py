"""A client for the kubelet's PodResources API (podresources/v1, `List` only).

Why: the kubelet, not the API server, knows which device ids it handed to which container; a pod only
says how many of a resource it wants. The hypervisor asks the kubelet so it can tell the GPUs that
another device plugin (e.g. nvidia.com/gpu) gave out, and keep them out of its own pool.

Bound by hand like `rpc.py`: the method path and message types come from the descriptor of
`podresources_pb2` (generated from proto/podresources.proto), so mypy checks the calls. For a kubelet
stand-in, such as a test's, `pod_resources_handler` serves `List` from a Python callable.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import grpc
import grpc.aio

from tfusion.hypervisor.deviceplugin import podresources_pb2 as pb
from tfusion.hypervisor.deviceplugin.rpc import Context, method_types, unix_target

LISTER = "PodResourcesLister"

# what each status usually means when it comes from the kubelet's socket
_HINTS = {
    grpc.StatusCode.UNAVAILABLE: "nothing answers on the socket; is the kubelet running and the socket readable?",
    grpc.StatusCode.DEADLINE_EXCEEDED: "the kubelet did not answer in time",
    grpc.StatusCode.UNIMPLEMENTED: "this kubelet does not serve podresources v1 List",
}


@dataclass(frozen=True)
class AssignedDevices:
    """The devices of one resource that the kubelet assigned to one container."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]


class PodResourcesError(Exception):
    """The kubelet's assignments could not be read. `code` is the gRPC status, None if the socket is missing."""

    def __init__(self, message: str, socket_path: str, code: grpc.StatusCode | None) -> None:
        super().__init__(message)
        self.socket_path = socket_path
        self.code = code


async def list_assigned_devices(socket_path: str | Path, *, timeout: float = 10.0) -> list[AssignedDevices]:
    """Every container's devices, one entry per (container, resource), as the kubelet's `List` reports them.

    Raises PodResourcesError, within `timeout` seconds, if the kubelet cannot be asked or does not answer."""
    path = str(socket_path)
    if not Path(path).exists():
        raise PodResourcesError(f"kubelet PodResources socket {path} does not exist; is the kubelet running and "
                                f"its pod-resources directory mounted?", path, None)
    rpc_path, request_cls, response_cls, _ = method_types(LISTER, "List", pb)
    async with grpc.aio.insecure_channel(unix_target(path)) as channel:
        list_call = channel.unary_unary(rpc_path, request_serializer=request_cls.SerializeToString,
                                        response_deserializer=response_cls.FromString)
        try:
            answer = await list_call(pb.ListPodResourcesRequest(), timeout=timeout)
        except grpc.aio.AioRpcError as error:
            raise _rpc_error(path, error, timeout) from error
    assert isinstance(answer, pb.ListPodResourcesResponse)
    return _assigned(answer)


def _rpc_error(path: str, error: grpc.aio.AioRpcError, timeout: float) -> PodResourcesError:
    code = error.code()
    hint = _HINTS.get(code)
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        hint = f"{hint} ({timeout:g}s)"
    message = f"kubelet PodResources List on {path} failed: {code.name}: {error.details() or 'no details'}"
    return PodResourcesError(f"{message} ({hint})" if hint else message, path, code)


def _assigned(answer: pb.ListPodResourcesResponse) -> list[AssignedDevices]:
    return [AssignedDevices(namespace=pod.namespace, pod=pod.name, container=container.name,
                            resource=devices.resource_name, device_ids=tuple(devices.device_ids))
            for pod in answer.pod_resources for container in pod.containers for devices in container.devices]


def _response(assigned: Iterable[AssignedDevices]) -> pb.ListPodResourcesResponse:
    """The kubelet's nesting (pod > container > resource), in the order the entries first name them."""
    pods: dict[tuple[str, str], dict[str, list[pb.ContainerDevices]]] = {}
    for entry in assigned:
        containers = pods.setdefault((entry.namespace, entry.pod), {})
        containers.setdefault(entry.container, []).append(
            pb.ContainerDevices(resource_name=entry.resource, device_ids=entry.device_ids))
    return pb.ListPodResourcesResponse(pod_resources=[
        pb.PodResources(namespace=namespace, name=pod,
                        containers=[pb.ContainerResources(name=name, devices=devices)
                                    for name, devices in containers.items()])
        for (namespace, pod), containers in pods.items()])


def pod_resources_handler(list_fn: Callable[[], Awaitable[list[AssignedDevices]]]) -> grpc.GenericRpcHandler:
    """The kubelet's side of `List` (for a kubelet stand-in, e.g. a test's): answers with what `list_fn` returns."""
    _, request_cls, response_cls, _ = method_types(LISTER, "List", pb)

    async def list_pod_resources(request: pb.ListPodResourcesRequest,
                                 context: Context) -> pb.ListPodResourcesResponse:
        return _response(await list_fn())

    handler = grpc.unary_unary_rpc_method_handler(list_pod_resources, request_deserializer=request_cls.FromString,
                                                  response_serializer=response_cls.SerializeToString)
    return grpc.method_handlers_generic_handler(f"{pb.DESCRIPTOR.package}.{LISTER}", {"List": handler})
