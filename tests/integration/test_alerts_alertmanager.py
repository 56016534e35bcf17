"""The dynamic config's alertRules fire into a real Alertmanager: a controller with --enable-alert
(in-process, on the embedded API server) evaluates a PromQL rule on a real Prometheus that scrapes
the controller's own /metrics; a GPUNode that is not Running fires the rule's alert after
`consecutiveCount` evaluations, with its labels and rendered annotations, into Alertmanager's v2
API, and deleting the GPUNode resolves it there. The controller's /metrics says when the webhook's
certificate expires and counts the unscheduled worker pods (shipped rules' inputs). A SQL rule,
which Prometheus cannot run, is refused in GET /api/alerts naming the rule and the field."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import yaml

from tests.apiserver_fixture import apply_crds
from tests.helpers import eventually
from tests.helpers.alertmanager import ALERTMANAGER, ALERTMANAGER_MISSING, Alertmanager
from tests.helpers.controller import controllers, kube_client, settings_for, start_controller
from tests.helpers.metrics_servers import PROMETHEUS, PROMETHEUS_MISSING, Prometheus
from tests.helpers.role_all import free_ports
from tfusion.api.annotations import COMPONENT, COMPONENT_WORKER
from tfusion.kube import resources as r
from tfusion.kube.client import NotFound

pytestmark = [pytest.mark.anyio,
              pytest.mark.skipif(ALERTMANAGER is None, reason=ALERTMANAGER_MISSING),
              pytest.mark.skipif(PROMETHEUS is None, reason=PROMETHEUS_MISSING)]

RULES = [
    {"name": "GPUNodeNotRunning", "query": 'max by (node, phase) (tfusion_gpunode_phase{phase!="Running"}) == 1',
     "threshold": 1, "evaluationInterval": "1s", "consecutiveCount": 2, "severity": "critical",
     "summary": "GPUNode {{.node}} is {{.phase}}", "description": "value {{.Value}}, threshold {{.Threshold}}",
     "runbookURL": "https://example.test/runbook", "alertTargetInstance": "{{.node}}"},
    {"name": "OriginalSQL", "query": "SELECT worker FROM tf_worker_usage WHERE {{.Conditions}}",
     "evaluationInterval": "1s"},
]


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[Alertmanager]:
    server = Alertmanager(tmp_path / "alertmanager")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Prometheus]:
    servers = Prometheus(tmp_path / "prometheus")
    yield servers
    servers.stop()


def ours(alerts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [a for a in alerts if a["labels"].get("alertname") == "GPUNodeNotRunning"]


async def test_an_alert_rule_fires_into_alertmanager_and_resolves(
        apiserver: Any, tmp_path: Path, alertmanager: Alertmanager, prometheus: Prometheus) -> None:
    await apply_crds(apiserver)
    (port,) = free_ports(1)
    # Prometheus scrapes the controller's port before it listens: the first scrapes just fail
    prometheus_url = await anyio.to_thread.run_sync(
        lambda: prometheus.start({"tensor-fusion-controller": f"127.0.0.1:{port}"}, scrape_interval="1s"))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"alertRules": RULES}))
    settings = settings_for(apiserver, tmp_path, controller_listen=f"127.0.0.1:{port}", enable_alert=True,
                            alert_metrics_url=prometheus_url, alert_manager_addr=alertmanager.url)
    async with kube_client(apiserver) as kube, controllers() as tg:
        await start_controller(tg, settings)
        await kube.create(r.GPUNODES, {"metadata": {"name": "gpu-node-a"}, "spec": {}})
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
            refused = (await http.get("/api/alerts")).json()["refused"]
            assert set(refused) == {"OriginalSQL"}
            assert "alertRules[1] (OriginalSQL): query: looks like SQL" in refused["OriginalSQL"]

            async def fired() -> list[dict[str, Any]]:
                return ours(await anyio.to_thread.run_sync(alertmanager.active_alerts))

            (alert,) = await eventually(fired, timeout=60, what="the alert in Alertmanager")
            labels = alert["labels"]
            assert labels["node"] == labels["instance"] == "gpu-node-a" and labels["severity"] == "critical"
            annotations = alert["annotations"]
            assert annotations["summary"] == f"GPUNode gpu-node-a is {labels['phase']}"
            assert annotations["description"] == "value 1, threshold 1"
            assert annotations["runbook_url"] == "https://example.test/runbook"
            view = (await http.get("/api/alerts")).json()
            (rule,) = view["rules"]
            assert view["enabled"] and view["leader"] and rule["name"] == "GPUNodeNotRunning"
            assert rule["consecutiveCount"] == 2 and rule["lastError"] == ""
            assert [f["labels"]["node"] for f in rule["firing"]] == ["gpu-node-a"]

            await kube.delete(r.GPUNODES, "gpu-node-a")

            async def gone() -> bool:
                try:
                    await kube.get(r.GPUNODES, "gpu-node-a")
                except NotFound:
                    return not await fired()
                return False

            await eventually(gone, timeout=60, what="the alert resolved in Alertmanager")
            metrics = (await http.get("/metrics")).text
            assert 'tfusion_alert_evaluations_total{result="ok",rule="GPUNodeNotRunning"}' in metrics
            assert 'tfusion_alertmanager_posts_total{result="ok"}' in metrics
            # a worker pod no scheduler places, for the shipped rule TFusionGPUPodsPendingTooLong
            await kube.create(r.PODS, {
                "metadata": {"name": "waiting", "namespace": "default", "labels": {COMPONENT: COMPONENT_WORKER}},
                "spec": {"schedulerName": "nobody", "containers": [{"name": "c", "image": "busybox"}]}})

            async def pending() -> bool:
                return 'tfusion_gpu_pods_pending{namespace="default"} 1.0' in (await http.get("/metrics")).text

            await eventually(pending, what="the unscheduled worker pod counted")
            # the webhook's certificate, for the shipped rule TFusionWebhookCertificateExpiresSoon
            expiry = next(line for line in metrics.splitlines()
                          if line.startswith("tfusion_webhook_certificate_expiry_timestamp_seconds "))
            assert float(expiry.split()[1]) > time.time() + 300 * 86400
