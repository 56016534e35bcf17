"""Watch streams: newline-delimited JSON events over a chunked HTTP response, as kube-apiserver sends them.

A watch starts from the current state (synthetic ADDED events) when no resourceVersion or "0" is
given, or resumes after the given resourceVersion from the store's event log (a 410 Expired ERROR
event when that part of the log is gone). Label and field selectors apply to events the way the
watch cache applies them: an object that stops matching arrives as DELETED, one that starts
matching as ADDED. BOOKMARK events carry only the current resourceVersion.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from tfusion.apiserver import errors, tables
from tfusion.apiserver.conversion import to_served
from tfusion.apiserver.resources import ResourceInfo
from tfusion.apiserver.store import ADDED, DELETED, MODIFIED, Entry, Event, Selection, Store, Subscription

Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]


class WatchRequest:
    def __init__(
        self,
        info: ResourceInfo,
        namespace: str | None,
        *,
        resource_version: str | None,
        label_selector: Any,
        field_selector: Any,
        timeout_s: float | None,
        bookmarks: bool,
        as_table: bool = False,
        include_object: str = "Metadata",
        initial_events: bool | None = None,
    ) -> None:
        self.info = info
        self.namespace = namespace
        self.resource_version = resource_version
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.timeout_s = timeout_s
        self.bookmarks = bookmarks
        self.as_table = as_table
        self.include_object = include_object
        #: sendInitialEvents (the watch-list protocol): None when not given
        self.initial_events = initial_events
        self._table_started = False
        #: events at or before this resourceVersion are already known to the client
        self.after_rv = 0
        self.selection = Selection(label_selector, field_selector)

    def matches(self, entry: Entry) -> bool:
        return self.selection.matches(entry)

    def line(self, event_type: str, entry: Entry) -> bytes:
        if self.as_table:
            body = tables.table(
                self.info,
                [self._versioned(entry)],
                include_object=self.include_object,
                list_meta={"resourceVersion": str(entry.rv)},
                with_columns=not self._table_started,
            )
            self._table_started = True
            return orjson.dumps({"type": event_type, "object": body}) + b"\n"
        if entry.api_version != self.info.api_version:
            return _plain_line(event_type, orjson.dumps(self._versioned(entry)))
        return _LINES.line(event_type, entry)

    def _versioned(self, entry: Entry) -> dict[str, Any]:
        if entry.obj.get("apiVersion") == self.info.api_version:
            return entry.obj
        return to_served(self.info, entry.obj)

    def translate(self, event: Event) -> bytes | None:
        """The line this watcher sees for a store event, or None when it sees nothing."""
        if event.rv <= self.after_rv:
            return None  # already part of the state this watch started from
        if self.selection.everything:
            return self.line(event.type, event.entry)
        now = self.matches(event.entry)
        if event.type == ADDED:
            return self.line(ADDED, event.entry) if now else None
        before = event.old is not None and self.matches(event.old)
        if event.type == DELETED:
            return self.line(DELETED, event.entry) if before else None
        if now and before:
            return self.line(MODIFIED, event.entry)
        if now:
            return self.line(ADDED, event.entry)
        if before:
            return self.line(DELETED, event.entry)
        return None

    def bookmark(self, rv: int, *, initial_events_end: bool = False) -> bytes:
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if initial_events_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        obj = {"kind": self.info.kind, "apiVersion": self.info.api_version, "metadata": meta}
        return orjson.dumps({"type": "BOOKMARK", "object": obj}) + b"\n"


def _plain_line(event_type: str, raw: bytes) -> bytes:
    return b'{"type":"' + event_type.encode() + b'","object":' + raw + b"}\n"


class _SharedLines:
    """The line of an event as stored, built once for all the watchers it goes to (each would copy the
    object's bytes again). Keyed by the entry's identity; the cached value holds the entry, so that
    identity cannot be reused while it is cached. A few hundred suffice: watchers read each event
    within a few turns of the event loop of one another. Shared by every server of the process."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._lines: dict[tuple[int, str], tuple[Entry, bytes]] = {}

    def line(self, event_type: str, entry: Entry) -> bytes:
        key = (id(entry), event_type)
        cached = self._lines.get(key)
        if cached is not None and cached[0] is entry:
            return cached[1]
        line = _plain_line(event_type, entry.raw)
        if len(self._lines) >= self.size:
            # start afresh rather than evict one by one: one rebinding is safe while servers in other
            # threads (tests run several) use the cache too, and costs at most one rebuilt line each
            self._lines = {}
        self._lines[key] = (entry, line)
        return line


_LINES = _SharedLines(256)


def _error_line(error: errors.ApiError) -> bytes:
    return orjson.dumps({"type": "ERROR", "object": error.status()}) + b"\n"


async def serve_watch(
    store: Store,
    request: WatchRequest,
    send: Send,
    receive: Receive,
    *,
    bookmark_interval: float,
    headers: list[tuple[bytes, bytes]],
) -> None:
    info = request.info
    sub = store.subscribe(info.storage_key, request.namespace)
    try:
        initial: list[bytes] = []
        rv_text = request.resource_version
        if request.initial_events is False and rv_text in (None, "", "0"):
            request.after_rv = store.rv  # "start at most recent", with no synthetic events
        elif rv_text in (None, "", "0") or request.initial_events:
            request.after_rv = store.rv
            order, first, end = store.ordered(info.storage_key, request.namespace, None)
            bucket = store.bucket(info.storage_key)
            for index in range(first, end):
                entry = bucket[order[index]]
                if request.matches(entry):
                    initial.append(request.line(ADDED, entry))
            if request.initial_events:
                # the watch-list protocol: this bookmark tells the client its initial state is complete
                initial.append(request.bookmark(store.rv, initial_events_end=True))
        else:
            assert rv_text is not None
            since = request.after_rv = int(rv_text)
            events = store.events_since(info.storage_key, since)
            if events is None:
                initial.append(
                    _error_line(errors.expired(f"too old resource version: {since} ({store.log_start + 1})"))
                )
                await _start(send, headers)
                await send({"type": "http.response.body", "body": b"".join(initial), "more_body": False})
                return
            for event in events:
                if request.namespace is not None and event.entry.namespace != request.namespace:
                    continue
                line = request.translate(event)
                if line is not None:
                    initial.append(line)
        await _start(send, headers)
        if initial:
            await send({"type": "http.response.body", "body": b"".join(initial), "more_body": True})
        await _stream(store, request, sub, send, receive, bookmark_interval)
    finally:
        store.unsubscribe(sub)


async def _start(send: Send, headers: list[tuple[bytes, bytes]]) -> None:
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json"), *headers]}
    )


