"""The state file's schema version on open: stamped when new, migrated with a copy kept when older,
refused with the file untouched when newer or not ours (real SQLite files)."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest

from tfusion import __version__
from tfusion.apiserver.statefile import (
    SCHEMA_VERSION,
    StateFileError,
    ensure_schema,
    meta_text,
    schema_version,
)
from tfusion.apiserver.store import Store

CREATE_V1 = (
    "CREATE TABLE objects (skey TEXT NOT NULL, ns TEXT NOT NULL, name TEXT NOT NULL, rv INTEGER NOT NULL,"
    " data BLOB NOT NULL, PRIMARY KEY (skey, ns, name)) WITHOUT ROWID",
    "CREATE TABLE meta (k TEXT PRIMARY KEY, v BLOB NOT NULL)",
)


def _file(path: Path, *statements: str) -> Path:
    db = sqlite3.connect(path)
    for statement in statements:
        db.execute(statement)
    db.commit()
    db.close()
    return path


def _unversioned(path: Path) -> Path:
    """A state file as tfusion wrote it before it recorded a schema version: one object, rv 7."""
    return _file(path, *CREATE_V1, """INSERT INTO objects VALUES ('configmaps', 'default', 'a', 7,
                 CAST('{"metadata":{"name":"a","namespace":"default","resourceVersion":"7"}}' AS BLOB))""",
                 "INSERT INTO meta VALUES ('rv', CAST('7' AS BLOB))")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _objects_sql(db: sqlite3.Connection) -> str:
    return str(db.execute("SELECT sql FROM sqlite_master WHERE name = 'objects'").fetchone()[0])


def test_a_new_file_is_stamped_and_a_file_from_before_versions_is_read_as_version_1(tmp_path: Path) -> None:
    store = Store(tmp_path / "new.db", 10)
    store.close()
    db = sqlite3.connect(tmp_path / "new.db")
    assert meta_text(db, "schema") == str(SCHEMA_VERSION) and meta_text(db, "written_by") == __version__
    assert "WITHOUT ROWID" not in _objects_sql(db)
    db.close()

    old = _unversioned(tmp_path / "old.db")
    db = sqlite3.connect(old)
    assert schema_version(db, str(old)) == 1
    db.close()
    store = Store(old, 10)
    entry = store.get("configmaps", "default", "a")
    assert entry is not None and store.rv == 7, "the objects of a file from before versions are kept"
    store.close()
    db = sqlite3.connect(old)
    assert schema_version(db, str(old)) == SCHEMA_VERSION == 2
    db.close()


def test_version_1_becomes_a_rowid_table_with_every_object_and_its_key(tmp_path: Path) -> None:
    path = _unversioned(tmp_path / "state.db")
    big = b"x" * 20_000  # several pages: the rows that made the old layout slow
    _file(path, *(f"INSERT INTO objects VALUES ('pods', 'ns{i % 3}', 'p{i}', {10 + i}, x'{big.hex()}')"
                  for i in range(5)))
    db = sqlite3.connect(path)
    before = db.execute("SELECT * FROM objects ORDER BY skey, ns, name").fetchall()
    assert ensure_schema(db, str(path)) == 1
    assert "WITHOUT ROWID" not in _objects_sql(db) and schema_version(db, str(path)) == 2
    assert db.execute("SELECT * FROM objects ORDER BY skey, ns, name").fetchall() == before
    assert [row[1] for row in db.execute("PRAGMA table_info(objects)")] == ["skey", "ns", "name", "rv", "data"]
    with pytest.raises(sqlite3.IntegrityError):  # the key is still unique
        db.execute("INSERT INTO objects VALUES ('pods', 'ns0', 'p0', 1, x'00')")
    db.close()
    kept = sqlite3.connect(tmp_path / "state.db.schema-1.bak")
    assert "WITHOUT ROWID" in _objects_sql(kept) and kept.execute("SELECT count(*) FROM objects").fetchone() == (6,)
    kept.close()


def test_a_newer_schema_is_refused_naming_it_and_the_file_is_not_changed(tmp_path: Path) -> None:
    path = _unversioned(tmp_path / "state.db")
    _file(path, "INSERT INTO meta VALUES ('schema', '99'), ('written_by', '9.9.9')")
    before = _digest(path)
    with pytest.raises(StateFileError) as raised:
        Store(path, 10)
    message = str(raised.value)
    assert "store schema 99" in message and "tfusion 9.9.9" in message and f"reads schema {SCHEMA_VERSION}" in message
    assert "tfusion state restore" in message and "not changed" in message
    assert _digest(path) == before


def test_not_a_state_file_is_refused(tmp_path: Path) -> None:
    other = _file(tmp_path / "other.db", "CREATE TABLE songs (title TEXT)")
    with pytest.raises(StateFileError, match=r"is not a tfusion state file: it has tables songs"):
        Store(other, 10)
    text = tmp_path / "notes.txt"
    text.write_text("not a database, but long enough to have a header " * 4)
    with pytest.raises(StateFileError, match="cannot be opened: file is not a database"):
        Store(text, 10)


def test_an_older_schema_is_migrated_in_one_transaction_keeping_a_copy(tmp_path: Path) -> None:
    path = _unversioned(tmp_path / "state.db")

    def add_column(db: sqlite3.Connection) -> None:
        db.execute("ALTER TABLE objects ADD COLUMN uid TEXT NOT NULL DEFAULT ''")

    db = sqlite3.connect(path)
    assert ensure_schema(db, str(path), target=2, migrations={1: add_column}) == 1
    assert schema_version(db, str(path)) == 2
    assert db.execute("SELECT name, uid FROM objects").fetchall() == [("a", "")]
    db.close()
    kept = sqlite3.connect(tmp_path / "state.db.schema-1.bak")
    assert schema_version(kept, "copy") == 1 and kept.execute("SELECT count(*) FROM objects").fetchone() == (1,)
    kept.close()

    again = _unversioned(tmp_path / "again.db")

    def half_then_fail(db: sqlite3.Connection) -> None:
        db.execute("ALTER TABLE objects ADD COLUMN uid TEXT NOT NULL DEFAULT ''")
        db.execute("INSERT INTO nowhere VALUES (1)")

    db = sqlite3.connect(again)
    with pytest.raises(StateFileError, match=r"migrating store schema 1 to 2 failed: no such table: nowhere"):
        ensure_schema(db, str(again), target=2, migrations={1: half_then_fail})
    columns = [row[1] for row in db.execute("PRAGMA table_info(objects)")]
    assert "uid" not in columns and schema_version(db, str(again)) == 1, "a failed step leaves nothing behind"
    with pytest.raises(StateFileError, match="no migration from schema 2"):
        ensure_schema(db, str(again), target=3, migrations={1: half_then_fail})
    db.close()
