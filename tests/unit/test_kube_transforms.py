"""The informer transforms (kube/transforms.py): what they drop, that the controller's readers of a
pod, a node, a GPU and a workload answer the same on the transformed object, that objects share
strings and that sibling informers share objects."""

from __future__ import annotations

import copy
import sys
import tracemalloc
from typing import Any

import orjson
import pytest

from tfusion.allocator.request import pod_index_of, request_from_pod
from tfusion.api import annotations as tfa
from tfusion.api.accessors import Body, Gpu, Meta, Node, Pod, Workload
from tfusion.controller.reconcilers.workers import template_hash
from tfusion.controller.scheduling.nodes import allocatable, extended_requests, is_pending, pod_demand, static_check
from tfusion.controller.webhook.remote import connection_of
from tfusion.kube import resources as r
from tfusion.kube.informer import node_name_index
from tfusion.kube.transforms import (
    LEVELS,
    PRUNED,
    SHARED,
    SHARED_PATHS,
    Pruner,
    SharedTable,
    intern_strings,
    pruned_decoder,
    strip_managed_fields,
    transform_for,
)


def bound_worker() -> dict[str, Any]:
    """A worker pod as tfusion's webhook and scheduler leave it (the shape benchmarks/scale.py clones)."""
    env = [{"name": "LD_PRELOAD", "value": "/tensor-fusion-limiter/libcuda_limiter.so"},
           {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
           {"name": "TENSOR_FUSION_CONNECTION_NAME", "value": "conn-1"}]
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": "d-00001-003", "namespace": "team-01", "uid": "u-1", "resourceVersion": "42",
            "labels": {tfa.ENABLED: "true", tfa.COMPONENT: "worker", tfa.WORKLOAD: "d-00001", tfa.GPU_POOL: "pool-0"},
            "annotations": {tfa.GPU_POOL: "pool-0", tfa.TFLOPS_REQUEST: "10", tfa.TFLOPS_LIMIT: "10",
                            tfa.VRAM_REQUEST: "8Gi", tfa.VRAM_LIMIT: "8Gi", tfa.QOS: "high", tfa.GPU_COUNT: "1",
                            tfa.ISOLATION: "soft", tfa.GPU_IDS: "gpu-00001", tfa.INDEX: "7"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "d-00001-rs", "uid": "rs-1",
                                 "controller": True}],
            "finalizers": ["tensor-fusion.ai/finalizer"],
            "managedFields": [{"manager": "tfusion", "fieldsV1": {"f:spec": {}}}]},
        "spec": {
            "nodeName": "node-00001", "terminationGracePeriodSeconds": 30,
            "schedulerName": "tensor-fusion-scheduler", "priority": 10000,
            "priorityClassName": "tensor-fusion-high", "preemptionPolicy": "PreemptLowerPriority",
            "nodeSelector": {"kubernetes.io/os": "linux"},
            "tolerations": [{"key": tfa.USED_BY, "operator": "Equal", "value": "tensor-fusion",
                             "effect": "PreferNoSchedule"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["pool-0"]}]}]}}},
            "containers": [{"name": "main", "image": "app", "env": env, "imagePullPolicy": "Always",
                            "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
                            "volumeMounts": [{"name": "tf-data", "mountPath": "/run/tensor-fusion/shm"}],
                            "resources": {"requests": {"cpu": "100m", "memory": "128Mi",
                                                       "tensor-fusion.ai/index_0": "1", "example.com/fpga": "2"},
                                          "limits": {"tensor-fusion.ai/index_0": "1"}}}],
            "initContainers": [{"name": "init", "image": "tfusion", "command": ["cp", "a", "b"],
                                "resources": {"requests": {"cpu": "20m", "memory": "256Mi"}}}],
            "volumes": [{"name": "tf-data", "hostPath": {"path": "/run/tensor-fusion"}}],
            "dnsPolicy": "ClusterFirst", "enableServiceLinks": True, "restartPolicy": "Always",
            "overhead": {"cpu": "10m"}},
        "status": {"phase": "Running", "hostIP": "10.0.0.1", "podIP": "10.1.0.1",
                   "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                   "containerStatuses": [{"name": "main", "ready": True, "restartCount": 0, "image": "app",
                                          "imageID": "sha256:1", "containerID": "containerd://1",
                                          "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}}


def a_node() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "node-00001", "resourceVersion": "3", "labels": {"pool": "pool-0"}},
            "spec": {"taints": [{"key": "gpu", "value": "yes", "effect": "PreferNoSchedule"}]},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110", "example.com/fpga": "4"},
                       "capacity": {"cpu": "64", "memory": "512Gi", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True"}],
                       "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
                       "images": [{"names": [f"registry/image-{i}:v1"], "sizeBytes": 1000} for i in range(50)],
                       "volumesInUse": ["kubernetes.io/csi/x"]}}


