"""Object storage of the embedded API server: the working set in memory, SQLite (WAL) as the durable copy.

Every write gets the next value of one global, monotonic resourceVersion and is committed to SQLite
before the caller answers, so a restart on the same file keeps every object and continues the
sequence. Writes happen on the server's event loop with no await between reading the current
version and storing the new one, which is what makes optimistic concurrency (409 on a stale
resourceVersion) exact. Each write is also appended to a bounded event log (watch resume) and
fanned out to the live watchers of that resource.

In memory an object is its encoded JSON plus the few fields lists, selectors, watches and the
garbage collector read (`Entry`); only the most recently touched keep a decoded dict. At 100,000
pods that is about 6 KB a pod instead of 30, and a full cyclic collection walks one object per pod
instead of a hundred.
"""

from __future__ import annotations

import asyncio
import bisect
import os
import sqlite3
import stat
import sys
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from tfusion.api.selectors import FieldSelector, LabelSelector
from tfusion.apiserver import errors, limits
from tfusion.apiserver.statefile import StateFileError, ensure_schema, snapshot

ObjKey = tuple[str, str]  # (namespace or "", name)

ADDED, MODIFIED, DELETED = "ADDED", "MODIFIED", "DELETED"
#: events buffered for one watcher before its stream is closed
MAX_QUEUED_EVENTS = 100_000
#: the most bytes of objects the watch history holds (it also holds at most --watch-history events):
#: what a watch may resume from, and how far a slow watcher may fall behind before it gets 410 Gone
HISTORY_BYTES = 128 * 2**20


def encode_object(obj: dict[str, Any]) -> bytes:
    """The stored form of an object; refuses (413) what etcd would refuse as too large to store."""
    try:
        raw = orjson.dumps(obj)
    except orjson.JSONEncodeError as exc:
        raise errors.bad_request(f"the object cannot be encoded as JSON: {exc}") from None
    if len(raw) > limits.MAX_OBJECT_BYTES:
        raise limits.object_too_large(len(raw))
    return raw


def secure_state_files(path: Path) -> None:
    """The state file holds the service-account signing key, the admin token and the TLS key: it and
    its -wal/-shm companions are 0600, created so, and tightened when an older run left them wider.

    The directory is made 0700 when we create it. An existing directory is tightened only when it
    looks like ours (owned by this user, not sticky like /tmp, not the home or working directory),
    so `--state ./state.db` never changes the permissions of a directory the user shares.
    """
    directory = path.parent
    if not directory.exists():
        directory.mkdir(mode=0o700, parents=True)
    elif _ours(directory):
        directory.chmod(stat.S_IMODE(directory.stat().st_mode) & 0o700)
    if not path.exists():
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    for candidate in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        if candidate.exists() and stat.S_IMODE(candidate.stat().st_mode) & 0o077:
            candidate.chmod(0o600)


def _ours(directory: Path) -> bool:
    info = directory.stat()
    resolved = directory.resolve()
    shared = {Path.cwd().resolve(), Path.home().resolve(), Path("/").resolve()}
    return info.st_uid == os.getuid() and not info.st_mode & stat.S_ISVTX and resolved not in shared


#: how many entries keep their decoded dict beside their bytes (the most recently touched ones): the
#: working set of writes, admission and GC reads; everything else is decoded again when read
DECODED_KEPT = 1024
#: the field paths whose values every entry keeps, so that the field selectors clients use (the
#: kubelet's spec.nodeName, status.phase, ...) are evaluated without decoding the object;
#: metadata.name and metadata.namespace come from the key. Any other path decodes the object.
INDEXED_FIELDS: tuple[str, ...] = ("spec.nodeName", "status.phase", "spec.schedulerName")
_INDEXED_PARTS = tuple(tuple(path.split(".")) for path in INDEXED_FIELDS)
_INDEXED_POSITION = {path: index for index, path in enumerate(INDEXED_FIELDS)}
#: the field paths a selector can be evaluated on without decoding
SELECTABLE_FIELDS = frozenset(("metadata.name", "metadata.namespace", *INDEXED_FIELDS))
#: the fields of an owner reference the garbage collector reads: uid, apiVersion, kind
OwnerRef = tuple[str, str, str]


