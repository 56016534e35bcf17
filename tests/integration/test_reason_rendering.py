"""One rendering of a Reason, seen from every side: a pod asking for 5000 TFLOPS of a 100-TFLOPS GPU
is judged by the built-in scheduler (its PodScheduled condition, its FailedScheduling event, its
`/api/why` answer and `tfusion why`'s text from it) and by `POST /api/simulate-schedule`, against
the embedded API server over real HTTP; each shows the same message and the same reason, with the
amounts as canonical quantities ("5k", not 5000000)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.apiserver_fixture import apply_crds
from tests.helpers import eventually
from tests.helpers.controller import controllers, kube_client, settings_for, start_controller
from tests.helpers.scheduler import events_for, gpu_pod, one_gpu_node, scheduled_condition
from tfusion.api.accessors import Pod
from tfusion.kube import resources as r
from tfusion.why import render_text

pytestmark = pytest.mark.anyio


async def test_why_simulate_condition_and_event_render_the_reason_alike(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube:
        await one_gpu_node(kube)  # gpu-a1: 100 TFLOPS, 40Gi
        async with controllers() as tg:
            ctl = await start_controller(tg, settings_for(apiserver, tmp_path))
            manifest = gpu_pod("huge", tflops="5000")
            await kube.create(r.PODS, manifest)
            condition = await eventually(lambda: scheduled_condition(kube, "huge"), what="huge's condition")
            message = "0/1 nodes are available: 1 GPU TFLOPS too small."
            assert condition["message"] == message

            why = (await ctl.http.get("/api/why", params={"namespace": "default", "name": "huge"})).json()
            simulated = await ctl.http.post("/api/simulate-schedule", content=json.dumps(manifest))
            assert simulated.status_code == 200, simulated.text
            explanation = simulated.json()["error"]["explanation"]
            assert why["message"] == explanation["message"] == message

            reason = why["nodes"]["node-a"]["reasons"][0]
            assert explanation["nodes"]["node-a"]["reasons"][0] == reason
            assert (reason["gpu"], reason["resource"], reason["requested"], reason["available"]) == \
                ("gpu-a1", "tflops", "5k", "100")
            assert reason["detail"] == "gpu-a1: TFLOPS available 100 < requested 5k"

            pod = await kube.get(r.PODS, "huge", namespace="default")
            rendered = render_text(Pod(pod), why, "").splitlines()
            assert "  node-a: gpu-a1: TFLOPS available 100 < requested 5k" in rendered

            await ctl.runtime.events.drain()
            events = await events_for(kube, "huge", "FailedScheduling")
            assert [e["message"] for e in events] == [message]
