"""The device-plugin messages: generated from our proto/deviceplugin.proto (and current with it), with
the published method paths and field numbers on the wire."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from tfusion.hypervisor.deviceplugin import deviceplugin_pb2 as pb
from tfusion.hypervisor.deviceplugin.rpc import method_types

ROOT = Path(__file__).resolve().parents[2]


def test_committed_stubs_are_what_the_proto_generates() -> None:
    if importlib.util.find_spec("grpc_tools") is None:
        pytest.skip("grpcio-tools (a dev dependency) is not installed")
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import gen_deviceplugin_stubs
    finally:
        sys.path.remove(str(ROOT / "tools"))
    assert gen_deviceplugin_stubs.stale() == []


def test_method_paths_come_from_the_proto() -> None:
    assert method_types("Registration", "Register")[:3] == ("/v1beta1.Registration/Register", pb.RegisterRequest,
                                                            pb.Empty)
    path, request, response, streaming = method_types("DevicePlugin", "ListAndWatch")
    assert (path, request, response, streaming) == ("/v1beta1.DevicePlugin/ListAndWatch", pb.Empty,
                                                    pb.ListAndWatchResponse, True)
    assert method_types("DevicePlugin", "Allocate")[0] == "/v1beta1.DevicePlugin/Allocate"


def test_field_numbers_on_the_wire() -> None:
    register = pb.RegisterRequest(version="v1beta1", endpoint="e.sock", resource_name="r",
                                  options=pb.DevicePluginOptions(get_preferred_allocation_available=True))
    assert register.SerializeToString() == (b"\x0a\x07v1beta1" b"\x12\x06e.sock" b"\x1a\x01r" b"\x22\x02\x10\x01")
    device = pb.Device(ID="0-1", health="Healthy", topology=pb.TopologyInfo(nodes=[pb.NUMANode(ID=1)]))
    assert device.SerializeToString() == b"\x0a\x030-1\x12\x07Healthy\x1a\x04\x0a\x02\x08\x01"
    answer = pb.ContainerAllocateResponse(envs={"A": "1"}, mounts=[pb.Mount(container_path="/c", read_only=True)],
                                          devices=[pb.DeviceSpec(permissions="rwm")], annotations={"k": "v"},
                                          cdi_devices=[pb.CDIDevice(name="n")])
    assert answer.SerializeToString() == (b"\x0a\x06\x0a\x01A\x12\x011" b"\x12\x06\x0a\x02/c\x18\x01"
                                          b"\x1a\x05\x1a\x03rwm" b"\x22\x06\x0a\x01k\x12\x01v" b"\x2a\x03\x0a\x01n")
    preferred = pb.ContainerPreferredAllocationRequest(available_deviceIDs=["a"], must_include_deviceIDs=["b"],
                                                       allocation_size=2)
    assert preferred.SerializeToString() == b"\x0a\x01a\x12\x01b\x18\x02"