async def _stream(
    store: Store,
    request: WatchRequest,
    sub: Subscription,
    send: Send,
    receive: Receive,
    bookmark_interval: float,
) -> None:
    async def wait_disconnect() -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                sub.close()
                return

    watcher = asyncio.ensure_future(wait_disconnect())
    deadline = time.monotonic() + request.timeout_s if request.timeout_s else None
    next_bookmark = time.monotonic() + bookmark_interval if request.bookmarks else None
    try:
        while True:
            events, closing = await _next_batch(sub, _earliest(next_bookmark, deadline))
            chunk = [line for line in map(request.translate, events) if line is not None]
            if closing and sub.expired:
                chunk.append(_error_line(errors.expired(
                    f"the watch fell behind by more than the server's history ({store.history_bytes} bytes)")))
            now = time.monotonic()
            if next_bookmark is not None and now >= next_bookmark:
                chunk.append(request.bookmark(store.committed_rv))
                next_bookmark = now + bookmark_interval
            if chunk:
                await send({"type": "http.response.body", "body": b"".join(chunk), "more_body": True})
            if closing or (deadline is not None and now >= deadline):
                break
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    except OSError:
        pass  # the client went away mid-write
    finally:
        watcher.cancel()


def _earliest(*moments: float | None) -> float | None:
    present = [m for m in moments if m is not None]
    return min(present) if present else None


async def _next_batch(sub: Subscription, until: float | None) -> tuple[list[Event], bool]:
    """Every queued event (waiting for the first until `until`), and whether the stream must end."""
    queue = sub.queue
    events: list[Event] = []
    if queue.empty():
        try:
            if until is None:
                first = await queue.get()
            else:
                # a timer on this task, not wait_for's extra task per wait: client-go's watches ask for
                # bookmarks and a timeout, so every event of every such watcher waits here
                async with asyncio.timeout(max(until - time.monotonic(), 0)):
                    first = await queue.get()
        except TimeoutError:
            return events, False
        if first is None:
            return events, True
        sub.taken(first)
        events.append(first)
    while not queue.empty():
        event = queue.get_nowait()
        if event is None:
            return events, True
        sub.taken(event)
        events.append(event)
    return events, False