def copy_json(value: Any) -> Any:
    """A deep copy of a JSON value (orjson's round trip is the fastest deep copy of this shape)."""
    return orjson.loads(orjson.dumps(value))


class _DecodedCache:
    """Which entries keep their decoded dict: the `size` most recently touched (LRU). Shared by every
    store of the process (tests run several servers, in threads), so each step tolerates another
    thread having just moved or evicted the same entry."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._order: OrderedDict[Entry, None] = OrderedDict()

    def touch(self, entry: Entry) -> None:
        order = self._order
        try:
            order.move_to_end(entry)
            return
        except KeyError:
            order[entry] = None
        while len(order) > self.size:
            try:
                evicted, _ = order.popitem(last=False)
            except KeyError:
                return
            evicted._decoded = None


def _scalar(value: Any) -> str | int | float | bool | None:
    """A field value as a selector reads it: scalars kept (strings interned: a few node names and
    phases repeat across every pod), anything else as None (which a selector reads as "")."""
    if isinstance(value, str):
        return sys.intern(value)
    if isinstance(value, bool | int | float):
        return value
    return None


def _field_at(obj: dict[str, Any], parts: tuple[str, ...]) -> Any:
    node: Any = obj
    for part in parts:
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


class Entry:
    """One stored object: its exact JSON encoding, the few fields lists, selectors, watches and the
    garbage collector read, and (for the most recently touched entries only) the decoded dict.

    The bytes are the object; the dict, when kept, is a read-only view of them (never mutated once
    stored). At 100,000 pods the dicts would be most of the server's memory and most of the objects
    its cyclic collector walks, so all but `DECODED_KEPT` of them are dropped and decoded on demand.
    """

    __slots__ = ("_decoded", "api_version", "fields", "labels", "name", "namespace",
                 "owners", "raw", "rv", "uid")

    def __init__(self, obj: dict[str, Any], raw: bytes, rv: int) -> None:
        # a copy of exactly its length: orjson's output keeps the buffer it grew into, about twice
        # the JSON's size, for as long as the bytes live
        self.raw = bytes(memoryview(raw))
        self.rv = rv
        self._index(obj)
        self._decoded: dict[str, Any] | None = obj
        _DECODED.touch(self)

    @classmethod
    def from_raw(cls, raw: bytes, rv: int) -> Entry:
        """An entry read back from the state file: indexed, and not kept decoded."""
        entry = cls.__new__(cls)
        entry.raw = raw
        entry.rv = rv
        entry._index(orjson.loads(raw))
        entry._decoded = None
        return entry

    def _index(self, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        self.namespace: str = sys.intern(str(meta.get("namespace") or ""))
        self.name: str = str(meta.get("name") or "")
        uid = meta.get("uid")
        self.uid: str | None = uid if isinstance(uid, str) and uid else None
        api_version = obj.get("apiVersion")
        self.api_version: str | None = sys.intern(api_version) if isinstance(api_version, str) else None
        labels = meta.get("labels")
        self.labels: dict[str, str] | None = (
            {sys.intern(str(k)): sys.intern(str(v)) if isinstance(v, str) else v for k, v in labels.items()}
            if isinstance(labels, dict) and labels else None
        )
        values = tuple(_scalar(_field_at(obj, parts)) for parts in _INDEXED_PARTS)
        self.fields: tuple[str | int | float | bool | None, ...] | None = (
            values if any(v is not None for v in values) else None
        )
        refs = meta.get("ownerReferences")
        owners = tuple(
            (ref["uid"], sys.intern(str(ref.get("apiVersion") or "")), sys.intern(str(ref.get("kind") or "")))
            for ref in refs if isinstance(ref, dict) and isinstance(ref.get("uid"), str) and ref["uid"]
        ) if isinstance(refs, list) else ()
        self.owners: tuple[OwnerRef, ...] = owners

    @property
    def obj(self) -> dict[str, Any]:
        """The object, read only: kept decoded for recently touched entries, decoded again otherwise."""
        decoded = self._decoded
        if decoded is None:
            decoded = self._decoded = orjson.loads(self.raw)
        _DECODED.touch(self)
        return decoded

    @property
    def decoded(self) -> bool:
        """Whether the dict is kept (for tests and the memory benchmark)."""
        return self._decoded is not None

    def copy(self) -> dict[str, Any]:
        """A deep, mutable copy (decoding the stored JSON is the fastest deep copy)."""
        result: dict[str, Any] = orjson.loads(self.raw)
        return result

    def field_text(self, path: str) -> str:
        """An indexed field's value as a field selector reads it (`SELECTABLE_FIELDS` only)."""
        if path == "metadata.name":
            return self.name
        if path == "metadata.namespace":
            return self.namespace
        value = self.fields[_INDEXED_POSITION[path]] if self.fields is not None else None
        if value is None:
            return ""
        if isinstance(value, bool):
            return "true" if value else "false"
        return value if isinstance(value, str) else str(value)


