"""Which GPUs another device plugin holds, from what the kubelet recorded (no I/O here)."""

from __future__ import annotations

import json

import pytest

from tfusion.api.accessors import Body
from tfusion.api.jsontypes import JsonMapping
from tfusion.hypervisor.external_plugins import (
    NVIDIA,
    NVIDIA_DEVICE_PLUGIN,
    THIRD_PARTY_DEVICE_PLUGIN,
    Detector,
    SourceError,
    checkpoint_allocations,
    held_gpus,
    provider_detectors,
)

UUID_A = "GPU-2f1c7a3e-5b7d-4c1e-9f0a-0123456789ab"
UUID_B = "GPU-8e0d4b2a-1c3f-4a5b-8d7e-fedcba987654"


def test_checkpoint_entries_of_both_kubelet_formats() -> None:
    newer = {"Data": {"PodDeviceEntries": [
        {"PodUID": "p1", "ContainerName": "c", "ResourceName": "nvidia.com/gpu",
         "DeviceIDs": {"0": [UUID_A], "1": [UUID_B]}, "AllocResp": "e30="},
        {"PodUID": "p2", "ContainerName": "c", "ResourceName": "tensor-fusion.ai/index_0",
         "DeviceIDs": {"-1": ["0-1"]}}],
        "RegisteredDevices": {"nvidia.com/gpu": [UUID_A, UUID_B]}}, "Checksum": 1}
    assert checkpoint_allocations(json.dumps(newer)) == [
        ("nvidia.com/gpu", [UUID_A, UUID_B]), ("tensor-fusion.ai/index_0", ["0-1"])]
    older = {"Data": {"PodDeviceEntries": [{"ResourceName": "nvidia.com/gpu", "DeviceIDs": [UUID_A]}]}}
    assert checkpoint_allocations(json.dumps(older)) == [("nvidia.com/gpu", [UUID_A])]
    assert checkpoint_allocations(json.dumps({"Data": {"PodDeviceEntries": None}})) == []


@pytest.mark.parametrize(("text", "says"), [
    ("{not json", "not JSON"),
    ('{"Data": {"PodDeviceEntries": {"a": 1}}}', "Data.PodDeviceEntries is a dict, not a list"),
])
def test_an_unreadable_checkpoint_says_why(text: str, says: str) -> None:
    with pytest.raises(SourceError, match=says):
        checkpoint_allocations(text)


def test_nvidia_resources_mark_their_gpus_lowercased_without_time_slices() -> None:
    held = held_gpus([("nvidia.com/gpu", [UUID_A + "::3"]), ("nvidia.com/mig-1g.10gb", [UUID_B])], [NVIDIA])
    assert held == {UUID_A.lower(): NVIDIA_DEVICE_PLUGIN, UUID_B.lower(): NVIDIA_DEVICE_PLUGIN}


def test_an_id_longer_than_a_uuid_is_a_third_party_plugins_share_of_that_gpu() -> None:
    assert held_gpus([("nvidia.com/gpu", [UUID_A + "-2"])], [NVIDIA]) == {UUID_A.lower(): THIRD_PARTY_DEVICE_PLUGIN}


def test_own_index_resources_and_unclaimed_resources_mark_nothing() -> None:
    everything = Detector(("",), "anything")  # would claim every resource name
    assert held_gpus([("tensor-fusion.ai/index_3", ["3-1"])], [everything]) == {}
    assert held_gpus([("example.com/fpga", [UUID_A])], [NVIDIA]) == {}


def test_provider_configs_add_detectors_in_name_order() -> None:
    configs: list[JsonMapping] = [
        {"metadata": {"name": "z"}, "spec": {"devicePluginDetection": {
            "resourceNamePrefixes": ["example.com/npu"], "usedBySystemName": "npu-plugin"}}},
        {"metadata": {"name": "a"}, "spec": {"devicePluginDetection": {"resourceNamePrefixes": ["example.com/npu",
                                                                                              "", 7]}}},
        {"metadata": {"name": "b"}, "spec": {"vendor": "NVIDIA"}},
    ]
    detectors = provider_detectors(map(Body, configs))
    assert detectors == [Detector(("example.com/npu",), THIRD_PARTY_DEVICE_PLUGIN),
                         Detector(("example.com/npu",), "npu-plugin")]
    held = held_gpus([("example.com/npu", ["NPU-1"]), ("nvidia.com/gpu", [UUID_A])], [NVIDIA, *detectors])
    assert held == {"npu-1": THIRD_PARTY_DEVICE_PLUGIN, UUID_A.lower(): NVIDIA_DEVICE_PLUGIN}
