"""The dynamic isolation-mode policy: a GPU takes the isolation mode of the first pod placed on it.

Why it exists: under the original's `dynamic` policy (TF_ISOLATION_MODE_POLICY) a GPU has no fixed
isolation mode; the first allocation on it sets its active mode, every later pod must ask the same
mode, and the mode is cleared when the GPU holds nothing again. The mode follows from the pods on
the GPU (the ledger recomputes it whenever a GPU's allocations change), so leader recovery, which
restores the allocations from the worker pods' annotations, recovers it too; where the recovered
pods disagree the GPU is flagged (`dynamicIsolationConflict`) and takes no new pod until the pods
agree again. Partitioned isolation is not allowed under this policy (as the original refuses it).

Under the `static` policy (the default) nothing here runs: GpuSlot.dynamic is False and the
filters keep their static rules (filters.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

from tfusion.allocator.request import AllocRequest
from tfusion.allocator.state import GpuSlot
from tfusion.api import annotations as tfa

STATIC = "static"
DYNAMIC = "dynamic"
POLICIES = (STATIC, DYNAMIC)
#: the rule a partitioned request breaks under the dynamic policy
PARTITIONED_RULE = "partitioned isolation is not allowed under the dynamic isolation policy"
# the stage's number-free reasons (the reasons.py vocabulary re-exports them)
ACTIVE_MODE_MISMATCH = "GPU active isolation mode differs (dynamic policy)"
MODE_CONFLICT = "GPU pods disagree on the isolation mode (dynamic policy)"
DYNAMIC_PARTITIONED = "partitioned isolation not allowed under the dynamic policy"
POLICY = "GPU isolation policy not supported"


class _Held(Protocol):
    req: AllocRequest


def parse_policy(text: str) -> str:
    """`static` or `dynamic`, case-insensitive as the original reads TF_ISOLATION_MODE_POLICY."""
    lowered = text.strip().lower()
    if lowered not in POLICIES:
        raise ValueError(f"isolation mode policy must be static or dynamic (case-insensitive), got {text!r}")
    return lowered


def fits(g: GpuSlot, req: AllocRequest) -> bool:
    """The dynamic IsolationPolicy stage as a yes/no (the fast path)."""
    if req.isolation == tfa.ISOLATION_PARTITIONED or g.mode_conflict:
        return False
    if g.info.isolation_policy.lower() != DYNAMIC:
        return False
    return not g.active_mode or g.active_mode == req.isolation


def label(g: GpuSlot, req: AllocRequest) -> str | None:
    """The number-free reason (reasons.py) the dynamic IsolationPolicy stage gives, None when `g` passes."""
    if req.isolation == tfa.ISOLATION_PARTITIONED:
        return DYNAMIC_PARTITIONED
    if g.info.isolation_policy.lower() != DYNAMIC:
        return POLICY
    if g.mode_conflict:
        return MODE_CONFLICT
    if g.active_mode and g.active_mode != req.isolation:
        return ACTIVE_MODE_MISMATCH
    return None


def refusal(g: GpuSlot, req: AllocRequest) -> str | None:
    """The dynamic IsolationPolicy stage's sentence for `g`, None when it passes."""
    if req.isolation == tfa.ISOLATION_PARTITIONED:
        return f"{g.name}: {PARTITIONED_RULE}; the pod asks partitioned"
    policy = g.info.isolation_policy
    if policy.lower() != DYNAMIC:
        return (f"{g.name}: isolation policy {policy or 'unset'} reported by the hypervisor, the controller "
                f"runs the dynamic policy (the hypervisor must run with --isolation-policy=dynamic)")
    if g.mode_conflict:
        return (f"{g.name}: its pods disagree on the isolation mode (dynamicIsolationConflict, dynamic "
                f"policy); no new pod until they agree; the pod asks {req.isolation}")
    if g.active_mode and g.active_mode != req.isolation:
        return f"{g.name}: active isolation mode {g.active_mode} (dynamic policy); the pod asks {req.isolation}"
    return None


def committed_mode(requests: Iterable[AllocRequest]) -> tuple[str, bool]:
    """(active mode, conflict) of a GPU holding these requests: no request, no mode; one mode, that
    mode; several (only recovered pods can disagree), the conflict flag and the mode most of them
    hold (ties: alphabetical)."""
    counts: dict[str, int] = {}
    for req in requests:
        counts[req.isolation] = counts.get(req.isolation, 0) + 1
    return (max(sorted(counts), key=counts.__getitem__) if counts else ""), len(counts) > 1


def settle(slot: GpuSlot, allocs: Mapping[str, _Held]) -> None:
    """Recompute `slot`'s active mode and conflict flag from the allocations it holds (assumed included)."""
    held = (allocs[uid].req for uid in slot.allocs if uid in allocs)
    slot.active_mode, slot.mode_conflict = committed_mode(held)
