"""Which GPUs of a node a multi-GPU pod gets, by how closely they are joined (the original's
`GPUNetworkTopologyAware` plugin).

Why it exists: a 2- or 4-GPU job that talks over NVLink runs several times faster than one whose
GPUs talk across the CPU's interconnect. The hypervisor reports each GPU's peers with a tier
(`GpuInfo.peer_tiers`: 0 NVLink, 1 PCIe switch / host bridge / same NUMA node, 2 across NUMA nodes,
3 unknown) and its NUMA node; this module turns that into a choice. Pure: no I/O, no state.

- The tier of a pair comes from the reported peers (`vendor`), from the NUMA nodes (`numa`: same
  node 1, different 2), or from the peers where a GPU has them and else NUMA (`auto`); a pair
  neither knows is tier 3 (unknown). The tier of a set is its worst pair.
- `best_set` picks `count` GPUs among a node's fitting ones: every combination when there are at
  most `EXHAUSTIVE_LIMIT`, else a greedy growth from each GPU. Sets compare by (tier, damage,
  the sum of their pair tiers, the load order the allocator would use without topology); damage
  (with `preferLeastDamage`) is how badly the GPUs left over are joined to each other, so a job
  takes a whole NVLink pair rather than breaking two.
- Hard mode (`mode: hard`, or a pod's `require-gpu-topology: "true"` / `gpu-topology-max-tier`):
  a node whose best set is worse than the allowed tier cannot take the pod (indexes.py `node_fit`,
  so the cached feasible sets, Filter and the explanations all agree); with
  `unknownTopologyPolicy: reject` a set with a pair of unknown topology is never used, in either mode.
- Soft mode never refuses. Node choice: the load score orders nodes through score-ordered indexes
  (index.py) that cannot carry a per-request value, so the preference is folded into Score only,
  among the nodes that already fit (`band_score`): the score becomes 25 x (3 - tier) plus a quarter of
  the load score, so a node with a better best set always wins and load decides within a tier (the
  original's banding). `GpuAllocator.select` (single-node mode, suggestions) keeps its best-first
  walk of the load index and applies the topology inside the node it picks.
Requests for one GPU, and nodes whose GPUs report no topology under soft mode with unknown treated
as worst, never reach this module: they keep the allocator's plain path and cost.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from tfusion.allocator.request import AllocRequest
from tfusion.allocator.state import GpuSlot
from tfusion.api import annotations as tfa

STAGE = "GPUNetworkTopologyAware"
MODES = ("soft", "hard")
SOURCES = tfa.TOPOLOGY_SOURCES
UNKNOWN_POLICIES = ("treat-as-worst", "reject")
TIER_NVLINK, TIER_SWITCH, TIER_SYSTEM, TIER_UNKNOWN = 0, 1, 2, 3
#: combinations searched one by one; above this a greedy heuristic builds the set
EXHAUSTIVE_LIMIT = 256
OUTCOMES = ("satisfied", "unsatisfied", "fallback")


@dataclass(frozen=True, slots=True)
class TopologyArgs:
    """`GPUNetworkTopologyAware`'s arguments (the scheduler config file; these are its defaults)."""

    mode: str = "soft"
    source: str = "auto"
    max_tier: int = TIER_SWITCH
    unknown_policy: str = "treat-as-worst"
    prefer_least_damage: bool = True

    def policy(self) -> Policy:
        return Policy(self.mode == "hard", self.source, self.max_tier, self.unknown_policy == "reject",
                      self.prefer_least_damage)


@dataclass(frozen=True, slots=True)
class Policy:
    """What applies to one request: the arguments with the pod's annotations over them."""

    hard: bool
    source: str
    max_tier: int
    reject_unknown: bool
    least_damage: bool

    @property
    def gates(self) -> bool:
        """Whether the topology can make a node unfit (else it only orders)."""
        return self.hard or self.reject_unknown


def policy_for(default: Policy, req: AllocRequest) -> Policy:
    """`default` (the config's) with the pod's overrides: `require-gpu-topology` sets hard or soft;
    a `gpu-topology-max-tier` of its own makes the pod require it unless it says "false"."""
    required, tier, source = req.topology_required, req.topology_max_tier, req.topology_source
    if required is None and tier is None and not source:
        return default
    hard = required if required is not None else (True if tier is not None else default.hard)
    return Policy(hard, source or default.source, default.max_tier if tier is None else tier,
                  default.reject_unknown, default.least_damage)


def tier_name(tier: int, source: str = "auto") -> str:
    """The link a tier stands for, as a user reads it."""
    if tier == TIER_NVLINK:
        return "NVLink"
    if tier == TIER_SWITCH:
        return "same NUMA node" if source == "numa" else "PCIe switch or host bridge"
    if tier == TIER_SYSTEM:
        return "across NUMA nodes"
    return "unknown link"


def knows(slot: GpuSlot, source: str) -> bool:
    """Whether the GPU reports anything `source` reads."""
    info = slot.info
    if source == "vendor":
        return bool(info.peer_tiers)
    if source == "numa":
        return info.numa is not None
    return bool(info.peer_tiers) or info.numa is not None


