"""The synthetic cluster the console's tests and benchmark use is a cluster tfusion could be in.

A view model tested on objects no controller would write proves little, and a benchmark on them
measures the wrong thing: these checks hold the helper to the schemas and to the invariants the
allocator keeps (a worker's GPUs are on its node, a GPU's free amount is its capacity less the
requests on it, totals add up).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import kubernetes_validate
import pytest

from tests.helpers.console_cluster import synthetic_cluster
from tfusion.api import annotations as tfa
from tfusion.api import crds, schema
from tfusion.api.accessors import Gpu, Node, Pod
from tfusion.api.quantity import Quantity
from tfusion.console.cache import RESOURCES, StaticCluster
from tfusion.kube import resources as r
from tfusion.kube.resources import ApiResource

Objects = dict[ApiResource, list[dict[str, Any]]]
SMALL = {"nodes": 12, "gpus_per_node": 4, "pods": 90, "pending": 6, "namespaces": 3, "pools": 2}


@pytest.fixture(scope="module")
def small() -> Objects:
    return synthetic_cluster(**SMALL, now=1_760_000_000)


def _q(value: object) -> Quantity:
    assert isinstance(value, str), value
    return Quantity.parse(value)


def _bound(objects: Objects) -> list[Pod]:
    return [Pod(p) for p in objects[r.PODS] if Pod(p).node_name]


def test_every_resource_the_console_reads_is_there(small: Objects) -> None:
    assert set(small) == set(RESOURCES)
    assert StaticCluster(small).list(r.GPUPOOLS)


def test_counts_follow_the_arguments(small: Objects) -> None:
    assert len(small[r.NODES]) == len(small[r.GPUNODES]) == SMALL["nodes"]
    assert len(small[r.GPUS]) == SMALL["nodes"] * SMALL["gpus_per_node"]
    assert len(_bound(small)) == SMALL["pods"]
    assert len(small[r.PODS]) - len(_bound(small)) == SMALL["pending"]
    assert len(small[r.GPUPOOLS]) == SMALL["pools"]
    assert len({p["metadata"]["namespace"] for p in small[r.PODS]}) == SMALL["namespaces"]
    assert len(small[r.GPURESOURCEQUOTAS]) == SMALL["namespaces"]


def test_every_bound_pod_holds_gpus_of_its_own_node(small: Objects) -> None:
    gpus = {g["metadata"]["name"]: Gpu(g) for g in small[r.GPUS]}
    for pod in _bound(small):
        assert pod.holds_gpus, pod.name
        names = tfa.parse_gpu_ids(pod.meta.annotations[tfa.GPU_IDS])
        assert len(names) == tfa.parse_gpu_count(pod.meta.annotations[tfa.GPU_COUNT])
        for name in names:
            assert name in gpus, f"{pod.name} names GPU {name}, which does not exist"
            assert gpus[name].node_selector[tfa.HOSTNAME_LABEL] == pod.node_name
            assert gpus[name].meta.label(tfa.MANAGED_BY) == pod.node_name
            assert gpus[name].meta.label(tfa.GPU_POOL) == pod.meta.annotations[tfa.GPU_POOL]


def test_gpu_available_is_capacity_less_the_requests_on_it(small: Objects) -> None:
    requested: dict[str, list[Pod]] = defaultdict(list)
    for pod in _bound(small):
        for name in tfa.parse_gpu_ids(pod.meta.annotations[tfa.GPU_IDS]):
            requested[name].append(pod)
    for raw in small[r.GPUS]:
        gpu = Gpu(raw)
        pods = requested[gpu.name]
        used_t = sum(_q(p.meta.annotations[tfa.TFLOPS_REQUEST]).milli_value() for p in pods)
        used_v = sum(_q(p.meta.annotations[tfa.VRAM_REQUEST]).value() for p in pods)
        assert _q(gpu.available["tflops"]).milli_value() == _q(gpu.capacity["tflops"]).milli_value() - used_t >= 0
        assert _q(gpu.available["vram"]).value() == _q(gpu.capacity["vram"]).value() - used_v >= 0
        listed = sorted(p["name"] for app in gpu.status["runningApps"] for p in app["pods"])
        assert listed == sorted(p.name for p in pods)


def test_every_pool_referenced_exists_and_sums_its_gpus(small: Objects) -> None:
    pools = {p["metadata"]["name"]: p for p in small[r.GPUPOOLS]}
    referenced = {p["metadata"]["annotations"][tfa.GPU_POOL] for p in small[r.PODS]}
    referenced |= {w["spec"]["poolName"] for w in small[r.TENSORFUSIONWORKLOADS]}
    referenced |= {g["metadata"]["labels"][tfa.MANAGED_BY] for g in small[r.GPUNODES]}
    assert referenced <= set(pools)
    ready = {n["metadata"]["name"]: Node(n).ready for n in small[r.NODES]}
    for name, pool in pools.items():
        mine = [Gpu(g) for g in small[r.GPUS] if g["metadata"]["labels"][tfa.GPU_POOL] == name]
        status = pool["status"]
        assert status["totalGPUs"] == len(mine)
        assert _q(status["totalTFlops"]).milli_value() == sum(_q(g.capacity["tflops"]).milli_value() for g in mine)
        assert _q(status["availableVRAM"]).value() == sum(_q(g.available["vram"]).value() for g in mine)
        nodes = {g.node_selector[tfa.HOSTNAME_LABEL] for g in mine}
        assert status["readyNodes"] == sum(1 for n in nodes if ready[n])
        assert status["readyNodes"] + status["notReadyNodes"] == status["totalNodes"] == len(nodes)


def test_workloads_and_quotas_count_their_workers(small: Objects) -> None:
    bound = _bound(small)
    per_workload = Counter((p.namespace, p.meta.labels[tfa.WORKLOAD]) for p in bound)
    for w in small[r.TENSORFUSIONWORKLOADS]:
        meta = w["metadata"]
        assert w["status"]["workerCount"] == per_workload[(meta["namespace"], meta["name"])]
    per_namespace = Counter(p.namespace for p in bound)
    for quota in small[r.GPURESOURCEQUOTAS]:
        assert quota["status"]["used"]["workers"] == per_namespace[quota["metadata"]["namespace"]]
        requested = sum(_q(p.meta.annotations[tfa.TFLOPS_REQUEST]).milli_value() * len(p.meta.annotations[tfa.GPU_IDS]
                                                                                      .split(","))
                        for p in bound if p.namespace == quota["metadata"]["namespace"])
        assert _q(quota["status"]["used"]["requests"]["tflops"]).milli_value() == requested
    # the quotas page has both kinds to show: a namespace past its alert threshold and one well within
    ready = Counter(q["status"]["conditions"][0]["status"] for q in small[r.GPURESOURCEQUOTAS])
    assert ready["False"] >= 1 and ready["True"] >= 1, ready


def test_pending_pods_say_why_the_scheduler_left_them(small: Objects) -> None:
    pending = [Pod(p) for p in small[r.PODS] if not Pod(p).node_name]
    for pod in pending:
        cond = pod.condition("PodScheduled")
        assert cond is not None and cond["status"] == "False" and cond["reason"] == "Unschedulable"
        assert tfa.GPU_IDS not in pod.meta.annotations and pod.phase == "Pending"
    warned = {e["involvedObject"]["name"] for e in small[r.EVENTS] if e["type"] == "Warning"}
    assert warned == {p.name for p in pending}


def test_custom_resources_match_their_crd_schemas(small: Objects) -> None:
    for resource, objects in small.items():
        if not resource.group:
            continue
        wanted = crds.openapi_schema_view(resource.kind)
        for obj in objects:
            assert obj["kind"] == resource.kind
            assert schema.unknown_fields(wanted, obj) == [], obj["metadata"]["name"]
            assert schema.validate(wanted, obj) == [], obj["metadata"]["name"]


@pytest.mark.parametrize("resource", [r.NODES, r.PODS, r.EVENTS], ids=lambda res: res.kind)
def test_core_objects_match_the_kubernetes_schemas(small: Objects, resource: ApiResource) -> None:
    # strict: an unknown field is an error, so a misspelt key cannot pass
    for obj in small[resource][:5] + small[resource][-5:]:
        kubernetes_validate.validate(obj, "1.32", strict=True)


def test_the_same_seed_gives_the_same_cluster() -> None:
    first = synthetic_cluster(**SMALL, seed=3, now=1_760_000_000)
    assert first == synthetic_cluster(**SMALL, seed=3, now=1_760_000_000)
    assert first != synthetic_cluster(**SMALL, seed=4, now=1_760_000_000)


def test_the_default_size_is_the_issue_s_scale() -> None:
    objects = synthetic_cluster(now=1_760_000_000)
    assert (len(objects[r.NODES]), len(objects[r.GPUS]), len(_bound(objects))) == (1000, 4000, 10000)
    assert sum(not Node(n).ready for n in objects[r.NODES]) == 1000 // 97


@pytest.mark.parametrize(("field", "value"), [("nodes", 0), ("pools", 0), ("pods", -1)])
def test_bad_sizes_are_refused_by_name(field: str, value: int) -> None:
    with pytest.raises(ValueError, match=f"{field}={value} is not allowed"):
        synthetic_cluster(**{**SMALL, field: value})
