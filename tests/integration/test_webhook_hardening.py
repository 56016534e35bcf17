"""The pod webhook against callers that are not the API server, and pods it cannot use.

- A review for a pod that never comes leaves nothing: 50 made-up reviews of bare local pods write
  no workload (the pod reconciler makes one once its pod exists); 50 of remote clients create 50
  workloads marked awaiting-pod-since, and the workload reconciler deletes every one once the
  grace is over, while a real pod's workload, created alongside, is owned by it and kept.
- Bad input is a 4xx, never a 5xx: a body nested 200,000 levels deep, integers beyond 64 bits,
  `1e999999`, a field of the wrong type anywhere in the pod, a pod named `a.` (its workload could
  not be named after it), and a Hypothesis fuzz of pod shapes through the route.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import ssl
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import eventually
from tests.helpers.controller import controllers
from tests.helpers.webhook import (
    BARE,
    kube_with_webhook_objects,  # noqa: F401  (the `kube` fixture of these tests)
    pod,
    serve_webhook,
    webhook_settings,
)
from tfusion.api import annotations as tfa
from tfusion.controller.webhook.server import PATH
from tfusion.controller.webhook.workloads import AWAITING_POD
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient, KubeError

pytestmark = pytest.mark.anyio

GHOSTS = 50


def review(obj: Any, *, uid: str = "u", dry_run: bool = False, namespace: str = "default") -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": uid, "operation": "CREATE", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": namespace,
        "object": obj, "dryRun": dry_run}}


def trust(ctl: Any) -> ssl.SSLContext:
    webhook = ctl.runtime.webhook
    assert webhook is not None
    return ssl.create_default_context(cadata=base64.b64decode(webhook.certs.ca_bundle or "").decode())


def webhook_url(ctl: Any) -> str:
    webhook = ctl.runtime.webhook
    assert webhook is not None
    return f"https://localhost:{webhook.address[1]}"


def assert_refused(answer: httpx.Response, code: int = 400) -> dict[str, Any]:
    """An HTTP 4xx, or a review answered allowed: false with a 4xx code."""
    assert answer.status_code < 500, answer.text
    if answer.status_code != 200:
        assert answer.status_code == code, answer.text
        return dict(answer.json())
    response = answer.json()["response"]
    assert response["allowed"] is False and response["status"]["code"] == code, response
    return dict(response)


async def workload_names(client: KubeClient, prefix: str) -> list[str]:
    return [w["metadata"]["name"] for w in await client.list(r.TENSORFUSIONWORKLOADS, namespace="default")
            if w["metadata"]["name"].startswith(prefix)]


async def test_reviews_for_pods_that_never_come_leave_no_workload(apiserver: Any, kube: KubeClient,
                                                                  tmp_path: Path) -> None:
    """The grace is long while the reviews go in and the real pod is adopted (no reconcile can age
    out a workload however slow the machine), then ends, and the ghosts are looked at again."""
    async with controllers() as tg:
        ctl = await serve_webhook(tg, kube, webhook_settings(apiserver, tmp_path))
        reconcilers = ctl.runtime.reconcilers
        assert reconcilers is not None
        reconcilers.workload.admission_grace = 3600.0
        remote = {**BARE, tfa.IS_LOCAL_GPU: "false"}
        async with httpx.AsyncClient(base_url=webhook_url(ctl), verify=trust(ctl), timeout=30) as http:
            for i in range(GHOSTS):
                for name, notes in ((f"local-{i}", BARE), (f"ghost-{i}", remote)):
                    answer = await http.post(PATH, json=review(pod(name, notes), uid=f"g-{name}"))
                    assert answer.json()["response"]["allowed"] is True
        real = await kube.create(r.PODS, pod("real", BARE), namespace="default")
        ghosts = await workload_names(kube, "ghost-")
        assert len(ghosts) == GHOSTS  # the webhook did write the remote clients' workloads
        assert not await workload_names(kube, "local-")  # and none of a bare local pod's

        async def confirmed() -> bool:
            found = await kube.get(r.TENSORFUSIONWORKLOADS, "real", namespace="default")
            owners = [o["uid"] for o in found["metadata"].get("ownerReferences") or []]
            return AWAITING_POD not in found["metadata"]["annotations"] and owners == [real["metadata"]["uid"]]

        await eventually(confirmed, what="the real pod's workload confirmed and owned by it")
        assert len(await workload_names(kube, "ghost-")) == GHOSTS  # none aged out within the grace
        reconcilers.workload.admission_grace = 0.0
        for name in ghosts:
            reconcilers.workload.controller.enqueue(f"default/{name}")

        async def none_left() -> bool:
            return not await workload_names(kube, "ghost-")

        await eventually(none_left, timeout=60, what="the workloads of pods that never came deleted")
        assert await confirmed()  # the real one stays
        await kube.delete(r.PODS, "real", namespace="default")  # and it goes with its pod

        async def real_gone() -> bool:
            try:
                await kube.get(r.TENSORFUSIONWORKLOADS, "real", namespace="default")
            except KubeError as exc:
                return exc.code == 404
            return False

        await eventually(real_gone, timeout=30, what="the workload collected with its pod")


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


async def test_bodies_out_of_bounds_are_400(apiserver: Any, kube: KubeClient, tmp_path: Path) -> None:
    async with controllers() as tg:
        ctl = await serve_webhook(tg, kube, webhook_settings(apiserver, tmp_path))
        async with httpx.AsyncClient(base_url=webhook_url(ctl), verify=trust(ctl), timeout=30) as http:
            head = orjson.dumps(review(None))[:-2]  # ...,"dryRun":false}} without the closing braces

            def with_object(raw: bytes) -> bytes:
                return head.replace(b'"object":null', b'"object":' + raw) + b"}}"

            deep_object = await http.post(PATH, content=with_object(nested(200_000)))
            assert deep_object.status_code == 400 and deep_object.json()["field"] in ("body", "request.object")
            deep_elsewhere = await http.post(PATH, content=with_object(b"{}")[:-1] + b',"x":' + nested(200_000) + b"}")
            assert deep_elsewhere.status_code == 400, deep_elsewhere.text
            for raw in (b'{"metadata":{"name":"inf"},"spec":{"priority":1e999999}}',
                        b'{"metadata":{"name":"deep"},"spec":' + nested(150) + b"}"):
                answer = await http.post(PATH, content=with_object(raw))
                assert answer.status_code == 400 and answer.json()["field"] == "request.object", answer.text
            # beyond 64 bits: the decoder reads it as a float, which no integer field takes
            big = await http.post(PATH, content=with_object(
                b'{"metadata":{"name":"big"},"spec":{"priority":123456789012345678901234567890}}'))
            assert "spec.priority" in assert_refused(big)["status"]["message"]
            inf = await http.post(PATH, content=with_object(b'{"metadata":{"name":"i"},"x":1e999999}'))
            assert inf.status_code == 400 and "too large" in inf.json()["error"], inf.text
            # in a field no one reads, a float is as good as any value: the pod is mutated as usual
            enabled = orjson.dumps(pod("big", BARE))[:-1] + b',"x":[123456789012345678901234567890123456789]}'
            answer = await http.post(PATH, content=with_object(enabled))
            assert answer.status_code == 200 and answer.json()["response"]["allowed"] is True, answer.text


WRONG_TYPES: list[tuple[str, Any]] = [
    ("metadata", "x"), ("metadata.labels", ["a"]), ("metadata.annotations", {tfa.TFLOPS_REQUEST: 5}),
    ("metadata.annotations", "x"), ("metadata.ownerReferences", {"kind": "ReplicaSet"}),
    ("metadata.ownerReferences", [{"kind": 5, "name": "x", "uid": "u", "controller": True}]),
    ("metadata.name", 7), ("metadata.generateName", ["x"]), ("spec", []), ("spec.containers", 5),
    ("spec.containers", ["app"]), ("spec.containers.0.resources", "x"), ("spec.containers.0.resources.limits", []),
    ("spec.containers.0.ports", {"name": "http"}), ("spec.containers.0.env", "x"), ("spec.volumes", {"a": 1}),
    ("spec.tolerations", "x"), ("spec.schedulerName", 1), ("spec.initContainers", {}), ("spec.nodeSelector", []),
]


def replaced(obj: Any, path: str, value: Any) -> Any:
    parts = path.split(".")
    target = obj
    for part in parts[:-1]:
        target = target[int(part)] if isinstance(target, list) else target[part]
    last = parts[-1]
    target[int(last) if isinstance(target, list) else last] = value
    return obj


async def test_a_field_of_the_wrong_type_anywhere_is_a_denial_naming_it(apiserver: Any, kube: KubeClient,
                                                                          tmp_path: Path) -> None:
    async with controllers() as tg:
        ctl = await serve_webhook(tg, kube, webhook_settings(apiserver, tmp_path))
        async with httpx.AsyncClient(base_url=webhook_url(ctl), verify=trust(ctl), timeout=30) as http:
            for path, value in WRONG_TYPES:
                body = pod("typed", BARE, containers=[{"name": "app", "image": "x", "resources": {"limits": {}},
                                                       "ports": [], "env": []}])
                answer = await http.post(PATH, json=review(replaced(body, path, value), dry_run=True))
                response = assert_refused(answer)
                assert path.split(".")[-1] in response["status"]["message"], (path, response)


async def test_a_pod_named_a_dot_is_refused_with_422(apiserver: Any, kube: KubeClient,
                                                     tmp_path: Path) -> None:
    async with controllers() as tg:
        ctl = await serve_webhook(tg, kube, webhook_settings(apiserver, tmp_path))
        async with httpx.AsyncClient(base_url=webhook_url(ctl), verify=trust(ctl), timeout=30) as http:
            response = assert_refused(await http.post(PATH, json=review(pod("a.", BARE))), 422)
            assert "metadata.name" in response["status"]["message"] and '"a."' in response["status"]["message"]
        with pytest.raises(KubeError) as refused:
            await kube.create(r.PODS, pod("a.", BARE), namespace="default")
        assert refused.value.code == 422 and "a." in str(refused.value)
        assert not await workload_names(kube, "a.")


# --- fuzz ----------------------------------------------------------------------------------------

FUZZ = settings(max_examples=int(os.environ.get("TFUSION_FUZZ_EXAMPLES", "120")), deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])
scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12),
                    st.sampled_from(["", "0", "1", "true", "soft", "hard", "shared", "20", "8Gi", "app", "a.", "-1",
                                     "ReplicaSet", "apps/v1", "auto", "http"]))
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)), max_leaves=12)
PATHS = ["metadata", "metadata.name", "metadata.generateName", "metadata.labels", "metadata.annotations",
         "metadata.ownerReferences", "spec", "spec.containers", "spec.containers.0", "spec.containers.0.name",
         "spec.containers.0.resources", "spec.containers.0.resources.limits", "spec.containers.0.ports",
         "spec.containers.0.env", "spec.containers.0.volumeMounts", "spec.initContainers", "spec.volumes",
         "spec.tolerations", "spec.affinity", "spec.nodeSelector", "spec.schedulerName", "spec.priorityClassName",
         "spec.hostNetwork", "spec.containers.0.env.0", "spec.containers.0.env.0.value", "spec.containers.0.ports.0",
         "spec.containers.0.ports.0.name", "spec.containers.0.volumeMounts.0", "spec.containers.0.resources.requests",
         "metadata.labels.app", "metadata.namespace", "metadata.ownerReferences.0", "metadata.ownerReferences.0.name",
         "metadata.ownerReferences.0.uid", "metadata.ownerReferences.0.controller", "spec.securityContext",
         "spec.containers.0.securityContext", "spec.containers.0.image", "spec.containers.0.command"]
ANNOTATION_KEYS = [tfa.TFLOPS_REQUEST, tfa.VRAM_REQUEST, tfa.TFLOPS_LIMIT, tfa.VRAM_LIMIT, tfa.GPU_COUNT, tfa.QOS,
                   tfa.ISOLATION, tfa.SIDECAR_WORKER, tfa.IS_LOCAL_GPU, tfa.GPU_POOL, tfa.INJECT_CONTAINER,
                   tfa.GANG_ENABLED, tfa.GPU_INDICES, tfa.COMPUTE_PERCENT_REQUEST, tfa.DEDICATED_GPU,
                   tfa.ENABLED_REPLICAS, tfa.AUTOSCALE, tfa.WORKLOAD_PROFILE, tfa.DISABLE_FEATURES]


@st.composite
def pods(draw: st.DrawFn) -> Any:
    notes = {**BARE, **draw(st.dictionaries(st.sampled_from(ANNOTATION_KEYS),
                                            st.one_of(st.text(max_size=10), st.sampled_from(
                                                ["1", "0", "2", "true", "false", "soft", "hard", "x", "8Gi"])),
                                            max_size=4))}
    labels = draw(st.dictionaries(st.sampled_from([tfa.HOST_PORT, tfa.PORT_NAME, "app"]),
                                  st.sampled_from(["auto", "http", "x", ""]), max_size=2))
    body = pod(draw(st.sampled_from(["fz", "a.", "fz-" + "x" * 250])), notes, labels=labels, containers=[
        {"name": "app", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}},
         "ports": [{"name": "http", "containerPort": 80}], "env": [{"name": "A", "value": "1"}],
         "volumeMounts": [{"name": "v", "mountPath": "/v"}]}])
    if draw(st.booleans()):
        body["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": draw(st.sampled_from(
            ["ReplicaSet", "Job", "StatefulSet", "Other"])), "name": draw(st.sampled_from(["rs", "a.", "x/y", ""])),
            "uid": "u", "controller": True}]
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        try:
            replaced(body, draw(st.sampled_from(PATHS)), draw(json_values))
        except (KeyError, IndexError, TypeError, ValueError):
            continue  # a path through a value replaced before
    return body


async def test_fuzzed_pods_never_get_a_5xx(apiserver: Any, kube: KubeClient, tmp_path: Path) -> None:
    async with controllers() as tg:
        ctl = await serve_webhook(tg, kube, webhook_settings(apiserver, tmp_path))
        context, url = trust(ctl), webhook_url(ctl)

        def fuzz() -> None:
            with httpx.Client(base_url=url, verify=context, timeout=30) as http:

                @FUZZ
                @given(body=pods(), dry_run=st.booleans())
                def check(body: Any, dry_run: bool) -> None:
                    # json, not orjson: it writes the integers beyond 64 bits a caller may send
                    answer = http.post(PATH, content=json.dumps(review(body, dry_run=dry_run)).encode())
                    assert answer.status_code < 500, answer.text
                    if answer.status_code == 200:
                        status = answer.json()["response"].get("status") or {}
                        assert int(status.get("code") or 200) < 500, (body, status)

                check()

        await anyio.to_thread.run_sync(fuzz)


async def test_a_mark_left_by_a_controller_killed_meanwhile_is_acted_on_at_start(
        apiserver: Any, kube: KubeClient, tmp_path: Path) -> None:
    """The webhook's mark lives on the workload, so the next leader deletes what its predecessor
    created for a pod that never came, and leaves alone what was not the webhook's."""
    spec = {"poolName": "pool-a", "resources": {"requests": {"tflops": "1", "vram": "1Gi"},
                                                "limits": {"tflops": "1", "vram": "1Gi"}}}
    long_ago = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)).isoformat()
    await kube.create(r.TENSORFUSIONWORKLOADS, {"metadata": {"name": "left-behind", "namespace": "default",
                                                             "annotations": {AWAITING_POD: long_ago}},
                                                "spec": spec}, namespace="default")
    await kube.create(r.TENSORFUSIONWORKLOADS, {"metadata": {"name": "users-own", "namespace": "default"},
                                                "spec": spec}, namespace="default")
    async with controllers() as tg:
        await serve_webhook(tg, kube, webhook_settings(apiserver, tmp_path))

        async def left_behind_gone() -> bool:
            return await workload_names(kube, "left-behind") == []

        await eventually(left_behind_gone, timeout=30, what="the workload left behind deleted")
        # the same workload without the mark is kept: the mark is what made it go (the outcome, not
        # the reconciler's counter: under load a delete that succeeds may answer the client too late,
        # and the retry then finds nothing left to delete)
        assert await workload_names(kube, "users-own") == ["users-own"]


