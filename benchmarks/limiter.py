"""The soft limiter's cost per kernel launch when it does not throttle; prints ONE JSON object.

Builds `native/limiter/libcuda_limiter.so`, the fake CUDA driver and the probe (tests/fake_cuda),
writes a real V2 shared-memory file with the hypervisor's code whose token bucket never runs short,
and times `--launches` cuLaunchKernel calls in the probe, linked to the driver and resolved through
cuGetProcAddress, each without and with the library preloaded (best of `--repeats` runs). The fake
driver's own launch is a few nanoseconds, so the difference is the limiter's work per launch: the
current device's slot, the heartbeat check and the token compare-and-swap.

    python benchmarks/limiter.py [--launches 200000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests import fake_cuda
from tfusion.hypervisor.shm.state import DeviceConfig
from tfusion.hypervisor.shm.store import ShmStore

PLENTY = 1e15


def best_ns(program: Path, launches: int, repeats: int, env: dict[str, str]) -> float:
    best = float("inf")
    for _ in range(repeats):
        result = subprocess.run([str(program), "bench", str(launches)], env=env, capture_output=True, text=True,
                                timeout=300, check=True)
        best = min(best, float(json.loads(result.stdout)["ns_per_launch"]))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tf-limiter-bench-") as tmp:
        root = Path(tmp)
        binaries = fake_cuda.build(root / "build")
        state = ShmStore(root / "shm").create("ns", "bench", [DeviceConfig(
            slot=0, uuid=fake_cuda.DEVICE_UUID.format(0), up_limit=100, mem_limit=1 << 30)])
        state.set_bucket(0, refill_rate=PLENTY, capacity=PLENTY)
        state.update_tokens(0, lambda _: PLENTY)
        with_limiter = fake_cuda.environment(binaries, state.path)
        without = {k: v for k, v in with_limiter.items() if k != "LD_PRELOAD"}
        report: dict[str, object] = {"launches": args.launches, "repeats": args.repeats}
        for how in ("linked", "runtime"):
            plain = best_ns(binaries.probe(how), args.launches, args.repeats, without)
            limited = best_ns(binaries.probe(how), args.launches, args.repeats, with_limiter)
            report[how] = {"ns_per_launch_without": round(plain, 1), "ns_per_launch_with": round(limited, 1),
                           "overhead_ns_per_launch": round(limited - plain, 1)}
        report["tokens_taken"] = round(PLENTY - state.device(0).tokens)
        state.close()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
