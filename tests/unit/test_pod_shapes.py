"""Pods the original's images run unchanged: what the webhook and the worker reconcilers write,
compared field by field with the original (reference upstream-controller.md §2.3 and
upstream-hypervisor.md §4.4 and §8.3; where those are silent, the original's worker composition,
as the README note says).

- remote worker pods (tfusion/controller/reconcilers/workers.py) and the sidecar worker
  (tfusion/controller/worker_shape.py): container `tensorfusion-worker`, the hypervisor's address
  and port, identity env, the shm mount, the limiter and hard-limit env, command, default requests;
  a soft worker's `init-soft-limiter`;
- the `init-soft-limiter` and `inject-lib` init containers: requests = limits, a tolerant copy,
  `/tensor-fusion-conf`;
- the vendor annotation: written only when the pod named a vendor (annotation, profile, native GPU);
- TFLOPS and compute percent together: admitted with the percent dropped.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.helpers.mutate_inputs import BARE, OWNER, PROVIDER, ctx, env_of, pool, tf_pod
from tfusion.api import annotations as tfa
from tfusion.api import podindex
from tfusion.api.accessors import GpuPool, Pod, Workload
from tfusion.apiserver.patch import json_patch
from tfusion.controller.reconcilers.workers import worker_pod
from tfusion.controller.webhook.mutate import Context, Plan, analyse
from tfusion.controller.webhook.patch import json_diff
from tfusion.controller.webhook.render import render
from tfusion.kube.ownership import OwnerReference

OWNER_REF: OwnerReference = {"apiVersion": "tensor-fusion.ai/v1", "kind": "TensorFusionWorkload", "name": "w",
                             "uid": "uid-w", "controller": True, "blockOwnerDeletion": True}
SHM = {"name": "tf-data", "mountPath": "/run/tensor-fusion/shm", "subPathExpr": "shm/$(POD_NAMESPACE)/$(POD_NAME)",
       "mountPropagation": "HostToContainer"}
DATA = {"name": "tf-data", "hostPath": {"path": "/run/tensor-fusion", "type": "DirectoryOrCreate"}}
INIT_RESOURCES = {"requests": {"cpu": "20m", "memory": "256Mi"}, "limits": {"cpu": "20m", "memory": "256Mi"}}


def mutated(pod: dict[str, Any], context: Context | None = None) -> tuple[dict[str, Any], Plan]:
    plan = analyse(Pod(pod), context or ctx(operator_endpoint="http://op:8080"), OWNER)
    assert plan is not None
    before = copy.deepcopy(pod)
    out = render(Pod(pod), plan, index=None if plan.remote else 1, host_port=None)
    assert pod == before, "render must not change the pod it was given"
    assert json_patch(before, json_diff(pod, out)) == out
    return out, plan


def workload(isolation: str | None = "soft", limits: dict[str, str] | None = None,
             annotations: dict[str, str] | None = None, **spec: Any) -> Workload:
    body: dict[str, Any] = {"poolName": "pool-a", "resources": {"requests": {"tflops": "10", "vram": "4Gi"},
                                                                "limits": limits or {"tflops": "10", "vram": "4Gi"}},
                            **spec}
    if isolation:
        body["isolation"] = isolation
    return Workload({"metadata": {"name": "w", "namespace": "ns", "uid": "uid-w", "labels": {tfa.GPU_POOL: "pool-a"},
                                  "annotations": annotations or {}}, "spec": body})


def worker(load: Workload, pool_body: dict[str, Any] | None = None) -> dict[str, Any]:
    providers: list[dict[str, Any]] = [PROVIDER]
    return worker_pod(load, GpuPool(pool_body or pool()), providers, owner=OWNER_REF, generate_name="w-tf-worker-",
                      template="h", index=3)


# --- remote worker pods --------------------------------------------------------------------------------------


def test_a_soft_remote_worker_has_the_originals_container() -> None:
    pod = worker(workload())
    (container,) = pod["spec"]["containers"]
    assert container["name"] == "tensorfusion-worker"
    assert container["image"] == "tensorfusion/tensor-fusion-worker:latest"
    assert container["command"] == ["./tensor-fusion-worker", "-p", "8000"]
    assert container["ports"] == [{"name": "remote-vgpu", "containerPort": 8000, "protocol": "TCP"}]
    assert container["resources"]["requests"] == {"cpu": "50m", "memory": "128Mi"}
    assert "cpu" not in container["resources"]["limits"], "a worker may burst: requests only"
    resource, count = podindex.encode_pod_index(3)
    assert container["resources"]["limits"] == {resource: str(count)}, "the index resource stays"
    env = env_of(container)
    assert env["HYPERVISOR_IP"] == {"fieldRef": {"fieldPath": "status.hostIP"}}
    assert env["HYPERVISOR_PORT"] == "8001"  # the original's fallback when the pool names no port
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["CONTAINER_NAME"] == "tensorfusion-worker" and env["TF_ENABLE_LOG"] == "1"
    assert env["LD_PRELOAD"] == "/home/app/libcuda_limiter.so"
    assert not {"TF_CUDA_SM_PERCENT_LIMIT", "TF_GPU_MEMORY_LIMIT", "NVIDIA_VISIBLE_DEVICES"} & set(env)
    assert env["TF_ISOLATION_MODE"] == "soft" and env["TF_SHM_PATH"] == "/run/tensor-fusion/shm/shm"
    limiter = {"name": "soft-limiter", "mountPath": "/home/app/libcuda_limiter.so", "subPath": "libcuda_limiter.so",
               "readOnly": True}
    smi = {"name": "soft-limiter", "mountPath": "/usr/local/bin/nvidia-smi", "subPath": "nvidia-smi", "readOnly": True}
    assert container["volumeMounts"] == [SHM, limiter, smi]
    assert pod["spec"]["volumes"] == [DATA, {"name": "soft-limiter", "emptyDir": {}}]
    (init,) = pod["spec"]["initContainers"]
    assert init["name"] == "init-soft-limiter" and init["image"] == "mw:1"  # the ProviderConfig's middleware
    assert init["command"] == ["sh", "-c", "cp /build/* /soft-limiter/ 2>/dev/null; true"]
    assert init["resources"] == INIT_RESOURCES
    assert pod["spec"]["terminationGracePeriodSeconds"] == 5


def test_a_hard_remote_worker_gets_the_hard_limits() -> None:
    env = env_of(worker(workload("hard", {"compute": "30", "vram": "6Gi"}))["spec"]["containers"][0])
    assert (env["TF_CUDA_SM_PERCENT_LIMIT"], env["TF_GPU_MEMORY_LIMIT"], env["TF_CUDA_MEMORY_LIMIT"]) == \
        ("30", "6144", "6144")
    assert "LD_PRELOAD" not in env, "hard isolation does not preload the soft limiter"
    assert "TF_ISOLATION_MODE" not in env


def test_a_tflops_hard_limit_leaves_the_percent_to_the_device_plugin() -> None:
    """A TFLOPS limit is a percent only of the GPU picked later: the hypervisor's Allocate sets it."""
    env = env_of(worker(workload("hard", {"tflops": "10"}))["spec"]["containers"][0])
    assert "TF_CUDA_SM_PERCENT_LIMIT" not in env
    assert env["TF_GPU_MEMORY_LIMIT"] == env["TF_CUDA_MEMORY_LIMIT"] == "0"  # no VRAM limit


