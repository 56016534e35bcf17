"""Vertical autoscaling in `tfusion --role=all` (issue 28's "done when"): a workload asking 40 TFLOPS /
8 GiB whose worker uses about 10 TFLOPS / 2 GiB gets a recommendation near p95/p98 + 15 %; its running
worker's annotations, allocation and shared-memory limits change without a restart, and its GPU's status
shows the freed share; `tfusion why workload/NAME` explains it; a cron rule in force now overrides it
(and a rule the GPU cannot hold is refused with an event) and clears at its end; after a restart the
histograms come back from the workload's checkpoint.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests import c as creader
from tests.helpers.autoscaler import (
    AUTO_SET,
    USED_TFLOPS,
    USED_VRAM,
    create_worker,
    near,
    patch_autoscaling,
    quantity,
    running,
    scaling_role_all,
    steady_load,
    workload_of,
)
from tests.helpers.role_all import TF, RoleAll

POD = "scaled"


@pytest.fixture
def run(tmp_path: Path) -> Iterator[RoleAll]:
    with running(scaling_role_all(tmp_path, "--metrics-interval", "1s")) as process:
        yield process


def _recommended(run: RoleAll, workload: str) -> dict[str, Any] | None:
    status = workload_of(run, workload).get("status") or {}
    rec = status.get("recommendation")
    if not rec or status.get("activeCronScalingRule"):
        return None
    requests = rec["requests"]
    done = near(quantity(requests["tflops"]), USED_TFLOPS * 1000 * 1.15 / 1000) and \
        near(quantity(requests["vram"]), USED_VRAM * 1.15)
    return status if done else None


def _annotations(run: RoleAll) -> dict[str, str]:
    notes: dict[str, str] = run.get(f"/api/v1/namespaces/default/pods/{POD}")["metadata"]["annotations"]
    return notes


def _events(run: RoleAll, reason: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = run.get(f"/api/v1/namespaces/default/events?fieldSelector=reason%3D{reason}")[
        "items"]
    return items


def _available_tflops(run: RoleAll, gpu: str) -> float:
    return quantity(run.get(f"{TF}/gpus/{gpu}")["status"]["available"]["tflops"])


def _minute_window() -> tuple[str, str]:
    """Cron start/end expressions for a rule in force from this minute to the next (UTC); waits out
    the end of a minute so the rule has most of one to be seen in."""
    now = dt.datetime.now(dt.UTC)
    if now.second > 35:
        time.sleep(61 - now.second)
        now = dt.datetime.now(dt.UTC)
    end = now + dt.timedelta(minutes=1)
    return f"{now.minute} {now.hour} * * *", f"{end.minute} {end.hour} * * *"


def test_usage_right_sizes_a_running_worker_and_a_cron_rule_overrides_it(run: RoleAll, tmp_path: Path) -> None:
    if creader.gcc() is None:
        pytest.skip("no C compiler for the shared-memory reader")
    reader = creader.build(tmp_path / "reader")
    run.wait_for("tfusion to be ready", run.ready, timeout=60)
    pod = create_worker(run, POD)
    workload = pod["metadata"]["labels"]["tensor-fusion.ai/workload"]
    gpu = pod["metadata"]["annotations"]["tensor-fusion.ai/gpu-ids"]
    shm = tmp_path / "shm" / "default" / POD / "shm"
    run.wait_for("the worker's shared memory", lambda: shm.is_file() and creader.run(reader, shm)["devices"])
    inode = shm.stat().st_ino
    capacity = quantity(run.get(f"{TF}/gpus/{gpu}")["status"]["capacity"]["tflops"])
    run.wait_for("the GPU's status showing the 40 TFLOPS taken", lambda: _available_tflops(run, gpu) == capacity - 40)
    before = capacity - 40

    with steady_load(run, pod):
        patch_autoscaling(run, workload, {"autoSetResources": AUTO_SET})
        status = run.wait_for("a recommendation near the usage's percentiles plus margin",
                              lambda: _recommended(run, workload), timeout=60)
        rec = status["recommendation"]
        assert near(quantity(rec["limits"]["tflops"]), 2 * quantity(rec["requests"]["tflops"]), 0.01)
        condition = next(c for c in status["conditions"] if c["type"] == "ResourcesRecommended")
        assert condition["status"] == "True" and condition["reason"] == "Recommended", condition
        assert "p95" in condition["message"] and "samples" in condition["message"], condition

        # the running worker: annotations, allocation (GPU status) and shared memory, in place
        notes = run.wait_for("the worker's annotations resized", lambda: _annotations(run) if quantity(
            _annotations(run)["tensor-fusion.ai/tflops-request"]) == quantity(rec["requests"]["tflops"]) else None)
        assert quantity(notes["tensor-fusion.ai/vram-limit"]) == quantity(rec["limits"]["vram"])
        freed = 40 - quantity(rec["requests"]["tflops"])
        run.wait_for("the GPU's status showing the freed share",
                     lambda: near(_available_tflops(run, gpu) - before, freed, 0.001))
        seen = run.wait_for("the new VRAM limit in shared memory", lambda: (lambda d: d if d["mem_limit"] == int(
            quantity(rec["limits"]["vram"])) else None)(creader.run(reader, shm)["devices"][0]))
        assert seen["mem_limit"] >= USED_VRAM
        assert shm.stat().st_ino == inode, "the shared memory was created anew"
        assert run.get(f"/api/v1/namespaces/default/pods/{POD}")["metadata"]["uid"] == pod["metadata"]["uid"]
        assert _events(run, "Resized"), "no Resized event"

        # explained: the route and tfusion why
        answer = httpx.get(f"{run.controller}/api/recommendation", params={"name": workload}, timeout=5).json()
        assert answer["enabled"] and answer["samples"] > 0 and answer["rule"] == "percentile", answer
        assert near(quantity(answer["observed"]["tflops"]["target"]), USED_TFLOPS), answer
        why = subprocess.run([sys.executable, "-m", "tfusion", "why", f"workload/{workload}", "--controller",
                              run.controller], capture_output=True, text=True, timeout=30,
                             env={**os.environ, "KUBECONFIG": str(run.kubeconfig)})
        assert why.returncode == 0, why.stderr
        assert "Recommendation: requests" in why.stdout and "Observed usage per GPU" in why.stdout, why.stdout

        # a cron rule in force now: one the GPU cannot hold is refused, one it can wins, then it ends
        start, end = _minute_window()
        patch_autoscaling(run, workload, {"cronScalingRules": [{
            "enable": True, "name": "too-big", "start": start, "end": end,
            "desiredResources": {"requests": {"tflops": "5000", "vram": "8Gi"},
                                 "limits": {"tflops": "5000", "vram": "8Gi"}}}]})
        refused = run.wait_for("a ResizeRefused event", lambda: _events(run, "ResizeRefused"), timeout=20)
        assert "TFLOPS" in refused[0]["message"], refused[0]
        assert quantity(_annotations(run)["tensor-fusion.ai/tflops-request"]) == quantity(rec["requests"]["tflops"])
        patch_autoscaling(run, workload, {"cronScalingRules": [{
            "enable": True, "name": "burst", "start": start, "end": end,
            "desiredResources": {"requests": {"tflops": "30", "vram": "6Gi"},
                                 "limits": {"tflops": "60", "vram": "12Gi"}}}]})

        def burst() -> dict[str, Any] | None:
            found = workload_of(run, workload).get("status") or {}
            rule = found.get("activeCronScalingRule") or {}
            return found if rule.get("name") == "burst" and \
                quantity(_annotations(run)["tensor-fusion.ai/tflops-request"]) == 30 else None

        during = run.wait_for("the cron rule in force on the worker", burst, timeout=20)
        assert quantity(during["recommendation"]["requests"]["vram"]) == 6 * 1024 ** 3
        assert next(c for c in during["conditions"] if c["type"] == "ResourcesRecommended")["reason"] == "CronRule"
        run.wait_for("the rule to clear at its end and the percentile recommendation to return",
                     lambda: _recommended(run, workload), timeout=90)

    # the histograms survive a restart (the leader's state comes back from the workload's checkpoint)
    samples = httpx.get(f"{run.controller}/api/recommendation", params={"name": workload}, timeout=5).json()[
        "samples"]
    code, _ = run.stop()
    assert code == 0
    run.start()
    run.wait_for("tfusion to be ready again", run.ready, timeout=60)

    def restored() -> int | None:
        response = httpx.get(f"{run.controller}/api/recommendation", params={"name": workload}, timeout=5)
        found = response.json().get("samples", 0) if response.status_code == 200 else 0
        return found if found > 0 else None

    assert run.wait_for("the histograms restored", restored, timeout=30) >= samples // 2
