"""The tables' facts as Prometheus gauges and counters, for /metrics on both roles.

Why: the design card has Prometheus scrape both roles; the same points the tables get become
metric families named by Prometheus conventions: a `tfusion_` prefix, base units in the name
(`_tflops`, `_bytes`, `_watts`, `_celsius`), percentages as 0-1 `_ratio`s, counters ending in
`_total`. Labels are bounded: pool, node, gpu, model, namespace, pod, workload, qos, result. No UID
and no timestamp is ever a label (so `tf_gpu_allocation`, keyed by pod UID, has no family here;
`tfusion_worker_gpus` says the same).

A `MetricSpec` maps one field of one table to one family; `families(points, specs)` turns a tick's
points into families. The controller's collector reads the last tick of its recorder
(controller/metrics.py; only the leader records, so a follower exports none of these); the
hypervisor's builds its points at scrape time.
Each collector's `describe()` names its families, so the shared registry refuses a clash at startup.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from tfusion.metrics import tables as t
from tfusion.metrics.points import Point


@dataclass(frozen=True)
class MetricSpec:
    """Field `field` of table `measure` as the family `name`; `labels` maps label -> tag; `scale`
    multiplies the value (0.01 turns a percentage into a ratio)."""

    measure: str
    field: str
    name: str
    help: str
    labels: tuple[tuple[str, str], ...]
    scale: float = 1.0
    counter: bool = False


def _specs(measure: str, labels: dict[str, str], rows: Sequence[tuple[str, str, str, float]],
           ) -> list[MetricSpec]:
    return [MetricSpec(measure, f, name, text, tuple(labels.items()), scale) for f, name, text, scale in rows]


_WORKER_LABELS = {"namespace": "namespace", "pod": "worker", "workload": "workload", "pool": "pool", "qos": "qos"}
_NODE_LABELS = {"node": "node", "pool": "pool"}
_POOL_LABELS = {"pool": "pool"}
_GPU_LABELS = {"gpu": "gpu", "node": "node", "pool": "pool", "model": "gpu_model"}
_PCT = 0.01

CONTROLLER_SPECS: list[MetricSpec] = [
    *_specs(t.WORKER_TABLE, _WORKER_LABELS, [
        ("tflops_request", "tfusion_worker_tflops_request", "TFLOPS a worker requests per GPU", 1.0),
        ("tflops_limit", "tfusion_worker_tflops_limit", "TFLOPS a worker may use per GPU", 1.0),
        ("vram_bytes_request", "tfusion_worker_vram_request_bytes", "VRAM a worker requests per GPU", 1.0),
        ("vram_bytes_limit", "tfusion_worker_vram_limit_bytes", "VRAM a worker may use per GPU", 1.0),
        ("gpu_count", "tfusion_worker_gpus", "GPUs a worker holds", 1.0),
        ("tflops_recommended", "tfusion_worker_tflops_recommended",
         "TFLOPS per GPU the autoscaler recommends for a worker's workload", 1.0),
        ("vram_bytes_recommended", "tfusion_worker_vram_recommended_bytes",
         "VRAM per GPU the autoscaler recommends for a worker's workload", 1.0),
        ("ready", "tfusion_worker_ready", "1 when the worker pod is Ready", 1.0)]),
    *_specs(t.NODE_TABLE, _NODE_LABELS, [
        ("allocated_tflops", "tfusion_node_allocated_tflops", "TFLOPS allocated on a node's GPUs", 1.0),
        ("allocated_vram_bytes", "tfusion_node_allocated_vram_bytes", "VRAM allocated on a node's GPUs", 1.0),
        ("allocated_tflops_percent", "tfusion_node_allocated_tflops_ratio",
         "allocated / physical TFLOPS of a node", _PCT),
        ("allocated_vram_percent", "tfusion_node_allocated_vram_ratio", "allocated / physical VRAM of a node", _PCT),
        ("allocated_tflops_percent_virtual", "tfusion_node_allocated_tflops_virtual_ratio",
         "allocated / virtual (oversold) TFLOPS of a node", _PCT),
        ("allocated_vram_percent_virtual", "tfusion_node_allocated_vram_virtual_ratio",
         "allocated / virtual (expanded) VRAM of a node", _PCT),
        ("gpu_count", "tfusion_node_gpus", "GPUs a node reports", 1.0)]),
    *_specs(t.POOL_TABLE, _POOL_LABELS, [
        ("allocated_tflops", "tfusion_pool_allocated_tflops", "TFLOPS allocated in a pool", 1.0),
        ("allocated_vram_bytes", "tfusion_pool_allocated_vram_bytes", "VRAM allocated in a pool", 1.0),
        ("allocated_tflops_percent", "tfusion_pool_allocated_tflops_ratio", "allocated / physical TFLOPS", _PCT),
        ("allocated_vram_percent", "tfusion_pool_allocated_vram_ratio", "allocated / physical VRAM", _PCT),
        ("allocated_tflops_percent_virtual", "tfusion_pool_allocated_tflops_virtual_ratio",
         "allocated / virtual TFLOPS", _PCT),
        ("allocated_vram_percent_virtual", "tfusion_pool_allocated_vram_virtual_ratio",
         "allocated / virtual VRAM", _PCT),
        ("limited_tflops", "tfusion_pool_limited_tflops", "sum of the workers' TFLOPS limits in a pool", 1.0),
        ("limited_vram_bytes", "tfusion_pool_limited_vram_bytes", "sum of the workers' VRAM limits in a pool", 1.0),
        ("limited_tflops_percent_virtual", "tfusion_pool_limited_tflops_virtual_ratio",
         "TFLOPS limits / virtual TFLOPS", _PCT),
        ("limited_vram_percent_virtual", "tfusion_pool_limited_vram_virtual_ratio", "VRAM limits / virtual VRAM",
         _PCT),
        ("gpu_count", "tfusion_pool_gpus", "GPUs in a pool", 1.0)]),
    *_specs(t.GPU_TABLE, _GPU_LABELS, [
        ("capacity_tflops", "tfusion_gpu_capacity_tflops", "a GPU's FP16 TFLOPS", 1.0),
        ("capacity_vram_bytes", "tfusion_gpu_capacity_vram_bytes", "a GPU's VRAM", 1.0),
        ("available_tflops", "tfusion_gpu_available_tflops", "TFLOPS not allocated on a GPU", 1.0),
        ("available_vram_bytes", "tfusion_gpu_available_vram_bytes", "VRAM not allocated on a GPU", 1.0),
        ("allocated_tflops", "tfusion_gpu_allocated_tflops", "TFLOPS allocated on a GPU", 1.0),
        ("allocated_vram_bytes", "tfusion_gpu_allocated_vram_bytes", "VRAM allocated on a GPU", 1.0),
        ("allocated_tflops_percent", "tfusion_gpu_allocated_tflops_ratio", "allocated / capacity TFLOPS", _PCT),
        ("allocated_vram_percent", "tfusion_gpu_allocated_vram_ratio", "allocated / capacity VRAM", _PCT)]),
    *_specs(t.SYSTEM_TABLE, _POOL_LABELS, [
        ("total_workers_cnt", "tfusion_pool_workers", "worker pods holding GPUs in a pool", 1.0),
        ("total_nodes_cnt", "tfusion_pool_nodes", "GPU nodes in a pool", 1.0)]),
]

_DEVICE_LABELS = {"gpu": "uuid", "node": "node", "pool": "pool"}
_USAGE_LABELS = {"gpu": "uuid", "node": "node", "pool": "pool", "namespace": "namespace", "pod": "pod_name",
                 "workload": "workload"}

HYPERVISOR_SPECS: list[MetricSpec] = [
    *_specs(t.GPU_USAGE_TABLE, _DEVICE_LABELS, [
        ("compute_percentage", "tfusion_gpu_compute_utilization_ratio", "share of a GPU's compute in use", _PCT),
        ("compute_tflops", "tfusion_gpu_compute_used_tflops", "TFLOPS in use on a GPU", 1.0),
        ("memory_bytes", "tfusion_gpu_memory_used_bytes", "GPU memory in use", 1.0),
        ("memory_percentage", "tfusion_gpu_memory_utilization_ratio", "share of a GPU's memory in use", _PCT),
        ("power_usage", "tfusion_gpu_power_watts", "GPU power draw", 1.0),
        ("temperature", "tfusion_gpu_temperature_celsius", "GPU temperature", 1.0),
        ("rx", "tfusion_gpu_pcie_rx_bytes_per_second", "PCIe receive throughput", 1.0),
        ("tx", "tfusion_gpu_pcie_tx_bytes_per_second", "PCIe transmit throughput", 1.0)]),
    *_specs(t.WORKER_USAGE_TABLE, _USAGE_LABELS, [
        ("compute_percentage", "tfusion_worker_compute_utilization_ratio",
         "share of a GPU's compute a worker's processes use", _PCT),
        ("compute_tflops", "tfusion_worker_compute_used_tflops", "TFLOPS a worker's processes use", 1.0),
        ("memory_bytes", "tfusion_worker_memory_used_bytes", "GPU memory a worker's processes use", 1.0),
        ("memory_percentage", "tfusion_worker_memory_utilization_ratio",
         "a worker's GPU memory use / its VRAM limit", _PCT)]),
]


def families(points: Iterable[Point], specs: Sequence[MetricSpec]) -> list[Metric]:
    """One family per spec, with a sample per point of its table that has the field. A point's
    label values are read once for all the families that share its labels, and their samples
    share one dict of them; when two rows carry the same labels (one GPU on two nodes), the first
    one's samples are kept. At 100,000 workers (six families each) this runs at every tick: each
    sample is one tuple, no per-sample lookups (add_metric per sample took 3.7 s, the loop over
    specs per sample 2.4 s, this 1.2 s)."""
    out: dict[str, Metric] = {}
    for spec in specs:
        label_names = [label for label, _ in spec.labels]
        out[spec.name] = (CounterMetricFamily if spec.counter else GaugeMetricFamily)(
            spec.name, spec.help, labels=label_names)
    plans = _plans(specs, out)
    for point in points:
        for plan in plans.get(point.measure, ()):
            tags, fields = point.tags, point.fields
            values = tuple([str(tags.get(tag, "")) for tag in plan.tags])
            if values in plan.seen:
                continue
            plan.seen.add(values)
            labels = dict(zip(plan.names, values, strict=True))
            for field_name, name, scale, samples in plan.families:
                value = fields.get(field_name)
                if value is not None and not isinstance(value, str):
                    samples.append(_sample(name, labels, float(value) * scale))
    return list(out.values())


#: a Sample's fields after name, labels and value, at their defaults (timestamp, exemplar, ...)
_SAMPLE_DEFAULTS = tuple(Sample._field_defaults[name] for name in Sample._fields[3:])


def _sample(name: str, labels: dict[str, str], value: float) -> Sample:
    """`Sample(name, labels, value)` without the keyword handling of a NamedTuple's constructor."""
    return tuple.__new__(Sample, (name, labels, value, *_SAMPLE_DEFAULTS))


