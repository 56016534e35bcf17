"""Allocator placement speed on the reference workload (DESIGN.md §8); prints ONE JSON object.

Cluster: `--nodes` nodes sharing `--gpus` GPUs evenly, node i all of one model, cycling B200
(2250 TFLOPS / 141Gi), H100 (989 / 80Gi), L40S (450 / 48Gi), A100 (312 / 40Gi), one pool, the
default placement mode. Pods cycle 20 TFLOPS/4Gi x1, 40/8Gi x1, 100/16Gi x1, 30/4Gi x2, 200/32Gi x2.

Each pod's annotations are parsed into an AllocRequest BEFORE timing (the webhook/scheduler parse
once per pod, not per decision). What is timed, per pod, is what the scheduler does: filter + score +
choose node and GPUs (`select`), `assume`, `commit`. Pods that do not fit (the cluster fills up)
are timed too, including building their explanation, and counted as not placed.

    python benchmarks/allocator.py [--nodes 500 --gpus 3000 --pods 10000] [--json]
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import statistics
import sys
import time
from typing import Any

from tfusion.allocator import GpuAllocator, GpuInfo, Unschedulable, request_from_pod

GIB = 1 << 30
MODELS = (("B200", 2250, 141), ("H100", 989, 80), ("L40S", 450, 48), ("A100", 312, 40))
SHAPES = (("20", "4Gi", 1), ("40", "8Gi", 1), ("100", "16Gi", 1), ("30", "4Gi", 2), ("200", "32Gi", 2))
POOL = "default-pool"


def build_cluster(nodes: int, gpus: int) -> GpuAllocator:
    allocator = GpuAllocator()
    for i in range(gpus):
        node = i % nodes
        model, tflops, vram = MODELS[node % len(MODELS)]
        allocator.upsert_gpu(GpuInfo(
            name=f"gpu-{i:06d}", node=f"node-{node:05d}", pool=POOL, model=model, index=i // nodes,
            capacity_tflops=tflops * 1000, capacity_vram=vram * GIB))
    return allocator


def pod(i: int) -> dict[str, Any]:
    tflops, vram, count = SHAPES[i % len(SHAPES)]
    return {"metadata": {"name": f"pod-{i}", "namespace": f"ns-{i % 10}", "uid": f"uid-{i:07d}",
                         "annotations": {"tensor-fusion.ai/gpupool": POOL,
                                         "tensor-fusion.ai/tflops-request": tflops,
                                         "tensor-fusion.ai/vram-request": vram,
                                         "tensor-fusion.ai/gpu-count": str(count)}}}


def run(nodes: int, gpus: int, pods: int) -> dict[str, Any]:
    allocator = build_cluster(nodes, gpus)
    requests = [request_from_pod(pod(i)) for i in range(pods)]  # pre-parsed, not timed
    timings: list[int] = []
    placed = 0
    clock = time.perf_counter_ns
    gc.collect()
    gc.disable()
    try:
        started = clock()
        for req in requests:
            t0 = clock()
            try:
                placement = allocator.select(req)
                allocator.assume(req, placement.gpu_names)
                allocator.commit(req.pod_uid)
                placed += 1
            except Unschedulable:
                pass
            timings.append(clock() - t0)
        elapsed = clock() - started
    finally:
        gc.enable()
    timings.sort()
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "benchmark": "allocator",
        "nodes": nodes, "gpus": gpus, "pods": pods,
        "timed": "select (filter+score+choose) + assume + commit per pod; requests pre-parsed",
        "median_us": round(statistics.median(timings) / 1000, 2),
        "p99_us": round(timings[min(len(timings) - 1, int(len(timings) * 0.99))] / 1000, 2),
        "max_us": round(timings[-1] / 1000, 2),
        "pods_per_s": round(pods / (elapsed / 1e9), 1),
        "placed": placed,
        "rss_mb": round(rss_kb / 1024, 1),
        "python": sys.version.split()[0],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--gpus", type=int, default=3000)
    parser.add_argument("--pods", type=int, default=10000)
    parser.add_argument("--json", action="store_true", help="print JSON (the only output format)")
    args = parser.parse_args(argv)
    if args.nodes < 1 or args.gpus < args.nodes or args.pods < 1:
        parser.error("need nodes >= 1, gpus >= nodes and pods >= 1")
    print(json.dumps(run(args.nodes, args.gpus, args.pods)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
