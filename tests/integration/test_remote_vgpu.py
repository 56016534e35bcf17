"""Remote vGPU end to end: an in-process controller (webhook, reconcilers, scheduler, allocator and
GET /api/connection) against the embedded API server over real HTTP. A client pod created through
the API gets its TensorFusionConnection; the connection's worker is scheduled onto a GPU and, once
Running, its URL is what the client pod's own bound token gets from /api/connection (another pod's
token 401, an unknown name 404, a short wait 504, a broken watch 503, a client that leaves leaves
no waiter); a killed worker gives a new worker and a new URL; fixed-replica workloads scale up and
down, replace workers of an outdated template and spread connections over their workers.

No kubelet runs here: the test plays it, writing a bound worker's status Running with a pod IP."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.helpers import eventually
from tests.helpers.controller import Controller, controllers, create_gpu, start_controller
from tests.helpers.scheduler import create_node
from tests.helpers.webhook import (
    BARE,
    OPS,
    POOL,
    kube_with_webhook_objects,  # noqa: F401  (the `kube` fixture of these tests)
    serve_webhook,
    webhook_settings,
)
from tfusion.api import annotations as tfa
from tfusion.api.accessors import Pod
from tfusion.controller.webhook.remote import connection_of
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient, NotFound
from tfusion.kube.leader import LEASE_NAME, micro_time

pytestmark = pytest.mark.anyio

NS = "default"
REMOTE = {**BARE, tfa.IS_LOCAL_GPU: "false"}


def client_pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "labels": {tfa.ENABLED: "true"}, "annotations": dict(REMOTE)},
            "spec": {"serviceAccountName": "default", "containers": [{"name": "app", "image": "python:3.11-slim"}]}}


async def get(kube: KubeClient, resource: r.ApiResource, name: str) -> Any:
    try:
        return await kube.get(resource, name, namespace=NS)
    except NotFound:
        return None


async def run_pod(kube: KubeClient, name: str, ip: str) -> dict[str, Any]:
    """What a kubelet writes once the pod's containers run."""
    return await kube.patch(r.PODS, name, {"status": {
        "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": "192.0.2.1",
        "conditions": [{"type": "Ready", "status": "True"}]}}, namespace=NS, subresource="status")


async def gpu_cluster(kube: KubeClient, *, gpus: int = 1) -> None:
    await create_node(kube, "node-a")
    for i in range(gpus):
        await create_gpu(kube, f"gpu-a{i}", "node-a", index=i)


async def token_of(kube: KubeClient, pod: dict[str, Any]) -> str:
    return await kube.request_token(NS, "default", bound_pod={"name": pod["metadata"]["name"],
                                                              "uid": pod["metadata"]["uid"]})