@dataclass
class _Plan:
    """The families of one table that share one set of labels: the label names, the tags they are
    read from, and per family (field, family name, scale, the family's samples); `seen`: the label
    values already written."""

    names: tuple[str, ...]
    tags: tuple[str, ...]
    families: list[tuple[str, str, float, list[Sample]]] = field(default_factory=list)
    seen: set[tuple[str, ...]] = field(default_factory=set)


def _plans(specs: Sequence[MetricSpec], out: Mapping[str, Metric]) -> dict[str, list[_Plan]]:
    plans: dict[str, dict[tuple[tuple[str, str], ...], _Plan]] = {}
    for spec in specs:
        by_labels = plans.setdefault(spec.measure, {})
        plan = by_labels.get(spec.labels)
        if plan is None:
            plan = by_labels[spec.labels] = _Plan(tuple(label for label, _ in spec.labels),
                                                  tuple(tag for _, tag in spec.labels))
        family = out[spec.name]
        # a counter's samples are named as add_metric names them: the family's name and "_total"
        plan.families.append((spec.field, f"{family.name}_total" if spec.counter else spec.name, spec.scale,
                              family.samples))
    return {measure: list(by_labels.values()) for measure, by_labels in plans.items()}


def _empty(specs: Sequence[MetricSpec], extra: Iterable[Metric] = ()) -> list[Metric]:
    return [*families([], specs), *extra]


