"""The failure path's short road (explain.py `_judge_plain`) gives exactly the GPU-by-GPU answer,
`Framework.feasible` agrees with `filter`, and every Reason the framework returns has a `detail`
sentence (with the numbers where it has numbers)."""

from __future__ import annotations

import random
import re
from dataclasses import replace

from tfusion.allocator import AllocRequest, Framework, GpuAllocator, GpuInfo, QuotaSpec, Reason, Status
from tfusion.allocator import explain as ex
from tfusion.allocator import framework as fwk
from tfusion.api import annotations as tfa

GIB = 1 << 30
MODELS = (("H100", 989_000, 80), ("L40S", 450_000, 48))
#: what makes a node's GPUs not "plain" (the long road then)
ODDITIES: tuple[dict[str, object], ...] = (
    {"phase": "Pending"}, {"isolation_mode": "hard"}, {"used_by": "nvidia"}, {"vendor": "AMD"},
    {"isolation_policy": "Dynamic"}, {"virtualization": frozenset({"soft", "shared"})})


def random_cluster(rng: random.Random, nodes: int = 30) -> GpuAllocator:
    alloc = GpuAllocator(max_workers_per_node=rng.choice((3, 256)))
    for n in range(nodes):
        model, tflops, vram = MODELS[n % 2]
        odd = rng.random()
        for g in range(rng.randint(1, 6)):
            extra: dict[str, object] = {}
            if odd < 0.15 and g == 0:
                extra = rng.choice(ODDITIES)
            elif odd < 0.2:
                extra = {"capacity_tflops": tflops // 2}
            fields: dict[str, object] = {"capacity_tflops": tflops, **extra}
            alloc.upsert_gpu(GpuInfo(name=f"n{n:02d}-g{g}", node=f"n{n:02d}", pool="pool", model=model, index=g,
                                     capacity_vram=vram * GIB, **fields))  # type: ignore[arg-type]
    fw = Framework(alloc)
    for i in range(nodes * 4):  # load it unevenly
        shared = rng.random() < 0.05
        request = request_of(f"load-{i}", rng, isolation=tfa.ISOLATION_SHARED if shared else "soft")
        nodes_ok = fw.feasible(request, alloc.nodes())
        if nodes_ok:
            placement, _ = fw.reserve(request, rng.choice(nodes_ok))
            if placement is not None and rng.random() < 0.7:
                fw.pre_bind(request.pod_uid)
    return alloc


def request_of(uid: str, rng: random.Random, **extra: object) -> AllocRequest:
    percent = rng.random() < 0.2
    fields: dict[str, object] = dict(
        pod_uid=uid, pod_name=uid, namespace="ml", pool="pool", workload=("ml", uid),
        tflops_request=0 if percent else rng.choice((10, 100, 300, 500, 1200)) * 1000,
        percent_request=rng.choice((10, 50, 90)) * 1000 if percent else 0,
        vram_request=rng.choice((2, 8, 20, 45, 90)) * GIB, count=rng.choice((1, 1, 2, 4, 7)),
        gpu_model=rng.choice(("", "", "H100", "L40S")), vendor=rng.choice(("", "", "NVIDIA", "AMD")),
        isolation=rng.choice(("soft", "soft", "hard", "shared")))
    fields.update(extra)
    return AllocRequest(**fields)  # type: ignore[arg-type]


def test_the_short_road_judges_every_node_as_the_long_one() -> None:
    rng = random.Random(11)
    compared = short = 0
    for _round in range(8):
        alloc = random_cluster(rng)
        for k in range(40):
            request = request_of(f"probe-{k}", rng)
            alloc.indexes.explained.clear()
            assert ex.node_statuses(alloc, request, alloc.nodes()) == \
                {n: ex._judge_node_slow(alloc, request, n).status for n in alloc.nodes()}
            for name in alloc.nodes():
                slow = ex._judge_node_slow(alloc, request, name)
                fast = ex._judge_node(alloc, request, name)
                assert fast.status == slow.status, (name, request)
                assert (fast.fitting, fast.loaded) == (slow.fitting, slow.loaded), (name, request)
                node = alloc.indexes.nodes[name]
                key = (request.pool, request.gpu_model)
                short += key in node.groups and ex._plain_group(alloc, node, key) is not None
                compared += 1
    assert compared > 5000 and short > compared // 3  # the short road was taken often


def test_plain_facts_follow_a_change_of_the_reported_gpu() -> None:
    alloc = GpuAllocator()
    info = GpuInfo(name="g", node="n", pool="pool", capacity_tflops=100_000, capacity_vram=40 * GIB)
    alloc.upsert_gpu(info)
    node, key = alloc.indexes.nodes["n"], ("pool", "")
    assert ex._plain_group(alloc, node, key) == ("NVIDIA", 100_000)
    alloc.upsert_gpu(replace(info, phase="Pending"))
    assert ex._plain_group(alloc, node, key) is None
    request = AllocRequest(pod_uid="p", pod_name="p", namespace="ml", pool="pool", workload=("ml", "p"),
                           vram_request=GIB)
    assert Framework(alloc).node_status(request, "n").reasons[0].message == fwk.NOT_RUNNING


def test_feasible_is_filters_success_set() -> None:
    rng = random.Random(3)
    alloc = random_cluster(rng)
    fw = Framework(alloc)
    names = [*alloc.nodes(), "no-such-node"]
    for k in range(50):
        request = request_of(f"q-{k}", rng)
        expected = [n for n, s in fw.filter(request, names).items() if s.ok]
        assert fw.feasible(request, names) == expected
        assert sorted(fw.feasible(request, set(names))) == sorted(expected)
        assert sorted(fw.feasible(request, iter(names))) == sorted(expected)
        assert fw.split(request, names)[0] == expected


def _every_reason(fw: Framework, alloc: GpuAllocator, rng: random.Random) -> list[tuple[str, Reason]]:
    names = [*alloc.nodes(), "no-such-node"]
    found: list[tuple[str, Status]] = []
    for k in range(40):
        request = request_of(f"r-{k}", rng, pod_index=rng.choice((0, 1, 2)))
        found.append(("pre_filter", fw.pre_filter(request)))
        found.extend(("filter", s) for s in fw.filter(request, names).values())
        found.extend(("filter explained", s) for s in fw.filter(request, names, explain=True).values())
        found.extend(("split", s) for s in fw.split(request, names)[1].values())
        expl = fw.explain(request, names)
        found.extend(("explain", s) for s in expl.nodes.values())
        for name in names:
            placement, status = fw.reserve(request, name)
            found.append(("reserve", status))
            if placement is not None:
                found.append(("pre_bind", fw.pre_bind(request.pod_uid)))
                found.append(("pre_bind twice", fw.pre_bind(request.pod_uid)))
                found.append(("reserve twice", fw.reserve(request, name)[1]))
                break
    found.append(("pre_bind unknown", fw.pre_bind("nobody")))
    small = AllocRequest(pod_uid="small-1", pod_name="small-1", namespace="free", pool="pool",
                         workload=("free", "small-1"), tflops_request=1000, vram_request=GIB, pod_index=9)
    found.append(("pre_filter no pool", fw.pre_filter(replace(small, pool="nope"))))
    host = fw.feasible(small, names)[0]
    assert fw.reserve(small, host)[0] is not None
    twin = replace(small, pod_uid="small-2", pod_name="small-2")
    found.append(("filter index", fw.filter(twin, [host])[host]))
    found.append(("reserve index", fw.reserve(twin, host)[1]))
    return [(where, reason) for where, status in found for reason in status.reasons]


def test_every_reason_the_framework_returns_has_a_detail_with_its_numbers() -> None:
    rng = random.Random(5)
    alloc = random_cluster(rng)
    alloc.set_quota("ml", QuotaSpec(requests_vram=100 * GIB, single_max_gpu_count=4))
    fw = Framework(alloc)
    reasons = _every_reason(fw, alloc, rng)
    messages = {r.message for _, r in reasons}
    assert {fwk.NO_FIT, fwk.VRAM_TOO_SMALL, fwk.QUOTA_EXCEEDED, fwk.INDEX_BUSY, fwk.NO_POOL_GPUS} <= messages
    for where, reason in reasons:
        assert reason.detail, (where, reason)
        if reason.requested is not None or reason.available is not None:
            assert re.search(r"\d", reason.detail), (where, reason)
    no_fit = next(r for _, r in reasons if r.message == fwk.NO_FIT)
    assert re.fullmatch(r"no \d+ GPU\(s\) on the node have .+ and .+ VRAM free each \(pool pool.*\)", no_fit.detail)


def test_reason_is_a_value() -> None:
    a = Reason(fwk.VRAM_TOO_SMALL, "ResourceFilter", "n", "g", "vram", 8 * GIB, 6 * GIB, gpus=2)
    b = Reason(fwk.VRAM_TOO_SMALL, "ResourceFilter", "n", "g", "vram", 8 * GIB, 6 * GIB, gpus=2)
    assert a == b and hash(a) == hash(b) and a != a.replace(available=5 * GIB)
    assert a.detail == a.text() == \
        "g: VRAM available 6Gi < requested 8Gi (the most free of the node's 2 GPUs short of VRAM)"
    assert Reason("m", "S", detail="given").detail == "given"
    assert "available=6442450944" in repr(a)
    assert Status(fwk.Code.UNSCHEDULABLE, "Filter", (a,)) == Status(fwk.Code.UNSCHEDULABLE, "Filter", (b,))
    assert Status(fwk.Code.UNSCHEDULABLE, "Filter", (a,)).with_stage("Reserve").stage == "Reserve"


def test_feasible_nodes_prunes_by_the_node_maxima_exactly() -> None:
    """The per-node maxima only rule out nodes where no GPU could fit: the kept sets equal a
    GPU-by-GPU judgement of every node, for new shapes and after changes (releases, new load)."""
    rng = random.Random(21)
    for _round in range(6):
        alloc = random_cluster(rng)
        fw = Framework(alloc)
        probes = [request_of(f"f-{k}", rng) for k in range(30)]
        for step in range(4):
            for request in probes:
                key = (request.pool, request.gpu_model)
                fit = alloc.indexes.node_fit
                truth = {n for n, node in alloc.indexes.nodes.items() if fit(node, key, request) is not None}
                assert set(alloc.feasible_nodes(request)) == truth, (step, request)
            live = sorted(alloc.allocations())
            for uid in rng.sample(live, min(len(live), 10)):
                alloc.release(uid)
            for k in range(10):
                extra = request_of(f"more-{step}-{k}", rng, isolation="soft", count=1)
                nodes = fw.feasible(extra, alloc.nodes())
                if nodes:
                    fw.reserve(extra, rng.choice(nodes))
