"""The autoscaler's usage sources against real servers: a real hypervisor's `GET /api/v1/usage`
(local backend, simulated devices with a scripted load; and reached through a controller runtime's
Running GPUNode and Node InternalIP), a real influxd holding known `tf_worker_usage` points, and a
real Prometheus scraping a small exporter at 1 s. A test whose server binary is missing skips,
saying so.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.apiserver_fixture import apply_crds
from tests.helpers import eventually
from tests.helpers.controller import controllers, kube_client, settings_for, start_controller
from tests.helpers.hypervisor_process import free_port
from tests.helpers.local_hypervisor import GIB, gpunode_at, hypervisor, worker_with_load
from tests.helpers.metrics_servers import (
    DATABASE,
    INFLUXD,
    INFLUXD_MISSING,
    PROMETHEUS,
    PROMETHEUS_MISSING,
    Influx,
    Prometheus,
)
from tfusion.controller.autoscaler.sources import (
    MAX_POINTS,
    HypervisorUsage,
    InfluxUsage,
    PrometheusUsage,
    UsageSample,
    UsageSourceError,
    prometheus_step,
    usage_source,
)
from tfusion.controller.role import ControllerRole
from tfusion.kube import resources as r

pytestmark = pytest.mark.anyio

H100_TFLOPS = 989


# --- hypervisor -----------------------------------------------------------------------------------

async def test_the_usage_route_lists_each_worker_gpu_from_the_worker_samples(tmp_path: Path) -> None:
    async with hypervisor(tmp_path) as http:
        uid, h100 = await worker_with_load(http, tmp_path)
        body = (await http.get("/api/v1/usage")).json()
        assert body["node"] == "box-1" and body["at"] > 0
        assert body["data"] == [{"namespace": "default", "pod": "trainer", "worker": uid, "workload": "trainer",
                                 "gpu": h100, "compute_tflops": pytest.approx(0.4 * H100_TFLOPS),
                                 "memory_bytes": 3 * GIB}]
        document = (await http.get("/schema/openapi.json")).json()
        assert "/api/v1/usage" in document["paths"]


async def test_the_hypervisor_source_reads_every_node_and_skips_an_unreachable_one(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    async with hypervisor(tmp_path) as http:
        _, h100 = await worker_with_load(http, tmp_path)
        base = str(http.base_url).rstrip("/")
        source = HypervisorUsage(lambda: {"box-1": base, "gone": dead}, timeout_s=2.0)
        assert (source.name, source.keeps_history) == ("hypervisor", False)
        before = time.time()
        (sample,) = await source.samples(before - 60, before)
        assert before <= sample.at <= time.time()
        assert (sample.namespace, sample.workload, sample.worker, sample.gpu) == ("default", "trainer", "trainer", h100)
        assert sample.tflops_milli == pytest.approx(0.4 * H100_TFLOPS * 1000)
        assert sample.vram_bytes == 3 * GIB

        with pytest.raises(UsageSourceError, match=r"no hypervisor answered.*gone.*cannot reach"):
            await HypervisorUsage(lambda: {"gone": dead}).samples(0, 1)
        wrong = HypervisorUsage(lambda: {"box-1": f"{base}/api/v1/devices#"})
        with pytest.raises(UsageSourceError, match="unexpected answer"):
            await wrong.samples(0, 1)
    assert await HypervisorUsage(lambda: {}).samples(0, 1) == [], "no node: nothing measured, not an error"


async def test_the_default_source_finds_hypervisors_through_running_gpunodes(apiserver: Any, tmp_path: Path) -> None:
    """usage_source() with the default settings: the controller runtime's informers name the Running
    GPUNode, its Node's InternalIP and --port lead to the real hypervisor; a GPUNode not Running is
    not asked."""
    await apply_crds(apiserver)
    state = tmp_path / "hv"
    state.mkdir()
    async with hypervisor(state) as http, kube_client(apiserver) as kube, controllers() as tg:
        await worker_with_load(http, state)
        port = http.base_url.port
        assert port is not None
        for name, phase in (("box-1", "Running"), ("box-2", "Pending")):
            await gpunode_at(kube, name, "127.0.0.1", phase)

        def no_services(_runtime: ControllerRole) -> None:
            """Only the runtime's informers: no reconciler rewrites the GPUNodes' phases."""

        settings = settings_for(apiserver, tmp_path, hypervisor_port=port)
        ctl = await start_controller(tg, settings, prepare=no_services)
        source = usage_source(settings, ctl.runtime)
        assert source.name == "hypervisor"

        async def both_nodes_seen() -> list[UsageSample] | None:
            if len(ctl.runtime.informer(r.GPUNODES).list()) < 2 or len(ctl.runtime.informer(r.NODES).list()) < 2:
                return None
            return await source.samples(0, time.time())

        samples = await eventually(both_nodes_seen, what="the informers holding both GPUNodes")
        assert [(s.workload, s.worker, s.vram_bytes) for s in samples] == [("trainer", "trainer", 3 * GIB)]
        await ctl.stop()


# --- InfluxDB 1.x ---------------------------------------------------------------------------------

@pytest.fixture
def influx(tmp_path: Path) -> Iterator[Influx]:
    if INFLUXD is None:
        pytest.skip(INFLUXD_MISSING)
    server = Influx(tmp_path / "influx")
    server.start()
    yield server
    server.kill()


def _usage_line(at_ms: int, *, workload: str, pod: str, gpu: str, tflops: float, memory: int,
                namespace: str = "team-a") -> str:
    """A tf_worker_usage point as the hypervisor pushes it (all its tags and fields)."""
    return (f"tf_worker_usage,namespace={namespace},node=n1,pod_name={pod},pool=p,uuid={gpu},worker=uid-{pod},"
            f"workload={workload} compute_percentage=1,compute_tflops={tflops},memory_bytes={memory}i,"
            f"memory_percentage=2 {at_ms}")


async def test_influx_source_returns_exactly_the_points_in_the_range(influx: Influx) -> None:
    influx.query(f"CREATE DATABASE {DATABASE}")
    now_ms = int(time.time() * 1000)
    since_ms, until_ms = now_ms - 300_000, now_ms - 60_000
    wanted = []
    lines = []
    for minute in range(5):  # over the last minutes, two workers, one of them on two GPUs
        at = since_ms + 1 + minute * 50_000
        for pod, gpu, tflops, memory in (("a-0", "gpu-1", 10.5, 2 * GIB), ("a-0", "gpu-2", 11.0, GIB),
                                         ("b-0", "gpu-1", 0.25, 512 * 1024 ** 2)):
            workload = pod.split("-")[0] + "-job"
            lines.append(_usage_line(at, workload=workload, pod=pod, gpu=gpu, tflops=tflops, memory=memory))
            wanted.append(UsageSample(at=at / 1000, namespace="team-a", workload=workload, worker=pod,
                                      tflops_milli=tflops * 1000, vram_bytes=float(memory), gpu=gpu))
    outside = [_usage_line(since_ms, workload="a-job", pod="a-0", gpu="gpu-1", tflops=99, memory=1),  # == since
               _usage_line(until_ms + 1, workload="a-job", pod="a-0", gpu="gpu-1", tflops=99, memory=1),
               _usage_line(since_ms + 10, workload="unknown", pod="bare", gpu="gpu-1", tflops=5, memory=1)]
    last = _usage_line(until_ms, workload="a-job", pod="a-0", gpu="gpu-1", tflops=7, memory=3)  # == until: in
    wanted.append(UsageSample(at=until_ms / 1000, namespace="team-a", workload="a-job", worker="a-0",
                              tflops_milli=7000.0, vram_bytes=3.0, gpu="gpu-1"))
    influx.write("\n".join([*lines, *outside, last]))

    source = InfluxUsage(influx.url, DATABASE)
    assert (source.name, source.keeps_history) == ("influxdb", True)
    got = await source.samples(since_ms / 1000, until_ms / 1000)
    key = lambda s: (s.at, s.worker, s.gpu)  # noqa: E731
    assert sorted(got, key=key) == sorted(wanted, key=key)

    with pytest.raises(UsageSourceError, match=r"database.*not found"):
        await InfluxUsage(influx.url, "nope").samples(since_ms / 1000, until_ms / 1000)
    with pytest.raises(UsageSourceError, match="cannot reach"):
        await InfluxUsage(f"http://127.0.0.1:{free_port()}", DATABASE).samples(0, 1)


# --- Prometheus -----------------------------------------------------------------------------------

_LABELS = {("a-0", "gpu-1", "a-job"): (12.5, 2147483648), ("a-0", "gpu-2", "a-job"): (3, 1048576),
           ("bare", "gpu-1", "unknown"): (9, 7)}


def _exposition() -> str:
    """The two families as a hypervisor's /metrics shows them: a worker on two GPUs, one without a workload."""
    lines = []
    for index, name in enumerate(("tfusion_worker_compute_used_tflops", "tfusion_worker_memory_used_bytes")):
        lines.append(f"# TYPE {name} gauge")
        for (pod, gpu, workload), values in _LABELS.items():
            lines.append(f'{name}{{gpu="{gpu}",namespace="team-a",node="n1",pod="{pod}",pool="p",'
                         f'workload="{workload}"}} {values[index]}')
    return "\n".join(lines) + "\n"