async def ask(ctl: Controller, name: str, token: str | None, **options: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return await ctl.http.get("/api/connection", params={"name": name, "namespace": NS}, headers=headers,
                              **options)


async def waiting(ctl: Controller) -> float:
    for line in (await ctl.http.get("/metrics")).text.splitlines():
        if line.startswith("tfusion_connection_waiters "):
            return float(line.split()[1])
    raise AssertionError("tfusion_connection_waiters is not in /metrics")


async def bound_worker(kube: KubeClient, name: str) -> Any:
    pod = await get(kube, r.PODS, name)
    return pod if pod and pod["spec"].get("nodeName") and not pod["metadata"].get("deletionTimestamp") else None


async def test_client_pod_gets_a_dedicated_worker_and_its_url(apiserver: Any, kube: KubeClient,
                                                              tmp_path: Path) -> None:
    await gpu_cluster(kube)
    async with controllers() as tg:
        ctl = await serve_webhook(tg, kube, webhook_settings(apiserver, tmp_path, connection_wait=20.0))
        created = await kube.create(r.PODS, client_pod("app"), namespace=NS)
        assert created["metadata"]["labels"][tfa.COMPONENT] == "client"
        name = connection_of(Pod(created))
        conn = await eventually(lambda: get(kube, r.TENSORFUSIONCONNECTIONS, name), what="the connection")
        assert conn["spec"] == {"workloadName": "app", "clientPod": "app"}
        owner = conn["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"], owner["uid"]) == ("Pod", "app", created["metadata"]["uid"])

        worker = await eventually(lambda: bound_worker(kube, name), what="the dedicated worker bound")
        notes, labels = worker["metadata"]["annotations"], worker["metadata"]["labels"]
        assert notes[tfa.GPU_IDS] == "gpu-a0" and notes[tfa.DEDICATED_WORKER] == "true"
        assert notes[tfa.TFLOPS_REQUEST] == "20" and notes[tfa.VRAM_REQUEST] == "8Gi"
        assert labels[tfa.COMPONENT] == "worker" and labels[tfa.WORKLOAD] == "app"
        assert worker["metadata"]["ownerReferences"][0]["kind"] == "TensorFusionConnection"
        assert tfa.FINALIZER in worker["metadata"]["finalizers"]
        assert worker["spec"]["containers"][0]["ports"][0]["containerPort"] == 8000

        token = await token_of(kube, created)
        other = await kube.create(r.PODS, {"metadata": {"name": "other", "namespace": NS}, "spec": {
            "serviceAccountName": "default", "containers": [{"name": "c", "image": "busybox"}]}}, namespace=NS)
        stranger = await token_of(kube, other)
        async with anyio.create_task_group() as waiters:
            answers: list[httpx.Response] = []

            async def long_poll() -> None:
                answers.append(await ask(ctl, name, token))

            waiters.start_soon(long_poll)
            await eventually(lambda: _waiting_at_least(ctl, 1), what="the request waiting")
            assert (await get(kube, r.TENSORFUSIONCONNECTIONS, name))["status"]["phase"] == "Pending"
            await run_pod(kube, name, "10.0.0.5")
        (answer,) = answers
        assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/plain")
        assert answer.text.startswith(f"native+10.0.0.5+8000+{name}-")
        status = (await get(kube, r.TENSORFUSIONCONNECTIONS, name))["status"]
        assert status == {"phase": "Running", "workerName": name, "connectionURL": answer.text}
        assert (await ask(ctl, name, token)).text == answer.text  # Running: at once

        refused = await ask(ctl, name, stranger)
        assert refused.status_code == 401 and "not to the client pod" in refused.json()["error"]
        assert (await ask(ctl, name, None)).status_code == 401
        assert (await ask(ctl, name, "not-a-token")).status_code == 401
        unknown = await ask(ctl, "nope", token)
        assert unknown.status_code == 404 and unknown.json() == {"error": "connection not found"}
        missing = await ctl.http.get("/api/connection", params={"name": name},
                                     headers={"Authorization": f"Bearer {token}"})
        assert missing.status_code == 400 and missing.json()["field"] == "namespace"

        async def workload_running() -> bool:
            found = await get(kube, r.TENSORFUSIONWORKLOADS, "app")
            status = (found or {}).get("status") or {}
            return status.get("workerCount") == 1 and status.get("readyWorkers") == 1

        await eventually(workload_running, what="the workload counting its worker")

        # killing the worker: the connection fails, a new worker comes, with a new URL
        old_uid = worker["metadata"]["uid"]
        await kube.delete(r.PODS, name, namespace=NS)

        async def failed() -> bool:
            found = (await get(kube, r.TENSORFUSIONCONNECTIONS, name))["status"]
            return found["phase"] in ("Failed", "Pending") and found["connectionURL"] == ""

        await eventually(failed, what="the connection without its worker")

        async def replaced() -> Any:
            pod = await bound_worker(kube, name)
            return pod if pod and pod["metadata"]["uid"] != old_uid else None

        await eventually(replaced, what="a new worker bound")
        await run_pod(kube, name, "10.0.0.6")
        renewed = await ask(ctl, name, token)
        assert renewed.status_code == 200 and renewed.text.startswith(f"native+10.0.0.6+8000+{name}-")
        assert renewed.text != answer.text

        async def reported() -> bool:  # the event recorder writes in the background
            events = [e["reason"] for e in await kube.list(r.EVENTS, namespace=NS)
                      if e["involvedObject"].get("name") == name]
            return {"WorkerCreated", "ConnectionReady", "WorkerLost"} <= set(events)

        await eventually(reported, what="the WorkerCreated, ConnectionReady and WorkerLost events")

        # the client pod goes: its connection and its worker go with it
        await kube.delete(r.PODS, "app", namespace=NS)
        await eventually(lambda: _gone(kube, r.TENSORFUSIONCONNECTIONS, name), what="the connection gone")
        await eventually(lambda: _gone(kube, r.PODS, name), what="the dedicated worker gone")


