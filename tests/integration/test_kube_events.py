"""EventRecorder against the embedded API server: aggregation into count/lastTimestamp, the
Event's fields, cluster-scoped objects, and never raising into or blocking the caller."""

from __future__ import annotations

import logging
from typing import Any

import anyio
import pytest

from tfusion.api.accessors import Body
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient
from tfusion.kube.events import EventRecorder

pytestmark = pytest.mark.anyio


@pytest.fixture
async def kube(kube: KubeClient) -> KubeClient:
    """The shared client (tests/apiserver_fixture.py), with this module's namespace created."""
    await kube.create(r.NAMESPACES, {"metadata": {"name": "ev"}})
    return kube


async def test_repeats_are_aggregated(kube: KubeClient) -> None:
    pod = await kube.create(r.PODS, {"metadata": {"name": "p", "namespace": "ev"},
                                     "spec": {"containers": [{"name": "c", "image": "x"}]}})
    node = await kube.create(r.NODES, {"metadata": {"name": "n1"}})
    recorder = EventRecorder(kube, component="tensor-fusion-operator", instance="ctl-1", host="h")
    async with anyio.create_task_group() as tg:
        await tg.start(recorder.run)
        for _ in range(3):
            recorder.warning(Body(pod), "AllocationFailed", "no GPU with 40Gi free")
        recorder.warning(Body(pod), "AllocationFailed", "no GPU with 80Gi free")
        recorder.normal(Body(pod), "Allocated", "gpu-1")
        recorder.normal(Body(node), "Discovered", "2 GPUs")
        with anyio.fail_after(5):
            await recorder.drain()
        tg.cancel_scope.cancel()
    events = (await kube.list(r.EVENTS, namespace="ev")).items
    by_message = {e["message"]: e for e in events}
    assert sorted(by_message) == ["gpu-1", "no GPU with 40Gi free", "no GPU with 80Gi free"]
    repeated = by_message["no GPU with 40Gi free"]
    assert repeated["count"] == 3 and repeated["type"] == "Warning" and repeated["reason"] == "AllocationFailed"
    assert repeated["lastTimestamp"] >= repeated["firstTimestamp"]
    assert repeated["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "name": "p", "namespace": "ev",
                                          "uid": pod["metadata"]["uid"],
                                          "resourceVersion": pod["metadata"]["resourceVersion"]}
    assert repeated["source"] == {"component": "tensor-fusion-operator", "host": "h"}
    assert repeated["reportingComponent"] == "tensor-fusion-operator"
    assert repeated["reportingInstance"] == "ctl-1"
    assert by_message["gpu-1"]["count"] == 1 and by_message["gpu-1"]["type"] == "Normal"
    node_events = (await kube.list(r.EVENTS, namespace="default")).items
    assert [(e["involvedObject"]["kind"], e["message"]) for e in node_events] == [("Node", "2 GPUs")]
    assert recorder.written == 6 and recorder.dropped == 0


async def test_bad_input_and_a_dead_server_never_reach_the_caller(apiserver: Any, kube: KubeClient) -> None:
    pod = Body({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x", "namespace": "ev"}})
    recorder = EventRecorder(kube, queue_size=2)
    recorder.event(pod, "Info", "Reason", "bad type")
    recorder.event(Body({"metadata": {}}), "Normal", "Reason", "no kind or name")
    assert recorder.dropped == 2
    async with anyio.create_task_group() as tg:
        apiserver.stop()
        for i in range(5):  # the queue holds 2: the rest are dropped, not waited for
            recorder.normal(pod, "Reason", f"m{i}")
        await tg.start(recorder.run)
        with anyio.fail_after(10):
            await recorder.drain()
        tg.cancel_scope.cancel()
    assert recorder.written == 0 and recorder.dropped == 2 + 3 + 2


async def test_drops_are_logged_once_in_a_while_with_their_count(kube: KubeClient,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """An API server that falls behind makes the recorder drop thousands of events a minute: the
    first drop is logged with the count, the next ones only once `DROP_LOG_EVERY_S` has passed."""
    pod = Body({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x", "namespace": "ev"}})
    recorder = EventRecorder(kube, queue_size=1)
    with caplog.at_level(logging.WARNING, logger="tfusion.kube.events"):
        for i in range(5):
            recorder.normal(pod, "Reason", f"m{i}")
    assert recorder.dropped == 4
    assert [r.getMessage() for r in caplog.records] == [
        "event queue full; dropped Normal Reason (1 event(s) dropped so far; the next drops are logged 10 s from now)"]
