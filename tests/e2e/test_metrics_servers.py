"""Metrics against real servers: a `tfusion --role=all` process pushes its tables to an InfluxDB 1.x
server the test starts (points read back with InfluxQL, every table's tags and fields checked, and
an outage of the server loses nothing that fits the buffer), and a Prometheus server the test
starts scrapes both roles (series read back from its HTTP API). Both servers come from
tests/helpers/metrics_servers.py (their Debian packages, temporary directories, free loopback
ports, `timeout -s KILL`); a test skips, saying so, when its server is not installed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.metrics_servers import (
    DATABASE,
    INFLUXD,
    INFLUXD_MISSING,
    PROMETHEUS,
    PROMETHEUS_MISSING,
    Influx,
    Prometheus,
    poll,
    prom_query,
)
from tests.helpers.role_all import NODE, POOL, RoleAll

CONTROLLER_TABLES: dict[str, tuple[set[str], set[str]]] = {
    "tf_worker_resources": ({"namespace", "pool", "qos", "worker", "workload"},
                            {"gpu_count", "tflops_limit", "tflops_request", "raw_cost", "vram_bytes_limit",
                             "vram_bytes_request", "ready"}),
    "tf_node_metrics": ({"node", "pool", "phase"},
                        {"allocated_tflops", "allocated_tflops_percent", "allocated_tflops_percent_virtual",
                         "allocated_vram_bytes", "allocated_vram_percent", "allocated_vram_percent_virtual",
                         "gpu_count", "raw_cost"}),
    "tf_pool_metrics": ({"pool", "phase"},
                        {"allocated_tflops", "allocated_tflops_percent", "allocated_tflops_percent_virtual",
                         "allocated_vram_bytes", "allocated_vram_percent", "allocated_vram_percent_virtual",
                         "limited_tflops", "limited_vram_bytes", "limited_tflops_percent_virtual",
                         "limited_vram_percent_virtual", "gpu_count"}),
    "tf_gpu_metrics": ({"gpu", "node", "pool", "gpu_model", "phase"},
                       {"capacity_tflops", "capacity_vram_bytes", "available_tflops", "available_vram_bytes",
                        "allocated_tflops", "allocated_vram_bytes", "allocated_tflops_percent",
                        "allocated_vram_percent"}),
    "tf_gpu_allocation": ({"pod", "namespace", "pod_uuid", "node", "gpu_model_index", "gpu_name"}, {"gpu_count"}),
    "tf_system_metrics": ({"pool"},
                          {"total_workers_cnt", "total_nodes_cnt", "total_allocation_fail_cnt",
                           "total_allocation_success_cnt", "total_scale_up_cnt", "total_scale_down_cnt",
                           "total_topo_satisfied_cnt", "total_topo_unsatisfied_cnt", "total_topo_fallback_cnt",
                           "total_topo_search_degraded_cnt"}),
}
HYPERVISOR_TABLES: dict[str, tuple[set[str], set[str]]] = {
    "tf_gpu_usage": ({"uuid", "node", "pool"},
                     {"compute_percentage", "compute_tflops", "memory_bytes", "memory_percentage", "power_usage",
                      "rx", "tx", "temperature"}),
    "tf_worker_usage": ({"uuid", "node", "pool", "pod_name", "namespace", "workload", "worker"},
                        {"compute_percentage", "compute_tflops", "memory_bytes", "memory_percentage"}),
}


@pytest.fixture
def influx(tmp_path: Path) -> Iterator[Influx]:
    if INFLUXD is None:
        pytest.skip(INFLUXD_MISSING)
    server = Influx(tmp_path / "influx")
    yield server
    server.kill()


def role_all_args(run: RoleAll, *extra: str) -> None:
    """The e2e process's flags without its metrics file (so the state-directory default is used)."""
    i = run.args.index("--metrics-output-path")
    del run.args[i:i + 2]
    run.args.extend(["--metrics-interval", "1s", *extra])


@pytest.fixture
def run(tmp_path: Path) -> Iterator[RoleAll]:
    process = RoleAll(tmp_path)
    yield process
    process.shut_down()


