"""Allocator placement speed on the reference workload (DESIGN.md §8); prints ONE JSON object.

Cluster: `--nodes` nodes sharing `--gpus` GPUs evenly, node i all of one model, cycling B200
(2250 TFLOPS / 141Gi), H100 (989 / 80Gi), L40S (450 / 48Gi), A100 (312 / 40Gi), one pool, the
default placement mode. Pods cycle 20 TFLOPS/4Gi x1, 40/8Gi x1, 100/16Gi x1, 30/4Gi x2, 200/32Gi x2.

Each pod's annotations are parsed into an AllocRequest BEFORE timing (the webhook/scheduler parse
once per pod, not per decision). The garbage collector stays on. `--path` picks what is timed per pod:
- default: what the built-in scheduler does: `select` (filter + score + choose node and GPUs),
  `assume`, `commit`;
- extender: what a kube-scheduler extender round costs: Framework.pre_filter, Framework.filter over
  every node name, Framework.score of the feasible nodes, the best one picked, Framework.reserve
  on it and Framework.pre_bind;
- churn: the cluster is filled to 90% of its VRAM first (not timed), then releases of a random live
  pod alternate with extender-path placements for `--ops` operations (each timed).
Pods that do not fit are timed separately (`failure`), including building their explanation
(per-node reasons and suggestions: Framework.explain over every node), and counted as not placed:
the run's own misfits and `--unfit` probes no node can take (160Gi, 2500 TFLOPS, 8 GPUs), the
first probe of each shape included (a new shape has no cached per-node judgement; `failure_cold`
repeats those first probes alone).

`--topology soft|hard` gives each node's GPUs NVLink pairs (index 0-1, 2-3, ...), a PCIe switch per 4
and NUMA crossings beyond, and places the 2-GPU shapes by GPUNetworkTopologyAware in that mode.

- preempt: a cluster full of low pods, critical pods arriving (benchmarks/preempt_bench.py).
- gang: groups of 4 and 8 members placed all or none (benchmarks/gang_bench.py), per member.
- partitioned: MIG partitions on nodes of 8 A100-80GB GPUs, and fragmentation under churn
  (benchmarks/partition_bench.py; `--nodes` and `--ops` apply).

    python benchmarks/allocator.py [--path default|extender|churn|preempt|gang] [--nodes 500 --gpus 3000 --pods 10000]
                                   [--topology off|soft|hard]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import resource
import statistics
import sys
import time
from typing import Any

from tfusion.allocator import AllocRequest, Framework, GpuAllocator, GpuInfo, Unschedulable, request_from_pod
from tfusion.allocator.topology import TopologyArgs
from tfusion.api.accessors import Pod

GIB = 1 << 30
MODELS = (("B200", 2250, 141), ("H100", 989, 80), ("L40S", 450, 48), ("A100", 312, 40))
SHAPES = (("20", "4Gi", 1), ("40", "8Gi", 1), ("100", "16Gi", 1), ("30", "4Gi", 2), ("200", "32Gi", 2))
#: pods no node can take: VRAM beyond any GPU, TFLOPS beyond any GPU, more GPUs than a node has
UNFIT_SHAPES = (("100", "160Gi", 1), ("2500", "8Gi", 1), ("20", "4Gi", 8))
POOL = "default-pool"


def build_cluster(nodes: int, gpus: int, topology: str = "off") -> GpuAllocator:
    allocator = GpuAllocator(topology=None if topology == "off" else TopologyArgs(mode=topology))
    per_node = -(-gpus // nodes)
    for i in range(gpus):
        node = i % nodes
        model, tflops, vram = MODELS[node % len(MODELS)]
        allocator.upsert_gpu(GpuInfo(
            name=f"gpu-{i:06d}", node=f"node-{node:05d}", pool=POOL, model=model, index=i // nodes,
            capacity_tflops=tflops * 1000, capacity_vram=vram * GIB,
            peer_tiers=() if topology == "off" else peers(i, nodes, gpus, per_node)))
    return allocator


def peers(i: int, nodes: int, gpus: int, per_node: int) -> tuple[tuple[str, int], ...]:
    """GPU i's peers on its node: NVLink pairs (index 0-1, 2-3, ...), a PCIe switch per 4, else across NUMA."""
    mine = i // nodes
    out = []
    for k in range(per_node):
        j = i % nodes + k * nodes
        if k != mine and j < gpus:
            out.append((f"gpu-{j:06d}", 0 if k // 2 == mine // 2 else 1 if k // 4 == mine // 4 else 2))
    return tuple(sorted(out))


def pod(i: int, shapes: tuple[tuple[str, str, int], ...] = SHAPES, prefix: str = "") -> dict[str, Any]:
    tflops, vram, count = shapes[i % len(shapes)]
    return {"metadata": {"name": f"{prefix}pod-{i}", "namespace": f"ns-{i % 10}", "uid": f"{prefix}uid-{i:07d}",
                         "annotations": {"tensor-fusion.ai/gpupool": POOL,
                                         "tensor-fusion.ai/tflops-request": tflops,
                                         "tensor-fusion.ai/vram-request": vram,
                                         "tensor-fusion.ai/gpu-count": str(count)}}}


def stats(timings_ns: list[int]) -> dict[str, Any]:
    if not timings_ns:
        return {"count": 0}
    ordered = sorted(timings_ns)
    return {
        "count": len(ordered),
        "median_us": round(statistics.median(ordered) / 1000, 2),
        "p99_us": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] / 1000, 2),
        "max_us": round(ordered[-1] / 1000, 2),
    }


