"""The pod webhook's pure mutation (tfusion/controller/webhook/mutate.py, render.py) and its JSON patch.

Every patch produced here is applied with the embedded API server's RFC 6902 code and must give
exactly the rendered pod."""

from __future__ import annotations

import copy
import json
from typing import Any

import orjson
import pytest

from tests.helpers.mutate_inputs import BARE, OWNER, POOL, ctx, env_of, pool, tf_pod
from tfusion.api import annotations as tfa
from tfusion.api.accessors import Pod
from tfusion.apiserver.patch import json_patch
from tfusion.controller.webhook import render as render_module
from tfusion.controller.webhook.mutate import Context, Denial, Owner, analyse, selects
from tfusion.controller.webhook.patch import json_diff
from tfusion.controller.webhook.render import render


def mutated(pod: dict[str, Any], context: Context | None = None, owner: Owner = OWNER, *, index: int = 1,
            port: int | None = None) -> tuple[dict[str, Any], Any]:
    plan = analyse(Pod(pod), context or ctx(), owner)
    assert plan is not None
    before = copy.deepcopy(pod)
    out = render(Pod(pod), plan, index=index, host_port=port)
    assert json_patch(pod, json_diff(pod, out)) == out, "the patch must apply cleanly and give the mutated pod"
    assert pod == before, "render must not change the pod it was given"
    return out, plan


def test_a_bare_pod_becomes_a_soft_isolated_worker() -> None:
    out, plan = mutated(tf_pod(BARE))
    notes, labels, spec = out["metadata"]["annotations"], out["metadata"]["labels"], out["spec"]
    assert notes[tfa.TFLOPS_REQUEST] == "20" and notes[tfa.VRAM_REQUEST] == "8Gi"
    assert tfa.TFLOPS_LIMIT not in notes and tfa.VRAM_LIMIT not in notes
    assert notes[tfa.QOS] == "medium" and notes[tfa.GPU_COUNT] == "1" and notes[tfa.GPU_POOL] == POOL
    assert notes[tfa.ISOLATION] == "soft" and notes[tfa.IS_LOCAL_GPU] == "true"
    assert notes[tfa.SIDECAR_WORKER] == "false" and notes[tfa.INJECT_CONTAINER] == "app"
    assert tfa.VENDOR not in notes and notes[tfa.EMBEDDED_WORKER] == "true"  # named by nothing: not written
    assert notes[tfa.PENDING_OWNED_WORKLOAD] == "p"
    assert labels[tfa.COMPONENT] == "worker" and labels[tfa.GPU_POOL] == POOL and labels[tfa.WORKLOAD] == "p"
    assert len(labels[tfa.POD_TEMPLATE_HASH]) == 10
    assert spec["schedulerName"] == "tensor-fusion-scheduler"
    assert {"key": tfa.USED_BY, "operator": "Equal", "value": "tensor-fusion",
            "effect": "PreferNoSchedule"} in spec["tolerations"]
    assert "priorityClassName" not in spec
    app = spec["containers"][0]
    assert app["resources"]["limits"] == {"tensor-fusion.ai/index_0": "1"}
    env = env_of(app)
    assert env["LD_PRELOAD"] == "/tensor-fusion-limiter/libcuda_limiter.so"
    assert env["TF_ISOLATION_MODE"] == "soft" and env["CONTAINER_NAME"] == "app"
    assert env["HYPERVISOR_IP"] == {"fieldRef": {"fieldPath": "status.hostIP"}}
    assert env["HYPERVISOR_PORT"] == "8001"
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    mounts = {m["mountPath"]: m for m in app["volumeMounts"]}
    assert mounts["/run/tensor-fusion/shm"]["subPathExpr"] == "shm/$(POD_NAMESPACE)/$(POD_NAME)"
    assert mounts["/tensor-fusion-limiter"]["readOnly"] is True
    assert "/usr/local/bin/nvidia-smi" in mounts
    (init,) = spec["initContainers"]
    assert init["name"] == "init-soft-limiter" and init["image"] == "mw:1"
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["tf-data"]["hostPath"] == {"path": "/run/tensor-fusion", "type": "DirectoryOrCreate"}
    assert volumes["tf-soft-limiter"] == {"name": "tf-soft-limiter", "emptyDir": {}}
    workload = plan.workload
    assert workload["metadata"]["name"] == "p" and workload["metadata"]["labels"] == {tfa.GPU_POOL: POOL}
    assert workload["metadata"]["annotations"][tfa.WORKLOAD_MODE] == "dynamic"
    assert workload["spec"]["resources"] == {"requests": {"tflops": "20", "vram": "8Gi"},
                                             "limits": {"tflops": "0", "vram": "0"}}
    assert workload["spec"]["poolName"] == POOL and workload["spec"]["isLocalGPU"] is True


