"""`benchmarks/allocator.py --path gang`: gang placement on the reference cluster, per member.

Groups of 4 and 8 members (alternating; each group one shape of allocator.py's SHAPES) are placed
as the built-in scheduler places a gang member: Framework.pre_filter, feasible, score, the best
node, reserve, then the gang book's Permit (gang.py); the first member of a group also pays the
"could the gang ever fit" check (allocator/gangfit.py). When a group's last member is permitted,
every member is committed (PreBind). A group whose member fits nowhere is released whole (what its
timeout does) and counted in `groups_released`; `partial_gangs` counts groups left with some but
not all members committed (0 expected). Per-member time = its own placement and Permit + its own
commit; `group` times a whole group.
"""

from __future__ import annotations

import gc
import time
from typing import Any

from tfusion.allocator import AllocRequest, Framework, GpuAllocator, request_from_pod
from tfusion.allocator.gangfit import gang_never_fits
from tfusion.api.accessors import Pod
from tfusion.controller.scheduling.gang import GangBook, GangSpec

GROUP_SIZES = (4, 8)
TARGET_P99_MS = 5.0


def _ms(timings_ns: list[int]) -> dict[str, Any]:
    if not timings_ns:
        return {"count": 0}
    ordered = sorted(timings_ns)
    return {"count": len(ordered), "p50_ms": round(ordered[len(ordered) // 2] / 1e6, 3),
            "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] / 1e6, 3),
            "max_ms": round(ordered[-1] / 1e6, 3)}


def _place(fw: Framework, req: AllocRequest, names: list[str]) -> bool:
    """One member through PreFilter, Filter, Score and Reserve (the built-in scheduler's order)."""
    if not fw.pre_filter(req).ok:
        return False
    scores = fw.score(req, fw.feasible(req, names))
    while scores:
        best = max(scores.values())
        node = min(n for n, v in scores.items() if v == best)
        del scores[node]
        placement, _status = fw.reserve(req, node)
        if placement is not None:
            return True
    return False


def run_gang(allocator: GpuAllocator, pod: Any, pods: int) -> dict[str, Any]:
    """Place up to `pods` members in groups of 4 and 8 on `allocator`; `pod(i, prefix=)` makes pod i."""
    fw = Framework(allocator)
    names = sorted(allocator.node_entries())
    book = GangBook()
    member_ns: list[int] = []
    group_ns: list[int] = []
    placed_groups = released_groups = partial = members_placed = 0
    i = group_no = 0
    gc.collect()
    while i < pods:
        size = GROUP_SIZES[group_no % len(GROUP_SIZES)]
        spec = GangSpec(f"ns/gang-{group_no}", size, size, None)
        shape = group_no  # one shape per group
        group_no += 1
        reqs = []
        for m in range(size):
            raw = pod(shape, prefix=f"g{group_no}m{m}-")
            raw["metadata"]["uid"] = f"g{group_no}-uid-{m}"
            reqs.append(request_from_pod(Pod(raw)))
        i += size
        timings: list[int] = []
        group_start = time.perf_counter_ns()
        complete = False
        for m, req in enumerate(reqs):
            start = time.perf_counter_ns()
            if m == 0 and gang_never_fits(allocator, req, size):
                break
            if not _place(fw, req, names):
                break
            answer = book.permit(spec, req.pod_uid, req.pod_name, 0.0, ())
            timings.append(time.perf_counter_ns() - start)
            if not answer.waits:
                for k, member in enumerate(answer.release):
                    start = time.perf_counter_ns()
                    fw.pre_bind(member.uid)
                    timings[k] += time.perf_counter_ns() - start
                complete = True
        if complete:
            group_ns.append(time.perf_counter_ns() - group_start)
            member_ns.extend(timings)
            placed_groups += 1
            members_placed += size
            continue
        # what the gang timeout does: every waiting member's reservation goes
        group = book.groups.get(spec.key)
        if group is not None:
            for uid in list(group.waiting):
                book.unreserve(uid, 0.0)
                fw.unreserve(uid)
        committed = sum(1 for req in reqs if (info := allocator.allocation(req.pod_uid)) is not None
                        and not info.assumed)
        partial += 1 if 0 < committed < size else 0
        released_groups += 1
    per_member = _ms(member_ns)
    return {"member": per_member, "group": _ms(group_ns), "groups_placed": placed_groups,
            "groups_released": released_groups, "members_placed": members_placed, "partial_gangs": partial,
            "group_sizes": list(GROUP_SIZES), "target_member_p99_ms": TARGET_P99_MS,
            "meets_target": per_member.get("p99_ms", 0.0) <= TARGET_P99_MS}