#: the tables whose rows become Prometheus families (the others are only written to the sinks)
EXPORTED_TABLES = frozenset(spec.measure for spec in CONTROLLER_SPECS)


@dataclass
class Snapshot:
    """One tick's points of the exported tables, and the cumulative costs the Prometheus counters
    show. Rows of other tables are dropped on the way in: the allocation table has a row per
    worker, which /metrics never shows and a snapshot would keep alive until the next tick."""

    points: list[Point] = field(default_factory=list)
    worker_cost_total: dict[tuple[str, str, str, str, str], float] = field(default_factory=dict)
    node_cost_total: dict[tuple[str, str], float] = field(default_factory=dict)
    #: the families of the points and costs, made once (`bake`) rather than at every scrape
    baked: list[Metric] | None = None

    def __post_init__(self) -> None:
        self.points = [p for p in self.points if p.measure in EXPORTED_TABLES]

    def bake(self) -> Snapshot:
        """Make the families now. A pure function of the snapshot, which nothing changes once made:
        the recorder runs it in a worker thread when the first scrape after a tick asks (at 100,000
        workers it is seconds of CPU, which at each scrape on the event loop came close to the
        Lease's renew deadline)."""
        self.baked = [*families(self.points, CONTROLLER_SPECS), *_cost_families(self)]
        return self


