"""tfusion.metrics on its own: the line-protocol and JSON encoders, the raw-cost formula against hand
computations, the billing ledger (a worker deleted mid-interval is billed once, up to its deletion),
the rotating file, and the push sender against a real HTTP server on loopback (retries keep
the batch, a refused batch is dropped and counted, a full buffer drops the oldest lines)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import pytest
from prometheus_client import CollectorRegistry

from tests.helpers import closed_port
from tests.helpers.metrics import POOL, worker_pod
from tfusion.api.accessors import Body, GpuPool, Pod
from tfusion.api.jsontypes import JsonObject
from tfusion.metrics import cost
from tfusion.metrics.points import Point, encode, influx_line, json_line
from tfusion.metrics.sinks import MetricsOutput, PushConfig, PushSender, RotatingFile, SinkMetrics, write_url

GIB = 1024 ** 3


# --- encoders ---------------------------------------------------------------------------------------

def test_line_protocol_escapes_quotes_and_types() -> None:
    point = Point("tf worker,x", {"pool": "a b", "ns": "x=y,z", "empty": ""},
                  {"n": 3, "f": 0.5, "ok": True, "s": 'say "hi"\\', "nan": float("nan")}, 1700000000123)
    assert influx_line(point) == (
        r'tf\ worker\,x,ns=x\=y\,z,pool=a\ b f=0.5,n=3i,ok=true,s="say \"hi\"\\" 1700000000123')


def test_a_point_without_writable_fields_is_skipped() -> None:
    assert influx_line(Point("t", {"a": "b"}, {"x": float("inf")}, 1)) is None
    assert encode([Point("t", {}, {}, 1), Point("t", {}, {"v": 1}, 2)], "influx") == ["t v=1i 2"]
    with pytest.raises(ValueError, match="xml"):
        encode([], "xml")


def test_json_line_is_the_original_shape() -> None:
    line = json_line(Point("tf_gpu_usage", {"uuid": "g"}, {"memory_bytes": 5, "t": 1.5}, 42))
    assert json.loads(line) == {"measure": "tf_gpu_usage", "tag": {"uuid": "g"},
                                "field": {"memory_bytes": 5, "t": 1.5}, "ts": 42}


def test_otel_is_one_otlp_json_request_per_batch() -> None:
    points = [Point("tf_gpu_usage", {"uuid": "g", "pool": 'p "q"'},
                    {"memory_bytes": 5, "temperature": 41.5, "healthy": True, "note": "x", "nan": float("nan")}, 42),
              Point("tf_worker_usage", {}, {"note": "only a string"}, 43)]
    (line,) = encode(points, "otel")
    request = json.loads(line)  # valid JSON even with quotes in a tag
    (resource,) = request["resourceMetrics"]
    assert resource["resource"] == {"attributes": []}
    (scope,) = resource["scopeMetrics"]
    assert scope["scope"] == {"name": "operator"}
    attributes = [{"key": "pool", "value": {"stringValue": 'p "q"'}}, {"key": "uuid", "value": {"stringValue": "g"}}]
    at = {"attributes": attributes, "timeUnixNano": "42000000", "startTimeUnixNano": "42000000"}
    assert scope["metrics"] == [
        {"name": "tf_gpu_usage_healthy", "gauge": {"dataPoints": [{**at, "asInt": "1"}]}},
        {"name": "tf_gpu_usage_memory_bytes", "gauge": {"dataPoints": [{**at, "asInt": "5"}]}},
        {"name": "tf_gpu_usage_temperature", "gauge": {"dataPoints": [{**at, "asDouble": 41.5}]}},
    ]
    assert encode([Point("t", {}, {"s": "text"}, 1)], "otel") == []


# --- cost -------------------------------------------------------------------------------------------

SHARE = cost.WorkerShare(tflops_request=10, tflops_limit=20, vram_request=4 * GIB, vram_limit=8 * GIB,
                         gpu_count=2, qos="medium")


def test_worker_cost_matches_a_hand_computation() -> None:
    pricing = cost.pool_pricing(POOL)
    # per second: 10 TFLOPS * 0.0001 + 4 GiB * 0.0002 + 10 TFLOPS over * 0.0001 * 0.5 + 4 GiB over * 0.0002 * 0.5
    #           = 0.001 + 0.0008 + 0.0005 + 0.0004 = 0.0027; for 60 s on 2 GPUs: 0.324
    assert cost.worker_cost(SHARE, pricing, 60) == pytest.approx(0.324)
    assert cost.worker_cost(SHARE, pricing, 60, eviction_protected=True) == pytest.approx(0.324 * 1.5)
    critical = cost.WorkerShare(10, 20, 4 * GIB, 8 * GIB, 2, qos="critical")  # limitsOverRequests defaults to 1
    # 0.001 + 0.0008 + 0.001 + 0.0008 = 0.0036 per second; protection does not raise a critical worker's price
    assert cost.worker_cost(critical, pricing, 60, eviction_protected=True) == pytest.approx(0.0036 * 120)


def test_no_pricing_or_no_time_costs_nothing() -> None:
    pricing = cost.pool_pricing(POOL)
    assert cost.worker_cost(cost.WorkerShare(10, 20, GIB, GIB, 1, qos="high"), pricing, 60) == 0
    assert cost.worker_cost(SHARE, None, 60) == 0
    assert cost.worker_cost(SHARE, pricing, -5) == 0


def test_eviction_ratio_below_one_means_the_default() -> None:
    pool = {"spec": {"qosConfig": {"evictionProtectionPriceRatio": "0.5", "pricing": []}}}
    assert cost.pool_pricing(GpuPool(pool)).eviction_ratio == 1.2
    assert cost.pool_pricing(GpuPool({"spec": {}})).eviction_ratio == 1.2


def test_a_bad_price_names_its_field() -> None:
    pool: JsonObject = {"spec": {"qosConfig": {"pricing": [{"qos": "low",
                                                            "requests": {"perFP16TFlopsPerHour": "cheap"}}]}}}
    with pytest.raises(cost.PriceError, match=r"pricing\[0\]\.requests\.perFP16TFlopsPerHour: 'cheap'"):
        cost.pool_pricing(GpuPool(pool))


def test_node_cost_from_provider_prices() -> None:
    prices = cost.hourly_prices([Body({"spec": {"hardwareMetadata": [
        {"model": "A100", "fullModelName": "NVIDIA A100-SXM4-80GB", "costPerHour": "$1.8", "fp16TFlops": "312"},
        {"model": "H100", "fp16TFlops": "989"}]}})])
    assert prices == {"A100": 1.8, "NVIDIA A100-SXM4-80GB": 1.8}
    # two A100: 3.6 $/h; the unpriced H100 adds nothing
    models = ["A100", "NVIDIA A100-SXM4-80GB", "H100"]
    assert cost.node_hourly_price(Body({}), models, prices) == pytest.approx(3.6)
    # a provisioned node's own price (its instance's) wins over its GPUs' model prices
    assert cost.node_hourly_price(Body({"spec": {"costPerHour": "$5.07"}}), models, prices) == pytest.approx(5.07)
    assert cost.node_hourly_price(Body({"spec": {"costPerHour": "cheap"}}), models, prices) == pytest.approx(3.6)


def test_a_worker_deleted_mid_interval_is_billed_once_to_its_deletion() -> None:
    ledger = cost.BillingLedger()
    ledger.seen("w", 1000.0)
    ledger.seen("w", 1010.0)  # seen again: billing still starts at 1000
    assert ledger.bill("w", 1060.0) == 60
    ledger.ended("w", 1090.0)
    ledger.ended("w", 1100.0)  # a later event about the same pod does not move its end
    assert not ledger.finished("w")
    assert ledger.bill("w", 1120.0) == 30
    assert ledger.finished("w")
    assert ledger.bill("w", 1180.0) == 0
    total = cost.worker_cost(SHARE, cost.pool_pricing(POOL), 60 + 30)
    assert total == pytest.approx(0.0027 * 90 * 2)


def test_an_end_before_the_last_bill_bills_nothing_more() -> None:
    ledger = cost.BillingLedger()
    ledger.seen("w", 100.0)
    assert ledger.bill("w", 160.0) == 60
    ledger.ended("w", 150.0)  # reported late: the row at 160 already covered it
    assert ledger.finished("w") and ledger.bill("w", 220.0) == 0
    ledger.ended("unknown", 1.0)
    assert "unknown" not in ledger


# --- file ------------------------------------------------------------------------------------------

def test_rotating_file_keeps_a_few_backups(tmp_path: Path) -> None:
    sink = RotatingFile(tmp_path / "m" / "metrics.log", max_bytes=10, backups=2)  # one line each
    for i in range(5):
        sink.write([f"line-{i}-padding-xx"])
    assert (tmp_path / "m" / "metrics.log").read_text() == "line-4-padding-xx\n"
    assert sink.backup(1).read_text() == "line-3-padding-xx\n"
    assert sink.backup(2).read_text() == "line-2-padding-xx\n"
    assert not sink.backup(3).exists()


def test_rotating_file_removes_backups_older_than_the_ttl(tmp_path: Path) -> None:
    import os

    sink = RotatingFile(tmp_path / "metrics.log", max_bytes=5, backups=3, ttl_s=3600)
    sink.write(["old-line"])
    sink.write(["second"])
    assert sink.backup(1).exists()
    os.utime(sink.backup(1), (1_000_000, 1_000_000))  # written long ago
    sink.write(["third"])
    assert sink.backup(1).read_text() == "second\n" and not sink.backup(2).exists()


@pytest.mark.anyio
async def test_output_survives_an_unwritable_file(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    registry = CollectorRegistry()
    output = MetricsOutput(role="t", registry=registry, file=RotatingFile(blocker / "metrics.log"))
    await output.emit([Point("t", {}, {"v": 1}, 1)])
    assert registry.get_sample_value("tfusion_metrics_dropped_total", {"role": "t", "reason": "file_error"}) == 1


# --- push ------------------------------------------------------------------------------------------

def test_write_url_adds_the_database_and_precision() -> None:
    assert write_url("http://db:4000/v1/influxdb/write", "public") == \
        "http://db:4000/v1/influxdb/write?db=public&precision=ms"
    assert write_url("http://db:4000/v1/influxdb/api/v2/write?precision=s", "x") == \
        "http://db:4000/v1/influxdb/api/v2/write?precision=s&bucket=x"


class _Server:
    """A real HTTP server on loopback that answers writes with the next status of `statuses`."""

    def __init__(self, statuses: list[int]) -> None:
        self.statuses = statuses
        self.bodies: list[tuple[int, str, dict[str, str]]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
                status = server.statuses.pop(0) if server.statuses else 204
                server.bodies.append((status, body, {"path": self.path,
                                                     "auth": self.headers.get("Authorization") or "",
                                                     "hints": self.headers.get("x-greptime-hints") or ""}))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}/write"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture
def server_factory() -> Iterator[Any]:
    made: list[_Server] = []

    def make(statuses: list[int]) -> _Server:
        made.append(_Server(statuses))
        return made[-1]

    yield make
    for server in made:
        server.close()


async def _until(check: Any) -> None:
    with anyio.fail_after(15):
        while not check():
            await anyio.sleep(0.02)


@pytest.mark.anyio
async def test_push_retries_keeps_order_and_drops_refused_batches(server_factory: Any) -> None:
    server = server_factory([503, 400, 204])
    registry = CollectorRegistry()
    sender = PushSender(PushConfig(url=server.url, database="tf", user="u", password="p", batch_lines=2,
                                   backoff_first_s=0.01), SinkMetrics.of(registry), "t")
    sender.ttl = "30d"
    sender.offer(["a v=1i 1", "b v=1i 2", "c v=1i 3"])
    async with anyio.create_task_group() as tg:
        tg.start_soon(sender.run)
        await _until(lambda: len(server.bodies) == 3 and not len(sender))
        tg.cancel_scope.cancel()
    statuses = [(status, body) for status, body, _ in server.bodies]
    # 503: retried with the same batch; 400: refused for good, dropped; then the rest
    assert statuses == [(503, "a v=1i 1\nb v=1i 2"), (400, "a v=1i 1\nb v=1i 2"), (204, "c v=1i 3")]
    assert server.bodies[0][2] == {"path": "/write?db=tf&precision=ms", "auth": "Basic dTpw", "hints": "ttl=30d"}
    assert registry.get_sample_value("tfusion_metrics_dropped_total", {"role": "t", "reason": "rejected"}) == 2
    assert registry.get_sample_value("tfusion_metrics_lines_total", {"role": "t", "sink": "push"}) == 1
    assert registry.get_sample_value("tfusion_metrics_push_errors_total", {"role": "t"}) == 1


@pytest.mark.anyio
async def test_a_full_buffer_drops_the_oldest_and_never_blocks() -> None:
    registry = CollectorRegistry()
    sender = PushSender(PushConfig(url=f"http://127.0.0.1:{closed_port()}/write", buffer_lines=5,
                                   backoff_first_s=0.01, backoff_max_s=0.05), SinkMetrics.of(registry), "t")
    async with anyio.create_task_group() as tg:
        tg.start_soon(sender.run)
        for i in range(8):
            sender.offer([f"m v={i}i {i}"])
        await _until(lambda: sender.failures >= 2)
        tg.cancel_scope.cancel()
    assert list(sender._buffer) == [f"m v={i}i {i}" for i in range(3, 8)]
    assert registry.get_sample_value("tfusion_metrics_dropped_total", {"role": "t", "reason": "buffer_full"}) == 3
    assert registry.get_sample_value("tfusion_metrics_push_buffered_lines", {"role": "t"}) == 5
    assert "ConnectError" in sender.last_error


# --- what the controller reads from a worker pod ------------------------------------------------------

def test_a_worker_row_from_its_pod() -> None:
    from datetime import UTC, datetime

    from tfusion.api import annotations as tfa
    from tfusion.controller.metrics import is_billable, worker_row

    row = worker_row(Pod(worker_pod(**{tfa.EVICTION_PROTECTION: "1h", tfa.QOS: "high"})), None)
    assert row is not None
    assert (row.namespace, row.pod, row.pool, row.qos, row.workload, row.node, row.gpus) == \
        ("ns", "w", "p", "high", "wl", "n", ("g1", "g2"))
    # without a limit (and no allocator to say the GPU's size) the limit is the request
    assert row.share == cost.WorkerShare(10.0, 10.0, 4 * GIB, 4 * GIB, 2, "high")
    created = datetime(2025, 1, 31, 12, tzinfo=UTC).timestamp()
    assert row.protected_until == created + 3600
    assert is_billable(Pod(worker_pod()))
    finished = worker_pod()
    finished["status"]["phase"] = "Succeeded"
    assert not is_billable(Pod(finished))
    assert worker_row(Pod(worker_pod(**{tfa.GPU_IDS: ",,"})), None) is None  # unreadable annotations: no row
    assert worker_row(Pod(worker_pod(**{tfa.VRAM_REQUEST: "lots"})), None) is None


@pytest.mark.anyio
async def test_output_writes_json_lines_to_the_file(tmp_path: Path) -> None:
    output = MetricsOutput(role="t", registry=CollectorRegistry(), file=RotatingFile(tmp_path / "m.log"), fmt="json")
    await output.emit([Point("tf_pool_metrics", {"pool": "p"}, {"gpu_count": 3}, 5)])
    assert json.loads((tmp_path / "m.log").read_text()) == {"measure": "tf_pool_metrics", "tag": {"pool": "p"},
                                                           "field": {"gpu_count": 3}, "ts": 5}


def test_metrics_ttl_reaches_the_file_and_the_push() -> None:
    output = MetricsOutput(role="t", registry=CollectorRegistry(), file=RotatingFile(Path("unused.log")),
                           push=PushConfig(url="http://127.0.0.1:1/write"))
    assert output.file is not None and output.sender is not None
    output.set_ttl("7d")
    assert (output.file.ttl_s, output.sender.ttl) == (7 * 86400, "7d")
    output.set_ttl("soon")
    assert (output.file.ttl_s, output.sender.ttl) == (None, "")
