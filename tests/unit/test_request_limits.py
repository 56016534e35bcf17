"""A request above its limit is refused, by one check that the webhook and simulate-schedule share.

Kubernetes refuses `requests > limits` for CPU and memory; the original admits a pod with
`tflops-request: "5000"` and `tflops-limit: "40"`, which then waits forever. One table of
annotations goes to the webhook's `analyse` and to `simulate_schedule`: both refuse the same pods
with the same words, and both take the rest.
"""

from __future__ import annotations

from typing import Any

import pytest

from tfusion.allocator import GpuAllocator, GpuInfo
from tfusion.allocator.request import RequestOverLimit, check_pod_within_limits, request_from_pod
from tfusion.api import annotations as tfa
from tfusion.api.accessors import Pod
from tfusion.controller.defaults import Sources
from tfusion.controller.scheduling.simulate import simulate_schedule
from tfusion.controller.webhook.mutate import Context, Denial, Owner, analyse

POOL = "pool-a"
GIB = 1 << 30
POOLS: list[dict[str, Any]] = [{"metadata": {"name": POOL, "annotations": {tfa.IS_DEFAULT_POOL: "true"}},
          "spec": {"nodeManagerConfig": {"defaultVendor": "NVIDIA"}}}]
PROVIDER: dict[str, Any] = {"metadata": {"name": "nvidia"},
                            "spec": {"vendor": "NVIDIA", "inUseResourceNames": ["nvidia.com/gpu"]}}
OVER = "; a request may not exceed its limit"
T_REQ, T_LIM = tfa.TFLOPS_REQUEST, tfa.TFLOPS_LIMIT
V_REQ, V_LIM = tfa.VRAM_REQUEST, tfa.VRAM_LIMIT
P_REQ, P_LIM = tfa.COMPUTE_PERCENT_REQUEST, tfa.COMPUTE_PERCENT_LIMIT

#: the pod's annotations, and the message both callers refuse it with (None: both accept it)
TABLE: list[tuple[dict[str, str], str | None]] = [
    ({T_REQ: "5000", T_LIM: "40", V_REQ: "8Gi"}, f'{T_REQ} "5000" is greater than {T_LIM} "40"{OVER}'),
    ({T_REQ: "20", V_REQ: "10Gi", V_LIM: "8Gi"}, f'{V_REQ} "10Gi" is greater than {V_LIM} "8Gi"{OVER}'),
    ({P_REQ: "80", P_LIM: "50", V_REQ: "8Gi"}, f'{P_REQ} "80" is greater than {P_LIM} "50"{OVER}'),
    ({T_REQ: "40001m", T_LIM: "40", V_REQ: "1Gi"}, f'{T_REQ} "40001m" is greater than {T_LIM} "40"{OVER}'),
    ({T_REQ: "40", T_LIM: "40", V_REQ: "8Gi", V_LIM: "8Gi"}, None),
    ({T_REQ: "40", T_LIM: "40000m", V_REQ: "8192Mi", V_LIM: "8Gi"}, None),
    ({T_REQ: "20", T_LIM: "40", V_REQ: "4Gi", V_LIM: "8Gi"}, None),
    ({T_REQ: "5000", V_REQ: "8Gi"}, None),  # no limit: nothing to exceed
    ({T_LIM: "40", V_LIM: "8Gi"}, None),  # the request is its limit
    ({T_REQ: "20", T_LIM: "0", V_REQ: "8Gi"}, None),  # a zero limit is no limit
    ({T_REQ: "20", P_LIM: "10", V_REQ: "8Gi"}, None),  # TFLOPS against a percent: TFLOPS wins
    ({P_REQ: "80", T_LIM: "40", V_REQ: "8Gi"}, None),  # a percent against TFLOPS: TFLOPS wins
    # TFLOPS and a percent on one side: the percent is dropped (the original's rule), not refused
    ({P_REQ: "80", P_LIM: "50", T_LIM: "40", V_REQ: "8Gi"}, None),
]


def _pod(notes: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "uid": "uid-p", "labels": {tfa.ENABLED: "true"},
                         "annotations": dict(notes)},
            "spec": {"schedulerName": "tensor-fusion-scheduler", "containers": [{"name": "app", "image": "x"}]}}


def _allocator() -> GpuAllocator:
    allocator = GpuAllocator()
    allocator.upsert_gpu(GpuInfo(name="gpu-0", node="node-a", pool=POOL, model="H100", index=0,
                                 capacity_tflops=100_000, capacity_vram=16 * GIB))
    return allocator


def _webhook(notes: dict[str, str], **context: Any) -> str | None:
    """The webhook's denial message for a pod with `notes`, None when it admits it."""
    try:
        analyse(Pod(_pod(notes)), Context(pools=POOLS, provider_configs=[PROVIDER], **context),
                Owner(workload_name="p"))
    except Denial as denial:
        assert denial.code == 400
        return denial.message
    return None


def _simulate(notes: dict[str, str]) -> str | None:
    """simulate-schedule's 400 error for the same pod, None when it judges the pod (200)."""
    status, body = simulate_schedule(_allocator(), _pod(notes), sources=Sources(pools=POOLS))
    assert status in (200, 400), body
    return str(body["error"]) if status == 400 else None


@pytest.mark.parametrize(("notes", "refusal"), TABLE)
def test_the_webhook_and_simulate_schedule_agree(notes: dict[str, str], refusal: str | None) -> None:
    assert _webhook(notes) == refusal
    assert _simulate(notes) == refusal


@pytest.mark.parametrize(("notes", "refusal"), TABLE)
def test_the_check_names_both_annotations_and_values(notes: dict[str, str], refusal: str | None) -> None:
    if refusal is None or OVER not in refusal:
        check_pod_within_limits(Pod(_pod(notes)))
        return
    with pytest.raises(RequestOverLimit) as info:
        check_pod_within_limits(Pod(_pod(notes)))
    assert str(info.value) == refusal
    assert info.value.key in notes and info.value.limit_key in notes
    assert isinstance(info.value, ValueError)


def test_a_pod_admitted_before_the_rule_still_parses() -> None:
    """Running workers read their numbers through request_from_pod; it does not refuse them."""
    req = request_from_pod(Pod(_pod({T_REQ: "50", T_LIM: "40", V_REQ: "8Gi"})), default_pool=POOL)
    assert (req.tflops_request, req.tflops_limit) == (50_000, 40_000)


def test_a_workload_profile_limit_counts_as_the_pods_own() -> None:
    profile = {"metadata": {"name": "small", "namespace": "ns"},
               "spec": {"resources": {"limits": {"tflops": "40", "vram": "8Gi"}}}}
    notes = {tfa.WORKLOAD_PROFILE: "small", T_REQ: "5000"}
    message = _webhook(notes, profile=lambda name: profile if name == "small" else None)
    assert message == f'{T_REQ} "5000" is greater than {T_LIM} "40, from the WorkloadProfile"{OVER}'


def test_a_quota_default_limit_below_the_request_is_admitted_as_by_the_original() -> None:
    """The namespace's defaults are the administrator's, not the pod's: not judged (README)."""
    quota = {"metadata": {"name": "q", "namespace": "ns"},
             "spec": {"single": {"defaultLimits": {"tflops": "40", "vram": "8Gi"}}}}
    assert _webhook({T_REQ: "50", V_REQ: "8Gi"}, quotas=[quota]) is None
