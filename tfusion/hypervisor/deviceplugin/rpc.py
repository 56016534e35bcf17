"""The device-plugin gRPC services, bound by hand to the generated messages.

Why by hand: grpcio's generated `_pb2_grpc` modules are untyped. Here each method's path and message
types are read from the generated file's service descriptors (so they can only be what
proto/deviceplugin.proto says), and bound with grpcio's generic handlers and channel methods, which
mypy checks. Both sides live here: the plugin's server (`device_plugin_handler`), the kubelet's
Registration client (`RegistrationClient`), and — for a kubelet, like the tests' fake one — the
Registration server (`registration_handler`) and the plugin client (`DevicePluginClient`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from types import ModuleType
from typing import Any, Protocol

import grpc
import grpc.aio
from google.protobuf.descriptor import FileDescriptor
from google.protobuf.message import Message

from tfusion.hypervisor.deviceplugin import deviceplugin_pb2 as pb

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
PACKAGE = pb.DESCRIPTOR.package
DEVICE_PLUGIN = "DevicePlugin"
REGISTRATION = "Registration"

Context = grpc.aio.ServicerContext[Any, Any]


def _message_class(name: str, proto: ModuleType) -> type[Message]:
    cls: type[Message] = getattr(proto, name)
    return cls


def method_types(service: str, method: str,
                 proto: ModuleType = pb) -> tuple[str, type[Message], type[Message], bool]:
    """(path, request class, response class, server-streaming) of a method, from the descriptor of
    `proto`, a generated `_pb2` module (the device-plugin one unless told)."""
    file: FileDescriptor = proto.DESCRIPTOR
    descriptor = file.services_by_name[service].methods_by_name[method]
    return (f"/{file.package}.{service}/{method}", _message_class(descriptor.input_type.name, proto),
            _message_class(descriptor.output_type.name, proto), descriptor.server_streaming)


class DevicePluginServicer(Protocol):
    async def get_device_plugin_options(self, request: pb.Empty, context: Context) -> pb.DevicePluginOptions: ...

    def list_and_watch(self, request: pb.Empty, context: Context) -> AsyncIterator[pb.ListAndWatchResponse]: ...

    async def get_preferred_allocation(self, request: pb.PreferredAllocationRequest,
                                       context: Context) -> pb.PreferredAllocationResponse: ...

    async def allocate(self, request: pb.AllocateRequest, context: Context) -> pb.AllocateResponse: ...

    async def pre_start_container(self, request: pb.PreStartContainerRequest,
                                  context: Context) -> pb.PreStartContainerResponse: ...


def _handler(service: str, method: str, behaviour: Callable[..., Any]) -> grpc.RpcMethodHandler[Any, Any]:
    _, request_cls, response_cls, streaming = method_types(service, method)
    make = grpc.unary_stream_rpc_method_handler if streaming else grpc.unary_unary_rpc_method_handler
    return make(behaviour, request_deserializer=request_cls.FromString,
                response_serializer=response_cls.SerializeToString)


def device_plugin_handler(servicer: DevicePluginServicer) -> grpc.GenericRpcHandler:
    methods: dict[str, Callable[..., Any]] = {
               "GetDevicePluginOptions": servicer.get_device_plugin_options,
               "ListAndWatch": servicer.list_and_watch,
               "GetPreferredAllocation": servicer.get_preferred_allocation,
               "Allocate": servicer.allocate,
               "PreStartContainer": servicer.pre_start_container}
    return grpc.method_handlers_generic_handler(
        f"{PACKAGE}.{DEVICE_PLUGIN}", {name: _handler(DEVICE_PLUGIN, name, fn) for name, fn in methods.items()})


def registration_handler(register: Callable[[pb.RegisterRequest, Context], Awaitable[pb.Empty]],
                         ) -> grpc.GenericRpcHandler:
    """The kubelet's side of registration (for a kubelet written in Python, e.g. a test's)."""
    return grpc.method_handlers_generic_handler(
        f"{PACKAGE}.{REGISTRATION}", {"Register": _handler(REGISTRATION, "Register", register)})


def unix_target(path: str) -> str:
    return f"unix://{path}" if path.startswith("/") else f"unix:{path}"


class RegistrationClient:
    """Calls the kubelet's `Registration.Register` over its socket."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        path, request_cls, response_cls, _ = method_types(REGISTRATION, "Register")
        self._register = channel.unary_unary(path, request_serializer=request_cls.SerializeToString,
                                             response_deserializer=response_cls.FromString)

    async def register(self, request: pb.RegisterRequest, timeout: float) -> None:
        await self._register(request, timeout=timeout)


class DevicePluginClient:
    """A kubelet's calls into one plugin."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        def unary(method: str) -> Any:
            path, request_cls, response_cls, _ = method_types(DEVICE_PLUGIN, method)
            return channel.unary_unary(path, request_serializer=request_cls.SerializeToString,
                                       response_deserializer=response_cls.FromString)

        path, request_cls, response_cls, _ = method_types(DEVICE_PLUGIN, "ListAndWatch")
        self._list_and_watch = channel.unary_stream(path, request_serializer=request_cls.SerializeToString,
                                                    response_deserializer=response_cls.FromString)
        self._options = unary("GetDevicePluginOptions")
        self._allocate = unary("Allocate")
        self._preferred = unary("GetPreferredAllocation")
        self._pre_start = unary("PreStartContainer")

    async def list_and_watch(self) -> AsyncIterator[pb.ListAndWatchResponse]:
        """Each device list the plugin sends, until it ends the stream or the caller stops reading."""
        call = self._list_and_watch(pb.Empty())
        try:
            async for answer in call:
                assert isinstance(answer, pb.ListAndWatchResponse)
                yield answer
        finally:
            call.cancel()

    async def options(self, timeout: float = 10.0) -> pb.DevicePluginOptions:
        answer: pb.DevicePluginOptions = await self._options(pb.Empty(), timeout=timeout)
        return answer

    async def allocate(self, request: pb.AllocateRequest, timeout: float = 30.0) -> pb.AllocateResponse:
        answer: pb.AllocateResponse = await self._allocate(request, timeout=timeout)
        return answer

    async def preferred_allocation(self, request: pb.PreferredAllocationRequest,
                                   timeout: float = 10.0) -> pb.PreferredAllocationResponse:
        answer: pb.PreferredAllocationResponse = await self._preferred(request, timeout=timeout)
        return answer

    async def pre_start(self, request: pb.PreStartContainerRequest,
                        timeout: float = 10.0) -> pb.PreStartContainerResponse:
        answer: pb.PreStartContainerResponse = await self._pre_start(request, timeout=timeout)
        return answer
