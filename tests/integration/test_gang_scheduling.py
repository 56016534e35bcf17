"""Gang scheduling through the built-in scheduler and the extender, in-process controller against
the embedded API server over real HTTP: a gang binds all or nothing; a member waits reserved and
says how many more the gang needs (PodScheduled, GET /api/why); the timeout releases everything and
the group backs off; a satisfied gang lets a replacement pass; a gang that can never fit is
explained at once; the orphan sweep keeps a waiting member's reservation; the workload's
status.gang follows; the extender's bind answers only when the gang is complete."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.apiserver_fixture import apply_crds
from tests.helpers import eventually
from tests.helpers.controller import (
    POOL,
    controllers,
    create_gpu,
    create_pool,
    kube_client,
    settings_for,
    start_controller,
)
from tests.helpers.scheduler import bound, create_node, events_for, gpu_pod, scheduled_condition, scheduler_of
from tfusion.api import annotations as tfa
from tfusion.controller.scheduling.gang_runtime import EXTENDER_HTTP_TIMEOUT_S, EXTENDER_WAIT_CAP_S
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient

pytestmark = pytest.mark.anyio

GROUP = "default/train"


def member(name: str, *, required: int = 2, timeout: str = "0", tflops: str = "40",
           scheduler: str = "tensor-fusion-scheduler", cpu: str | None = None) -> dict[str, Any]:
    return gpu_pod(name, tflops=tflops, scheduler=scheduler, cpu=cpu, extra={
        tfa.GANG_GROUP_KEY: GROUP, tfa.GANG_REQUIRED_MEMBERS: str(required),
        tfa.GANG_DESIRED_MEMBERS: str(required), tfa.GANG_TIMEOUT: timeout})


async def cluster(kube: KubeClient, *, gpus: int = 1, cpu: str = "8") -> None:
    """The pool and node-a with `gpus` GPUs of 100 TFLOPS, and the workload the gang belongs to."""
    await create_pool(kube)
    await create_node(kube, "node-a", cpu=cpu)
    for index in range(gpus):
        await create_gpu(kube, f"gpu-a{index + 1}", "node-a", index=index)
    await kube.create(r.TENSORFUSIONWORKLOADS, {"metadata": {"name": "train", "namespace": "default"},
                                                "spec": {"gangScheduling": {"minMembers": 0}}})


async def gang_status(kube: KubeClient) -> dict[str, Any]:
    workload = await kube.get(r.TENSORFUSIONWORKLOADS, "train", namespace="default")
    found: dict[str, Any] = (workload.get("status") or {}).get("gang") or {}
    return found


async def all_bound(kube: KubeClient, *names: str, timeout: float = 10) -> None:
    for name in names:
        await eventually(lambda: bound(kube, name), timeout=timeout, what=f"{name} bound")  # noqa: B023


async def blocker(kube: KubeClient, tflops: str = "40") -> None:
    """A plain worker that takes `tflops` of the GPU first (the gang's room is then short)."""
    await kube.create(r.PODS, gpu_pod("blocker", tflops=tflops))
    await eventually(lambda: bound(kube, "blocker"), what="blocker bound")


async def test_strict_gang_of_two_with_room_for_two_binds_both(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube:
        await cluster(kube)
        async with controllers() as tg:
            await start_controller(tg, settings_for(apiserver, tmp_path))
            await kube.create(r.PODS, member("m1"))
            await kube.create(r.PODS, member("m2"))
            await all_bound(kube, "m1", "m2")

            async def scheduled() -> dict[str, Any] | None:
                gang = await gang_status(kube)
                return gang if gang.get("scheduledMembers") == 2 else None

            gang = await eventually(scheduled, what="status.gang with 2 scheduled")
            assert (gang["phase"], gang["groupKey"], gang["desiredMembers"], gang["waitingMembers"]) == \
                ("Scheduling", GROUP, 2, 0)
            assert gang["lastTransitionTime"].endswith("Z")


async def test_room_for_one_of_two_binds_nothing_then_times_out_and_backs_off(
        apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube:
        await cluster(kube)
        async with controllers() as tg:
            ctl = await start_controller(tg, settings_for(apiserver, tmp_path))
            scheduler = scheduler_of(ctl)
            scheduler.gangs.book.backoff_s = 5.0  # the original's 10 s, shortened for the test
            await blocker(kube)  # 60 of 100 TFLOPS left: one member of 40 fits, not two
            # the waiting member's condition is written once its gang waited 1 s; the timeout comes later
            first = await kube.create(r.PODS, member("m1", timeout="4s"))
            second = await kube.create(r.PODS, member("m2", timeout="4s"))
            waiting = "waiting for 1 more member(s) of gang default/train (1/2 reserved)"

            async def says_waiting() -> dict[str, Any] | None:
                for name in ("m1", "m2"):
                    condition = await scheduled_condition(kube, name)
                    if condition is not None and condition["message"] == waiting:
                        return {"name": name, **condition}
                return None

            condition = await eventually(says_waiting, what="a member says it waits for the gang")
            waiter = condition["name"]
            why = (await ctl.http.get("/api/why", params={"namespace": "default", "name": waiter})).json()
            assert why["message"] == waiting and why["scheduled"] is False
            assert await bound(kube, "m1") is None and await bound(kube, "m2") is None
            allocator = ctl.service.allocator
            assert allocator is not None
            waiter_uid = (await kube.get(r.PODS, waiter, namespace="default"))["metadata"]["uid"]
            assert allocator.allocation(waiter_uid) is not None  # reserved while it waits

            # the orphan sweep keeps a waiting member's reservation, however old
            allocator.assume_ttl = 0.0
            assert waiter_uid not in await ctl.service.sweep_once()
            assert allocator.allocation(waiter_uid) is not None

            async def timed_out() -> dict[str, Any] | None:
                gang = await gang_status(kube)
                return gang if gang.get("phase") == "TimedOut" else None

            gang = await eventually(timed_out, what="status.gang TimedOut")
            assert gang["backoffUntil"] and gang["reason"] == "GangTimeout" and gang["waitingMembers"] == 0
            assert allocator.allocation(waiter_uid) is None  # released
            assert await events_for(kube, waiter, "GangTimedOut")
            assert await bound(kube, "m1") is None and await bound(kube, "m2") is None
            # backing off: no member is tried, nothing is reserved
            queue = scheduler.queue
            assert queue is not None and queue.where(f"default/{waiter}") == "backoff"
            await kube.delete(r.PODS, "blocker", namespace="default")  # room for both now, yet the group backs off
            await anyio.sleep(1.0)
            assert queue.where(f"default/{waiter}") == "backoff"
            assert allocator.allocations().keys().isdisjoint({first["metadata"]["uid"], second["metadata"]["uid"]})
            # after the backoff, with room for both, the gang binds
            await all_bound(kube, "m1", "m2", timeout=15)


async def test_a_deleted_waiting_member_gives_its_reservation_back(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube:
        await cluster(kube)
        async with controllers() as tg:
            ctl = await start_controller(tg, settings_for(apiserver, tmp_path))
            scheduler = scheduler_of(ctl)
            await blocker(kube)  # room for one member of two; no timeout: it would wait forever
            pods = {n: await kube.create(r.PODS, member(n)) for n in ("m1", "m2")}
            book = scheduler.gangs.book
            waiting = await eventually(lambda: book.waiting_uids(), what="a member waiting at Permit")
            [name] = [n for n, p in pods.items() if p["metadata"]["uid"] in waiting]
            allocator = ctl.service.allocator
            assert allocator is not None and allocator.allocation(pods[name]["metadata"]["uid"]) is not None
            # `tfusion why` says what the condition says (it waits forever: no timeout changes it)
            says = "waiting for 1 more member(s) of gang default/train (1/2 reserved)"
            condition = await eventually(lambda: scheduled_condition(kube, name), what="the waiting condition")
            assert condition["message"] == says
            assert ctl.runtime.address is not None
            url = f"http://127.0.0.1:{ctl.runtime.address[1]}"
            told = await anyio.to_thread.run_sync(lambda: subprocess.run(
                [sys.executable, "-m", "tfusion", "why", "--kube", str(apiserver.kubeconfig), "--controller", url,
                 "-n", "default", name], capture_output=True, text=True, timeout=60))
            assert told.returncode == 0, told.stderr
            assert f"Why: {says}" in told.stdout, told.stdout
            await kube.delete(r.PODS, name, namespace="default")
            await eventually(lambda: not book.waiting_uids(), what="the deleted member gone from Permit")
            assert allocator.allocation(pods[name]["metadata"]["uid"]) is None
            [other] = [n for n in pods if n != name]
            assert await bound(kube, other) is None


async def test_a_waiting_member_keeps_its_cpu_on_the_node(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube:
        await cluster(kube, cpu="1")
        async with controllers() as tg:
            await start_controller(tg, settings_for(apiserver, tmp_path))
            await blocker(kube)  # room for one member of two
            for name in ("m1", "m2"):
                await kube.create(r.PODS, member(name, cpu="600m"))
            # its condition written (an update of the pod the scheduler sees) it still holds 600m of the 1 CPU
            await eventually(lambda: scheduled_condition(kube, "m1"), what="m1's condition")
            await eventually(lambda: scheduled_condition(kube, "m2"), what="m2's condition")
            await kube.create(r.PODS, gpu_pod("hog", tflops="10", cpu="600m"))
            condition = await eventually(lambda: scheduled_condition(kube, "hog"), what="hog refused")
            assert condition["message"] == "0/1 nodes are available: 1 Insufficient cpu."


async def test_satisfied_gang_lets_a_replacement_pass_at_once(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube:
        await cluster(kube)
        async with controllers() as tg:
            await start_controller(tg, settings_for(apiserver, tmp_path))
            await kube.create(r.PODS, member("m1"))
            await kube.create(r.PODS, member("m2"))
            await all_bound(kube, "m1", "m2")
            await kube.delete(r.PODS, "m2", namespace="default")

            async def m2_gone() -> bool:
                return all(p["metadata"]["name"] != "m2" for p in await kube.list(r.PODS, namespace="default"))

            await eventually(m2_gone, what="m2 deleted")
            await kube.create(r.PODS, member("m3"))  # alone it is 1 of 2; the gang was satisfied before
            await eventually(lambda: bound(kube, "m3"), what="the replacement bound")


async def test_a_gang_that_can_never_fit_is_explained_at_once(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube:
        await cluster(kube)  # one GPU of 100 TFLOPS: one 60-TFLOPS member at most, ever
        async with controllers() as tg:
            ctl = await start_controller(tg, settings_for(apiserver, tmp_path))
            for name in ("m1", "m2"):
                await kube.create(r.PODS, member(name, tflops="60", timeout="5m"))

            async def failed() -> dict[str, Any] | None:
                gang = await gang_status(kube)
                return gang if gang.get("phase") == "Failed" else None

            gang = await eventually(failed, what="status.gang Failed")
            expected = (f"the gang needs 2 members but the GPUs of pool {POOL} could hold at most 1 at this "
                        "request even when empty")
            assert (gang["reason"], gang["message"]) == ("GangUnsatisfiable", expected)
            condition = await eventually(lambda: scheduled_condition(kube, "m1"), what="m1 condition")
            assert condition["message"] == f"gang {GROUP} can never be placed: {expected}"
            why = (await ctl.http.get("/api/why", params={"namespace": "default", "name": "m1"})).json()
            assert why["code"] == "UnschedulableAndUnresolvable" and why["message"] == condition["message"]
            assert await eventually(lambda: events_for(kube, "m1", "GangUnsatisfiable"), what="event")
            assert ctl.service.allocator is not None and ctl.service.allocator.allocations() == {}


async def test_extender_bind_answers_when_the_gang_is_complete(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube:
        await cluster(kube)
        async with controllers() as tg:
            ctl = await start_controller(tg, settings_for(apiserver, tmp_path, scheduler="extender"))
            await eventually(lambda: ctl.service.allocator is not None, what="leader ready")
            allocator = ctl.service.allocator
            assert allocator is not None
            assert EXTENDER_WAIT_CAP_S < EXTENDER_HTTP_TIMEOUT_S
            pods = [await kube.create(r.PODS, member(n, timeout="2s", scheduler="default-scheduler"))
                    for n in ("m1", "m2")]

            def binding(pod: dict[str, Any]) -> dict[str, str]:
                return {"PodName": pod["metadata"]["name"], "PodNamespace": "default",
                        "PodUID": pod["metadata"]["uid"], "Node": "node-a"}

            # one member alone: its bind call waits, holding the reservation, then times out with nothing bound
            answer = (await ctl.http.post("/scheduler/bind", json=binding(pods[0]), timeout=10)).json()
            assert "timed out" in answer["Error"] and GROUP in answer["Error"]
            assert await bound(kube, "m1") is None and allocator.allocations() == {}
            # backing off: kube-scheduler's filter is told so
            refused = (await ctl.http.post("/scheduler/filter", json={"Pod": pods[0], "NodeNames": ["node-a"]})).json()
            assert refused["NodeNames"] == [] and "backs off" in refused["FailedNodes"]["node-a"]
            scheduler_of(ctl).gangs.book.groups[GROUP].backoff_until = 0.0  # end the backoff now

            # both members: the first call answers only once the second arrives, then both bind
            answers: dict[str, Any] = {}

            async def bind(pod: dict[str, Any]) -> None:
                reply = await ctl.http.post("/scheduler/bind", json=binding(pod), timeout=10)
                answers[pod["metadata"]["name"]] = reply.json()

            async with anyio.create_task_group() as calls:
                calls.start_soon(bind, pods[0])
                await eventually(lambda: allocator.allocation(pods[0]["metadata"]["uid"]), what="m1 reserved")
                assert "m1" not in answers and await bound(kube, "m1") is None
                calls.start_soon(bind, pods[1])
            assert answers == {"m1": {"Error": ""}, "m2": {"Error": ""}}
            for name in ("m1", "m2"):
                assert await bound(kube, name) is not None
