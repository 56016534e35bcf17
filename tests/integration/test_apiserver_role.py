"""`tfusion --role=apiserver` as a real process: starts, writes its kubeconfig, serves, stops on SIGTERM,
and keeps its objects across restarts."""

from __future__ import annotations

import base64
import signal
import sqlite3
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml


def _command(listen: str, state: Path, kubeconfig: Path) -> list[str]:
    return [sys.executable, "-m", "tfusion", "--role=apiserver", "--listen", listen,
            "--state", str(state), "--kubeconfig-out", str(kubeconfig)]


def _start(workdir: Path, listen: str) -> tuple[subprocess.Popen[bytes], str, dict[str, str]]:
    kubeconfig = workdir / "kubeconfig"
    kubeconfig.unlink(missing_ok=True)
    proc = subprocess.Popen(
        _command(listen, workdir / "state.db", kubeconfig),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 20
    while not kubeconfig.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"apiserver did not start: {proc.communicate()[0].decode()}")
        time.sleep(0.05)
    config = yaml.safe_load(kubeconfig.read_text())
    url = config["clusters"][0]["cluster"]["server"]
    user = config["users"][0]["user"] or {}
    headers = {"authorization": f"Bearer {user['token']}"} if user.get("token") else {}
    return proc, url, headers


def _stop(proc: subprocess.Popen[bytes]) -> str:
    proc.send_signal(signal.SIGTERM)
    try:
        output = proc.communicate(timeout=10)[0].decode()
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    assert proc.returncode == 0, output
    return output


def _verify(workdir: Path) -> ssl.SSLContext:
    """Trusts the server certificate whose CA the kubeconfig carries."""
    config = yaml.safe_load((workdir / "kubeconfig").read_text())
    ca = base64.b64decode(config["clusters"][0]["cluster"]["certificate-authority-data"]).decode()
    return ssl.create_default_context(cadata=ca)


def test_role_serves_and_persists_across_restarts(tmp_path: Path) -> None:
    proc, url, headers = _start(tmp_path, "127.0.0.1:0")
    try:
        # loopback is HTTPS with a token too: any local process could reach a plain, open port
        assert url.startswith("https://127.0.0.1:") and headers
        client = httpx.Client(base_url=url, headers=headers, verify=_verify(tmp_path))
        created = client.post("/api/v1/namespaces/default/configmaps", json={"metadata": {"name": "kept"}})
        assert created.status_code == 201
        rv = int(created.json()["metadata"]["resourceVersion"])
    finally:
        output = _stop(proc)
    assert "Traceback" not in output
    proc, url, again = _start(tmp_path, "127.0.0.1:0")
    assert again == headers  # the admin token is kept in the state file
    try:
        client = httpx.Client(base_url=url, headers=headers, verify=_verify(tmp_path))
        kept = client.get("/api/v1/namespaces/default/configmaps/kept")
        assert kept.status_code == 200 and int(kept.json()["metadata"]["resourceVersion"]) == rv
        later = client.post("/api/v1/namespaces/default/configmaps", json={"metadata": {"name": "later"}})
        assert int(later.json()["metadata"]["resourceVersion"]) > rv
    finally:
        _stop(proc)


def test_role_on_a_non_loopback_address_uses_https_and_a_token(tmp_path: Path) -> None:
    proc, url, headers = _start(tmp_path, "0.0.0.0:0")
    try:
        assert url.startswith("https://127.0.0.1:") and headers
        config = yaml.safe_load((tmp_path / "kubeconfig").read_text())
        assert config["clusters"][0]["cluster"]["certificate-authority-data"]
        assert httpx.get(f"{url}/api/v1/namespaces", verify=False).status_code == 401
        assert httpx.get(f"{url}/api/v1/namespaces", headers=headers, verify=False).status_code == 200
    finally:
        _stop(proc)


def test_role_reports_a_busy_port_in_one_line(tmp_path: Path) -> None:
    first = tmp_path / "first"
    first.mkdir()
    proc, url, _ = _start(first, "127.0.0.1:0")
    try:
        port = url.rsplit(":", 1)[1]
        second = subprocess.run(
            _command(f"127.0.0.1:{port}", tmp_path / "second.db", tmp_path / "kc2"),
            capture_output=True,
            text=True,
            timeout=20,
        )
        assert second.returncode == 1
        assert "apiserver cannot start" in second.stderr and "Address already in use" in second.stderr
        assert "Traceback" not in second.stderr
    finally:
        _stop(proc)


def test_one_server_per_state_file(tmp_path: Path) -> None:
    proc, _, _ = _start(tmp_path, "127.0.0.1:0")
    try:
        second = subprocess.run(
            _command("127.0.0.1:0", tmp_path / "state.db", tmp_path / "kc2"),
            capture_output=True,
            text=True,
            timeout=20,
        )
        assert second.returncode == 1 and "is another API server using it?" in second.stderr
    finally:
        _stop(proc)


def test_a_state_file_of_a_newer_schema_is_refused_in_one_line_and_left_as_it_was(tmp_path: Path) -> None:
    """A downgrade: the file a newer tfusion wrote is not read with this one's layout."""
    state = tmp_path / "state.db"
    db = sqlite3.connect(state)
    db.execute("CREATE TABLE objects (skey TEXT, ns TEXT, name TEXT, rv INTEGER, data BLOB)")
    db.execute("CREATE TABLE meta (k TEXT PRIMARY KEY, v BLOB NOT NULL)")
    db.execute("INSERT INTO meta VALUES ('schema', CAST('99' AS BLOB)), ('written_by', CAST('9.0.0' AS BLOB))")
    db.commit()
    db.close()
    before = state.read_bytes()
    run = subprocess.run(_command("127.0.0.1:0", state, tmp_path / "kc"), capture_output=True, text=True,
                         timeout=20)
    assert run.returncode == 1, run.stderr
    assert "apiserver cannot start" in run.stderr and "store schema 99, written by tfusion 9.0.0" in run.stderr
    assert "Traceback" not in run.stderr and state.read_bytes() == before
