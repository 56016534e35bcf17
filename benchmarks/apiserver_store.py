"""The embedded API server's store in-process: memory per pod and cyclic-GC pauses, printed as ONE JSON object.

`benchmarks/apiserver.py` measures the whole server over HTTP; this one isolates the store, so the
figures do not move with the HTTP stack or the machine's load:

- written_rss_kb_per_pod: the process's resident memory growth per pod while `--pods` TF worker
  pods (the same 4.6 KB objects as apiserver.py's, plus the uid, timestamp and managedFields the
  server adds) are written through `Store.put`, in batches sharing a commit as the server's do;
- loaded_rss_kb_per_pod: the growth per pod of a fresh process that opens the state file (a
  restart); load_cpu_s: that process's CPU seconds for the load;
- full_gc_max_ms: the longest of `--collections` full collections (`gc.collect()`) in that process,
  timed in CPU time; full_gc_frozen_max_ms: the same after `freeze_long_lived()` (the server
  calls it after loading);
- select_cpu_ms: CPU time of one pass over every pod evaluating `spec.nodeName=<one node>` as a
  list or watch does (through `Selection` where the store has it, on the decoded object otherwise),
  and select_matches, the pods it kept.

Usage: python benchmarks/apiserver_store.py [--pods 100000] [--collections 5]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from apiserver import rss_mb, tf_worker_pod  # benchmarks/apiserver.py: the same pods

PODS = "/pods"
BATCH = 500


def stored_pod(i: int) -> dict[str, Any]:
    """A pod as the server stores it: what a client sends plus the fields the server adds."""
    pod = tf_worker_pod(i)
    meta = pod["metadata"]
    meta["uid"] = str(uuid.UUID(int=i + 1))
    meta["creationTimestamp"] = "2026-01-01T00:00:00Z"
    meta["managedFields"] = [{
        "manager": "tensor-fusion-operator", "operation": "Update", "apiVersion": "v1",
        "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1",
        "fieldsV1": {"f:metadata": {"f:annotations": {f"f:{k}": {} for k in meta.get("annotations") or {}},
                                    "f:labels": {f"f:{k}": {} for k in meta.get("labels") or {}}},
                     "f:spec": {"f:nodeName": {}}},
    }]
    return pod


async def write(state: Path, pods: int) -> float:
    """Write `pods` pods; returns the RSS growth in MB."""
    from tfusion.apiserver.store import Store

    store = Store(state, 10_000)
    gc.collect()
    before = rss_mb(os.getpid())
    for start in range(0, pods, BATCH):
        for i in range(start, min(start + BATCH, pods)):
            store.put(PODS, stored_pod(i), None)
        await store.durable()
    gc.collect()
    grown = rss_mb(os.getpid()) - before
    store.close()
    return grown


def load(state: Path, collections: int) -> dict[str, Any]:
    """Open the state file as a restarting server does; measure it (run in a fresh process)."""
    from tfusion.api.documents import freeze_long_lived
    from tfusion.apiserver import store as store_module

    gc.collect()
    before = rss_mb(os.getpid())
    started = time.process_time()
    store = store_module.Store(state, 10_000)
    result: dict[str, Any] = {"load_cpu_s": round(time.process_time() - started, 2)}
    gc.collect()
    pods = store.count(PODS)
    result["loaded_rss_kb_per_pod"] = round((rss_mb(os.getpid()) - before) * 1024 / pods, 2)
    result["full_gc_max_ms"] = _longest_collection(collections)
    freeze_long_lived()  # as the server does once it has loaded its state
    result["full_gc_frozen_max_ms"] = _longest_collection(collections)
    result.update(_select(store_module, store))
    store.close()
    return result


def _longest_collection(collections: int) -> float:
    longest = 0.0
    for _ in range(collections):
        started = time.process_time()
        gc.collect()
        longest = max(longest, time.process_time() - started)
    return round(longest * 1000, 1)


def _select(store_module: Any, store: Any) -> dict[str, Any]:
    from tfusion.api.selectors import parse_field_selector

    fields = parse_field_selector("spec.nodeName=gpu-node-0007")
    selection_type = getattr(store_module, "Selection", None)
    entries = [entry for _, entry in store.items(PODS)]
    started = time.process_time()
    if selection_type is not None:
        selection = selection_type(None, fields)
        kept = sum(1 for entry in entries if selection.matches(entry))
    else:
        kept = sum(1 for entry in entries if fields.matches(entry.obj))
    return {"select_cpu_ms": round((time.process_time() - started) * 1000, 1), "select_matches": kept}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=100_000)
    parser.add_argument("--collections", type=int, default=5)
    parser.add_argument("--load", help=argparse.SUPPRESS)  # the child: measure loading this state file
    args = parser.parse_args()
    if args.load:
        print(json.dumps(load(Path(args.load), args.collections)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state.db"
        grown = asyncio.run(write(state, args.pods))
        result: dict[str, Any] = {"pods": args.pods,
                                  "written_rss_kb_per_pod": round(grown * 1024 / args.pods, 2)}
        child = subprocess.run([sys.executable, __file__, "--load", str(state), "--collections",
                                str(args.collections)], capture_output=True, text=True, check=True)
        result.update(json.loads(child.stdout))
        result["state_file_mb"] = round(sum(f.stat().st_size for f in Path(tmp).iterdir()) / 2**20, 1)
    result["note"] = "in-process store; CPU times from time.process_time(), RSS from /proc"
    print(json.dumps(result))


if __name__ == "__main__":
    main()