async def _waiting_at_least(ctl: Controller, count: int) -> bool:
    return await waiting(ctl) >= count


async def _gone(kube: KubeClient, resource: r.ApiResource, name: str) -> bool:
    return await get(kube, resource, name) is None


async def lonely_connection(kube: KubeClient) -> tuple[str, str]:
    """A client pod whose worker cannot be scheduled (there is no GPU): (connection, the pod's token)."""
    created = await kube.create(r.PODS, client_pod("lonely"), namespace=NS)
    name = connection_of(Pod(created))
    await eventually(lambda: get(kube, r.TENSORFUSIONCONNECTIONS, name), what="the connection")
    return name, await token_of(kube, created)


async def answered(ctl: Controller, code: str) -> float:
    for line in (await ctl.http.get("/metrics")).text.splitlines():
        if line.startswith(f'tfusion_connection_requests_total{{code="{code}"}}'):
            return float(line.split()[1])
    return 0.0


async def test_a_worker_that_does_not_come_in_time_is_504(apiserver: Any, kube: KubeClient,
                                                          tmp_path: Path) -> None:
    async with controllers() as tg:
        ctl = await serve_webhook(tg, kube, webhook_settings(apiserver, tmp_path, connection_wait=1.0))
        name, token = await lonely_connection(kube)
        timed_out = await ask(ctl, name, token)
        assert timed_out.status_code == 504 and "timeout waiting for connection" in timed_out.json()["error"]
        assert await waiting(ctl) == 0 and await answered(ctl, "504") == 1


async def test_a_client_that_leaves_leaves_no_waiter_and_a_broken_watch_is_503(
        apiserver: Any, kube: KubeClient, tmp_path: Path) -> None:
    async with controllers() as tg:
        # a wait far longer than the test: only the client's leaving can end its request
        ctl = await serve_webhook(tg, kube, webhook_settings(apiserver, tmp_path, connection_wait=600.0))
        name, token = await lonely_connection(kube)
        with pytest.raises(httpx.ReadTimeout):
            await ask(ctl, name, token, timeout=0.5)
        await eventually(lambda: _answered_at_least(ctl, "499", 1), what="the request ended by its client")
        assert await waiting(ctl) == 0

        # the controller's watch breaks (the API server goes away): the waiting request gets 503
        async with anyio.create_task_group() as waiters:
            answers: list[httpx.Response] = []

            async def long_poll() -> None:
                answers.append(await ask(ctl, name, token, timeout=30))

            waiters.start_soon(long_poll)
            await eventually(lambda: _waiting_at_least(ctl, 1), what="the request waiting")
            await anyio.to_thread.run_sync(apiserver.stop)
        (answer,) = answers
        assert answer.status_code == 503 and "connection watch closed" in answer.json()["error"]
        assert await waiting(ctl) == 0


async def _answered_at_least(ctl: Controller, code: str, count: int) -> bool:
    return await answered(ctl, code) >= count


async def workers_of(kube: KubeClient, workload: str) -> list[dict[str, Any]]:
    pods = await kube.list(r.PODS, namespace=NS, label_selector=f"{tfa.WORKLOAD}={workload}")
    return sorted((p for p in pods if not p["metadata"].get("deletionTimestamp")),
                  key=lambda p: p["metadata"]["name"])


