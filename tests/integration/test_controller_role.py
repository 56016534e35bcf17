"""The controller role in-process against the embedded API server, over real HTTP: /healthz,
/readyz (503 until every informer synced, listing each), /metrics, /api/config with hot reload,
leader-only tasks, and the Lease released on cancellation."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import yaml

from tests.apiserver_fixture import apply_crds
from tests.helpers import eventually
from tfusion.controller.role import ControllerRole, build_runtime, serve_runtime
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient
from tfusion.kube.leader import LEASE_NAME
from tfusion.settings import Settings

pytestmark = pytest.mark.anyio


def settings_for(apiserver: Any, tmp_path: Path, **changes: Any) -> Settings:
    base = Settings(roles=("controller",), kube=str(apiserver.kubeconfig), controller_listen="127.0.0.1:0",
                    health_probe_listen="127.0.0.1:0", webhook_listen="127.0.0.1:0",
                    dynamic_config=str(tmp_path / "config.yaml"), dynamic_config_interval=0.05,
                    leader_lease_duration=2.0, leader_renew_deadline=1.5, leader_retry_period=0.2,
                    operator_namespace="tf-ops")
    return base.replace(**changes)


def metric(text: str, line_start: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return None


async def test_health_ready_metrics_config_and_leader_tasks(apiserver: Any, tmp_path: Path) -> None:
    settings = settings_for(apiserver, tmp_path)
    runtime = await build_runtime(settings)
    leader_work: list[str] = []

    async def leader_only() -> None:
        leader_work.append("started")
        try:
            await anyio.sleep_forever()
        finally:
            leader_work.append("cancelled")

    runtime.add_leader_task(leader_only)
    async with anyio.create_task_group() as tg:
        started: ControllerRole = await tg.start(lambda task_status: serve_runtime(runtime,
                                                                                      task_status=task_status))
        assert started is runtime and runtime.address is not None
        base = f"http://127.0.0.1:{runtime.address[1]}"
        async with httpx.AsyncClient(base_url=base, timeout=5) as http:
            assert (await http.get("/healthz")).status_code == 200

            # no CRDs yet: the tensor-fusion.ai informers cannot list, so not ready
            await anyio.sleep(0.3)
            not_ready = await http.get("/readyz")
            assert not_ready.status_code == 503
            conditions = {c["name"]: c["ready"] for c in not_ready.json()["conditions"]}
            assert len(conditions) == 14
            assert conditions["informer gpus.tensor-fusion.ai"] is False
            assert "informer pods" in conditions

            await apply_crds(apiserver)

            async def ready() -> bool:
                return (await http.get("/readyz")).status_code == 200

            await eventually(ready, timeout=15)
            body = (await http.get("/readyz")).json()
            assert body["status"] == "ready" and all(c["ready"] for c in body["conditions"])
            # the same probes on --health-probe-bind-address, the port the original's chart probes
            assert runtime.probe_address is not None and runtime.probe_address[1] != runtime.address[1]
            probes = f"http://127.0.0.1:{runtime.probe_address[1]}"
            assert (await http.get(f"{probes}/healthz")).json() == {"status": "ok"}
            assert (await http.get(f"{probes}/readyz")).json() == body
            assert (await http.get(f"{probes}/api/config")).status_code == 404, "only the probes there"

            async def leading() -> bool:  # the gauge turns when the Lease is won, the task starts after
                return metric((await http.get("/metrics")).text, "tfusion_leader ") == 1.0 and bool(leader_work)

            await eventually(leading)
            assert runtime.is_leader and leader_work == ["started"]
            text = (await http.get("/metrics")).text
            assert metric(text, 'tfusion_informer_synced{informer="gpus.tensor-fusion.ai"}') == 1.0
            assert 'tfusion_informer_relists_total{informer="nodes"}' in text
            assert "tfusion_informer_last_event_age_seconds" in text
            assert "# TYPE tfusion_workqueue_depth gauge" in text
            assert "# TYPE tfusion_reconcile_duration_seconds histogram" in text

            # /api/config: defaults, then hot reload, a refused file, and back to defaults
            config = (await http.get("/api/config")).json()["config"]
            assert config["metricsTTL"] == "30d" and config["maxInFlightNodes"] == 15
            path = Path(settings.dynamic_config)
            path.write_text(yaml.safe_dump({"metricsTTL": "7d", "maxInFlightNodes": 3,
                                            "metricsExtraPodLabels": {"team": "team"}}))

            async def reloaded() -> bool:
                return bool((await http.get("/api/config")).json()["config"]["metricsTTL"] == "7d")

            await eventually(reloaded, timeout=3)
            config = (await http.get("/api/config")).json()["config"]
            assert config["maxInFlightNodes"] == 3 and config["metricsExtraPodLabels"] == {"team": "team"}
            assert config["gpuOperatorNamespace"] == "gpu-operator", "unset keys keep their defaults"
            path.write_text(yaml.safe_dump({"metricsTTL": "1d", "metricsFormat": "xml"}))

            async def refused() -> bool:
                return "metricsFormat" in runtime.dynamic_config.error

            await eventually(refused, timeout=3)
            assert (await http.get("/api/config")).json()["config"]["metricsTTL"] == "7d"
            path.unlink()

            async def defaults() -> bool:
                return bool((await http.get("/api/config")).json()["config"]["metricsTTL"] == "30d")

            await eventually(defaults, timeout=3)

        # the pod informer holds only our labelled pods
        # "other" first: once "w" (created after it) is cached, "other" would have been too
        await runtime.client.create(r.PODS, {"metadata": {"name": "other", "namespace": "default"},
                                             "spec": {"containers": [{"name": "c", "image": "x"}]}})
        await runtime.client.create(r.PODS, {"metadata": {"name": "w", "namespace": "default",
                                                          "labels": {"tensor-fusion.ai/component": "worker"}},
                                             "spec": {"containers": [{"name": "c", "image": "x"}]}})
        pods = runtime.informer(r.PODS)

        async def has_worker() -> bool:
            return pods.get("default/w") is not None

        await eventually(has_worker, timeout=5)
        assert pods.keys() == ["default/w"]
        cancelled_at = time.monotonic()
        tg.cancel_scope.cancel()
    assert time.monotonic() - cancelled_at < 5  # a few seconds, lease release included, on a busy machine
    assert leader_work == ["started", "cancelled"]
    client = await KubeClient.connect(str(apiserver.kubeconfig))
    try:
        lease = await client.get(r.LEASES, LEASE_NAME, namespace="tf-ops")
        assert lease["spec"]["holderIdentity"] == "", "the lease is released on shutdown"
    finally:
        await client.close()


async def test_without_leader_election_it_leads_at_once(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    runtime = await build_runtime(settings_for(apiserver, tmp_path, leader_elect=False))
    ran = anyio.Event()

    async def leader_only() -> None:
        ran.set()

    runtime.add_leader_task(leader_only)
    async with anyio.create_task_group() as tg:
        await tg.start(lambda task_status: serve_runtime(runtime, task_status=task_status))
        assert runtime.address is not None
        with anyio.fail_after(5):
            await ran.wait()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{runtime.address[1]}") as http:
            assert metric((await http.get("/metrics")).text, "tfusion_leader ") == 1.0
        assert runtime.is_leader
        tg.cancel_scope.cancel()
