"""The extender's `preemptVerb` (`--scheduler=extender`): GPU-aware victims for kube-scheduler's
DefaultPreemption.

Why: in extender mode kube-scheduler preempts, and it cannot see GPU shares: for a GPU worker that
the extender's filter refused on a node, kube proposes victims for its own resources only (often
none). It then calls this verb with its candidates, `ExtenderPreemptionArgs {Pod, NodeNameToVictims |
NodeNameToMetaVictims}` (meta, i.e. pod UIDs, when the extender is `nodeCacheCapable`), and
evicts what the answer, `ExtenderPreemptionResult {NodeNameToMetaVictims}`, says. For each proposed
node the answer is kube's victims plus the minimal GPU victim set there, by the built-in
scheduler's rules (preemption.py: priority, eviction protection, namespace scope, budgets); a node
where evicting eligible pods would not make GPU room is left out. kube can evict only pods of the
node it names, so a node whose victims would include gang members on other nodes is left out too,
as is a node where kube's own victims include a GPU pod that may not go (stock DefaultPreemption
knows nothing of eviction protection).
kube-scheduler keeps the node for the preemptor (`nominatedNodeName`); the freed GPU share is not
reserved for it here (the built-in scheduler does that), so another pod may take it first, after
which kube-scheduler tries again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from tfusion.allocator import RequestError
from tfusion.allocator.framework import Framework
from tfusion.api.accessors import Pod
from tfusion.controller.scheduling.preemption import Refusals
from tfusion.web import BodyBuffer

if TYPE_CHECKING:
    from tfusion.controller.scheduling.scheduler import Scheduler


class MetaPod(msgspec.Struct, gc=False):
    UID: str


class MetaVictims(msgspec.Struct, gc=False):
    Pods: list[MetaPod] = msgspec.field(default_factory=list)
    NumPDBViolations: int = 0


class Victims(msgspec.Struct, gc=False):
    Pods: list[dict[str, Any]] = msgspec.field(default_factory=list)
    NumPDBViolations: int = 0


class ExtenderPreemptionArgs(msgspec.Struct, gc=False):
    """kube-scheduler's preempt request: the pod and kube's candidate nodes with their victims."""

    Pod: dict[str, Any]
    NodeNameToVictims: dict[str, Victims | None] | None = None
    NodeNameToMetaVictims: dict[str, MetaVictims | None] | None = None


class ExtenderPreemptionResult(msgspec.Struct):
    NodeNameToMetaVictims: dict[str, MetaVictims] = msgspec.field(default_factory=dict)


_decoder = msgspec.json.Decoder(ExtenderPreemptionArgs)


def decode_preemption_args(body: BodyBuffer) -> ExtenderPreemptionArgs:
    return _decoder.decode(body)


def proposals(args: ExtenderPreemptionArgs) -> dict[str, tuple[list[str], int]]:
    """kube's candidates: node -> (victim pod UIDs, PodDisruptionBudget violations)."""
    out: dict[str, tuple[list[str], int]] = {}
    for node, meta in (args.NodeNameToMetaVictims or {}).items():
        out[node] = ([p.UID for p in meta.Pods], meta.NumPDBViolations) if meta is not None else ([], 0)
    for node, full in (args.NodeNameToVictims or {}).items():
        if node in out:
            continue
        uids = [Pod(p).uid for p in full.Pods] if full is not None else []
        out[node] = ([u for u in uids if u], full.NumPDBViolations if full is not None else 0)
    return out


def preempt(scheduler: Scheduler, args: ExtenderPreemptionArgs, fw: Framework) -> ExtenderPreemptionResult:
    """See the module docstring."""
    from tfusion.controller.scheduling.scheduler import asks_for_gpus

    proposed = proposals(args)
    pod = Pod(args.Pod)
    if not asks_for_gpus(pod) or not pod.is_worker:  # no GPU: kube's own victims stand
        return _result({n: (uids, pdb) for n, (uids, pdb) in proposed.items()})
    preemption = scheduler.preemption
    search = preemption.search() if preemption is not None else None
    try:
        req = scheduler.request_of(pod)
    except RequestError:
        return ExtenderPreemptionResult()
    if preemption is None or search is None or preemption.why_not(pod, req, fw) is not None:
        return ExtenderPreemptionResult()
    allowed: dict[str, int] = {}
    eligible = preemption.eligibility(pod, req, Refusals(), allowed)
    out: dict[str, tuple[list[str], int]] = {}
    allocator = fw.allocator
    for node, (uids, violations) in proposed.items():
        if any(allocator.allocation(uid) is not None and eligible(uid) is None for uid in uids):
            continue  # kube would take a GPU pod that may not go (protected, another namespace ...)
        found = search.victims_on(node, req, req.priority, eligible, allowed=allowed)
        if found is None:
            if allocator.fitting_gpus(node, req) is not None and search.quota_allows(req, uids):
                out[node] = (uids, violations)  # the GPUs are not what keeps the pod off this node
            continue
        if set(found.victims) != set(found.local):
            continue  # a gang's members elsewhere would have to go too, which kube cannot do
        out[node] = (sorted(set(uids) | set(found.local)), violations + len(found.violating))
    return _result(out)


def _result(victims: dict[str, tuple[list[str], int]]) -> ExtenderPreemptionResult:
    return ExtenderPreemptionResult({node: MetaVictims([MetaPod(uid) for uid in uids], violations)
                                     for node, (uids, violations) in victims.items()})