def place_extender(fw: Framework, req: AllocRequest, names: list[str]) -> bool:
    """One extender round for `req`; on failure the explanation is built (as a scheduler would)."""
    if fw.pre_filter(req).ok:
        feasible, _failed = fw.split(req, names)
        if feasible:
            scores = fw.score(req, feasible)
            best = max(scores, key=scores.__getitem__)  # the first best in name order, as names are sorted
            placement, _status = fw.reserve(req, best)
            if placement is not None and fw.pre_bind(req.pod_uid).ok:
                return True
    fw.explain(req, names)
    return False


def place_default(allocator: GpuAllocator, req: AllocRequest) -> bool:
    try:
        placement = allocator.select(req, diagnose=False)  # the explanation is Framework.explain's
    except Unschedulable:
        return False
    allocator.assume(req, placement.gpu_names)
    allocator.commit(req.pod_uid)
    return True


def fill(allocator: GpuAllocator, share: float) -> tuple[list[str], int, float]:
    """Place pods (not timed) until `share` of the cluster's VRAM is allocated.

    Returns (live pod uids, the next pod number, the VRAM share reached)."""
    total = sum(allocator.gpu_info(n).capacity_vram for n in allocator.gpu_names())
    used = 0
    live: list[str] = []
    misses = 0
    i = 0
    while used < total * share and misses < 50:
        req = request_from_pod(Pod(pod(i)))
        i += 1
        if place_default(allocator, req):
            used += req.vram_request * req.count
            live.append(req.pod_uid)
            misses = 0
        else:
            misses += 1
    return live, i, used / total


