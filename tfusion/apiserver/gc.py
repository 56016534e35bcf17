"""Background cleanup kube-controller-manager would do: ownerReference garbage collection and namespace deletion.

The collector watches the store's event stream; when an object is really gone (not just marked for
deletion) its dependents are deleted in the background, or only lose that ownerReference when
another owner still exists, which is kube's garbage collector behaviour. A terminating namespace
has its contents deleted and disappears once empty (objects with finalizers keep it waiting).

An owner that is already gone when its dependent names it never sends the DELETED event the
collector waits for: a reference written after the owner's deletion (a controller adopting an
object for a pod that was deleted meanwhile), a uid that never existed, or an owner deleted while
the process was killed before its dependents were collected. So, as kube's collector verifies an
owner it has not seen, every write naming an owner uid that is not in the store, and every such
reference found at start, is checked: when the owner's kind is served here and no object has that
uid, the dependent is collected (or loses that reference when another owner exists). A kind this
server does not serve cannot be verified and is left alone, as kube leaves it.
"""

from __future__ import annotations

import asyncio
import logging

from tfusion.apiserver.errors import ApiError
from tfusion.apiserver.objects import FOREGROUND, Engine
from tfusion.apiserver.store import DELETED, Entry, Event

log = logging.getLogger(__name__)

_NamedKey = tuple[str, str, str]  # storage key, namespace, name


