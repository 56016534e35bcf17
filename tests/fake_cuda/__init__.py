"""Builds tfusion's limiter (`native/limiter`, with `make`), a fake CUDA driver (fake_cuda.c, as
`libcuda.so.1`) and the probe program (probe.c) twice: linked against the driver, and resolving
everything through `dlopen` + `cuGetProcAddress_v2` as the CUDA 12 runtime does. `Probe` runs one
under the limiter (LD_PRELOAD) and reads the JSON lines it prints, with deadlines.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.cbuild import compile_c
from tests.cbuild import gcc as gcc  # re-exported: the callers ask it before building

HERE = Path(__file__).parent
LIMITER_SOURCE = HERE.parent.parent / "native" / "limiter"
#: what the fake reports for device i: the last byte is i
DEVICE_UUID = "GPU-5f3a1c2e-7e57-4000-8000-0000000000{:02x}"


def make() -> str | None:
    return shutil.which("make")


@dataclass(frozen=True)
class Binaries:
    limiter: Path
    driver_dir: Path  # holds the fake libcuda.so.1
    probe_linked: Path
    probe_runtime: Path

    def probe(self, how: str) -> Path:
        return self.probe_runtime if how == "runtime" else self.probe_linked


def build_limiter(out_dir: Path) -> Path:
    """`make BUILD=out_dir` in native/limiter; raises with make's output."""
    result = subprocess.run(["make", "-s", "-C", str(LIMITER_SOURCE), f"BUILD={out_dir}"],
                            capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise RuntimeError(f"building libcuda_limiter.so failed:\n{result.stdout}{result.stderr}")
    return out_dir / "libcuda_limiter.so"


def build(out_dir: Path) -> Binaries:
    driver, linked, runtime = build_fakes(out_dir)
    return Binaries(build_limiter(out_dir / "limiter"), driver.parent, linked, runtime)


def build_fakes(out_dir: Path) -> tuple[Path, Path, Path]:
    """The fake driver (`out_dir/driver/libcuda.so.1`) and the two probes (linked, runtime-style)."""
    include = f"-I{LIMITER_SOURCE}"
    driver = compile_c(HERE / "fake_cuda.c", out_dir / "driver" / "libcuda.so.1",
                       [include, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-Wl,-Bsymbolic"],
                       "the fake CUDA driver")
    linked = compile_c(HERE / "probe.c", out_dir / "probe_linked",
                       ["-std=c11", include, "-Wl,--no-as-needed", str(driver)], "the linked probe")
    runtime = compile_c(HERE / "probe.c", out_dir / "probe_runtime",
                        ["-std=c11", include, "-DVIA_GET_PROC_ADDRESS", "-Wl,--no-as-needed", "-ldl"],
                        "the runtime-style probe")
    return driver, linked, runtime


def environment(binaries: Binaries, shm_path: Path | None, **extra: str) -> dict[str, str]:
    """The probe's environment: the limiter preloaded, the fake driver on the library path."""
    env = {k: v for k, v in os.environ.items() if k not in ("TF_SHM_PATH", "DISABLE_GPU_LIMITER", "LD_PRELOAD")}
    env["LD_PRELOAD"] = str(binaries.limiter)
    env["LD_LIBRARY_PATH"] = str(binaries.driver_dir)
    if shm_path is not None:
        env["TF_SHM_PATH"] = str(shm_path)
    env.update(extra)
    return env


class Probe:
    """A running probe; `line()` is its next JSON line (or fails at the deadline)."""

    def __init__(self, program: Path, args: list[str], env: dict[str, str]) -> None:
        self.process = subprocess.Popen([str(program), *args], env=env, stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for text in self.process.stdout:
            self._lines.put(text)
        self._lines.put(None)

    def line(self, timeout: float = 20.0) -> dict[str, Any]:
        try:
            text = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"the probe printed nothing within {timeout} s") from None
        if text is None:
            raise AssertionError(f"the probe ended: {self.finish()}")
        value = json.loads(text)
        assert isinstance(value, dict)
        return value

    def quiet_for(self, seconds: float) -> bool:
        """True when the probe printed nothing for `seconds` (it is blocked)."""
        try:
            text = self._lines.get(timeout=seconds)
        except queue.Empty:
            return True
        self._lines.put(text)  # a line came: put it back for `line()` (order within the test is kept)
        return False

    def release(self) -> None:
        """Close stdin: a probe holding its allocations frees them and goes on."""
        assert self.process.stdin is not None
        self.process.stdin.close()

    def finish(self, timeout: float = 20.0) -> str:
        """Wait for the exit; returns stderr (raises when the exit status is not 0)."""
        if self.process.stdin and not self.process.stdin.closed:
            self.process.stdin.close()
        self.process.wait(timeout=timeout)
        assert self.process.stderr is not None
        errors = self.process.stderr.read()
        if self.process.returncode != 0:
            raise AssertionError(f"the probe exited {self.process.returncode}: {errors}")
        return errors


def run(program: Path, args: list[str], env: dict[str, str]) -> tuple[list[dict[str, Any]], str]:
    """Run a probe to its end: its JSON lines and its stderr."""
    result = subprocess.run([str(program), *args], env=env, capture_output=True, text=True, timeout=60,
                            stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        raise AssertionError(f"{program.name} {args} exited {result.returncode}: {result.stderr}")
    return [json.loads(line) for line in result.stdout.splitlines()], result.stderr
