"""Starting and stopping the tfusion processes benchmarks measure, written once: the benchmarks that
run a whole `tfusion --role=all` need the same ports, readiness wait and kubeconfig CA, and every
benchmark stops its children the same way. Imported by the sibling scripts (run as
`python benchmarks/<name>.py`, so this folder is on sys.path)."""

from __future__ import annotations

import base64
import os
import random
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import httpx
import yaml


def _ephemeral_low() -> int:
    """The first port of the kernel's range for outgoing connections' source ports (0: unknown)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _bind_below(sock: socket.socket, low: int) -> None:
    """Bind `sock` to a loopback port below `low` when there is room there, else to any port: a
    port from inside the ephemeral range can become the source port of an outgoing connection
    between this check and the server's bind (seen once in scale.py, whose processes keep dozens
    of connections open)."""
    for _ in range(200 if low > 11000 else 0):
        try:
            sock.bind(("127.0.0.1", random.randrange(10000, low)))
            return
        except OSError:
            continue
    sock.bind(("127.0.0.1", 0))


def free_ports(count: int) -> list[int]:
    """`count` distinct loopback ports, all bound at once so none is handed out twice, below the
    ephemeral range where it has room."""
    low = _ephemeral_low()
    socks = [socket.socket() for _ in range(count)]
    for sock in socks:
        _bind_below(sock, low)
    ports = [int(sock.getsockname()[1]) for sock in socks]
    for sock in socks:
        sock.close()
    return ports


def stop(proc: subprocess.Popen[bytes], grace_s: float = 10) -> None:
    """SIGTERM (so the process shuts down as in production), then kill it if it has not exited."""
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def role_all(tmp: Path, *extra: str, stderr: IO[bytes] | int = subprocess.DEVNULL,
             ready_s: float = 90) -> Iterator[dict[str, Any]]:
    """Run `tfusion --role=all` (plus `extra` flags) with its state under `tmp`, ready to serve
    (kubeconfig written, controller /readyz 200); stopped on leaving. Yields where it listens: base
    URLs "api" (HTTPS), "controller", "probes" and "hypervisor", their "ports", "verify" (an SSL
    context trusting the kubeconfig's CA), the kubeconfig's bearer "token" and the "proc"."""
    api, controller, probes, hypervisor = free_ports(4)
    kubeconfig = tmp / "kubeconfig"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tfusion", "--role=all", *extra, "--apiserver-listen", f"127.0.0.1:{api}",
         "--controller-listen", f"127.0.0.1:{controller}", "--health-probe-bind-address", f"127.0.0.1:{probes}",
         "--port", str(hypervisor), "--state", str(tmp / "state.db"), "--kubeconfig-out", str(kubeconfig),
         "--state-dir", str(tmp / "hv"), "--metrics-output-path", str(tmp / "metrics.log"), "--node-name", "bench"],
        stdout=subprocess.DEVNULL, stderr=stderr, cwd=tmp, env={**os.environ, "HOME": str(tmp)})
    try:
        controller_url = f"http://127.0.0.1:{controller}"
        wait_ready(proc, kubeconfig, f"{controller_url}/readyz", ready_s)
        config = yaml.safe_load(kubeconfig.read_text())
        ca = base64.b64decode(config["clusters"][0]["cluster"]["certificate-authority-data"]).decode()
        yield {"api": f"https://127.0.0.1:{api}", "controller": controller_url,
               "probes": f"http://127.0.0.1:{probes}", "hypervisor": f"http://127.0.0.1:{hypervisor}",
               "ports": {"api": api, "controller": controller, "probes": probes, "hypervisor": hypervisor},
               "verify": ssl.create_default_context(cadata=ca), "token": config["users"][0]["user"]["token"],
               "proc": proc}
    finally:
        stop(proc)


def wait_ready(proc: subprocess.Popen[bytes], kubeconfig: Path, readyz: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"tfusion --role=all exited with {proc.returncode} before it was ready")
        try:
            if kubeconfig.exists() and httpx.get(readyz, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"tfusion --role=all did not become ready within {seconds:g} s")
