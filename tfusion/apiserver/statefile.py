"""The embedded API server's state file as a file: its schema version, migrations, backup and restore.

Why: the state file outlives the tfusion that wrote it. An upgrade may change how objects are stored,
and a downgrade meets a layout it does not know; either way the server must migrate the file (keeping
a copy of the old one) or refuse to start with a message, never start on a layout it misreads or drop
what it cannot read. Backups go through SQLite's online backup API, which copies a consistent image
page by page, so a backup of a running server is never a half-written file.

How "in use" is known: the server opens the file in SQLite's exclusive locking mode and takes the
write lock once at start, keeping it for as long as it runs (a POSIX lock, which the kernel drops when
the process ends, even on kill -9, so a crash leaves no stale lock). Restore takes the same lock
without waiting: when it cannot, some process (a running tfusion) holds the file.
"""

from __future__ import annotations

import logging
import os
import sqlite3
from collections.abc import Callable, Mapping
from pathlib import Path

from tfusion import __version__

log = logging.getLogger(__name__)

#: the layout this tfusion reads and writes: tables `objects` (skey, ns, name, rv, data) and `meta` (k, v).
#: Raise it with every change of layout, and add the migration from the previous version to MIGRATIONS.
#: 2: `objects` is a rowid table (1 kept the rows in the key's own B-tree: WITHOUT ROWID)
SCHEMA_VERSION = 2
#: meta keys: the schema version, and the tfusion that last opened the file (for messages)
SCHEMA_KEY, WRITTEN_BY_KEY = "schema", "written_by"
OBJECT_COLUMNS = ("skey", "ns", "name", "rv", "data")

Migration = Callable[[sqlite3.Connection], None]

_OBJECTS = ("CREATE TABLE {} (skey TEXT NOT NULL, ns TEXT NOT NULL, name TEXT NOT NULL, rv INTEGER NOT NULL,"
            " data BLOB NOT NULL, PRIMARY KEY (skey, ns, name))")
_CREATE = (
    _OBJECTS.format("IF NOT EXISTS objects"),
    "CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v BLOB NOT NULL)",
)


def _objects_with_rowid(db: sqlite3.Connection) -> None:
    """1 -> 2: `objects` as a rowid table. SQLite keeps a WITHOUT ROWID table's whole rows in its key's
    B-tree, which suits rows of a few dozen bytes; an object is kilobytes, so every write moved
    them about: at 130,000 pods a write cost 65 us of CPU and 95-145 us in all, 33 and 65 us as a
    rowid table (and 43 against 30 us of CPU on a small file)."""
    db.execute(_OBJECTS.format("objects_v2"))
    db.execute("INSERT INTO objects_v2 (skey, ns, name, rv, data) SELECT skey, ns, name, rv, data FROM objects"
               " ORDER BY skey, ns, name")
    db.execute("DROP TABLE objects")
    db.execute("ALTER TABLE objects_v2 RENAME TO objects")


#: version n -> the step that turns a file of version n into one of version n + 1 (inside one transaction)
MIGRATIONS: dict[int, Migration] = {1: _objects_with_rowid}


class StateFileError(OSError):
    """The state file cannot be used (locked by another server, unreadable, not a database, a schema
    this tfusion does not read)."""


class StateInUse(StateFileError):
    """Another process holds the state file's lock."""


# ------------------------------------------------------------------------------------- schema