def test_managed_fields_are_stripped_without_editing_the_original() -> None:
    pod = bound_worker()
    stripped = strip_managed_fields(pod)
    assert "managedFields" not in stripped["metadata"]
    assert "managedFields" in pod["metadata"]


def a_gpu(n: int = 1) -> dict[str, Any]:
    return {"apiVersion": "tensor-fusion.ai/v1", "kind": "GPU",
            "metadata": {"name": f"gpu-{n:05d}", "resourceVersion": "9", "labels": {
                tfa.GPU_POOL: "pool-0", tfa.MANAGED_BY: "node-00001"}, "managedFields": [{}]},
            "status": {"phase": "Running", "uuid": f"GPU-{n}", "gpuModel": "H100", "usedBy": "tensor-fusion",
                       "capacity": {"tflops": "100", "vram": "80Gi"}, "available": {"tflops": "90", "vram": "72Gi"},
                       "nodeSelector": {"kubernetes.io/hostname": "node-00001"},
                       "runningApps": [{"name": "w", "namespace": "ns", "count": 1}]}}


def decoded_page(resource: r.ApiResource, objects: list[dict[str, Any]]) -> dict[str, Any]:
    decode = pruned_decoder(resource, transform_for(resource))
    assert decode is not None
    body = {"kind": "List", "apiVersion": "v1", "metadata": {"resourceVersion": "9", "continue": "abc"},
            "items": objects}
    page: dict[str, Any] = decode.page(orjson.dumps(body))
    return page


@pytest.mark.parametrize("objects", [
    pytest.param([bound_worker(), {**bound_worker(), "metadata": {"name": "bare"}}, {"spec": {}}], id="pods"),
    pytest.param([{**bound_worker(), "spec": {**bound_worker()["spec"], "aFieldOfKubeTwo": 1}}], id="unknown-field"),
    pytest.param([{**bound_worker(), "status": None}, {**bound_worker(), "spec": {"containers": None}}], id="nulls"),
])
def test_a_page_decoded_and_pruned_at_once_holds_each_item_pruned(objects: list[dict[str, Any]]) -> None:
    """`pruned_decoder` prunes while decoding (dropped fields unbuilt, shared subtrees looked up by
    their JSON text): its items equal the transform of each item decoded whole, with the list's
    metadata kept; an item with a field the decoder does not know sends the page the whole way."""
    page = decoded_page(r.PODS, copy.deepcopy(objects))
    assert page["metadata"] == {"resourceVersion": "9", "continue": "abc"}
    assert page["items"] == [transform_for(r.PODS)(obj) for obj in copy.deepcopy(objects)]
    for resource, obj in ((r.NODES, a_node()), (r.GPUS, a_gpu())):
        assert decoded_page(resource, [copy.deepcopy(obj)])["items"] == [transform_for(resource)(obj)]
    assert SHARED.changed() == []


