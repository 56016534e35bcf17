"""Builds `shm_reader` (shm_reader.c), a C program that reads and changes the soft limiter's
shared-memory file as a C limiter would, and runs it (the tests compare its JSON with the API)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tests.cbuild import compile_c
from tests.cbuild import gcc as gcc  # re-exported: the callers ask it before building

SOURCE = Path(__file__).with_name("shm_reader.c")


def build(out_dir: Path) -> Path:
    """Compile the reader into `out_dir/shm_reader`; raises with the compiler's message."""
    return compile_c(SOURCE, out_dir / "shm_reader", ["-std=c11", "-D_GNU_SOURCE"], "shm_reader")


def run(reader: Path, *args: str | Path | int | float) -> Any:
    """Run the reader and parse its one line of JSON; raises with its stderr when it fails."""
    result = subprocess.run([str(reader), *map(str, args)], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise RuntimeError(f"shm_reader {' '.join(map(str, args))} exited {result.returncode}: {result.stderr}")
    return json.loads(result.stdout)