def _cost_families(snapshot: Snapshot) -> list[Metric]:
    worker = CounterMetricFamily("tfusion_worker_cost", "a worker's raw cost since this leader began "
                                 "billing it (the pool's QoS pricing, in its currency)",
                                 labels=["namespace", "pod", "workload", "pool", "qos"])
    names = ("namespace", "pod", "workload", "pool", "qos")
    worker.samples = [_sample("tfusion_worker_cost_total", dict(zip(names, labels, strict=True)), total)
                      for labels, total in sorted(snapshot.worker_cost_total.items())]
    node = CounterMetricFamily("tfusion_node_cost", "a node's raw cost (its GPUs' costPerHour) since this "
                               "leader began billing it", labels=["node", "pool"])
    for node_labels, total in sorted(snapshot.node_cost_total.items()):
        node.add_metric(list(node_labels), total)
    return [worker, node]


class ControllerCollector(Collector):
    """The controller's families from the recorder's last tick (`snapshot()`), plus the cumulative
    cost counters and the scheduler's placements by pool and result (`tally()`)."""

    def __init__(self, snapshot: Callable[[], Snapshot], tally: Callable[[], Mapping[tuple[str, bool], int]]) -> None:
        self.snapshot = snapshot
        self.tally = tally

    def _allocations(self) -> Metric:
        allocations = CounterMetricFamily("tfusion_pool_allocations", "GPU placements by the scheduler, by pool "
                                          "and result (success, failure)", labels=["pool", "result"])
        for (pool, ok), count in sorted(self.tally().items()):
            allocations.add_metric([pool, "success" if ok else "failure"], float(count))
        return allocations

    def describe(self) -> Iterator[Metric]:
        yield from _empty(CONTROLLER_SPECS, self._empty_costs())

    @staticmethod
    def _empty_costs() -> list[Metric]:
        return [CounterMetricFamily("tfusion_worker_cost", "", labels=[]),
                CounterMetricFamily("tfusion_node_cost", "", labels=[]),
                CounterMetricFamily("tfusion_pool_allocations", "", labels=[])]

    def collect(self) -> Iterator[Metric]:
        snapshot = self.snapshot()
        if snapshot.baked is None:  # made without the recorder's tick (an empty one, a test's)
            snapshot.bake()
        yield from snapshot.baked or ()
        yield self._allocations()


def register_controller_metrics(registry: CollectorRegistry, snapshot: Callable[[], Snapshot],
                                tally: Callable[[], Mapping[tuple[str, bool], int]]) -> None:
    registry.register(ControllerCollector(snapshot, tally))


class PointsCollector(Collector):
    """Families built at scrape time from `build()`'s points (the hypervisor's usage samples), plus
    any extra families `extra()` gives."""

    def __init__(self, build: Callable[[], Sequence[Point]], specs: Sequence[MetricSpec],
                 extra: Callable[[], Iterable[Metric]] = lambda: (), extra_names: Mapping[str, str] | None = None,
                 ) -> None:
        self.build = build
        self.specs = specs
        self.extra = extra
        self.extra_names = dict(extra_names or {})

    def describe(self) -> Iterator[Metric]:
        yield from _empty(self.specs, (GaugeMetricFamily(name, text) for name, text in self.extra_names.items()))

    def collect(self) -> Iterator[Metric]:
        yield from families(self.build(), self.specs)
        yield from self.extra()