def start_worker(run: RoleAll, name: str = "trainer") -> dict[str, Any]:
    """An annotated pod: the webhook makes it a worker, the scheduler gives it GPUs, the kubelet runs it."""
    pods = f"{run.api}/api/v1/namespaces/default/pods"
    created = httpx.post(pods, timeout=10, **run._api_auth(), json={
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"tensor-fusion.ai/enabled": "true"},
                     "annotations": {"tensor-fusion.ai/tflops-request": "20", "tensor-fusion.ai/vram-request": "8Gi"}},
        "spec": {"containers": [{"name": "main", "image": "busybox", "command": ["sleep", "3600"]}]}})
    assert created.status_code == 201, created.text

    def running() -> dict[str, Any] | None:
        pod: dict[str, Any] = run.get(f"/api/v1/namespaces/default/pods/{name}")
        held = (pod["metadata"].get("annotations") or {}).get("tensor-fusion.ai/gpu-ids")
        return pod if held and pod["status"].get("phase") == "Running" else None

    return run.wait_for("the worker pod running on a GPU", running, timeout=40)


def metric_value(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_pushed_tables_arrive_in_influxdb_and_an_outage_loses_nothing(run: RoleAll, influx: Influx) -> None:
    influx.start()
    influx.query(f"CREATE DATABASE {DATABASE}")
    role_all_args(run, "--metrics-push-url", f"{influx.url}/write", "--metrics-push-database", DATABASE)
    run.start()
    run.wait_for("controller and hypervisor /readyz", run.ready, timeout=40)
    pod = start_worker(run)

    tables = {**CONTROLLER_TABLES, **HYPERVISOR_TABLES}
    poll("every table in InfluxDB", lambda: set(tables) <= influx.keys("SHOW MEASUREMENTS"), log=run.output)
    poll("the worker's usage row", lambda: influx.query('SELECT * FROM "tf_worker_usage"'), log=run.output)
    for measure, (tags, fields) in tables.items():
        assert influx.keys(f'SHOW TAG KEYS FROM "{measure}"') == tags, measure
        assert influx.keys(f'SHOW FIELD KEYS FROM "{measure}"') == fields, measure

    def one(measure: str, where: str = "") -> dict[str, Any]:
        series = influx.query(f'SELECT * FROM "{measure}" {where} ORDER BY time DESC LIMIT 1')
        assert series, measure
        return dict(zip(series[0]["columns"], series[0]["values"][0], strict=True))

    uid = pod["metadata"]["uid"]
    worker = one("tf_worker_resources", "WHERE \"worker\" = 'trainer'")
    assert (worker["namespace"], worker["pool"], worker["qos"], worker["workload"]) == \
        ("default", POOL, "medium", "trainer")
    assert worker["tflops_request"] == 20.0 and worker["vram_bytes_request"] == 8 * 1024 ** 3
    assert worker["gpu_count"] == 1 and worker["raw_cost"] >= 0
    allocation = one("tf_gpu_allocation")
    assert allocation["pod_uuid"] == uid and allocation["node"] == NODE
    assert allocation["gpu_name"] == pod["metadata"]["annotations"]["tensor-fusion.ai/gpu-ids"]
    assert one("tf_node_metrics")["node"] == NODE and one("tf_node_metrics")["pool"] == POOL
    assert one("tf_pool_metrics")["gpu_count"] == 3
    assert one("tf_system_metrics")["total_nodes_cnt"] == 1
    gpu_usage = one("tf_gpu_usage")
    assert gpu_usage["pool"] == POOL and gpu_usage["node"] == NODE, "the real pool, not 'unknown'"
    usage = one("tf_worker_usage")
    assert (usage["pod_name"], usage["namespace"], usage["workload"], usage["worker"], usage["pool"]) == \
        ("trainer", "default", "trainer", uid, POOL)

    # by default both roles also write their files under the state directory (--state's)
    controller_file = run.tmp / "metrics" / "controller.log"
    hypervisor_file = run.tmp / "metrics" / "hypervisor.log"
    assert controller_file.read_text().startswith("tf_")
    assert hypervisor_file.read_text().startswith("tf_gpu_usage,")

    # an outage: the pushes fail and are retried; once the server is back, every tick arrives
    influx.kill()
    ticks_at_kill = controller_file.read_text().count("tf_system_metrics,")
    poll("failed pushes while the server is away", lambda: metric_value(
        httpx.get(f"{run.controller}/metrics", timeout=5).text, "tfusion_metrics_push_errors_total",
        role="controller") >= 1, log=run.output)
    poll("two more ticks recorded during the outage",
         lambda: controller_file.read_text().count("tf_system_metrics,") >= ticks_at_kill + 2, log=run.output)
    influx.start()
    wanted = {int(line.rsplit(" ", 1)[1]) for line in controller_file.read_text().splitlines()
              if line.startswith("tf_system_metrics,")}
    wanted_gpu = {int(line.rsplit(" ", 1)[1]) for line in hypervisor_file.read_text().splitlines()
                  if line.startswith("tf_gpu_usage,")}
    poll("every tick written during the outage in InfluxDB",
         lambda: wanted <= influx.times("tf_system_metrics", "total_nodes_cnt")
         and wanted_gpu <= influx.times("tf_gpu_usage", "temperature"), timeout=90, log=run.output)
    metrics = httpx.get(f"{run.controller}/metrics", timeout=5).text
    assert metric_value(metrics, "tfusion_metrics_dropped_total") == 0


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[[dict[str, str]], str]]:
    if PROMETHEUS is None:
        pytest.skip(PROMETHEUS_MISSING)
    servers = Prometheus(tmp_path)
    yield servers.start
    servers.stop()