def ensure_schema(db: sqlite3.Connection, path: str, *, target: int = SCHEMA_VERSION,
                  migrations: Mapping[int, Migration] | None = None) -> int:
    """Make the open file's layout `target`: create it when the file is new, migrate it when older
    (a copy of the old file is kept first), refuse when newer or not ours. Returns the version found."""
    steps = MIGRATIONS if migrations is None else migrations
    try:
        found = schema_version(db, path)
    except sqlite3.DatabaseError as exc:
        raise StateFileError(f"state file {path} cannot be read: {exc}") from None
    if found is None:
        for statement in _CREATE:
            db.execute(statement)
        _stamp(db, target)
        db.commit()
        return target
    if found > target:
        written_by = meta_text(db, WRITTEN_BY_KEY) or "an unknown version"
        raise StateFileError(
            f"state file {path} has store schema {found}, written by tfusion {written_by}; this tfusion "
            f"({__version__}) reads schema {target} and older. Run tfusion {written_by} or newer on it, or "
            f"restore a backup taken before the upgrade with 'tfusion state restore'. The file was not changed.")
    if found < target:
        _migrate(db, path, found, target, steps)
    elif meta_text(db, WRITTEN_BY_KEY) != __version__ or meta_text(db, SCHEMA_KEY) is None:
        _stamp(db, target)
        db.commit()
    return found


def schema_version(db: sqlite3.Connection, path: str) -> int | None:
    """The file's schema version; None for an empty file. A file with our tables and no version was
    written before versions were recorded, in version 1's layout."""
    tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if not tables:
        return None
    if not {"objects", "meta"} <= tables:
        raise StateFileError(f"{path} is not a tfusion state file: it has tables {', '.join(sorted(tables))}, "
                             "not objects and meta; pass another --state")
    columns = tuple(row[1] for row in db.execute("PRAGMA table_info(objects)"))
    recorded = meta_text(db, SCHEMA_KEY)
    if recorded is None:
        if columns != OBJECT_COLUMNS:
            raise StateFileError(f"{path} is not a tfusion state file: its objects table has columns "
                                 f"{', '.join(columns)}, expected {', '.join(OBJECT_COLUMNS)}")
        return 1
    try:
        return int(recorded)
    except ValueError:
        raise StateFileError(f"state file {path}: its schema version {recorded!r} is not a number") from None


def meta_text(db: sqlite3.Connection, key: str) -> str | None:
    row = db.execute("SELECT v FROM meta WHERE k = ?", (key,)).fetchone()
    if row is None:
        return None
    value = row[0]
    return value if isinstance(value, str) else bytes(value).decode(errors="replace")


def _stamp(db: sqlite3.Connection, version: int) -> None:
    db.executemany("INSERT OR REPLACE INTO meta (k, v) VALUES (?, ?)",
                   [(SCHEMA_KEY, str(version).encode()), (WRITTEN_BY_KEY, __version__.encode())])


def _migrate(db: sqlite3.Connection, path: str, found: int, target: int, steps: Mapping[int, Migration]) -> None:
    missing = [v for v in range(found, target) if v not in steps]
    if missing:
        raise StateFileError(f"state file {path} has store schema {found} and this tfusion has no migration from "
                             f"schema {missing[0]}; restore a newer backup or start with an empty --state. "
                             "The file was not changed.")
    kept = ""
    if path != ":memory:":
        copy = Path(f"{path}.schema-{found}.bak")
        copy.unlink(missing_ok=True)
        backup_connection(db, copy)
        kept = f"; the file as it was is kept at {copy}"
    try:
        if not db.in_transaction:  # DDL opens no transaction by itself: every step commits or none does
            db.execute("BEGIN IMMEDIATE")
        for version in range(found, target):
            steps[version](db)
        _stamp(db, target)
        db.commit()
    except sqlite3.Error as exc:
        db.rollback()
        raise StateFileError(f"state file {path}: migrating store schema {found} to {target} failed: {exc}. "
                             f"The file was not changed{kept}.") from None
    log.warning("state file %s migrated from store schema %d to %d%s", path, found, target, kept)


# ------------------------------------------------------------------------------------- locking