def test_a_pod_that_is_not_labelled_is_left_alone() -> None:
    pod = tf_pod(BARE)
    del pod["metadata"]["labels"][tfa.ENABLED]
    assert not selects(Pod(pod), ctx())
    assert analyse(Pod(pod), ctx(), OWNER) is None


NATIVE = [{"name": "train", "image": "pytorch", "resources": {"limits": {"nvidia.com/gpu": "2", "cpu": "1"}}}]
AUTO_MIGRATION = {"enable": True}


def native_pod() -> dict[str, Any]:
    pod = tf_pod({}, containers=copy.deepcopy(NATIVE))
    pod["metadata"]["labels"] = {}
    return pod


def test_native_gpu_pods_migrate_when_auto_migration_is_on() -> None:
    assert analyse(Pod(native_pod()), ctx(), OWNER) is None, "auto-migration off: untouched"
    context = ctx(auto_migration=AUTO_MIGRATION)
    assert selects(Pod(native_pod()), context)
    out, _ = mutated(native_pod(), context)
    notes = out["metadata"]["annotations"]
    assert out["metadata"]["labels"][tfa.ENABLED] == "true"
    assert notes[tfa.ISOLATION] == "shared" and notes[tfa.GPU_COUNT] == "2"
    assert notes[tfa.INJECT_CONTAINER] == "train"
    train = out["spec"]["containers"][0]
    assert train["resources"]["limits"] == {"cpu": "1", "tensor-fusion.ai/index_0": "1"}
    assert "initContainers" not in out["spec"], "shared isolation gets no soft limiter"


def test_auto_migration_scope_excludes_and_includes() -> None:
    excluded = ctx(auto_migration={"enable": True, "scope": {"excludes": {"namespaceNames": ["ns"]}}})
    assert analyse(Pod(native_pod()), excluded, OWNER) is None
    other = ctx(auto_migration={"enable": True, "scope": {"includes": {"namespaceNames": ["elsewhere"]}}})
    assert analyse(Pod(native_pod()), other, OWNER) is None
    by_label = ctx(auto_migration={"enable": True, "scope": {"includes": {
        "namespaceSelector": {"matchLabels": {"gpu": "yes"}}}}}, namespace_labels={"gpu": "yes"})
    assert analyse(Pod(native_pod()), by_label, OWNER) is not None
    pod = native_pod()
    pod["metadata"]["labels"] = {tfa.ENABLED: "false"}
    assert analyse(Pod(pod), ctx(auto_migration=AUTO_MIGRATION), OWNER) is None, '"false" never migrates'


def test_migrated_soft_pods_get_the_whole_gpu_and_the_container_count() -> None:
    pod = native_pod()
    pod["metadata"]["annotations"] = {tfa.ISOLATION: "soft", tfa.VRAM_REQUEST: "10Gi"}
    out, plan = mutated(pod, ctx(auto_migration=AUTO_MIGRATION))
    notes = out["metadata"]["annotations"]
    assert notes[tfa.COMPUTE_PERCENT_LIMIT] == "100" and notes[tfa.COMPUTE_PERCENT_REQUEST] == "100"
    assert json.loads(notes[tfa.CONTAINER_GPU_COUNT]) == {"train": 2}
    assert plan.workload["metadata"]["annotations"][tfa.CONTAINER_GPU_COUNT] == '{"train":2}'


