"""The command line run two ways: `tfusion.cli.main` in-process, and `python -m tfusion` as a process."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from tfusion import cli


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code: Any = cli.main(argv)
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return int(code or 0), out, err


def run_tfusion(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("TENSOR_FUSION_", "HYPERVISOR_"))}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "tfusion", *args], capture_output=True, text=True,
                          timeout=60, env=full_env, check=False)
