"""Gang scheduling's state: which pods form a gang, who waits at Permit, when a gang is complete,
timed out or backing off. Pure: no I/O, no await, time passed in; gang_runtime.py does the rest.

Why a gang: a distributed job placed half-way holds GPUs and never runs. So the pods of one
workload group (`gang-group-key`, stamped by the pod webhook) are placed all or none:

- a member that passes Filter and Reserve keeps its reservation and waits at Permit, unbound;
- when the waiting members plus the members already bound reach the required count, every waiting
  member is released to bind; a group once satisfied lets later members (a replacement) pass at
  once, as the original does;
- when the gang timeout (`gang-timeout`, else the workload's `gangScheduling.timeout`; 0 or unset
  waits forever) runs out first, every waiting member is released (its reservation goes) and the
  group backs off `GANG_BACKOFF_S`; no member is tried meanwhile (PreEnqueue);
- a member that does not fit never releases the waiting ones before the timeout.

Required members as the original computes them: the pod's `gang-required-members` (the webhook
writes minMembers when ≥ 2, else the replicas); without it the workload's
`gangScheduling.minMembers` (0 ⇒ `replicas`). Annotations win over the workload.

Times are the runtime clock's seconds (monotonic); the caller turns them into wall time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from tfusion.api import annotations as tfa

#: how long a timed-out group waits before its members are tried again (the original's 10 s)
GANG_BACKOFF_S = 10.0

Phase = Literal["Pending", "Waiting", "Scheduling", "Running", "TimedOut", "Failed"]
GANG_PHASES: tuple[Phase, ...] = ("Pending", "Waiting", "Scheduling", "Running", "TimedOut", "Failed")


@dataclass(frozen=True, slots=True)
class GangSpec:
    """One pod's view of its gang: the group key ("namespace/workload"), how many members must be
    placed together, how many the workload has, and the timeout (None: wait forever)."""

    key: str
    required: int
    desired: int
    timeout: float | None


def _int_field(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def gang_spec(annotations: Mapping[str, str], workload_spec: Mapping[str, Any] | None = None) -> GangSpec | None:
    """The pod's gang, or None when it is in none. Raises `tfa.AnnotationError` naming the bad
    annotation (the scheduler shows it as the pod's reason)."""
    key = annotations.get(tfa.GANG_GROUP_KEY, "")
    if not key:
        return None
    workload_spec = workload_spec or {}
    config = workload_spec.get("gangScheduling")
    config = config if isinstance(config, Mapping) else {}
    replicas = _int_field(workload_spec.get("replicas"))
    desired = (tfa.parse_int(annotations[tfa.GANG_DESIRED_MEMBERS], key=tfa.GANG_DESIRED_MEMBERS, minimum=1)
               if annotations.get(tfa.GANG_DESIRED_MEMBERS) else replicas)
    if annotations.get(tfa.GANG_REQUIRED_MEMBERS):
        required = tfa.parse_int(annotations[tfa.GANG_REQUIRED_MEMBERS], key=tfa.GANG_REQUIRED_MEMBERS, minimum=1)
    elif annotations.get(tfa.GANG_MIN_MEMBERS):
        required = tfa.parse_gang_min_members(annotations[tfa.GANG_MIN_MEMBERS]) or desired or 0
    else:
        min_members = _int_field(config.get("minMembers")) or 0
        required = min_members if min_members >= 2 else (replicas or desired or 0)
    if required < 1:
        raise tfa.AnnotationError(tfa.GANG_REQUIRED_MEMBERS, "", "an integer of at least 2",
                                  detail=f"gang {key} has no member count: neither the annotation nor the "
                                         f"workload's gangScheduling.minMembers or replicas says how many")
    timeout_text = annotations.get(tfa.GANG_TIMEOUT) or ""
    timeout_key = tfa.GANG_TIMEOUT
    if not timeout_text and isinstance(config.get("timeout"), str):
        timeout_text, timeout_key = config["timeout"], "spec.gangScheduling.timeout"
    timeout = tfa.parse_gang_timeout(timeout_text, key=timeout_key) if timeout_text else None
    return GangSpec(key, required, max(desired or required, required), timeout)


@dataclass(slots=True)
class Waiting:
    """A member held at Permit: reserved, not bound. `payload` is the caller's (what to bind)."""

    uid: str
    pod_key: str
    since: float
    payload: Any = None


@dataclass(slots=True)
class Group:
    """One gang's progress. `bound` are the members known bound (or binding)."""

    spec: GangSpec
    waiting: dict[str, Waiting] = field(default_factory=dict)
    bound: set[str] = field(default_factory=set)
    satisfied: bool = False
    deadline: float | None = None
    backoff_until: float = 0.0
    phase: Phase = "Pending"
    reason: str = ""
    message: str = ""
    changed_at: float = 0.0

    @property
    def key(self) -> str:
        return self.spec.key

    @property
    def reserved(self) -> int:
        return len(self.waiting) + len(self.bound)

    @property
    def missing(self) -> int:
        return max(0, self.spec.required - self.reserved)

    def waiting_message(self) -> str:
        return (f"waiting for {self.missing} more member(s) of gang {self.key} "
                f"({self.reserved}/{self.spec.required} reserved)")


@dataclass(frozen=True, slots=True)
class PermitAnswer:
    """Permit's answer: `release` are the members to bind now (this one among them when the gang is
    complete or was satisfied before); empty while the member waits."""

    release: tuple[Waiting, ...]

    @property
    def waits(self) -> bool:
        return not self.release


class GangBook:
    """Every gang this scheduler has seen. `wait_cap` bounds any gang's wait (the extender: its
    httpTimeout minus a margin); `changed` collects the group keys whose status must be written."""

    def __init__(self, *, backoff_s: float = GANG_BACKOFF_S, wait_cap: float | None = None) -> None:
        self.backoff_s = backoff_s
        self.wait_cap = wait_cap
        self.groups: dict[str, Group] = {}
        self._member_of: dict[str, str] = {}  # waiting uid -> group key
        self.changed: set[str] = set()

    # --- reading -----------------------------------------------------------------------------------

    def group(self, spec: GangSpec) -> Group:
        """The group of `spec`, made when first seen; the newest member's spec is the group's."""
        found = self.groups.get(spec.key)
        if found is None:
            found = self.groups[spec.key] = Group(spec)
        elif found.spec != spec:
            found.spec = spec
        return found

    def waiting_uids(self) -> set[str]:
        """Every member held at Permit (the orphan sweep must keep their reservations)."""
        return set(self._member_of)

    def is_waiting(self, uid: str) -> bool:
        return uid in self._member_of

    def effective_timeout(self, spec: GangSpec) -> float | None:
        if self.wait_cap is None:
            return spec.timeout
        return self.wait_cap if spec.timeout is None else min(spec.timeout, self.wait_cap)

    def next_deadline(self) -> float | None:
        return min((g.deadline for g in self.groups.values() if g.deadline is not None), default=None)

    # --- PreEnqueue --------------------------------------------------------------------------------

    def blocked(self, spec: GangSpec, now: float, peers: int) -> str:
        """Why a member must not be tried now ("" when it may): its group backs off after a timeout,
        or fewer members exist than the gang needs (`peers`: live pods of the group)."""
        group = self.group(spec)
        if group.backoff_until > now:
            return (f"gang {spec.key} timed out waiting for its members and backs off for "
                    f"{group.backoff_until - now:.0f} s more")
        if not group.satisfied and peers < spec.required:
            return (f"waiting for {spec.required - peers} more pod(s) of gang {spec.key} to be created "
                    f"({peers}/{spec.required} exist)")
        return ""

    # --- Permit ------------------------------------------------------------------------------------

    def permit(self, spec: GangSpec, uid: str, pod_key: str, now: float, bound: Iterable[str],
               payload: Any = None) -> PermitAnswer:
        """A member passed Reserve. `bound` are the group's members bound already (the caller's
        view of the cluster). Released members leave the book; the group is then satisfied."""
        group = self.group(spec)
        group.bound = set(bound) - group.waiting.keys() - {uid}
        member = Waiting(uid, pod_key, now, payload)
        if group.satisfied:
            group.bound.add(uid)
            return PermitAnswer((member,))
        group.waiting[uid] = member
        self._member_of[uid] = spec.key
        if group.reserved >= spec.required:
            released = tuple(group.waiting.values())
            self._drop_waiting(group)
            group.bound.update(m.uid for m in released)
            group.satisfied = True
            group.deadline = None
            self._set(group, "Scheduling", now, "GangComplete",
                      f"{len(group.bound)}/{spec.required} members reserved: binding")
            return PermitAnswer(released)
        timeout = self.effective_timeout(spec)
        if group.deadline is None and timeout is not None:
            group.deadline = now + timeout
        self._set(group, "Waiting", now, "WaitingForMembers", group.waiting_message())
        return PermitAnswer(())

    def unreserve(self, uid: str, now: float) -> Waiting | None:
        """A waiting member left (deleted, or no longer ours): it leaves the book; the caller drops
        its reservation. The group keeps waiting for a replacement."""
        key = self._member_of.pop(uid, None)
        if key is None:
            return None
        group = self.groups[key]
        member = group.waiting.pop(uid)
        if not group.waiting:
            group.deadline = None
        self._set(group, "Waiting" if group.waiting else "Pending", now, "MemberLeft", group.waiting_message())
        return member

    def bind_failed(self, spec: GangSpec, uid: str) -> None:
        """A released member's bind failed: it is no longer counted bound (it is tried again, and
        passes at once: the group stays satisfied)."""
        group = self.groups.get(spec.key)
        if group is not None:
            group.bound.discard(uid)

    def expire(self, now: float) -> list[tuple[Group, tuple[Waiting, ...]]]:
        """Groups whose wait ran out: their waiting members (whose reservations the caller drops),
        and the group backs off."""
        out = []
        for group in self.groups.values():
            if group.deadline is None or group.deadline > now:
                continue
            released = tuple(group.waiting.values())
            self._drop_waiting(group)
            group.deadline = None
            group.backoff_until = now + self.backoff_s
            self._set(group, "TimedOut", now, "GangTimeout",
                      f"timed out with {len(released) + len(group.bound)}/{group.spec.required} members "
                      f"reserved; released them, retrying after {self.backoff_s:.0f} s")
            out.append((group, released))
        return out

    def fail(self, spec: GangSpec, now: float, message: str) -> None:
        """The gang can never be placed (capacity or quota): said at once, nothing waits."""
        group = self.group(spec)
        released = tuple(group.waiting.values())
        if released:  # never the case in practice: the check runs before any member reserves
            self._drop_waiting(group)
        group.deadline = None
        self._set(group, "Failed", now, "GangUnsatisfiable", message)

    def clear(self) -> None:
        """A new leadership term: the allocator is rebuilt, so no reservation of the last term is held."""
        self.groups.clear()
        self._member_of.clear()
        self.changed.clear()

    def forget(self, key: str) -> None:
        """The group has no pod left."""
        group = self.groups.pop(key, None)
        if group is not None:
            self._drop_waiting(group)
            self.changed.discard(key)

    # --- internals ---------------------------------------------------------------------------------

    def _drop_waiting(self, group: Group) -> None:
        for uid in group.waiting:
            self._member_of.pop(uid, None)
        group.waiting.clear()

    def _set(self, group: Group, phase: Phase, now: float, reason: str, message: str) -> None:
        if (group.phase, group.reason, group.message) == (phase, reason, message):
            return
        if group.phase != phase:
            group.changed_at = now
        group.phase, group.reason, group.message = phase, reason, message
        self.changed.add(group.key)


#: the reason the workload controller gives its own Failed (a member failed)
MEMBER_FAILED = "MemberFailed"


def controller_phase(current: Phase, reason: str, ready: int, failed: int, required: int) -> Phase:
    """The phases the workload controller owns: Running once `required` members are ready, Failed
    (reason MEMBER_FAILED) when a member failed; when neither holds any more, its own phase goes back
    to Pending. The scheduler's phases (Failed for a gang that can never fit among them) stay."""
    if failed:
        return "Failed"
    if required and ready >= required:
        return "Running"
    if current == "Running" or (current == "Failed" and reason == MEMBER_FAILED):
        return "Pending"
    return current