QUOTA = {"metadata": {"name": "q", "namespace": "ns"}, "spec": {"single": {
    "defaultRequests": {"tflops": "5", "vram": "2Gi"}, "defaultLimits": {"tflops": "10", "vram": "4Gi"}}}}


def test_quota_defaults_fill_what_the_pod_leaves_out() -> None:
    out, _ = mutated(tf_pod({}), ctx(quotas=[QUOTA]))
    notes = out["metadata"]["annotations"]
    assert (notes[tfa.TFLOPS_REQUEST], notes[tfa.VRAM_REQUEST]) == ("5", "2Gi")
    assert (notes[tfa.TFLOPS_LIMIT], notes[tfa.VRAM_LIMIT]) == ("10", "4Gi")
    out, _ = mutated(tf_pod({tfa.VRAM_REQUEST: "1Gi", tfa.COMPUTE_PERCENT_REQUEST: "30"}), ctx(quotas=[QUOTA]))
    notes = out["metadata"]["annotations"]
    assert notes[tfa.VRAM_REQUEST] == "1Gi" and notes[tfa.COMPUTE_PERCENT_REQUEST] == "30"
    assert tfa.TFLOPS_REQUEST not in notes, "the pod's percent is not replaced by the quota's TFLOPS"


def test_high_qos_gets_its_priority_class_and_equal_limits_default_to_high() -> None:
    out, _ = mutated(tf_pod({**BARE, tfa.QOS: "critical"}))
    assert out["spec"]["priorityClassName"] == "tensor-fusion-critical"
    equal = {**BARE, tfa.TFLOPS_LIMIT: "20", tfa.VRAM_LIMIT: "8Gi"}
    out, _ = mutated(tf_pod(equal))
    assert out["metadata"]["annotations"][tfa.QOS] == "high"
    assert out["spec"]["priorityClassName"] == "tensor-fusion-high"
    pod = tf_pod(equal)
    pod["spec"]["priorityClassName"] = "mine"
    pod["spec"]["priority"] = 5
    out, _ = mutated(pod)
    assert out["spec"]["priorityClassName"] == "mine" and out["spec"]["priority"] == 5
    out, _ = mutated(tf_pod(BARE), ctx(pools=[pool(qosConfig={"defaultQoS": "low"})]))
    assert out["metadata"]["annotations"][tfa.QOS] == "low"


@pytest.mark.parametrize("index, resource, count", [(1, "index_0", "1"), (8, "index_0", "8"), (9, "index_1", "1"),
                                                    (128, "index_f", "8")])
def test_the_index_resource_has_no_off_by_one(index: int, resource: str, count: str) -> None:
    out, _ = mutated(tf_pod(BARE), index=index)
    assert out["spec"]["containers"][0]["resources"]["limits"] == {f"tensor-fusion.ai/{resource}": count}


