"""The webhook's memo of pods already mutated, through the embedded API server: identical replicas
(from the second on, the first only marks its key) get the answer a fresh analysis gives, each
with its own index; a change to what the analysis read (a quota, a GPU's capacity for a dedicated
pod) is seen by the next pod; GPU status writes do not invalidate the pods that never read a GPU;
per-pod claims (host ports) are never remembered; and replicas that differ only in
kube-apiserver's managedFields stamp share the answer."""

from __future__ import annotations

import base64
import copy
import ssl
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.helpers import eventually
from tests.helpers.controller import controllers, create_gpu
from tests.helpers.webhook import (
    POOL,
    kube_with_webhook_objects,  # noqa: F401  (the `kube` fixture of these tests)
    serve_webhook,
    webhook_settings,
)
from tfusion.api import annotations as tfa
from tfusion.api import podindex
from tfusion.apiserver.patch import json_patch
from tfusion.controller.webhook.memo import ReviewMemo
from tfusion.controller.webhook.service import WebhookService
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient, NotFound

pytestmark = pytest.mark.anyio

RS_UID = "3f0c1d9e-5b7a-4c1e-9a52-7f3c2b1d0e11"


def replica(notes: dict[str, str] | None = None, *, labels: dict[str, str] | None = None,
            containers: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A pod as a ReplicaSet creates it: generateName, its controller reference, no name."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "generateName": "trainer-7d9f-", "namespace": "default",
        "labels": {tfa.ENABLED: "true", "app": "trainer", **(labels or {})}, "annotations": dict(notes or {}),
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "trainer-7d9f", "uid": RS_UID,
                             "controller": True, "blockOwnerDeletion": True}]},
        "spec": {"containers": containers or [{"name": "app", "image": "python:3.11-slim"}]}}


