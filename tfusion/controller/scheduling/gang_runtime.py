"""Gang scheduling in the scheduler: the hooks the built-in scheduler and the extender call, the
gang timer, the workload's `status.gang`, and what a waiting member tells its user.

Why a module of its own: gang.py holds the state (pure); this is where it meets the cluster. The
scheduler calls three hooks (see scheduler.py `_cycle`):

- `holds_back` (PreEnqueue), before a member is tried: its group backs off after a timeout, fewer
  of its pods exist than the gang needs, or the gang can never fit (allocator/gangfit.py: the pool's
  capacities or the namespace quota's totals, not the current load; then status.gang says Failed at
  once). The member is parked with that reason.
- `permit` (Permit), after Reserve: the members to bind now, or none while this one waits with its
  reservation (it stays "in flight" in the queue, so it is not tried again). When the gang is
  complete every waiting member binds. If one member's bind fails after that, the others still
  bind (the original does the same: binds are independent once permitted); the failed one is
  tried again and passes at once, the group being satisfied. No member binds before the gang is
  complete.
- the scheduler reports a bind's outcome (`bound`, `bind_failed`).

The timer releases the members of a gang whose timeout ran out (each reservation is rolled back,
an event `GangTimedOut` on each, the group backs off gang.GANG_BACKOFF_S); a deleted waiting
member gives its reservation back at once. The allocator's orphan sweep is told the waiting
members (`AllocatorService.keep_assumed`), so a long wait never expires a reservation.

Extender mode: kube-scheduler cannot wait at our Permit, so its `/scheduler/bind` call of a member
waits here until the gang is complete (then every waiting call binds its pod) or its wait ends
(then it answers an error and the reservation is gone). The wait never exceeds
`EXTENDER_WAIT_CAP_S`: the shipped extender's httpTimeout (deploy/overlays/kube-scheduler,
30 s) minus a margin, so kube-scheduler never gives up on a call that would still bind. A longer
gang timeout is capped to it (said once in the log and in the gang's message); kube-scheduler then
tries the members again after the group's backoff.

`status.gang` of the TensorFusionWorkload (phase, groupKey, desired/waiting/scheduled counts,
lastTransitionTime, reason, message, backoffUntil) is written by the leader, coalesced per
workload every `STATUS_FLUSH_S`, as a merge patch of the status subresource; the workload
controller owns readyMembers and the phases Running and Failed (for failed pods), the scheduler
Waiting, Scheduling and TimedOut (and Failed for a gang that can never fit).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import anyio
from anyio.abc import TaskGroup

from tfusion.allocator.framework import Code
from tfusion.allocator.gangfit import gang_never_fits
from tfusion.allocator.request import RequestError
from tfusion.api import annotations as tfa
from tfusion.api.accessors import Pod
from tfusion.api.jsontypes import JsonMapping
from tfusion.api.timestamps import rfc3339
from tfusion.controller.scheduling import nodes as nc
from tfusion.controller.scheduling.explain import why_text
from tfusion.controller.scheduling.gang import GangBook, GangSpec, Group, Waiting, gang_spec
from tfusion.controller.scheduling.unschedulable import as_pod, pod_key
from tfusion.kube import resources as r
from tfusion.kube.client import KubeError, NotFound

if TYPE_CHECKING:
    from tfusion.controller.scheduling.scheduler import Decision, Scheduler

log = logging.getLogger(__name__)

GANG_INDEX = "gang-group"
#: the httpTimeout of the extender in deploy/overlays/kube-scheduler/scheduler/scheduler-config.yaml
EXTENDER_HTTP_TIMEOUT_S = 30.0
#: a bind call answers this long before kube-scheduler would give up on it
EXTENDER_MARGIN_S = 5.0
EXTENDER_WAIT_CAP_S = EXTENDER_HTTP_TIMEOUT_S - EXTENDER_MARGIN_S
#: status.gang writes are coalesced per workload this long
STATUS_FLUSH_S = 0.5
#: a waiting member's PodScheduled condition and event are written once its gang has waited this long
TELL_AFTER_S = 1.0


def gang_group_index(obj: JsonMapping) -> list[str]:
    """The pod's gang group key (an informer index)."""
    key = Pod(obj).meta.annotations.get(tfa.GANG_GROUP_KEY)
    return [key] if key else []