INVALID = [
    ({tfa.GPU_COUNT: "0"}, tfa.GPU_COUNT, '"0"', "an integer from 1 to 128"),
    ({tfa.GPU_COUNT: "129"}, tfa.GPU_COUNT, '"129"', "an integer from 1 to 128"),
    ({tfa.TFLOPS_REQUEST: "lots"}, tfa.TFLOPS_REQUEST, '"lots"', "non-negative Kubernetes quantity"),
    ({tfa.VRAM_REQUEST: "-1Gi"}, tfa.VRAM_REQUEST, '"-1Gi"', "non-negative Kubernetes quantity"),
    ({tfa.COMPUTE_PERCENT_REQUEST: "150"}, tfa.COMPUTE_PERCENT_REQUEST, '"150"', "from 0 to 100"),
    ({tfa.QOS: "urgent"}, tfa.QOS, '"urgent"', "low|medium|high|critical"),
    ({tfa.ISOLATION: "total"}, tfa.ISOLATION, '"total"', "shared|soft|hard|partitioned"),
    ({tfa.ISOLATION: "hard"}, tfa.ISOLATION, '"hard"', "sidecar-worker"),
    ({tfa.GPU_POOL: "nope"}, tfa.GPU_POOL, '"nope"', "pool-a"),
    ({tfa.GPU_INDICES: "0,x"}, tfa.GPU_INDICES, '"0,x"', "comma list"),
    ({tfa.SIDECAR_WORKER: "perhaps"}, tfa.SIDECAR_WORKER, '"perhaps"', '"true" or "false"'),
    ({tfa.INJECT_CONTAINER: "ghost"}, tfa.INJECT_CONTAINER, '"ghost"', "app"),
    ({tfa.WORKLOAD_PROFILE: "missing"}, tfa.WORKLOAD_PROFILE, '"missing"', "WorkloadProfile"),
    ({tfa.GANG_MIN_MEMBERS: "1"}, tfa.GANG_MIN_MEMBERS, '"1"', "at least 2"),
    ({tfa.GANG_ENABLED: "true"}, tfa.GANG_ENABLED, '"true"', "at least 2 replicas"),
    ({tfa.GANG_TIMEOUT: "soon"}, tfa.GANG_TIMEOUT, '"soon"', "duration"),
    ({tfa.DISABLE_FEATURES: "everything"}, tfa.DISABLE_FEATURES, '"everything"', "gpu-limiter"),
    ({tfa.EVICTION_PROTECTION: "forever"}, tfa.EVICTION_PROTECTION, '"forever"', "duration"),
    ({tfa.AUTOSCALE_TARGET: "gpu"}, tfa.AUTOSCALE_TARGET, '"gpu"', "compute|vram|all"),
    ({tfa.REQUIRE_GPU_TOPOLOGY: "yes"}, tfa.REQUIRE_GPU_TOPOLOGY, '"yes"', '"true" or "false"'),
    ({tfa.GPU_TOPOLOGY_MAX_TIER: "4"}, tfa.GPU_TOPOLOGY_MAX_TIER, '"4"', "an integer from 0 to 3"),
    ({tfa.GPU_TOPOLOGY_SOURCE: "pcie"}, tfa.GPU_TOPOLOGY_SOURCE, '"pcie"', "auto|numa|vendor"),
    ({tfa.ENABLED_REPLICAS: "-1"}, tfa.ENABLED_REPLICAS, '"-1"', "at least 0"),
    ({tfa.DEDICATED_GPU: "true"}, tfa.DEDICATED_GPU, '"true"', tfa.GPU_MODEL),
    ({tfa.DEDICATED_GPU: "true", tfa.GPU_MODEL: "Z9"}, tfa.GPU_MODEL, '"Z9"', "status.gpuModel"),
]


@pytest.mark.parametrize("notes, key, value, allowed", INVALID, ids=[case[1] + "=" + case[2] for case in INVALID])
def test_each_invalid_annotation_is_denied_naming_it(notes: dict[str, str], key: str, value: str,
                                                     allowed: str) -> None:
    with pytest.raises(Denial) as info:
        analyse(Pod(tf_pod({**BARE, **notes})), ctx(), OWNER)
    message = info.value.message
    assert info.value.code == 400
    assert f"{key}: {value} is not allowed" in message and allowed in message, message


def test_no_resources_and_two_containers_are_denied() -> None:
    with pytest.raises(Denial, match="asks for no GPU resources"):
        analyse(Pod(tf_pod({})), ctx(), OWNER)
    two = tf_pod(BARE, containers=[{"name": "a"}, {"name": "b"}])
    with pytest.raises(Denial, match=r"inject-container: \"\" is not allowed.*\(a, b\)"):
        analyse(Pod(two), ctx(), OWNER)
    two["metadata"]["annotations"][tfa.INJECT_CONTAINER] = "b"
    out, _ = mutated(two)
    assert "env" not in out["spec"]["containers"][0] and env_of(out["spec"]["containers"][1])


