"""The autoscaler's recommendation applied by the webhook (tfusion/controller/webhook/workloads.py):
when autoscaling counts as on, and what the pod's requests, limits and annotations become."""

from __future__ import annotations

from typing import Any

import pytest

from tfusion.api import annotations as tfa
from tfusion.api.accessors import Pod, Workload
from tfusion.controller.webhook.mutate import Context, Owner, analyse
from tfusion.controller.webhook.render import render
from tfusion.controller.webhook.workloads import apply_recommendation, autoscaling_enabled, recommendation_for

POOL: dict[str, Any] = {"metadata": {"name": "pool-a", "annotations": {tfa.IS_DEFAULT_POOL: "true"}}, "spec": {}}
RECOMMENDED = {"requests": {"tflops": "12", "vram": "6Gi"}, "limits": {"tflops": "30", "vram": "10Gi"}}
AUTO = {"autoSetResources": {"enable": True}}


def plan_for(notes: dict[str, str]) -> Any:
    pod: dict[str, Any] = {
        "metadata": {"name": "p", "namespace": "ns", "labels": {tfa.ENABLED: "true"}, "annotations": notes},
        "spec": {"containers": [{"name": "app", "image": "python"}]}}
    plan = analyse(Pod(pod), Context(pools=[POOL]), Owner(workload_name="p"))
    assert plan is not None
    return pod, plan


def workload(config: dict[str, Any] | None, recommendation: dict[str, Any] | None = RECOMMENDED) -> dict[str, Any]:
    spec = {"autoScalingConfig": config} if config is not None else {}
    status = {"recommendation": recommendation} if recommendation is not None else {}
    return {"metadata": {"name": "p", "namespace": "ns"}, "spec": spec, "status": status}


@pytest.mark.parametrize(("config", "enabled"), [
    (AUTO, True),
    ({"externalScaler": {"enable": True}}, True),
    ({"cronScalingRules": [{"name": "night", "enable": False}, {"name": "day", "enable": True}]}, True),
    ({"cronScalingRules": [{"name": "night", "enable": False}]}, False),
    ({"autoSetResources": {"enable": False}}, False),
    ({}, False),
    (None, False),
])
def test_what_counts_as_autoscaling(config: Any, enabled: bool) -> None:
    assert autoscaling_enabled(config) is enabled


def test_the_pods_own_autoscaling_config_is_merged_over_the_workloads() -> None:
    desired: dict[str, Any] = {"spec": {}}
    assert recommendation_for(Workload(workload(AUTO)), desired) == RECOMMENDED
    assert recommendation_for(Workload(workload(None)), desired) is None
    # the pod turns it on (autoscale annotation) or off: as the workload will be once patched
    assert recommendation_for(Workload(workload(None)), {"spec": {"autoScalingConfig": AUTO}}) == RECOMMENDED
    off = {"spec": {"autoScalingConfig": {"autoSetResources": {"enable": False}}}}
    assert recommendation_for(Workload(workload(AUTO)), off) is None
    assert recommendation_for(Workload(workload(AUTO, recommendation=None)), desired) is None


def test_the_recommendation_becomes_the_pods_requests_and_limits() -> None:
    pod, plan = plan_for({tfa.TFLOPS_REQUEST: "20", tfa.VRAM_REQUEST: "8Gi"})
    assert apply_recommendation(plan, RECOMMENDED)
    notes = Pod(render(Pod(pod), plan, index=1, host_port=None)).meta.annotations
    assert (notes[tfa.TFLOPS_REQUEST], notes[tfa.VRAM_REQUEST]) == ("12", "6Gi")
    assert (notes[tfa.TFLOPS_LIMIT], notes[tfa.VRAM_LIMIT]) == ("30", "10Gi")
    assert not apply_recommendation(plan, RECOMMENDED), "applied twice changes nothing more"


def test_tflops_replace_a_compute_percent_and_missing_parts_stay() -> None:
    pod, plan = plan_for({tfa.COMPUTE_PERCENT_REQUEST: "50", tfa.VRAM_REQUEST: "8Gi", tfa.VRAM_LIMIT: "16Gi"})
    assert apply_recommendation(plan, {"requests": {"tflops": "12", "vram": "0"}, "limits": {"tflops": "30"}})
    notes = Pod(render(Pod(pod), plan, index=1, host_port=None)).meta.annotations
    assert notes[tfa.TFLOPS_REQUEST] == "12" and notes[tfa.TFLOPS_LIMIT] == "30"
    assert tfa.COMPUTE_PERCENT_REQUEST not in notes and tfa.COMPUTE_PERCENT_LIMIT not in notes
    assert (notes[tfa.VRAM_REQUEST], notes[tfa.VRAM_LIMIT]) == ("8Gi", "16Gi"), "zero or absent: kept"


def test_an_unreadable_recommendation_changes_nothing() -> None:
    _, plan = plan_for({tfa.TFLOPS_REQUEST: "20", tfa.VRAM_REQUEST: "8Gi"})
    assert not apply_recommendation(plan, {"requests": {"tflops": "lots"}, "limits": "x"})
    assert plan.annotations[tfa.TFLOPS_REQUEST] == "20"
