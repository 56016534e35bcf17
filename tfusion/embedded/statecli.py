"""`tfusion state backup FILE` and `tfusion state restore FILE`: save and bring back `--role=all`'s state.

Why: the embedded API server keeps every object, its keys and its tokens in one SQLite file, and
copying that file while a server writes it can catch half a transaction. Backup uses SQLite's online
backup API: directly on the file when no server runs, else through the running server (which holds
the file's lock; see apiserver/statefile.py) over its admin-only `/tfusion/state/backup` route.
Restore replaces the file only while no tfusion runs on it, and checks the backup first.
"""

from __future__ import annotations

import base64
import contextlib
import os
import sqlite3
import ssl
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml

from tfusion.apiserver.app import STATE_BACKUP_PATH
from tfusion.apiserver.statefile import (
    SCHEMA_VERSION,
    StateFileError,
    StateInUse,
    backup_file,
    check_backup,
    restore_file,
    settle,
)
from tfusion.console.target import OneLineParser
from tfusion.settings import OPTIONS

PROG = "tfusion state"
DEFAULT_STATE = str(next(opt.default for opt in OPTIONS if opt.attr == "state"))
#: a snapshot of a large state takes a while to copy and send
FETCH_TIMEOUT_S = 120.0


class BackupError(Exception):
    """A backup cannot be taken; the message says why and what to do."""


def state_command(argv: Sequence[str]) -> int:
    parser = OneLineParser(prog=PROG, description="Back up or restore the embedded API server's state file "
                                                  "(what --role=all and --role=apiserver keep).")
    commands = parser.add_subparsers(dest="command", required=True, metavar="{backup,restore}")
    backup = commands.add_parser("backup", help="write a consistent copy of the state to FILE, also while "
                                                "tfusion runs")
    backup.add_argument("file", metavar="FILE", help="where the backup goes (must not exist)")
    backup.add_argument("--state", default=DEFAULT_STATE, help=f"the state file (default: {DEFAULT_STATE})")
    backup.add_argument("--kubeconfig", default=None,
                        help="the running server's admin kubeconfig, used when a server holds the state "
                             "(default: 'kubeconfig' beside the state file)")
    restore = commands.add_parser("restore", help="replace the state with FILE; refused while tfusion runs on it")
    restore.add_argument("file", metavar="FILE", help="a backup made by 'tfusion state backup'")
    restore.add_argument("--state", default=DEFAULT_STATE, help=f"the state file (default: {DEFAULT_STATE})")
    args = parser.parse_args(list(argv))
    state = Path(args.state).expanduser()
    try:
        if args.command == "backup":
            kubeconfig = Path(args.kubeconfig).expanduser() if args.kubeconfig else state.parent / "kubeconfig"
            print(take_backup(state, Path(args.file).expanduser(), kubeconfig))
        else:
            print(restore_state(state, Path(args.file).expanduser()))
    except (StateFileError, BackupError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    return 0


def take_backup(state: Path, dest: Path, kubeconfig: Path) -> str:
    """Back `state` up to `dest`; returns the line to print."""
    if dest.exists():
        raise BackupError(f"{dest} exists; choose another name or remove it first")
    partial = dest.with_name(dest.name + ".partial")
    partial.unlink(missing_ok=True)
    try:
        try:
            backup_file(state, partial)
            how = "directly (no server was running on it)"
        except StateInUse:
            url = _fetch(kubeconfig, partial)
            how = f"from the API server running on it ({url})"
        version = check_backup(partial)
        partial.rename(dest)
    finally:
        partial.unlink(missing_ok=True)
    return f"backed up {state} to {dest} {how}; store schema {version}"


def restore_state(state: Path, backup: Path) -> str:
    version = restore_file(backup, state)
    later = f" (this tfusion migrates it to schema {SCHEMA_VERSION} when it starts)" \
        if version < SCHEMA_VERSION else ""
    return f"restored {backup} into {state}; store schema {version}{later}. Start tfusion on it."


def _fetch(kubeconfig: Path, partial: Path) -> str:
    """Ask the server holding the state for a snapshot, written to `partial`; returns its URL."""
    server, token, ca_pem = _admin_credentials(kubeconfig)
    context = ssl.create_default_context(cadata=ca_pem) if ca_pem else True
    url = server.rstrip("/") + STATE_BACKUP_PATH
    try:
        response = httpx.get(url, headers={"Authorization": f"Bearer {token}"}, verify=context,
                             timeout=FETCH_TIMEOUT_S)
    except httpx.HTTPError as exc:
        raise BackupError(f"the state file is in use, and its server at {server} (from {kubeconfig}) cannot be "
                          f"reached: {exc}") from None
    if response.status_code != 200:
        raise BackupError(f"the state file is in use, and its server at {server} refused the backup: "
                          f"HTTP {response.status_code} {response.text[:300]}")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(response.content)
    db = sqlite3.connect(partial)
    try:
        settle(db)
    except sqlite3.DatabaseError as exc:
        raise BackupError(f"the server at {server} sent something that is not a database: {exc}") from None
    finally:
        db.close()
    return server


def _admin_credentials(kubeconfig: Path) -> tuple[str, str, str | None]:
    """(server URL, token, CA PEM) of the kubeconfig's current context."""
    try:
        config: Any = yaml.safe_load(kubeconfig.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise BackupError(f"the state file is in use by a running server, and its kubeconfig {kubeconfig} cannot "
                          f"be read ({exc}); pass --kubeconfig with the admin kubeconfig it wrote") from None
    with contextlib.suppress(AttributeError, KeyError, TypeError, StopIteration, ValueError):
        context = next(c["context"] for c in config["contexts"] if c["name"] == config["current-context"])
        cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
        user = next(u["user"] for u in config["users"] if u["name"] == context["user"])
        ca = cluster.get("certificate-authority-data")
        return str(cluster["server"]), str(user["token"]), base64.b64decode(ca).decode() if ca else None
    raise BackupError(f"kubeconfig {kubeconfig} has no server, token and context to use; pass --kubeconfig with "
                      "the admin kubeconfig the embedded API server wrote")