def test_watch_events_are_decoded_pruned_and_others_as_sent() -> None:
    """`PrunedDecoder.event` prunes the object of an ADDED, MODIFIED or DELETED event, also one with
    a field it does not know; an ERROR's Status and a BOOKMARK come as sent."""
    decode = pruned_decoder(r.PODS, transform_for(r.PODS))
    assert decode is not None
    odd = {**bound_worker(), "spec": {**bound_worker()["spec"], "aFieldOfKubeTwo": 1}}
    for kind, obj in (("ADDED", bound_worker()), ("DELETED", bound_worker()), ("MODIFIED", odd)):
        line = orjson.dumps({"type": kind, "object": copy.deepcopy(obj)}).decode()
        assert decode.event(line) == (kind, transform_for(r.PODS)(obj))
    status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 410, "reason": "Expired"}
    assert decode.event(orjson.dumps({"type": "ERROR", "object": status}).decode()) == ("ERROR", status)
    mark = {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": "77"}}
    assert decode.event(orjson.dumps({"type": "BOOKMARK", "object": mark}).decode()) == ("BOOKMARK", mark)
    with pytest.raises(ValueError):
        decode.event("not json")


def test_pruners_with_other_rules_do_not_share_what_they_decode() -> None:
    """A subtree met as the same JSON text by two Pruners whose rules differ below it is kept once
    per set of rules: each decoder hands out its own pruning of it."""
    body = orjson.dumps({"items": [bound_worker()]})
    shared = ((("spec", "containers", "[]"),))
    strict = Pruner((("metadata", "managedFields"), ("spec", "containers", "[]", "env")), shared)
    loose = Pruner((("metadata", "managedFields"),), shared)
    levels = LEVELS[("", "Pod")]
    one = strict.decoder("Pod", lambda: levels).page(body)["items"][0]["spec"]["containers"][0]
    two = loose.decoder("Pod", lambda: levels).page(body)["items"][0]["spec"]["containers"][0]
    assert "env" not in one and two["env"] == bound_worker()["spec"]["containers"][0]["env"]
    assert SHARED.changed() == []


def test_pods_decoded_from_one_page_share_their_common_subtrees() -> None:
    one, two = decoded_page(r.PODS, [sibling(bound_worker(), 1), sibling(bound_worker(), 2)])["items"]
    assert one["spec"]["containers"][0] is two["spec"]["containers"][0]
    assert one["spec"]["tolerations"] is two["spec"]["tolerations"]
    assert one["metadata"]["labels"] is two["metadata"]["labels"]
    assert one["metadata"]["annotations"] is not two["metadata"]["annotations"]
    assert "volumeMounts" not in one["spec"]["containers"][0]


def test_tensor_fusion_kinds_have_no_top_level_field_the_pruned_decoder_would_lose() -> None:
    """`pruned_decoder` knows apiVersion, kind, metadata, spec and status of tensor-fusion's kinds: a
    CRD that grew another top-level field would send every page of its kind the whole way."""
    from tfusion.api.accessors import items, section, text
    from tfusion.api.crds import all_crds

    for crd in all_crds():
        for version in items(crd, "spec", "versions"):
            fields = set(section(version, "schema", "openAPIV3Schema", "properties"))
            assert fields <= {"apiVersion", "kind", "metadata", "spec", "status"}, text(crd, "spec", "names", "kind")


def test_pages_are_decoded_whole_where_a_field_could_be_lost() -> None:
    """Kinds with fields outside spec and status (a ConfigMap's data), and informers whose transform
    keeps managedFields, get no decoder; a body not shaped like a list of objects raises ValueError."""
    assert pruned_decoder(r.CONFIGMAPS, transform_for(r.CONFIGMAPS)) is None
    assert pruned_decoder(r.PODS, Pruner((("spec", "volumes"),))) is None
    assert pruned_decoder(r.PODS, strip_managed_fields) is None
    decode = pruned_decoder(r.PODS, transform_for(r.PODS))
    assert decode is not None
    for body in (b'{"items": 3}', b'{"items": [1]}', b"not json", b"[]"):
        with pytest.raises(ValueError):
            decode.page(body)


def test_the_pruned_pod_keeps_what_the_controller_reads() -> None:
    raw = bound_worker()
    before = Pod(copy.deepcopy(raw))
    after = Pod(transform_for(r.PODS)(raw))
    assert raw == bound_worker(), "the transform edited the server's object"
    assert "volumes" not in after.spec and "volumeMounts" not in after.containers[0]
    assert "imageID" not in after.container_statuses[0]
    for reader in (request_from_pod, pod_index_of, connection_of, is_pending, pod_demand):
        assert reader(after) == reader(before), reader.__name__
    assert node_name_index(after.raw) == node_name_index(before.raw) == ["node-00001"]
    assert extended_requests(after, ["example.com/fpga"]) == extended_requests(before, ["example.com/fpga"])
    for accessor in ("holds_gpus", "is_worker", "finished", "node_name", "scheduler_name", "phase", "pod_ip",
                     "restart_policy", "node_selector", "component"):
        assert getattr(after, accessor) == getattr(before, accessor), accessor
    assert after.meta.raw == {k: v for k, v in before.meta.raw.items() if k != "managedFields"}
    assert after.status.get("conditions") == before.status.get("conditions")
    assert after.spec.get("tolerations") == before.spec.get("tolerations")
    assert after.spec.get("preemptionPolicy") == before.spec.get("preemptionPolicy")
    # preemption waits this long for a victim before naming it (scheduling/preemption.py)
    assert after.spec["terminationGracePeriodSeconds"] == before.spec["terminationGracePeriodSeconds"] == 30


def test_the_pruned_node_keeps_what_the_scheduler_reads() -> None:
    before = Node(a_node())
    after = Node(transform_for(r.NODES)(a_node()))
    assert "images" not in after.status and "volumesInUse" not in after.status
    demand = pod_demand(Pod(bound_worker()))
    assert static_check(demand, after) == static_check(demand, before)
    assert allocatable(after) == allocatable(before)
    assert (after.ready, after.unschedulable, after.taints, after.meta.labels) == (
        before.ready, before.unschedulable, before.taints, before.meta.labels)
    assert after.status.get("addresses") == before.status.get("addresses")


def test_kinds_without_pruning_lose_only_managed_fields() -> None:
    gpu = {"kind": "GPU", "metadata": {"name": "g", "managedFields": [{}]}, "status": {"capacity": {"tflops": "1"}}}
    assert r.GPUS.kind not in PRUNED
    assert transform_for(r.GPUS)(copy.deepcopy(gpu)) == {"kind": "GPU", "metadata": {"name": "g"},
                                                          "status": {"capacity": {"tflops": "1"}}}
    assert transform_for(r.PODS, pruning=False)(bound_worker())["spec"]["volumes"]


def test_interned_objects_share_their_strings() -> None:
    one, two = (intern_strings(orjson.loads(orjson.dumps(bound_worker()))) for _ in range(2))
    assert one == two
    assert one["metadata"]["annotations"][tfa.GPU_POOL] is two["metadata"]["annotations"][tfa.GPU_POOL]
    assert one["spec"]["nodeName"] is two["spec"]["nodeName"]
    long = "x" * 500
    assert intern_strings({"k": long})["k"] is long  # long values are left alone, not copied


def bytes_each(texts: list[bytes], transform: Any) -> float:
    """Memory kept per object (tracemalloc) when each JSON text is decoded and transformed."""
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        kept = [transform(orjson.loads(text)) for text in texts]
        used = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    assert len(kept) == len(texts)
    return used / len(texts)


def test_a_cached_pod_costs_half_after_the_transform() -> None:
    """The per-object memory the transform saves (tracemalloc over 500 distinct decoded pods)."""
    texts = [orjson.dumps(bound_worker()).replace(b"d-00001-003", f"d-{i:05d}".encode())
             .replace(b"u-1", f"u-{i}".encode()) for i in range(500)]

    raw, transformed = bytes_each(texts, lambda o: o), bytes_each(texts, transform_for(r.PODS))
    sys.stderr.write(f"bytes per cached pod: {raw:.0f} raw, {transformed:.0f} transformed\n")
    assert transformed < raw * 0.6


#: accessors that hand back a whole section, or a whole container: a pruned object answers them
#: with less on purpose; the fields inside are compared through the other accessors and below
_WHOLE_SECTIONS = {"raw", "spec", "status", "meta", "containers", "init_containers", "container_statuses"}


def accessor_names(cls: type[Body]) -> list[str]:
    """Every property of `cls` (its bases' included): the controller reads objects through them."""
    return sorted({name for klass in cls.__mro__ for name, member in vars(klass).items()
                   if isinstance(member, property)} - _WHOLE_SECTIONS)


def meta_accessor_names() -> list[str]:
    return sorted({name for name, member in vars(Meta).items() if isinstance(member, property)} - {"raw"})


def a_workload(n: int = 1) -> dict[str, Any]:
    """A TensorFusionWorkload as the webhook makes it for a Deployment's pods (webhook/build.py), with
    the status its reconciler writes: the shape benchmarks/scale.py clones, one per ten pods."""
    return {"apiVersion": "tensor-fusion.ai/v1", "kind": "TensorFusionWorkload",
            "metadata": {"name": f"d-{n:05d}-workload", "namespace": "team-01", "uid": f"w-{n}",
                         "resourceVersion": "77", "generation": 1, "creationTimestamp": "2026-01-01T00:00:00Z",
                         "labels": {tfa.GPU_POOL: "pool-0"},
                         "annotations": {tfa.WORKLOAD_MODE: tfa.WORKLOAD_MODE_DYNAMIC,
                                         tfa.CONTAINER_GPU_COUNT: '{"main":1}'},
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": f"d-{n:05d}",
                                              "uid": f"dep-{n}", "controller": True, "blockOwnerDeletion": True}],
                         "finalizers": [tfa.FINALIZER], "managedFields": [{"manager": "tfusion"}]},
            "spec": {"poolName": "pool-0", "qos": "high", "isLocalGPU": True, "sidecarWorker": False,
                     "isolation": "soft", "gpuCount": 1, "gpuModel": "H100",
                     "resources": {"requests": {"tflops": "10", "vram": "8Gi"},
                                   "limits": {"tflops": "10", "vram": "8Gi"}},
                     "autoScalingConfig": {"autoSetResources": {"enable": True, "targetResource": "all"}},
                     "gangScheduling": {"minMembers": 2}},
            "status": {"workerCount": 10, "readyWorkers": 10, "phase": "Running", "podTemplateHash": "abc123",
                       "conditions": [{"type": "Ready", "status": "True", "reason": "WorkersReady",
                                       "message": "10 worker(s) ready", "observedGeneration": 1,
                                       "lastTransitionTime": "2026-01-01T00:00:05Z"}]}}


