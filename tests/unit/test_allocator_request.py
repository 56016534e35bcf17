"""request_from_pod: the one parser of a pod's GPU annotations."""

from __future__ import annotations

from typing import Any

import pytest

from tfusion.allocator import RequestError, request_from_pod
from tfusion.api.accessors import Pod

GIB = 1 << 30
P = "tensor-fusion.ai/"


def pod(notes: dict[str, str], labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "train-0", "namespace": "ml", "uid": "u-1",
                         "annotations": {P + "gpupool": "pool-a", **notes}, "labels": labels or {}}}


def test_defaults_and_units() -> None:
    r = request_from_pod(Pod(pod({P + "tflops-request": "20", P + "vram-limit": "8Gi"})))
    assert (r.pod_uid, r.pod_name, r.namespace, r.pool) == ("u-1", "train-0", "ml", "pool-a")
    assert (r.tflops_request, r.tflops_limit) == (20_000, 0)  # no limit given: none (0), not the request
    assert (r.vram_request, r.vram_limit) == (8 * GIB, 8 * GIB)  # request defaults to limit
    assert (r.count, r.qos, r.isolation, r.workload) == (1, "medium", "soft", ("ml", "train-0"))


def test_requests_without_limits_are_unlimited() -> None:
    r = request_from_pod(Pod(pod({P + "tflops-request": "20", P + "vram-request": "8Gi"})))
    assert (r.tflops_request, r.vram_request) == (20_000, 8 * GIB)
    assert (r.tflops_limit, r.vram_limit, r.limit.tflops, r.limit.vram) == (0, 0, 0, 0)
    percent = request_from_pod(Pod(pod({P + "compute-percent-request": "30"})))
    assert (percent.percent_request, percent.percent_limit) == (30_000, 0)
    only_limits = request_from_pod(Pod(pod({P + "compute-percent-limit": "40", P + "vram-limit": "2Gi"})))
    assert (only_limits.percent_request, only_limits.percent_limit) == (40_000, 40_000)
    assert (only_limits.vram_request, only_limits.vram_limit) == (2 * GIB, 2 * GIB)


def test_all_fields() -> None:
    r = request_from_pod(Pod(pod({
        P + "tflops-request": "10", P + "tflops-limit": "500m", P + "vram-request": "1Gi",
        P + "vram-limit": "2Gi", P + "gpu-count": "4", P + "gpu-model": "H100", P + "vendor": "NVIDIA",
        P + "qos": "high", P + "isolation": "shared", P + "gpu-ids": "gpu-a,gpu-b"},
        labels={P + "workload": "trainer"})))
    assert (r.tflops_request, r.tflops_limit, r.count, r.gpu_model, r.vendor) == (10_000, 500, 4, "H100", "NVIDIA")
    assert (r.qos, r.isolation, r.gpu_names, r.workload) == ("high", "shared", ("gpu-a", "gpu-b"), ("ml", "trainer"))


def test_indices_set_the_count() -> None:
    r = request_from_pod(Pod(pod({P + "gpu-indices": "0,2,3", P + "gpu-count": "1"})))
    assert (r.indices, r.count) == ((0, 2, 3), 3)


def test_compute_percent_and_tflops_wins() -> None:
    r = request_from_pod(Pod(pod({P + "compute-percent-request": "12.5"})))
    assert (r.percent_request, r.percent_limit, r.tflops_request) == (12_500, 0, 0)  # no limit: none
    r = request_from_pod(Pod(pod({P + "compute-percent-limit": "50", P + "tflops-request": "10"})))
    assert (r.tflops_request, r.percent_request, r.percent_limit) == (10_000, 0, 0)


@pytest.mark.parametrize(("notes", "key", "fragment"), [
    ({P + "gpu-count": "0"}, P + "gpu-count", "1 to 128"),
    ({P + "gpu-count": "129"}, P + "gpu-count", "1 to 128"),
    ({P + "gpu-count": "two"}, P + "gpu-count", "1 to 128"),
    ({P + "qos": "urgent"}, P + "qos", "low|medium|high|critical"),
    ({P + "isolation": "strict"}, P + "isolation", "shared|soft|hard|partitioned"),
    ({P + "tflops-request": "lots"}, P + "tflops-request", '"lots"'),
    ({P + "vram-limit": "-1Gi"}, P + "vram-limit", "negative"),
    ({P + "compute-percent-request": "150"}, P + "compute-percent-request", "0 to 100"),
    ({P + "tflops-request": "10", P + "compute-percent-request": "10"}, P + "compute-percent-request",
     "not both"),
    ({P + "gpu-indices": "0,x"}, P + "gpu-indices", "'x' is not an index"),
])
def test_errors_name_annotation_value_and_allowed(notes: dict[str, str], key: str, fragment: str) -> None:
    with pytest.raises(RequestError) as info:
        request_from_pod(Pod(pod(notes)))
    err = info.value
    assert isinstance(err, ValueError)
    assert err.key == key and err.value == notes[key]
    assert key in str(err) and fragment in str(err) and err.allowed


def test_pool_required_unless_defaulted() -> None:
    bare: dict[str, Any] = {"metadata": {"name": "x", "namespace": "ns", "annotations": {}}}
    with pytest.raises(RequestError, match="gpupool"):
        request_from_pod(Pod(bare))
    assert request_from_pod(Pod(bare), default_pool="fallback").pool == "fallback"


def test_topology_overrides_are_kept_as_given_and_absent_ones_stay_unset() -> None:
    r = request_from_pod(Pod(pod({P + "gpu-count": "2", P + "require-gpu-topology": "true",
                                  P + "gpu-topology-max-tier": "0", P + "gpu-topology-source": "numa"})))
    assert (r.topology_required, r.topology_max_tier, r.topology_source) == (True, 0, "numa")
    bare = request_from_pod(Pod(pod({P + "gpu-count": "2"})))
    assert (bare.topology_required, bare.topology_max_tier, bare.topology_source) == (None, None, "")
    soft = request_from_pod(Pod(pod({P + "require-gpu-topology": "false"})))
    assert soft.topology_required is False


@pytest.mark.parametrize(("key", "value", "allowed"), [
    ("require-gpu-topology", "maybe", '"true" or "false"'),
    ("gpu-topology-max-tier", "-1", "an integer from 0 to 3"),
    ("gpu-topology-max-tier", "nvlink", "an integer from 0 to 3"),
    ("gpu-topology-source", "pci", "auto|numa|vendor"),
])
def test_a_bad_topology_annotation_names_itself_its_value_and_what_is_allowed(key: str, value: str,
                                                                               allowed: str) -> None:
    with pytest.raises(RequestError) as info:
        request_from_pod(Pod(pod({P + key: value})))
    assert (info.value.key, info.value.value) == (P + key, value)
    assert allowed in str(info.value)
