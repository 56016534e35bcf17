"""The leader's compaction and defrag loop: gives idle nodes back and, on a schedule, moves small
workers off lightly used nodes so that they become idle.

Compaction runs for each pool every `nodeCompaction.period` (1m when the pool has no
`nodeCompaction`, as the original does; the CRD's default period is 5m) and at once when the pool's
`tensor-fusion.ai/manual-compaction` annotation (an RFC 3339 time) is newer than the last pass. A
pool whose GPUNodeClaims are not all Bound (one being created or deleted) waits: its capacity is
about to change. The decision is `compaction_plan.compaction` on the pool's GPUNodes (a node is
empty when the allocator holds nothing on its GPUs and no worker pod is bound to it;
`tensor-fusion.ai/do-not-disrupt: "true"` as a label or annotation of the Node or GPUNode keeps
it). For each node it gives back:

- a node the pool selected (no claim): the Node is labelled `tensor-fusion.ai/should-delete=true`
  for whoever manages the machines to act on; from then on it is not counted as the pool's;
- a provisioned node: its GPUNodeClaim is deleted, whose finalizer terminates the instance.

Each gets a Normal `Compaction` event on the pool; an empty node the targets keep gets a
`CompactionKept` event when that (or why) changes. Every pass writes `status.lastCompactionTime`
and `status.potentialSavingsPerMonth` (dollars a month the empty nodes that stay would cost).
Unusable settings get a Warning `CompactionConfigInvalid` on the pool, once per value.

Defrag (`nodeCompaction.defrag.enabled`) runs at the cron `schedule` read in `timezone`, when not
more than `maxDuration` late (a missed run is not made up). `compaction_plan.defrag_moves` says
which nodes to empty; a node is emptied whole or not at all, so one whose workers the
PodDisruptionBudgets would not all let go is left. Each worker is annotated
`tensor-fusion.ai/defrag-evicted=<time>` and evicted through the Eviction API (budgets are
checked again by the API server; a refusal ends that node's move with a Warning
`DefragEvictionRefused`), with a Normal `DefragEvicted` event on the pod and one `Defrag` event on
the pool per node; `status.lastDefragTime` is written. The emptied node is compaction's at a
later pass.

Facts come from the informers and the allocator's ledger, read only. Times are the injected wall
clock's, so tests drive the loop without waiting (`poke()` wakes it after moving the clock).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import tzinfo
from typing import TYPE_CHECKING

import anyio

from tfusion.allocator import GpuAllocator
from tfusion.api import annotations as tfa
from tfusion.api import cron
from tfusion.api.accessors import Body, GpuPool, Pod
from tfusion.api.annotations import AnnotationError
from tfusion.api.durations import DurationError, parse_duration
from tfusion.api.kinds.pool import GPUPool
from tfusion.api.timestamps import parse_rfc3339, rfc3339
from tfusion.api.types import ManifestError, decode_as
from tfusion.controller.eviction import disruptions_allowed, evict, protected_until, selects
from tfusion.controller.provisioning.compaction_plan import (
    DefragMove,
    GpuRoom,
    Kept,
    NodeFacts,
    Removal,
    WorkerFacts,
    compaction,
    defrag_moves,
    potential_savings_per_month,
    utilization_percent,
)
from tfusion.controller.provisioning.plan import ZERO, Capacity, PoolCapacity, Targets, capacity_text, targets_of
from tfusion.controller.reconcilers.common import write_status
from tfusion.kube import resources as r
from tfusion.kube.client import KubeError, NotFound
from tfusion.metrics.cost import hourly_prices, node_hourly_price
from tfusion.settings import Settings

if TYPE_CHECKING:
    from tfusion.controller.allocation import AllocatorService
    from tfusion.controller.role import ControllerRole
    from tfusion.controller.runtime import ControllerRuntime
    from tfusion.kube.informer import Informer

log = logging.getLogger(__name__)

#: the period of a pool without `nodeCompaction` (the original's code default)
DEFAULT_PERIOD_S = 60.0
#: the loop looks again at least this often (a wall clock that jumps, a protection that ends)
MAX_SLEEP_S = 30.0
#: and never more often than this, whatever woke it
MIN_SLEEP_S = 0.05
BOUND = "Bound"
RUNNING = "Running"


class ConfigError(ValueError):
    """A pool's compaction or defrag settings that cannot be used; the message names the field."""