def mutation(created: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """What the webhook decided, without what the API server assigns, and the pod's index."""
    meta, spec = created["metadata"], copy.deepcopy(created["spec"])
    resources = spec["containers"][0]["resources"]
    found = [(k, v) for k, v in resources["limits"].items() if podindex.index_resource_number(k) is not None]
    assert len(found) == 1, resources
    for side in ("limits", "requests"):  # the API server defaults the request from the limit
        resources[side].pop(found[0][0], None)
    decided = {"annotations": meta["annotations"], "labels": meta["labels"], "spec": spec}
    return decided, podindex.decode_pod_index(found[0][0], int(found[0][1]))


def service(ctl: Any) -> WebhookService:
    webhook: WebhookService | None = ctl.runtime.webhook
    assert webhook is not None
    return webhook


async def quota(client: KubeClient, tflops: str) -> None:
    body: dict[str, Any] = {"metadata": {"name": "q", "namespace": "default"}, "spec": {"single": {
        "defaultRequests": {"tflops": tflops, "vram": "2Gi"}, "defaultLimits": {"tflops": tflops, "vram": "2Gi"}}}}
    try:
        current = await client.get(r.GPURESOURCEQUOTAS, "q", namespace="default")
    except NotFound:
        await client.create(r.GPURESOURCEQUOTAS, body)
        return
    await client.replace(r.GPURESOURCEQUOTAS, {**body, "metadata": {**body["metadata"], "resourceVersion":
                                                                   current["metadata"]["resourceVersion"]}})


async def cached(webhook: WebhookService, resource: r.ApiResource, key: str, check: Any) -> None:
    """Until the webhook's informer holds `key` and `check` holds for it."""
    informer = webhook.runtime.informer(resource)

    async def there() -> bool:
        found = informer.get(key)
        return found is not None and bool(check(found))

    await eventually(there, what=f"the webhook's cache of {key}")


async def settled(webhook: WebhookService) -> None:
    """Until the pool reconciler has put its finalizer on the pool (a change the memo must see)."""
    await cached(webhook, r.GPUPOOLS, POOL, lambda pool: pool["metadata"].get("finalizers"))


async def test_identical_replicas_share_the_answer_until_what_it_read_changes(apiserver: Any, kube: KubeClient,
                                                                               tmp_path: Path) -> None:
    await quota(kube, "5")
    async with controllers() as tg:
        webhook = service(await serve_webhook(tg, kube, webhook_settings(apiserver, tmp_path)))
        await cached(webhook, r.GPURESOURCEQUOTAS, "default/q", lambda q: True)
        await settled(webhook)
        created = [await kube.create(r.PODS, replica(), namespace="default") for _ in range(3)]
        # the first replica only marks its key, the second is kept, the third answered from the memo
        assert (webhook.memo.hits, len(webhook.memo)) == (1, 1)
        decided = [mutation(p) for p in created]
        assert decided[0][0] == decided[1][0] == decided[2][0]
        assert len({index for _, index in decided}) == 3, "each replica has its own index"
        assert decided[0][0]["annotations"][tfa.TFLOPS_REQUEST] == "5"

        webhook.memo = ReviewMemo()  # what a fresh analysis gives for the same pod
        fresh = mutation(await kube.create(r.PODS, replica(), namespace="default"))
        assert fresh[0] == decided[0][0] and webhook.memo.hits == 0
        kept = mutation(await kube.create(r.PODS, replica(), namespace="default"))
        assert kept[0] == fresh[0] and (webhook.memo.hits, len(webhook.memo)) == (0, 1)

        await quota(kube, "7")
        await cached(webhook, r.GPURESOURCEQUOTAS, "default/q",
                     lambda q: q["spec"]["single"]["defaultRequests"]["tflops"] == "7")
        after = mutation(await kube.create(r.PODS, replica(), namespace="default"))
        assert after[0]["annotations"][tfa.TFLOPS_REQUEST] == "7", "the changed quota is read again"
        assert (webhook.memo.hits, webhook.memo.misses) == (0, 1)

        await create_gpu(kube, "gpu-status-only", "node-a")  # a GPU appears: not read for this pod
        await cached(webhook, r.GPUS, "gpu-status-only", lambda g: (g.get("status") or {}).get("capacity"))
        again = mutation(await kube.create(r.PODS, replica(), namespace="default"))
        assert again[0] == after[0] and webhook.memo.hits == 1


async def test_a_dedicated_pod_reads_the_gpu_capacity_again_when_it_changes(apiserver: Any, kube: KubeClient,
                                                                            tmp_path: Path) -> None:
    notes = {tfa.DEDICATED_GPU: "true", tfa.GPU_MODEL: "H100"}
    async with controllers() as tg:
        webhook = service(await serve_webhook(tg, kube, webhook_settings(apiserver, tmp_path)))
        await create_gpu(kube, "gpu-h", "node-a", tflops="900", vram="80Gi", model="H100")
        await cached(webhook, r.GPUS, "gpu-h", lambda g: (g.get("status") or {}).get("gpuModel") == "H100")
        await settled(webhook)
        first, second, third = [mutation(await kube.create(r.PODS, replica(notes), namespace="default"))
                                for _ in range(3)]
        assert first[0] == second[0] == third[0] and first[0]["annotations"][tfa.TFLOPS_REQUEST] == "900"
        assert webhook.memo.hits == 1

        await kube.patch(r.GPUS, "gpu-h", {"status": {"capacity": {"tflops": "990", "vram": "80Gi"}}},
                         subresource="status")
        await cached(webhook, r.GPUS, "gpu-h", lambda g: g["status"]["capacity"]["tflops"] == "990")
        fourth = mutation(await kube.create(r.PODS, replica(notes), namespace="default"))
        assert fourth[0]["annotations"][tfa.TFLOPS_REQUEST] == "990"
        assert webhook.memo.hits == 1


async def test_per_pod_claims_are_never_remembered(apiserver: Any, kube: KubeClient,
                                                 tmp_path: Path) -> None:
    containers = [{"name": "app", "image": "srv", "ports": [{"name": "http", "containerPort": 80}]}]
    notes = {tfa.TFLOPS_REQUEST: "20", tfa.VRAM_REQUEST: "8Gi"}
    async with controllers() as tg:
        webhook = service(await serve_webhook(tg, kube, webhook_settings(apiserver, tmp_path)))
        ports = set()
        for _ in range(2):
            created = await kube.create(r.PODS, replica(notes, labels={tfa.HOST_PORT: "auto", tfa.PORT_NAME: "http"},
                                                        containers=containers), namespace="default")
            ports.add(created["metadata"]["annotations"][tfa.PORT_NUMBER])
        assert len(ports) == 2 and len(webhook.memo) == 0
        unowned = replica(notes)
        del unowned["metadata"]["ownerReferences"]  # its workload is named with a random suffix
        workloads = {(await kube.create(r.PODS, unowned, namespace="default"))["metadata"]["annotations"][
            tfa.PENDING_OWNED_WORKLOAD] for _ in range(2)}
        assert len(workloads) == 2 and len(webhook.memo) == 0


async def test_bare_pods_that_differ_only_in_name_share_the_answer(apiserver: Any, kube: KubeClient,
                                                                    tmp_path: Path) -> None:
    """A bare pod's plan reads its name only as its workload's: pods named apart share one entry,
    and each answer is what a fresh analysis gives that pod, its own workload included."""
    notes = {tfa.TFLOPS_REQUEST: "20", tfa.VRAM_REQUEST: "8Gi"}

    def bare(name: str) -> dict[str, Any]:
        made = replica(notes)
        del made["metadata"]["ownerReferences"], made["metadata"]["generateName"]
        made["metadata"]["name"] = name
        return made

    def named_apart(decided: dict[str, Any], name: str) -> dict[str, Any]:
        assert decided["labels"][tfa.WORKLOAD] == decided["annotations"][tfa.PENDING_OWNED_WORKLOAD] == name
        renamed: dict[str, Any] = orjson.loads(orjson.dumps(decided).replace(name.encode(), b"NAME"))
        return renamed

    async with controllers() as tg:
        webhook = service(await serve_webhook(tg, kube, webhook_settings(apiserver, tmp_path)))
        await settled(webhook)
        names = ("solo-a", "solo-b", "solo-d")
        shared = [mutation(await kube.create(r.PODS, bare(name), namespace="default"))[0] for name in names]
        assert (webhook.memo.hits, len(webhook.memo)) == (1, 1)  # marked, kept, shared
        webhook.memo = ReviewMemo()  # what a fresh analysis gives
        fresh = mutation(await kube.create(r.PODS, bare("solo-c"), namespace="default"))[0]
        assert all(named_apart(decided, name) == named_apart(fresh, "solo-c")
                   for decided, name in zip(shared, names, strict=True))
        for name in (*names, "solo-c"):  # each pod's own workload (the pod reconciler makes it)
            workload = await eventually(partial(kube.get, r.TENSORFUSIONWORKLOADS, name, namespace="default"),
                                        retry_on=(NotFound,), what=f"workload {name}")
            assert workload["spec"]["resources"]["requests"]["tflops"] == "20"


def review(pod: dict[str, Any], uid: str) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "operation": "CREATE",
        "namespace": "default", "object": pod, "dryRun": True}}