def test_only_a_bare_local_pod_carries_its_workload_for_the_pod_reconciler() -> None:
    """pending-owned-workload-spec: the plan's workload less its name, namespace and owners (the pod
    reconciler adds those); a remote client's workload and an owned pod's are written at
    admission, and a copy of the annotation a pod arrives with is dropped."""
    out, plan = mutated(tf_pod(BARE))
    carried = orjson.loads(out["metadata"]["annotations"][tfa.PENDING_OWNED_WORKLOAD_SPEC])
    workload: dict[str, Any] = plan.workload
    meta = workload["metadata"]
    assert carried == {"labels": meta["labels"], "annotations": meta["annotations"], "spec": workload["spec"]}
    stale = {**BARE, tfa.PENDING_OWNED_WORKLOAD_SPEC: "{}"}
    deployment = Owner(workload_name="d", reference={"apiVersion": "apps/v1", "kind": "Deployment", "name": "d",
                                                     "uid": "u", "controller": True})
    for pod, context, owner in ((tf_pod(stale), ctx(), deployment),
                                (tf_pod({**stale, tfa.IS_LOCAL_GPU: "false"}), ctx(), OWNER)):
        out, _ = mutated(pod, context, owner)
        assert tfa.PENDING_OWNED_WORKLOAD_SPEC not in out["metadata"]["annotations"]


def test_remote_mode_comes_from_the_annotation_or_the_pool_and_refuses_a_sidecar() -> None:
    # the whole remote rendering is in tests/unit/test_webhook_remote.py
    for pod, context in ((tf_pod({**BARE, tfa.IS_LOCAL_GPU: "false"}), ctx()),
                         (tf_pod(BARE), ctx(pools=[pool(defaultUsingLocalGPU=False)]))):
        plan = analyse(Pod(pod), context, OWNER)
        assert plan is not None and plan.remote is not None
    with pytest.raises(Denial, match='sidecar-worker: "true" needs local GPU mode'):
        analyse(Pod(tf_pod({**BARE, tfa.IS_LOCAL_GPU: "false", tfa.SIDECAR_WORKER: "true"})), ctx(), OWNER)


def test_no_pool_and_no_default_pool_is_denied() -> None:
    bare_pool = {"metadata": {"name": "x"}, "spec": {}}
    with pytest.raises(Denial, match="no GPUPool is annotated"):
        analyse(Pod(tf_pod(BARE)), ctx(pools=[bare_pool]), OWNER)


def test_soft_isolation_is_refused_for_vendors_without_a_limiter() -> None:
    with pytest.raises(Denial, match="vendor AMD has no soft limiter"):
        analyse(Pod(tf_pod({**BARE, tfa.VENDOR: "AMD"})), ctx(), OWNER)


def test_a_workload_profile_is_the_base_and_annotations_win() -> None:
    profile = {"metadata": {"name": "prof"}, "spec": {"qos": "low", "gpuCount": 2, "resources": {
        "requests": {"tflops": "7", "vram": "3Gi"}, "limits": {"tflops": "9", "vram": "3Gi"}}}}
    context = ctx(profile=lambda name: profile if name == "prof" else None)
    out, plan = mutated(tf_pod({tfa.WORKLOAD_PROFILE: "prof", tfa.TFLOPS_REQUEST: "8"}), context)
    notes = out["metadata"]["annotations"]
    assert (notes[tfa.TFLOPS_REQUEST], notes[tfa.TFLOPS_LIMIT], notes[tfa.VRAM_REQUEST]) == ("8", "9", "3Gi")
    assert notes[tfa.QOS] == "low" and notes[tfa.GPU_COUNT] == "2"
    assert plan.workload["spec"]["gpuCount"] == 2


def test_dedicated_gpu_takes_the_models_capacity() -> None:
    context = ctx(gpu_capacity=lambda model: {"tflops": "312", "vram": "80Gi"} if model == "A100" else None)
    out, _ = mutated(tf_pod({tfa.DEDICATED_GPU: "true", tfa.GPU_MODEL: "A100"}), context)
    notes = out["metadata"]["annotations"]
    assert (notes[tfa.TFLOPS_REQUEST], notes[tfa.TFLOPS_LIMIT], notes[tfa.VRAM_LIMIT]) == ("312", "312", "80Gi")
    assert notes[tfa.QOS] == "high"