async def test_a_bare_pod_gone_before_it_adopted_its_workload_leaves_none(
        apiserver: Any, kube: KubeClient, tmp_path: Path) -> None:
    """A pod of the workload that has yet to become its owner keeps the workload marked (and
    kept); once that pod is gone without adopting it, nothing would ever own it, so it goes."""
    async with controllers() as tg:
        ctl = await serve_webhook(tg, kube, webhook_settings(apiserver, tmp_path))
        reconcilers = ctl.runtime.reconcilers
        assert reconcilers is not None
        reconcilers.workload.admission_grace = 1.0
        await kube.create(r.TENSORFUSIONWORKLOADS, {"metadata": {
            "name": "unadopted", "namespace": "default",
            "annotations": {AWAITING_POD: dt.datetime.now(dt.UTC).isoformat()}}, "spec": {
            "poolName": "pool-a", "resources": {"requests": {"tflops": "1", "vram": "1Gi"},
                                                "limits": {"tflops": "1", "vram": "1Gi"}}}}, namespace="default")
        # a worker of it whose adoption is still pending (it names a workload that is not there)
        await kube.create(r.PODS, {"metadata": {
            "name": "worker", "namespace": "default",
            "labels": {tfa.COMPONENT: tfa.COMPONENT_WORKER, tfa.WORKLOAD: "unadopted"},
            "annotations": {tfa.PENDING_OWNED_WORKLOAD: "not-yet"}},
            "spec": {"containers": [{"name": "app", "image": "x"}]}}, namespace="default")

        async def counted() -> bool:
            found = await kube.get(r.TENSORFUSIONWORKLOADS, "unadopted", namespace="default")
            return (found.get("status") or {}).get("workerCount") == 1

        await eventually(counted, what="the workload reconciled with its pod in the cache")
        found = await kube.get(r.TENSORFUSIONWORKLOADS, "unadopted", namespace="default")
        assert AWAITING_POD in found["metadata"]["annotations"]  # not confirmed by a pod yet to adopt it
        await kube.delete(r.PODS, "worker", namespace="default")

        async def unadopted_gone() -> bool:
            return await workload_names(kube, "unadopted") == []

        await eventually(unadopted_gone, timeout=30, what="the workload nothing will own deleted")
