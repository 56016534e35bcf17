"""`benchmarks/allocator.py --path partitioned`: MIG partitions on a cluster of A100-80GB GPUs.

Cluster: `--nodes` nodes of 8 A100-SXM4-80GB GPUs each (312 TFLOPS / 80Gi), partition templates
from the shipped NVIDIA ProviderConfig (deploy/overlays/defaults/providerconfig.yaml). Pods ask
`isolation: partitioned` with a `partition-id`, cycling 1g.10gb x4, 2g.20gb x2, 3g.40gb, 4g.40gb,
and every 10th pod names no template but 15Gi of VRAM (the original's score picks 2g.20gb).

Timed per pod: what the built-in scheduler does (`select`, `assume`, `commit`), requests parsed
before timing. The cluster is first filled to `fill` (80%) of its compute slices (a GPU has 7: a
1g slice is 1, 2g 2, 3g 3, 4g 4, 7g 7), then `ops` operations alternate: above the fill a random
live pod is released, below it a new pod is placed. Fragmentation: the share of refused placements
for which some single GPU still had enough free slices (memory and compute) for the template,
i.e. refused by slot geometry or limits alone (`refused_with_room_on_a_gpu`), and the share refused
although the cluster as a whole had enough free slices (`refused_with_room_in_cluster`). The same
operations are replayed with the original's first-fit slot choice for comparison (`first_fit`).
`stranded_slices_share`: at the end, the share of free compute slices on GPUs where not even a
1g.10gb slice fits any more (a free slot 7 alone, or memory or maxPartitions exhausted).
"""

from __future__ import annotations

import gc
import random
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from tfusion.allocator import AllocRequest, GpuAllocator, GpuInfo, Unschedulable, partitions, request_from_pod
from tfusion.api import annotations as tfa
from tfusion.api.accessors import Pod

GIB = 1 << 30
GPUS_PER_NODE = 8
MODEL = "A100-SXM4-80GB"
POOL = "default-pool"
SHIPPED = Path(__file__).resolve().parents[1] / "deploy/overlays/defaults/providerconfig.yaml"
SHAPES = ("1g.10gb", "1g.10gb", "2g.20gb", "1g.10gb", "3g.40gb", "2g.20gb", "1g.10gb", "4g.40gb", "1g.10gb")
SLICES = {"nv-80g-1g-10gb": 1, "nv-80g-2g-20gb": 2, "nv-80g-3g-40gb": 3, "nv-80g-4g-40gb": 4, "nv-80g-7g-80gb": 7}
BY_NAME = {"1g.10gb": 1, "2g.20gb": 2, "3g.40gb": 3, "4g.40gb": 4, "7g.80gb": 7, "": 2}
TARGET_MEDIAN_US = 200.0
TARGET_P99_MS = 2.0


def build(nodes: int) -> GpuAllocator:
    catalog, problems = partitions.catalog_from_providers([("nvidia", yaml.safe_load(SHIPPED.read_text())["spec"])])
    assert not problems, problems
    allocator = GpuAllocator()
    allocator.set_partition_catalog(catalog)
    for n in range(nodes):
        for g in range(GPUS_PER_NODE):
            allocator.upsert_gpu(GpuInfo(name=f"gpu-{n}-{g}", node=f"node-{n}", pool=POOL, capacity_tflops=312_000,
                                         capacity_vram=80 * GIB, model=MODEL, index=g,
                                         isolation_mode=tfa.ISOLATION_PARTITIONED))
    return allocator


def pod(i: int) -> tuple[AllocRequest, str]:
    template = "" if i % 10 == 9 else SHAPES[i % len(SHAPES)]
    notes = {tfa.GPU_POOL: POOL, tfa.ISOLATION: tfa.ISOLATION_PARTITIONED}
    if template:
        notes[tfa.PARTITION_ID] = template
    else:
        notes[tfa.VRAM_REQUEST] = "15Gi"
    req = request_from_pod(Pod({"metadata": {"name": f"p{i}", "namespace": "bench", "uid": f"uid-{i}",
                                             "annotations": notes}}))
    return req, template


def place(allocator: GpuAllocator, req: AllocRequest) -> bool:
    try:
        placement = allocator.select(req, diagnose=False)
    except Unschedulable:
        return False
    allocator.assume(req, placement.gpu_names)
    allocator.commit(req.pod_uid)
    return True


