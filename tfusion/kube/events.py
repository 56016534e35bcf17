"""Kubernetes Events (core/v1) for users to read with `kubectl describe`.

Reconcilers report what they did or why they could not; the same thing often happens again and
again, so the recorder aggregates like client-go's event correlator: the same (object, type,
reason, message) within `window` seconds bumps `count` and `lastTimestamp` of the existing Event
with a patch instead of creating another one. Recording never blocks and never raises into the
caller: events go through a bounded background queue and are dropped (and counted) when it is
full or when the API server refuses them.
"""

from __future__ import annotations

import logging
import socket
import time
from collections import OrderedDict
from dataclasses import dataclass

import anyio
from anyio.abc import TaskStatus

from tfusion.api.accessors import Body
from tfusion.api.timestamps import rfc3339 as _timestamp
from tfusion.kube.client import KubeClient, KubeError, NotFound
from tfusion.kube.resources import EVENTS

log = logging.getLogger(__name__)

NORMAL, WARNING = "Normal", "Warning"
MAX_MESSAGE = 1024
#: a drop is logged at most this often (with the count so far): when the API server falls behind,
#: thousands of events are dropped in a minute, and a line for each cost CPU of their own
DROP_LOG_EVERY_S = 10.0


@dataclass
class _Pending:
    involved: dict[str, str]
    type: str
    reason: str
    message: str


@dataclass
class _Seen:
    name: str
    namespace: str
    count: int
    last_seen: float


class EventRecorder:
    """`recorder.event(obj, "Warning", "AllocationFailed", "…")`; run `recorder.run()` in a task group."""

    def __init__(self, client: KubeClient, *, component: str = "tensor-fusion-operator",
                 instance: str | None = None, host: str | None = None, window: float = 600.0,
                 queue_size: int = 1000, cache_size: int = 4096) -> None:
        self.client = client
        self.component = component
        self.instance = instance or socket.gethostname()
        self.host = host or socket.gethostname()
        self.window = window
        self.cache_size = cache_size
        self._send, self._receive = anyio.create_memory_object_stream[_Pending](queue_size)
        self._seen: OrderedDict[tuple[str, ...], _Seen] = OrderedDict()
        self._idle = anyio.Event()
        self._idle.set()
        self._outstanding = 0
        self.dropped = 0
        self.written = 0
        self._drop_logged_at = -DROP_LOG_EVERY_S

    # --- recording (never blocks, never raises) -------------------------------------------------

    def event(self, obj: Body, type: str, reason: str, message: str) -> None:
        try:
            if type not in (NORMAL, WARNING):
                raise ValueError(f"event type {type!r}: expected Normal or Warning")
            if not reason:
                raise ValueError("event reason: required")
            involved = self._involved(obj)
            pending = _Pending(involved, type, reason, message[:MAX_MESSAGE])
            self._send.send_nowait(pending)
            self._outstanding += 1
            self._idle = anyio.Event() if self._idle.is_set() else self._idle
        except anyio.WouldBlock:
            self._drop(f"event queue full; dropped {type} {reason}")
        except Exception as exc:
            self._drop(f"dropped event {type} {reason}: {exc}")

    def _drop(self, what: str) -> None:
        self.dropped += 1
        now = time.monotonic()
        if now - self._drop_logged_at >= DROP_LOG_EVERY_S:
            self._drop_logged_at = now
            log.warning("%s (%d event(s) dropped so far; the next drops are logged %.0f s from now)",
                        what, self.dropped, DROP_LOG_EVERY_S)

    def normal(self, obj: Body, reason: str, message: str) -> None:
        self.event(obj, NORMAL, reason, message)

    def warning(self, obj: Body, reason: str, message: str) -> None:
        self.event(obj, WARNING, reason, message)

    async def drain(self) -> None:
        """Wait until every event recorded so far has been written (or dropped)."""
        await self._idle.wait()

    @staticmethod
    def _involved(obj: Body) -> dict[str, str]:
        meta = obj.meta
        involved = {"apiVersion": obj.api_version, "kind": obj.kind, "name": meta.name,
                    "namespace": meta.namespace, "uid": meta.uid, "resourceVersion": meta.resource_version}
        if not involved["name"] or not involved["kind"]:
            raise ValueError("involved object needs kind and metadata.name")
        return {k: v for k, v in involved.items() if v}

    # --- writing ----------------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        async with self._receive:
            async for pending in self._receive:
                try:
                    await self._write(pending)
                    self.written += 1
                except KubeError as exc:
                    self.dropped += 1
                    log.warning("could not write event %s %s: %s", pending.type, pending.reason, exc)
                except Exception:
                    self.dropped += 1
                    log.exception("could not write event %s %s", pending.type, pending.reason)
                finally:
                    self._outstanding -= 1
                    if self._outstanding == 0:
                        self._idle.set()

    async def _write(self, pending: _Pending) -> None:
        involved = pending.involved
        key = (involved.get("namespace", ""), involved["kind"], involved["name"], involved.get("uid", ""),
               pending.type, pending.reason, pending.message)
        now = time.monotonic()
        seen = self._seen.get(key)
        if seen is not None and now - seen.last_seen <= self.window:
            try:
                bump = {"count": seen.count + 1, "lastTimestamp": _timestamp()}
                await self.client.patch(EVENTS, seen.name, bump, namespace=seen.namespace)
                seen.count += 1
                seen.last_seen = now
                self._seen.move_to_end(key)
                return
            except NotFound:
                pass  # someone removed it (events expire); start a new one
        namespace = involved.get("namespace") or "default"
        stamp = _timestamp()
        body = {
            "metadata": {"name": f"{involved['name']}.{time.time_ns():x}", "namespace": namespace},
            "involvedObject": involved, "reason": pending.reason, "message": pending.message,
            "type": pending.type, "count": 1, "firstTimestamp": stamp, "lastTimestamp": stamp,
            "source": {"component": self.component, "host": self.host},
            "reportingComponent": self.component, "reportingInstance": self.instance,
        }
        created = await self.client.create(EVENTS, body, namespace=namespace)
        self._seen[key] = _Seen(Body(created).name, namespace, 1, now)
        while len(self._seen) > self.cache_size:
            self._seen.popitem(last=False)

