"""Remote vGPU mode in the pod webhook (tfusion/controller/webhook/remote.py): what a client pod and
its workload become, on plain dicts, each patch applied with the API server's RFC 6902 code."""

from __future__ import annotations

import copy
import re
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.helpers.mutate_inputs import BARE, OWNER, ctx, env_of, pool, tf_pod
from tfusion.api import annotations as tfa
from tfusion.api.accessors import Pod, Workload
from tfusion.apiserver.patch import json_patch
from tfusion.controller.webhook.mutate import Context, Denial, Owner, Plan, analyse
from tfusion.controller.webhook.patch import json_diff
from tfusion.controller.webhook.remote import connection_of, operator_endpoint
from tfusion.controller.webhook.render import render
from tfusion.settings import Settings

ENDPOINT = "http://tensor-fusion-controller.tensor-fusion-sys.svc:8080"
REMOTE = {**BARE, tfa.IS_LOCAL_GPU: "false"}


def remote_ctx(**changes: Any) -> Context:
    return ctx(operator_endpoint=ENDPOINT, **changes)


def client(pod: dict[str, Any], context: Context | None = None, owner: Owner = OWNER) -> tuple[dict[str, Any], Plan]:
    plan = analyse(Pod(pod), context or remote_ctx(), owner)
    assert plan is not None and plan.remote is not None
    before = copy.deepcopy(pod)
    out = render(Pod(pod), plan, index=None, host_port=None)
    assert json_patch(pod, json_diff(pod, out)) == out
    assert pod == before
    return out, plan


def test_a_remote_pod_becomes_a_client_with_the_library_and_its_connection() -> None:
    out, plan = client(tf_pod(REMOTE))
    notes, labels, spec = out["metadata"]["annotations"], out["metadata"]["labels"], out["spec"]
    assert labels[tfa.COMPONENT] == "client" and labels[tfa.GPU_POOL] == "pool-a"
    assert tfa.WORKLOAD not in labels, "a client is not one of the workload's workers"
    assert notes[tfa.IS_LOCAL_GPU] == "false" and notes[tfa.SELECTED_WORKLOAD] == "p"
    assert tfa.EMBEDDED_WORKER not in notes and notes[tfa.TFLOPS_REQUEST] == "20"
    assert "schedulerName" not in spec and "tolerations" not in spec, "a client goes to any node"
    (init,) = spec["initContainers"]
    assert init["name"] == "inject-lib" and init["image"] == "tensorfusion/tensor-fusion-client:latest"
    assert init["resources"]["limits"] == {"cpu": "20m", "memory": "256Mi"}
    assert {"name": "tf-libs", "emptyDir": {}} in spec["volumes"]
    (app,) = spec["containers"]
    env = env_of(app)
    name = env["TENSOR_FUSION_CONNECTION_NAME"]
    assert re.fullmatch(r"p-tf-vgpu-[1-9a-y]{10}", name) and connection_of(Pod(out)) == name
    assert env["TENSOR_FUSION_CONNECTION_NAMESPACE"] == "ns"
    url = urlsplit(env["TENSOR_FUSION_OPERATOR_GET_CONNECTION_URL"])
    assert f"{url.scheme}://{url.netloc}{url.path}" == f"{ENDPOINT}/api/connection"
    assert parse_qs(url.query) == {"name": [name], "namespace": ["ns"]}
    assert env["TF_PREPEND_PATH"] == env["TF_LD_LIBRARY_PATH"] == "/tensor-fusion"
    mounts = {m["mountPath"]: m for m in app["volumeMounts"]}
    assert mounts["/etc/ld.so.preload"]["subPath"] == "ld.so.preload" and "/usr/local/bin/nvidia-smi" in mounts
    assert not any(k.startswith(tfa.INDEX_RESOURCE_PREFIX) for k in (app.get("resources") or {}).get("limits", {}))
    spec = Workload(plan.workload).spec
    assert spec["isLocalGPU"] is False and spec["sidecarWorker"] is False
    assert spec["resources"]["requests"] == {"tflops": "20", "vram": "8Gi"}