def free_slices(allocator: GpuAllocator) -> list[int]:
    return [7 - sum(SLICES[p.template_id] for p in slot.parts.values()) for slot in allocator.indexes.gpus.values()]


@contextmanager
def first_fit() -> Iterator[None]:
    """The original's slot choice (the first free start) instead of tfusion's largest-free-run one."""
    def first(template: partitions.Template, used: int, total: int) -> int | None:
        block = (1 << template.placement_offset) - 1
        return next((s for s in template.placement_limit
                     if s + template.placement_offset <= total and not used & (block << s)), None)
    saved: Callable[[partitions.Template, int, int], int | None] = partitions.best_start
    partitions.best_start = first
    try:
        yield
    finally:
        partitions.best_start = saved


def _us(timings_ns: list[int]) -> dict[str, Any]:
    if not timings_ns:
        return {"count": 0}
    ordered = sorted(timings_ns)
    return {"count": len(ordered), "median_us": round(statistics.median(ordered) / 1000, 2),
            "p99_us": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] / 1000, 2),
            "max_us": round(ordered[-1] / 1000, 2)}


def simulate(nodes: int, ops: int, fill: float, seed: int) -> dict[str, Any]:
    allocator = build(nodes)
    total = nodes * GPUS_PER_NODE * 7
    rng = random.Random(seed)
    live: list[tuple[str, int]] = []
    used = 0
    timings: list[int] = []
    refused = refused_gpu_room = refused_cluster_room = attempts = 0
    i = 0
    clock = time.perf_counter_ns

    def attempt() -> bool:
        nonlocal i, used
        req, _ = pod(i)
        i += 1
        start = clock()
        ok = place(allocator, req)
        timings.append(clock() - start)
        if ok:
            info = allocator.allocation(req.pod_uid)
            part = info.partitions[0] if info is not None and info.partitions else None
            size = SLICES[part.template_id] if part is not None else 0
            live.append((req.pod_uid, size))
            used += size
        return ok

    misses = 0
    while used < total * fill and misses < 20:
        misses = 0 if attempt() else misses + 1
    for _ in range(ops):
        if used >= total * fill and live:
            uid, size = live.pop(rng.randrange(len(live)))
            allocator.release(uid)
            used -= size
            continue
        attempts += 1
        need = BY_NAME[pod(i)[1]]
        if not attempt():
            refused += 1
            free = free_slices(allocator)
            refused_gpu_room += any(f >= need for f in free)
            refused_cluster_room += sum(free) >= need
    probe, _ = pod(0)  # a 1g.10gb request: the smallest slice
    free = free_slices(allocator)
    stranded = sum(f for f, slot in zip(free, allocator.indexes.gpus.values(), strict=True)
                   if f and not partitions.fits(slot, probe))
    return {"timing": _us(timings), "placements_timed": len(timings), "fill_reached": round(used / total, 3),
            "stranded_slices_share": round(stranded / sum(free), 4) if sum(free) else 0.0,
            "churn_place_attempts": attempts, "refused": refused,
            "refused_share": round(refused / attempts, 4) if attempts else 0.0,
            "refused_with_room_on_a_gpu": round(refused_gpu_room / attempts, 4) if attempts else 0.0,
            "refused_with_room_in_cluster": round(refused_cluster_room / attempts, 4) if attempts else 0.0}


def run_partitioned(nodes: int, ops: int, fill: float = 0.8, seed: int = 7) -> dict[str, Any]:
    gc.collect()
    ours = simulate(nodes, ops, fill, seed)
    with first_fit():
        theirs = simulate(nodes, ops, fill, seed)
    timing = ours["timing"]
    return {"benchmark": "allocator", "path": "partitioned", "nodes": nodes, "gpus": nodes * GPUS_PER_NODE,
            "model": MODEL, "ops": ops, "fill": fill, **ours,
            "first_fit": {k: theirs[k] for k in ("refused_share", "refused_with_room_on_a_gpu",
                                                 "refused_with_room_in_cluster", "stranded_slices_share")},
            "target_median_us": TARGET_MEDIAN_US, "target_p99_ms": TARGET_P99_MS,
            "meets_target": timing.get("median_us", 0) <= TARGET_MEDIAN_US
            and timing.get("p99_us", 0) <= TARGET_P99_MS * 1000}
