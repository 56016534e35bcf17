"""The pod webhook and simulate-schedule give a raw pod the same defaults, because one resolver decides them.

Issue 24: the webhook picked pool, isolation and QoS (WorkloadProfile and quota defaults first) in
webhook/mutate.py while simulate-schedule had its own copy that ignored WorkloadProfiles and quota
defaults, so a pod whose profile names a non-default pool was simulated into the default pool.
Each pod here goes through both, for real: created through the embedded API server (the webhook
mutates it; its annotations are read back) and posted to `/api/simulate-schedule` on the same
controller. The pools have their GPUs on different nodes, so the node simulate-schedule suggests
says which pool it judged the pod in; and the annotations simulate-schedule judges (its
`defaulted_pod`, fed from the controller's caches) equal the webhook's for pool, isolation, QoS,
GPU count, vendor and every request and limit.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.apiserver_fixture import apply_crds
from tests.helpers import eventually
from tests.helpers.controller import Controller, controllers
from tests.helpers.webhook import OPS, PRIORITY_CLASSES, serve_webhook, webhook_settings
from tfusion.api import annotations as tfa
from tfusion.api.accessors import Pod
from tfusion.controller.scheduling.simulate import cached_sources, defaulted_pod
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient

pytestmark = pytest.mark.anyio

DEFAULT_POOL, OTHER_POOL = "pool-main", "pool-train"
NODE_OF = {DEFAULT_POOL: "node-main", OTHER_POOL: "node-train"}
#: what both must agree on
COMPARED = (tfa.GPU_POOL, tfa.ISOLATION, tfa.QOS, tfa.GPU_COUNT, tfa.VENDOR, tfa.TFLOPS_REQUEST, tfa.TFLOPS_LIMIT,
            tfa.COMPUTE_PERCENT_REQUEST, tfa.COMPUTE_PERCENT_LIMIT, tfa.VRAM_REQUEST, tfa.VRAM_LIMIT)

#: pod name -> (its annotations, the pool both must give it)
PODS: dict[str, tuple[dict[str, str], str]] = {
    # the profile names the non-default pool, a QoS, shared isolation and the amounts
    "profiled": ({tfa.WORKLOAD_PROFILE: "training"}, OTHER_POOL),
    # no amounts at all: the namespace quota's single.defaultRequests/defaultLimits give them
    "quota-defaults": ({tfa.GPU_POOL: OTHER_POOL}, OTHER_POOL),
    # no pool: the default pool (and its default QoS); limits from the quota
    "no-pool": ({tfa.TFLOPS_REQUEST: "20", tfa.VRAM_REQUEST: "4Gi"}, DEFAULT_POOL),
    # limits equal to requests: QoS high, whatever the pool's default
    "equal-limits": ({tfa.TFLOPS_REQUEST: "10", tfa.TFLOPS_LIMIT: "10", tfa.VRAM_REQUEST: "2Gi",
                      tfa.VRAM_LIMIT: "2Gi"}, DEFAULT_POOL),
}


def raw_pod(name: str, notes: dict[str, str]) -> dict[str, Any]:
    """A pod as its author writes it (simulate-schedule judges only pods for the tfusion scheduler)."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": {tfa.ENABLED: "true"},
                         "annotations": dict(notes)},
            "spec": {"schedulerName": tfa.SCHEDULER_NAME, "containers": [{"name": "app", "image": "app:1"}]}}


async def create_cluster(apiserver: Any, kube: KubeClient) -> None:
    """Two pools with one GPU each on its own node, a WorkloadProfile and a quota with defaults."""
    await apply_crds(apiserver)
    await kube.create(r.NAMESPACES, {"metadata": {"name": OPS}})
    for name, value in (("high", 10000), ("critical", 100000)):
        await kube.create(PRIORITY_CLASSES, {"metadata": {"name": f"tensor-fusion-{name}"}, "value": value})
    await kube.create(r.PROVIDERCONFIGS, {"metadata": {"name": "nvidia"}, "spec": {
        "vendor": "NVIDIA", "images": {"middleware": "mw:1"}, "inUseResourceNames": ["nvidia.com/gpu"]}})
    await kube.create(r.GPUPOOLS, {"metadata": {"name": DEFAULT_POOL, "annotations": {tfa.IS_DEFAULT_POOL: "true"}},
                                   "spec": {"nodeManagerConfig": {}, "qosConfig": {"defaultQoS": "low"}}})
    await kube.create(r.GPUPOOLS, {"metadata": {"name": OTHER_POOL}, "spec": {"nodeManagerConfig": {}}})
    for pool, node in NODE_OF.items():
        await create_gpu(kube, f"gpu-{node}", node, pool)
    await kube.create(r.WORKLOADPROFILES, {"metadata": {"name": "training", "namespace": "default"}, "spec": {
        "poolName": OTHER_POOL, "qos": "critical", "isolation": "shared",
        "resources": {"requests": {"tflops": "30", "vram": "6Gi"}, "limits": {"tflops": "60", "vram": "12Gi"}}}},
        namespace="default")
    await kube.create(r.GPURESOURCEQUOTAS, {"metadata": {"name": "defaults", "namespace": "default"}, "spec": {
        "single": {"defaultRequests": {"tflops": "15", "vram": "3Gi"},
                   "defaultLimits": {"tflops": "25", "vram": "5Gi"}}}}, namespace="default")


