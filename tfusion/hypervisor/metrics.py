"""Device and worker usage: Prometheus gauges on /metrics and the original's metrics file.

Both come from the same samples (the registry's last metrics and process lists). The file holds
`tf_gpu_usage` and `tf_worker_usage` lines in influx line protocol with millisecond timestamps
(or one JSON object per line with TF_HYPERVISOR_METRICS_FORMAT=json), which a vector sidecar ships
to GreptimeDB, as upstream does.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from tfusion.hypervisor.devices.registry import DeviceRegistry
from tfusion.hypervisor.workers.tracker import WorkerTracker

log = logging.getLogger(__name__)

ROTATE_BYTES = 100 * 1024 * 1024
ROTATE_KEEP = 10


@dataclass(frozen=True)
class Sample:
    measure: str
    tags: dict[str, str]
    fields: dict[str, float | int]


def gpu_samples(registry: DeviceRegistry, node: str, pool: str) -> list[Sample]:
    metrics = registry.metrics()
    result = []
    for device in registry.devices():
        m = metrics.get(device.uuid)
        if m is None:
            continue
        result.append(Sample("tf_gpu_usage", {"node": node, "pool": pool, "uuid": device.uuid}, {
            "compute_percentage": float(m.utilization_percent),
            "compute_tflops": float(m.utilization_percent) / 100 * device.max_tflops,
            "memory_bytes": int(m.memory_used_bytes),
            "memory_percentage": (m.memory_used_bytes / device.total_memory_bytes * 100
                                  if device.total_memory_bytes else 0.0),
            "power_usage": float(m.power_watts), "rx": int(m.pcie_rx_bytes),
            "temperature": float(m.temperature_celsius), "tx": int(m.pcie_tx_bytes)}))
    return result


def parse_extra_labels(text: str) -> dict[str, str]:
    """TF_HYPERVISOR_METRICS_EXTRA_LABELS: a JSON map of pod annotation key -> extra tag name (the
    direction the original's code uses)."""
    if not text.strip():
        return {}
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"TF_HYPERVISOR_METRICS_EXTRA_LABELS is not JSON: {exc}") from None
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        raise ValueError("TF_HYPERVISOR_METRICS_EXTRA_LABELS must map annotation keys to tag names (strings)")
    return dict(data)


def worker_samples(registry: DeviceRegistry, workers: WorkerTracker, node: str, pool: str,
                   extra_labels: dict[str, str] | None = None) -> list[Sample]:
    allocations = {a.worker.uid: a for a in workers.allocations()}
    sums: dict[tuple[str, str], dict[str, float]] = {}
    for proc in registry.processes():
        uid = workers.worker_for_pid(proc.pid)
        if uid is None or uid not in allocations:
            continue
        entry = sums.setdefault((uid, proc.device_uuid), {"memory_bytes": 0.0, "compute_percentage": 0.0})
        entry["memory_bytes"] += proc.used_memory_bytes
        entry["compute_percentage"] += proc.compute_percent
    result = []
    for uid, allocation in allocations.items():
        worker = allocation.worker
        for device in allocation.devices:
            used = sums.get((uid, device.uuid), {"memory_bytes": 0.0, "compute_percentage": 0.0})
            limit = worker.limits.vram_bytes
            tags = {"namespace": worker.namespace, "node": node, "pod_name": worker.name, "pool": pool,
                    "uuid": device.uuid, "worker": uid, "workload": worker.workload_name or "unknown"}
            for annotation, tag in (extra_labels or {}).items():
                if annotation in worker.annotations and tag not in tags:
                    tags[tag] = worker.annotations[annotation]
            result.append(Sample("tf_worker_usage", tags, {
                "compute_percentage": used["compute_percentage"],
                "compute_tflops": used["compute_percentage"] / 100 * device.max_tflops,
                "memory_bytes": int(used["memory_bytes"]),
                "memory_percentage": used["memory_bytes"] / limit * 100 if limit else 0.0}))
    return result