EXPOSITION = _exposition()


class _Exporter(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = EXPOSITION.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def _serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """`host:port` of a small HTTP server in a thread, for the life of the block."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def exporter() -> Iterator[str]:
    with _serving(_Exporter) as address:
        yield address


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Prometheus]:
    if PROMETHEUS is None:
        pytest.skip(PROMETHEUS_MISSING)
    servers = Prometheus(tmp_path)
    yield servers
    servers.stop()


async def test_prometheus_source_joins_the_two_series_over_the_range(prometheus: Prometheus, exporter: str) -> None:
    # the same exporter under two jobs, as --role=all's controller also shows the hypervisor's families
    url = prometheus.start({"hypervisor": exporter, "controller": exporter}, scrape_interval="1s")
    source = PrometheusUsage(url)
    assert (source.name, source.keeps_history) == ("prometheus", True)
    started = time.time()

    async def ten_seconds_of_history() -> list[UsageSample] | None:
        samples = await source.samples(started - 5, time.time())
        return samples if len({s.at for s in samples}) >= 10 else None

    await eventually(ten_seconds_of_history, timeout=60, what="ten seconds of scraped usage")
    since, until = started - 5, time.time()
    samples = await source.samples(since, until)
    times = sorted({s.at for s in samples})
    assert all(since < at <= until for at in times)
    assert all(b - a == pytest.approx(prometheus_step(since, until)) for a, b in itertools.pairwise(times))
    by_gpu: dict[str, list[UsageSample]] = {}
    for sample in samples:
        by_gpu.setdefault(sample.gpu, []).append(sample)
    assert set(by_gpu) == {"gpu-1", "gpu-2"}, "the worker without a workload is skipped"
    for gpu, tflops, memory in (("gpu-1", 12.5, 2 * GIB), ("gpu-2", 3.0, 1024 ** 2)):
        rows = by_gpu[gpu]
        assert len(rows) == len({s.at for s in rows}), "one row per time, not one per scraping job"
        assert {(s.namespace, s.workload, s.worker, s.tflops_milli, s.vram_bytes) for s in rows} == {
            ("team-a", "a-job", "a-0", tflops * 1000, float(memory))}

    # a long range is read at a coarser step: never more than MAX_POINTS points per series
    long = await source.samples(until - 7 * 86400, until)
    per_gpu = [s for s in long if s.gpu == "gpu-1"]
    assert 0 < len(per_gpu) <= MAX_POINTS
    with pytest.raises(UsageSourceError, match="cannot reach"):
        await PrometheusUsage(f"http://127.0.0.1:{free_port()}").samples(0, 1)
    with pytest.raises(UsageSourceError, match="404"):
        await PrometheusUsage(f"{url}/nothing").samples(0, 1)


async def test_a_slow_server_fails_within_the_timeout() -> None:
    """A server that accepts and never answers: UsageSourceError after the timeout, not a hang."""
    import socket

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        with anyio.fail_after(10), pytest.raises(UsageSourceError, match=r"did not answer within 0\.5 s"):
            await InfluxUsage(url, DATABASE, timeout_s=0.5).samples(0, 1)


class _Flood(BaseHTTPRequestHandler):
    """Answers any POST with a JSON document larger than the test's cap."""

    def do_POST(self) -> None:
        body = b'{"status": "success", "padding": "' + b"x" * 100_000 + b'"}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


async def test_an_answer_over_the_size_cap_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from tfusion.controller.autoscaler import sources

    monkeypatch.setattr(sources, "MAX_RESPONSE_BYTES", 10_000)
    with _serving(_Flood) as address:
        with pytest.raises(UsageSourceError, match=r"answered more than 10000 bytes"):
            await PrometheusUsage(f"http://{address}").samples(0, 60)
        with pytest.raises(UsageSourceError, match=r"answered more than 10000 bytes"):
            await InfluxUsage(f"http://{address}", DATABASE).samples(0, 60)