def test_gang_annotations_from_the_owner_replicas() -> None:
    owner = Owner(workload_name="train", reference={"apiVersion": "apps/v1", "kind": "Deployment", "name": "train",
                                                    "uid": "u1", "controller": True}, replicas=4)
    out, plan = mutated(tf_pod({**BARE, tfa.GANG_ENABLED: "true", tfa.GANG_MIN_MEMBERS: "3",
                                tfa.GANG_TIMEOUT: "5m"}), owner=owner)
    notes = out["metadata"]["annotations"]
    assert (notes[tfa.GANG_DESIRED_MEMBERS], notes[tfa.GANG_REQUIRED_MEMBERS]) == ("4", "3")
    assert notes[tfa.GANG_GROUP_KEY] == "ns/train" and tfa.PENDING_OWNED_WORKLOAD not in notes
    assert plan.workload["spec"]["gangScheduling"] == {"minMembers": 3, "timeout": "5m"}
    assert plan.workload["metadata"]["ownerReferences"][0]["kind"] == "Deployment"
    with pytest.raises(Denial, match="from 2 to 4"):
        analyse(Pod(tf_pod({**BARE, tfa.GANG_ENABLED: "true", tfa.GANG_MIN_MEMBERS: "5"})), ctx(), owner)


def test_host_port_auto_sets_the_named_port() -> None:
    containers = [{"name": "app", "ports": [{"name": "http", "containerPort": 80}]}]
    pod = tf_pod(BARE, labels={tfa.HOST_PORT: "auto", tfa.PORT_NAME: "http"}, containers=containers)
    out, _ = mutated(pod, port=42001)
    assert out["spec"]["containers"][0]["ports"][0]["hostPort"] == 42001
    assert out["metadata"]["annotations"][tfa.PORT_NUMBER] == "42001"
    wrong = tf_pod(BARE, labels={tfa.HOST_PORT: "auto", tfa.PORT_NAME: "grpc"}, containers=containers)
    with pytest.raises(Denial, match=r'label tensor-fusion.ai/port-name: "grpc" is not allowed.*\(http\)'):
        analyse(Pod(wrong), ctx(), OWNER)


@pytest.mark.parametrize("notes", [
    BARE,  # soft isolation: the limiter's init container, env and mounts
    {**BARE, tfa.SIDECAR_WORKER: "true", tfa.ISOLATION: "hard"},
    {**BARE, tfa.IS_LOCAL_GPU: "false"},  # a remote client
], ids=["soft", "sidecar", "remote"])
def test_render_writes_into_a_copy_of_every_part_it_changes(notes: dict[str, str]) -> None:
    """The copy shares the parts rendering never writes with the pod (render.writable_copy): a pod
    that already holds every list and map rendering writes into (finalizers, tolerations, the
    container's resources and ports, its env and mounts, init containers and volumes) stays as it
    was sent, and the patch still gives the rendered pod (`mutated` checks both)."""
    containers = [{"name": "app", "image": "python", "env": [{"name": "A", "value": "1"}],
                   "volumeMounts": [{"name": "v", "mountPath": "/v"}],
                   "ports": [{"name": "http", "containerPort": 80}],
                   "resources": {"requests": {"cpu": "1", "nvidia.com/gpu": "1"},
                                 "limits": {"nvidia.com/gpu": "1", "tensor-fusion.ai/index_3": "2"}}}]
    pod = tf_pod(notes, labels={tfa.HOST_PORT: "auto", tfa.PORT_NAME: "http"}, containers=containers)
    pod["metadata"]["finalizers"] = ["example.com/keep"]
    pod["spec"].update({"tolerations": [{"key": "k", "operator": "Exists"}], "volumes": [{"name": "v", "emptyDir": {}}],
                        "initContainers": [{"name": "first", "image": "busybox"}]})
    context = ctx(operator_endpoint="http://op:8080") if notes.get(tfa.IS_LOCAL_GPU) == "false" else None
    out, _ = mutated(pod, context, port=None if context else 42001)
    assert out["metadata"]["finalizers"] == ["example.com/keep"] if context else ["example.com/keep", tfa.FINALIZER]
    assert out["spec"]["tolerations"][0] == {"key": "k", "operator": "Exists"}


