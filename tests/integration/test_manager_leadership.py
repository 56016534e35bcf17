"""The Manager's leadership terms, against the embedded API server over HTTP: a replica that loses
its Lease stops its leader-only work, and when it leads again that work runs again, on what the
cluster looks like now. And level-triggered means it: a GPU status edited by hand is rewritten
from the ledger, in the first term and in the next."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.apiserver_fixture import apply_crds
from tests.helpers import eventually
from tests.helpers.controller import (
    controllers,
    create_gpu,
    create_pool,
    gpu_available,
    kube_client,
    settings_for,
    start_controller,
    worker,
)
from tests.helpers.leases import steal_lease
from tfusion.kube import resources as r
from tfusion.kube.leader import LEASE_NAME

pytestmark = pytest.mark.anyio

FULL = {"tflops": "100", "vram": "40Gi"}


async def test_leader_work_stops_with_the_lease_and_runs_again_when_it_leads_again(
        apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube, controllers() as tg:
        await create_pool(kube)
        await kube.create(r.GPUNODES, {"metadata": {"name": "node-a"}, "spec": {"manageMode": "AutoSelect"}})
        await create_gpu(kube, "gpu-a1", "node-a")
        await kube.create(r.PODS, worker("p1", "node-a", ["gpu-a1"], tflops="20", vram="4Gi"))
        ctl = await start_controller(tg, settings_for(apiserver, tmp_path, leader_elect=True, pod_name="r1"))
        manager = ctl.runtime.manager

        async def available_is(expected: dict[str, str]) -> bool:
            return await gpu_available(kube, "gpu-a1") == expected

        await eventually(lambda: available_is({"tflops": "80", "vram": "36Gi"}), what="p1 written back")
        assert manager.is_leader and manager.terms == 1

        # level-triggered: a hand edit is an update event, and the ledger wins
        await kube.patch(r.GPUS, "gpu-a1", {"status": {"available": FULL}}, subresource="status")
        await eventually(lambda: available_is({"tflops": "80", "vram": "36Gi"}),
                         what="hand-edited status rewritten in the first term")

        # another holder takes the Lease for 3 s: this replica stops leading and drops its state
        await steal_lease(kube, LEASE_NAME, "intruder", namespace="tf-ops", duration_s=3)

        async def follower() -> bool:
            return not manager.is_leader and ctl.service.allocator is None

        await eventually(follower, what="leader-only work stopped with the Lease")
        assert ctl.service.gpu_status is not None and not ctl.service.gpu_status.running

        # the cluster changes while it follows: p1 goes, p2 comes, and the status is edited again
        await kube.delete(r.PODS, "p1", namespace="default", grace_period_seconds=0)
        p2 = await kube.create(r.PODS, worker("p2", "node-a", ["gpu-a1"], tflops="30", vram="8Gi"))
        await kube.patch(r.GPUS, "gpu-a1", {"status": {"available": {"tflops": "1", "vram": "1Gi"}}},
                         subresource="status")

        # the intruder stops renewing; this replica leads again and its work runs again, on the
        # current state: p2's allocation rebuilt, the wrong status rewritten
        async def leads_again() -> bool:
            # at least 2: on a loaded machine a renewal can miss its 1.5 s deadline, which ends a term too
            return manager.is_leader and manager.terms >= 2 and ctl.service.allocator is not None

        await eventually(leads_again, timeout=20, what="a second leadership term")
        await eventually(lambda: available_is({"tflops": "70", "vram": "32Gi"}),
                         what="changes made while following are reconciled in the new term")
        allocations = (await ctl.http.get("/api/allocation")).json()["allocation"]
        assert list(allocations) == [p2["metadata"]["uid"]], "p1's allocation is gone, p2's recovered"
        assert ctl.service.gpu_status.running and ctl.service.quota_status is not None \
            and ctl.service.quota_status.running

        # and it stays level-triggered after the change of leadership
        await kube.patch(r.GPUS, "gpu-a1", {"status": {"available": FULL}}, subresource="status")
        await eventually(lambda: available_is({"tflops": "70", "vram": "32Gi"}),
                         what="hand-edited status rewritten in the second term")
        metrics = (await ctl.http.get("/metrics")).text
        assert 'tfusion_reconcile_total{name="gpu-status",result="success"}' in metrics
        assert "tfusion_leader 1.0" in metrics
