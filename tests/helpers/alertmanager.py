"""A real Alertmanager for tests (Debian's `prometheus-alertmanager`; `.ci/run` installs it): one per
call of `start()`, in a temporary directory on a free loopback port, without clustering, killed by
`stop()` (and by `timeout -s KILL` if a test forgets it). `ALERTMANAGER` is None when missing, and a
test then skips saying so."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.helpers.metrics_servers import kill_group, poll, start_group
from tests.helpers.role_all import free_ports

ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
ALERTMANAGER_MISSING = ("prometheus-alertmanager is not installed (Debian package prometheus-alertmanager); "
                        ".ci/run installs it")


class Alertmanager:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self) -> str:
        """The server's base URL, once it is ready."""
        assert ALERTMANAGER is not None
        self.root.mkdir(parents=True, exist_ok=True)
        (port,) = free_ports(1)
        config = self.root / "alertmanager.yml"
        config.write_text(yaml.safe_dump({"route": {"receiver": "nobody"}, "receivers": [{"name": "nobody"}]}))
        log = self.root / "alertmanager.log"
        self.proc = start_group([ALERTMANAGER, f"--config.file={config}", f"--storage.path={self.root / 'data'}",
                                 f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="], log)
        self.url = f"http://127.0.0.1:{port}"
        poll("alertmanager ready", lambda: httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200,
             log=lambda: log.read_text(errors="replace"))
        return self.url

    def active_alerts(self) -> list[dict[str, Any]]:
        """The alerts Alertmanager holds as active (not resolved), as its v2 API lists them."""
        response = httpx.get(f"{self.url}/api/v2/alerts", params={"active": "true"}, timeout=10)
        assert response.status_code == 200, response.text
        alerts: list[dict[str, Any]] = response.json()
        return [a for a in alerts if a["status"]["state"] == "active"]

    def stop(self) -> None:
        kill_group(self.proc)
        self.proc = None