def test_sidecar_worker_with_hard_isolation() -> None:
    notes = {**BARE, tfa.SIDECAR_WORKER: "true", tfa.ISOLATION: "hard", tfa.VRAM_LIMIT: "8Gi",
             tfa.COMPUTE_PERCENT_LIMIT: "50"}
    out, _ = mutated(tf_pod(notes))
    names = [c["name"] for c in out["spec"]["containers"]]
    assert names == ["app", "tensorfusion-worker"]
    worker = out["spec"]["containers"][1]
    env = env_of(worker)
    assert {k: env[k] for k in ("TF_CUDA_SM_PERCENT_LIMIT", "TF_GPU_MEMORY_LIMIT", "TF_CUDA_MEMORY_LIMIT")} == {
        "TF_CUDA_SM_PERCENT_LIMIT": "50", "TF_GPU_MEMORY_LIMIT": "8192", "TF_CUDA_MEMORY_LIMIT": "8192"}
    assert env["CONTAINER_NAME"] == "tensorfusion-worker" and "LD_PRELOAD" not in env  # hard: no soft limiter
    assert env["HYPERVISOR_IP"] == {"fieldRef": {"fieldPath": "status.hostIP"}} and env["HYPERVISOR_PORT"] == "8001"
    assert worker["command"][-1].endswith("exec ./tensor-fusion-worker -n shmem -m tf_shm -M 1024")
    mounts = {m["mountPath"]: m for m in worker["volumeMounts"]}
    assert mounts["/dev/shm"]["name"] == "tf-transport-shm"
    assert mounts["/run/tensor-fusion/shm"]["subPathExpr"] == "shm/$(POD_NAMESPACE)/$(POD_NAME)"
    assert {"name": "tf-data", "hostPath": {"path": "/run/tensor-fusion", "type": "DirectoryOrCreate"}} \
        in out["spec"]["volumes"]
    assert worker["resources"]["limits"] == {"tensor-fusion.ai/index_0": "1"}
    assert env_of(out["spec"]["containers"][0])["TENSOR_FUSION_OPERATOR_CONNECTION_INFO"] == "shmem+tf_shm+1024+1"
    assert out["spec"]["initContainers"][0]["name"] == "inject-lib"
    assert tfa.EMBEDDED_WORKER not in out["metadata"]["annotations"]


def test_the_patch_escapes_keys_and_appends_to_lists() -> None:
    kept = {f"k{i}": "same" for i in range(4)}  # most of the map unchanged: each change is an op of its own
    before: dict[str, Any] = {"metadata": {"annotations": {"a/b": "1", "t~x": "2", **kept}},
                              "spec": {"tolerations": [{"key": "k"}]}}
    after: dict[str, Any] = {"metadata": {"annotations": {"a/b": "3", **kept}},
                             "spec": {"tolerations": [{"key": "k"}, {"key": "z"}]}}
    ops = json_diff(before, after)
    assert {"op": "remove", "path": "/metadata/annotations/t~0x"} in ops
    assert {"op": "replace", "path": "/metadata/annotations/a~1b", "value": "3"} in ops
    assert {"op": "add", "path": "/spec/tolerations/-", "value": {"key": "z"}} in ops
    assert json_patch(before, ops) == after


def test_a_mostly_new_map_or_list_is_replaced_whole() -> None:
    before: dict[str, Any] = {"metadata": {"name": "p", "labels": {"app": "x"}},
                              "spec": {"env": [{"name": "A"}], "ports": [1, 2, 3]}}
    after: dict[str, Any] = {"metadata": {"name": "p", "labels": {"app": "x", "t/a": "1", "t/b": "2"}},
                             "spec": {"env": [{"name": "A"}, {"name": "B"}, {"name": "C"}], "ports": [1, 2, 3, 4, 5]}}
    ops = json_diff(before, after)
    assert ops == [{"op": "replace", "path": "/metadata/labels", "value": after["metadata"]["labels"]},
                   {"op": "replace", "path": "/spec/env", "value": after["spec"]["env"]},
                   {"op": "add", "path": "/spec/ports/-", "value": 4},
                   {"op": "add", "path": "/spec/ports/-", "value": 5}]
    assert json_patch(before, ops) == after
    # the document itself is never replaced whole, however much of it changed
    assert json_diff({"a": 1}, {"b": 2, "c": 3}) == [{"op": "remove", "path": "/a"}, {"op": "add", "path": "/b",
                                                     "value": 2}, {"op": "add", "path": "/c", "value": 3}]
    assert json_diff({"x": [1, 2, 3]}, {"x": [3]}) == [{"op": "replace", "path": "/x", "value": [3]}]
    assert json_diff({"x": True}, {"x": 1}) == [{"op": "replace", "path": "/x", "value": 1}]


