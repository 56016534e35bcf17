"""`tfusion state backup` of a running embedded API server (through its admin-only route, since the
server holds the file's lock), `tfusion state restore` refused while it runs and working into a free
file, and the restored file serving what was backed up."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tfusion.apiserver.app import STATE_BACKUP_PATH
from tfusion.apiserver.statefile import SCHEMA_VERSION
from tfusion.apiserver.store import Store
from tfusion.cli import main
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient


@pytest.mark.anyio
async def test_backup_while_running_restore_refused_while_running_and_restored_into_a_free_file(
        apiserver: Any, kube: KubeClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    await kube.create(r.CONFIGMAPS, {"metadata": {"name": "kept"}, "data": {"k": "v"}}, namespace="default")
    backup = tmp_path / "backup.db"
    state = str(apiserver.state)

    assert main(["state", "backup", str(backup), "--state", state, "--kubeconfig", apiserver.kubeconfig]) == 0
    out = capsys.readouterr().out
    assert "from the API server running on it" in out and f"store schema {SCHEMA_VERSION}" in out
    assert backup.stat().st_mode & 0o777 == 0o600, "a backup holds the keys and tokens"
    assert not backup.with_name("backup.db.partial").exists()
    assert main(["state", "backup", str(backup), "--state", state, "--kubeconfig", apiserver.kubeconfig]) == 1
    assert "exists; choose another name" in capsys.readouterr().err

    assert main(["state", "restore", str(backup), "--state", state]) == 1
    err = capsys.readouterr().err
    assert "is in use: a running tfusion holds its lock" in err and "stop it first" in err

    restored = tmp_path / "other" / "state.db"
    assert main(["state", "restore", str(backup), "--state", str(restored)]) == 0
    assert "restored" in capsys.readouterr().out
    store = Store(restored, 10)
    try:
        entry = store.get("/configmaps", "default", "kept")
        assert entry is not None and entry.obj["data"] == {"k": "v"}
        assert store.get_meta("admin.token") == apiserver.token.encode()
    finally:
        store.close()

    # offline: the restored file, no server on it, is read directly
    again = tmp_path / "again.db"
    assert main(["state", "backup", str(again), "--state", str(restored)]) == 0
    assert "directly (no server was running on it)" in capsys.readouterr().out
    db = sqlite3.connect(again)
    assert db.execute("SELECT count(*) FROM objects WHERE name = 'kept'").fetchone() == (1,)
    db.close()

    garbage = tmp_path / "garbage.db"
    garbage.write_text("not a database " * 20)
    assert main(["state", "restore", str(garbage), "--state", str(restored)]) == 1
    assert "is not a tfusion state file" in capsys.readouterr().err


@pytest.mark.anyio
async def test_the_backup_route_is_for_the_administrator_only(apiserver: Any, kube: KubeClient) -> None:
    token = await kube.request_token("default", "default")
    async with apiserver.http(authenticated=False) as http:
        answer = await http.get(STATE_BACKUP_PATH, headers={"Authorization": f"Bearer {token}"})
        assert answer.status_code == 403
    async with apiserver.http() as http:
        assert (await http.post(STATE_BACKUP_PATH)).status_code == 405
        answer = await http.get(STATE_BACKUP_PATH)
        assert answer.status_code == 200 and answer.content.startswith(b"SQLite format 3\x00")