@dataclass(frozen=True)
class DefragSettings:
    schedule: cron.Schedule
    zone: tzinfo
    max_duration_s: float
    threshold_percent: int
    text: tuple[str, str]  # (schedule, timezone) as written: a change restarts the timetable


@dataclass(frozen=True)
class PoolSettings:
    period_s: float
    targets: Targets
    defrag: DefragSettings | None


@dataclass
class PoolState:
    """What the loop remembers of a pool between passes (rebuilt from the status on a new leader)."""

    last_pass: float = 0.0
    #: the manual-compaction value already served
    manual_served: str = ""
    next_defrag: float | None = None
    defrag_text: tuple[str, str] = ("", "")
    #: the configuration error last reported (each reported once)
    warned: str = ""
    #: the claims not Bound the last look found (logged when they change)
    waiting: list[str] = field(default_factory=list)
    #: empty nodes kept for the pool's targets, with why (an event when that changes)
    kept: dict[str, str] = field(default_factory=dict)


class Compaction:
    """See the module docstring; `run_leader` is registered leader-only."""

    def __init__(self, runtime: ControllerRuntime, allocation: AllocatorService, *,
                 wall: Callable[[], float] = time.time, min_age_s: float = 300.0) -> None:
        self.runtime = runtime
        self.allocation = allocation
        self.wall = wall
        self.min_age_s = min_age_s
        self.pools = runtime.informer(r.GPUPOOLS)
        self.gpunodes = runtime.informer(r.GPUNODES)
        self.nodes = runtime.informer(r.NODES)
        self.claims = runtime.informer(r.GPUNODECLAIMS)
        self.providers = runtime.informer(r.PROVIDERCONFIGS)
        self.pods = runtime.informer(r.PODS)
        self._by_pool = self.gpunodes.add_label_index(tfa.MANAGED_BY)
        self._claims_by_pool = self.claims.add_label_index(tfa.MANAGED_BY)
        self.budgets: Informer | None = None
        self.state: dict[str, PoolState] = {}
        self._parsed: dict[str, tuple[str, PoolSettings | ConfigError]] = {}
        self.passes = 0
        self._wake: anyio.Event | None = None
        for informer in (self.pools, self.claims):
            informer.add_handler(on_add=self._changed, on_update=self._changed, on_delete=self._changed)

    def attach(self) -> Compaction:
        self.budgets = self.runtime.manager.cache.informer(r.PODDISRUPTIONBUDGETS)
        self.runtime.add_leader_task(self.run_leader)
        return self

    def _changed(self, *_: object) -> None:
        self.poke()

    def poke(self) -> None:
        """Look at the pools now (a pool or claim changed, or a test moved the wall clock)."""
        if self._wake is not None:
            self._wake.set()

    # --- the loop ------------------------------------------------------------------------------

    async def run_leader(self) -> None:
        self.state.clear()
        if await self.allocation.wait_ready() is None:
            return  # not the leader (any more)
        while True:
            self._wake = anyio.Event()
            next_at = await self.pass_once()
            delay = min(MAX_SLEEP_S, max(MIN_SLEEP_S, next_at - self.wall()))
            with anyio.move_on_after(delay):
                await self._wake.wait()

    async def pass_once(self) -> float:
        """Compact (and defrag) every pool that is due; the wall time the next one is due."""
        now = self.wall()
        wake = now + MAX_SLEEP_S
        for raw in self.pools.list():
            pool = GpuPool(raw)
            if pool.meta.deleting:
                continue
            try:
                due = await self._pool(pool, now)
            except KubeError as exc:
                log.warning("compaction of pool %s: %s", pool.name, exc)
                due = now + DEFAULT_PERIOD_S
            wake = min(wake, due)
        for name in set(self.state) - {GpuPool(p).name for p in self.pools.list()}:
            del self.state[name]
            self._parsed.pop(name, None)
        self.passes += 1
        return wake

    async def _pool(self, pool: GpuPool, now: float) -> float:
        state = self.state.get(pool.name)
        if state is None:
            state = self.state[pool.name] = PoolState(last_pass=_status_time(pool, "lastCompactionTime"))
        try:
            settings = self._settings(pool)
        except ConfigError as exc:
            self._warn(pool, state, str(exc))
            return now + DEFAULT_PERIOD_S
        state.warned = ""
        if not pool.status.get("phase"):
            return now + settings.period_s  # the pool reconciler has not written its status yet (that pokes us)
        wake = await self._maybe_defrag(pool, state, settings, now)
        manual = self._manual(pool, state)
        due = state.last_pass + settings.period_s
        if not manual and now < due:
            return min(wake, due)
        waiting = self._unbound_claims(pool.name)
        if waiting != state.waiting and waiting:
            log.info("compaction of pool %s waits: claim(s) %s not Bound yet", pool.name, ", ".join(waiting))
        state.waiting = waiting
        if waiting:
            return min(wake, now + settings.period_s)  # or as soon as a claim changes
        await self.compact(pool, settings.targets, now, state)
        state.last_pass = now
        if manual:
            state.manual_served = pool.meta.annotation(tfa.MANUAL_COMPACTION) or ""
        return min(wake, now + settings.period_s)

    def _settings(self, pool: GpuPool) -> PoolSettings:
        """`pool_settings`, read again only when the pool changed."""
        version = pool.meta.resource_version
        cached = self._parsed.get(pool.name)
        if cached is None or cached[0] != version:
            try:
                found: PoolSettings | ConfigError = pool_settings(pool)
            except ConfigError as exc:
                found = exc
            cached = self._parsed[pool.name] = (version, found)
        if isinstance(cached[1], ConfigError):
            raise cached[1]
        return cached[1]

    def _manual(self, pool: GpuPool, state: PoolState) -> bool:
        """Whether the pool's manual-compaction asks for a pass now: a value not served yet and newer
        than the last pass."""
        value = pool.meta.annotation(tfa.MANUAL_COMPACTION)
        if not value or value == state.manual_served:
            return False
        try:
            asked = tfa.parse_timestamp(value, key=tfa.MANUAL_COMPACTION).timestamp()
        except AnnotationError as exc:
            self.runtime.events.warning(pool, "CompactionConfigInvalid", str(exc))
            state.manual_served = value  # reported once
            return False
        return asked > state.last_pass

    def _unbound_claims(self, pool: str) -> list[str]:
        return sorted(claim.name for claim in map(Body, self.claims.by_index(self._claims_by_pool, pool))
                      if claim.meta.deleting or claim.status.get("phase") != BOUND)

    def _warn(self, pool: GpuPool, state: PoolState, message: str) -> None:
        if state.warned != message:
            state.warned = message
            log.warning("pool %s: %s", pool.name, message)
            self.runtime.events.warning(pool, "CompactionConfigInvalid", message)

    # --- compaction ------------------------------------------------------------------------------

    async def compact(self, pool: GpuPool, targets: Targets, now: float,
                      state: PoolState | None = None) -> list[Removal]:
        """One compaction pass over `pool`: give back what `compaction()` says, write the status."""
        allocator = self.allocation.allocator
        if allocator is None:
            return []
        facts = self.node_facts(pool.name, allocator, now)
        removals, kept = compaction(facts, pool_capacity(facts), targets, now=now, min_age_s=self.min_age_s)
        by_name = {f.name: f for f in facts}
        gone: set[str] = set()
        for removal in removals:
            if await self._give_back(pool, removal, by_name[removal.node]):
                gone.add(removal.node)
        self._announce_kept(pool, [k for k in kept if k.for_targets], state)
        savings = potential_savings_per_month(f for f in facts if f.name not in gone)
        await write_status(self.runtime.client, r.GPUPOOLS, pool, {
            "lastCompactionTime": rfc3339(now), "potentialSavingsPerMonth": f"{savings:.2f}"})
        return removals

    def _announce_kept(self, pool: GpuPool, kept: list[Kept], state: PoolState | None) -> None:
        """An event for each empty node the targets keep, when that (or why) is new."""
        now_kept = {k.node: k.reason for k in kept}
        known = state.kept if state is not None else {}
        for node, reason in sorted(now_kept.items()):
            if known.get(node) != reason:
                self.runtime.events.normal(pool, "CompactionKept", f"kept empty node {node}: {reason}")
        if state is not None:
            state.kept = now_kept

    async def _give_back(self, pool: GpuPool, removal: Removal, node: NodeFacts) -> bool:
        price = f"${node.price_per_hour:.2f}/h" if node.price_per_hour else "no price known"
        try:
            if removal.claim:
                await self.runtime.client.delete(r.GPUNODECLAIMS, removal.claim)
                what = f"removed empty node {removal.node} (claim {removal.claim}, {price})"
            else:
                await self.runtime.client.patch(r.NODES, removal.node,
                                                {"metadata": {"labels": {tfa.SHOULD_DELETE: "true"}}})
                what = f"marked empty node {removal.node} {tfa.SHOULD_DELETE}=true ({price})"
        except NotFound:
            return True  # gone already
        except KubeError as exc:
            log.warning("compaction of pool %s: cannot give node %s back: %s", pool.name, removal.node, exc)
            return False
        log.info("compaction of pool %s: %s: %s", pool.name, what, removal.reason)
        self.runtime.events.normal(pool, "Compaction", f"{what}: {removal.reason}")
        return True

    def node_facts(self, pool: str, allocator: GpuAllocator, now: float) -> list[NodeFacts]:
        """The pool's nodes that compaction and defrag may consider: its GPUNodes not being deleted
        whose Node is not marked should-delete already."""
        gpus = _gpus_by_node(allocator, pool)
        prices = hourly_prices(map(Body, self.providers.list()))  # once per pass, not per node
        facts = []
        for gpunode in sorted(map(Body, self.gpunodes.by_index(self._by_pool, pool)), key=lambda b: b.name):
            raw_node = self.nodes.get(gpunode.name)
            node = Body(raw_node) if raw_node is not None else None
            if gpunode.meta.deleting or (node is not None and node.meta.label(tfa.SHOULD_DELETE) == "true"):
                continue
            mine = gpus.get(gpunode.name, [])
            capacity = Capacity(sum(allocator.gpu_info(g).capacity_tflops for g in mine),
                                sum(allocator.gpu_info(g).capacity_vram for g in mine))
            free = [allocator.available(g) for g in mine]
            claim = gpunode.meta.label(tfa.NODE_PROVISIONER) or (node.meta.label(tfa.NODE_PROVISIONER) if node else "")
            facts.append(NodeFacts(
                name=gpunode.name, pool=pool, claim=claim or "",
                created_at=_created(node or gpunode, now), running=gpunode.status.get("phase") == RUNNING,
                empty=self._empty(allocator, gpunode.name, mine), do_not_disrupt=_do_not_disrupt(gpunode, node),
                capacity=capacity, available=Capacity(sum(t for t, _ in free), sum(v for _, v in free)),
                price_per_hour=node_hourly_price(gpunode, [allocator.gpu_info(g).model for g in mine], prices)))
        return facts

    def _empty(self, allocator: GpuAllocator, node: str, gpus: list[str]) -> bool:
        """No allocation (committed or being made) on its GPUs and no GPU worker bound to it."""
        if any(allocator.gpu_allocations(g, committed_only=False) for g in gpus):
            return False
        return not any(Pod(p).is_worker and not Pod(p).finished for p in self.pods.by_index("node", node))

    # --- defrag ----------------------------------------------------------------------------------

    async def _maybe_defrag(self, pool: GpuPool, state: PoolState, settings: PoolSettings, now: float) -> float:
        """Run the pool's defrag when its time has come; the wall time to look again."""
        defrag = settings.defrag
        if defrag is None:
            state.next_defrag = None
            return float("inf")
        if state.next_defrag is None or state.defrag_text != defrag.text:
            state.defrag_text = defrag.text
            since = _status_time(pool, "lastDefragTime") or now
            state.next_defrag = defrag.schedule.next_after(since, defrag.zone)
        if now < state.next_defrag:
            return state.next_defrag
        if now <= state.next_defrag + defrag.max_duration_s:
            await self.defrag(pool, defrag.threshold_percent, now)
        else:
            log.info("pool %s: defrag scheduled at %s skipped: more than maxDuration late", pool.name,
                     rfc3339(state.next_defrag))
        state.next_defrag = defrag.schedule.next_after(now, defrag.zone)
        return state.next_defrag

    async def defrag(self, pool: GpuPool, threshold_percent: int, now: float) -> list[DefragMove]:
        """One defrag of `pool`: plan the moves, evict their workers, write lastDefragTime."""
        allocator = self.allocation.allocator
        if allocator is None:
            return []
        facts = self.node_facts(pool.name, allocator, now)
        names = {f.name for f in facts}
        rooms = [GpuRoom(info.node, info.name, *allocator.available(info.name), info.model)
                 for info in map(allocator.gpu_info, allocator.gpu_names())
                 if info.pool == pool.name and info.node in names]
        workers, pods = self.worker_facts(allocator, names, now)
        moves = defrag_moves(facts, rooms, workers, utilization_threshold_percent=threshold_percent)
        by_name = {f.name: f for f in facts}
        spent: dict[str, int] = {}
        for move in moves:
            if self._budgets_allow(move, pods, spent):
                await self._move(pool, move, by_name[move.node], pods)
        await write_status(self.runtime.client, r.GPUPOOLS, pool, {"lastDefragTime": rfc3339(now)})
        return moves

    def worker_facts(self, allocator: GpuAllocator, nodes: set[str], now: float
                     ) -> tuple[list[WorkerFacts], dict[str, Pod]]:
        """The GPU workers on `nodes`, and their pods by key."""
        budgets = [] if self.budgets is None else self.budgets.list()
        workers, pods = [], {}
        for info in allocator.allocations().values():
            if info.node not in nodes:
                continue
            req = info.request
            key = f"{req.namespace}/{req.pod_name}"
            raw = self.pods.get(key)
            pod = Pod(raw) if raw is not None else None
            if pod is not None:
                pods[key] = pod
            protected = (pod is None or info.assumed or pod.meta.deleting or _protected(pod, now)
                         or any(selects(b, pod) and disruptions_allowed(b) < 1 for b in budgets))
            workers.append(WorkerFacts(
                key=key, node=info.node, qos=req.qos, protected=protected, gpu_count=len(info.gpu_names),
                tflops_per_gpu=max((t for t, _ in info.charges), default=0),
                vram_per_gpu=max((v for _, v in info.charges), default=0), model=req.gpu_model))
        return workers, pods

    def _budgets_allow(self, move: DefragMove, pods: Mapping[str, Pod], spent: dict[str, int]) -> bool:
        """Whether the budgets selecting the move's workers allow evicting all of them, after the
        disruptions the earlier moves of this defrag spent (counted into `spent` when they do): a
        node is emptied whole or not touched."""
        wanted: dict[str, int] = {}
        allowed: dict[str, int] = {}
        for budget in [] if self.budgets is None else self.budgets.list():
            name = f"{Body(budget).namespace}/{Body(budget).name}"
            for key in move.workers:
                if selects(budget, pods[key]):
                    wanted[name] = wanted.get(name, 0) + 1
                    allowed[name] = disruptions_allowed(budget)
        short = sorted(n for n, count in wanted.items() if spent.get(n, 0) + count > allowed[n])
        if short:
            log.info("defrag leaves node %s: PodDisruptionBudget(s) %s allow fewer evictions than its %d worker(s)",
                     move.node, ", ".join(short), len(move.workers))
            return False
        for name, count in wanted.items():
            spent[name] = spent.get(name, 0) + count
        return True

    async def _move(self, pool: GpuPool, move: DefragMove, node: NodeFacts, pods: Mapping[str, Pod]) -> None:
        used = f"{utilization_percent(node):.0f}%"
        where = ", ".join(move.destinations)
        self.runtime.events.normal(pool, "Defrag", f"moving {len(move.workers)} low-QoS worker(s) off node "
                                                   f"{move.node} ({used} used, {capacity_text(node.available)} "
                                                   f"free); they fit on {where}: {', '.join(move.workers)}")
        for key in move.workers:
            pod = pods[key]
            # marked first, so that the pod carries the mark for as long as it terminates
            if not await self._mark(pod, rfc3339(self.wall())):
                continue  # gone already
            try:
                await evict(self.runtime.client, pod)
            except NotFound:
                continue
            except KubeError as exc:
                await self._mark(pod, None)
                refused = "a PodDisruptionBudget forbids it" if exc.code == 429 else str(exc)
                log.info("defrag of pool %s: cannot evict pod %s: %s", pool.name, key, refused)
                self.runtime.events.warning(pool, "DefragEvictionRefused",
                                            f"defrag stopped emptying node {move.node}: pod {key} could not be "
                                            f"evicted ({refused})")
                return
            self.runtime.events.normal(pod, "DefragEvicted",
                                       f"evicted by the defrag of pool {pool.name}: node {move.node} is {used} "
                                       f"used and its workers fit on {where}")

    async def _mark(self, pod: Pod, value: str | None) -> bool:
        """Set (or, with None, remove) the pod's defrag-evicted mark; False when the pod is gone."""
        try:
            await self.runtime.client.patch(r.PODS, pod.name, {"metadata": {"annotations": {
                tfa.DEFRAG_EVICTED: value}}}, namespace=pod.namespace or "default")
        except NotFound:
            return False
        return True