def test_vertical_scaling_rules_and_the_pools_container_patch() -> None:
    template = {"metadata": {"name": "tmpl"}, "spec": {"verticalScalingRules": [
        {"name": "other", "selector": {"matchLabels": {"team": "b"}}, "autoScalingConfig": {"x": 1}},
        {"name": "ours", "selector": {"matchLabels": {"team": "a"}},
         "autoScalingConfig": {"autoSetResources": {"enable": True, "targetResource": "vram"}}}]}}
    patched_pool = pool(schedulingConfigTemplate="tmpl", componentConfig={"client": {"patchToContainer": {
        "env": [{"name": "FROM_POOL", "value": "1"}]}}})
    context = ctx(pools=[patched_pool], templates=[template])
    out, plan = mutated(tf_pod(BARE, labels={"team": "a"}), context)
    assert plan.workload["spec"]["autoScalingConfig"] == {"autoSetResources": {"enable": True,
                                                                              "targetResource": "vram"}}
    assert env_of(out["spec"]["containers"][0])["FROM_POOL"] == "1"
    _, plain = mutated(tf_pod({**BARE, tfa.AUTOSCALE: "true"}, labels={"team": "c"}), context)
    assert plain.workload["spec"]["autoScalingConfig"] == {"autoSetResources": {"enable": True,
                                                                               "targetResource": "all"}}


ANY_INDEX_CASES = {
    "soft": BARE,
    "sidecar": {**BARE, tfa.SIDECAR_WORKER: "true", tfa.ISOLATION: "hard", tfa.VRAM_LIMIT: "8Gi"},
    "two containers": {**BARE, tfa.INJECT_CONTAINER: "app,side"},
}


@pytest.mark.parametrize("notes", ANY_INDEX_CASES.values(), ids=ANY_INDEX_CASES.keys())
def test_one_rendering_for_any_index_gives_each_index_its_patch(notes: dict[str, str]) -> None:
    """What the memo does for a Deployment's pods (memo.py): the patch rendered once with the index
    marks, an index written in, is to the byte the patch rendered for that index, for all 128."""
    two = tfa.INJECT_CONTAINER in notes
    pod = tf_pod(notes, containers=[{"name": "app", "image": "python"}, {"name": "side", "image": "python"}]
                 if two else None)
    plan = analyse(Pod(pod), ctx(), OWNER)
    assert plan is not None and render_module.renders_any_index(plan, orjson.dumps(pod))
    template = orjson.dumps(json_diff(pod, render(Pod(pod), plan, index=render_module.ANY_INDEX,
                                                  host_port=None))).decode()
    for index in range(1, tfa.POD_INDEX_MAX + 1):
        one = orjson.dumps(json_diff(pod, render(Pod(pod), plan, index=index, host_port=None))).decode()
        assert render_module.with_index(template, index) == one, index


def test_a_pool_patch_or_an_index_already_there_is_rendered_for_each_index() -> None:
    pod = tf_pod(BARE)
    plan = analyse(Pod(pod), ctx(), OWNER)
    assert plan is not None and render_module.renders_any_index(plan, orjson.dumps(pod))
    patched = analyse(Pod(pod), ctx(pools=[pool(componentConfig={"client": {"patchToContainer": {
        "resources": {"limits": {"tensor-fusion.ai/index_0": "3"}}}}})]), OWNER)
    assert patched is not None and not render_module.renders_any_index(patched, orjson.dumps(pod))
    held = tf_pod(BARE, containers=[{"name": "app", "image": "python",
                                     "resources": {"limits": {"tensor-fusion.ai/index_2": "4"}}}])
    assert not render_module.renders_any_index(plan, orjson.dumps(held))
