"""tfusion --role=all started as a process for end-to-end tests, with kubectl on its API server."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

T = TypeVar("T")


NODE = "test-node"


POOL = "tensor-fusion-shared"


TF = "/apis/tensor-fusion.ai/v1"


def free_ports(count: int) -> list[int]:
    """`count` distinct free ports (all held open while choosing, so none repeats)."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]
    finally:
        for sock in socks:
            sock.close()


class RoleAll:
    """One `python -m tfusion --role=all` process and the addresses it serves."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        api, controller, hypervisor, probes, console = free_ports(5)
        self.api = f"https://127.0.0.1:{api}"  # the embedded API server: HTTPS and a token
        self.controller = f"http://127.0.0.1:{controller}"
        self.hypervisor = f"http://127.0.0.1:{hypervisor}"
        self.console = f"http://127.0.0.1:{console}"
        self.kubeconfig = tmp / "kubeconfig"
        self.args = [
            "--role=all", "--apiserver-listen", self.api.removeprefix("https://"),
            "--controller-listen", self.controller.removeprefix("http://"),
            "--health-probe-bind-address", f"127.0.0.1:{probes}", "--port", str(hypervisor),
            "--webhook-listen", "127.0.0.1:0",
            "--state", str(tmp / "state.db"), "--kubeconfig-out", str(self.kubeconfig),
            "--state-dir", str(tmp / "hv"), "--metrics-output-path", str(tmp / "metrics.log"),
            "--node-name", NODE,
            # the console costs a cache of its own: only the tests that look at it serve it
            "--console-listen", "off",
        ]
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = tmp / "log0.txt"
        self.runs = 0

    def serve_console(self) -> None:
        """Serve the console at `self.console` (the default for users; off in the other tests)."""
        at = self.args.index("--console-listen")
        self.args[at + 1] = self.console.removeprefix("http://")

    def start(self) -> None:
        self.runs += 1
        self.log = self.tmp / f"log{self.runs}.txt"
        env = {**os.environ, "HOME": str(self.tmp)}
        env.pop("KUBECONFIG", None)
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "tfusion", *self.args], stdout=out,
                                         stderr=subprocess.STDOUT, env=env, cwd=self.tmp, start_new_session=True)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, what: str, check: Callable[[], T | None], timeout: float = 20.0) -> T:
        """Poll `check` until it returns something truthy; fail with the log when it never does."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                pytest.fail(f"tfusion exited with {self.proc.returncode} while waiting for {what}:\n{self.output()}")
            try:
                result = check()
                if result:
                    return result
                last = result
            except (httpx.TransportError, AssertionError, KeyError) as exc:
                last = exc
            time.sleep(0.1)
        pytest.fail(f"{what} not seen after {timeout} s (last: {last!r}):\n{self.output()}")

    def denials(self) -> list[str]:
        """Requests the embedded API server refused to the controller or the hypervisor (every run's
        log): in --role=all they run as their ServiceAccounts under the RBAC deploy/ ships, so each
        line names a rule that RBAC lacks."""
        return [line for log in sorted(self.tmp.glob("log*.txt"))
                for line in log.read_text(errors="replace").splitlines()
                if "RBAC DENIED system:serviceaccount:" in line and "tensor-fusion" in line]

    def ready(self) -> bool:
        return all(httpx.get(f"{url}/readyz", timeout=2).status_code == 200
                   for url in (self.controller, self.hypervisor))

    def stop(self, grace: float = 5.0) -> tuple[int, float]:
        """SIGTERM; returns (exit code, seconds it took). Kills the group when it overstays."""
        assert self.proc is not None
        began = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"tfusion did not exit within {grace} s of SIGTERM:\n{self.output()}")
        return code, time.monotonic() - began

    def shut_down(self, grace: float = 5.0) -> None:
        """Fixture teardown: SIGTERM if still running, the group killed when it overstays."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=5)

    # --- reading the cluster ------------------------------------------------------------------------

    def get(self, path: str) -> Any:
        response = httpx.get(f"{self.api}{path}", timeout=5, **self._api_auth())
        assert response.status_code == 200, f"GET {path}: {response.status_code} {response.text}"
        return response.json()

    def _api_auth(self) -> dict[str, Any]:
        """The admin token and CA from the kubeconfig the process wrote."""
        import base64
        import ssl

        import yaml

        if not self.kubeconfig.exists():
            raise AssertionError("the API server has not written its kubeconfig yet")
        config = yaml.safe_load(self.kubeconfig.read_text())
        ca = base64.b64decode(config["clusters"][0]["cluster"]["certificate-authority-data"]).decode()
        token = config["users"][0]["user"]["token"]
        return {"headers": {"authorization": f"Bearer {token}"}, "verify": ssl.create_default_context(cadata=ca)}

    def node_gpus(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.get(
            f"{TF}/gpus?labelSelector=tensor-fusion.ai/managed-by%3D{NODE}")["items"]
        return sorted(items, key=lambda g: g["status"].get("index", 0) if g.get("status") else 0)


@pytest.fixture
def role_all(tmp_path: Path) -> Iterator[RoleAll]:
    process = RoleAll(tmp_path)
    yield process
    process.shut_down()
    assert process.denials() == [], "the shipped RBAC refused the controller or the hypervisor"


@pytest.fixture(scope="module")
def role_all_ready(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RoleAll]:
    """One started and ready --role=all process for a whole module (its tests use names of their own),
    so a module of end-to-end checks pays for one start. Its log must show no ASGI error."""
    process = RoleAll(tmp_path_factory.mktemp("role-all"))
    process.start()
    process.wait_for("the controller and hypervisor to be ready", process.ready, timeout=60)
    yield process
    process.shut_down()
    assert "ASGI" not in process.output(), "the API server logged an ASGI error"
    assert process.denials() == [], "the shipped RBAC refused the controller or the hypervisor"


def reported_gpus(run: RoleAll) -> list[dict[str, Any]] | None:
    gpus = run.node_gpus()
    done = len(gpus) == 3 and all((g.get("status") or {}).get("phase") == "Running"
                                  and (g["status"].get("capacity") or {}).get("tflops") for g in gpus)
    return gpus if done else None