def pool_settings(pool: GpuPool) -> PoolSettings:
    """The pool's compaction period, capacity targets and defrag settings; ConfigError names the
    field and value that cannot be used."""
    try:
        model = decode_as(GPUPool, pool.raw)
    except ManifestError as exc:
        raise ConfigError(f"the pool's spec cannot be read: {exc}") from None
    spec = model.spec
    manager = spec.node_manager_config if spec is not None else None
    config = manager.node_compaction if manager is not None else None
    targets = targets_of(spec.capacity_config if spec is not None else None)
    if config is None:
        return PoolSettings(DEFAULT_PERIOD_S, targets, None)
    where = "spec.nodeManagerConfig.nodeCompaction"
    period = _duration(config.period, f"{where}.period")
    if period <= 0:
        raise ConfigError(f"{where}.period: {config.period!r} is not allowed; expected a positive duration")
    defrag = config.defrag
    if defrag is None or not defrag.enabled:
        return PoolSettings(period, targets, None)
    try:
        schedule = cron.parse(defrag.schedule)
    except cron.CronError as exc:
        raise ConfigError(f"{where}.defrag.schedule: {defrag.schedule!r} is not allowed: {exc}") from None
    try:
        zone = cron.zone(defrag.timezone)
    except cron.ZoneError as exc:
        raise ConfigError(f"{where}.defrag.timezone: {defrag.timezone!r} is not allowed: {exc}") from None
    return PoolSettings(period, targets, DefragSettings(
        schedule, zone, _duration(defrag.max_duration, f"{where}.defrag.maxDuration"),
        defrag.utilization_threshold_percent, (defrag.schedule, defrag.timezone)))


