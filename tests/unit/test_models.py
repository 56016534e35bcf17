"""The tensor-fusion.ai/v1 models: decoding, defaults, errors that name the field, encoding."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest

from tfusion.api import types
from tfusion.api.quantity import Quantity
from tfusion.api.types import (
    GPU,
    KINDS,
    GPUPool,
    GPUStatus,
    ManifestError,
    ObjectMeta,
    Resource,
    TensorFusionCluster,
    TensorFusionWorkload,
    decode,
    decode_as,
    encode,
    to_json,
)


def manifest(kind: str, spec: Any = None, **extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"apiVersion": "tensor-fusion.ai/v1", "kind": kind, "metadata": {"name": "x"}}
    if spec is not None:
        doc["spec"] = spec
    doc.update(extra)
    return doc


def pool_manifest(**node_manager: Any) -> dict[str, Any]:
    return manifest("GPUPool", {"nodeManagerConfig": node_manager})


def error_of(doc: dict[str, Any]) -> ManifestError:
    with pytest.raises(ManifestError) as info:
        decode(doc)
    return info.value


# --- registry ------------------------------------------------------------------------------------


def test_registry_has_the_twelve_kinds_with_their_scope() -> None:
    assert list(KINDS) == [
        "TensorFusionCluster", "GPUPool", "GPUNode", "GPU", "GPUNodeClass", "GPUNodeClaim",
        "SchedulingConfigTemplate", "GPUResourceQuota", "ProviderConfig", "TensorFusionWorkload",
        "WorkloadProfile", "TensorFusionConnection"]
    namespaced = {k for k, info in KINDS.items() if info.namespaced}
    assert namespaced == {"GPUResourceQuota", "TensorFusionWorkload", "WorkloadProfile", "TensorFusionConnection"}
    assert all(kind == info.model.KIND for kind, info in KINDS.items())
    assert {k for k, info in KINDS.items() if not info.has_status} == {"ProviderConfig"}
    assert KINDS["GPUPool"].singular == "gpupool" and KINDS["GPUPool"].plural == "gpupools"
    assert KINDS["GPUNode"].short_names == ("gn",)


# --- decoding ------------------------------------------------------------------------------------


def test_decode_picks_the_model_by_kind_and_fills_defaults() -> None:
    pool = decode(pool_manifest())
    assert isinstance(pool, GPUPool)
    assert pool.spec is not None
    nmc = pool.spec.node_manager_config
    assert nmc.provisioning_mode == "AutoSelect"
    assert nmc.default_isolation_mode == "soft"
    assert nmc.default_vendor == "NVIDIA"
    assert pool.spec.capacity_config is None  # absent objects stay absent


def test_nested_defaults_apply_only_inside_present_objects() -> None:
    doc = manifest("GPUPool", {"nodeManagerConfig": {}, "capacityConfig": {"oversubscription": {}}})
    pool = decode(doc)
    assert isinstance(pool, GPUPool) and pool.spec is not None and pool.spec.capacity_config is not None
    over = pool.spec.capacity_config.oversubscription
    assert over is not None
    assert (over.vram_expand_to_host_mem, over.vram_expand_to_host_disk, over.tflops_oversell_ratio) == (50, 70, 500)


def test_quantities_become_quantity_objects() -> None:
    doc = manifest("GPUNodeClaim", {"tflopsOffered": 70, "vramOffered": "24576Mi", "gpuDeviceOffered": 1})
    claim = decode(doc)
    assert isinstance(claim, types.GPUNodeClaim) and claim.spec is not None
    assert claim.spec.tflops_offered == Quantity.parse("70")
    assert str(claim.spec.vram_offered) == "24Gi"


def test_nulls_are_treated_like_absent_fields() -> None:
    doc = manifest("GPUNode")
    doc["spec"] = None
    node = decode(doc)
    assert isinstance(node, types.GPUNode)
    assert node.spec.manage_mode == "AutoSelect"
    doc = manifest("GPUPool", {"nodeManagerConfig": {"provisioningMode": None, "nodeSelector": None}})
    pool = decode(doc)
    assert isinstance(pool, GPUPool) and pool.spec is not None
    assert pool.spec.node_manager_config.provisioning_mode == "AutoSelect"


def test_decode_does_not_change_its_input() -> None:
    doc = pool_manifest(provisioningMode=None)
    decode(doc)
    assert doc["spec"]["nodeManagerConfig"] == {"provisioningMode": None}


def test_timestamps_decode_to_aware_datetimes() -> None:
    doc = manifest("GPU", None, status={
        "capacity": {"tflops": "1", "vram": "1Gi"}, "available": {"tflops": "1", "vram": "1Gi"}, "uuid": "u",
        "nodeSelector": {}, "gpuModel": "A100", "message": "", "allocatedPartitions": {
            "pod-1": {"templateId": "t", "podUid": "pod-1", "podName": "p", "namespace": "n",
                      "allocatedAt": "2025-01-02T03:04:05Z"}}})
    doc["metadata"]["creationTimestamp"] = "2025-01-01T00:00:00Z"
    gpu = decode(doc)
    assert isinstance(gpu, GPU) and gpu.status is not None
    assert gpu.metadata.creation_timestamp == datetime(2025, 1, 1, tzinfo=UTC)
    assert gpu.status.allocated_partitions["pod-1"].allocated_at == datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


def test_decode_as_uses_the_given_model() -> None:
    cluster = decode_as(TensorFusionCluster, {"spec": {"gpuPools": [
        {"name": "shared", "specTemplate": {"nodeManagerConfig": {}}}]}})
    assert cluster.spec.gpu_pools[0].name == "shared"
    assert cluster.spec.gpu_pools[0].is_default is False


# --- errors name the field -----------------------------------------------------------------------


def test_wrong_enum_names_the_path_and_the_allowed_values() -> None:
    error = error_of(pool_manifest(provisioningMode="Manual"))
    assert error.field == "spec.nodeManagerConfig.provisioningMode"
    assert error.reason == "FieldValueNotSupported"
    assert error.message == 'Unsupported value: "Manual": supported values: "Provisioned", "AutoSelect", "Karpenter"'
    assert str(error).startswith('GPUPool "x": spec.nodeManagerConfig.provisioningMode: Unsupported value')


def test_wrong_type_in_a_list_item_names_the_index() -> None:
    doc = manifest("TensorFusionCluster", {"gpuPools": [
        {"name": "a", "specTemplate": {"nodeManagerConfig": {}}},
        {"name": 7, "specTemplate": {"nodeManagerConfig": {}}}]})
    error = error_of(doc)
    assert error.field == "spec.gpuPools[1].name"
    assert error.reason == "FieldValueTypeInvalid"
    assert error.message == 'Invalid value: "integer": spec.gpuPools[1].name in body must be of type string: "integer"'


def test_errors_in_maps_name_the_key() -> None:
    error = error_of(pool_manifest(multiVendorNodeSelector={"AMD": {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "gpu", "operator": 1}]}]}}))
    assert error.field == ("spec.nodeManagerConfig.multiVendorNodeSelector.AMD"
                           ".nodeSelectorTerms[0].matchExpressions[0].operator")


def test_all_errors_are_kept() -> None:
    error = error_of(manifest("TensorFusionWorkload", {"gpuCount": 0, "qos": "urgent"}))
    assert {e.field for e in error.errors} == {"spec.gpuCount", "spec.qos"}


def test_missing_required_field_is_named() -> None:
    error = error_of(manifest("GPUPool", {}))
    assert (error.field, error.reason, error.message) == ("spec.nodeManagerConfig", "FieldValueRequired",
                                                          "Required value")
    error = error_of(manifest("TensorFusionConnection", {"workloadName": "w"}))
    assert error.field == "spec.clientPod"


def test_bad_quantities_are_named_with_the_value() -> None:
    doc = manifest("GPUResourceQuota", {"total": {"requests": {"tflops": "lots", "vram": "1Gi"}}})
    error = error_of(doc)
    assert error.field == "spec.total.requests.tflops"
    assert '"lots"' in error.message
    doc = manifest("GPUResourceQuota", {"total": {"requests": {"tflops": 1.5, "vram": "1Gi"}}})
    error = error_of(doc)
    assert error.field == "spec.total.requests.tflops"
    assert error.reason == "FieldValueTypeInvalid"
    assert "must be of type integer,string" in error.message


def test_bounds_are_enforced() -> None:
    error = error_of(manifest("TensorFusionWorkload", {"gpuCount": 129}))
    assert error.field == "spec.gpuCount"
    assert error.message == "Invalid value: 129: spec.gpuCount in body should be less than or equal to 128"
    error = error_of(pool_manifest(nodePoolRollingUpdatePolicy={"batchPercentage": 101}))
    assert error.field == "spec.nodeManagerConfig.nodePoolRollingUpdatePolicy.batchPercentage"


def test_gang_rules() -> None:
    error = error_of(manifest("TensorFusionWorkload", {"gangScheduling": {"minMembers": 1}}))
    assert error.field == "spec.gangScheduling"
    assert "at least 2" in error.message
    error = error_of(manifest("TensorFusionWorkload", {"replicas": 2, "gangScheduling": {"minMembers": 3}}))
    assert error.field == "spec"
    assert "must not exceed replicas" in error.message
    workload = decode(manifest("TensorFusionWorkload", {"replicas": 4, "gangScheduling": {"minMembers": 2}}))
    assert isinstance(workload, TensorFusionWorkload) and workload.spec.gang_scheduling is not None
    assert workload.spec.gang_scheduling.mode == "Strict"


def test_unknown_kind_and_api_version_are_rejected() -> None:
    error = error_of({"apiVersion": "tensor-fusion.ai/v1", "kind": "GPUFarm"})
    assert error.field == "kind" and '"GPUFarm"' in error.message and '"GPUPool"' in error.message
    error = error_of({"apiVersion": "v1", "kind": "Pod"})
    assert error.field == "apiVersion"
    with pytest.raises(ManifestError):
        decode([])  # type: ignore[arg-type]


def test_manifest_error_is_a_value_error() -> None:
    assert issubclass(ManifestError, ValueError)


# --- encoding ------------------------------------------------------------------------------------


def test_encode_is_camel_case_canonical_and_omits_zero_values() -> None:
    gpu = GPU(metadata=ObjectMeta(name="gpu-1", labels={"a": "b"}), status=GPUStatus(
        capacity=Resource(tflops=Quantity.parse("312"), vram=Quantity.parse("81920Mi")),
        available=Resource(tflops=Quantity.parse("0.5"), vram=Quantity.parse(0)),
        uuid="GPU-1", node_selector={"kubernetes.io/hostname": "n1"}, gpu_model="A100", message="ok",
        numa_node=-1, index=0))
    assert encode(gpu) == {
        "apiVersion": "tensor-fusion.ai/v1", "kind": "GPU",
        "metadata": {"name": "gpu-1", "labels": {"a": "b"}},
        "status": {
            "capacity": {"tflops": "312", "vram": "80Gi"},
            "available": {"tflops": "500m", "vram": "0"},
            "uuid": "GPU-1", "nodeSelector": {"kubernetes.io/hostname": "n1"}, "gpuModel": "A100", "message": "ok",
            "index": 0, "numaNode": -1,
        },
    }
    assert msgspec.json.decode(to_json(gpu)) == encode(gpu)


def test_api_version_and_kind_survive_plain_msgspec_encoding() -> None:
    body = msgspec.json.decode(msgspec.json.encode(TensorFusionWorkload(), enc_hook=types.enc_hook))
    assert body["apiVersion"] == "tensor-fusion.ai/v1"
    assert body["kind"] == "TensorFusionWorkload"


def test_decode_encode_decode_is_stable() -> None:
    doc = manifest("TensorFusionWorkload", {
        "replicas": 2, "qos": "high", "resources": {"requests": {"tflops": "20", "vram": "8Gi"},
                                                     "limits": {"tflops": 40, "vram": "8192Mi"}},
        "workerPodTemplate": {"spec": {"containers": [{"name": "w", "image": None}]}}})
    first = decode(doc)
    again = decode(encode(first))
    assert again == first
    encoded: Any = encode(again)
    assert encoded["spec"]["workerPodTemplate"] == {"spec": {"containers": [{"name": "w", "image": None}]}}