@dataclass(eq=False)
class Member:
    """A reserved member: what to bind, and (extender) the bind call waiting for the verdict."""

    key: str
    pod: Pod
    decision: Decision
    spec: GangSpec
    outcome: Literal["waiting", "bind", "rejected"] = "waiting"
    verdict: anyio.Event = field(default_factory=anyio.Event)


class GangCoordinator:
    """See the module docstring."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        extender = scheduler.mode == "extender"
        self.book = GangBook(wait_cap=EXTENDER_WAIT_CAP_S if extender else None)
        self._wake = anyio.Event()
        self._capped_noted: set[str] = set()
        self._writes: TaskGroup | None = None  # the leader's: condition writes of waiting members
        self._untold: set[str] = set()  # gangs whose waiting members' conditions are not written yet
        self.status_writes = 0

    def attach(self) -> GangCoordinator:
        pods = self.scheduler.pods
        pods.add_index(GANG_INDEX, gang_group_index)
        pods.add_handler(on_add=self._on_add, on_update=self._on_update, on_delete=self._on_delete)
        self.scheduler.service.keep_assumed = self.book.waiting_uids
        self.scheduler.runtime.add_leader_task(self.run_leader)
        return self

    @property
    def clock_now(self) -> float:
        return self.scheduler.runtime.manager.clock.now()

    # --- reading the cluster ----------------------------------------------------------------------

    def spec_of(self, pod: Pod) -> GangSpec | None:
        """The pod's gang (raises tfa.AnnotationError for a bad gang annotation)."""
        notes = pod.meta.annotations
        key = notes.get(tfa.GANG_GROUP_KEY)
        if not key:
            return None
        raw = self.scheduler.runtime.informer(r.TENSORFUSIONWORKLOADS).get(key)
        spec = raw.get("spec") if raw is not None else None
        return gang_spec(notes, spec if isinstance(spec, dict) else None)

    def live_members(self, key: str) -> list[Pod]:
        pods = (Pod(p) for p in self.scheduler.pods.by_index(GANG_INDEX, key))
        return [p for p in pods if not p.finished and not p.meta.deleting]

    def bound_uids(self, key: str) -> set[str]:
        """Members bound (the cache shows a node) or being bound by this scheduler."""
        in_flight = self.scheduler._in_flight
        return {p.uid for p in self.live_members(key)
                if (p.node_name or p.uid in in_flight) and not self.book.is_waiting(p.uid)}

    # --- PreEnqueue -----------------------------------------------------------------------------------

    def holds_back(self, key: str, pod: Pod, tg: TaskGroup | None) -> bool:
        """True when the member must not be tried now; it is then parked (or held until its group's
        backoff ends) and told why."""
        try:
            spec = self.spec_of(pod)
        except tfa.AnnotationError as exc:
            return self._park(key, pod, f"the pod cannot be scheduled: {exc}", Code.UNRESOLVABLE, tg)
        if spec is None:
            return False
        now = self.clock_now
        blocked = self.book.blocked(spec, now, len(self.live_members(spec.key)))
        if blocked:
            group = self.book.group(spec)
            queue = self.scheduler.queue
            why = why_text(pod, blocked, Code.UNSCHEDULABLE)
            if group.backoff_until > now and queue is not None:
                self.scheduler.reports.report(pod, why, tg or self.scheduler._binds)
                queue.hold_until(key, group.backoff_until)
                return True
            # its peers are still being created (a Deployment's pods come one by one): kept for
            # GET /api/why, no condition or event, as kube writes none for a pod PreEnqueue holds
            self.scheduler.reports.remember(key, why)
            if queue is not None:
                queue.park(key)
            return True
        never = self.never_fits(pod, spec)
        if never:
            if self.book.group(spec).message != never:  # said once per pod and cause, not per attempt
                self.book.fail(spec, now, never)
                for member in self.live_members(spec.key):
                    self.scheduler.runtime.events.warning(as_pod(member), "GangUnsatisfiable", never)
            return self._park(key, pod, f"gang {spec.key} can never be placed: {never}", Code.UNRESOLVABLE, tg)
        return False

    def never_fits(self, pod: Pod, spec: GangSpec) -> str:
        """Why the gang can never fit, checked when a round of attempts starts (no member waits)."""
        group = self.book.group(spec)
        if group.satisfied or group.waiting:
            return ""
        allocator = self.scheduler.service.allocator
        if allocator is None:
            return ""
        try:
            req = self.scheduler.request_of(pod)
        except RequestError:
            return ""  # decide() explains a bad request
        return gang_never_fits(allocator, req, spec.required)

    def _park(self, key: str, pod: Pod, message: str, code: Code, tg: TaskGroup | None) -> bool:
        queue = self.scheduler.queue
        if queue is not None:
            queue.unschedulable(key)
        self.scheduler.reports.report(pod, why_text(pod, message, code), tg or self.scheduler._binds)
        return True

    def refusal(self, pod: Pod) -> str:
        """The extender's PreEnqueue: why kube-scheduler must not place this member now ("" if it may)."""
        try:
            spec = self.spec_of(pod)
        except tfa.AnnotationError as exc:
            return str(exc)
        if spec is None:
            return ""
        now = self.clock_now
        blocked = self.book.blocked(spec, now, len(self.live_members(spec.key)))
        if blocked:
            return blocked
        never = self.never_fits(pod, spec)
        if never:
            self.book.fail(spec, now, never)
            return f"gang {spec.key} can never be placed: {never}"
        return ""

    # --- Permit ---------------------------------------------------------------------------------------

    def permit(self, key: str, pod: Pod, decision: Decision, tg: TaskGroup | None) -> list[Member]:
        """After Reserve: the members to bind now (just this pod when it is in no gang); empty while
        it waits. Waiting members are told how many more the gang needs."""
        try:
            spec = self.spec_of(pod)
        except tfa.AnnotationError:
            spec = None  # holds_back refused it already; a change since: bind as a plain pod
        if spec is None:
            return [Member(key, pod, decision, GangSpec("", 1, 1, None), "bind")]
        member = Member(key, pod, decision, spec)
        self._note_capped(spec)
        answer = self.book.permit(spec, pod.uid, key, self.clock_now, self.bound_uids(spec.key), member)
        self._wake.set()
        if answer.waits:
            self._tell_waiting(self.book.group(spec), None)
            return []
        released = [m.payload for m in answer.release]
        for waiting in released:
            waiting.outcome = "bind"
            waiting.verdict.set()
        return released

    def _tell_waiting(self, group: Group, tg: TaskGroup | None) -> None:
        """Every waiting member's explanation says how many more the gang needs: kept at once (GET
        /api/why); the condition and event follow once the gang has waited `TELL_AFTER_S` (`tg` given:
        now), so a gang that completes within it writes none (n members would otherwise cost n²/2
        condition writes and n events)."""
        message = group.waiting_message()
        reports = self.scheduler.reports
        for waiting in group.waiting.values():
            pod = waiting.payload.pod
            why = why_text(pod, message, Code.UNSCHEDULABLE)
            if tg is None:
                reports.remember(waiting.pod_key, why)
            else:
                reports.report(pod, why, tg)
        if tg is None:
            self._untold.add(group.key)

    def _note_capped(self, spec: GangSpec) -> None:
        cap = self.book.wait_cap
        if cap is None or spec.key in self._capped_noted or (spec.timeout is not None and spec.timeout <= cap):
            return
        self._capped_noted.add(spec.key)
        wanted = "no timeout" if spec.timeout is None else f"a timeout of {spec.timeout:.0f} s"
        log.warning("gang %s asks for %s, but in extender mode a bind call waits at most %.0f s (the extender's "
                    "httpTimeout %.0f s minus %.0f s): the gang waits that long per attempt", spec.key, wanted,
                    cap, EXTENDER_HTTP_TIMEOUT_S, EXTENDER_MARGIN_S)

    async def extender_permit(self, key: str, pod: Pod, decision: Decision) -> str:
        """The extender's Permit, inside its bind call: "" to bind now, else why not (the
        reservation is then gone). Waits for the rest of the gang, at most the wait cap."""
        released = self.permit(key, pod, decision, None)
        if any(m.pod.uid == pod.uid for m in released):
            return ""
        member = next((m for m in self.waiting_members() if m.pod.uid == pod.uid), None)
        if member is None:
            return f"pod {key} left its gang while waiting"
        if await self.wait_verdict(member):
            return ""
        group = self.book.groups.get(member.spec.key)
        return f"gang {member.spec.key}: {group.message if group is not None else 'the wait ended'}"

    async def wait_verdict(self, member: Member) -> bool:
        """Extender: wait for the gang (True: bind now). On False the reservation is gone."""
        cap = self.book.effective_timeout(member.spec)
        with anyio.move_on_after((cap if cap is not None else EXTENDER_WAIT_CAP_S) + 1.0):
            await member.verdict.wait()
        if member.outcome == "bind":
            return True
        if member.outcome == "waiting":  # the timer did not run (not leading any more): give it back here
            self._release(self.book.unreserve(member.pod.uid, self.clock_now))
        return False

    # --- outcomes -------------------------------------------------------------------------------------

    def bind_failed(self, pod: Pod) -> None:
        """A member's bind failed: it no longer counts as bound."""
        try:
            spec = self.spec_of(pod)
        except tfa.AnnotationError:
            return
        if spec is not None:
            self.book.bind_failed(spec, pod.uid)

    def _release(self, waiting: Waiting | None) -> None:
        """Roll back a waiting member's reservation and its node totals."""
        if waiting is None:
            return
        member: Member = waiting.payload
        fw = self.scheduler.framework()
        if fw is not None:
            self.scheduler._unassume(member.pod, member.decision, fw)
        member.outcome = "rejected"
        member.verdict.set()

    def _on_add(self, raw: dict[str, Any]) -> None:
        """A new member may complete the gang's head count: its parked peers are tried again."""
        key = gang_group_index(raw)
        queue = self.scheduler.queue
        if not key or queue is None:
            return
        for peer in self.live_members(key[0]):
            if nc.is_pending(peer) and not self.book.is_waiting(peer.uid):
                queue.add(pod_key(peer))

    def _on_update(self, _old: dict[str, Any] | None, new: dict[str, Any]) -> None:
        pod = Pod(new)
        if self.book.is_waiting(pod.uid) and not nc.is_pending(pod):
            self._gone(pod)

    def _on_delete(self, raw: dict[str, Any]) -> None:
        pod = Pod(raw)
        if self.book.is_waiting(pod.uid):
            self._gone(pod)
        keys = gang_group_index(raw)
        if keys and not self.live_members(keys[0]):
            self.book.forget(keys[0])

    def _gone(self, pod: Pod) -> None:
        """A waiting member was deleted (or is being): its reservation goes at once."""
        waiting = self.book.unreserve(pod.uid, self.clock_now)
        self._release(waiting)
        queue = self.scheduler.queue
        if waiting is not None and queue is not None:
            queue.delete(waiting.pod_key)
        if waiting is not None:
            self._tell_waiting(self.book.groups[waiting.payload.spec.key], None)  # written at the next flush

    # --- the leader's loops ---------------------------------------------------------------------------

    async def run_leader(self) -> None:
        try:
            async with anyio.create_task_group() as tg:
                self._writes = tg
                tg.start_soon(self._timer)
                tg.start_soon(self._status_loop)
        finally:
            self.book.clear()  # the next term rebuilds the allocator: nothing of this term stays reserved

    async def _timer(self) -> None:
        clock = self.scheduler.runtime.manager.clock
        while True:
            self.expire(None)
            due = self.book.next_deadline()
            self._wake = wake = anyio.Event()
            with clock.move_on_after(float("inf") if due is None else max(0.0, due - clock.now())):
                await wake.wait()

    def expire(self, tg: TaskGroup | None) -> int:
        """Release the members of every gang whose wait ran out; returns how many were released."""
        released = 0
        for group, members in self.book.expire(self.clock_now):
            queue = self.scheduler.queue
            message = f"gang {group.key}: {group.message}"
            for waiting in members:
                member: Member = waiting.payload
                self._release(waiting)
                self.scheduler.runtime.events.warning(as_pod(member.pod), "GangTimedOut", message)
                self.scheduler.reports.report(member.pod, why_text(member.pod, message, Code.UNSCHEDULABLE),
                                              tg or self.scheduler._binds)
                if queue is not None:
                    queue.hold_until(member.key, group.backoff_until)
                released += 1
            log.info("%s", message)
        return released

    async def _status_loop(self) -> None:
        clock = self.scheduler.runtime.manager.clock
        while True:
            await clock.sleep(STATUS_FLUSH_S)
            await self.write_statuses()

    def _wall(self, at: float) -> str:
        return rfc3339(time.time() + (at - self.clock_now))

    def gang_status(self, group: Group) -> dict[str, Any]:
        now = self.clock_now
        scheduled = len(self.bound_uids(group.key)) if group.phase != "TimedOut" else 0
        return {"phase": group.phase, "groupKey": group.key, "desiredMembers": group.spec.desired,
                "waitingMembers": len(group.waiting), "scheduledMembers": scheduled,
                "lastTransitionTime": self._wall(group.changed_at), "reason": group.reason,
                "message": group.message,
                "backoffUntil": self._wall(group.backoff_until) if group.backoff_until > now else ""}

    def tell_waiting_members(self) -> None:
        """Write the conditions (and events) of the members of gangs waiting `TELL_AFTER_S` or more."""
        told_before = self.clock_now - TELL_AFTER_S
        for key in list(self._untold):
            group = self.book.groups.get(key)
            if group is None or not group.waiting:
                self._untold.discard(key)
            elif min(w.since for w in group.waiting.values()) <= told_before:
                self._untold.discard(key)
                self._tell_waiting(group, self._writes or self.scheduler._binds)

    async def write_statuses(self) -> None:
        """Write status.gang of every workload whose gang changed since the last call."""
        self.tell_waiting_members()
        changed, self.book.changed = self.book.changed, set()
        workloads = self.scheduler.runtime.informer(r.TENSORFUSIONWORKLOADS)
        for key in sorted(changed):
            group = self.book.groups.get(key)
            raw = workloads.get(key)
            if group is None or raw is None:
                continue
            namespace, _, name = key.partition("/")
            status: dict[str, Any] = {"gang": self.gang_status(group)}
            if "workerCount" not in (raw.get("status") or {}):
                status["workerCount"] = 0  # required by the schema; the workload controller writes the real one
            try:
                await self.scheduler.client.patch(r.TENSORFUSIONWORKLOADS, name, {"status": status},
                                                  namespace=namespace, subresource="status")
                self.status_writes += 1
            except NotFound:
                pass
            except KubeError as exc:
                self.book.changed.add(key)
                log.warning("cannot write status.gang of TensorFusionWorkload %s: %s", key, exc)

    def waiting_members(self) -> Iterator[Member]:
        for group in self.book.groups.values():
            for waiting in group.waiting.values():
                yield waiting.payload
