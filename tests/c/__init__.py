"""Builds `shm_reader` (shm_reader.c), a C program that reads and changes the soft limiter's
shared-memory file as a C limiter would, and runs it (the tests compare its JSON with the API)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).with_name("shm_reader.c")


def gcc() -> str | None:
    return shutil.which("gcc") or shutil.which("cc")


def build(out_dir: Path) -> Path:
    """Compile the reader into `out_dir/shm_reader`; raises with the compiler's message."""
    compiler = gcc()
    if compiler is None:
        raise FileNotFoundError("no C compiler (gcc or cc) on PATH")
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / "shm_reader"
    result = subprocess.run([compiler, "-std=c11", "-D_GNU_SOURCE", "-O1", "-Wall", "-Werror", "-o", str(target),
                             str(SOURCE)], capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise RuntimeError(f"building shm_reader failed:\n{result.stderr}")
    return target


def run(reader: Path, *args: str | Path | int | float) -> Any:
    """Run the reader and parse its one line of JSON; raises with its stderr when it fails."""
    result = subprocess.run([str(reader), *map(str, args)], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise RuntimeError(f"shm_reader {' '.join(map(str, args))} exited {result.returncode}: {result.stderr}")
    return json.loads(result.stdout)
