"""`GET /api/usage` on the controller (tfusion/controller/usage_http.py) against the embedded API
server and a real hypervisor (local backend, simulated devices with a scripted load): the leader
lists every worker's use of every GPU with its node, names a Running GPUNode whose hypervisor does
not answer, does not ask one that is not Running, answers from its cache within a second (one round
for many requests, concurrent ones included), and documents the route; a follower answers 503
naming the leader.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.apiserver_fixture import ApiServerHandle, apply_crds
from tests.helpers import Clock, eventually
from tests.helpers.controller import controllers, kube_client, settings_for, start_controller
from tests.helpers.local_hypervisor import GIB, gpunode_at, hypervisor, worker_with_load
from tfusion.controller.autoscaler.sources import HypervisorUsage
from tfusion.controller.hypervisors import hypervisor_urls
from tfusion.controller.role import ControllerRole
from tfusion.controller.usage_http import UsageRoute, attach_usage_route
from tfusion.kube import resources as r
from tfusion.kube.leader import LEASE_NAME, micro_time

pytestmark = pytest.mark.anyio

H100_TFLOPS = 989
OPS = "tf-ops"


async def _lead_forever() -> None:
    """A leader-only task, so the Manager campaigns and leads (no reconciler rewrites the GPUNodes)."""
    await anyio.sleep_forever()


async def test_the_leader_lists_every_worker_gpu_by_node_from_a_cache(apiserver: ApiServerHandle,
                                                                      tmp_path: Path) -> None:
    await apply_crds(apiserver)
    state = tmp_path / "hv"
    state.mkdir()
    clock = Clock()
    routes: list[UsageRoute] = []

    def usage_only(runtime: ControllerRole) -> None:
        source = HypervisorUsage(lambda: hypervisor_urls(runtime), timeout_s=5.0)
        routes.append(UsageRoute(runtime, source, clock=clock).attach())
        runtime.add_leader_task(_lead_forever)

    async with hypervisor(state) as hv, kube_client(apiserver) as kube, controllers() as tg:
        uid, h100 = await worker_with_load(hv, state)
        await gpunode_at(kube, "box-1", "127.0.0.1", "Running")
        await gpunode_at(kube, "box-2", "127.0.0.2", "Running")  # the same port, where nothing listens
        await gpunode_at(kube, "box-3", "127.0.0.3", "Pending")  # not asked
        assert hv.base_url.port is not None
        ctl = await start_controller(tg, settings_for(apiserver, tmp_path, hypervisor_port=hv.base_url.port),
                                     prepare=usage_only)
        route = routes[0]
        await eventually(lambda: ctl.runtime.is_leader, what="the controller leading")

        async def all_nodes_known() -> bool:
            return len(hypervisor_urls(ctl.runtime)) == 2

        await eventually(all_nodes_known, what="the informers holding both Running GPUNodes")
        answer = await ctl.http.get("/api/usage")
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["data"] == [{"node": "box-1", "namespace": "default", "pod": "trainer", "worker": uid,
                                 "workload": "trainer", "gpu": h100,
                                 "compute_tflops": pytest.approx(0.4 * H100_TFLOPS), "memory_bytes": 3 * GIB}]
        assert list(body["unreachable"]) == ["box-2"]
        assert "hypervisor of node box-2: cannot reach http://127.0.0.2:" in body["unreachable"]["box-2"]
        assert body["at"] > 0 and route.rounds == 1

        # within the cache's second: the same answer, no round; many at once after it: one round
        assert (await ctl.http.get("/api/usage")).json() == body and route.rounds == 1
        clock.now += 1.0
        answers: list[dict[str, Any]] = []

        async def ask() -> None:
            answers.append((await ctl.http.get("/api/usage")).json())

        async with anyio.create_task_group() as many:
            for _ in range(5):
                many.start_soon(ask)
        assert route.rounds == 2 and len({a["at"] for a in answers}) == 1

        document = (await ctl.http.get("/schema/openapi.json")).json()
        operation = document["paths"]["/api/usage"]["get"]
        assert set(operation["responses"]) >= {"200", "503"}
        schemas = document["components"]["schemas"]
        answer_schema = next(s for name, s in schemas.items() if name.endswith("UsageAnswer"))
        assert all(field.get("description") for field in answer_schema["properties"].values()), answer_schema
        await ctl.stop()


async def test_a_follower_answers_503_naming_the_leader(apiserver: ApiServerHandle, tmp_path: Path) -> None:
    async with kube_client(apiserver) as kube, controllers() as tg:
        await kube.create(r.NAMESPACES, {"metadata": {"name": OPS}})
        now = micro_time()
        await kube.create(r.LEASES, {"metadata": {"name": LEASE_NAME, "namespace": OPS}, "spec": {
            "holderIdentity": "the-leader", "leaseDurationSeconds": 3600, "acquireTime": now, "renewTime": now}},
            namespace=OPS)

        def usage_only(runtime: ControllerRole) -> None:
            attach_usage_route(runtime)
            runtime.add_leader_task(_lead_forever)

        ctl = await start_controller(tg, settings_for(apiserver, tmp_path, leader_elect=True, pod_name="follower"),
                                     prepare=usage_only)

        def saw_the_leader() -> bool:
            elector = ctl.runtime.manager.elector
            return elector is not None and elector.observed_holder == "the-leader"

        await eventually(saw_the_leader, what="the follower reading the Lease")
        refused = await ctl.http.get("/api/usage")
        assert refused.status_code == 503
        assert "not the leader (the-leader leads)" in refused.json()["error"]
        await ctl.stop()