async def create_gpu(kube: KubeClient, name: str, node: str, pool: str) -> None:
    await kube.create(r.GPUS, {"metadata": {"name": name, "labels": {tfa.GPU_POOL: pool, tfa.MANAGED_BY: node}}})
    await kube.patch(r.GPUS, name, {"status": {
        "phase": "Running", "vendor": "NVIDIA", "gpuModel": "A100_SXM_40G", "uuid": f"GPU-{name}", "index": 0,
        "message": "managed", "usedBy": "tensor-fusion", "isolationMode": "soft",
        "nodeSelector": {"kubernetes.io/hostname": node},
        "capacity": {"tflops": "100", "vram": "40Gi"}, "available": {"tflops": "100", "vram": "40Gi"}}},
        subresource="status")


async def caches_hold_the_cluster(ctl: Controller) -> bool:
    """The controller has read every object the defaults come from (and both GPUs)."""
    rt = ctl.runtime
    listed = [rt.informer(res).list() for res in (r.GPUPOOLS, r.WORKLOADPROFILES, r.GPURESOURCEQUOTAS, r.GPUS)]
    if [len(objs) for objs in listed] != [2, 1, 1, 2]:
        return False
    body = (await ctl.http.get("/api/allocation")).json()
    return len(body.get("gpuStore") or {}) == 2


async def test_the_webhook_and_simulate_schedule_give_the_same_defaults(apiserver: Any, kube: KubeClient,
                                                                         tmp_path: Path) -> None:
    await create_cluster(apiserver, kube)
    found: dict[str, dict[str, str]] = {}
    async with controllers() as tg:
        ctl = await serve_webhook(tg, kube, webhook_settings(apiserver, tmp_path))
        await eventually(lambda: caches_hold_the_cluster(ctl), what="pools, profile, quota and GPUs cached")
        for name, (notes, pool) in PODS.items():
            admitted = (await kube.create(r.PODS, raw_pod(name, notes), namespace="default"))["metadata"]
            assert admitted["annotations"][tfa.GPU_POOL] == pool, (name, admitted["annotations"])

            answer = await ctl.http.post("/api/simulate-schedule", content=json.dumps(raw_pod(name, notes)))
            assert answer.status_code == 200, (name, answer.text)
            body = answer.json()
            assert body["error"] is None, (name, body["error"])
            assert body["scheduleResult"]["SuggestedHost"] == NODE_OF[pool], (name, body["scheduleResult"])

            judged = defaulted_pod(Pod(raw_pod(name, notes)), cached_sources(ctl.runtime.informer, "default"))
            simulated = judged.meta.annotations
            assert {k: simulated.get(k) for k in COMPARED} == {k: admitted["annotations"].get(k) for k in COMPARED}, \
                name
            found[name] = dict(simulated)
    # what the agreement is about: the profile's and the quota's values, not the code's own
    profiled, quota, no_pool = found["profiled"], found["quota-defaults"], found["no-pool"]
    assert (profiled[tfa.GPU_POOL], profiled[tfa.QOS], profiled[tfa.ISOLATION]) == (OTHER_POOL, "critical", "shared")
    assert (profiled[tfa.TFLOPS_REQUEST], profiled[tfa.VRAM_LIMIT]) == ("30", "12Gi")
    assert [quota[k] for k in (tfa.TFLOPS_REQUEST, tfa.VRAM_REQUEST, tfa.TFLOPS_LIMIT, tfa.VRAM_LIMIT)] == \
        ["15", "3Gi", "25", "5Gi"]
    assert (no_pool[tfa.GPU_POOL], no_pool[tfa.QOS], no_pool[tfa.ISOLATION]) == (DEFAULT_POOL, "low", "soft")
    assert found["equal-limits"][tfa.QOS] == "high"