class GarbageCollector:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._uids: dict[str, _NamedKey] = {}
        self._dependents: dict[str, set[_NamedKey]] = {}
        self._queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue()  # (action, owner uid)
        self._namespaces: set[str] = set()
        self._wake = asyncio.Event()
        #: owner uids queued for verification (one queue entry each, however many writes name it)
        self._verifying: set[str] = set()
        store = engine.store
        for storage_key in store.storage_keys():
            for _, entry in store.items(storage_key):
                self._index(storage_key, entry, add=True)
        for storage_key in store.storage_keys():  # owners deleted while no collector ran
            for _, entry in store.items(storage_key):
                self._verify_owners(entry)
        store.listeners.append(self._on_event)
        engine.on_namespace_terminating = self._namespace_terminating
        engine.has_dependents = lambda uid: bool(self._dependents.get(uid))
        engine.on_foreground = lambda uid: self._queue.put_nowait(("foreground", uid))
        for _, entry in store.items("/namespaces"):
            if entry.obj["metadata"].get("deletionTimestamp"):
                self._namespaces.add(entry.obj["metadata"]["name"])

    def _index(self, storage_key: str, entry: Entry, *, add: bool) -> None:
        """Index (or unindex) an object's uid and owners from the fields its entry keeps: no decoding."""
        key = (storage_key, entry.namespace, entry.name)
        uid = entry.uid
        if uid:
            if add:
                self._uids[uid] = key
            elif self._uids.get(uid) == key:
                del self._uids[uid]
        for owner, _, _ in entry.owners:
            if add:
                self._dependents.setdefault(owner, set()).add(key)
            else:
                deps = self._dependents.get(owner)
                if deps is not None:
                    deps.discard(key)
                    if not deps:
                        del self._dependents[owner]

    def _on_event(self, event: Event) -> None:
        if event.old is not None:
            self._index(event.storage_key, event.old, add=False)
        if event.type == DELETED:
            entry = event.entry
            if entry.uid and entry.uid in self._dependents:
                self._queue.put_nowait(("collect", entry.uid))
            for owner, _, _ in entry.owners:
                self._queue.put_nowait(("release", owner))
            if entry.namespace in self._namespaces:
                self._wake.set()
        else:
            self._index(event.storage_key, event.entry, add=True)
            self._verify_owners(event.entry)

    def _verify_owners(self, entry: Entry) -> None:
        """Queue the owners `entry` names that are not in the store (see the module docstring)."""
        for owner, api_version, kind in entry.owners:
            if owner in self._uids or owner in self._verifying:
                continue
            if self._kind_served(api_version, kind):
                self._verifying.add(owner)
                self._queue.put_nowait(("verify", owner))

    def _kind_served(self, api_version: str, kind: str) -> bool:
        group, _, version = api_version.rpartition("/")
        return any(info.kind == kind for info in self.engine.registry.in_group_version(group, version))

    def _namespace_terminating(self, name: str) -> None:
        self._namespaces.add(name)
        self._wake.set()

    def owner_exists(self, uid: str) -> bool:
        return uid in self._uids

    async def run(self) -> None:
        await asyncio.gather(self._collect(), self._finish_namespaces())

    async def _collect(self) -> None:
        while True:
            action, owner = await self._queue.get()
            try:
                if action == "release":
                    self._release_foreground(owner)
                    continue
                if action == "verify":
                    self._verifying.discard(owner)
                    if self.owner_exists(owner):
                        continue
                    action = "collect"
                dependents = (
                    self._dependents.pop(owner, set())
                    if action == "collect"
                    else set(self._dependents.get(owner, set()))
                )
                for storage_key, namespace, name in sorted(dependents):
                    if action == "collect":
                        self._collect_one(owner, storage_key, namespace, name)
                    else:
                        self._delete_for_foreground(storage_key, namespace, name)
                    await asyncio.sleep(0)
                if action == "foreground":
                    self._release_foreground(owner)
            except ApiError as exc:
                log.warning("garbage collection for owner %s failed: %s", owner, exc.message)

    def _delete_for_foreground(self, storage_key: str, namespace: str, name: str) -> None:
        entry = self.engine.store.get(storage_key, namespace, name)
        info = self.engine.registry.storage_info(storage_key)
        if entry is None or info is None or entry.obj["metadata"].get("deletionTimestamp"):
            return
        self.engine.delete(info, namespace, name, {"propagationPolicy": "Foreground"})

    def _release_foreground(self, owner: str) -> None:
        """A foreground-deleting owner whose dependents are all gone loses its finalizer (and goes)."""
        key = self._uids.get(owner)
        if key is None or self._dependents.get(owner):
            return
        storage_key, namespace, name = key
        entry = self.engine.store.get(storage_key, namespace, name)
        info = self.engine.registry.storage_info(storage_key)
        if entry is None or info is None:
            return
        finalizers = entry.obj["metadata"].get("finalizers") or []
        if FOREGROUND not in finalizers:
            return
        obj = entry.copy()
        obj["metadata"]["finalizers"] = [f for f in finalizers if f != FOREGROUND]
        self.engine.commit_update(info, entry, obj)

    def _collect_one(self, owner: str, storage_key: str, namespace: str, name: str) -> None:
        entry = self.engine.store.get(storage_key, namespace, name)
        info = self.engine.registry.storage_info(storage_key)
        if entry is None or info is None:
            return
        refs = entry.obj["metadata"].get("ownerReferences") or []
        if not any(r.get("uid") == owner for r in refs):
            return
        others = [r for r in refs if r.get("uid") != owner and self.owner_exists(r.get("uid", ""))]
        if others:
            obj = entry.copy()
            obj["metadata"]["ownerReferences"] = [r for r in refs if r.get("uid") != owner]
            self.engine.commit_update(info, entry, obj)
            return
        self.engine.delete(info, namespace, name, {"propagationPolicy": "Background"})

    async def _finish_namespaces(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            for name in sorted(self._namespaces):
                self._empty_namespace(name)
                if self.engine.finish_namespace(name):
                    self._namespaces.discard(name)
                await asyncio.sleep(0)

    def _empty_namespace(self, namespace: str) -> None:
        engine = self.engine
        for storage_key in engine.store.storage_keys():
            info = engine.registry.storage_info(storage_key)
            if info is None or not info.namespaced:
                continue
            for _, entry in engine.store.items(storage_key, namespace):
                meta = entry.obj["metadata"]
                if meta.get("deletionTimestamp"):
                    continue
                try:
                    engine.delete(info, namespace, meta["name"], {"propagationPolicy": "Background"})
                except ApiError as exc:
                    if exc.code != 404:
                        log.warning(
                            "deleting %s %s/%s for its namespace failed: %s",
                            storage_key,
                            namespace,
                            meta["name"],
                            exc.message,
                        )
