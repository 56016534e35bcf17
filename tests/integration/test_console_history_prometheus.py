"""The console's Prometheus history against a real `prometheus` scraping tfusion's own collectors.

The exporter is the controller's and the hypervisor's real collectors (tfusion/metrics/prometheus.py)
on a prometheus_client server, fed known worker rows: so the queries are checked against the
family names and labels tfusion really exports, not against names this test makes up. The worker's
cost counter grows at a known rate with the wall clock, as the recorder's does.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from prometheus_client import CollectorRegistry, start_http_server

from tests.helpers.metrics_servers import PROMETHEUS, PROMETHEUS_MISSING, Prometheus, poll
from tests.helpers.role_all import free_ports
from tfusion.console.history import GroupBy, History, HistoryError, Metric, PrometheusHistory
from tfusion.metrics.points import Point
from tfusion.metrics.prometheus import HYPERVISOR_SPECS, PointsCollector, Snapshot, register_controller_metrics
from tfusion.metrics.tables import WORKER_TABLE, WORKER_USAGE_TABLE

pytestmark = [pytest.mark.skipif(PROMETHEUS is None, reason=PROMETHEUS_MISSING), pytest.mark.slow]

COST_PER_S = 0.5
STEP = 5.0
#: (namespace, pod, workload, pool, tflops_request per GPU, gpus)
WORKERS = [("a", "p1", "train", "gold", 10.0, 2), ("a", "p2", "infer", "gold", 5.0, 1),
           ("b", "p3", "batch", "silver", 4.0, 1)]


def _snapshot(started: float) -> Snapshot:
    points = [Point(WORKER_TABLE, {"namespace": ns, "pool": pool, "qos": "medium", "worker": pod, "workload": wl},
                    {"tflops_request": tflops, "gpu_count": gpus, "raw_cost": 0.0}) for ns, pod, wl, pool, tflops, gpus
              in WORKERS]
    elapsed = time.time() - started
    return Snapshot(points=points, worker_cost_total={
        ("a", "p1", "train", "gold", "medium"): COST_PER_S * elapsed,
        ("b", "p3", "batch", "silver", "medium"): 2 * COST_PER_S * elapsed})


def _usage() -> list[Point]:
    # the hypervisor's pool tag is empty when it does not know the pool: the group is "unknown"
    return [Point(WORKER_USAGE_TABLE, {"namespace": "a", "pod_name": "p1", "pool": "", "uuid": "gpu-1",
                                       "workload": "train", "node": "n1"}, {"compute_tflops": 7.5,
                                                                            "memory_bytes": 1024 ** 3}),
            Point(WORKER_USAGE_TABLE, {"namespace": "a", "pod_name": "p1", "pool": "", "uuid": "gpu-2",
                                       "workload": "train", "node": "n1"}, {"compute_tflops": 2.5,
                                                                            "memory_bytes": 1024 ** 3})]


@pytest.fixture
def exporter() -> Iterator[str]:
    registry = CollectorRegistry()
    started = time.time()
    register_controller_metrics(registry, lambda: _snapshot(started), lambda: {})
    registry.register(PointsCollector(_usage, HYPERVISOR_SPECS))
    (port,) = free_ports(1)
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture
def prometheus(tmp_path: Path, exporter: str) -> Iterator[str]:
    servers = Prometheus(tmp_path)
    try:
        yield servers.start({"tfusion": exporter}, scrape_interval="1s")
    finally:
        servers.stop()


def ask(source: PrometheusHistory, metric: Metric, group_by: GroupBy, top: int = 8) -> History:
    now = time.time()
    return anyio.run(functools.partial(source.query, metric, group_by, now - 60, now, STEP, top=top))


def values(history: History) -> dict[str, set[float]]:
    return {s.label: {round(v, 6) for _, v in s.points} for s in history.series}


def test_requests_usage_and_cost_by_group(prometheus: str) -> None:
    source = PrometheusHistory(prometheus)
    # a constant gauge averages to itself in every bucket that has samples

    def requested() -> History | None:
        history = ask(source, "tflops_requested", "namespace")
        return history if history.series else None

    by_namespace = poll("requests by namespace", requested)
    assert by_namespace.source == f"prometheus: {prometheus}" and by_namespace.step == STEP
    assert values(by_namespace) == {"a": {25.0}, "b": {4.0}}
    assert [s.label for s in by_namespace.series] == ["a", "b"]
    points = by_namespace.series[0].points
    assert all(at % STEP == 0 for at, _ in points) and [at for at, _ in points] == sorted(at for at, _ in points)
    assert values(ask(source, "tflops_requested", "workload", top=2)) == {"a/train": {20.0}, "other": {9.0}}
    assert values(ask(source, "tflops_used", "pool")) == {"unknown": {10.0}}
    assert values(ask(source, "vram_used", "workload")) == {"a/train": {2.0 * 1024 ** 3}}

    def full_bucket() -> History | None:
        history = ask(source, "cost", "pool")
        return history if len(history.series) == 2 and len(history.series[0].points) >= 3 else None

    cost = poll("cost over whole buckets", full_bucket, timeout=60)
    assert [s.label for s in cost.series] == ["silver", "gold"]
    silver = max(v for _, v in cost.series[0].points)
    gold = max(v for _, v in cost.series[1].points)
    # increase() over a 5 s window of 1 s scrapes: the rate times the window, give or take a scrape
    assert 0.7 * 2 * COST_PER_S * STEP <= silver <= 1.3 * 2 * COST_PER_S * STEP, cost
    assert 0.7 * COST_PER_S * STEP <= gold <= 1.3 * COST_PER_S * STEP, cost


def test_a_source_that_cannot_answer_says_which_and_why(exporter: str) -> None:
    (closed,) = free_ports(1)
    with pytest.raises(HistoryError, match=rf"prometheus: http://127.0.0.1:{closed}: cannot reach it: Connect"):
        ask(PrometheusHistory(f"http://127.0.0.1:{closed}", timeout_s=5), "cost", "pool")
    # the exporter is an HTTP server, but no Prometheus
    with pytest.raises(HistoryError, match=rf"prometheus: http://{exporter}: HTTP 200, not a Prometheus API answer"):
        ask(PrometheusHistory(f"http://{exporter}"), "cost", "pool")
