"""`tfusion --role=hypervisor --backend=local` and its bearer token (issue 11): the local backend's
POST /api/v1/workers runs a command, so a hypervisor that would listen beyond loopback refuses to
start without --api-token-file (exit 1, one line naming the flag), and one given a token file
wants that token for creating and deleting workers. Real processes; the one that serves listens
on a free loopback port (the refusal happens before anything is bound)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.helpers.hypervisor_process import free_port, start, stop, wait_ready

SPEC = "sim:1xA100-SXM4-80GB"


def local_args(tmp_path: Path, *extra: str) -> list[str]:
    return ["--role=hypervisor", "--backend=local", f"--devices={SPEC}", "--node-name=token-box",
            f"--state-dir={tmp_path / 'state'}", f"--metrics-output-path={tmp_path / 'metrics.log'}", *extra]


def run_to_exit(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tfusion", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_local_backend_beyond_loopback_without_a_token_file_exits_1(tmp_path: Path, host: str) -> None:
    done = run_to_exit(local_args(tmp_path, f"--host={host}", "--port=0"))
    assert done.returncode == 1, (done.stdout, done.stderr)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "--api-token-file is required" in lines[0] and f"--host={host}" in lines[0], lines


def test_an_empty_token_file_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "token"
    empty.write_text("\n")
    done = run_to_exit(local_args(tmp_path, "--host=0.0.0.0", "--port=0", f"--api-token-file={empty}"))
    assert done.returncode == 1 and "the file is empty" in done.stderr, done.stderr


def test_with_a_token_file_the_worker_routes_need_the_token(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    port = free_port()
    log = tmp_path / "log.txt"
    proc = start(local_args(tmp_path, "--host=127.0.0.1", f"--port={port}", f"--api-token-file={token_file}"), log)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(proc, url, log)
        with httpx.Client(base_url=url, timeout=10) as http:
            worker = {"name": "w1", "gpuCount": 1}
            missing = http.post("/api/v1/workers", json=worker)
            assert missing.status_code == 401 and "missing authorization" in missing.json()["error"], missing.text
            assert missing.headers["www-authenticate"] == "Bearer"
            wrong = http.post("/api/v1/workers", json=worker, headers={"Authorization": "Bearer s3cret-tokeX"})
            assert wrong.status_code == 401 and "invalid token" in wrong.json()["error"], wrong.text
            assert http.get("/api/v1/workers").json()["data"] == []  # nothing was created
            good = {"Authorization": "Bearer s3cret-token"}
            created = http.post("/api/v1/workers", json=worker, headers=good)
            assert created.status_code == 201, created.text
            uid = created.json()["data"]["WorkerInfo"]["WorkerUID"]
            assert http.delete(f"/api/v1/workers/{uid}").status_code == 401
            assert http.delete(f"/api/v1/workers/{uid}", headers=good).status_code == 200
            assert http.get("/api/v1/devices").status_code == 200  # reading needs no token
    finally:
        assert stop(proc) == 0, log.read_text()
