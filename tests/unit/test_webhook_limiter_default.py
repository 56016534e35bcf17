"""Soft isolation uses tfusion's own limiter by default: the webhook's init container (local soft
pods) and the worker pod's (controller-made workers) copy `libcuda_limiter.so` from the tfusion
image's fixed path into the shared volume, with no `nvidia-smi` mount (ours answers NVML itself);
a ProviderConfig that names `spec.images.middleware` still wins, with the original's tolerant copy."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.mutate_inputs import BARE, OWNER, ctx, env_of, pool, tf_pod
from tfusion.api import annotations as tfa
from tfusion.api.accessors import GpuPool, Pod, Workload
from tfusion.apiserver.patch import json_patch
from tfusion.controller.limiter_source import IMAGE_LIMITER_DIR, TFUSION_IMAGE, LimiterSource, limiter_source
from tfusion.controller.reconcilers.workers import worker_pod
from tfusion.controller.webhook.mutate import Context, Denial, analyse
from tfusion.controller.webhook.patch import json_diff
from tfusion.controller.webhook.render import render
from tfusion.settings import Settings

NVIDIA_NO_MIDDLEWARE: dict[str, Any] = {"metadata": {"name": "nvidia"}, "spec": {
    "vendor": "NVIDIA", "images": {"remoteWorker": "w:1"}, "inUseResourceNames": ["nvidia.com/gpu"]}}
#: as deploy/overlays/defaults writes it (the CRD requires spec.images.middleware)
NVIDIA_TFUSION: dict[str, Any] = {"metadata": {"name": "nvidia"}, "spec": {
    "vendor": "NVIDIA", "images": {"middleware": "tfusion"}, "inUseResourceNames": ["nvidia.com/gpu"]}}
OWN_COPY = ["cp", "/opt/tfusion/lib/libcuda_limiter.so", "/tensor-fusion-limiter/"]


def mutated(pod: dict[str, Any], context: Context) -> dict[str, Any]:
    plan = analyse(Pod(pod), context, OWNER)
    assert plan is not None
    before = copy.deepcopy(pod)
    out = render(Pod(pod), plan, index=1, host_port=None)
    assert pod == before, "render must not change the pod it was given"
    assert json_patch(before, json_diff(pod, out)) == out
    return out


@pytest.mark.parametrize("providers", [[], [NVIDIA_NO_MIDDLEWARE], [NVIDIA_TFUSION]],
                         ids=["no-providerconfig", "no-middleware", "middleware-tfusion"])
def test_a_soft_pod_gets_tfusions_limiter_from_the_tfusion_image(providers: list[dict[str, Any]]) -> None:
    out = mutated(tf_pod(BARE), ctx(provider_configs=providers))
    (init,) = out["spec"]["initContainers"]
    assert init["name"] == "init-soft-limiter" and init["image"] == TFUSION_IMAGE == "tfusion:0.1.0"
    assert init["command"] == OWN_COPY, "our image always has the file: no tolerant copy hiding its absence"
    assert init["volumeMounts"] == [{"name": "tf-soft-limiter", "mountPath": "/tensor-fusion-limiter"}]
    (app,) = out["spec"]["containers"]
    assert env_of(app)["LD_PRELOAD"] == "/tensor-fusion-limiter/libcuda_limiter.so"
    mounts = {m["mountPath"] for m in app["volumeMounts"]}
    assert "/tensor-fusion-limiter" in mounts
    assert "/usr/local/bin/nvidia-smi" not in mounts, "no wrapped nvidia-smi is copied: mounting one would fail"


def test_the_limiter_image_setting_names_the_image() -> None:
    out = mutated(tf_pod(BARE), ctx(provider_configs=[], limiter_image="registry.example/tfusion:7"))
    assert out["spec"]["initContainers"][0]["image"] == "registry.example/tfusion:7"
    settings = Settings.load({}, env={"TF_LIMITER_IMAGE": "registry.example/tfusion:7"}, roles=("controller",))
    assert settings.limiter_image == "registry.example/tfusion:7"
    assert Settings.load({}, env={}, roles=("controller",)).limiter_image == TFUSION_IMAGE


def test_a_providerconfigs_middleware_image_still_wins() -> None:
    provider = copy.deepcopy(NVIDIA_NO_MIDDLEWARE)
    provider["spec"]["images"]["middleware"] = "vendor/limiter:3"
    out = mutated(tf_pod(BARE), ctx(provider_configs=[provider]))
    (init,) = out["spec"]["initContainers"]
    assert init["image"] == "vendor/limiter:3"
    assert init["command"] == ["sh", "-c", "cp /build/* /tensor-fusion-limiter/ 2>/dev/null; true"]
    assert "/usr/local/bin/nvidia-smi" in {m["mountPath"] for m in out["spec"]["containers"][0]["volumeMounts"]}


def test_a_vendor_without_our_limiter_still_needs_a_middleware_image() -> None:
    ascend = pool()
    ascend["spec"]["nodeManagerConfig"] = {"defaultVendor": "Ascend"}
    with pytest.raises(Denial, match=r"spec\.images\.middleware"):
        analyse_and_render(tf_pod(BARE), ctx(pools=[ascend], provider_configs=[]))


def analyse_and_render(pod: dict[str, Any], context: Context) -> dict[str, Any]:
    plan = analyse(Pod(pod), context, OWNER)
    assert plan is not None
    return render(Pod(pod), plan, index=1, host_port=None)


def test_limiter_source_rules() -> None:
    named: dict[str, Any] = {"spec": {"images": {"middleware": "m:1"}}}
    assert limiter_source(named, "Ascend") == LimiterSource("m:1", own=False)
    assert limiter_source(None, "NVIDIA") == LimiterSource(TFUSION_IMAGE, own=True)
    assert limiter_source(None, "") == LimiterSource(TFUSION_IMAGE, own=True)
    assert limiter_source(None, "Ascend") is None
    assert limiter_source(None, "NVIDIA", own_image="") is None
    tfusion: dict[str, Any] = {"spec": {"images": {"middleware": "tfusion"}}}  # what deploy/overlays/defaults names
    assert limiter_source(tfusion, "NVIDIA", own_image="reg/tf:2") == LimiterSource("reg/tf:2", own=True)
    assert limiter_source({"spec": {"images": {"middleware": "reg/tf:2"}}}, "NVIDIA", own_image="reg/tf:2") \
        == LimiterSource("reg/tf:2", own=True)
    assert limiter_source(tfusion, "Ascend") is None, "our limiter serves CUDA only"
    assert LimiterSource("i", own=True).copy_command("/d") == ["cp", f"{IMAGE_LIMITER_DIR}/libcuda_limiter.so", "/d/"]


def test_a_soft_worker_pod_gets_tfusions_limiter_over_the_worker_images() -> None:
    load = Workload({"metadata": {"name": "w", "namespace": "ns", "uid": "uid-w", "labels": {tfa.GPU_POOL: "pool-a"}},
                     "spec": {"poolName": "pool-a", "isolation": "soft",
                              "resources": {"requests": {"tflops": "10", "vram": "4Gi"},
                                            "limits": {"tflops": "10", "vram": "4Gi"}}}})
    pod: dict[str, Any] = worker_pod(load, GpuPool(pool()), [NVIDIA_NO_MIDDLEWARE], owner={
        "apiVersion": "tensor-fusion.ai/v1", "kind": "TensorFusionWorkload", "name": "w", "uid": "uid-w",
        "controller": True, "blockOwnerDeletion": True}, generate_name="w-", template="h", index=3,
        limiter_image="registry.example/tfusion:7")
    (init,) = pod["spec"]["initContainers"]
    assert init["image"] == "registry.example/tfusion:7"
    assert init["command"] == ["cp", "/opt/tfusion/lib/libcuda_limiter.so", "/soft-limiter/"]
    (container,) = pod["spec"]["containers"]
    limiter = {"name": "soft-limiter", "mountPath": "/home/app/libcuda_limiter.so", "subPath": "libcuda_limiter.so",
               "readOnly": True}
    assert limiter in container["volumeMounts"]
    assert not [m for m in container["volumeMounts"] if m.get("subPath") == "nvidia-smi"]
    assert env_of(container)["LD_PRELOAD"] == "/home/app/libcuda_limiter.so"


def test_the_default_install_uses_tfusions_limiter() -> None:
    overlay = Path(__file__).resolve().parents[2] / "deploy" / "overlays" / "defaults" / "providerconfig.yaml"
    provider = yaml.safe_load(overlay.read_text())
    assert limiter_source(provider, "NVIDIA", own_image="reg/tf:2") == LimiterSource("reg/tf:2", own=True)