def pool_capacity(facts: list[NodeFacts]) -> PoolCapacity:
    """The pool as its Running nodes make it (compaction runs only when no claim is in flight)."""
    total, available = ZERO, ZERO
    for node in facts:
        if node.running:
            total, available = total + node.capacity, available + node.available
    return PoolCapacity(total=total, available=available, in_flight=ZERO)


def _duration(text: str, where: str) -> float:
    try:
        return parse_duration(text)
    except DurationError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _gpus_by_node(allocator: GpuAllocator, pool: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for name in allocator.gpu_names():
        info = allocator.gpu_info(name)
        if info.pool == pool:
            found.setdefault(info.node, []).append(name)
    return found


def _status_time(pool: GpuPool, key: str) -> float:
    value = pool.status.get(key)
    try:
        return parse_rfc3339(value).timestamp() if isinstance(value, str) and value else 0.0
    except ValueError:
        return 0.0


def _created(obj: Body, default: float) -> float:
    try:
        return parse_rfc3339(obj.meta.creation_timestamp).timestamp()
    except ValueError:
        return default


def _do_not_disrupt(gpunode: Body, node: Body | None) -> bool:
    """`tensor-fusion.ai/do-not-disrupt: "true"` as a label or annotation of the Node or its GPUNode."""
    return any(notes.get(tfa.DO_NOT_DISRUPT) == "true"
               for obj in (gpunode, node) if obj is not None
               for notes in (obj.meta.labels, obj.meta.annotations))


def _protected(pod: Pod, now: float) -> bool:
    until = protected_until(pod)
    return until is not None and until.timestamp() > now


def register_compaction(runtime: ControllerRole, settings: Settings) -> Compaction:
    """Build the compaction and defrag loop on the controller (after its allocator service) and
    register it leader-only."""
    if runtime.allocation is None:
        raise RuntimeError("register_compaction needs the allocator service: call it after configure() built it")
    return Compaction(runtime, runtime.allocation, min_age_s=settings.compaction_min_node_age).attach()

