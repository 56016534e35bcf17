"""The same recommendation from history: `tfusion --role=all` pushes its usage to a real InfluxDB and a
real Prometheus scrapes its hypervisor while an autoscaled worker runs a steady load; the recommendation
the leader made from the hypervisor source is computed again from Prometheus' `query_range` and from
InfluxQL over `tf_worker_usage`, by the same sources and recommender the autoscaler runs; and a
restarted `--role=all` reading InfluxDB rebuilds the workload's histograms from that history at once.
Both servers run from their Debian packages (`.ci/run` installs them); the test skips without them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.autoscaler import (
    AUTO_SET,
    USED_TFLOPS,
    USED_VRAM,
    create_worker,
    near,
    patch_autoscaling,
    quantity,
    scaling_role_all,
    steady_load,
    workload_of,
)
from tests.helpers.metrics_servers import DATABASE, INFLUXD, PROMETHEUS, Influx, Prometheus
from tests.helpers.role_all import RoleAll
from tfusion.controller.autoscaler.policy import scaling_policy
from tfusion.controller.autoscaler.recommender import Share, WorkloadUsage, recommend, share_of
from tfusion.controller.autoscaler.sources import InfluxUsage, PrometheusUsage, UsageSource

POD = "historic"
pytestmark = pytest.mark.skipif(INFLUXD is None or PROMETHEUS is None,
                                reason="influxd or prometheus is not installed (Debian packages influxdb, "
                                       "prometheus; .ci/run installs them)")


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[tuple[Influx, Prometheus]]:
    influx, prometheus = Influx(tmp_path / "influx"), Prometheus(tmp_path)
    try:
        yield influx, prometheus
    finally:
        influx.kill()
        prometheus.stop()


@pytest.fixture
def run(tmp_path: Path) -> Iterator[RoleAll]:
    process = scaling_role_all(tmp_path, "--metrics-interval", "1s")
    yield process
    process.shut_down()


def _from_history(source: UsageSource, workload: dict[str, Any], since: float, until: float) -> tuple[Share, int]:
    """The recommendation the autoscaler's recommender makes from `source`'s history of the workload."""
    spec = workload["spec"]
    policy = scaling_policy(spec["autoScalingConfig"], namespace="default").auto_set
    usage = WorkloadUsage(policy.half_life_s)
    for sample in asyncio.run(source.samples(since, until)):
        if sample.workload == workload["metadata"]["name"]:
            usage.add(sample.at, sample.tflops_milli, sample.vram_bytes)
    original = share_of(spec["resources"], "spec.resources")
    assert original is not None
    decision = recommend(usage, policy, original=original, current=original, capacity=None, started_at=0,
                         now=until)
    return decision.share, usage.samples


def test_prometheus_and_influxdb_history_give_the_same_recommendation(
        run: RoleAll, servers: tuple[Influx, Prometheus]) -> None:
    influx, prometheus = servers
    influx.start()
    influx.query(f"CREATE DATABASE {DATABASE}")
    run.args.extend(["--metrics-push-url", f"{influx.url}/write", "--metrics-push-database", DATABASE])
    run.start()
    run.wait_for("tfusion to be ready", run.ready, timeout=60)
    prom = prometheus.start({"hypervisor": run.hypervisor.removeprefix("http://")}, scrape_interval="1s")
    pod = create_worker(run, POD)
    name = pod["metadata"]["labels"]["tensor-fusion.ai/workload"]
    with steady_load(run, pod):
        began = time.time() + 3  # from when the scripted load is certainly in the samples
        patch_autoscaling(run, name, {"autoSetResources": AUTO_SET})

        def recommended() -> dict[str, Any] | None:
            found = workload_of(run, name)
            rec = (found.get("status") or {}).get("recommendation")
            return found if rec and near(quantity(rec["requests"]["tflops"]), USED_TFLOPS * 1.15) else None

        workload = run.wait_for("the leader's recommendation from the hypervisor source", recommended, timeout=60)
        live = share_of(workload["status"]["recommendation"], "status.recommendation")
        time.sleep(max(0.0, began + 12 - time.time()))  # at least a dozen points of steady history
        until = time.time() - 2  # what both servers have certainly ingested
        from_prometheus, prom_samples = _from_history(PrometheusUsage(prom), workload, began, until)
        from_influx, influx_samples = _from_history(InfluxUsage(influx.url, DATABASE), workload, began, until)
        assert prom_samples >= 5 and influx_samples >= 5, (prom_samples, influx_samples)
        assert from_prometheus == from_influx == live, (from_prometheus, from_influx, live)
        assert near(from_influx.request.vram, USED_VRAM * 1.15)

        # a new leader reading InfluxDB rebuilds the histograms from its history at once
        code, _ = run.stop()
        assert code == 0
        run.args.extend(["--autoscaler-usage-source", "influxdb", "--autoscaler-usage-url", influx.url,
                         "--autoscaler-usage-database", DATABASE])
        run.start()
        run.wait_for("tfusion to be ready again", run.ready, timeout=60)

        def rebuilt() -> dict[str, Any] | None:
            response = httpx.get(f"{run.controller}/api/recommendation", params={"name": name}, timeout=5)
            answer: dict[str, Any] = response.json()
            done = response.status_code == 200 and answer.get("samples", 0) >= influx_samples and answer.get("decision")
            return answer if done else None

        answer = run.wait_for("the histograms rebuilt from InfluxDB", rebuilt, timeout=30)
        assert answer["source"] == "influxdb" and answer["recommendation"]["requests"] == \
            workload["status"]["recommendation"]["requests"], answer
