"""The soft limiter on a real NVIDIA GPU; prints ONE JSON object.

Needs a GPU with its driver, `nvidia-smi`, `nvcc` (CUDA toolkit), gcc and make. Without them it
prints `{"ran": false, "why": ...}` and exits 0. Otherwise it:

1. builds `libcuda_limiter.so` (`make`) and `limiter_gpu.cu` (nvcc; it uses the CUDA runtime, which
   reaches the driver through `dlopen` + `cuGetProcAddress`, the path real programs take);
2. starts this machine's hypervisor (`--role=hypervisor --backend=local --devices=nvml
   --limiter-library ...`), which writes the worker's shared-memory file and runs the elastic rate
   limiter, and creates a soft worker with a `--vram` / `--percent` share on GPU 0 that runs:
   `info`, `alloc` of the share + 1 GiB (must be refused), `alloc` of 1 GiB (granted), `nvidia-smi`
   (must show the share as the memory total), then `spin` (as much compute as it can get);
3. samples the device's SM utilisation through NVML (host side, no limiter) while the worker spins,
   after a settling time, and the hypervisor's own view (`GET /api/v1/usage`);
4. spins once more without the library, for the unlimited baseline;
5. times empty launches without and with the library, the bucket never short (no throttling).

    python benchmarks/limiter_gpu.py [--vram-gib 4] [--percent 30] [--spin-s 60] [--settle-s 25]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.helpers.hypervisor_process import free_port, start, stop, wait_ready
from tfusion.hypervisor.shm.state import DeviceConfig
from tfusion.hypervisor.shm.store import ShmStore

HERE = Path(__file__).resolve().parent
LIMITER = HERE.parent / "native" / "limiter"
GIB = 1 << 30
PLENTY = 1e15


def missing() -> str:
    """Why this machine cannot run the check ('' when it can)."""
    for tool in ("nvcc", "nvidia-smi", "make", "gcc"):
        if shutil.which(tool) is None:
            return f"no {tool} on PATH"
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
    except Exception as exc:  # any NVML failure means "no GPU here"
        return f"NVML does not answer: {exc}"
    return "" if count else "NVML reports no GPU"


def build(out: Path) -> tuple[Path, Path]:
    subprocess.run(["make", "-s", "-C", str(LIMITER), f"BUILD={out / 'limiter'}"], check=True, timeout=300)
    program = out / "limiter_gpu"
    subprocess.run(["nvcc", "-O2", "-o", str(program), str(HERE / "limiter_gpu.cu")], check=True, timeout=600)
    return out / "limiter" / "libcuda_limiter.so", program


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


@contextmanager
def hypervisor(root: Path, library: Path) -> Iterator[str]:
    port = free_port()
    proc = start(["--role=hypervisor", "--backend=local", "--devices=nvml", "--port", str(port), "--state-dir",
                  str(root / "state"), "--node-name", "gpu-check", "--limiter-library", str(library)],
                 root / "hypervisor.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(proc, url, root / "hypervisor.log", timeout=60)
        yield url
    finally:
        stop(proc)


def device_utilisation(index: int, seconds: float) -> list[int]:
    """NVML's SM utilisation of the device every 0.5 s for `seconds` (read on the host: no limiter)."""
    import pynvml

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        samples = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(0.5)
            samples.append(int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu))
        return samples
    finally:
        pynvml.nvmlShutdown()


def hypervisor_percent(url: str, max_tflops: float, seconds: float) -> list[float]:
    """The worker's compute as the hypervisor measures it (`/api/v1/usage`), in percent of the GPU."""
    samples = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(1.0)
        rows = httpx.get(f"{url}/api/v1/usage", timeout=10).json()["data"]
        samples.append(round(100 * sum(r["compute_tflops"] for r in rows) / max_tflops, 1))
    return samples