def test_a_shared_worker_has_no_shared_memory() -> None:
    pod = worker(workload("shared"))
    container = pod["spec"]["containers"][0]
    assert "volumeMounts" not in container and "volumes" not in pod["spec"] and "initContainers" not in pod["spec"]
    assert "LD_PRELOAD" not in env_of(container)


def test_unset_isolation_is_soft() -> None:
    assert env_of(worker(workload(None))["spec"]["containers"][0])["LD_PRELOAD"] == "/home/app/libcuda_limiter.so"


def test_disabled_features_reach_the_worker() -> None:
    notes = {tfa.DISABLE_FEATURES: "gpu-limiter,start-worker"}
    container = worker(workload(annotations=notes))["spec"]["containers"][0]
    env = env_of(container)
    assert "LD_PRELOAD" not in env and env["DISABLE_GPU_LIMITER"] == "true"
    assert container["command"] == ["sleep", "infinity"]


def test_the_pools_port_and_template_shape_the_one_worker_container() -> None:
    template = {"template": {"spec": {"containers": [{"name": "anything", "image": "mine:2",
                                                      "resources": {"requests": {"cpu": "2"}}}]}}}
    body = pool(componentConfig={"hypervisor": {"portNumber": 8055}, "worker": {"podTemplate": template}})
    (container,) = worker(workload(), body)["spec"]["containers"]
    assert container["name"] == "tensorfusion-worker" and container["image"] == "mine:2"
    assert container["resources"]["requests"]["cpu"] == "2"
    assert env_of(container)["HYPERVISOR_PORT"] == "8055"


def test_the_sidecar_takes_env_and_resources_from_the_pools_worker_template() -> None:
    template = {"template": {"spec": {"containers": [{"env": [{"name": "TF_LICENSE", "value": "k"}],
                                                      "resources": {"limits": {"cpu": "1"}}}]}}}
    context = ctx(pools=[pool(componentConfig={"worker": {"podTemplate": template}})])
    out, _ = mutated(tf_pod({**BARE, tfa.SIDECAR_WORKER: "true"}), context)
    sidecar = out["spec"]["containers"][-1]
    assert sidecar["name"] == "tensorfusion-worker" and env_of(sidecar)["TF_LICENSE"] == "k"
    assert env_of(sidecar)["CONTAINER_NAME"] == "tensorfusion-worker"
    assert sidecar["resources"]["limits"]["cpu"] == "1"
    assert sidecar["resources"]["requests"] == {"cpu": "50m", "memory": "128Mi"}, "default requests still apply"
    resource, count = podindex.encode_pod_index(1)
    assert sidecar["resources"]["limits"][resource] == str(count), "the index resource is added after"