@pytest.mark.parametrize(("cls", "make", "resource"), [(Pod, bound_worker, r.PODS), (Node, a_node, r.NODES),
                                                       (Gpu, a_gpu, r.GPUS), (Workload, a_workload,
                                                                              r.TENSORFUSIONWORKLOADS)])
def test_every_accessor_answers_the_same_on_the_transformed_object(cls: type[Body], make: Any,
                                                                    resource: r.ApiResource) -> None:
    """Derived from the accessors themselves: one added later that reads a pruned field fails here."""
    before, after = cls(make()), cls(transform_for(resource)(make()))
    names = accessor_names(cls)
    assert names, "no accessors found"
    for name in names:
        assert getattr(after, name) == getattr(before, name), name
    for name in meta_accessor_names():
        assert getattr(after.meta, name) == getattr(before.meta, name), f"meta.{name}"


def test_containers_lose_only_the_pruned_fields() -> None:
    before, after = Pod(bound_worker()), Pod(transform_for(r.PODS)(bound_worker()))
    dropped = {path[-1] for path in PRUNED["Pod"] if path[1] in ("containers", "initContainers")}
    for kept, whole in ((after.containers, before.containers), (after.init_containers, before.init_containers)):
        assert kept == [{k: v for k, v in c.items() if k not in dropped} for c in whole]
    status_dropped = {path[-1] for path in PRUNED["Pod"] if path[1] == "containerStatuses"}
    assert after.container_statuses == [{k: v for k, v in c.items() if k not in status_dropped}
                                        for c in before.container_statuses]