def limited_run(args: argparse.Namespace, root: Path, library: Path, program: Path) -> dict[str, Any]:
    limit = args.vram_gib * GIB
    script = (f"{program} info; {program} alloc {limit + GIB}; {program} alloc {GIB}; "
              f"nvidia-smi --query-gpu=memory.total,memory.used --format=csv,noheader,nounits -i $GPU_INDEX; "
              f"exec {program} spin {args.spin_s}")
    with hypervisor(root, library) as url:
        device = httpx.get(f"{url}/api/v1/devices", timeout=10).json()["data"][0]
        share = {"vram": f"{args.vram_gib}Gi", "computePercent": str(args.percent)}
        created = httpx.post(f"{url}/api/v1/workers", timeout=30, json={
            "name": "gpu-check", "isolation": "soft", "requests": share, "limits": share, "gpuIds": [device["UUID"]],
            "command": f"sh -c '{script}'", "env": {"GPU_INDEX": str(device["Index"])}})
        created.raise_for_status()
        time.sleep(args.settle_s)
        measured = args.spin_s - args.settle_s - 5
        by_hypervisor = hypervisor_percent(url, float(device["MaxTflops"]) or 1.0, measured / 2)
        by_nvml = device_utilisation(int(device["Index"]), measured / 2)
        log = root / "state" / "logs" / "default" / "worker-gpu-check.log"
        deadline = time.monotonic() + args.spin_s
        while "launches" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(1)
        httpx.delete(f"{url}/api/v1/workers/gpu-check", timeout=30)
    text = log.read_text()
    lines = json_lines(text)
    smi = [line for line in text.splitlines() if line and line[0].isdigit() and "," in line]
    refused, granted = lines[1], lines[2]
    return {
        "gpu": device["Model"], "vram_limit_bytes": limit, "up_limit_percent": args.percent,
        "cuMemGetInfo_in_pod": lines[0],
        "alloc_past_limit": refused, "alloc_within_limit": granted,
        "refused_at_limit": refused["result"] == "cudaErrorMemoryAllocation" and granted["result"] == "cudaSuccess",
        "nvidia_smi_in_pod_mib": smi[0] if smi else None,
        "nvidia_smi_shows_share": bool(smi) and int(smi[0].split(",")[0]) == limit // (1 << 20),
        "sm_utilisation_nvml": {"median": statistics.median(by_nvml), "samples": by_nvml},
        "sm_utilisation_hypervisor": {"median": statistics.median(by_hypervisor), "samples": by_hypervisor},
        "spin": lines[-1],
        "worker_stderr": [line for line in text.splitlines() if line.startswith("tfusion-limiter")],
    }


def unlimited_utilisation(program: Path, index: int, seconds: float) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "TF_SHM_PATH")}
    env["CUDA_VISIBLE_DEVICES"] = str(index)
    proc = subprocess.Popen([str(program), "spin", str(seconds + 4)], env=env, stdout=subprocess.DEVNULL)
    try:
        time.sleep(2)
        return float(statistics.median(device_utilisation(index, seconds)))
    finally:
        proc.wait(timeout=seconds + 30)


def launch_overhead(root: Path, library: Path, program: Path, uuid: str, index: int) -> dict[str, float]:
    """Empty launches without and with the library; the bucket is never short (no throttling)."""
    state = ShmStore(root / "bench-shm").create("bench", "gpu", [DeviceConfig(
        slot=0, uuid=uuid, up_limit=100, mem_limit=0)])
    state.set_bucket(0, refill_rate=PLENTY, capacity=PLENTY)
    base = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "TF_SHM_PATH")}
    base["CUDA_VISIBLE_DEVICES"] = str(index)
    limited = {**base, "LD_PRELOAD": str(library), "TF_SHM_PATH": str(state.path)}

    def best(env: dict[str, str]) -> float:
        runs = []
        for _ in range(3):
            state.heartbeat()
            state.update_tokens(0, lambda _: PLENTY)
            out = subprocess.run([str(program), "bench", "200000"], env=env, capture_output=True, text=True,
                                 timeout=300, check=True).stdout
            runs.append(float(json_lines(out)[0]["ns_per_launch"]))
        return min(runs)

    without, with_library = best(base), best(limited)
    state.close()
    return {"ns_per_launch_without": round(without, 1), "ns_per_launch_with": round(with_library, 1),
            "overhead_ns_per_launch": round(with_library - without, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vram-gib", type=int, default=4)
    parser.add_argument("--percent", type=int, default=30)
    parser.add_argument("--spin-s", type=int, default=60)
    parser.add_argument("--settle-s", type=int, default=25)
    args = parser.parse_args()
    why = missing()
    if why:
        print(json.dumps({"ran": False, "why": why}))
        return
    with tempfile.TemporaryDirectory(prefix="tf-limiter-gpu-") as tmp:
        root = Path(tmp)
        library, program = build(root / "build")
        report: dict[str, Any] = {"ran": True}
        report["limited"] = limited_run(args, root, library, program)
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        uuid = str(pynvml.nvmlDeviceGetUUID(handle))
        pynvml.nvmlShutdown()
        report["unlimited_sm_utilisation_median"] = unlimited_utilisation(program, 0, 10)
        report["launch_overhead"] = launch_overhead(root, library, program, uuid, 0)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
