"""The console's InfluxDB history against a real influxd holding the tables as the roles push them:
the same rows give the same history as the metrics files do, and with two hypervisors each node's
ticks are its own (a group's mean is the sum of the nodes' means)."""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from tests.helpers.metrics_servers import DATABASE, INFLUXD, INFLUXD_MISSING, Influx
from tfusion.console.history import (
    GROUPS,
    METRICS,
    FileHistory,
    GroupBy,
    History,
    HistoryError,
    InfluxHistory,
    Metric,
)
from tfusion.metrics.points import Point, influx_line
from tfusion.metrics.tables import GPU_USAGE_TABLE, SYSTEM_TABLE, WORKER_TABLE, WORKER_USAGE_TABLE

pytestmark = [pytest.mark.skipif(INFLUXD is None, reason=INFLUXD_MISSING), pytest.mark.slow]

BASE = math.floor(time.time() / 60) * 60 - 600  # ten minutes ago, on a minute
SINCE, UNTIL = BASE - 60, BASE + 180


def _ms(at: float) -> int:
    return int(at * 1000)


def _worker(at: float, namespace: str, workload: str, cost: float, tflops: float, gpus: int) -> Point:
    return Point(WORKER_TABLE, {"namespace": namespace, "pool": "gold", "qos": "medium", "worker": f"{workload}-0",
                                "workload": workload},
                 {"raw_cost": cost, "tflops_request": tflops, "gpu_count": gpus, "ready": True}, _ms(at))


def controller_points() -> list[Point]:
    points = []
    for n in range(6):
        at = BASE + 10 + 20 * n
        points.append(Point(SYSTEM_TABLE, {"pool": "gold"}, {"total_nodes_cnt": 1}, _ms(at)))
        points.append(_worker(at, "a", "train", 0.5, 10.0, 2))
        if n == 0:
            points.append(_worker(at, "b", "infer", 0.25, 6.0, 1))
    return points


def hypervisor_points(node: str, ticks: list[float], using: dict[float, tuple[str, str, str, float]]) -> list[Point]:
    points = []
    for at in ticks:
        points.append(Point(GPU_USAGE_TABLE, {"node": node, "pool": "gold", "uuid": f"{node}-gpu"},
                            {"memory_bytes": 1, "compute_tflops": 0.0}, _ms(at)))
        if at in using:
            namespace, workload, pool, tflops = using[at]
            points.append(Point(WORKER_USAGE_TABLE, {"namespace": namespace, "node": node, "pod_name": "p",
                                                     "pool": pool, "uuid": f"{node}-gpu", "workload": workload,
                                                     "worker": "uid"},
                                {"compute_tflops": tflops, "memory_bytes": int(tflops * 100)}, _ms(at)))
    return points


def text(points: list[Point]) -> str:
    return "".join(f"{influx_line(p)}\n" for p in points)


@pytest.fixture
def influx(tmp_path: Path) -> Iterator[Influx]:
    server = Influx(tmp_path / "influx")
    server.start()
    try:
        server.query(f'CREATE DATABASE "{DATABASE}"')
        yield server
    finally:
        server.kill()


def ask(source: InfluxHistory | FileHistory, metric: Metric, group_by: GroupBy, top: int = 8) -> History:
    return anyio.run(functools.partial(source.query, metric, group_by, SINCE, UNTIL, 60, top=top))


def test_the_pushed_tables_give_what_the_files_give(influx: Influx, tmp_path: Path) -> None:
    hypervisor = hypervisor_points("n1", [BASE + 5, BASE + 25, BASE + 45, BASE + 65],
                                   {BASE + 5: ("a", "train", "gold", 4.0), BASE + 25: ("a", "train", "gold", 2.0),
                                    BASE + 65: ("b", "infer", "", 3.0)})
    lines = text(controller_points()) + text(hypervisor)
    influx.write(lines)
    files = tmp_path / "files"
    files.mkdir()
    (files / "controller.log").write_text(text(controller_points()))
    (files / "hypervisor.log").write_text(text(hypervisor))
    source, reference = InfluxHistory(influx.url, DATABASE), FileHistory(files)
    assert source.name == f"influxdb: {influx.url} (database {DATABASE})"
    for metric in METRICS:
        for group_by in GROUPS:
            got, want = ask(source, metric, group_by), ask(reference, metric, group_by)
            assert got.series == want.series and got.step == want.step == 60, (metric, group_by)
    cost = ask(source, "cost", "workload")
    assert [(s.label, s.points) for s in cost.series] == [
        ("a/train", ((BASE, 1.5), (BASE + 60, 1.5))), ("b/infer", ((BASE, 0.25), (BASE + 60, 0.0)))]
    used = ask(source, "tflops_used", "pool")  # 4 and 2 over the first minute's three ticks
    assert [(s.label, s.points) for s in used.series] == [
        ("unknown", ((BASE, 0.0), (BASE + 60, 3.0))), ("gold", ((BASE, 2.0), (BASE + 60, 0.0)))]
    top = ask(source, "tflops_requested", "namespace", top=1)
    assert [(s.label, s.points) for s in top.series] == [("other", ((BASE, 22.0), (BASE + 60, 20.0)))]


def test_each_hypervisor_has_its_own_ticks(influx: Influx) -> None:
    n1 = hypervisor_points("n1", [BASE + 5, BASE + 25, BASE + 45], {
        BASE + 5: ("a", "train", "gold", 4.0), BASE + 25: ("a", "train", "gold", 4.0),
        BASE + 45: ("a", "train", "gold", 4.0)})
    n2 = hypervisor_points("n2", [BASE + 15, BASE + 35, BASE + 55], {
        BASE + 15: ("b", "infer", "", 3.0), BASE + 35: ("b", "infer", "", 3.0)})
    influx.write(text(n1 + n2))
    used = ask(InfluxHistory(influx.url, DATABASE), "tflops_used", "pool")
    assert [(s.label, s.points) for s in used.series] == [("gold", ((BASE, 4.0),)), ("unknown", ((BASE, 2.0),))]


def test_a_source_that_cannot_answer_says_which_and_why(influx: Influx) -> None:
    with pytest.raises(HistoryError, match=rf"influxdb: {influx.url} \(database nope\): database not found: nope"):
        ask(InfluxHistory(influx.url, "nope"), "cost", "pool")
    empty = ask(InfluxHistory(influx.url, DATABASE), "cost", "pool")
    assert empty.series == () and empty.note == "no metrics recorded in this window yet"