def sibling(pod: dict[str, Any], n: int) -> dict[str, Any]:
    """Another pod of the same Deployment, as the API server would send it (a fresh decode)."""
    text = orjson.dumps(pod).replace(b"d-00001-003", f"d-00001-{n:03d}".encode()).replace(b'"u-1"', f'"u-{n}"'.encode())
    decoded: dict[str, Any] = orjson.loads(text)
    return decoded


def test_pods_of_one_deployment_share_their_common_subtrees() -> None:
    transform = transform_for(r.PODS)
    one, two = transform(sibling(bound_worker(), 1)), transform(sibling(bound_worker(), 2))
    assert one["metadata"]["name"] != two["metadata"]["name"]
    for path in SHARED_PATHS["Pod"]:
        a: Any = one
        b: Any = two
        for step in path:
            if step == "[]":
                a, b = a[0], b[0]
            elif step in a:
                a, b = a[step], b[step]
            else:
                break
        else:
            assert a is b, path
    # the per-pod parts stay per pod
    assert one["metadata"] is not two["metadata"]
    assert one["metadata"]["annotations"] is not two["metadata"]["annotations"]


def test_shared_subtrees_are_not_modified_by_transforming_or_reading() -> None:
    transform = transform_for(r.PODS)
    pods = [Pod(transform(sibling(bound_worker(), n))) for n in range(20)]
    changed = sibling(bound_worker(), 21)
    changed["spec"]["tolerations"][0]["value"] = "other"
    odd = Pod(transform(changed))
    assert odd.spec["tolerations"] is not pods[0].spec["tolerations"]
    assert pods[0].spec["tolerations"][0]["value"] == "tensor-fusion"
    for pod in [*pods, odd]:
        for reader in (request_from_pod, pod_index_of, connection_of, is_pending, pod_demand):
            reader(pod)
        node_name_index(pod.raw)
        extended_requests(pod, ["example.com/fpga"])
    assert SHARED.changed() == []


