"""Autoscaler core speed and memory (issue 28); prints ONE JSON object.

`--workloads` workloads (10,000) each get `--samples` usage samples (1,000), one every 30 s, fed
time-major (every workload's sample of one interval, then the next interval), as the autoscaler
service ingests them. Each workload has its own level, 1..200 TFLOPS and 0.5..60 GiB, and every
sample varies it by a log-normal factor (sigma 0.15 for TFLOPS, 0.05 for VRAM); the factors are
drawn before timing so that the random generator is not what is measured.

Reported:
- ingest: samples per second through WorkloadUsage.add (one sample = one TFLOPS and one VRAM
  histogram update);
- recommend: seconds of one pass of `recommend` over every workload (default policy, the
  workload asking 40 TFLOPS / 8 GiB with limits twice that, an H100's capacity), `--passes` times;
  target: the median pass <= 1 s on one core (the process is pinned to one CPU when it may be);
- memory: what the histograms of all workloads (2 each) take, measured with tracemalloc on copies
  rebuilt from their checkpoints (the same buckets; measuring the ingest itself under tracemalloc
  would slow it tenfold), and the sys.getsizeof sum of the live ones as a cross-check;
  target <= 20 MB for 10,000 workloads.

    python benchmarks/autoscaler.py [--workloads 10000] [--samples 1000] [--passes 3] [--seed 1]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import statistics
import sys
import time
import tracemalloc
from collections import Counter
from typing import Any

from tfusion.allocator.request import Resources
from tfusion.controller.autoscaler.policy import AutoSetPolicy
from tfusion.controller.autoscaler.recommender import Share, WorkloadUsage, recommend

GIB = 1 << 30
MB = 1e6
INTERVAL_S = 30.0
T0 = 1_800_000_000.0
#: noise factors are drawn once and reused cyclically (a prime length, so workloads do not align)
NOISE = 8191
RECOMMEND_TARGET_S = 1.0
MEMORY_TARGET_MB = 20.0
H100 = Resources(tflops=989_000, vram=80 * GIB)


def pin_one_cpu() -> int | None:
    if not hasattr(os, "sched_setaffinity"):
        return None
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    return cpu


def ingest(usages: list[WorkloadUsage], levels: list[tuple[float, float]], samples: int,
           draw: random.Random) -> float:
    """Seconds to feed every workload `samples` samples."""
    tflops_noise = [draw.lognormvariate(0.0, 0.15) for _ in range(NOISE)]
    vram_noise = [draw.lognormvariate(0.0, 0.05) for _ in range(NOISE)]
    offsets = [draw.randrange(NOISE) for _ in usages]
    rows = list(zip(usages, levels, offsets, strict=True))
    started = time.perf_counter()
    for step in range(samples):
        at = T0 + step * INTERVAL_S
        for usage, (tflops, vram), offset in rows:
            k = (offset + step) % NOISE
            usage.add(at, tflops * tflops_noise[k], vram * vram_noise[k])
    return time.perf_counter() - started


def recommend_pass(usages: list[WorkloadUsage], now: float) -> tuple[float, Counter[str]]:
    policy = AutoSetPolicy(enable=True)
    ask = Share(Resources(tflops=40_000, vram=8 * GIB), Resources(tflops=80_000, vram=16 * GIB))
    reasons: Counter[str] = Counter()
    started = time.perf_counter()
    for usage in usages:
        decision = recommend(usage, policy, original=ask, current=ask, capacity=H100, started_at=T0, now=now)
        reasons[decision.reason] += 1
    return time.perf_counter() - started, reasons


def histogram_memory(usages: list[WorkloadUsage], half_life_s: float) -> tuple[float, float]:
    """(tracemalloc bytes of rebuilt copies, sys.getsizeof bytes of the live histograms)."""
    checkpoints = [usage.to_checkpoint() for usage in usages]
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    copies = [WorkloadUsage.from_checkpoint(half_life_s, data) for data in checkpoints]
    traced = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    del copies
    live = sum(sys.getsizeof(u) + u.tflops.footprint() + u.vram.footprint() for u in usages)
    return float(traced), float(live)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", type=int, default=10_000)
    parser.add_argument("--samples", type=int, default=1_000)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    cpu = pin_one_cpu()
    draw = random.Random(args.seed)
    half_life = AutoSetPolicy().half_life_s
    levels = [(draw.uniform(1, 200) * 1000, draw.uniform(0.5, 60) * GIB) for _ in range(args.workloads)]
    usages = [WorkloadUsage(half_life) for _ in range(args.workloads)]
    ingest_s = ingest(usages, levels, args.samples, draw)
    now = T0 + args.samples * INTERVAL_S
    passes, reasons = [], Counter[str]()
    for _ in range(args.passes):
        seconds, reasons = recommend_pass(usages, now)
        passes.append(seconds)
    traced, live = histogram_memory(usages, half_life)
    histograms = 2 * args.workloads
    buckets = statistics.mean(len(h.buckets()) for u in usages for h in (u.tflops, u.vram))
    median = statistics.median(passes)
    scale = 10_000 / args.workloads  # the targets are stated for 10,000 workloads
    result: dict[str, Any] = {
        "benchmark": "autoscaler",
        "python": platform.python_version(),
        "pinned_cpu": cpu,
        "workloads": args.workloads,
        "samples_per_workload": args.samples,
        "ingest": {"samples": args.workloads * args.samples, "seconds": round(ingest_s, 3),
                   "samples_per_s": round(args.workloads * args.samples / ingest_s)},
        "recommend": {"pass_seconds": [round(s, 4) for s in passes], "median_s": round(median, 4),
                      "per_workload_us": round(median / args.workloads * 1e6, 2), "reasons": dict(reasons),
                      "target_s_per_10000": RECOMMEND_TARGET_S, "met": median * scale <= RECOMMEND_TARGET_S},
        "memory": {"histograms": histograms, "tracemalloc_mb": round(traced / MB, 3),
                   "getsizeof_live_mb": round(live / MB, 3), "bytes_per_histogram": round(traced / histograms, 1),
                   "mean_nonempty_buckets": round(buckets, 2), "target_mb_per_10000": MEMORY_TARGET_MB,
                   "met": traced / MB * scale <= MEMORY_TARGET_MB},
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
