"""The console's history from the metrics files: both file formats as the recorders write them
(tfusion/metrics/points.py), sums and means per bucket and group, the top groups with the rest as
"other", rotations (followed by inode, through the real `RotatingFile`), reading only what was
appended, and starting a file over when it was replaced or truncated."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import pytest

from tfusion.console.history import (
    NO_DATA,
    WINDOWS,
    FileHistory,
    History,
    PrometheusHistory,
    file_history,
    parse_influx,
    parse_json,
    promql,
    rank,
    window,
)
from tfusion.metrics.points import Point, influx_line, json_line
from tfusion.metrics.sinks import RotatingFile
from tfusion.metrics.tables import POOL_TABLE, WORKER_TABLE, WORKER_USAGE_TABLE

#: a minute boundary, so buckets are easy to name
T0 = 1_764_000_000.0 - 1_764_000_000.0 % 3600
NOW = T0 + 1800


def clock() -> float:
    return NOW


def worker(at: float, namespace: str, workload: str, *, cost: float = 0.0, tflops: float = 0.0, gpus: int = 1,
           pool: str = "gold") -> Point:
    return Point(WORKER_TABLE, {"namespace": namespace, "pool": pool, "qos": "medium", "worker": f"{workload}-0",
                                "workload": workload},
                 {"raw_cost": cost, "tflops_request": tflops, "gpu_count": gpus, "ready": True,
                  "vram_bytes_request": 1024}, int(at * 1000))


def pool_row(at: float) -> Point:
    """A row every controller tick has, even one without workers."""
    return Point(POOL_TABLE, {"pool": "gold"}, {"gpu_count": 4}, int(at * 1000))


def usage(at: float, namespace: str, workload: str, *, tflops: float, vram: int, pool: str = "") -> Point:
    return Point(WORKER_USAGE_TABLE, {"namespace": namespace, "pool": pool, "pod_name": f"{workload}-0",
                                      "uuid": "gpu-1", "workload": workload, "worker": "uid"},
                 {"compute_tflops": tflops, "memory_bytes": vram, "compute_percentage": 1.0}, int(at * 1000))


def lines(points: Iterable[Point], fmt: str = "influx") -> str:
    out = []
    for point in points:
        line = influx_line(point) if fmt == "influx" else json_line(point)
        assert line is not None
        out.append(line + "\n")
    return "".join(out)


def series(history: History) -> dict[str, list[tuple[float, float]]]:
    return {s.label: list(s.points) for s in history.series}


def test_line_protocol_with_escapes_and_string_fields() -> None:
    point = Point(WORKER_TABLE, {"namespace": "team a,b=c", "workload": 'w "1"'},
                  {"raw_cost": 1.5, "gpu_count": 2, "ready": False, "note": 'says "hi", and more'}, 1234)
    line = influx_line(point)
    assert line is not None and "\\" in line
    assert parse_influx(line) == (WORKER_TABLE, {"namespace": "team a,b=c", "workload": 'w "1"'},
                                  {"raw_cost": 1.5, "gpu_count": 2.0, "ready": 0.0}, 1234)
    plain = influx_line(worker(T0, "ns", "w", cost=0.25, tflops=10, gpus=2))
    assert plain is not None
    assert parse_influx(plain) == (WORKER_TABLE, {"namespace": "ns", "pool": "gold", "qos": "medium",
                                                  "worker": "w-0", "workload": "w"},
                                   {"gpu_count": 2.0, "raw_cost": 0.25, "ready": 1.0, "tflops_request": 10.0,
                                    "vram_bytes_request": 1024.0}, int(T0 * 1000))


def test_json_lines() -> None:
    line = json_line(usage(T0, "ns", "w", tflops=2.5, vram=7))
    assert parse_json(line) == (WORKER_USAGE_TABLE, {"namespace": "ns", "pool": "", "pod_name": "w-0",
                                                     "uuid": "gpu-1", "workload": "w", "worker": "uid"},
                                {"compute_tflops": 2.5, "memory_bytes": 7.0, "compute_percentage": 1.0},
                                int(T0 * 1000))
    assert parse_json('{"measure": "x"}') is None
    assert parse_json("[1]") is None


def test_cost_is_summed_and_requests_averaged_over_the_ticks_of_a_bucket(tmp_path: Path) -> None:
    ticks = [T0 + 10, T0 + 30, T0 + 50, T0 + 70]
    points = []
    for at in ticks:
        points.append(pool_row(at))
        points.append(worker(at, "a", "train", cost=0.5, tflops=10, gpus=2))
    # b runs in the first tick only: its request averages over the three ticks of that minute
    points.append(worker(ticks[0], "b", "infer", cost=0.25, tflops=6))
    (tmp_path / "controller.log").write_text(lines(points))
    source = FileHistory(tmp_path, clock=clock)
    cost = source.answer("cost", "namespace", T0, T0 + 120, 60)
    assert cost.step == 60 and cost.source == f"files: {tmp_path}" and cost.note == ""
    assert series(cost) == {"a": [(T0, 1.5), (T0 + 60, 0.5)], "b": [(T0, 0.25), (T0 + 60, 0.0)]}
    requested = source.answer("tflops_requested", "workload", T0, T0 + 120, 60)
    assert series(requested) == {"a/train": [(T0, 20.0), (T0 + 60, 20.0)], "b/infer": [(T0, 2.0), (T0 + 60, 0.0)]}
    by_pool = source.answer("tflops_requested", "pool", T0, T0 + 120, 120)
    assert by_pool.step == 120
    assert series(by_pool) == {"gold": [(T0, 21.5)]}  # (26 + 20 + 20 + 20) / 4 ticks


def test_usage_from_json_files_with_a_missing_pool(tmp_path: Path) -> None:
    points = [usage(T0 + 5, "a", "train", tflops=4.0, vram=100), usage(T0 + 5, "a", "train", tflops=2.0, vram=50),
              usage(T0 + 25, "a", "train", tflops=3.0, vram=300, pool="gold")]
    (tmp_path / "hypervisor.log").write_text(lines(points, "json"))
    source = FileHistory(tmp_path, clock=clock)
    assert series(source.answer("tflops_used", "namespace", T0, T0 + 60, 60)) == {"a": [(T0, 4.5)]}
    assert series(source.answer("vram_used", "pool", T0, T0 + 60, 60)) == {
        "unknown": [(T0, 75.0)], "gold": [(T0, 150.0)]}
    # the controller's metrics are not in these files: no point rather than a zero
    assert source.answer("cost", "namespace", T0, T0 + 60, 60).series == ()


def test_rotated_files_are_all_read_oldest_first(tmp_path: Path) -> None:
    for n, name in enumerate(["controller.log.2", "controller.log.1", "controller.log"]):
        (tmp_path / name).write_text(lines([worker(T0 + 60 * n + 1, "a", "w", cost=1.0 + n)]))
    (tmp_path / "controller.log.x").write_text("not a rotation\n")
    source = FileHistory(tmp_path, clock=clock)
    assert series(source.answer("cost", "namespace", T0, T0 + 180, 60)) == {
        "a": [(T0, 1.0), (T0 + 60, 2.0), (T0 + 120, 3.0)]}


def test_only_appended_lines_are_read_and_a_half_written_line_waits(tmp_path: Path) -> None:
    path = tmp_path / "controller.log"
    first = lines([worker(T0 + 1, "a", "w", cost=1.0)])
    path.write_text(first)
    source = FileHistory(tmp_path, clock=clock)
    follower = source.followers[0]
    assert series(source.answer("cost", "namespace", T0, T0 + 60, 60)) == {"a": [(T0, 1.0)]}
    assert follower.bytes_read == len(first)
    second = lines([worker(T0 + 2, "a", "w", cost=2.0)])
    with open(path, "a") as out:
        out.write(second[:20])  # a writer halfway through its line
    assert series(source.answer("cost", "namespace", T0, T0 + 60, 60)) == {"a": [(T0, 1.0)]}
    with open(path, "a") as out:
        out.write(second[20:])
    assert series(source.answer("cost", "namespace", T0, T0 + 60, 60)) == {"a": [(T0, 3.0)]}
    # the half line was read twice (it had to be), nothing before it again
    assert follower.bytes_read == len(first) + 20 + len(second)
    assert follower.resets == 0


def test_a_rotation_is_followed_without_counting_twice(tmp_path: Path) -> None:
    """The real writer's rotation (rename to .1, a new file): the old file's tail, then the new one."""
    out = RotatingFile(tmp_path / "controller.log", max_bytes=600, backups=3)
    source = FileHistory(tmp_path, clock=clock)
    expected = 0.0
    for n in range(12):
        text = lines([worker(T0 + n, "a", "w", cost=1.0), worker(T0 + n, "b", "w", cost=0.5)])
        out.write(text.splitlines())
        expected += 1.0
        if n % 3 == 0:  # some queries between rotations, some across them
            assert series(source.answer("cost", "namespace", T0, T0 + 60, 60))["a"] == [(T0, expected)]
    assert (tmp_path / "controller.log.2").exists()  # it did rotate, twice at least
    assert series(source.answer("cost", "namespace", T0, T0 + 60, 60)) == {"a": [(T0, 12.0)], "b": [(T0, 6.0)]}
    assert source.followers[0].resets == 0


def test_a_replaced_or_truncated_file_starts_over(tmp_path: Path) -> None:
    path = tmp_path / "controller.log"
    path.write_text(lines([worker(T0 + 1, "a", "w", cost=5.0), worker(T0 + 2, "a", "w", cost=5.0)]))
    source = FileHistory(tmp_path, clock=clock)
    assert series(source.answer("cost", "namespace", T0, T0 + 60, 60)) == {"a": [(T0, 10.0)]}
    # replaced by a longer file (e.g. the directory was wiped and the role restarted)
    path.unlink()
    path.write_text(lines([worker(T0 + 3, "b", "w", cost=1.0), worker(T0 + 4, "b", "w", cost=1.0),
                           worker(T0 + 5, "b", "w", cost=1.0)]))
    assert series(source.answer("cost", "namespace", T0, T0 + 60, 60)) == {"b": [(T0, 3.0)]}
    assert source.followers[0].resets == 1
    # truncated in place: same inode, smaller
    with open(path, "w") as handle:
        handle.write(lines([worker(T0 + 6, "c", "w", cost=2.0)]))
    assert series(source.answer("cost", "namespace", T0, T0 + 60, 60)) == {"c": [(T0, 2.0)]}
    assert source.followers[0].resets == 2
    path.unlink()
    history = source.answer("cost", "namespace", T0, T0 + 60, 60)
    assert history.series == () and "no metrics files" in history.note


def test_top_groups_and_the_rest_as_other(tmp_path: Path) -> None:
    # a namespace called "other" among the largest keeps its name; the rest is then "other (rest)"
    costs = {"n1": 1.0, "n2": 5.0, "n3": 3.0, "n4": 0.5, "other": 4.6}
    (tmp_path / "controller.log").write_text(lines(
        [worker(T0 + 1, ns, "w", cost=c) for ns, c in costs.items()] + [worker(T0 + 61, "n4", "w", cost=4.0)]))
    source = FileHistory(tmp_path, clock=clock)
    history = source.answer("cost", "namespace", T0, T0 + 120, 60, top=3)
    assert series(history) == {"n2": [(T0, 5.0), (T0 + 60, 0.0)], "other": [(T0, 4.6), (T0 + 60, 0.0)],
                               "other (rest)": [(T0, 4.5), (T0 + 60, 4.0)]}
    assert [s.label for s in history.series] == ["n2", "other", "other (rest)"]
    assert len(source.answer("cost", "namespace", T0, T0 + 120, 60, top=5).series) == 5
    ranked = rank({"x": {1.0: 1.0}, "y": {1.0: 2.0}, "z": {2.0: 0.5}}, [1.0, 2.0], 2)
    assert [(s.label, s.points) for s in ranked] == [("y", ((1.0, 2.0), (2.0, 0.0))),
                                                     ("other", ((1.0, 1.0), (2.0, 0.5)))]


def test_buckets_come_from_the_resolution_that_still_holds_the_window(tmp_path: Path) -> None:
    day_ago = NOW - 86400
    (tmp_path / "controller.log").write_text(lines(
        [worker(day_ago + 100, "a", "w", cost=1.0), worker(day_ago + 1000, "a", "w", cost=2.0),
         worker(NOW - 3000, "a", "w", cost=4.0), worker(NOW - 10 * 86400, "a", "w", cost=100.0)]))
    source = FileHistory(tmp_path, clock=clock)
    since, until, step = window("day", NOW)
    day = source.answer("cost", "namespace", since, until, step)
    assert day.step == 900
    values = dict(series(day)["a"])
    assert sum(values.values()) == 7.0 and all(at % 900 == 0 for at in values)
    week = source.answer("cost", "namespace", *window("week", NOW))
    assert week.step == 3600 and sum(v for _, v in series(week)["a"]) == 7.0  # the 10-day-old row is gone
    hour = source.answer("cost", "namespace", *window("hour", NOW))
    assert hour.step == 60 and series(hour) == {"a": [(NOW - 3000 - (NOW - 3000) % 60, 4.0)]}
    # a step that is no multiple of the resolution is rounded up to one
    assert source.answer("cost", "namespace", NOW - 3600, NOW, 90).step == 120
    assert source.answer("cost", "namespace", NOW - 3600, NOW, 1).step == 60
    assert WINDOWS == {"hour": (3600.0, 60.0), "day": (86400.0, 900.0), "week": (604800.0, 3600.0)}


def test_a_rotation_older_than_the_week_is_not_read(tmp_path: Path) -> None:
    old = tmp_path / "controller.log.1"
    old.write_text(lines([worker(NOW - 9 * 86400, "a", "w", cost=1.0)] * 50))
    os.utime(old, (NOW - 9 * 86400, NOW - 9 * 86400))
    current = lines([worker(NOW - 60, "a", "w", cost=1.0)])
    (tmp_path / "controller.log").write_text(current)
    source = FileHistory(tmp_path, clock=clock)
    assert sum(v for _, v in series(source.answer("cost", "namespace", *window("week", NOW)))["a"]) == 1.0
    assert source.followers[0].bytes_read == len(current)


def test_notes_say_what_is_missing_or_skipped(tmp_path: Path) -> None:
    missing = FileHistory(tmp_path / "nothing", clock=clock).answer("cost", "pool", T0, T0 + 60, 60)
    assert missing.series == () and missing.empty
    assert missing.note == f"no metrics files (controller.log, hypervisor.log) in {tmp_path / 'nothing'} yet"
    (tmp_path / "controller.log").write_text(lines([worker(T0 + 1, "a", "w", cost=1.0)])
                                             + '{"resourceMetrics": []}\nnot line protocol\n')
    source = FileHistory(tmp_path, clock=clock)
    later = source.answer("cost", "pool", T0 + 600, T0 + 660, 60)
    assert later.series == ()
    assert later.note == (f"{NO_DATA}; 1 otel line(s) skipped: the console reads the influx and json formats only; "
                          "1 unreadable line(s) skipped")


def test_bad_arguments_name_the_field_and_what_is_allowed(tmp_path: Path) -> None:
    source = FileHistory(tmp_path, clock=clock)
    with pytest.raises(ValueError, match=r"metric 'gpu': expected one of cost, tflops_used, vram_used, "):
        source.answer("gpu", "pool", T0, T0 + 60, 60)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"group_by 'node': expected one of namespace, pool, workload"):
        source.answer("cost", "node", T0, T0 + 60, 60)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"since=.*until=.*since < until"):
        source.answer("cost", "pool", T0, T0, 60)
    with pytest.raises(ValueError, match=r"step 0: expected a positive"):
        source.answer("cost", "pool", T0, T0 + 60, 0)
    with pytest.raises(ValueError, match=r"top 0: expected an integer of at least 1"):
        source.answer("cost", "pool", T0, T0 + 60, 60, top=0)
    with pytest.raises(ValueError, match=r"window 'month': expected one of hour, day, week"):
        window("month", NOW)


@pytest.mark.anyio
async def test_query_reads_in_a_worker_thread(tmp_path: Path) -> None:
    (tmp_path / "hypervisor.log").write_text(lines([usage(T0 + 1, "a", "w", tflops=1.0, vram=1)]))
    history = await file_history(tmp_path, clock=clock).query("tflops_used", "workload", T0, T0 + 60, 60)
    assert series(history) == {"a/w": [(T0, 1.0)]}


def test_promql_per_metric() -> None:
    assert promql("cost", "workload", 900) == \
        "sum by (namespace, workload) (increase(tfusion_worker_cost_total[900s]))"
    assert promql("tflops_requested", "pool", 60) == \
        "avg_over_time((sum by (pool) (tfusion_worker_tflops_request * tfusion_worker_gpus))[60s:])"
    assert PrometheusHistory("http://p:9090/").name == "prometheus: http://p:9090"


def test_rows_with_escaped_tags_in_a_file_are_read_like_plain_ones(tmp_path: Path) -> None:
    (tmp_path / "controller.log").write_text(lines([worker(T0 + 1, "team a", 'w,"1"', cost=1.0),
                                                    worker(T0 + 1, "team b", "w", cost=2.0, tflops=3)]))
    source = FileHistory(tmp_path, clock=clock)
    assert series(source.answer("cost", "workload", T0, T0 + 60, 60)) == {
        "team b/w": [(T0, 2.0)], 'team a/w,"1"': [(T0, 1.0)]}
    assert source.followers[0].bad_lines == 0