class Selection:
    """A list's or watch's label and field selectors, evaluated on entries: labels and the indexed
    fields are read from the entry, so only a field selector on another path decodes the object."""

    __slots__ = ("_by_index", "fields", "labels")

    def __init__(self, labels: LabelSelector | None, fields: FieldSelector | None) -> None:
        self.labels = labels
        self.fields = fields if fields is not None and not fields.empty else None
        #: (path, wanted equal?, value) per requirement, when every path is indexed
        self._by_index = (
            tuple((r.path, r.operator == "=", r.value) for r in self.fields.requirements)
            if self.fields is not None and self.fields.paths <= SELECTABLE_FIELDS else None
        )

    @property
    def everything(self) -> bool:
        return self.labels is None and self.fields is None

    def matches(self, entry: Entry) -> bool:
        if self.labels is not None and not self.labels.matches(entry.labels or {}):
            return False
        if self.fields is None:
            return True
        if self._by_index is None:
            return self.fields.matches(entry.obj)
        for path, equal, value in self._by_index:  # noqa: SIM110 - a plain loop is faster here
            if (entry.field_text(path) == value) != equal:
                return False
        return True


_DECODED = _DecodedCache(DECODED_KEPT)


@dataclass(slots=True)
class Event:
    rv: int
    storage_key: str
    type: str
    entry: Entry
    old: Entry | None  # the previous state, so selector watches can turn MODIFIED into ADDED/DELETED

    @property
    def size(self) -> int:
        """The bytes of objects this event keeps alive (the previous state's too: an upper bound, as
        it is often also the object of an earlier event)."""
        return len(self.entry.raw) + (len(self.old.raw) if self.old is not None else 0)


@dataclass(eq=False)
class Subscription:
    """A live watcher of one resource; the store pushes every event of that resource to `queue`."""

    storage_key: str
    namespace: str | None
    queue: asyncio.Queue[Event | None] = field(default_factory=asyncio.Queue)
    #: the bytes of the events queued and not yet taken (`taken`)
    queued_bytes: int = 0
    #: set when the watcher fell further behind than the history holds: its stream ends with 410 Gone
    expired: bool = False

    def push(self, event: Event) -> None:
        self.queued_bytes += event.size
        self.queue.put_nowait(event)

    def taken(self, event: Event) -> None:
        self.queued_bytes -= event.size

    def close(self) -> None:
        self.queue.put_nowait(None)


