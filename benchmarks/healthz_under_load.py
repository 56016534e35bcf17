"""/healthz latency while a large request body is being parsed, on the embedded API server and the
controller of one `tfusion --role=all` process (all roles share one event loop, so a request that
held it would starve the others, the Lease renewal included). Issue 11 asks for < 100 ms with a
3 MiB body in flight.

    .venv/bin/python benchmarks/healthz_under_load.py [--rounds 3]

Prints one JSON object per (server, body): the answer to the big request, its duration, and the
median and worst /healthz round trip polled every 5 ms from another thread on its own connection.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import yaml
from _processes import role_all


def pod_manifest_yaml(size: int) -> bytes:
    """A Pod as `kubectl get -o yaml` prints it, grown to `size` bytes with annotations."""
    notes = {f"example.com/note-{i}": "x" * 1000 for i in range(size // 1040)}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "big", "namespace": "default", "labels": {"tensor-fusion.ai/enabled": "true"},
        "annotations": {"tensor-fusion.ai/tflops-request": "20", "tensor-fusion.ai/vram-request": "8Gi", **notes}},
        "spec": {"schedulerName": "tensor-fusion-scheduler", "containers": [{"name": "c", "image": "busybox"}]}}
    return yaml.safe_dump(pod).encode()


def measure(base: str, verify: Any, headers: dict[str, str], path: str, body: bytes, ctype: str) -> dict[str, Any]:
    done = threading.Event()
    outcome: dict[str, Any] = {}

    def post() -> None:
        with httpx.Client(base_url=base, verify=verify, headers=headers, timeout=120) as client:
            started = time.perf_counter()
            outcome["status"] = client.post(path, content=body, headers={"content-type": ctype}).status_code
            outcome["request_s"] = round(time.perf_counter() - started, 3)
            if path.endswith("/configmaps"):
                client.delete(f"{path}/big")
        done.set()

    latencies: list[float] = []
    with httpx.Client(base_url=base, verify=verify, timeout=30) as health:
        health.get("/healthz")
        sender = threading.Thread(target=post)
        sender.start()
        while not done.is_set():
            started = time.perf_counter()
            health.get("/healthz").raise_for_status()
            latencies.append((time.perf_counter() - started) * 1000)
            time.sleep(0.005)
        sender.join()
    return {**outcome, "healthz_samples": len(latencies), "healthz_p50_ms": round(statistics.median(latencies), 1),
            "healthz_max_ms": round(max(latencies), 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    three_mib = 3 * 1024 * 1024 - 4096
    with tempfile.TemporaryDirectory() as tmp, role_all(Path(tmp)) as where:
        auth = {"authorization": f"Bearer {where['token']}"}
        cases = [
            # indented, so the body is 3 MiB while the stored object stays under the 1.5 MiB limit
            ("apiserver", where["api"], auth, "/api/v1/namespaces/default/configmaps",
             json.dumps({"metadata": {"name": "big"}, "extra": [{"name": f"i{i}", "v": i} for i in range(36000)]},
                        indent=5).encode(), "application/json", "3 MiB indented JSON ConfigMap"),
            ("controller", where["controller"], {}, "/api/simulate-schedule", pod_manifest_yaml(three_mib),
             "application/yaml", "3 MiB YAML Pod manifest"),
        ]
        for server, base, headers, path, body, ctype, label in cases:
            verify = where["verify"] if base.startswith("https") else True
            for round_ in range(args.rounds):
                result = measure(base, verify, headers, path, body, ctype)
                print(json.dumps({"benchmark": "healthz_under_load", "server": server, "body": label,
                                  "body_bytes": len(body), "round": round_ + 1, **result,
                                  "target_max_ms": 100}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
