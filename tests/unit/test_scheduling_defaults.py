"""default_pod_request: the pool, isolation and QoS the pod webhook gives a raw GPU pod."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tfusion.allocator import RequestError, request_from_pod
from tfusion.controller.scheduling.defaults import default_pod_request, default_pool_name, is_default_pool

P = "tensor-fusion.ai/"


def gpupool(name: str, default: str | None = None, qos: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if default is not None:
        meta["annotations"] = {P + "is-default-pool": default}
    spec: dict[str, Any] = {"qosConfig": {"defaultQoS": qos}} if qos else {}
    return {"apiVersion": "tensor-fusion.ai/v1", "kind": "GPUPool", "metadata": meta, "spec": spec}


def raw_pod(**notes: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "w", "namespace": "ml", "uid": "u1", "annotations": dict(notes)},
            "spec": {"schedulerName": "tensor-fusion-scheduler", "containers": [{"name": "c", "image": "x"}]}}


POOLS = [gpupool("a-pool"), gpupool("shared", default="true", qos="low"), gpupool("z", default="false")]


def notes_of(pod: dict[str, Any]) -> dict[str, str]:
    return dict(pod["metadata"]["annotations"])


def test_no_pool_annotation_gets_the_default_pool_and_its_qos() -> None:
    pod = raw_pod(**{P + "tflops-request": "10", P + "vram-request": "1Gi"})
    original = copy.deepcopy(pod)
    defaulted = default_pod_request(pod, POOLS)
    assert pod == original  # the input is not modified
    assert notes_of(defaulted) == {P + "tflops-request": "10", P + "vram-request": "1Gi", P + "gpupool": "shared",
                                   P + "isolation": "soft", P + "qos": "low"}
    req = request_from_pod(defaulted)
    assert (req.pool, req.isolation, req.qos) == ("shared", "soft", "low")
    assert defaulted["spec"] == pod["spec"]


def test_what_the_pod_says_is_kept() -> None:
    pod = raw_pod(**{P + "gpupool": "a-pool", P + "isolation": "hard", P + "qos": "critical",
                     P + "tflops-request": "10"})
    assert notes_of(default_pod_request(pod, POOLS)) == notes_of(pod)


@pytest.mark.parametrize(("notes", "qos"), [
    ({P + "tflops-request": "10", P + "tflops-limit": "10", P + "vram-request": "1Gi", P + "vram-limit": "1Gi"},
     "high"),
    ({P + "tflops-limit": "10", P + "vram-limit": "1Gi"}, "high"),  # a missing request is its limit
    ({P + "tflops-request": "10", P + "vram-request": "1Gi"}, "medium"),  # no limits: not equal
    ({P + "tflops-request": "10", P + "tflops-limit": "20", P + "vram-request": "1Gi", P + "vram-limit": "1Gi"},
     "medium"),
    ({P + "compute-percent-limit": "50", P + "vram-limit": "1Gi"}, "medium"),  # no TFLOPS limit: zero
    ({}, "medium"),
])
def test_qos_default(notes: dict[str, str], qos: str) -> None:
    pod = raw_pod(**{P + "gpupool": "a-pool", **notes})  # a-pool has no qosConfig
    assert notes_of(default_pod_request(pod, POOLS))[P + "qos"] == qos


def test_equal_limits_win_over_the_pool_default_qos() -> None:
    pod = raw_pod(**{P + "tflops-limit": "10", P + "vram-limit": "1Gi"})
    assert notes_of(default_pod_request(pod, POOLS))[P + "qos"] == "high"


def test_no_default_pool_is_an_error_naming_the_annotations() -> None:
    with pytest.raises(RequestError) as info:
        default_pod_request(raw_pod(), [gpupool("a-pool"), gpupool("z", default="false")])
    message = str(info.value)
    assert info.value.key == P + "gpupool"
    assert P + "gpupool" in message and P + "is-default-pool" in message


def test_default_pool_choice() -> None:
    assert default_pool_name([gpupool("b", default="true"), gpupool("a", default="True")]) == "a"
    assert default_pool_name([gpupool("b", default="yes"), gpupool("c")]) is None
    assert is_default_pool(gpupool("x", default="1")) and not is_default_pool(gpupool("x", default="0"))
    assert default_pool_name([]) is None


def test_bad_resource_annotation_is_a_request_error() -> None:
    with pytest.raises(RequestError, match=P + "tflops-limit"):
        default_pod_request(raw_pod(**{P + "tflops-limit": "lots"}), POOLS)
