"""The pure parts of applying a share (tfusion/controller/autoscaler/resize.py and external.py): the
annotations a share is written as read back as the same share, the VRAM floor, refused shares, and
the external scaler's answer and Secret rules."""

from __future__ import annotations

import base64

import pytest

from tfusion.allocator.request import Resources, request_from_pod
from tfusion.api import annotations as tfa
from tfusion.api.accessors import Pod, Workload
from tfusion.controller.autoscaler.external import ExternalScalerError, api_key, parse_answer, request_body
from tfusion.controller.autoscaler.resize import check_readable, check_share, floored, share_annotations, share_text

GI = 1 << 30


def pod_with(notes: dict[str, str | None]) -> Pod:
    base = {tfa.GPU_POOL: "pool-a", tfa.TFLOPS_REQUEST: "40", tfa.TFLOPS_LIMIT: "80",
            tfa.COMPUTE_PERCENT_REQUEST: "7", tfa.VRAM_REQUEST: "8Gi", tfa.VRAM_LIMIT: "16Gi"}
    merged = {k: v for k, v in {**base, **notes}.items() if v is not None}  # a merge patch's effect
    return Pod({"metadata": {"name": "w", "namespace": "default", "uid": "u1", "annotations": merged}})


@pytest.mark.parametrize(("request_", "limit"), [
    (Resources(tflops=10_500, vram=2 * GI), Resources(tflops=20_000, vram=4 * GI)),
    (Resources(percent=25_000, vram=GI), Resources(percent=50_000, vram=3 * GI)),
    (Resources(tflops=1, vram=512 << 20), Resources()),  # no limit
    (Resources(percent=1_500, vram=GI), Resources(vram=2 * GI)),
])
def test_share_annotations_read_back_as_the_share(request_: Resources, limit: Resources) -> None:
    req = request_from_pod(pod_with(share_annotations(request_, limit)))
    assert Resources(req.tflops_request, req.percent_request, req.vram_request) == request_
    assert Resources(req.tflops_limit, req.percent_limit, req.vram_limit) == limit


def test_vram_is_floored_at_use_and_no_limit_stays_none() -> None:
    assert floored(Resources(tflops=1, vram=GI), Resources(tflops=2, vram=2 * GI), 3 * GI) == \
        (Resources(tflops=1, vram=3 * GI), Resources(tflops=2, vram=3 * GI))
    assert floored(Resources(vram=4 * GI), Resources(), 3 * GI) == (Resources(vram=4 * GI), Resources())
    assert share_text(Resources(percent=50_000, vram=GI), Resources(tflops=2500, vram=GI)) == \
        "request 50%/1Gi, limit 2500m TFLOPS/1Gi"


@pytest.mark.parametrize(("request_", "limit", "use", "message"), [
    (Resources(tflops=-1), Resources(), 0, "request.tflops: -1 is negative"),
    (Resources(), Resources(), -5, "vram_in_use: -5 is negative"),
    (Resources(tflops=1, percent=1), Resources(), 0, "both given"),
    (Resources(), Resources(tflops=1, percent=1), 0, "limit: TFLOPS 1m and compute percent 1 both given"),
])
def test_shares_that_cannot_be_meant_are_refused(request_: Resources, limit: Resources, use: int,
                                                 message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_share(request_, limit, use)


@pytest.mark.parametrize(("request_", "limit", "message"), [
    (Resources(tflops=3, vram=1), Resources(tflops=2), "request.tflops: 3 is above limit.tflops 2"),
    (Resources(tflops=1, vram=3), Resources(vram=2), "request.vram: 3 is above limit.vram 2"),
    (Resources(tflops=1, vram=1), Resources(percent=5), "different forms"),
    (Resources(vram=1), Resources(tflops=5), "no compute with a compute limit"),
    (Resources(tflops=1), Resources(vram=5), "request.vram: 0 with a VRAM limit"),
])
def test_shares_whose_annotations_would_read_back_otherwise_are_refused(request_: Resources, limit: Resources,
                                                                        message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_readable(request_, limit)


def test_external_request_body_and_answers() -> None:
    body = request_body(Workload({"metadata": {"name": "llm", "namespace": "ns"}}),
                        Resources(tflops=40_000, vram=8 * GI), Resources(percent=50_000, vram=8 * GI))
    assert body == {"workloadName": "llm", "namespace": "ns", "currentResources": {
        "requests": {"tflops": "40", "vram": "8Gi"}, "limits": {"tflops": "0", "compute": "50", "vram": "8Gi"}}}
    assert parse_answer({"needScaleUp": False}) is None
    assert parse_answer({"needScaleDown": True}) is None  # nothing recommended
    assert parse_answer({"needScaleUp": True, "recommendedResources": {
        "requests": {"tflops": "1500m", "vram": "1Gi"}, "limits": {"compute": "20", "vram": "2Gi"}}}) == \
        (Resources(tflops=1500, vram=GI), Resources(percent=20_000, vram=2 * GI))


@pytest.mark.parametrize(("answer", "message"), [
    ([], "the answer is list, not a JSON object"),
    ({"needScaleUp": "yes"}, "needScaleUp: 'yes' is not a boolean"),
    ({"needScaleUp": True, "recommendedResources": {"limits": {}}}, "recommendedResources.requests: missing"),
    ({"needScaleUp": True, "recommendedResources": {"requests": {"vram": "-1Gi"}}},
     'recommendedResources.requests.vram: "-1Gi" is negative'),
    ({"needScaleUp": True, "recommendedResources": {"requests": {"compute": "150"}}},
     'recommendedResources.requests.compute: "150" is out of range'),
    ({"needScaleUp": True, "recommendedResources": {"requests": {"tflops": True}}},
     "recommendedResources.requests.tflops: True is not a quantity"),
])
def test_bad_answers_name_the_field(answer: object, message: str) -> None:
    with pytest.raises(ExternalScalerError, match=message):
        parse_answer(answer)


def secret(**data: str) -> dict[str, object]:
    return {"data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}


def test_api_key_field_order_and_problems() -> None:
    assert api_key(secret(key="k", token="t", apiKey="a"), "ns/s") == "a"
    assert api_key(secret(key="k", token="t"), "ns/s") == "t"
    assert api_key(secret(password="p\n"), "ns/s") == "p"
    with pytest.raises(ExternalScalerError, match="Secret ns/s holds no data"):
        api_key({}, "ns/s")
    with pytest.raises(ExternalScalerError, match="key apiKey: empty"):
        api_key(secret(apiKey=""), "ns/s")
    with pytest.raises(ExternalScalerError, match="key apiKey: not base64"):
        api_key({"data": {"apiKey": "***"}}, "ns/s")
