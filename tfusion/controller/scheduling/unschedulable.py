"""Telling users why a pod waits: the kept explanations, the FailedScheduling event and the
PodScheduled condition of each pod the built-in scheduler (or the extender) could not place.

Why a module of its own: the scheduler decides; this says what it decided, and how often. A pod
that fits nowhere is tried again whenever an event might make it fit, thousands of times for a
long-pending one, and each try must not become a write. So:

- the explanation (per-node reasons with numbers and the framework's suggestions, explain.py's
  `Why`) is kept in memory, one per pending pod, at most `MAX_EXPLANATIONS` (oldest dropped first),
  for `GET /api/why` and `tfusion why`;
- a `FailedScheduling` event goes out at most once per pod per `EVENT_INTERVAL_S` (the recorder
  counts repeats of an identical one);
- the condition `PodScheduled=False, reason=Unschedulable` with kube's message ("0/5 nodes are
  available: 2 Insufficient cpu, 3 GPU VRAM too small.") is written only when the message changes.

The bodies come from explain.py, the one renderer of the framework's answers.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from anyio.abc import TaskGroup

from tfusion.api.accessors import Pod
from tfusion.controller.scheduling.explain import Why, unschedulable_condition
from tfusion.kube import resources as r
from tfusion.kube.client import KubeError, NotFound

if TYPE_CHECKING:
    from tfusion.kube.manager import Manager

log = logging.getLogger(__name__)

#: at most one new FailedScheduling event per pod this often
EVENT_INTERVAL_S = 30.0
#: explanations kept (oldest dropped first); one per pending pod
MAX_EXPLANATIONS = 20_000


def pod_key(pod: Pod) -> str:
    return f"{pod.namespace or 'default'}/{pod.name}"


def as_pod(pod: Pod) -> Pod:
    """Informer list items carry no kind; events and JSON need it."""
    return Pod({**pod.raw, "apiVersion": "v1", "kind": "Pod"})


class Reports:
    """The explanations by "namespace/name", and the throttles of the event and the condition by UID.
    `manager` gives the clock, the event recorder and the client (read at each write: tests and the
    lean binding path may replace the client)."""

    def __init__(self, manager: Manager) -> None:
        self.manager = manager
        self.whys: dict[str, Why] = {}
        self._last_event: dict[str, float] = {}
        self._condition_written: dict[str, str] = {}

    def remember(self, key: str, why: Why) -> None:
        self.whys.pop(key, None)
        self.whys[key] = why
        while len(self.whys) > MAX_EXPLANATIONS:
            self.whys.pop(next(iter(self.whys)))

    def forget(self, key: str) -> None:
        """The pod is placed, gone or no longer ours: its explanation goes."""
        self.whys.pop(key, None)

    def forget_uid(self, uid: str) -> None:
        """The pod was deleted: its throttles go."""
        self._last_event.pop(uid, None)
        self._condition_written.pop(uid, None)

    def report(self, pod: Pod, why: Why, tg: TaskGroup | None) -> None:
        """Keep `why`; send the event and write the condition when their throttles allow."""
        self.remember(pod_key(pod), why)
        uid = why.uid
        now = self.manager.clock.now()
        last = self._last_event.get(uid)
        if last is None or now - last >= EVENT_INTERVAL_S:
            self._last_event[uid] = now
            self.manager.recorder.warning(as_pod(pod), "FailedScheduling", why.message)
        if self._condition_written.get(uid) != why.message and tg is not None:
            self._condition_written[uid] = why.message
            tg.start_soon(self._write_condition, pod, why.message)

    async def _write_condition(self, pod: Pod, message: str) -> None:
        condition = unschedulable_condition(pod, message)
        try:
            await self.manager.client.patch(r.PODS, pod.name, {"status": {"conditions": [condition]}},
                                            namespace=pod.namespace or "default", patch_type="strategic",
                                            subresource="status")
        except NotFound:
            pass
        except KubeError as exc:
            self._condition_written.pop(pod.uid, None)
            log.warning("cannot set the PodScheduled condition of pod %s: %s", pod_key(pod), exc)