async def test_fixed_replicas_scale_replace_and_spread_connections(apiserver: Any, kube: KubeClient,
                                                                   tmp_path: Path) -> None:
    await gpu_cluster(kube, gpus=2)
    spec = {"replicas": 2, "poolName": POOL, "isLocalGPU": False, "qos": "medium",
            "resources": {"requests": {"tflops": "10", "vram": "4Gi"}, "limits": {"tflops": "10", "vram": "4Gi"}}}
    async with controllers() as tg:
        await serve_webhook(tg, kube, webhook_settings(apiserver, tmp_path, connection_wait=20.0))
        await kube.create(r.TENSORFUSIONWORKLOADS, {"metadata": {"name": "svc", "namespace": NS}, "spec": spec},
                          namespace=NS)

        async def count(n: int, bound: bool = False) -> list[dict[str, Any]] | None:
            found = await workers_of(kube, "svc")
            ok = len(found) == n and (not bound or all(p["spec"].get("nodeName") for p in found))
            return found if ok else None

        first = await eventually(lambda: count(2, bound=True), what="two workers bound")
        workload = await kube.get(r.TENSORFUSIONWORKLOADS, "svc", namespace=NS)
        template = workload["status"]["podTemplateHash"]
        for pod in first:
            meta = pod["metadata"]
            assert meta["generateName"] == "svc-tf-worker-" and meta["name"].startswith("svc-tf-worker-")
            assert meta["labels"][tfa.POD_TEMPLATE_HASH] == template and meta["labels"][tfa.COMPONENT] == "worker"
            assert meta["ownerReferences"][0]["kind"] == "TensorFusionWorkload"
            assert meta["ownerReferences"][0]["controller"] is True and tfa.FINALIZER in meta["finalizers"]
            assert tfa.DEDICATED_WORKER not in meta["annotations"] and meta["annotations"][tfa.GPU_IDS]
        for i, pod in enumerate(first):
            await run_pod(kube, pod["metadata"]["name"], f"10.0.1.{i + 1}")

        async def status_is(**wanted: Any) -> bool:
            found = (await kube.get(r.TENSORFUSIONWORKLOADS, "svc", namespace=NS)).get("status") or {}
            return all(found.get(k) == v for k, v in wanted.items())

        await eventually(lambda: status_is(phase="Running", workerCount=2, readyWorkers=2), what="svc Running")

        # two clients' connections go to two different workers
        names = []
        for client in ("c1", "c2"):
            pod = await kube.create(r.PODS, {"metadata": {"name": client, "namespace": NS}, "spec": {
                "containers": [{"name": "c", "image": "busybox"}]}}, namespace=NS)
            await kube.create(r.TENSORFUSIONCONNECTIONS, {"metadata": {"name": f"{client}-conn", "namespace": NS,
                              "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": client,
                                                   "uid": pod["metadata"]["uid"]}]},
                              "spec": {"workloadName": "svc", "clientPod": client}}, namespace=NS)
            names.append(f"{client}-conn")

        async def both_running() -> list[dict[str, Any]] | None:
            found = [await get(kube, r.TENSORFUSIONCONNECTIONS, n) for n in names]
            return found if all((c.get("status") or {}).get("phase") == "Running" for c in found) else None

        conns = await eventually(both_running, what="both connections Running")
        assert {c["status"]["workerName"] for c in conns} == {p["metadata"]["name"] for p in first}
        assert all(c["metadata"]["labels"][tfa.WORKER_NAME] == c["status"]["workerName"] for c in conns)

        # scale up, then down
        await kube.patch(r.TENSORFUSIONWORKLOADS, "svc", {"spec": {"replicas": 3}}, namespace=NS)
        await eventually(lambda: count(3), what="three workers")
        await kube.patch(r.TENSORFUSIONWORKLOADS, "svc", {"spec": {"replicas": 1}}, namespace=NS)
        (survivor,) = await eventually(lambda: count(1), what="one worker left")
        assert survivor["metadata"]["name"] in {p["metadata"]["name"] for p in first}, \
            "the unscheduled or not-ready newcomer goes first"
        await eventually(lambda: status_is(workerCount=1, readyWorkers=1, phase="Running"), what="svc at 1")

        # both connections end up on the one worker left
        async def on_survivor() -> bool:
            found = [await get(kube, r.TENSORFUSIONCONNECTIONS, n) for n in names]
            return all(c["status"]["phase"] == "Running" and c["status"]["workerName"] ==
                       survivor["metadata"]["name"] for c in found)

        await eventually(on_survivor, what="the connections moved to the surviving worker")

        # a spec change: the worker of the old template is replaced
        await kube.patch(r.TENSORFUSIONWORKLOADS, "svc", {"spec": {"resources": {
            "requests": {"tflops": "12", "vram": "4Gi"}, "limits": {"tflops": "12", "vram": "4Gi"}}}}, namespace=NS)

        async def replaced() -> Any:
            found = await workers_of(kube, "svc")
            return found if len(found) == 1 and found[0]["metadata"]["name"] != survivor["metadata"]["name"] else None

        (fresh,) = await eventually(replaced, what="the outdated worker replaced")
        new_template = (await kube.get(r.TENSORFUSIONWORKLOADS, "svc", namespace=NS))["status"]["podTemplateHash"]
        assert new_template != template and fresh["metadata"]["labels"][tfa.POD_TEMPLATE_HASH] == new_template
        assert fresh["metadata"]["annotations"][tfa.TFLOPS_REQUEST] == "12"

        # deleting the workload deletes its workers first
        await kube.delete(r.TENSORFUSIONWORKLOADS, "svc", namespace=NS)
        await eventually(lambda: _gone(kube, r.TENSORFUSIONWORKLOADS, "svc"), what="the workload gone")
        assert await workers_of(kube, "svc") == []