def test_connection_names_differ_per_pod_and_follow_generate_name() -> None:
    first, _ = client(tf_pod(REMOTE))
    second, _ = client(tf_pod(REMOTE))
    assert connection_of(Pod(first)) != connection_of(Pod(second))
    generated = tf_pod(REMOTE)
    del generated["metadata"]["name"]
    generated["metadata"]["generateName"] = "job-"
    out, _ = client(generated, owner=Owner(workload_name="job-abc"))
    assert re.fullmatch(r"job-tf-vgpu-[1-9a-y]{10}", connection_of(Pod(out)))


def test_pool_patches_and_a_remote_client_image_are_applied() -> None:
    component = {"client": {"remoteModeImage": "client:remote", "operatorEndpoint": "http://ops:9000/", "patchToPod": {
        "metadata": {"labels": {"patched": "pod"}}, "spec": {"nodeSelector": {"cpu-only": "true"}}},
        "patchToContainer": {"env": [{"name": "FROM_POOL", "value": "1"}]}}}
    out, _ = client(tf_pod(REMOTE), remote_ctx(pools=[pool(componentConfig=component)]))
    assert out["spec"]["nodeSelector"] == {"cpu-only": "true"}
    assert out["metadata"]["labels"]["patched"] == "pod" and out["metadata"]["labels"][tfa.COMPONENT] == "client"
    assert out["spec"]["initContainers"][0]["image"] == "client:remote"
    env = env_of(out["spec"]["containers"][0])
    assert env["FROM_POOL"] == "1"
    assert env["TENSOR_FUSION_OPERATOR_GET_CONNECTION_URL"].startswith("http://ops:9000/api/connection?name=")
    provider = {"metadata": {"name": "nvidia"}, "spec": {
        "vendor": "NVIDIA", "images": {"middleware": "mw:1", "remoteClient": "rc:2"}}}
    out, _ = client(tf_pod(REMOTE), remote_ctx(provider_configs=[provider]))
    assert out["spec"]["initContainers"][0]["image"] == "rc:2"


def test_the_worker_pod_template_annotation_goes_to_the_workload() -> None:
    template = "metadata:\n  labels: {team: ml}\nspec:\n  nodeSelector: {gpu: a100}\n"
    _, plan = client(tf_pod({**REMOTE, tfa.WORKER_POD_TEMPLATE: template}))
    assert Workload(plan.workload).spec["workerPodTemplate"] == {"metadata": {"labels": {"team": "ml"}},
                                                                 "spec": {"nodeSelector": {"gpu": "a100"}}}
    for bad, message in (("[1, 2]", "expected a PodTemplateSpec"),
                         ("kind: Pod\nspec: {}", "expected a PodTemplateSpec"),
                         ("spec: 3", "spec must be an object"), ("a: [", "not YAML or JSON")):
        with pytest.raises(Denial, match=message):
            analyse(Pod(tf_pod({**REMOTE, tfa.WORKER_POD_TEMPLATE: bad})), remote_ctx(), OWNER)


def test_hard_isolation_needs_no_sidecar_in_remote_mode() -> None:
    _, plan = client(tf_pod({**REMOTE, tfa.ISOLATION: "hard"}))
    assert Workload(plan.workload).spec["isolation"] == "hard"
    with pytest.raises(Denial, match="hard isolation needs"):
        analyse(Pod(tf_pod({**BARE, tfa.ISOLATION: "hard"})), remote_ctx(), OWNER)


def test_the_disabled_limiter_reaches_the_init_container() -> None:
    out, _ = client(tf_pod({**REMOTE, tfa.DISABLE_FEATURES: "gpu-limiter"}))
    assert env_of(out["spec"]["initContainers"][0]) == {"DISABLE_GPU_LIMITER": "true"}


def test_the_default_operator_endpoint() -> None:
    assert operator_endpoint(Settings(roles=("controller",))) == ENDPOINT
    assert operator_endpoint(Settings(roles=("all",), controller_listen=":9090")) == "http://127.0.0.1:9090"