#: every label the metrics families of issue 16 use (Prometheus adds job and instance)
ALLOWED_LABELS = {"__name__", "job", "instance", "pool", "node", "gpu", "model", "namespace", "pod", "workload",
                  "qos", "result", "role", "reason", "sink"}


def test_prometheus_scrapes_both_roles(run: RoleAll, prometheus: Callable[[dict[str, str]], str]) -> None:
    role_all_args(run)
    run.start()
    run.wait_for("controller and hypervisor /readyz", run.ready, timeout=40)
    start_worker(run)
    url = prometheus({"controller": run.controller.removeprefix("http://"),
                      "hypervisor": run.hypervisor.removeprefix("http://")})

    def both_up() -> bool:
        targets = httpx.get(f"{url}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
        return sorted((t["labels"]["job"], t["health"]) for t in targets) == [("controller", "up"),
                                                                             ("hypervisor", "up")]

    poll("both roles scraped and up", both_up, log=run.output)

    def jobs_of(query: str) -> set[str]:
        return {s["metric"]["job"] for s in prom_query(url, query)}

    # the controller's facts (leader's tables) and the hypervisor's (device usage), from both targets
    def scraped() -> str:
        return httpx.get(f"{run.controller}/metrics", timeout=5).text + run.output()

    poll("the controller's GPU gauges", lambda: jobs_of("tfusion_gpu_capacity_tflops") == {"controller", "hypervisor"},
         log=scraped)
    poll("the hypervisor's usage gauges",
         lambda: jobs_of("tfusion_gpu_memory_used_bytes") == {"controller", "hypervisor"}, log=scraped)
    poll("the worker's cost counter", lambda: prom_query(url, 'tfusion_worker_cost_total{job="controller"}'),
         log=scraped)

    device = prom_query(url, 'tfusion_gpu_device_tflops{job="hypervisor"}')
    assert len(device) == 3 and {s["metric"]["pool"] for s in device} == {POOL}
    assert {s["metric"]["node"] for s in device} == {NODE}
    capacity = {s["metric"]["gpu"]: float(s["value"][1])
                for s in prom_query(url, 'tfusion_gpu_capacity_tflops{job="controller"}')}
    assert sorted(capacity.values()) == [312.0, 312.0, 989.0]
    assert {s["metric"]["gpu"] for s in device} == set(capacity), "one gpu label for both roles"
    (pool_gpus,) = prom_query(url, f'tfusion_pool_gpus{{job="controller",pool="{POOL}"}}')
    assert float(pool_gpus["value"][1]) == 3
    (worker,) = prom_query(url, 'tfusion_worker_tflops_request{job="controller"}')
    assert worker["metric"]["pod"] == "trainer" and worker["metric"]["pool"] == POOL
    assert float(worker["value"][1]) == 20.0
    poll("the worker's usage", lambda: prom_query(url, 'tfusion_worker_memory_used_bytes{job="hypervisor"}'),
         log=scraped)

    # bounded cardinality: no UID, timestamp or other free-form label on these families
    series = prom_query(url, '{__name__=~"tfusion_(worker|gpu|node|pool|metrics)_.*"}')
    assert series
    labels = {name for s in series for name in s["metric"]}
    assert labels <= ALLOWED_LABELS, labels - ALLOWED_LABELS