# --- the webhook's init containers ----------------------------------------------------------------------------


def test_init_soft_limiter_has_resources_and_a_tolerant_copy() -> None:
    out, _ = mutated(tf_pod(BARE))
    (init,) = out["spec"]["initContainers"]
    assert init["name"] == "init-soft-limiter"
    assert init["command"] == ["sh", "-c", "cp /build/* /tensor-fusion-limiter/ 2>/dev/null; true"]
    assert init["resources"] == INIT_RESOURCES


@pytest.mark.parametrize("notes", [{tfa.IS_LOCAL_GPU: "false"}, {tfa.SIDECAR_WORKER: "true"}],
                         ids=["remote client", "sidecar"])
def test_inject_lib_mounts_the_conf_directory_too(notes: dict[str, str]) -> None:
    out, _ = mutated(tf_pod({**BARE, **notes}))
    (init,) = out["spec"]["initContainers"]
    assert init["name"] == "inject-lib" and init["resources"] == INIT_RESOURCES
    assert init["volumeMounts"] == [{"name": "tf-libs", "mountPath": "/tensor-fusion"},
                                    {"name": "tf-libs", "mountPath": "/tensor-fusion-conf"}]


# --- the vendor ------------------------------------------------------------------------------------------------


def test_the_vendor_is_written_only_when_the_pod_names_one() -> None:
    out, plan = mutated(tf_pod(BARE))
    spec: dict[str, Any] = dict(Workload(plan.workload).spec)
    assert tfa.VENDOR not in out["metadata"]["annotations"] and "vendor" not in spec
    assert plan.vendor == "NVIDIA", "the pool's default still picks the limiter and images"
    out, plan = mutated(tf_pod({**BARE, tfa.VENDOR: "AMD", tfa.ISOLATION: "shared"}))
    assert out["metadata"]["annotations"][tfa.VENDOR] == "AMD" and Workload(plan.workload).spec["vendor"] == "AMD"


def test_a_native_gpu_resource_names_its_providers_vendor() -> None:
    other = {"metadata": {"name": "ascend"}, "spec": {"vendor": "Ascend", "inUseResourceNames": ["huawei.com/npu"]}}
    containers = [{"name": "app", "image": "x", "resources": {"limits": {"huawei.com/npu": "1"}}}]
    out, _ = mutated(tf_pod({**BARE, tfa.ISOLATION: "shared"}, containers=containers),
                     ctx(provider_configs=[PROVIDER, other]))
    assert out["metadata"]["annotations"][tfa.VENDOR] == "Ascend"


def test_a_profiles_vendor_is_written() -> None:
    profile = {"metadata": {"name": "prof", "namespace": "ns"}, "spec": {"vendor": "NVIDIA"}}
    out, _ = mutated(tf_pod({**BARE, tfa.WORKLOAD_PROFILE: "prof"}),
                     ctx(profile=lambda name: profile if name == "prof" else None))
    assert out["metadata"]["annotations"][tfa.VENDOR] == "NVIDIA"


# --- TFLOPS and a percent ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("notes", "kept"), [
    ({tfa.TFLOPS_REQUEST: "10", tfa.COMPUTE_PERCENT_REQUEST: "20"}, {tfa.TFLOPS_REQUEST: "10"}),
    ({tfa.TFLOPS_LIMIT: "10", tfa.COMPUTE_PERCENT_LIMIT: "20"}, {tfa.TFLOPS_LIMIT: "10", tfa.TFLOPS_REQUEST: "10"}),
    ({tfa.TFLOPS_LIMIT: "10", tfa.COMPUTE_PERCENT_REQUEST: "20"},  # a TFLOPS limit drops the percent request
     {tfa.TFLOPS_LIMIT: "10", tfa.TFLOPS_REQUEST: "10"}),
])
def test_tflops_and_a_percent_are_admitted_with_the_percent_dropped(notes: dict[str, str],
                                                                    kept: dict[str, str]) -> None:
    out, _ = mutated(tf_pod({tfa.VRAM_REQUEST: "4Gi", **notes}))
    written = out["metadata"]["annotations"]
    assert tfa.COMPUTE_PERCENT_REQUEST not in written and tfa.COMPUTE_PERCENT_LIMIT not in written
    assert {key: written[key] for key in kept} == kept


def test_a_percent_request_with_a_tflops_request_keeps_a_percent_limit() -> None:
    """Only TFLOPS on the same side or a TFLOPS limit overrides; a percent limit alone stays."""
    out, _ = mutated(tf_pod({tfa.VRAM_REQUEST: "4Gi", tfa.TFLOPS_REQUEST: "10", tfa.COMPUTE_PERCENT_LIMIT: "50"}))
    written = out["metadata"]["annotations"]
    assert written[tfa.TFLOPS_REQUEST] == "10" and written[tfa.COMPUTE_PERCENT_LIMIT] == "50"
