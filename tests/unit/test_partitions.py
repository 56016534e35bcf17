"""Unit tests of partitioned isolation (tfusion/allocator/partitions.py and its use by the allocator):
templates from the shipped NVIDIA ProviderConfig, template choice, MIG slot geometry, maxPartitions,
release freeing exactly the slot, recovery, and (hypothesis) no two live partitions overlapping."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.mutate_inputs import BARE, OWNER, ctx, tf_pod
from tfusion.allocator import AllocRequest, GpuAllocator, GpuInfo, InvalidAllocation, Resources, Unschedulable
from tfusion.allocator import partitions as pt
from tfusion.allocator.explain import gpu_label
from tfusion.allocator.framework import Framework
from tfusion.allocator.preemption import PreemptionSearch, VictimFacts
from tfusion.allocator.reasons import HOLDS_PARTITIONS, NO_SLOT, NO_TEMPLATES, PARTITIONS_FULL, UNKNOWN_TEMPLATE
from tfusion.api import annotations as tfa
from tfusion.api.accessors import Pod
from tfusion.controller.webhook.mutate import Denial, analyse

GIB = 1 << 30
A100 = "A100-SXM4-80GB"  # as the sim backend reports it; the catalog row says "NVIDIA A100-SXM4-80GB"
SHIPPED = Path(__file__).resolve().parents[2] / "deploy/overlays/defaults/providerconfig.yaml"


def shipped_catalog() -> pt.PartitionCatalog:
    spec = yaml.safe_load(SHIPPED.read_text())["spec"]
    catalog, problems = pt.catalog_from_providers([("nvidia-provider", spec)])
    assert problems == []
    return catalog


CATALOG = shipped_catalog()
MEMORY = {t.id: t.memory for m in CATALOG.models for t in m.templates}


def gpu(name: str = "g0", node: str = "n1", model: str = A100, **kw: Any) -> GpuInfo:
    return GpuInfo(name=name, node=node, pool="p", capacity_tflops=312_000, capacity_vram=80 * GIB, model=model, **kw)


_seq = 0


def part_req(template: str = "", *, tflops: float = 0, vram: float = 0, uid: str = "") -> AllocRequest:
    global _seq
    _seq += 1
    uid = uid or f"pod-{_seq}"
    return AllocRequest(pod_uid=uid, pod_name=uid, namespace="ns", pool="p", workload=("ns", uid),
                        tflops_request=int(tflops * 1000), vram_request=int(vram * GIB),
                        isolation="partitioned", partition_template=template)


def allocator(*gpus: GpuInfo) -> GpuAllocator:
    a = GpuAllocator()
    a.set_partition_catalog(CATALOG)
    for g in gpus or (gpu(),):
        a.upsert_gpu(g)
    return a


def place(a: GpuAllocator, r: AllocRequest) -> pt.Partition:
    a.allocate(r)
    info = a.allocation(r.pod_uid)
    assert info is not None and info.partitions and info.partitions[0] is not None
    return info.partitions[0]


# ---------------------------------------------------------------------- catalog and matching


def test_model_found_by_short_name_full_name_and_name_without_vendor() -> None:
    for name in ("A100_SXM_80G", "NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb", "  nvidia   A100-SXM4-80GB "):
        found = CATALOG.for_model(name)
        assert found is not None and found.model == "A100_SXM_80G", name
    assert CATALOG.for_model("L4") is None  # listed, but without templates
    assert CATALOG.for_model("") is None


@pytest.mark.parametrize("wanted", ["1g.10gb", "nv-80g-1g-10gb", "MIG-1g.10gb", "mig-1g-10gb", "1G_10GB", "1g 10gb"])
def test_partition_id_matches_id_or_name_as_the_original(wanted: str) -> None:
    model = CATALOG.for_model(A100)
    assert model is not None
    found = model.find(wanted)
    assert found is not None and found.id == "nv-80g-1g-10gb"


def test_unreadable_template_is_a_problem_naming_field_and_value() -> None:
    spec = {"vendor": "NVIDIA", "virtualizationTemplates": [{"id": "t", "computePercent": "lots"}],
            "hardwareMetadata": [{"model": "X", "partitionTemplateRefs": ["t"]}]}
    catalog, problems = pt.catalog_from_providers([("bad", spec)])
    assert catalog.models == ()
    assert len(problems) == 1 and "ProviderConfig bad" in problems[0] and "computePercent" in problems[0] \
        and "'lots'" in problems[0]


def test_reference_to_a_missing_template_is_a_problem() -> None:
    spec = {"vendor": "NVIDIA", "hardwareMetadata": [{"model": "X", "partitionTemplateRefs": ["nope"]}]}
    _, problems = pt.catalog_from_providers([("p", spec)])
    assert "partitionTemplateRefs" in problems[0] and "nope" in problems[0]


# ---------------------------------------------------------------------- template choice


def test_without_partition_id_the_smallest_fitting_template_by_the_original_score() -> None:
    a = allocator()
    assert place(a, part_req(vram=8)).template_id == "nv-80g-1g-10gb"
    assert place(a, part_req(vram=15)).template_id == "nv-80g-2g-20gb"
    # 40 GiB: 3g.40gb and 4g.40gb have the memory; 3g has less spare compute
    assert place(a, part_req(vram=40)).template_id == "nv-80g-3g-40gb"


def test_compute_request_moves_the_choice_up() -> None:
    a = allocator()
    # 100 TFLOPS of 312: 3g (42.9 % = 133.7 TFLOPS) is the smallest with enough compute
    assert place(a, part_req(tflops=100, vram=5)).template_id == "nv-80g-3g-40gb"


def test_usage_is_the_template_share_and_available_follows() -> None:
    a = allocator()
    place(a, part_req("1g.10gb"))
    t, v = a.available("g0")
    assert v == 70 * GIB
    assert t == 312_000 - 44_570  # 14.2857 % of 312 TFLOPS, to 2 decimals as the original rounds


def test_unknown_partition_id_names_the_model_templates() -> None:
    a = allocator()
    with pytest.raises(Unschedulable) as info:
        a.select(part_req("9g.90gb"))
    text = str(info.value.nodes["n1"][0])
    assert "unknown partition-id '9g.90gb'" in text and "1g.10gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb" in text
    slot = a.indexes.gpus["g0"]
    assert gpu_label(slot, part_req("9g.90gb")) == UNKNOWN_TEMPLATE


def test_model_without_templates_is_filtered_with_that_reason() -> None:
    a = allocator(gpu(model="NVIDIA L4"))
    slot = a.indexes.gpus["g0"]
    assert gpu_label(slot, part_req("1g.10gb")) == NO_TEMPLATES
    with pytest.raises(Unschedulable) as info:
        a.select(part_req("1g.10gb"))
    assert "no partition templates for this model" in str(info.value.nodes["n1"][0])


def test_device_without_partitioning_capability_is_filtered() -> None:
    a = allocator(gpu(virtualization=frozenset({"soft", "shared"})))
    with pytest.raises(Unschedulable) as info:
        a.select(part_req("1g.10gb"))
    assert info.value.stage == "GPUIsolationModeFilter"


def test_vendor_without_a_partition_strategy_is_refused() -> None:
    spec = yaml.safe_load(SHIPPED.read_text())["spec"]
    catalog, _ = pt.catalog_from_providers([("amd", {**spec, "vendor": "AMD"})])
    a = GpuAllocator()
    a.set_partition_catalog(catalog)
    a.upsert_gpu(gpu())
    with pytest.raises(Unschedulable) as info:
        a.select(part_req("1g.10gb"))
    assert "vendor AMD has no partition strategy" in str(info.value.nodes["n1"][0])


# ---------------------------------------------------------------------- slot geometry and limits


def test_three_small_slices_get_distinct_slots_packed_left() -> None:
    a = allocator()
    got = [place(a, part_req("1g.10gb")) for _ in range(3)]
    assert [(p.slot_start, p.slot_end) for p in got] == [(0, 1), (1, 2), (2, 3)]


def test_larger_slice_goes_where_its_slot_is_free_or_is_explained() -> None:
    a = allocator()
    for _ in range(3):
        place(a, part_req("1g.10gb"))
    big = place(a, part_req("3g.40gb"))
    assert (big.slot_start, big.slot_end) == (4, 8)
    with pytest.raises(Unschedulable) as info:
        a.select(part_req("3g.40gb"))
    assert "no free slot for 3g.40gb; free slots 3" in str(info.value.nodes["n1"][0])
    assert gpu_label(a.indexes.gpus["g0"], part_req("3g.40gb")) == NO_SLOT


def test_placement_keeps_the_largest_free_run() -> None:
    model = CATALOG.for_model(A100)
    assert model is not None
    one_g = model.find("1g.10gb")
    assert one_g is not None
    # slots 1 and 2 taken: 0 alone or 3..7 free; a 1g slice goes to 0, keeping the run of 5
    parts = {"a": pt.Partition("nv-80g-1g-10gb", 1, 2), "b": pt.Partition("nv-80g-1g-10gb", 2, 3)}
    spot = pt.place(model, one_g, parts)
    assert isinstance(spot, pt.Partition) and spot.slot_start == 0


def test_max_partitions_and_max_instances() -> None:
    a = allocator()
    for _ in range(7):
        place(a, part_req("1g.10gb"))
    slot = a.indexes.gpus["g0"]
    assert gpu_label(slot, part_req("1g.10gb")) == PARTITIONS_FULL
    b = allocator()
    for _ in range(2):
        place(b, part_req("3g.40gb"))
    with pytest.raises(Unschedulable) as info:
        b.select(part_req("3g.40gb"))
    assert "maxInstances 2" in str(info.value.nodes["n1"][0])


def test_release_frees_exactly_the_slot() -> None:
    a = allocator()
    reqs = [part_req("1g.10gb") for _ in range(4)]
    for r in reqs:
        place(a, r)
    assert a.release(reqs[1].pod_uid)
    slot = a.indexes.gpus["g0"]
    assert sorted((p.slot_start, p.slot_end) for p in slot.parts.values()) == [(0, 1), (2, 3), (3, 4)]
    assert place(a, part_req("1g.10gb")).slot_start == 1
    assert a.available("g0")[1] == 40 * GIB


def test_soft_pods_and_partitions_do_not_mix() -> None:
    a = allocator()
    soft = AllocRequest(pod_uid="soft", pod_name="soft", namespace="ns", pool="p", workload=("ns", "s"),
                        tflops_request=1000, vram_request=GIB)
    a.allocate(soft)
    with pytest.raises(Unschedulable) as info:
        a.select(part_req("1g.10gb"))
    assert "non-partitioned allocation" in str(info.value.nodes["n1"][0])


def test_restore_takes_slots_from_status_and_places_the_rest() -> None:
    a = allocator()
    r1, r2 = part_req("nv-80g-1g-10gb"), part_req("nv-80g-2g-20gb")
    reported = {(r1.pod_uid, "g0"): pt.Partition("nv-80g-1g-10gb", 5, 6)}
    assert a.restore([(r1, ["g0"]), (r2, ["g0"])], reported) == []
    slot = a.indexes.gpus["g0"]
    assert slot.parts[r1.pod_uid] == pt.Partition("nv-80g-1g-10gb", 5, 6)
    assert slot.parts[r2.pod_uid].slot_start == 0
    assert a.available("g0")[1] == 50 * GIB


def test_ascend_isolation_groups() -> None:
    spec = {"vendor": "Ascend", "virtualizationTemplates": [
        {"id": "vir01", "name": "vir01", "memoryGigabytes": 4, "computePercent": "12.5",
         "isolationGroupSharing": "shared", "maxPartitionsPerIsolationGroup": 2},
        {"id": "vir04", "name": "vir04", "memoryGigabytes": 16, "computePercent": "50"}],
        "hardwareMetadata": [{"model": "Ascend910", "maxIsolationGroups": 2,
                              "partitionTemplateRefs": ["vir01", "vir04"]}]}
    catalog, problems = pt.catalog_from_providers([("ascend", spec)])
    assert problems == []
    a = GpuAllocator()
    a.set_partition_catalog(catalog)
    a.upsert_gpu(GpuInfo(name="npu", node="n1", pool="p", capacity_tflops=320_000, capacity_vram=64 * GIB,
                         model="Ascend910", vendor="Ascend"))
    assert [place(a, part_req("vir01")).group for _ in range(3)] == [0, 0, 1]
    with pytest.raises(Unschedulable) as info:
        a.select(part_req("vir04"))
    assert "no free isolation group for vir04" in str(info.value.nodes["n1"][0])


# ---------------------------------------------------------------------- invariant


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.sampled_from(["1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]),
                          st.integers(0, 20)), max_size=40))
def test_no_two_live_partitions_overlap(ops: list[tuple[bool, str, int]]) -> None:
    a = allocator()
    live: list[str] = []
    for add, template, pick in ops:
        if add or not live:
            r = part_req(template)
            try:
                a.allocate(r)
            except Unschedulable:
                continue
            live.append(r.pod_uid)
        else:
            a.release(live.pop(pick % len(live)))
        slot = a.indexes.gpus["g0"]
        taken: list[int] = []
        for p in slot.parts.values():
            assert p.slot_start is not None and p.slot_end is not None
            taken.extend(range(p.slot_start, p.slot_end))
        assert len(taken) == len(set(taken)) and all(0 <= s < 8 for s in taken)
        assert set(slot.parts) == set(live) == set(slot.allocs)
        assert a.available("g0")[1] == 80 * GIB - sum(MEMORY[p.template_id] for p in slot.parts.values())


# ---------------------------------------------------------------------- the webhook's one rule


def test_webhook_refuses_partitioned_for_a_model_without_templates_naming_it() -> None:
    provider = yaml.safe_load(SHIPPED.read_text())
    notes = {**BARE, tfa.ISOLATION: "partitioned", tfa.PARTITION_ID: "1g.10gb"}
    with pytest.raises(Denial) as info:
        analyse(Pod(tf_pod({**notes, tfa.GPU_MODEL: "L4"})), ctx(provider_configs=[provider]), OWNER)
    assert "GPU model L4" in info.value.message and "no partition templates" in info.value.message
    assert "A100_SXM_80G" in info.value.message  # the models that have some
    plan = analyse(Pod(tf_pod({**notes, tfa.GPU_MODEL: "A100-SXM4-80GB"})), ctx(provider_configs=[provider]), OWNER)
    assert plan is not None


def test_a_full_node_remembered_as_full_takes_a_pod_again_once_a_slot_frees() -> None:
    a = allocator(gpu("g0"), gpu("g1"))
    held = [part_req("1g.10gb") for _ in range(14)]
    for r in held:
        a.allocate(r)
    with pytest.raises(Unschedulable):
        a.select(part_req("1g.10gb"))  # both GPUs at maxPartitions: the node is remembered as full
    freed = a.allocation(held[9].pod_uid)
    assert freed is not None
    a.release(held[9].pod_uid)
    assert a.select(part_req("1g.10gb")).gpu_names == freed.gpu_names


def test_preemption_frees_the_slots_a_partitioned_pod_needs() -> None:
    a = allocator()
    low = [replace(part_req("1g.10gb"), priority=0) for _ in range(7)]
    for r in low:
        a.allocate(r)
    critical = replace(part_req("2g.20gb"), priority=100_000)
    with pytest.raises(Unschedulable):
        a.select(critical)
    found = PreemptionSearch(a).best(critical, 100_000, lambda uid: VictimFacts())
    assert found is not None and found.node == "n1"
    # a 2g slice starts at 0, 2 or 4 and takes two slots: two 1g pods side by side must go
    assert len(found.victims) == 2
    for uid in found.victims:
        a.release(uid)
    assert a.select(critical).gpu_names == ("g0",)


def test_a_partition_is_not_resized_in_place() -> None:
    a = allocator()
    r = part_req("1g.10gb")
    a.allocate(r)
    with pytest.raises(InvalidAllocation, match="hardware partitions"):
        a.adjust(r.pod_uid, Resources(tflops=1000, vram=GIB), Resources(tflops=1000, vram=GIB))


def test_a_gpu_holding_partitions_takes_no_soft_pod_and_says_why() -> None:
    """Partitions and fractional shares never mix on one GPU, whichever comes first: a soft pod is
    refused on a GPU holding a partition (fast path, stage and explanation agree), and fits again once
    the partition is released."""
    a = allocator()
    held = part_req("1g.10gb")
    place(a, held)
    soft = replace(part_req(), isolation=tfa.ISOLATION_SOFT, tflops_request=1000, vram_request=GIB)
    fw = Framework(a)
    assert fw.feasible(soft, ["n1"]) == []
    status = fw.node_status(soft, "n1")
    assert not status.ok and status.reasons[0].message == HOLDS_PARTITIONS
    assert "only partitioned pods may share it" in (status.reasons[0].detail or "")
    a.release(held.pod_uid)
    assert fw.feasible(soft, ["n1"]) == ["n1"]