def run(path: str, nodes: int, gpus: int, pods: int, ops: int, unfit: int, topology: str = "off") -> dict[str, Any]:
    allocator = build_cluster(nodes, gpus, topology)
    fw = Framework(allocator)
    names = allocator.nodes()
    requests = [request_from_pod(Pod(pod(i))) for i in range(pods)] if path != "churn" else []  # pre-parsed
    placed_ns: list[int] = []
    failed_ns: list[int] = []
    release_ns: list[int] = []
    clock = time.perf_counter_ns
    gc.collect()
    timed = 0
    reached = 0.0
    started = clock()
    if path == "churn":
        live, i, reached = fill(allocator, 0.9)
        rng = random.Random(1)
        upcoming = [request_from_pod(Pod(pod(n))) for n in range(i, i + ops)]  # pre-parsed, not timed
        gc.collect()
        started = clock()
        for op in range(ops):
            t0 = clock()
            if op % 2 == 0 and live:
                allocator.release(live.pop(rng.randrange(len(live))))
                release_ns.append(clock() - t0)
                continue
            req = upcoming[op]
            ok = place_extender(fw, req, names)
            (placed_ns if ok else failed_ns).append(clock() - t0)
            if ok:
                live.append(req.pod_uid)
        timed = ops
    else:
        for req in requests:
            t0 = clock()
            ok = place_extender(fw, req, names) if path == "extender" else place_default(allocator, req)
            if not ok and path == "default":
                fw.explain(req, names)
            (placed_ns if ok else failed_ns).append(clock() - t0)
        timed = len(requests)
    elapsed = clock() - started
    cold_ns: list[int] = []
    # the probes start from a collected heap, as the timed run does: churn leaves tens of thousands of
    # young objects that the next gen-0 collection, whoever triggers it, walks (~10 ms here)
    gc.collect()
    for n, req in enumerate(request_from_pod(Pod(pod(i, UNFIT_SHAPES, "unfit-"))) for i in range(unfit)):
        t0 = clock()
        ok = place_extender(fw, req, names) if path != "default" else place_default(allocator, req)
        if not ok and path == "default":
            fw.explain(req, names)
        spent = clock() - t0
        failed_ns.append(spent)
        if n < len(UNFIT_SHAPES):
            cold_ns.append(spent)
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    what = {
        "default": "select (filter+score+choose) + assume + commit per pod",
        "extender": "pre_filter + split(all nodes: feasible list, failed statuses) + score(feasible) + pick "
                    "best + reserve + pre_bind per pod",
        "churn": "after a 90% VRAM fill: release of a random pod alternating with an extender-path placement",
    }[path]
    placed = stats(placed_ns)
    out: dict[str, Any] = {
        "benchmark": "allocator", "path": path,
        "nodes": nodes, "gpus": gpus, "pods": pods if path != "churn" else ops, "topology": topology,
        "timed": what + "; requests pre-parsed; GC on",
        "median_us": placed.get("median_us"), "p99_us": placed.get("p99_us"), "max_us": placed.get("max_us"),
        "ops_per_s": round(timed / (elapsed / 1e9), 1),
        "placed": placed["count"],
        "failure": {**stats(failed_ns), "unfit_probes": unfit,
                    "timed": "the same path for a pod that does not fit, plus its explanation (Framework.explain "
                             "over every node: per-node reasons and suggestions); the pods of the run that did "
                             "not fit and `unfit_probes` pods no node can take (160Gi, 2500 TFLOPS, 8 GPUs), "
                             "the first probe of each shape included; the probes start after a gc.collect()"},
        "failure_cold": {**stats(cold_ns), "timed": "the first explanation of each unfit shape alone (also in "
                                                    "failure): every node judged afresh for the shape (later ones "
                                                    "reuse unchanged nodes)"},
    }
    if path == "churn":
        out["release"] = stats(release_ns)
        out["filled_vram_share"] = round(reached, 3)
    out.update(rss_mb=round(rss_kb / 1024, 1), python=sys.version.split()[0])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--gpus", type=int, default=3000)
    parser.add_argument("--pods", type=int, default=10000)
    parser.add_argument("--path", choices=("default", "extender", "churn", "preempt", "gang", "partitioned"),
                        default="default")
    parser.add_argument("--unfit", type=int, default=300, help="pods that fit nowhere, timed with explanation")
    parser.add_argument("--ops", type=int, default=10000, help="churn: release/place operations after the fill; "
                        "preempt: critical pods arriving (at most 2000)")
    parser.add_argument("--protected", type=float, default=0.2, help="preempt: share of low pods protected")
    parser.add_argument("--topology", choices=("off", "soft", "hard"), default="off",
                        help="give each node's GPUs a topology (NVLink pairs, a PCIe switch per 4) and place "
                             "multi-GPU pods by it in this GPUNetworkTopologyAware mode")
    parser.add_argument("--json", action="store_true", help="print JSON (the only output format)")
    args = parser.parse_args(argv)
    if args.nodes < 1 or args.gpus < args.nodes or args.pods < 1 or args.ops < 1 or args.unfit < 0:
        parser.error("need nodes >= 1, gpus >= nodes, pods >= 1, ops >= 1 and unfit >= 0")
    if args.path == "preempt":  # preempt_bench.py: a full cluster of low pods, critical pods arriving
        import preempt_bench
        print(json.dumps(preempt_bench.run(build_cluster(args.nodes, args.gpus), pod, nodes=args.nodes,
                                           gpus=args.gpus, ops=min(args.ops, 2000), protected=args.protected)))
        return 0
    if args.path == "partitioned":  # MIG slices on A100-80GB nodes (partition_bench.py)
        from partition_bench import run_partitioned
        print(json.dumps(run_partitioned(args.nodes, args.ops)))
        return 0
    if args.path == "gang":  # groups of 4 and 8 (gang_bench.py)
        from gang_bench import run_gang

        result = {"benchmark": "allocator", "path": "gang", "nodes": args.nodes, "gpus": args.gpus,
                  **run_gang(build_cluster(args.nodes, args.gpus), pod, args.pods)}
        print(json.dumps(result))
        return 0
    print(json.dumps(run(args.path, args.nodes, args.gpus, args.pods, args.ops, args.unfit, args.topology)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