class Store:
    def __init__(self, path: str | Path, history: int, history_bytes: int = HISTORY_BYTES) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            secure_state_files(Path(self.path))
        self._db = sqlite3.connect(self.path, check_same_thread=False, timeout=0.5)
        self._committed: asyncio.Future[None] | None = None
        self._commit_handle: asyncio.Handle | None = None
        self._pending: list[Event] = []
        # one server per state file: two would hand out the same resourceVersions
        self._db.execute("PRAGMA locking_mode=EXCLUSIVE")
        try:
            self._db.execute("BEGIN EXCLUSIVE")
            self._db.execute("COMMIT")
            # a layout this tfusion does not read is migrated or refused, never read wrongly; checked
            # before the switch to WAL, so that a refused file is left byte for byte as it was
            ensure_schema(self._db, self.path)
            self._db.execute("PRAGMA journal_mode=WAL")
        except sqlite3.DatabaseError as exc:
            self._db.close()
            hint = " (is another API server using it?)" if "locked" in str(exc) else ""
            raise StateFileError(f"state file {self.path} cannot be opened: {exc}{hint}") from None
        except StateFileError:
            self._db.close()
            raise
        self._db.execute("PRAGMA synchronous=NORMAL")
        if self.path != ":memory:":
            secure_state_files(Path(self.path))  # the -wal and -shm files exist now
        row = self._db.execute("SELECT v FROM meta WHERE k = 'rv'").fetchone()
        self.rv = int(row[0]) if row else 0
        #: the newest resourceVersion whose events have been delivered to watchers
        self.committed_rv = self.rv
        self._objects: dict[str, dict[ObjKey, Entry]] = {}
        for skey, ns, name, rv, data in self._db.execute("SELECT skey, ns, name, rv, data FROM objects"):
            self._objects.setdefault(skey, {})[(sys.intern(ns), name)] = Entry.from_raw(bytes(data), rv)
        #: each resource's keys in order, kept as writes add and remove keys, so that a page of a list
        #: starts with a binary search instead of sorting every object of the resource
        self._order: dict[str, list[ObjKey]] = {skey: sorted(bucket) for skey, bucket in self._objects.items()}
        #: uid -> where the object with it is stored: a uid names one object, so a second create with it
        #: (which could only come from a bug) is refused rather than stored as a twin
        self._uids: dict[str, tuple[str, ObjKey]] = {}
        self._index_uids()
        #: is this resource cluster-scoped? Set by the Engine from the registry; the store then keys every
        #: row of such a resource by name alone, whatever namespace a body claims
        self.cluster_scoped: Callable[[str], bool] = lambda storage_key: False
        self.history = history
        self.history_bytes = history_bytes
        self.log: deque[Event] = deque()
        #: the bytes of objects the log holds (Event.size summed)
        self.log_bytes = 0
        #: events with rv > log_start are all in `log`; a watch from an older rv gets 410
        self.log_start = self.rv
        self._subs: dict[str, set[Subscription]] = {}
        self.listeners: list[Callable[[Event], None]] = []

    # ---------------------------------------------------------------- metadata (keys, signing, tls)
    def get_meta(self, key: str) -> bytes | None:
        row = self._db.execute("SELECT v FROM meta WHERE k = ?", (key,)).fetchone()
        return bytes(row[0]) if row else None

    def set_meta(self, key: str, value: bytes) -> None:
        self._db.execute("INSERT OR REPLACE INTO meta (k, v) VALUES (?, ?)", (key, value))
        self._db.commit()

    async def snapshot(self) -> bytes:
        """The committed state as the bytes of a database file (SQLite's online backup API). Taken after
        every write so far is durable, with no await in between, so it holds no half of a transaction;
        it holds the event loop for the copy, milliseconds per MB of state."""
        while self._committed is not None:  # a write made while we waited opens a new transaction
            await self.durable()
        return snapshot(self._db)

    # ---------------------------------------------------------------- reads
    def get(self, storage_key: str, namespace: str, name: str) -> Entry | None:
        bucket = self._objects.get(storage_key)
        return bucket.get((namespace, name)) if bucket else None

    def items(self, storage_key: str, namespace: str | None = None) -> Iterator[tuple[ObjKey, Entry]]:
        bucket = self._objects.get(storage_key)
        if not bucket:
            return iter(())
        if namespace is None:
            return iter(list(bucket.items()))
        return iter([(k, e) for k, e in bucket.items() if k[0] == namespace])

    def bucket(self, storage_key: str) -> dict[ObjKey, Entry]:
        """The resource's objects by key (read only; empty when it has none)."""
        return self._objects.get(storage_key) or {}

    def ordered(self, storage_key: str, namespace: str | None, after: ObjKey | None) -> tuple[list[ObjKey], int, int]:
        """The resource's keys in order and the range [start, end) of them in `namespace` (all when
        None) that sort after `after`. Valid until the next write: read it without awaiting."""
        order = self._order.get(storage_key)
        if not order:
            return [], 0, 0
        start, end = 0, len(order)
        if namespace is not None:
            # (ns,) sorts before every (ns, name); (ns + "\0",) after them and before any other namespace
            start = bisect.bisect_left(order, (namespace,))
            end = bisect.bisect_left(order, (namespace + "\0",), start)
        if after is not None:
            start = bisect.bisect_right(order, after, start, end)
        return order, start, end

    def count(self, storage_key: str) -> int:
        return len(self._objects.get(storage_key) or ())

    def storage_keys(self) -> list[str]:
        return [k for k, v in self._objects.items() if v]

    def _index_uids(self) -> None:
        self._uids = {}
        for skey, bucket in self._objects.items():
            for key, entry in bucket.items():
                if entry.uid is not None:
                    self._uids[entry.uid] = (skey, key)

    # ---------------------------------------------------------------- writes
    def put(self, storage_key: str, obj: dict[str, Any], old: Entry | None) -> Entry:
        """Store `obj` (created when `old` is None) under a new resourceVersion; returns the new entry.

        An update is stored where `old` is, with old's name, namespace and uid, whatever `obj` says: a
        write can never move an object, or leave a copy of it under a second key.
        """
        meta = obj["metadata"]
        key = self._key_for(storage_key, meta, old)
        rv = self.rv + 1
        meta["resourceVersion"] = str(rv)
        raw = encode_object(obj)
        self.rv = rv
        ns, name = key
        self._db.execute(
            "INSERT OR REPLACE INTO objects (skey, ns, name, rv, data) VALUES (?, ?, ?, ?, ?)",
            (storage_key, ns, name, rv, raw),
        )
        entry = Entry(obj, raw, rv)
        bucket = self._objects.setdefault(storage_key, {})
        if key not in bucket:
            bisect.insort(self._order.setdefault(storage_key, []), key)
        bucket[key] = entry
        uid = meta.get("uid")
        if isinstance(uid, str) and uid:
            self._uids[uid] = (storage_key, key)
        self._pending.append(Event(rv, storage_key, MODIFIED if old else ADDED, entry, old))
        self._save_rv()
        return entry

    def _key_for(self, storage_key: str, meta: dict[str, Any], old: Entry | None) -> ObjKey:
        """Where a write goes; makes `meta` agree with it. Refuses (409) a create that would duplicate an
        existing row or uid."""
        if old is not None:
            ns, name = old.namespace, old.name
            meta["name"] = name
            if old.uid is not None:
                meta["uid"] = old.uid
        else:
            ns, name = meta.get("namespace") or "", meta["name"]
            if self.cluster_scoped(storage_key):
                ns = ""
            if (ns, name) in self._objects.get(storage_key, {}):
                raise errors.ApiError(409, "AlreadyExists", f'{storage_key} "{name}" already exists')
            uid = meta.get("uid")
            if isinstance(uid, str) and uid in self._uids:
                raise errors.ApiError(
                    409, "AlreadyExists", f'{storage_key} "{name}": an object with uid {uid} already exists'
                )
        if ns:
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        return ns, name

    def purge(self, storage_key: str, key: ObjKey) -> None:
        """Drop a row without an event or a new resourceVersion: only for repairs at start, before
        anything watches (a row no version of the object could have been written to)."""
        self._db.execute(
            "DELETE FROM objects WHERE skey = ? AND ns = ? AND name = ?", (storage_key, key[0], key[1])
        )
        self._db.commit()
        if self._objects.get(storage_key, {}).pop(key, None) is not None:
            self._unorder(storage_key, key)
        self._index_uids()

    def remove(self, storage_key: str, old: Entry) -> Entry:
        """Delete an object; the DELETED event carries its last state under a new resourceVersion."""
        self.rv += 1
        rv = self.rv
        obj = old.copy()
        meta = obj["metadata"]
        meta["resourceVersion"] = str(rv)
        ns, name = meta.get("namespace", ""), meta["name"]
        self._db.execute("DELETE FROM objects WHERE skey = ? AND ns = ? AND name = ?", (storage_key, ns, name))
        if self._objects[storage_key].pop((ns, name), None) is not None:
            self._unorder(storage_key, (ns, name))
        uid = meta.get("uid")
        if isinstance(uid, str) and self._uids.get(uid) == (storage_key, (ns, name)):
            del self._uids[uid]
        entry = Entry(obj, orjson.dumps(obj), rv)
        self._pending.append(Event(rv, storage_key, DELETED, entry, old))
        self._save_rv()
        return entry

    def _unorder(self, storage_key: str, key: ObjKey) -> None:
        order = self._order[storage_key]
        index = bisect.bisect_left(order, key)
        if index < len(order) and order[index] == key:
            del order[index]

    def _save_rv(self) -> None:
        """Commit soon: every write made in this turn of the event loop shares one transaction."""
        if self._committed is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._commit()
            return
        self._committed = loop.create_future()
        self._commit_handle = loop.call_soon(self._commit)

    def _commit(self) -> None:
        committed, self._committed = self._committed, None
        self._commit_handle = None
        try:
            self._db.execute("INSERT OR REPLACE INTO meta (k, v) VALUES ('rv', ?)", (str(self.rv).encode(),))
            self._db.commit()
        except sqlite3.Error as exc:
            if committed is None:
                raise
            if not committed.done():
                committed.set_exception(exc)
            return
        if committed is not None and not committed.done():
            committed.set_result(None)
        # watchers and listeners learn of a write only once it is durable, as with etcd
        pending, self._pending = self._pending, []
        for event in pending:
            self._emit(event)
        self.committed_rv = self.rv

    async def durable(self) -> None:
        """Wait until every write made so far is committed to the state file."""
        if self._committed is not None:
            await asyncio.shield(self._committed)

    def _emit(self, event: Event) -> None:
        self._remember(event)
        subs = self._subs.get(event.storage_key)
        for sub in list(subs) if subs else ():
            if sub.namespace is None or sub.namespace == event.entry.namespace:
                if sub.queue.qsize() >= MAX_QUEUED_EVENTS or sub.queued_bytes > self.history_bytes:
                    # a watcher further behind than the history reaches is not reading: end its stream
                    # with 410 Gone (it re-lists), as kube-apiserver does with watchers that fall out
                    # of its watch cache, instead of holding its events forever
                    sub.expired = True
                    sub.close()
                    self.unsubscribe(sub)
                    continue
                sub.push(event)
        for listener in self.listeners:
            listener(event)

    # ---------------------------------------------------------------- watch support
    def _remember(self, event: Event) -> None:
        """Append to the history, dropping its oldest events past --watch-history events or
        `history_bytes` bytes; a watch from before the oldest one kept gets 410."""
        log = self.log
        log.append(event)
        self.log_bytes += event.size
        while len(log) > self.history or (self.log_bytes > self.history_bytes and len(log) > 1):
            dropped = log.popleft()
            self.log_bytes -= dropped.size
            self.log_start = dropped.rv

    def subscribe(self, storage_key: str, namespace: str | None) -> Subscription:
        sub = Subscription(storage_key, namespace)
        self._subs.setdefault(storage_key, set()).add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        self._subs.get(sub.storage_key, set()).discard(sub)

    def events_since(self, storage_key: str, rv: int) -> list[Event] | None:
        """Events of one resource after `rv`, or None when some of them are no longer retained."""
        if rv < self.log_start:
            return None
        return [e for e in self.log if e.rv > rv and e.storage_key == storage_key]

    def close_watches(self) -> None:
        for subs in self._subs.values():
            for sub in list(subs):
                sub.close()

    def compact(self) -> None:
        """Forget the event log: a watch from any resourceVersion before now gets 410 Expired."""
        self.log.clear()
        self.log_bytes = 0
        self.log_start = self.rv

    def close(self) -> None:
        self.close_watches()
        if self._committed is not None:
            if self._commit_handle is not None:
                self._commit_handle.cancel()
            self._commit()
        self._db.close()


