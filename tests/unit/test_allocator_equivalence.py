"""The indexed allocator places exactly what the straightforward reference places, pod by pod, on both
the built-in path (`select`) and the extender path (Framework filter/score/reserve over candidate nodes)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from tests.helpers.allocator_reference import ReferenceAllocator
from tfusion.allocator import AllocRequest, Framework, GpuAllocator, GpuInfo, PoolConfig, Unschedulable

GIB = 1 << 30
MODELS = (("B200", 2250, 141), ("H100", 989, 80), ("L40S", 450, 48), ("A100", 312, 40))
SHAPES = ((20, 4, 1), (40, 8, 1), (100, 16, 1), (30, 4, 2), (200, 32, 2))


def sample_cluster(seed: int) -> list[GpuInfo]:
    """50 nodes of 2..8 GPUs; a few Pending, used by the device plugin, or in another pool."""
    rng = random.Random(seed)
    gpus = []
    for n in range(50):
        model, tflops, vram = MODELS[n % 4]
        for i in range(rng.randint(2, 8)):
            roll = rng.random()
            gpus.append(GpuInfo(
                name=f"gpu-{n:02d}-{i}", node=f"node-{n:02d}", pool="other" if roll < 0.03 else "pool",
                model=model, vendor="AMD" if n % 17 == 5 else "NVIDIA", index=i,
                phase="Pending" if 0.03 <= roll < 0.08 else "Running",
                used_by="nvidia-device-plugin" if 0.08 <= roll < 0.1 else "tensor-fusion",
                isolation_mode="hard" if 0.1 <= roll < 0.12 else "",
                capacity_tflops=tflops * 1000, capacity_vram=vram * GIB))
    return gpus


def request(i: int, rng: random.Random) -> AllocRequest:
    tflops, vram, count = SHAPES[i % len(SHAPES)]
    extra: dict[str, object] = {}
    roll = rng.random()
    if roll < 0.05:
        extra["gpu_model"] = rng.choice(MODELS)[0]
    elif roll < 0.08:
        extra.update(tflops_request=0, percent_request=rng.choice((10_000, 25_000, 50_000)))
    elif roll < 0.10:
        extra["isolation"] = "shared"
    elif roll < 0.12:
        extra["indices"] = (rng.randint(0, 3),)
        count = 1
    elif roll < 0.13:
        extra["vendor"] = "AMD"
    elif roll < 0.14:
        extra["isolation"] = "hard"
    base = dict(pod_uid=f"uid-{i}", pod_name=f"pod-{i}", namespace="ns", pool="pool", workload=("ns", "w"),
                tflops_request=tflops * 1000, tflops_limit=tflops * 1000, vram_request=vram * GIB,
                vram_limit=vram * GIB, count=count)
    base.update(extra)
    return AllocRequest(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["NodeCompactGPULowLoad", "CompactFirst", "LowLoadFirst"])
def test_fast_allocator_matches_reference_pod_by_pod(mode: str) -> None:
    rng = random.Random(42)
    fast = GpuAllocator(max_workers_per_node=12)
    fast.set_pool_config("pool", PoolConfig(placement_mode=mode))
    ref = ReferenceAllocator(mode=mode, max_workers=12)
    for info in sample_cluster(7):
        fast.upsert_gpu(info)
        ref.add_gpu(info)
    live: list[str] = []
    placed = failed = 0
    for i in range(1500):
        req = request(i, rng)
        expected = ref.allocate(req)
        try:
            placement = fast.allocate(req)
            got: tuple[str, tuple[str, ...]] | None = (placement.node, placement.gpu_names)
        except Unschedulable:
            got = None
        assert got == expected, f"pod {i} {req}"
        if got is None:
            failed += 1
        else:
            placed += 1
            live.append(req.pod_uid)
        if i % 5 == 4 and live:  # churn: release a random live pod
            uid = live.pop(rng.randrange(len(live)))
            fast.release(uid)
            ref.release(uid)
    assert placed > 500 and failed > 50  # the run exercised both outcomes
    snap = fast.snapshot()["gpus"]
    for name, gpu in ref.gpus.items():
        assert snap[name]["available"] == (gpu.avail_t, gpu.avail_v), name


def test_filter_chain_agrees_with_fast_path() -> None:
    """`filter()` (the explaining path) finds a node feasible exactly when the fast check does."""
    rng = random.Random(3)
    fast = GpuAllocator()
    for info in sample_cluster(11):
        fast.upsert_gpu(info)
    for i in range(400):
        req = request(i, rng)
        result = fast.filter(req, explain=True)
        try:
            placement = fast.select(req)
        except Unschedulable:
            assert result.nodes == {}
            continue
        assert placement.node in result.nodes
        assert set(placement.gpu_names) <= set(result.nodes[placement.node])
        best = max(fast.score(req, result.nodes).items(), key=lambda kv: (kv[1], [-ord(c) for c in kv[0]]))
        assert placement.score == best[1]
        fast.assume(req, placement.gpu_names)
        fast.commit(req.pod_uid)


@pytest.mark.parametrize("mode", ["NodeCompactGPULowLoad", "CompactFirst", "LowLoadFirst"])
def test_extender_path_matches_reference_pod_by_pod(mode: str) -> None:
    """Framework.split/filter over every node name, score, best, reserve, pre_bind: the feasible set
    and the placement are the reference's, under churn; explained statuses agree with the cheap ones."""
    rng = random.Random(5)
    fast = GpuAllocator(max_workers_per_node=12)
    fast.set_pool_config("pool", PoolConfig(placement_mode=mode))
    fw = Framework(fast)
    ref = ReferenceAllocator(mode=mode, max_workers=12)
    gpus = sample_cluster(9)
    for info in gpus:
        fast.upsert_gpu(info)
        ref.add_gpu(info)
    names = sorted({g.node for g in gpus} | {"node-without-gpus"})
    live: list[str] = []
    placed = failed = 0
    for i in range(1500):
        req = request(i, rng)
        wanted = ref.feasible(req)
        feasible, rejected = fw.split(req, names)
        assert set(feasible) == wanted, f"pod {i} {req}"
        assert set(rejected) == set(names) - wanted
        if i % 25 == 0:
            explained = fw.filter(req, names, explain=True)
            assert {n for n, s in explained.items() if s.ok} == wanted
            assert all(s.reasons for s in explained.values() if not s.ok)
        expected = ref.allocate(req)
        got: tuple[str, tuple[str, ...]] | None = None
        if feasible and fw.pre_filter(req).ok:
            scores = fw.score(req, feasible)
            best = max(scores, key=scores.__getitem__)  # first best in name order
            placement, status = fw.reserve(req, best)
            assert status.ok and placement is not None and fw.pre_bind(req.pod_uid).ok
            got = (placement.node, placement.gpu_names)
        assert got == expected, f"pod {i} {req}"
        if got is None:
            failed += 1
        else:
            placed += 1
            live.append(req.pod_uid)
        if i % 5 == 4 and live:
            uid = live.pop(rng.randrange(len(live)))
            fast.release(uid)
            ref.release(uid)
        if i % 300 == 299:  # a GPU goes Pending and comes back: the cached sets must follow
            info = gpus[rng.randrange(len(gpus))]
            if not fast.snapshot()["gpus"][info.name]["allocs"]:
                fast.upsert_gpu(replace(info, phase="Pending"))
                ref.gpus[info.name].info = replace(info, phase="Pending")
    assert placed > 500 and failed > 50
