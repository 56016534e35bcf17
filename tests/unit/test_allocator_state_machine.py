"""Random sequences of GPU changes and ledger operations keep the allocator's books exact.

The machine keeps its own record of which pods hold what (its model) and after every step checks:
available is never negative nor above capacity and equals capacity minus the charges of live
allocations (0 while shared); no pod is held twice; quota usage equals the sum over live allocations;
a failed operation changes nothing; and a restart (fresh allocator + `restore` of the committed
allocations) reproduces the committed state.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tests.helpers import Clock
from tfusion.allocator import (
    AllocatorError,
    AllocRequest,
    GpuAllocator,
    GpuInfo,
    QuotaExceeded,
    QuotaSpec,
    Resources,
    Unschedulable,
)
from tfusion.allocator.queries import Snapshot
from tfusion.controller import views

GIB = 1 << 30
NODES = ("n0", "n1", "n2")
GPU_NAMES = tuple(f"g{i}" for i in range(7))
CAPS = ((100_000, 16 * GIB), (50_000, 8 * GIB), (200_000, 24 * GIB))
NAMESPACES = ("a", "b")
QUOTA = QuotaSpec(requests_tflops=300_000, requests_vram=40 * GIB, limits_tflops=600_000, limits_vram=80 * GIB,
                  max_workers=5, single_max_requests_vram=12 * GIB, single_max_gpu_count=2)


def need_t(req: AllocRequest, cap_t: int) -> int:
    if req.tflops_request or not req.percent_request:
        return req.tflops_request
    return req.percent_request * cap_t // 100_000


def limit_t(req: AllocRequest, cap_t: int) -> int:
    if req.tflops_limit or not req.percent_limit:
        return req.tflops_limit
    return req.percent_limit * cap_t // 100_000


# (tflops, percent, vram, extra limit tflops, extra limit vram, count, shared, namespace, model)
requests = st.tuples(
    st.sampled_from((0, 10_000, 30_000, 40_000, 80_000)),
    st.sampled_from((0, 0, 25_000, 50_000)), st.sampled_from((0, GIB, 2 * GIB, 5 * GIB, 9 * GIB)),
    st.sampled_from((0, 10_000)), st.sampled_from((0, GIB)), st.integers(1, 3), st.booleans(),
    st.sampled_from(NAMESPACES), st.sampled_from(("", "", "A")))


class AllocatorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        self.alloc = GpuAllocator(max_workers_per_node=4, clock=self.clock, assume_ttl=100.0)
        self.alloc.set_quota("b", QUOTA)
        self.gpus: dict[str, GpuInfo] = {}
        self.home: dict[str, str] = {}
        self.live: dict[str, tuple[AllocRequest, tuple[str, ...], bool]] = {}  # uid -> (req, gpus, assumed)
        self.caps_at_alloc: dict[str, dict[str, int]] = {}
        self.next_uid = 0

    # ---------------------------------------------------------------- GPU events
    @rule(name=st.sampled_from(GPU_NAMES), node=st.sampled_from(NODES), cap=st.sampled_from(CAPS),
          phase=st.sampled_from(("Running", "Running", "Running", "Pending")), model=st.sampled_from(("", "A", "B")))
    def upsert_gpu(self, name: str, node: str, cap: tuple[int, int], phase: str, model: str) -> None:
        node = self.home.setdefault(name, node)  # a GPU (a device UUID) never changes node
        info = GpuInfo(name=name, node=node, pool="p", capacity_tflops=cap[0], capacity_vram=cap[1], phase=phase,
                       model=model)
        self.alloc.upsert_gpu(info)
        self.gpus[name] = info

    @rule(name=st.sampled_from(GPU_NAMES))
    def remove_gpu(self, name: str) -> None:
        self.alloc.remove_gpu(name)
        self.gpus.pop(name, None)

    # ---------------------------------------------------------------- ledger
    def _request(self, spec: tuple[Any, ...]) -> AllocRequest:
        t, pct, v, extra_t, extra_v, count, shared, ns, model = spec
        self.next_uid += 1
        uid = f"pod-{self.next_uid}"
        return AllocRequest(pod_uid=uid, pod_name=uid, namespace=ns, pool="p", workload=(ns, "w"),
                            tflops_request=t, tflops_limit=t + extra_t if t else 0,
                            percent_request=0 if t else pct, percent_limit=0 if t else pct,
                            vram_request=v, vram_limit=v + extra_v, count=count,
                            isolation="shared" if shared else "soft", gpu_model=model)

    def _expect_unchanged(self, before: Snapshot) -> None:
        assert self.alloc.snapshot() == before

    @rule(spec=requests, commit=st.booleans())
    def place(self, spec: tuple[Any, ...], commit: bool) -> None:
        req = self._request(spec)
        before = self.alloc.snapshot()
        try:
            placement = self.alloc.select(req)
        except Unschedulable:
            self._expect_unchanged(before)
            assert self.alloc.filter(req).nodes == {}  # the full scan agrees: nothing fits
            return
        self._expect_unchanged(before)  # select has no side effects
        feasible = self.alloc.filter(req).nodes
        assert set(placement.gpu_names) <= set(feasible[placement.node])
        assert placement.score == max(self.alloc.score(req, feasible).values())
        assert all(self.gpus[n].model == req.gpu_model for n in placement.gpu_names if req.gpu_model)
        try:
            self.alloc.assume(req, placement.gpu_names)
        except QuotaExceeded:
            # compute-percent TFLOPS are known, and checked against quota, once GPUs are chosen
            assert req.percent_request and not req.tflops_request
            self._expect_unchanged(before)
            return
        self.live[req.pod_uid] = (req, placement.gpu_names, True)
        if commit:
            self.alloc.commit(req.pod_uid)
            self.live[req.pod_uid] = (req, placement.gpu_names, False)

    @rule(spec=requests, data=st.data())
    def assume_arbitrary(self, spec: tuple[Any, ...], data: st.DataObject) -> None:
        """Assume on GPUs the test picks: must either succeed consistently or change nothing."""
        req = self._request(spec)
        names = data.draw(st.lists(st.sampled_from(GPU_NAMES), min_size=1, max_size=3, unique=True))
        before = self.alloc.snapshot()
        try:
            self.alloc.assume(req, names)
        except AllocatorError:
            self._expect_unchanged(before)
            return
        assert len(names) == req.count and len({self.gpus[n].node for n in names}) == 1
        self.live[req.pod_uid] = (req, tuple(names), True)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def commit(self, data: st.DataObject) -> None:
        uid = data.draw(st.sampled_from(sorted(self.live)))
        self.alloc.commit(uid)
        self.alloc.commit(uid)  # idempotent
        req, names, _ = self.live[uid]
        self.live[uid] = (req, names, False)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), op=st.sampled_from(("forget", "rollback", "release")))
    def undo(self, data: st.DataObject, op: str) -> None:
        uid = data.draw(st.sampled_from(sorted(self.live)))
        assumed = self.live[uid][2]
        changed = getattr(self.alloc, op)(uid)
        if op == "forget" and not assumed:
            assert changed is False
            return
        assert changed is True
        del self.live[uid]
        assert getattr(self.alloc, op)(uid) is False  # idempotent

    @precondition(lambda self: self.live)
    @rule(data=st.data(), t=st.sampled_from((0, 5_000, 60_000)), v=st.sampled_from((0, GIB, 7 * GIB)),
          dry_run=st.booleans())
    def adjust(self, data: st.DataObject, t: int, v: int, dry_run: bool) -> None:
        uid = data.draw(st.sampled_from(sorted(self.live)))
        _, names, assumed = self.live[uid]
        before = self.alloc.snapshot()
        try:
            new = self.alloc.adjust(uid, Resources(tflops=t, vram=v), Resources(tflops=t * 2, vram=v * 2),
                                    dry_run=dry_run)
        except AllocatorError:
            self._expect_unchanged(before)
            return
        if dry_run:
            self._expect_unchanged(before)
        else:
            self.live[uid] = (new, names, assumed)

    @rule(seconds=st.sampled_from((10.0, 60.0, 150.0)))
    def expire(self, seconds: float) -> None:
        self.clock.now += seconds
        expired = set(self.alloc.expire_assumed())
        assert all(self.live[uid][2] for uid in expired)
        for uid in expired:
            del self.live[uid]
        assert all(not assumed or uid not in expired for uid, (_, _, assumed) in self.live.items())

    @rule()
    def restart(self) -> None:
        """Rebuild from the committed allocations: the committed view must be identical."""
        fresh = GpuAllocator(max_workers_per_node=4, clock=self.clock, assume_ttl=100.0)
        fresh.set_quota("b", QUOTA)
        for info in self.gpus.values():
            fresh.upsert_gpu(info)
        committed = [(info.request, info.gpu_names)
                     for info in self.alloc.allocations(committed_only=True).values()]
        restorable = [(r, g) for r, g in committed if any(n in self.gpus for n in g)]
        assert fresh.restore(restorable) == []
        for name in self.gpus:
            assert views.gpu_status(fresh, name) == views.gpu_status(self.alloc, name)
            assert fresh.available(name, committed_only=True) == self.alloc.available(name, committed_only=True)
        # a compute-percent charge on a GPU that is gone cannot be known after a restart
        exact = not any(r.percent_request or r.percent_limit for r, g in committed
                        if any(n not in self.gpus for n in g))
        if exact and len(restorable) == len(committed):
            for ns in NAMESPACES:
                assert fresh.quota_usage(ns) == self.alloc.quota_usage(ns)
            assert {u: (a.node, a.gpu_names, a.charges) for u, a in fresh.allocations().items()} == {
                u: (a.node, a.gpu_names, a.charges)
                for u, a in self.alloc.allocations(committed_only=True).items()}
            assert fresh.node_workers() == {
                n: {u: w for u, w in ws.items() if u in fresh.allocations()}
                for n, ws in self.alloc.node_workers().items()
                if any(u in fresh.allocations() for u in ws)}
        # continue on the restored allocator, like a new leader
        self.alloc = fresh
        self.live = {uid: v for uid, v in self.live.items()
                     if not v[2] and uid in {r.pod_uid for r, _ in restorable}}

    # ---------------------------------------------------------------- invariants
    @invariant()
    def books_balance(self) -> None:
        allocs = self.alloc.allocations()
        assert set(allocs) == set(self.live), "allocator and model disagree on live pods"
        seen: dict[str, set[str]] = {}
        for uid, info in allocs.items():
            req, names, assumed = self.live[uid]
            assert info.gpu_names == names and info.assumed == assumed and info.request == req
            for name in names:
                seen.setdefault(name, set()).add(uid)
        snap = self.alloc.snapshot()
        for name, gpu_info in self.gpus.items():
            gpu = snap["gpus"][name]
            cap_t, cap_v = gpu_info.capacity_tflops, gpu_info.capacity_vram
            avail_t, avail_v = gpu["available"]
            assert 0 <= avail_t <= cap_t and 0 <= avail_v <= cap_v
            holders = seen.get(name, set())
            assert set(gpu["allocs"]) == holders
            shared = [u for u in holders if self.live[u][0].isolation == "shared"]
            if shared:
                assert (avail_t, avail_v) == (0, 0)
                continue
            used_t = sum(need_t(self.live[u][0], cap_t) for u in holders)
            used_v = sum(self.live[u][0].vram_request for u in holders)
            assert (avail_t, avail_v) == (max(0, cap_t - used_t), max(0, cap_v - used_v))

    @invariant()
    def quota_matches_allocations(self) -> None:
        for ns in NAMESPACES:
            for committed in (True, False):
                want = [0, 0, 0, 0, 0]
                for uid, (req, names, assumed) in self.live.items():
                    if req.namespace != ns or (committed and assumed):
                        continue
                    charges = self.alloc.allocation(uid).charges  # type: ignore[union-attr]
                    caps = [self.gpus[n].capacity_tflops if n in self.gpus else None for n in names]
                    for cap, charge in zip(caps, charges, strict=True):
                        if cap is not None:
                            assert charge == (need_t(req, cap), req.vram_request)
                        want[0] += charge[0]
                        want[1] += charge[1]
                    limits = self.alloc.allocation(uid).limits  # type: ignore[union-attr]
                    want[2] += sum(lim[0] for lim in limits)
                    want[3] += sum(lim[1] for lim in limits)
                    want[4] += 1
                got = self.alloc.quota_usage(ns, include_assumed=not committed).as_tuple()
                assert list(got) == want

    @invariant()
    def workers_per_node(self) -> None:
        workers = self.alloc.node_workers()
        counted = sum(len(w) for w in workers.values())
        assert counted == len(self.live)

    @invariant()
    def limits_on_a_gpu_are_its_committed_allocations_limits(self) -> None:
        infos = list(self.alloc.allocations(committed_only=True).values())
        for name in self.alloc.gpu_names():
            held = [limit for info in infos for gpu, limit in zip(info.gpu_names, info.limits, strict=True)
                    if gpu == name]
            assert self.alloc.committed_limits_on([name]) == (sum(t for t, _ in held), sum(v for _, v in held))


TestAllocatorMachine = AllocatorMachine.TestCase
TestAllocatorMachine.settings = settings(max_examples=120, stateful_step_count=40, deadline=None,
                                         suppress_health_check=[HealthCheck.too_slow])
