"""The real kubectl for tests, in one place: where it is, the mark that skips a test on a machine
without it, and a runner bound to one kubeconfig and one discovery cache. Test modules that drive
kubectl import these instead of each finding the binary and wrapping subprocess again."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

KUBECTL = shutil.which("kubectl") or "/usr/bin/kubectl"

# Long enough for a cold discovery and OpenAPI download; short enough that a hanging command fails the test.
TIMEOUT = 60

needs_kubectl = pytest.mark.skipif(not Path(KUBECTL).exists(), reason="kubectl is not installed")


class Kubectl:
    """kubectl on one kubeconfig, with its own cache dir so discovery cached by one test never answers another."""

    def __init__(self, kubeconfig: str | Path, cache: Path) -> None:
        self.base = [KUBECTL, "--kubeconfig", str(kubeconfig), "--cache-dir", str(cache)]

    def __call__(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Runs `kubectl args`; with `check`, a non-zero exit fails the test naming the command and its output."""
        result = subprocess.run([*self.base, *args], capture_output=True, text=True, input=input, timeout=TIMEOUT)
        if check and result.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
            )
        return result

    def out(self, *args: str, input: str | None = None) -> str:
        """The stdout of a command that must succeed."""
        return self(*args, input=input).stdout