@pytest.mark.parametrize("auth_off", [False, True], ids=["token", "DISABLE_CONNECTION_AUTH"])
async def test_a_follower_answers_from_its_own_cache(apiserver: Any, kube: KubeClient, tmp_path: Path,
                                                     auth_off: bool) -> None:
    # another replica leads (the test holds the Lease): this one runs no reconciler, only the route
    await kube.create(r.LEASES, {"metadata": {"name": LEASE_NAME, "namespace": OPS}, "spec": {
        "holderIdentity": "someone-else", "leaseDurationSeconds": 3600, "renewTime": micro_time(),
        "acquireTime": micro_time()}}, namespace=OPS)
    pod = await kube.create(r.PODS, {"metadata": {"name": "c", "namespace": NS}, "spec": {
        "serviceAccountName": "default", "containers": [{"name": "c", "image": "busybox"}]}}, namespace=NS)
    await kube.create(r.TENSORFUSIONCONNECTIONS, {"metadata": {"name": "c-conn", "namespace": NS, "ownerReferences": [
        {"apiVersion": "v1", "kind": "Pod", "name": "c", "uid": pod["metadata"]["uid"]}]},
        "spec": {"workloadName": "w", "clientPod": "c"}}, namespace=NS)
    token = None if auth_off else await token_of(kube, pod)
    async with controllers() as tg:
        ctl = await start_controller(tg, webhook_settings(apiserver, tmp_path, leader_elect=True, enable_webhooks=False,
                                                          disable_connection_auth=auth_off, connection_wait=20.0))
        async with anyio.create_task_group() as waiters:
            answers: list[httpx.Response] = []

            async def long_poll() -> None:
                answers.append(await ask(ctl, "c-conn", token))

            waiters.start_soon(long_poll)
            await eventually(lambda: _waiting_at_least(ctl, 1), what="the request waiting")
            assert not ctl.runtime.is_leader
            await kube.patch(r.TENSORFUSIONCONNECTIONS, "c-conn", {"status": {
                "phase": "Running", "workerName": "w-1", "connectionURL": "native+10.9.0.1+8000+w-1-7"}},
                namespace=NS, subresource="status")
        (answer,) = answers
        assert answer.status_code == 200 and answer.text == "native+10.9.0.1+8000+w-1-7"
        assert (await ask(ctl, "c-conn", None)).status_code == (200 if auth_off else 401)