def pair_tier(a: GpuSlot, b: GpuSlot, source: str, peers: dict[str, dict[str, int]] | None = None) -> int:
    """How closely `a` and `b` are joined (0 best, 3 unknown) under `source`."""
    ia, ib = a.info, b.info
    if source != "numa" and (ia.peer_tiers or ib.peer_tiers):
        table_a = peers[a.name] if peers is not None else dict(ia.peer_tiers)
        tier = table_a.get(b.name)
        if tier is None:
            tier = (peers[b.name] if peers is not None else dict(ib.peer_tiers)).get(a.name)
        if tier is not None:
            return min(max(tier, TIER_NVLINK), TIER_UNKNOWN)
        if source == "vendor":
            return TIER_UNKNOWN
    if source == "vendor" or ia.numa is None or ib.numa is None:
        return TIER_UNKNOWN
    return TIER_SWITCH if ia.numa == ib.numa else TIER_SYSTEM


def tier_matrix(slots: Sequence[GpuSlot], source: str) -> list[list[int]]:
    peers = {s.name: dict(s.info.peer_tiers) for s in slots}
    n = len(slots)
    matrix = [[TIER_NVLINK] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            matrix[i][j] = matrix[j][i] = pair_tier(slots[i], slots[j], source, peers)
    return matrix


@dataclass(frozen=True, slots=True)
class Choice:
    """A set of GPUs (their positions in the candidates, best first) and how it is joined.
    `tier` is None when no set may be used (every one has a pair of unknown topology under reject)."""

    picks: tuple[int, ...]
    tier: int | None
    exhaustive: bool = True


def _set_tier(matrix: list[list[int]], picks: Sequence[int]) -> tuple[int, int]:
    worst = total = 0
    for x, i in enumerate(picks):
        row = matrix[i]
        for j in picks[x + 1:]:
            t = row[j]
            total += t
            if t > worst:
                worst = t
    return worst, total


def _damage(matrix: list[list[int]], picks: Sequence[int]) -> int:
    """How badly the GPUs left over are joined: each one's best link to another one left (3 alone)."""
    taken = set(picks)
    left = [i for i in range(len(matrix)) if i not in taken]
    return sum(min((matrix[i][j] for j in left if j != i), default=TIER_UNKNOWN) for i in left)


def best_set(slots: Sequence[GpuSlot], count: int, policy: Policy) -> Choice:
    """The best `count` of `slots` (the node's fitting GPUs, in the allocator's load order, best
    first) by the module's ordering; picks are positions in `slots`, sorted by that order."""
    n = len(slots)
    matrix = tier_matrix(slots, policy.source)
    reject = policy.reject_unknown
    if math.comb(n, count) <= EXHAUSTIVE_LIMIT:
        candidates: list[tuple[int, ...]] = list(itertools.combinations(range(n), count))
        exhaustive = True
    else:
        candidates = [_grow(matrix, seed, count) for seed in range(n)]
        exhaustive = False
    best: tuple[tuple[int, int, int], tuple[int, ...]] | None = None
    ranked: list[tuple[int, int, tuple[int, ...]]] = []
    for picks in candidates:
        worst, total = _set_tier(matrix, picks)
        if reject and worst >= TIER_UNKNOWN:
            continue
        ranked.append((worst, total, picks))
    if not ranked:
        return Choice((), None, exhaustive)
    top = min(r[0] for r in ranked)
    for worst, total, picks in ranked:
        if worst != top:
            continue
        key = (_damage(matrix, picks) if policy.least_damage else 0, total, sum(picks))
        if best is None or (key, picks) < best:
            best = (key, picks)
    assert best is not None
    return Choice(best[1], top, exhaustive)


def _grow(matrix: list[list[int]], seed: int, count: int) -> tuple[int, ...]:
    """A set grown from `seed`: each step adds the GPU whose worst and total link to the set are lowest."""
    picks = [seed]
    rest = [i for i in range(len(matrix)) if i != seed]
    while len(picks) < count:
        def cost(j: int) -> tuple[int, int, int]:
            links = [matrix[j][i] for i in picks]
            return max(links), sum(links), j
        chosen = min(rest, key=cost)
        picks.append(chosen)
        rest.remove(chosen)
    return tuple(sorted(picks))


def in_play(slots: Sequence[GpuSlot], req: AllocRequest, policy: Policy) -> bool:
    """Whether the topology can change anything for `req` on these GPUs: a multi-GPU request and
    either a policy that refuses or a GPU that reports a topology."""
    if req.count < 2:
        return False
    return policy.gates or any(knows(s, policy.source) for s in slots)


def refusal(choice: Choice, policy: Policy) -> bool:
    """Whether the node must refuse the request with this best set."""
    if choice.tier is None:
        return True
    return policy.hard and choice.tier > policy.max_tier


def band_score(score: int, tier: int) -> int:
    """Soft preference folded into a 0..100 node score: a better tier always ranks first."""
    return 25 * (TIER_UNKNOWN - tier) + score // 4


def outcome(tier: int | None, policy: Policy) -> str:
    """satisfied (within the allowed tier), fallback (placed worse under soft mode), unsatisfied."""
    if tier is not None and tier <= policy.max_tier:
        return "satisfied"
    return "unsatisfied" if tier is None or policy.hard else "fallback"


def refusal_detail(count: int, node: str, choice: Choice, policy: Policy) -> str:
    """The sentence a refused node shows."""
    if choice.tier is None:
        return (f"the topology between the GPUs on node {node} is unknown and unknownTopologyPolicy is "
                f"reject: no {count} of them can be placed together")
    return (f"best {count} GPUs on node {node} are joined at tier {choice.tier} "
            f"({tier_name(choice.tier, policy.source)}); at most tier {policy.max_tier} allowed")