async def test_replicas_stamped_in_different_seconds_share_the_answer(apiserver: Any, kube: KubeClient,
                                                                      tmp_path: Path) -> None:
    """kube-apiserver fills in managedFields (to the second) before admission; the memo looks past them."""
    notes = {tfa.TFLOPS_REQUEST: "20", tfa.VRAM_REQUEST: "8Gi"}
    async with controllers() as tg:
        webhook = service(await serve_webhook(tg, kube, webhook_settings(apiserver, tmp_path)))
        await settled(webhook)
        context = ssl.create_default_context(cadata=base64.b64decode(webhook.certs.ca_bundle or "").decode())
        pods = []
        for second in ("10", "11", "12"):
            stamped = replica(notes)
            stamped["metadata"]["managedFields"] = [{
                "manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
                "time": f"2026-12-01T10:00:{second}Z", "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {}}}]
            pods.append(stamped)
        async with httpx.AsyncClient(base_url=f"https://localhost:{webhook.address[1]}", verify=context) as http:
            answers = [(await http.post("/mutate-v1-pod", json=review(p, f"u{i}"))).json()["response"]
                       for i, p in enumerate(pods)]
        # the first marks the key, the second is kept under it, the third is answered from it
        assert (webhook.memo.hits, len(webhook.memo)) == (1, 1) and all(a["allowed"] for a in answers)
        for pod_sent, answer in zip(pods, answers, strict=True):
            mutated = json_patch(pod_sent, orjson.loads(base64.b64decode(answer["patch"])))
            assert mutated["metadata"]["managedFields"] == pod_sent["metadata"]["managedFields"]
            assert mutated["spec"]["schedulerName"] == "tensor-fusion-scheduler"