def test_the_shared_table_keeps_values_apart_by_json_and_starts_afresh_when_full() -> None:
    table = SharedTable(max_entries=3)
    one = {"a": 1}
    assert table.canonical(one) is one
    assert table.canonical({"a": 1}) is one and table.hits == 1
    assert table.canonical({"a": 1.0}) is not one and table.canonical({"a": True}) is not one
    assert len(table) == 3
    table.canonical({"b": 1})  # full: the table starts afresh
    assert len(table) == 1 and table.canonical({"a": 1}) is not one
    big = {"n": 1 << 70}  # not JSON orjson writes: handed back as it is, not kept
    assert table.canonical(big) is big and len(table) == 2
    one["a"] = 2
    table.clear()
    table.canonical(one)
    one["a"] = 3
    assert table.changed() == [{"a": 3}]


def test_the_transformed_workload_equals_the_whole_one_but_for_managed_fields() -> None:
    """Nothing of a workload is dropped: its spec is hashed whole into the worker template, its status
    compared field by field before each status write, its metadata by the webhook's patches, and its
    finalizers are written by PUTting the cached object back (kube/reconciler.py set_finalizers)."""
    raw = a_workload()
    after = transform_for(r.TENSORFUSIONWORKLOADS)(raw)
    assert raw == a_workload(), "the transform edited the server's object"
    del raw["metadata"]["managedFields"]
    assert after == raw
    assert template_hash(None, Workload(after)) == template_hash(None, Workload(a_workload()))


def test_workloads_of_one_profile_share_their_spec_and_common_metadata() -> None:
    transform = transform_for(r.TENSORFUSIONWORKLOADS)
    one, two = transform(a_workload(1)), transform(a_workload(2))
    for path in SHARED_PATHS["TensorFusionWorkload"]:
        a: Any = one
        b: Any = two
        for step in path:
            a, b = a[step], b[step]
        assert a is b, path
    assert one["metadata"] is not two["metadata"]
    assert one["metadata"]["ownerReferences"] != two["metadata"]["ownerReferences"]
    other = a_workload(3)
    other["spec"]["gpuCount"] = 2
    odd = transform(other)
    assert odd["spec"] is not one["spec"] and odd["spec"]["gpuCount"] == 2
    assert odd["spec"]["resources"] is one["spec"]["resources"]
    for workload in (one, two, odd):
        template_hash(None, Workload(workload))
    assert SHARED.changed() == []


def test_a_cached_workload_costs_half_of_an_interned_one() -> None:
    """What sharing saves per workload over interning alone, the transform of kinds that are not
    pruned (tracemalloc over 200 decoded workloads)."""
    texts = [orjson.dumps(a_workload(n)) for n in range(200)]

    interned = bytes_each(texts, transform_for(r.TENSORFUSIONWORKLOADS, pruning=False))
    transformed = bytes_each(texts, transform_for(r.TENSORFUSIONWORKLOADS))
    sys.stderr.write(f"bytes per cached workload: {interned:.0f} interned, {transformed:.0f} transformed\n")
    assert transformed < interned * 0.6
