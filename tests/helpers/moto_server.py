"""moto's AWS server (`python -m moto.server`) as a process of the test's own, on a free loopback port:
the EC2 API the AWS provider's tests launch instances on. Started once per test module, emptied
between tests (`reset`), killed with its whole process group at the end."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.role_all import free_ports

REGION = "us-east-1"
#: moto accepts any keys; these keep boto3 from looking for real ones
KEYS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


def missing() -> str:
    """Why the AWS tests cannot run here ("" when they can)."""
    absent = [name for name in ("boto3", "moto.server", "flask") if _absent(name)]
    return f"{', '.join(absent)} not importable: pip install 'boto3>=1.34' 'moto[server]>=5'" if absent else ""


def _absent(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except ModuleNotFoundError:
        return True


class MotoServer:
    def __init__(self, proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
        self.proc = proc
        self.url = url
        self.log = log
        self._clients: dict[str, Any] = {}

    def client(self, service: str) -> Any:
        """A boto3 client on the server (made once per service: making one takes most of a second)."""
        if service not in self._clients:
            import boto3

            session = boto3.session.Session(region_name=REGION, **KEYS)
            self._clients[service] = session.client(service, endpoint_url=self.url)
        return self._clients[service]

    def reset(self) -> None:
        httpx.post(f"{self.url}/moto-api/reset", timeout=10).raise_for_status()

    @contextmanager
    def auth_enforced(self) -> Iterator[None]:
        """Requests signed with keys of the server's IAM users only, as their policies allow (moto
        accepts any key otherwise)."""
        httpx.post(f"{self.url}/moto-api/reset-auth", content=b"0", timeout=10).raise_for_status()
        try:
            yield
        finally:
            httpx.post(f"{self.url}/moto-api/reset-auth", content=b"inf", timeout=10).raise_for_status()


@contextmanager
def moto_server(log: Path, *, attempts: int = 3) -> Iterator[MotoServer]:
    """A running server; a port taken between choosing and binding it is retried on another."""
    for _ in range(attempts):
        (port,) = free_ports(1)
        url = f"http://127.0.0.1:{port}"
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            if _wait_ready(proc, url):
                yield MotoServer(proc, url, log)
                return
        finally:
            _kill(proc)
    pytest.fail(f"moto's server did not start after {attempts} attempts:\n{log.read_text()}")


def _wait_ready(proc: subprocess.Popen[bytes], url: str, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            if httpx.get(f"{url}/moto-api/data.json", timeout=2).status_code == 200:
                return True
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    return False


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """The server and anything it started: its process group (it was started in a session of its own).
    SIGKILL at once: its state is the test's and goes with it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)