def open_exclusive(path: Path, *, create: bool) -> sqlite3.Connection:
    """A connection holding the file's write lock until closed (as a running server holds it); raises
    StateInUse, without waiting, when another process holds it."""
    if not create and not path.is_file():
        raise StateFileError(f"state file {path} does not exist")
    db = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        db.execute("PRAGMA locking_mode=EXCLUSIVE")
        db.execute("BEGIN EXCLUSIVE")
        db.execute("COMMIT")
    except sqlite3.OperationalError as exc:
        db.close()
        if "locked" in str(exc) or "busy" in str(exc):
            raise StateInUse(f"state file {path} is in use: a running tfusion holds its lock (SQLite's exclusive "
                             "lock, held for as long as the API server runs); stop it first") from None
        raise StateFileError(f"state file {path} cannot be opened: {exc}") from None
    except sqlite3.DatabaseError as exc:
        db.close()
        raise StateFileError(f"{path} cannot be read: {exc}") from None
    return db


# ------------------------------------------------------------------------------------- backup and restore


def backup_connection(source: sqlite3.Connection, dest: Path) -> None:
    """A consistent copy of `source`'s committed state at `dest` (a new 0600 file)."""
    _create_private(dest)
    target = sqlite3.connect(dest)
    try:
        source.backup(target)
        settle(target)
    finally:
        target.close()


def settle(db: sqlite3.Connection) -> None:
    """A backup is one self-contained file: rollback-journal mode (the copied header says WAL, which
    would make every reader create -wal and -shm files beside it)."""
    db.execute("PRAGMA journal_mode=DELETE")


def snapshot(source: sqlite3.Connection) -> bytes:
    """A consistent copy of `source`'s committed state as the bytes of a database file (nothing on disk)."""
    memory = sqlite3.connect(":memory:")
    try:
        source.backup(memory)
        return memory.serialize()
    finally:
        memory.close()


def check_backup(path: Path) -> int:
    """The schema version of a backup this tfusion can restore; StateFileError naming what is wrong."""
    if not path.is_file():
        raise StateFileError(f"backup {path} does not exist")
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        problem = db.execute("PRAGMA quick_check").fetchone()[0]
        if problem != "ok":
            raise StateFileError(f"backup {path} is damaged: {problem}")
        version = schema_version(db, str(path))
    except sqlite3.DatabaseError as exc:
        raise StateFileError(f"backup {path} is not a tfusion state file: {exc}") from None
    finally:
        db.close()
    if version is None:
        raise StateFileError(f"backup {path} is empty")
    if version > SCHEMA_VERSION:
        raise StateFileError(f"backup {path} has store schema {version}, newer than this tfusion reads "
                             f"({SCHEMA_VERSION}); restore it with the tfusion that made it")
    return version


def backup_file(state: Path, dest: Path) -> None:
    """Back up a state file no server is using (StateInUse when one is)."""
    source = open_exclusive(state, create=False)
    try:
        backup_connection(source, dest)
    finally:
        source.close()


def restore_file(backup: Path, state: Path) -> int:
    """Replace `state` with `backup` (checked first) while holding the state's lock, so that no server
    starts on a half-restored file; StateInUse when a server runs on it. Returns the backup's schema."""
    if state.exists() and backup.resolve() == state.resolve():
        raise StateFileError(f"{backup} is the state file itself; restore from a backup made with 'tfusion state "
                             "backup'")
    version = check_backup(backup)
    if not state.exists():
        state.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        _create_private(state)
    target = open_exclusive(state, create=True)
    try:
        source = sqlite3.connect(f"file:{backup}?mode=ro", uri=True)
        try:
            source.backup(target)  # one step: the state file is replaced whole or not at all
            target.execute("PRAGMA journal_mode=WAL")
        except sqlite3.Error as exc:
            raise StateFileError(f"restoring {backup} into {state} failed: {exc}") from None
        finally:
            source.close()
    finally:
        target.close()
    for leftover in (Path(f"{state}-wal"), Path(f"{state}-shm")):
        if leftover.exists():
            leftover.chmod(0o600)
    return version


def _create_private(path: Path) -> None:
    """Backups hold the signing key, the admin token and the TLS key: 0600 from the start."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
