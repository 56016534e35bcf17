"""The arithmetic of nodes on demand, kept apart from the API so that it can be tested exhaustively:
how far a pool is from its minimum and warm targets (`gap`), how much its maximum still allows
(`room`), the cheapest instances that close a gap (`cheapest_claims`), and where the node expander
puts pods that fit nowhere (`choose_expansions`).

No I/O and no clock: callers pass the pool's figures, the catalog's types and `now`. Amounts are the
allocator's: TFLOPS in milli-TFLOPS, VRAM in bytes (ints); prices are dollars per hour.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from typing import Final

from tfusion.allocator.units import vram_str
from tfusion.api.kinds.pool import CapacityConfig, GPUOrCPUResourceUnit
from tfusion.api.quantity import INT64_MAX, Quantity
from tfusion.controller.provisioning.catalog import CAPACITY_TYPES, ON_DEMAND, InstanceType

#: a maximum that names no amount for a dimension: nothing limits it
UNBOUNDED: Final = INT64_MAX
#: prices are compared in micro-dollars so that sums are exact and ties really tie
_MICRO: Final = 1_000_000


@dataclass(frozen=True)
class Capacity:
    tflops: int  # milli-TFLOPS
    vram: int  # bytes

    @classmethod
    def of(cls, tflops: Quantity | None, vram: Quantity | None) -> Capacity:
        """From quantities as a spec holds them; a missing one is 0."""
        return cls(tflops.milli_value() if tflops is not None else 0, vram.value() if vram is not None else 0)

    def __add__(self, other: Capacity) -> Capacity:
        return Capacity(self.tflops + other.tflops, self.vram + other.vram)

    def __sub__(self, other: Capacity) -> Capacity:
        return Capacity(self.tflops - other.tflops, self.vram - other.vram)

    def covers(self, other: Capacity) -> bool:
        return self.tflops >= other.tflops and self.vram >= other.vram

    def positive(self) -> Capacity:
        return Capacity(max(self.tflops, 0), max(self.vram, 0))

    @property
    def is_zero(self) -> bool:
        return self.tflops == 0 and self.vram == 0

    def __str__(self) -> str:
        return capacity_text(self)


ZERO: Final = Capacity(0, 0)


def tflops_text(milli: int) -> str:
    """"312 TFLOPS", "20.5 TFLOPS", "unbounded TFLOPS": for messages people read."""
    if milli >= UNBOUNDED:
        return "unbounded TFLOPS"
    number = Decimal(milli) / 1000
    return f"{number.normalize():f} TFLOPS" if number else "0 TFLOPS"


def bytes_text(size: int) -> str:
    return "unbounded VRAM" if size >= UNBOUNDED else vram_str(size)


def capacity_text(capacity: Capacity) -> str:
    """"100 TFLOPS / 64Gi"."""
    return f"{tflops_text(capacity.tflops)} / {bytes_text(capacity.vram)}"


@dataclass(frozen=True)
class Targets:
    minimum: Capacity | None
    warm: Capacity | None
    maximum: Capacity | None  # a dimension the spec leaves out is UNBOUNDED; None: no maximum at all


def targets_of(config: CapacityConfig | None) -> Targets:
    """A GPUPool's `spec.capacityConfig` as targets. A missing amount is 0 in the minimum and the warm
    target (nothing to keep) and unbounded in the maximum (nothing to stop at)."""
    if config is None:
        return Targets(None, None, None)
    return Targets(_lower(config.min_resources), _lower(config.warm_resources), _upper(config.max_resources))


def _lower(unit: GPUOrCPUResourceUnit | None) -> Capacity | None:
    return None if unit is None else Capacity.of(unit.tflops, unit.vram)


def _upper(unit: GPUOrCPUResourceUnit | None) -> Capacity | None:
    if unit is None or (unit.tflops is None and unit.vram is None):
        return None
    return Capacity(unit.tflops.milli_value() if unit.tflops is not None else UNBOUNDED,
                    unit.vram.value() if unit.vram is not None else UNBOUNDED)


@dataclass(frozen=True)
class PoolCapacity:
    total: Capacity  # what the pool's Running nodes offer
    available: Capacity  # what of it no worker holds
    in_flight: Capacity  # offered by claims not yet Bound: counted as if their nodes were there


def gap(pool: PoolCapacity, targets: Targets) -> Capacity:
    """What the pool lacks, per dimension: the larger of what the minimum wants beyond the total and
    what the warm target wants beyond the idle capacity, both counting claims in flight; never
    negative."""
    wants = [ZERO]
    if targets.minimum is not None:
        wants.append(targets.minimum - (pool.total + pool.in_flight))
    if targets.warm is not None:
        wants.append(targets.warm - (pool.available + pool.in_flight))
    return Capacity(max(w.tflops for w in wants), max(w.vram for w in wants))


def room(pool: PoolCapacity, targets: Targets) -> Capacity | None:
    """How much more the maximum allows (never negative; an unbounded dimension stays UNBOUNDED);
    None when the pool has no maximum."""
    top = targets.maximum
    if top is None:
        return None
    have = pool.total + pool.in_flight
    return Capacity(UNBOUNDED if top.tflops >= UNBOUNDED else max(top.tflops - have.tflops, 0),
                    UNBOUNDED if top.vram >= UNBOUNDED else max(top.vram - have.vram, 0))


# ---------------------------------------------------------------------------------------------------
# The cheapest claims that close a gap


@dataclass(frozen=True)
class PlannedClaim:
    instance_type: InstanceType
    capacity_type: str
    price: float  # dollars per hour of this instance

    @property
    def capacity(self) -> Capacity:
        return Capacity(self.instance_type.tflops, self.instance_type.vram)


@dataclass(frozen=True)
class ClaimPlan:
    claims: tuple[PlannedClaim, ...]
    shortfall: Capacity  # what the claims leave uncovered; zero when the plan closes the gap
    reason: str  # why the gap stays open, with numbers; "" when it closes

    @property
    def closed(self) -> bool:
        return self.shortfall.is_zero

    @property
    def capacity(self) -> Capacity:
        return sum((c.capacity for c in self.claims), ZERO)

    @property
    def price(self) -> float:
        return sum(c.price for c in self.claims)


def cheapest_claims(need: Capacity, types: Sequence[InstanceType], *, capacity_type: str = ON_DEMAND,
                    room: Capacity | None = None, max_claims: int) -> ClaimPlan:
    """The cheapest instances (any number of each type, at most `max_claims` in all) whose sum covers
    `need` in both dimensions and stays within `room` in both. Exact (short of a catalog so large
    that the search passes SEARCH_BUDGET); among equal prices the plan with fewer instances wins,
    then the one whose sorted type names come first.

    When no plan closes the gap within the limits, the plan that covers the largest share of it
    (the TFLOPS share plus the VRAM share) and, among those, is cheapest; `shortfall` is what stays
    open and `reason` says which limit holds it open."""
    _check_capacity_type(capacity_type)
    need = need.positive()
    sellable = _sellable(types, capacity_type)
    room = room.positive() if room is not None else None
    best = _search(need, sellable, capacity_type, room, max(max_claims, 0))
    claims = tuple(PlannedClaim(t, capacity_type, _price(t, capacity_type)) for t in best)
    covered = sum((Capacity(t.tflops, t.vram) for t in best), ZERO)
    shortfall = (need - covered).positive()
    reason = "" if shortfall.is_zero else _open_reason(need, types, sellable, capacity_type, room,
                                                       max(max_claims, 0))
    return ClaimPlan(claims, shortfall, reason)


def _check_capacity_type(capacity_type: str) -> None:
    if capacity_type not in CAPACITY_TYPES:
        raise ValueError(f"capacity_type {capacity_type!r} is not allowed; expected one of "
                         f"{', '.join(CAPACITY_TYPES)}")


def _price(t: InstanceType, capacity_type: str) -> float:
    price = t.price(capacity_type)
    assert price is not None  # only sellable types are planned
    return price


def _sellable(types: Iterable[InstanceType], capacity_type: str) -> list[InstanceType]:
    """Types sold as `capacity_type` that offer something, unique by name (the first wins)."""
    seen: set[str] = set()
    out = []
    for t in types:
        if t.price(capacity_type) is None or t.name in seen or t.tflops <= 0 or t.vram <= 0:
            continue
        seen.add(t.name)
        out.append(t)
    return out


@dataclass
class _Best:
    """The best plan found so far, as (score, micro-dollars, instances, sorted names)."""

    key: tuple[int, int, int, tuple[str, ...]] | None = None
    plan: list[InstanceType] = field(default_factory=list)


#: how many branches one search may visit before it settles for the best plan found so far; far more
#: than the packaged catalog or any test needs (they finish in a few thousand), it bounds the time a
#: catalog of dozens of near-equal types could take (well under a second)
SEARCH_BUDGET: Final = 50_000


def _search(need: Capacity, sellable: list[InstanceType], capacity_type: str, room: Capacity | None,
            max_claims: int, budget: int = SEARCH_BUDGET, seeds: bool = True) -> list[InstanceType]:
    """Branch and bound over how many of each type to take (types in order of price per TFLOPS).

    The score of a plan is its shortfall weighted so that each dimension counts by its share of the
    need (an integer: shortfall_tflops * need_vram + shortfall_vram * need_tflops); 0 means closed.
    A branch is cut when even its best case scores worse than the best plan so far (each free slot
    filled with the type that would close the most of what is left, up to the room), or, among
    closing plans, when what it has spent plus the least the rest can cost (what is left at the
    cheapest price per unit) exceeds the best price. Cuts are strict, so equal plans all reach the
    tie-break. The search starts from good plans (the best two-type mixes, a greedy mix) so that the
    cuts bite from the start, and past `budget` branches it keeps the best plan found."""
    if need.is_zero or not sellable or max_claims == 0:
        return []
    w_t = need.vram if need.vram > 0 else 1
    w_v = need.tflops if need.tflops > 0 else 1

    def micro(t: InstanceType) -> int:
        return round(_price(t, capacity_type) * _MICRO)

    order = sorted(_undominated(sellable, micro, room is None), key=lambda t: (Fraction(micro(t), t.tflops), t.name))
    prices = [micro(t) for t in order]
    sizes = [(t.tflops, t.vram) for t in order]
    n = len(order)
    # per suffix of `order`: the cheapest price per unit of each dimension
    per_t, per_v = [Fraction(0)] * n, [Fraction(0)] * n
    for i in range(n - 1, -1, -1):
        pt, pv = Fraction(prices[i], sizes[i][0]), Fraction(prices[i], sizes[i][1])
        per_t[i] = pt if i == n - 1 else min(pt, per_t[i + 1])
        per_v[i] = pv if i == n - 1 else min(pv, per_v[i + 1])
    best = _Best()
    chosen: list[InstanceType] = []
    visits = 0

    def score(rt: int, rv: int) -> int:
        return max(rt, 0) * w_t + max(rv, 0) * w_v

    def floor_score(i: int, rt: int, rv: int, qt: int, qv: int, slots: int) -> int:
        """The least score any completion can reach."""
        rt, rv = max(rt, 0), max(rv, 0)
        gain = max(min(tt, rt, qt) * w_t + min(vv, rv, qv) * w_v for tt, vv in sizes[i:])
        reachable = min(min(rt, qt) * w_t + min(rv, qv) * w_v, slots * gain)
        return rt * w_t + rv * w_v - reachable

    def visit(i: int, rt: int, rv: int, qt: int, qv: int, slots: int, spent: int) -> None:
        nonlocal visits
        visits += 1
        if (rt <= 0 and rv <= 0) or i == n or slots == 0:
            key = (score(rt, rv), spent, len(chosen), tuple(sorted(t.name for t in chosen)))
            if best.key is None or key < best.key:
                best.key, best.plan = key, list(chosen)
            return
        if best.key is not None:
            if visits > budget:
                return
            least = floor_score(i, rt, rv, qt, qv, slots)
            if least > best.key[0]:
                return
            if least == best.key[0]:
                extra = max(_floor(max(rt, 0) * per_t[i]), _floor(max(rv, 0) * per_v[i])) if least == 0 else 0
                if spent + extra > best.key[1]:
                    return
        tt, vv = sizes[i]
        most = max(0, min(slots, qt // tt, qv // vv, max(_ceil_div(max(rt, 0), tt), _ceil_div(max(rv, 0), vv))))
        for count in range(most, -1, -1):
            chosen.extend([order[i]] * count)
            visit(i + 1, rt - count * tt, rv - count * vv, _less(qt, count * tt), _less(qv, count * vv),
                  slots - count, spent + count * prices[i])
            del chosen[len(chosen) - count:]

    def consider(plan: list[int]) -> None:
        got_t, got_v = sum(sizes[j][0] for j in plan), sum(sizes[j][1] for j in plan)
        key = (score(need.tflops - got_t, need.vram - got_v), sum(prices[j] for j in plan), len(plan),
               tuple(sorted(order[j].name for j in plan)))
        if best.key is None or key < best.key:
            best.key, best.plan = key, [order[j] for j in plan]

    room_t = room.tflops if room is not None else UNBOUNDED
    room_v = room.vram if room is not None else UNBOUNDED
    # good plans found first make the cuts bite: the best mixes of two types, and a greedy mix
    if seeds:  # False only in tests, which check the search alone
        for plan in _pairs(need, sizes, room_t, room_v, max_claims):
            consider(plan)
        consider(_greedy(need, sizes, prices, w_t, w_v, room_t, room_v, max_claims))
    visit(0, need.tflops, need.vram, room_t, room_v, max_claims, 0)
    return sorted(best.plan, key=lambda t: t.name)


def _pairs(need: Capacity, sizes: list[tuple[int, int]], room_t: int, room_v: int,
           max_claims: int) -> Iterable[list[int]]:
    """For each two types (a type with itself included), the fewest of the second that, with 0, 1, ...
    of the first, close the gap within the limits; or as many as fit when none does."""
    for i, (ti, vi) in enumerate(sizes):
        for j in range(i, len(sizes)):
            tj, vj = sizes[j]
            for a in range(min(max_claims, room_t // ti, room_v // vi) + 1):
                rt, rv = need.tflops - a * ti, need.vram - a * vi
                b = max(0, _ceil_div(rt, tj), _ceil_div(rv, vj))
                b = min(b, max_claims - a, _less(room_t, a * ti) // tj, _less(room_v, a * vi) // vj)
                yield [i] * a + [j] * b
                if rt <= 0 and rv <= 0:
                    break


def _greedy(need: Capacity, sizes: list[tuple[int, int]], prices: list[int], w_t: int, w_v: int, room_t: int,
            room_v: int, max_claims: int) -> list[int]:
    """Adds, one at a time, the type that closes the most score per dollar until the gap closes."""
    rt, rv, plan = need.tflops, need.vram, list[int]()
    while len(plan) < max_claims and (rt > 0 or rv > 0):
        best: tuple[Fraction, int] | None = None
        for j, (tt, vv) in enumerate(sizes):
            if tt > room_t or vv > room_v:
                continue
            gain = min(tt, max(rt, 0)) * w_t + min(vv, max(rv, 0)) * w_v
            if gain > 0:
                rate = Fraction(-gain, prices[j]) if prices[j] else Fraction(-gain * 10**12)
                if best is None or (rate, j) < best:
                    best = (rate, j)
        if best is None:
            break
        j = best[1]
        plan.append(j)
        rt, rv = rt - sizes[j][0], rv - sizes[j][1]
        room_t, room_v = _less(room_t, sizes[j][0]), _less(room_v, sizes[j][1])
    return plan


def _undominated(types: list[InstanceType], micro: Callable[[InstanceType], int],
                 any_size: bool) -> list[InstanceType]:
    """Drops types no best plan needs: one that another type beats on price (or equals, with a name
    that sorts first) at the same size, or, when no room limits sizes (`any_size`), at a size at
    least as large in both dimensions. Swapping the beaten type for the other in any plan keeps it
    within the limits and covering as much, and makes it no worse in price or in the tie-break."""
    def beats(b: InstanceType, a: InstanceType) -> bool:
        same = b.tflops == a.tflops and b.vram == a.vram
        larger = b.tflops >= a.tflops and b.vram >= a.vram
        return (same or (any_size and larger)) and (micro(b), b.name) < (micro(a), a.name)

    return [a for a in types if not any(beats(b, a) for b in types if b is not a)]


def _less(limit: int, amount: int) -> int:
    return limit if limit >= UNBOUNDED else limit - amount


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _floor(value: Fraction) -> int:
    return value.numerator // value.denominator


def _open_reason(need: Capacity, types: Sequence[InstanceType],
                 sellable: list[InstanceType], capacity_type: str, room: Capacity | None,
                 max_claims: int) -> str:
    """Which limit holds the gap open: the catalog, the capacity type, maxResources, the claim cap.
    The shortfall itself is not repeated (callers print it beside the reason)."""
    if not types:
        return "the instance catalog has no types"
    if not sellable:
        return f"no instance type is sold as {capacity_type}"
    if max_claims == 0:
        return "no more claims may be in flight now"
    why = []
    if room is not None:
        why.extend(_room_reason(need, sellable, room))
    at_least = max(_ceil_div(need.tflops, max(t.tflops for t in sellable)),
                   _ceil_div(need.vram, max(t.vram for t in sellable)))
    if at_least > max_claims:
        why.append(f"at most {max_claims} more claims may be in flight and the gap needs at least {at_least}")
    if not why and room is not None:
        free = _search(need, sellable, capacity_type, None, max_claims)
        offered = sum((Capacity(t.tflops, t.vram) for t in free), ZERO)
        if offered.covers(need):
            why.append(f"maxResources leaves {capacity_text(room)} of room; the cheapest claims that close the "
                       f"gap, {_plan_text(free)}, offer {capacity_text(offered)}")
    if not why:
        within = " within maxResources" if room is not None else ""
        why.append(f"no {max_claims} or fewer instances sold as {capacity_type} add up to it{within}")
    return "; ".join(why)


def _room_reason(need: Capacity, sellable: list[InstanceType], room: Capacity) -> list[str]:
    short = not room.covers(need)
    fitting = any(room.covers(Capacity(t.tflops, t.vram)) for t in sellable)
    if not short and fitting:
        return []
    text = f"maxResources leaves {capacity_text(room)} of room" + (", less than the gap" if short else "")
    if not fitting:
        smallest = min(sellable, key=lambda t: (t.tflops, t.vram, t.name))
        text += (f"{' and' if short else ','} no type fits in it (the smallest, {smallest.name}, offers "
                 f"{capacity_text(Capacity(smallest.tflops, smallest.vram))})")
    return [text]


def _plan_text(plan: Sequence[InstanceType]) -> str:
    counts: dict[str, int] = {}
    for t in plan:
        counts[t.name] = counts.get(t.name, 0) + 1
    return " + ".join(f"{n} x {name}" for name, n in sorted(counts.items()))


# ---------------------------------------------------------------------------------------------------
# The node expander's choice


@dataclass(frozen=True)
class PodNeed:
    key: str  # "namespace/name"
    pool: str
    tflops_per_gpu: int  # milli-TFLOPS on each of its GPUs
    vram_per_gpu: int  # bytes on each of its GPUs
    gpu_count: int
    gpu_model: str = ""  # "" = any model


@dataclass(frozen=True)
class FreeGpu:
    tflops: int
    vram: int
    model: str


@dataclass(frozen=True)
class InFlight:
    claim: str
    instance_type: InstanceType
    ready_at: float
    gpus: tuple[FreeGpu, ...]  # what is still free after the pods already promised to it


@dataclass(frozen=True)
class Expansion:
    """One decision. `claim` set: the pods wait for that claim in flight; `instance_type` set: a new
    claim of that type is to be made for them (`cloned_from`: the node whose type it copies); neither:
    nothing can be made for them now, and `reason` says why."""

    pods: tuple[str, ...]
    claim: str = ""
    instance_type: InstanceType | None = None
    cloned_from: str = ""
    ready_at: float = 0.0
    reason: str = ""


def choose_expansions(pods: Sequence[PodNeed], in_flight: Sequence[InFlight], clonable: Mapping[str, InstanceType],
                      types: Sequence[InstanceType], *, capacity_type: str = ON_DEMAND, now: float,
                      max_new: int) -> list[Expansion]:
    """Where pods that fit on no node go, largest first (most GPUs, then VRAM, then TFLOPS per GPU).

    1. Onto claims in flight (earliest ready first), first fit: a pod takes the first `gpu_count`
       distinct GPUs that each have its TFLOPS and VRAM free and its model when it names one.
    2. The rest onto new claims, at most `max_new`: the largest pod left picks the type. An existing
       node's type (`clonable`, node name -> type) that fits it is preferred (the cheapest per pod,
       then by name); otherwise the type with the lowest price per pod it can hold, counting the pods
       left that first-fit onto one instance of it (ties: lower price, then name). Each new claim
       takes as many of the pods left as fit on it.
    3. Pods that no type sold as `capacity_type` can hold, and pods left when `max_new` is reached,
       get an Expansion with neither a claim nor a type and the reason."""
    _check_capacity_type(capacity_type)
    unique = {p.key: p for p in reversed(pods)}  # a pod listed twice is placed once (its first entry)
    order = sorted(unique.values(), key=_pod_order)
    out: list[Expansion] = []
    left = _onto_in_flight(order, in_flight, out)
    sellable = _sellable(types, capacity_type)
    clones = sorted(((node, t) for node, t in clonable.items() if t.price(capacity_type) is not None
                     and t.tflops > 0 and t.vram > 0), key=lambda nt: nt[0])
    fitting = []
    for pod in left:
        if any(_fits_empty(pod, t) for t in [*sellable, *(t for _, t in clones)]):
            fitting.append(pod)
        else:
            out.append(Expansion((pod.key,), reason=_no_type_reason(pod, types, sellable, capacity_type)))
    made = 0
    while fitting and made < max_new:
        choice, node, placed = _pick(fitting, clones, sellable, capacity_type)
        out.append(Expansion(tuple(p.key for p in placed), instance_type=choice, cloned_from=node,
                             ready_at=now + choice.boot_seconds))
        gone = {id(p) for p in placed}
        fitting = [p for p in fitting if id(p) not in gone]
        made += 1
    if fitting:
        out.append(Expansion(tuple(p.key for p in fitting),
                             reason=f"at most {max(max_new, 0)} new claims may be made now and {made} were; "
                                    f"{_pods_text(len(fitting))} for a later round"))
    return out


def _pods_text(count: int) -> str:
    return "this pod waits" if count == 1 else f"these {count} pods wait"


def _pod_order(pod: PodNeed) -> tuple[int, int, int, str]:
    return -pod.gpu_count, -pod.vram_per_gpu, -pod.tflops_per_gpu, pod.key


def place(pod: PodNeed, gpus: list[FreeGpu]) -> bool:
    """Put `pod` on the first GPUs that hold it (updating `gpus`); False, and `gpus` untouched, when
    fewer than `gpu_count` do."""
    if pod.gpu_count < 1:
        return False
    picks = [i for i, g in enumerate(gpus) if g.tflops >= pod.tflops_per_gpu and g.vram >= pod.vram_per_gpu
             and (not pod.gpu_model or g.model == pod.gpu_model)][:pod.gpu_count]
    if len(picks) < pod.gpu_count:
        return False
    for i in picks:
        g = gpus[i]
        gpus[i] = FreeGpu(g.tflops - pod.tflops_per_gpu, g.vram - pod.vram_per_gpu, g.model)
    return True


def _fresh(t: InstanceType) -> list[FreeGpu]:
    return [FreeGpu(t.tflops_per_gpu, t.vram_per_gpu, t.gpu_model)] * t.gpu_count


def _fits_empty(pod: PodNeed, t: InstanceType) -> bool:
    return place(pod, _fresh(t))


def _onto_in_flight(order: list[PodNeed], in_flight: Sequence[InFlight], out: list[Expansion]) -> list[PodNeed]:
    claims = sorted(in_flight, key=lambda c: (c.ready_at, c.claim))
    free = [list(c.gpus) for c in claims]
    placed: list[list[str]] = [[] for _ in claims]
    left = []
    for pod in order:
        at = next((i for i in range(len(claims)) if place(pod, free[i])), None)
        if at is None:
            left.append(pod)
        else:
            placed[at].append(pod.key)
    out.extend(Expansion(tuple(keys), claim=c.claim, ready_at=c.ready_at)
               for c, keys in zip(claims, placed, strict=True) if keys)
    return left


def _first_fit(pods: list[PodNeed], t: InstanceType) -> list[PodNeed]:
    gpus = _fresh(t)
    return [p for p in pods if place(p, gpus)]


def _pick(fitting: list[PodNeed], clones: list[tuple[str, InstanceType]], sellable: list[InstanceType],
          capacity_type: str) -> tuple[InstanceType, str, list[PodNeed]]:
    """The type for the next new claim, the node it clones ("" = none) and the pods it takes."""
    head = fitting[0]
    candidates = [(node, t) for node, t in clones if _fits_empty(head, t)] or \
                 [("", t) for t in sellable if _fits_empty(head, t)]
    best: tuple[Fraction, float, str, str] | None = None
    chosen: tuple[InstanceType, str, list[PodNeed]] | None = None
    for node, t in candidates:
        placed = _first_fit(fitting, t)
        price = _price(t, capacity_type)
        key = (Fraction(round(price * _MICRO), len(placed)), price, t.name, node)
        if best is None or key < best:
            best, chosen = key, (t, node, placed)
    assert chosen is not None  # `fitting` holds only pods some sellable or clonable type fits
    return chosen


def _no_type_reason(pod: PodNeed, types: Sequence[InstanceType], sellable: list[InstanceType],
                    capacity_type: str) -> str:
    if not types:
        return "the instance catalog has no types"
    if not sellable:
        return f"no instance type is sold as {capacity_type}"
    if pod.gpu_count < 1:
        return f"the pod asks for {pod.gpu_count} GPUs"
    model = f" {pod.gpu_model}" if pod.gpu_model else ""
    gpus = "GPU" if pod.gpu_count == 1 else "GPUs"
    largest = max(sellable, key=lambda t: (t.gpu_count, t.vram_per_gpu, t.tflops_per_gpu, t.name))
    return (f"no instance type sold as {capacity_type} has {pod.gpu_count}{model} {gpus} with at least "
            f"{tflops_text(pod.tflops_per_gpu)} and {bytes_text(pod.vram_per_gpu)} each (the largest, "
            f"{largest.name}, has {largest.gpu_count} x {largest.gpu_model} with "
            f"{tflops_text(largest.tflops_per_gpu)} and {bytes_text(largest.vram_per_gpu)})")
