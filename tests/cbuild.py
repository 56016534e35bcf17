"""Compiling the tests' C helpers (the fake NVML library, the shared-memory reader) with the
machine's C compiler; tests that need one skip with a reason where there is none."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


def gcc() -> str | None:
    return shutil.which("gcc") or shutil.which("cc")


def compile_c(source: Path, target: Path, flags: list[str], what: str) -> Path:
    """`cc <flags> -o target source`; raises with the compiler's message."""
    compiler = gcc()
    if compiler is None:
        raise FileNotFoundError("no C compiler (gcc or cc) on PATH")
    target.parent.mkdir(parents=True, exist_ok=True)
    result = subprocess.run([compiler, *flags, "-O1", "-Wall", "-Werror", "-o", str(target), str(source)],
                            capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise RuntimeError(f"building {what} failed:\n{result.stderr}")
    return target
