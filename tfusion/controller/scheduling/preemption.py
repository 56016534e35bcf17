"""Preemption in the built-in scheduler (its PostFilter): a GPU worker that fits nowhere may take the
place of pods of strictly lower priority, as kube's DefaultPreemption (patched by the original)
does.

Why it exists: without it a `critical` pod waits behind `low` pods that fill the GPUs (issue 26).
The arithmetic (would it fit without these pods, the minimal victim set, the least damaging node)
is the allocator's (tfusion/allocator/preemption.py); this module says who may be a victim and does
the evicting:

- eligible victims: GPU workers holding a committed allocation, of strictly lower priority
  (spec.priority; without one, the value of the PriorityClass we ship for its QoS), not protected
  (`tensor-fusion.ai/eviction-protection: <duration>` protects a pod until its creation + that
  duration), not already terminating, in the preemptor's namespace unless
  `TF_SCHEDULER_PREEMPT_CLUSTER_WIDE` is true (the default, as the original's), and not selected by a
  PodDisruptionBudget whose status allows no disruption (budgets are read from an informer; where
  the API serves none, none apply). A gang member (`gang-group-key`) goes with every running
  member of its group or not at all, and each member counts as damage;
- a preemptor whose `spec.preemptionPolicy` is Never (set from its PriorityClass) preempts nothing;
- the chosen victims are evicted through the Eviction API (policy/v1, pods/eviction), so budgets
  are checked once more by the API server: a 429 ends the attempt (nothing more is evicted, the
  pod backs off). Each evicted victim's allocation is released at once (AllocatorService.release;
  the pod reconciler's later release finds nothing to do) and the preemptor is reserved on the node
  right after, so the freed share is kept for it; its `status.nominatedNodeName` names the node;
- the preemptor binds once its victims on the node are gone from the informer; when they are not
  gone within their grace period + `VICTIM_WAIT_MARGIN_S`, the reservation goes and the pod is tried
  again later, saying which pod did not go. The victims do not get their shares back: a pod being
  deleted holds no GPU share (the pod reconciler's rule, reconcilers/pod.py), and by then its grace
  period is over, so its containers have been stopped unless its node is unreachable.

What users see: each victim gets a `Preempted` event naming the preemptor and the node; the
preemptor gets a `Preempting` event, and its explanation (PodScheduled message, `tfusion why`)
says what was preempted where. When preemption cannot help, the usual explanation gets a
"preemption: ..." note saying why (e.g. the lower-priority pods there are protected until a time).
Differences from kube: CPU and memory the victims would free are not counted (a node must pass the
node checks as it is), and victims of the same node are evicted one after another, not at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from anyio.abc import TaskGroup
from prometheus_client import Counter

from tfusion.allocator import AllocRequest
from tfusion.allocator.framework import Code, Framework
from tfusion.allocator.preemption import Candidate, Eligible, PreemptionSearch, SearchStats, VictimFacts
from tfusion.api import annotations as tfa
from tfusion.api.accessors import Body, Node, Pod
from tfusion.api.timestamps import rfc3339
from tfusion.controller.eviction import disruptions_allowed, evict, protected_until, selects
from tfusion.controller.scheduling import nodes as nc
from tfusion.controller.scheduling.explain import Why
from tfusion.controller.scheduling.unschedulable import as_pod, pod_key
from tfusion.kube import resources as r
from tfusion.kube.client import KubeError, NotFound
from tfusion.kube.informer import Informer

if TYPE_CHECKING:
    from tfusion.controller.scheduling.scheduler import Decision, Scheduler

log = logging.getLogger(__name__)

PDBS = r.PODDISRUPTIONBUDGETS
#: a victim may take its grace period to go; after that and this margin the attempt ends
VICTIM_WAIT_MARGIN_S = 30.0
DEFAULT_GRACE_S = 30.0
#: how often the informer is looked at for the victims while waiting
VICTIM_POLL_S = 0.05
GANG_INDEX = "preemption-gang"
#: nodes named in a "preemption: ..." note at most
NOTE_NODES = 3
#: a node found unable to help is looked at again at least this often (an eviction protection may
#: have run out meanwhile)
PROTECTION_STEP_S = 10.0


def gang_index(obj: Any) -> list[str]:
    """A bound pod's gang group (`gang-group-key`), for finding a victim's fellow members."""
    pod = Pod(obj)
    group = pod.meta.annotation(tfa.GANG_GROUP_KEY)
    return [group] if group and pod.node_name and not pod.finished else []


class PreemptionMetrics:
    def __init__(self, registry: Any) -> None:
        self.attempts = Counter("tfusion_scheduler_preemption_attempts", "preemption attempts by result "
                                "(started, bound, no_victims, refused, failed, timed_out, lost)", ["result"],
                                registry=registry)
        self.victims = Counter("tfusion_scheduler_preemption_victims", "pods evicted to make room for a "
                               "higher-priority pod", registry=registry)


@dataclass
class Refusals:
    """Why lower-priority pods could not be victims, per node (for the "preemption: ..." note)."""

    by_node: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    protected_until: dict[str, datetime] = field(default_factory=dict)

    def add(self, node: str, why: str, pod: str) -> None:
        self.by_node.setdefault(node, {}).setdefault(why, []).append(pod)


@dataclass
class Attempt:
    """One preemption under way: the pod, its request, the chosen node and victims."""

    key: str
    pod: Pod
    decision: Decision
    candidate: Candidate
    victims: dict[str, Pod]
    #: the explanation the attempt started from (why the pod fit nowhere)
    base: Why


class Preemption:
    """The built-in scheduler's PostFilter, and the eligibility rules the extender's preempt verb
    (extender_preempt.py) uses too; `attach()` it to a Scheduler."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.runtime = scheduler.runtime
        self.cluster_wide = bool(getattr(self.runtime.settings, "preempt_cluster_wide", True))
        self.metrics = PreemptionMetrics(self.runtime.registry)
        self.budgets: Informer | None = None
        #: victims of the attempts under way (not chosen again by another preemptor meanwhile)
        self._evicting: set[str] = set()
        #: what may be preempted changed everywhere (a budget, a gang) / on one node (its pods): the
        #: allocator keeps a node's examination while both (and the PROTECTION_STEP_S) stay
        self._epoch = 0
        self._node_epochs: dict[str, int] = {}
        self._node_refusals: dict[str, tuple[dict[str, list[str]], datetime | None]] = {}

    def attach(self) -> Preemption:
        self.budgets = self.runtime.manager.cache.informer(PDBS)
        self.scheduler.pods.add_index(GANG_INDEX, gang_index)
        self.budgets.add_handler(on_add=self._changed, on_update=self._changed, on_delete=self._changed)
        self.scheduler.pods.add_handler(on_add=self._pod_changed, on_update=self._pod_updated,
                                        on_delete=self._pod_changed)
        return self

    def _changed(self, *_: object) -> None:
        self._epoch += 1

    def _pod_changed(self, raw: Any) -> None:
        """A pod came or went: what may be preempted on its node changed (on every node, for a gang)."""
        pod = Pod(raw)
        if pod.meta.annotation(tfa.GANG_GROUP_KEY):
            self._epoch += 1
        elif pod.node_name:
            self._node_epochs[pod.node_name] = self._node_epochs.get(pod.node_name, 0) + 1

    def _pod_updated(self, old: Any, new: Any) -> None:
        if old is None or _eligibility_facts(Pod(old)) != _eligibility_facts(Pod(new)):
            if old is not None:
                self._pod_changed(old)
            self._pod_changed(new)

    def generation(self, scope: str) -> Callable[[str], Hashable]:
        """The allocator's per-node generation for one preemptor (see PreemptionSearch.best): what
        may be preempted on a node changes with its pods, the budgets, gangs, the preemptor's
        namespace scope and, as protections run out, the time."""
        shared = (scope, self._epoch, int(datetime.now(UTC).timestamp() // PROTECTION_STEP_S))
        epochs = self._node_epochs
        return lambda node: (shared, epochs.get(node, 0))

    def search(self) -> PreemptionSearch | None:
        allocator = self.scheduler.service.allocator
        if allocator is None:
            return None
        return allocator.preemption

    # --- the decision (synchronous) --------------------------------------------------------------

    def post_filter(self, key: str, pod: Pod, decision: Decision, fw: Framework, tg: TaskGroup) -> bool:
        """Called for a GPU worker that fits nowhere. True when a preemption started (the pod stays
        in flight until it binds or the attempt ends); False with a note added to its explanation
        when preemption cannot help (or none, when nothing of lower priority holds GPUs)."""
        req, why = decision.req, decision.why
        if req is None or why is None:
            return False
        note = self.why_not(pod, req, fw)
        if note is None:
            found, refusals, stats = self.choose(pod, req)
            if found is not None:
                self.metrics.attempts.labels("started").inc()
                attempt = Attempt(key, pod, decision, found, self._victim_pods(found), why)
                tg.start_soon(self._run, attempt, fw, tg)
                return True
            note = self.nothing_helps(refusals, stats)
        if note:
            self.metrics.attempts.labels("no_victims").inc()
            why.message = f"{why.message} preemption: {note}"
        return False

    def why_not(self, pod: Pod, req: AllocRequest, fw: Framework) -> str | None:
        """Why this pod may not preempt at all ("" to say nothing), None when it may try."""
        if pod.spec.get("preemptionPolicy") == "Never":
            return "the pod's preemptionPolicy is Never."
        status = fw.pre_filter(req)
        if not status.ok and status.code is Code.UNRESOLVABLE:
            return ""  # no eviction helps: the pool has no GPUs, or a per-pod quota limit is exceeded
        return None

    def choose(self, pod: Pod, req: AllocRequest) -> tuple[Candidate | None, Refusals, SearchStats]:
        """The least damaging node and victims for `pod`, with why other pods could not be taken."""
        refusals, stats = Refusals(), SearchStats()
        search = self.search()
        if search is None:
            return None, refusals, stats
        allowed: dict[str, int] = {}
        eligible = self.eligibility(pod, req, refusals, allowed)
        demand = nc.pod_demand(pod)

        def node_ok(name: str) -> bool:
            raw = self.scheduler.nodes.get(name)
            return raw is not None and self.scheduler.node_failure(demand, Node(raw)) is None

        scope = "" if self.cluster_wide else (pod.namespace or "default")
        found = search.best(req, req.priority, eligible, allowed=allowed, node_ok=node_ok, stats=stats,
                            generation=self.generation(scope))
        # nodes skipped as known unable to help keep the reasons their last examination found
        for node, reasons in refusals.by_node.items():
            self._node_refusals[node] = (reasons, refusals.protected_until.get(node))
        for node in (*stats.no_eligible, *stats.not_enough):
            if node not in refusals.by_node and node in self._node_refusals:
                reasons, until = self._node_refusals[node]
                refusals.by_node[node] = reasons
                if until is not None:
                    refusals.protected_until[node] = until
        return found, refusals, stats

    def eligibility(self, preemptor: Pod, req: AllocRequest, refusals: Refusals,
                    allowed: dict[str, int]) -> Eligible:
        """Who may be a victim of `preemptor` (see the module docstring); fills `refusals` with why
        others may not and `allowed` with the disruptions each budget of an eligible pod allows."""
        allocator = self.scheduler.service.allocator
        assert allocator is not None
        now = datetime.now(UTC)
        budgets = self._budgets()

        def eligible(uid: str) -> VictimFacts | None:
            info = allocator.allocation(uid)
            if info is None:
                return None
            victim_key = f"{info.request.namespace}/{info.request.pod_name}"
            pod = self.scheduler.pod(victim_key)
            if pod is None or pod.uid != uid:
                return None
            refusal = self._refusal(pod, preemptor, now, refusals)
            if refusal:
                refusals.add(info.node, refusal, victim_key)
                return None
            selecting = [b for b in budgets if selects(b, pod)]
            blocked = [b for b in selecting if disruptions_allowed(b) < 1]
            if blocked:
                refusals.add(info.node, f"have a PodDisruptionBudget that allows no disruption "
                                        f"({', '.join(sorted(Body(b).name for b in blocked))})", victim_key)
                return None
            names = tuple(f"{Body(b).namespace}/{Body(b).name}" for b in selecting)
            for budget, name in zip(selecting, names, strict=True):
                allowed[name] = disruptions_allowed(budget)
            return VictimFacts(group=self._gang(pod), budgets=names)

        return eligible

    def _refusal(self, pod: Pod, preemptor: Pod, now: datetime, refusals: Refusals) -> str:
        """Why `pod` may not be a victim of `preemptor` whatever its priority, or ""."""
        if pod.meta.deleting or pod.uid in self._evicting:
            return "are terminating already"
        if not self.cluster_wide and (pod.namespace or "default") != (preemptor.namespace or "default"):
            return "are in another namespace (TF_SCHEDULER_PREEMPT_CLUSTER_WIDE=false)"
        until = protected_until(pod)
        if until is not None and until > now:
            node = pod.node_name
            refusals.protected_until[node] = max(until, refusals.protected_until.get(node, until))
            return "are protected"
        return ""

    def _gang(self, pod: Pod) -> tuple[str, ...]:
        group = pod.meta.annotation(tfa.GANG_GROUP_KEY)
        if not group:
            return ()
        allocator = self.scheduler.service.allocator
        members = [Pod(raw).uid for raw in self.scheduler.pods.by_index(GANG_INDEX, group)]
        return tuple(sorted(uid for uid in members if allocator is not None and allocator.has_allocation(uid)))

    def _budgets(self) -> list[dict[str, Any]]:
        informer = self.budgets
        return [] if informer is None else informer.list()

    def _victim_pods(self, found: Candidate) -> dict[str, Pod]:
        allocator = self.scheduler.service.allocator
        out: dict[str, Pod] = {}
        for uid in found.victims:
            info = allocator.allocation(uid) if allocator is not None else None
            pod = self.scheduler.pod(f"{info.request.namespace}/{info.request.pod_name}") if info else None
            if pod is not None and pod.uid == uid:
                out[uid] = pod
        return out

    def nothing_helps(self, refusals: Refusals, stats: SearchStats) -> str:
        """The note for a pod no preemption can help ("" when nothing of lower priority holds GPUs
        where it could fit)."""
        if not stats.lower:
            return ""  # nothing of lower priority holds GPUs where the pod could go: nothing to say
        if not stats.bounded:
            return (f"evicting every lower-priority pod would not make room on any of the {stats.lower} node(s) "
                    "holding some.")
        parts: list[str] = []
        for node in sorted(refusals.by_node)[:NOTE_NODES]:
            for why, pods in sorted(refusals.by_node[node].items()):
                until = refusals.protected_until.get(node) if why == "are protected" else None
                tail = f" until {rfc3339(until)}" if until is not None else ""
                parts.append(f"{len(pods)} pod(s) on {node} {why}{tail}")
        if stats.not_enough:
            parts.append(f"evicting every eligible lower-priority pod would not make room on "
                         f"{', '.join(sorted(stats.not_enough)[:NOTE_NODES])}")
        if not parts and stats.node_refused:
            return (f"the {stats.node_refused} node(s) where evictions would make GPU room fail the pod's node "
                    "checks.")
        if not parts:
            return "no lower-priority pod may be evicted where the pod would fit."
        return "; ".join(parts) + "."

    # --- the attempt (asynchronous) --------------------------------------------------------------

    async def _run(self, attempt: Attempt, fw: Framework, tg: TaskGroup) -> None:
        self._evicting.update(attempt.candidate.victims)
        self._epoch += 1  # no other preemptor takes these victims from a kept examination
        try:
            await self._attempt(attempt, fw, tg)
        finally:
            self._evicting.difference_update(attempt.candidate.victims)

    async def _attempt(self, attempt: Attempt, fw: Framework, tg: TaskGroup) -> None:
        sched, queue = self.scheduler, self.scheduler.queue
        try:
            ok = await self._evict_all(attempt, tg)
            reserved = ok and await self._release_and_reserve(attempt, fw, tg)
        except Exception:
            log.exception("preemption for pod %s failed", attempt.key)
            reserved = False
        if not reserved:
            self.metrics.attempts.labels("failed").inc()
            if queue is not None:
                queue.error(attempt.key)
            return
        gone = await self._victims_gone(attempt)
        current = sched.pod(attempt.key)
        decision = attempt.decision
        if current is None or current.uid != attempt.pod.uid or not nc.is_pending(current):
            self.metrics.attempts.labels("lost").inc()
            sched._unassume(attempt.pod, decision, fw)
            if queue is not None:
                queue.delete(attempt.key)
            return
        if not gone:
            self._give_up(attempt, fw, tg)
            return
        self.metrics.attempts.labels("bound").inc()
        # Permit as after any Reserve: a gang member waits for the rest of its gang (gang_runtime.py)
        for member in sched.gangs.permit(attempt.key, current, decision, tg):
            sched.bind_later(member, fw)

    async def _evict_all(self, attempt: Attempt, tg: TaskGroup) -> bool:
        """Evict every victim; False (nothing more evicted) at the first one that cannot be."""
        preemptor = pod_key(attempt.pod)
        node = attempt.candidate.node
        for uid in attempt.candidate.victims:
            victim = attempt.victims.get(uid)
            if victim is None:
                continue  # gone already
            try:
                await self._evict(victim)
            except NotFound:
                continue
            except KubeError as exc:
                refused = exc.code == 429
                self.metrics.attempts.labels("refused" if refused else "failed").inc()
                log.info("preemption for pod %s: cannot evict pod %s: %s", preemptor, pod_key(victim), exc)
                message = (f"preemption: pod {pod_key(victim)} on node {node} could not be evicted "
                           f"({'a PodDisruptionBudget forbids it' if refused else exc}); trying again later.")
                self._explain(attempt, message, tg)
                return False
            self.metrics.victims.inc()
            where = "" if victim.node_name == node else f" (a member of its gang on node {victim.node_name})"
            self.runtime.events.normal(as_pod(victim), "Preempted",
                                       f"Preempted by pod {preemptor} on node {node}{where}")
        return True

    async def _evict(self, victim: Pod) -> None:
        await evict(self.scheduler.client, victim)

    async def _release_and_reserve(self, attempt: Attempt, fw: Framework, tg: TaskGroup) -> bool:
        """Release the evicted victims' allocations, then reserve the preemptor on the node at once."""
        service, sched = self.scheduler.service, self.scheduler
        for uid in attempt.candidate.victims:
            await service.release(uid, "preempted")
        if fw.allocator is not service.allocator:
            return False  # leadership ended meanwhile
        decision = attempt.decision
        assert decision.req is not None
        node = attempt.candidate.node
        placement, status = fw.reserve(decision.req, node)
        if placement is None:
            self._explain(attempt, f"preemption: the room freed on node {node} was taken before the pod could "
                                   f"have it ({status.details()}); trying again.", tg)
            return False
        decision = replace(decision, node=node, placement=placement, why=None)
        attempt.decision = decision
        sched.assume(attempt.pod, decision)
        service.flush()
        victims = ", ".join(f"{pod_key(p)} (priority {p.spec.get('priority', 0)})"
                            for p in attempt.victims.values())
        self.runtime.events.normal(as_pod(attempt.pod), "Preempting",
                                   f"preempted {len(attempt.victims)} pod(s) for it on node {node}: {victims}")
        self._explain(attempt, f"preemption: preempted {victims} on node {node}; the pod is nominated there and "
                               "binds when they are gone.", tg)
        tg.start_soon(self._nominate, attempt.pod, node)
        return True

    async def _nominate(self, pod: Pod, node: str) -> None:
        try:
            await self.scheduler.client.patch(r.PODS, pod.name, {"status": {"nominatedNodeName": node}},
                                              namespace=pod.namespace or "default", subresource="status")
        except KubeError as exc:
            log.info("cannot set status.nominatedNodeName of pod %s: %s", pod_key(pod), exc)

    def _local_victims(self, attempt: Attempt) -> list[Pod]:
        local = set(attempt.candidate.local)
        return [p for uid, p in attempt.victims.items() if uid in local]

    async def _victims_gone(self, attempt: Attempt) -> bool:
        """Wait (bounded by the victims' grace periods) until the victims on the node left the informer."""
        clock = self.runtime.manager.clock
        local = self._local_victims(attempt)
        grace = max((_grace(p) for p in local), default=0.0)
        deadline = clock.now() + grace + VICTIM_WAIT_MARGIN_S
        while True:
            if not self._still_there(local):
                return True
            if clock.now() >= deadline:
                return False
            await clock.sleep(VICTIM_POLL_S)

    def _still_there(self, pods: list[Pod]) -> list[Pod]:
        out = []
        for pod in pods:
            current = self.scheduler.pod(pod_key(pod))
            if current is not None and current.uid == pod.uid and not current.finished:
                out.append(current)
        return out

    def _give_up(self, attempt: Attempt, fw: Framework, tg: TaskGroup) -> None:
        """Victims did not go in time: drop the reservation and try the pod again later."""
        self.metrics.attempts.labels("timed_out").inc()
        staying = self._still_there(self._local_victims(attempt))
        self.scheduler._unassume(attempt.pod, attempt.decision, fw)
        names = ", ".join(pod_key(p) for p in staying)
        self._explain(attempt, f"preemption: pod(s) {names} did not leave node {attempt.candidate.node} in time; "
                               "trying again later.", tg)
        if self.scheduler.queue is not None:
            self.scheduler.queue.error(attempt.key)

    def _explain(self, attempt: Attempt, note: str, tg: TaskGroup | None = None) -> None:
        """The preemptor's explanation: its unschedulable one with the preemption's note."""
        why = replace(attempt.base, message=f"{attempt.base.message} {note}", updated=rfc3339())
        self.scheduler.reports.report(attempt.pod, why, tg)


def _eligibility_facts(pod: Pod) -> tuple[Any, ...]:
    """What of a pod the eligibility of it (or of its node's pods) reads."""
    meta = pod.meta
    return (pod.uid, pod.node_name, meta.deleting, pod.finished, meta.labels, meta.annotations,
            pod.spec.get("priority"))


def _grace(pod: Pod) -> float:
    value = pod.spec.get("terminationGracePeriodSeconds")
    return float(value) if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else DEFAULT_GRACE_S