class UsageCollector(Collector):
    """Builds the gauges at scrape time from the latest samples."""

    def __init__(self, registry: DeviceRegistry, workers: WorkerTracker, node: str, pool: str) -> None:
        self.registry = registry
        self.workers = workers
        self.node = node
        self.pool = pool

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["uuid", "node", "pool", "model"]
        device_gauges = {
            "compute_percentage": GaugeMetricFamily("tf_gpu_utilization_percent", "GPU utilisation", labels=labels),
            "memory_bytes": GaugeMetricFamily("tf_gpu_memory_used_bytes", "GPU memory in use", labels=labels),
            "power_usage": GaugeMetricFamily("tf_gpu_power_watts", "GPU power draw", labels=labels),
            "temperature": GaugeMetricFamily("tf_gpu_temperature_celsius", "GPU temperature", labels=labels),
            "rx": GaugeMetricFamily("tf_gpu_pcie_rx_bytes_per_second", "PCIe receive throughput", labels=labels),
            "tx": GaugeMetricFamily("tf_gpu_pcie_tx_bytes_per_second", "PCIe transmit throughput", labels=labels),
        }
        total = GaugeMetricFamily("tf_gpu_memory_total_bytes", "GPU memory size", labels=labels)
        tflops = GaugeMetricFamily("tf_gpu_capacity_tflops", "GPU fp16 TFLOPS capacity", labels=labels)
        healthy = GaugeMetricFamily("tf_gpu_healthy", "1 when the GPU is healthy", labels=labels)
        models = {}
        for device in self.registry.devices():
            values = [device.uuid, self.node, self.pool, device.model]
            models[device.uuid] = device.model
            total.add_metric(values, device.total_memory_bytes)
            tflops.add_metric(values, device.max_tflops)
            healthy.add_metric(values, 1.0 if device.healthy else 0.0)
        for sample in gpu_samples(self.registry, self.node, self.pool):
            values = [sample.tags["uuid"], self.node, self.pool, models.get(sample.tags["uuid"], "")]
            for key, gauge in device_gauges.items():
                gauge.add_metric(values, float(sample.fields[key]))
        yield from device_gauges.values()
        yield from (total, tflops, healthy)
        wlabels = ["uuid", "node", "pool", "namespace", "pod", "workload", "worker"]
        worker_memory = GaugeMetricFamily("tf_worker_memory_used_bytes", "GPU memory used by a worker's processes",
                                          labels=wlabels)
        worker_compute = GaugeMetricFamily("tf_worker_compute_percent",
                                           "share of the GPU's compute used by a worker", labels=wlabels)
        worker_limit = GaugeMetricFamily("tf_worker_vram_limit_bytes", "a worker's VRAM limit", labels=wlabels)
        worker_tflops_limit = GaugeMetricFamily("tf_worker_tflops_limit", "a worker's TFLOPS limit", labels=wlabels)
        limits = {a.worker.uid: a.worker.limits for a in self.workers.allocations()}
        for sample in worker_samples(self.registry, self.workers, self.node, self.pool):
            t = sample.tags
            values = [t["uuid"], self.node, self.pool, t["namespace"], t["pod_name"], t["workload"], t["worker"]]
            worker_memory.add_metric(values, float(sample.fields["memory_bytes"]))
            worker_compute.add_metric(values, float(sample.fields["compute_percentage"]))
            limit = limits.get(t["worker"])
            if limit is not None:
                worker_limit.add_metric(values, float(limit.vram_bytes))
                worker_tflops_limit.add_metric(values, limit.tflops)
        yield from (worker_memory, worker_compute, worker_limit, worker_tflops_limit)


def register_usage_metrics(prom: CollectorRegistry, registry: DeviceRegistry, workers: WorkerTracker, node: str,
                           pool: str) -> None:
    """Add the per-device and per-worker gauges to the process's registry (the Manager's)."""
    prom.register(UsageCollector(registry, workers, node, pool))


# --- the metrics file ----------------------------------------------------------------------------

def _escape_tag(value: str) -> str:
    return value.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=").replace(" ", "\\ ") or "unknown"


def _field(value: float | int) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value}i"
    return repr(float(value))


def influx_line(sample: Sample, ts_ms: int) -> str:
    tags = ",".join(f"{k}={_escape_tag(v)}" for k, v in sorted(sample.tags.items()))
    fields = ",".join(f"{k}={_field(v)}" for k, v in sorted(sample.fields.items()))
    return f"{sample.measure},{tags} {fields} {ts_ms}"


def json_line(sample: Sample, ts_ms: int) -> str:
    return json.dumps({"measure": sample.measure, "tag": sample.tags, "field": sample.fields, "ts": ts_ms},
                      sort_keys=True)


class MetricsFileWriter:
    """Appends one block of usage lines per interval, rotating the file at 100 MB (10 kept)."""

    def __init__(self, path: Path, registry: DeviceRegistry, workers: WorkerTracker, *, node: str, pool: str,
                 fmt: str = "influx", extra_labels: dict[str, str] | None = None) -> None:
        self.path = path
        self.extra_labels = extra_labels or {}
        self.registry = registry
        self.workers = workers
        self.node = node
        self.pool = pool
        if fmt not in ("influx", "json"):
            log.warning("TF_HYPERVISOR_METRICS_FORMAT=%s is not supported; writing influx line protocol", fmt)
            fmt = "influx"
        self.fmt = fmt

    def lines(self, ts_ms: int | None = None) -> list[str]:
        ts = int(time.time() * 1000) if ts_ms is None else ts_ms
        render = influx_line if self.fmt == "influx" else json_line
        samples = [*gpu_samples(self.registry, self.node, self.pool),
                   *worker_samples(self.registry, self.workers, self.node, self.pool, self.extra_labels)]
        return [render(s, ts) for s in samples]

    def write_once(self) -> int:
        lines = self.lines()
        if not lines:
            return 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._rotate_if_needed()
        with open(self.path, "a", encoding="utf-8") as out:
            out.write("\n".join(lines) + "\n")
        return len(lines)

    def _rotate_if_needed(self) -> None:
        try:
            if self.path.stat().st_size < ROTATE_BYTES:
                return
        except FileNotFoundError:
            return
        for i in range(ROTATE_KEEP - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{i}")
            if older.exists():
                older.replace(self.path.with_name(f"{self.path.name}.{i + 1}"))
        self.path.replace(self.path.with_name(f"{self.path.name}.1"))

    async def run(self, interval: float) -> None:
        while True:
            await anyio.sleep(interval)
            await self.registry.sample()
            try:
                await anyio.to_thread.run_sync(self.write_once)
            except OSError as exc:
                log.warning("cannot write metrics to %s: %s", self.path, exc)


def describe(sample: Sample) -> dict[str, Any]:
    return {"measure": sample.measure, "tags": sample.tags, "fields": sample.fields}
