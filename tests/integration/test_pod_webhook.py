"""The pod webhook end to end: an in-process controller serving it over TLS, registered with the
embedded API server (which calls it through the webhook Service, verifying the caBundle), and
pods created through the API: mutation, the workload, quota defaults, QoS, auto-migration,
denials as kubectl shows them, dryRun, internal failures, certificates kept across restarts and
rotated, and the leader's index and port allocators with their routes."""

from __future__ import annotations

import base64
import datetime as dt
import ssl
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx
import pytest
import yaml
from cryptography import x509

from tests.helpers import eventually
from tests.helpers.controller import Controller, controllers, start_controller
from tests.helpers.kubectl import KUBECTL, needs_kubectl
from tests.helpers.scheduler_index import gone
from tests.helpers.webhook import (
    BARE,
    OPS,
    POOL,
    SERVICE,
    kube_with_webhook_objects,  # noqa: F401  (the `kube` fixture of these tests)
    pod,
    serve_webhook,
    webhook_settings,
)
from tfusion.api import annotations as tfa
from tfusion.api import podindex
from tfusion.controller.webhook import certs
from tfusion.controller.webhook.registration import CONFIGURATION_NAME, MUTATING_WEBHOOK_CONFIGURATIONS
from tfusion.controller.webhook.server import MAX_REVIEW_BYTES
from tfusion.controller.webhook.workloads import AWAITING_POD, WorkloadWriter
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient, KubeError
from tfusion.kube.informer import Informer

pytestmark = pytest.mark.anyio

CRDS = r.ApiResource("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False)


async def served_certificate(port: int) -> x509.Certificate:
    pem = await anyio.to_thread.run_sync(lambda: ssl.get_server_certificate(("127.0.0.1", port)))
    return x509.load_pem_x509_certificate(pem.encode())


async def test_a_bare_pod_comes_back_mutated_with_its_workload(apiserver: Any, kube: KubeClient,
                                                               tmp_path: Path) -> None:
    async with controllers() as tg:
        ctl = await serve_webhook(tg, kube, webhook_settings(apiserver, tmp_path))
        created = await kube.create(r.PODS, pod("bare", BARE), namespace="default")
        notes, spec = created["metadata"]["annotations"], created["spec"]
        assert notes[tfa.GPU_POOL] == POOL and notes[tfa.ISOLATION] == "soft" and notes[tfa.QOS] == "medium"
        assert notes[tfa.PENDING_OWNED_WORKLOAD] == "bare"
        assert created["metadata"]["labels"][tfa.COMPONENT] == "worker"
        assert spec["schedulerName"] == "tensor-fusion-scheduler"
        assert spec["initContainers"][0]["name"] == "init-soft-limiter"
        assert any(k.startswith("tensor-fusion.ai/index_") for k in spec["containers"][0]["resources"]["limits"])
        # the pod reconciler creates the workload the webhook decided on, owned by the pod from the
        # start; deleted and created again under its name, the new pod keeps the workload (the
        # garbage collector would take it along with the old pod)
        await eventually(lambda: _owned_by(ctl, "default/bare", created["metadata"]["uid"]),
                         what="the workload owned by the pod, in the cache")
        workload = await kube.get(r.TENSORFUSIONWORKLOADS, "bare", namespace="default")
        assert workload["spec"]["poolName"] == POOL
        assert workload["spec"]["resources"]["requests"] == {"tflops": "20", "vram": "8Gi"}
        assert tfa.FINALIZER in workload["metadata"]["finalizers"]
        assert AWAITING_POD not in (workload["metadata"].get("annotations") or {})
        await kube.delete(r.PODS, "bare", namespace="default")
        with anyio.fail_after(10):  # created again at once, as `kubectl replace --force` does
            while not await gone(kube, "bare"):
                await anyio.sleep(0)
        again = await kube.create(r.PODS, pod("bare", BARE), namespace="default")
        assert again["metadata"]["annotations"][tfa.PENDING_OWNED_WORKLOAD] == "bare"
        await eventually(lambda: _owned_by(ctl, "default/bare", again["metadata"]["uid"]),
                         what="the workload owned by the new pod")
        await anyio.sleep(0.3)  # whatever the collector had queued for the old pod has run by now
        kept = await kube.get(r.TENSORFUSIONWORKLOADS, "bare", namespace="default")
        assert [o["uid"] for o in kept["metadata"]["ownerReferences"]] == [again["metadata"]["uid"]]


async def test_a_bare_pod_waits_for_its_terminating_workload_and_gets_a_new_one(
        apiserver: Any, kube: KubeClient, tmp_path: Path) -> None:
    """The race the test above can lose under load, made certain: the old pod's workload is still
    being deleted (its finalizer's cleanup not done) when the new pod is admitted. Patching it
    would leave the new pod with a workload about to vanish; the webhook admits the pod at once and
    the pod reconciler waits for the old workload to go and creates the new pod's own."""
    hold = "example.com/hold"
    async with controllers() as tg:
        ctl = await serve_webhook(tg, kube, webhook_settings(apiserver, tmp_path))
        old = await kube.create(r.PODS, pod("bare", BARE), namespace="default")
        await eventually(lambda: _owned_by(ctl, "default/bare", old["metadata"]["uid"]), what="the first owner")
        await kube.patch(r.TENSORFUSIONWORKLOADS, "bare", {"metadata": {"finalizers": [hold]}}, namespace="default")
        await kube.delete(r.TENSORFUSIONWORKLOADS, "bare", namespace="default")
        await kube.delete(r.PODS, "bare", namespace="default")
        with anyio.fail_after(10):
            while not await gone(kube, "bare"):
                await anyio.sleep(0)
        terminating = await kube.get(r.TENSORFUSIONWORKLOADS, "bare", namespace="default")
        assert terminating["metadata"].get("deletionTimestamp")

        async def release_later() -> None:
            await anyio.sleep(0.5)
            current = await kube.get(r.TENSORFUSIONWORKLOADS, "bare", namespace="default")
            left = [f for f in current["metadata"].get("finalizers") or [] if f != hold]
            await kube.patch(r.TENSORFUSIONWORKLOADS, "bare", {"metadata": {"finalizers": left or None}},
                             namespace="default")

        tg.start_soon(release_later)
        with anyio.fail_after(0.4):  # admitted without waiting: the workload is the pod reconciler's to make
            again = await kube.create(r.PODS, pod("bare", BARE), namespace="default")
        await eventually(lambda: _owned_by(ctl, "default/bare", again["metadata"]["uid"]),
                         what="the new workload owned by the new pod")
        fresh = await kube.get(r.TENSORFUSIONWORKLOADS, "bare", namespace="default")
        assert fresh["metadata"]["uid"] != terminating["metadata"]["uid"]
        assert not fresh["metadata"].get("deletionTimestamp")


async def test_a_workload_deleted_after_the_webhook_wrote_it_is_made_again(kube: KubeClient) -> None:
    """The writer keeps its last answer until the informer catches up with it; once the informer
    has seen the workload deleted, that answer is stale, whether or not a delete handler has run
    yet (under load it had not, and a bare pod created again under its name was admitted onto the
    deleted workload, which nothing then made again: CI failed the test above on it)."""
    informer = Informer(kube, r.TENSORFUSIONWORKLOADS)
    writer = WorkloadWriter(kube, informer)
    desired: dict[str, Any] = {"apiVersion": r.TENSORFUSIONWORKLOADS.api_version,
                               "kind": r.TENSORFUSIONWORKLOADS.kind,
                               "metadata": {"name": "short-lived", "namespace": "default"},
                               "spec": {"poolName": POOL, "resources": {"requests": {"tflops": "1", "vram": "1Gi"},
                                                                          "limits": {"tflops": "1", "vram": "1Gi"}}}}
    async with anyio.create_task_group() as tg:
        tg.start_soon(informer.run)
        await informer.wait_synced()
        assert await writer.ensure(desired) == "created"
        first = await kube.get(r.TENSORFUSIONWORKLOADS, "short-lived", namespace="default")
        await kube.patch(r.TENSORFUSIONWORKLOADS, "short-lived", {"metadata": {"finalizers": None}},
                         namespace="default")
        await kube.delete(r.TENSORFUSIONWORKLOADS, "short-lived", namespace="default")
        await eventually(lambda: _seen_and_gone(informer, "default/short-lived", first),
                         what="the informer past the workload's deletion")
        assert await writer.ensure(desired) == "created"
        again = await kube.get(r.TENSORFUSIONWORKLOADS, "short-lived", namespace="default")
        assert again["metadata"]["uid"] != first["metadata"]["uid"]
        tg.cancel_scope.cancel()


async def _seen_and_gone(informer: Informer, key: str, obj: dict[str, Any]) -> bool:
    return informer.get(key) is None and int(informer.resource_version or 0) > int(obj["metadata"]["resourceVersion"])


async def _owned_by(ctl: Controller, key: str, pod_uid: str) -> dict[str, Any] | None:
    cached = ctl.runtime.informer(r.TENSORFUSIONWORKLOADS).get(key)
    owners = [(o.get("kind"), o.get("uid"), o.get("controller")) for o in
              ((cached or {}).get("metadata") or {}).get("ownerReferences") or []]
    return dict(cached) if cached is not None and owners == [("Pod", pod_uid, True)] else None


async def test_quota_defaults_high_qos_and_dry_run(apiserver: Any, kube: KubeClient, tmp_path: Path) -> None:
    await kube.create(r.GPURESOURCEQUOTAS, {"metadata": {"name": "q", "namespace": "default"}, "spec": {"single": {
        "defaultRequests": {"tflops": "5", "vram": "2Gi"}, "defaultLimits": {"tflops": "5", "vram": "2Gi"}}}})
    async with controllers() as tg:
        await serve_webhook(tg, kube, webhook_settings(apiserver, tmp_path))

        async def quota_cached() -> bool:
            return bool(await kube.list(r.GPURESOURCEQUOTAS, namespace="default"))

        await eventually(quota_cached)
        await anyio.sleep(0.3)  # the controller's quota informer
        created = await kube.create(r.PODS, pod("defaults"), namespace="default")
        notes = created["metadata"]["annotations"]
        assert (notes[tfa.TFLOPS_REQUEST], notes[tfa.VRAM_LIMIT]) == ("5", "2Gi")
        assert notes[tfa.QOS] == "high", "requests equal limits"
        assert created["spec"]["priorityClassName"] == "tensor-fusion-high" and created["spec"]["priority"] == 10000
        dry = await kube.create(r.PODS, pod("dry", {**BARE, tfa.QOS: "critical"}), namespace="default",
                                params={"dryRun": "All"})
        assert dry["spec"]["priorityClassName"] == "tensor-fusion-critical"
        names = [p["metadata"]["name"] for p in await kube.list(r.PODS, namespace="default")]
        assert "dry" not in names
        with pytest.raises(KubeError):
            await kube.get(r.TENSORFUSIONWORKLOADS, "dry", namespace="default")


async def test_native_gpu_pods_migrate_with_auto_migration(apiserver: Any, kube: KubeClient, tmp_path: Path) -> None:
    settings = webhook_settings(apiserver, tmp_path)
    native = pod("native", containers=[{"name": "train", "image": "pytorch",
                                        "resources": {"limits": {"nvidia.com/gpu": "2"}}}])
    native["metadata"]["labels"] = {}
    async with controllers() as tg:
        await serve_webhook(tg, kube, settings)
        untouched = await kube.create(r.PODS, native, namespace="default")
        assert "schedulerName" not in untouched["spec"] or untouched["spec"]["schedulerName"] == "default-scheduler"
        await kube.delete(r.PODS, "native", namespace="default")
        Path(settings.dynamic_config).write_text(yaml.safe_dump({"autoMigration": {"enable": True}}))

        async def widened() -> bool:
            config = await kube.get(MUTATING_WEBHOOK_CONFIGURATIONS, CONFIGURATION_NAME)
            return bool(config["webhooks"][0]["objectSelector"]["matchExpressions"][0]["operator"] == "NotIn")

        await eventually(widened, what="the objectSelector widened for auto-migration")
        migrated = await kube.create(r.PODS, native, namespace="default")
        notes = migrated["metadata"]["annotations"]
        assert notes[tfa.GPU_COUNT] == "2" and notes[tfa.ISOLATION] == "shared"
        assert migrated["metadata"]["labels"][tfa.ENABLED] == "true"
        assert "nvidia.com/gpu" not in migrated["spec"]["containers"][0]["resources"]["limits"]
        assert migrated["spec"]["schedulerName"] == "tensor-fusion-scheduler"


INVALID = [
    ({tfa.GPU_COUNT: "0"}, 'annotation tensor-fusion.ai/gpu-count: "0" is not allowed; expected an integer '
                           'from 1 to 128'),
    ({tfa.QOS: "urgent"}, 'tensor-fusion.ai/qos: "urgent" is not allowed; expected one of low|medium|high|critical'),
    ({tfa.GPU_POOL: "nope"}, 'tensor-fusion.ai/gpupool: "nope" is not allowed'),
    ({tfa.IS_LOCAL_GPU: "false", tfa.SIDECAR_WORKER: "true"}, 'sidecar-worker: "true" needs local GPU mode'),
]


@needs_kubectl
async def test_invalid_annotations_are_denied_through_kubectl(apiserver: Any, kube: KubeClient,
                                                              tmp_path: Path) -> None:
    async with controllers() as tg:
        await serve_webhook(tg, kube, webhook_settings(apiserver, tmp_path))
        for i, (notes, expected) in enumerate(INVALID):
            manifest = tmp_path / f"bad{i}.yaml"
            manifest.write_text(yaml.safe_dump(pod(f"bad{i}", {**BARE, **notes})))
            result = await anyio.run_process([KUBECTL, "--kubeconfig", apiserver.kubeconfig, "create", "-f",
                                              str(manifest)], check=False)
            stderr = result.stderr.decode()
            assert result.returncode == 1
            assert 'admission webhook "pod.tensor-fusion.ai" denied the request: ' in stderr, stderr
            assert expected in stderr, stderr
        with pytest.raises(KubeError) as info:
            await kube.create(r.PODS, pod("bad", {**BARE, tfa.GPU_COUNT: "0"}), namespace="default")
        assert info.value.code == 400


async def test_an_internal_failure_is_500_and_leaves_nothing(apiserver: Any, kube: KubeClient,
                                                             tmp_path: Path) -> None:
    async with controllers() as tg:
        ctl = await serve_webhook(tg, kube, webhook_settings(apiserver, tmp_path))
        await ctl.runtime.informer(r.TENSORFUSIONWORKLOADS).wait_synced()
        await kube.delete(CRDS, "tensorfusionworkloads.tensor-fusion.ai")

        async def gone() -> bool:
            try:
                await kube.list(r.TENSORFUSIONWORKLOADS)
            except KubeError:
                return True
            return False

        await eventually(gone)
        owned = pod("orphan", BARE)  # an owned pod's workload is written at admission (a bare pod's is not)
        owned["metadata"]["ownerReferences"] = [{"apiVersion": "example.com/v1", "kind": "Widget", "name": "w",
                                                 "uid": "widget-1", "controller": True}]
        with pytest.raises(KubeError) as info:
            await kube.create(r.PODS, owned, namespace="default")
        assert info.value.code == 500 and "internal error: the API server failed" in str(info.value)
        assert not [p for p in await kube.list(r.PODS, namespace="default") if p["metadata"]["name"] == "orphan"]


async def test_the_certificate_survives_a_restart_and_is_rotated(apiserver: Any, kube: KubeClient,
                                                                 tmp_path: Path) -> None:
    settings = webhook_settings(apiserver, tmp_path)
    async with controllers() as tg:
        ctl = await serve_webhook(tg, kube, settings)
        first = await served_certificate(ctl.runtime.webhook.address[1])  # type: ignore[union-attr]
        names = first.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert f"{SERVICE}.{OPS}.svc" in names.get_values_for_type(x509.DNSName)
        await ctl.stop()
        ctl = await serve_webhook(tg, kube, settings)
        again = await served_certificate(ctl.runtime.webhook.address[1])  # type: ignore[union-attr]
        assert again.serial_number == first.serial_number, "the restarted replica serves the Secret's certificate"

        # the serving certificate is about to expire: renewed in place, no restart
        secret = await kube.get(r.SECRETS, certs.SECRET_NAME, namespace=OPS)
        ca_pem, ca_key = (base64.b64decode(secret["data"][k]) for k in (certs.CA_CRT, certs.CA_KEY))
        now = dt.datetime.now(dt.UTC)
        dns, ips = certs.split_hosts(ctl.runtime.webhook.hosts())  # type: ignore[union-attr]
        short, key = certs.issue_serving(ca_pem, ca_key, dns, ips, now=now, validity=dt.timedelta(hours=1))
        secret["data"][certs.TLS_CRT] = base64.b64encode(short).decode()
        secret["data"][certs.TLS_KEY] = base64.b64encode(key).decode()
        await kube.replace(r.SECRETS, secret, namespace=OPS)
        await ctl.runtime.webhook.refresh()  # type: ignore[union-attr]
        renewed = await served_certificate(ctl.runtime.webhook.address[1])  # type: ignore[union-attr]
        assert renewed.serial_number not in (first.serial_number, x509.load_pem_x509_certificate(short).serial_number)
        assert renewed.not_valid_after_utc > now + dt.timedelta(days=300)
        assert (await kube.create(r.PODS, pod("after-renewal", BARE), namespace="default"))["spec"]["schedulerName"] \
            == "tensor-fusion-scheduler"

        # the CA itself is near its end: a new CA, both in the caBundle, and the API server still calls us
        old_ca, old_ca_key = certs.issue_ca(now=now, validity=dt.timedelta(days=30))
        secret = await kube.get(r.SECRETS, certs.SECRET_NAME, namespace=OPS)
        cert_pem, key_pem = certs.issue_serving(old_ca, old_ca_key, dns, ips, now=now)
        secret["data"] = {certs.CA_CRT: base64.b64encode(old_ca).decode(),
                          certs.CA_KEY: base64.b64encode(old_ca_key).decode(),
                          certs.TLS_CRT: base64.b64encode(cert_pem).decode(),
                          certs.TLS_KEY: base64.b64encode(key_pem).decode()}
        await kube.replace(r.SECRETS, secret, namespace=OPS)
        await ctl.runtime.webhook.refresh()  # type: ignore[union-attr]
        config = await kube.get(MUTATING_WEBHOOK_CONFIGURATIONS, CONFIGURATION_NAME)
        bundle = x509.load_pem_x509_certificates(base64.b64decode(config["webhooks"][0]["clientConfig"]["caBundle"]))
        assert len(bundle) == 2 and bundle[1].subject == x509.load_pem_x509_certificate(old_ca).subject
        assert bundle[0].not_valid_after_utc > now + dt.timedelta(days=3000)
        created = await kube.create(r.PODS, pod("after-ca-rotation", BARE), namespace="default")
        assert created["spec"]["schedulerName"] == "tensor-fusion-scheduler"


async def test_index_and_port_routes_need_the_controllers_own_token(apiserver: Any, kube: KubeClient,
                                                                    tmp_path: Path) -> None:
    await kube.create(r.SERVICEACCOUNTS, {"metadata": {"name": "tensor-fusion-operator", "namespace": OPS}},
                      namespace=OPS)
    own = await kube.request_token(OPS, "tensor-fusion-operator")
    other = await kube.request_token("default", "default")
    async with controllers() as tg:
        ctl = await serve_webhook(tg, kube, webhook_settings(apiserver, tmp_path))
        http = ctl.http
        missing = await http.get("/api/assign-index", params={"podName": "x"})
        assert missing.status_code == 401 and missing.text.startswith("unauthorized: no Authorization header")
        assert missing.headers["content-type"].startswith("text/plain")
        foreign = await http.get("/api/assign-index", params={"podName": "x"},
                                 headers={"Authorization": f"Bearer {other}"})
        assert foreign.status_code == 401 and "is not the controller's ServiceAccount" in foreign.text
        forged = await http.get("/api/assign-index", params={"podName": "x"}, headers={"Authorization": "Bearer xyz"})
        assert forged.status_code == 401
        index = await http.get("/api/assign-index", params={"podName": "default/x"},
                               headers={"Authorization": f"Bearer {own}"})
        assert index.status_code == 200 and 1 <= int(index.text) <= 128
        port = await http.post("/api/assign-host-port", params={"podName": "default/y"},
                               headers={"Authorization": f"Bearer {own}"})
        assert port.status_code == 200 and port.text == "42000"


def host_port_pod(name: str) -> dict[str, Any]:
    return pod(name, BARE, labels={tfa.HOST_PORT: "auto", tfa.PORT_NAME: "http"},
               containers=[{"name": "app", "image": "srv", "ports": [{"name": "http", "containerPort": 80}]}])


def _host_port(created: dict[str, Any]) -> int:
    return int(created["spec"]["containers"][0]["ports"][0]["hostPort"])


async def test_ports_are_released_on_deletion_and_rebuilt_each_term(apiserver: Any, kube: KubeClient,
                                                                    tmp_path: Path) -> None:
    settings = webhook_settings(apiserver, tmp_path)
    async with controllers() as tg:
        ctl = await serve_webhook(tg, kube, settings)
        a = await kube.create(r.PODS, host_port_pod("a"), namespace="default")
        b = await kube.create(r.PODS, host_port_pod("b"), namespace="default")
        assert (_host_port(a), _host_port(b)) == (42000, 42001)
        assert a["metadata"]["annotations"][tfa.PORT_NUMBER] == "42000"
        assignments = ctl.runtime.webhook.assignments  # type: ignore[union-attr]

        async def held() -> bool:
            return assignments.ports is not None and len(assignments.ports.cluster.held()) == 2

        await eventually(held, what="both ports held by their pods")
        await kube.delete(r.PODS, "a", namespace="default")

        async def released() -> bool:
            return assignments.ports is not None and 42000 not in assignments.ports.cluster.held().values()

        await eventually(released, what="the deleted pod's port released")
        c = await kube.create(r.PODS, host_port_pod("c"), namespace="default")
        assert _host_port(c) == 42000
        await ctl.stop()

        ctl = await serve_webhook(tg, kube, settings)
        d = await kube.create(r.PODS, host_port_pod("d"), namespace="default")
        assert _host_port(d) == 42002, "the new term rebuilt the ports held by b and c"
        live = [p for p in await kube.list(r.PODS, namespace="default")]
        indices = [_index(p) for p in live if p["metadata"]["name"] != "d"]
        assert _index(d) not in indices


def _index(created: dict[str, Any]) -> int:
    limits = created["spec"]["containers"][0]["resources"]["limits"]
    (name,) = [k for k in limits if k.startswith("tensor-fusion.ai/index_")]
    return podindex.decode_pod_index(name, int(limits[name]))


async def test_enable_webhooks_false_serves_and_registers_nothing(apiserver: Any, kube: KubeClient,
                                                                 tmp_path: Path) -> None:
    async with controllers() as tg:
        ctl = await start_controller(tg, webhook_settings(apiserver, tmp_path, enable_webhooks=False))
        assert ctl.runtime.webhook is None
        await anyio.sleep(0.3)
        with pytest.raises(KubeError):
            await kube.get(MUTATING_WEBHOOK_CONFIGURATIONS, CONFIGURATION_NAME)
        assert (await ctl.http.get("/api/assign-index")).status_code == 401


async def test_a_malformed_review_is_400(apiserver: Any, kube: KubeClient, tmp_path: Path) -> None:
    async with controllers() as tg:
        ctl = await serve_webhook(tg, kube, webhook_settings(apiserver, tmp_path))
        webhook = ctl.runtime.webhook
        assert webhook is not None
        context = ssl.create_default_context(cadata=base64.b64decode(webhook.certs.ca_bundle or "").decode())
        async with httpx.AsyncClient(base_url=f"https://localhost:{webhook.address[1]}", verify=context) as http:
            bad = await http.post("/mutate-v1-pod", content=b"{not json")
            assert bad.status_code == 400 and bad.json()["field"] == "body"
            wrong = await http.post("/mutate-v1-pod", json={"apiVersion": "v1", "kind": "Pod"})
            assert wrong.status_code == 400 and wrong.json()["field"] == "apiVersion"
            other = await http.post("/mutate-v1-pod", json={"apiVersion": "admission.k8s.io/v1",
                                                            "kind": "AdmissionReview",
                                                            "request": {"uid": "u", "operation": "DELETE"}})
            assert other.json()["response"] == {"uid": "u", "allowed": True}
            get = await http.get("/mutate-v1-pod")
            assert get.status_code == 405 and get.headers["allow"] == "POST" and get.json()["allowed"] == ["POST"]
            big = await http.post("/mutate-v1-pod", content=b" " * (MAX_REVIEW_BYTES + 1))
            assert big.status_code == 413 and "at most" in big.json()["error"]


async def test_a_follower_gets_its_index_from_the_leader(apiserver: Any, kube: KubeClient, tmp_path: Path) -> None:
    await kube.create(r.SERVICEACCOUNTS, {"metadata": {"name": "tensor-fusion-operator", "namespace": OPS}},
                      namespace=OPS)
    token = await kube.request_token(OPS, "tensor-fusion-operator")
    # A long lease: the follower must never take over, even when a loaded machine delays a renewal.
    steady = {"leader_elect": True, "leader_lease_duration": 60.0, "leader_renew_deadline": 45.0}
    async with controllers() as tg:
        first = await start_controller(tg, webhook_settings(apiserver, tmp_path, pod_name="ctl-a", **steady))

        async def leading() -> bool:
            return first.runtime.webhook is not None and first.runtime.webhook.assignments.indexes is not None

        await eventually(leading, what="the first controller leading")
        follower = await serve_webhook(tg, kube, webhook_settings(apiserver, tmp_path, pod_name="ctl-b", **steady))
        assert not follower.runtime.is_leader
        helper = follower.runtime.webhook.assignments  # type: ignore[union-attr]
        helper.token_source = lambda: token
        assert first.runtime.address is not None

        async def leader_url() -> str:
            return f"http://127.0.0.1:{first.runtime.address[1]}"  # type: ignore[index]

        helper.leader_address = leader_url
        created = await kube.create(r.PODS, pod("via-follower", BARE), namespace="default")
        leader = first.runtime.webhook.assignments  # type: ignore[union-attr]
        assert leader.indexes is not None
        # The leader's claim: still reserved under the admission's key, or held by the pod once its
        # cache has it (asking the leader again would hand out a new index after that).
        claims = {leader.indexes.claims.reservation("default/via-follower"),
                  leader.indexes.held().get(created["metadata"]["uid"])}
        assert _index(created) in claims, "the leader made the assignment"
        refused = await follower.http.get("/api/assign-index", params={"podName": "z"},
                                          headers={"Authorization": f"Bearer {token}"})
        assert refused.status_code == 503 and "not the leader" in refused.text


async def test_cert_dir_is_served_and_the_ca_bundle_left_alone(apiserver: Any, kube: KubeClient,
                                                              tmp_path: Path) -> None:
    now = dt.datetime.now(dt.UTC)
    ca_pem, ca_key = certs.issue_ca(now=now, name="cert-manager-ca")
    directory = tmp_path / "serving-certs"
    directory.mkdir()

    def write_cert() -> x509.Certificate:
        cert_pem, key_pem = certs.issue_serving(ca_pem, ca_key, certs.service_names(SERVICE, OPS), [], now=now)
        (directory / "tls.crt").write_bytes(cert_pem)
        (directory / "tls.key").write_bytes(key_pem)
        return x509.load_pem_x509_certificate(cert_pem)

    first = write_cert()
    async with controllers() as tg:
        ctl = await start_controller(tg, webhook_settings(apiserver, tmp_path, webhook_cert_dir=str(directory)))
        webhook = ctl.runtime.webhook
        assert webhook is not None
        await kube.create(r.SERVICES, {"metadata": {"name": SERVICE, "namespace": OPS},
                                       "spec": {"ports": [{"port": 443, "targetPort": webhook.address[1]}]}},
                          namespace=OPS)

        async def registered() -> Any:
            try:
                return await kube.get(MUTATING_WEBHOOK_CONFIGURATIONS, CONFIGURATION_NAME)
            except KubeError:
                return None

        config = await eventually(registered)
        assert "caBundle" not in config["webhooks"][0]["clientConfig"]
        with pytest.raises(KubeError):
            await kube.get(r.SECRETS, certs.SECRET_NAME, namespace=OPS)
        # what cert-manager's CA injector does
        config["webhooks"][0]["clientConfig"]["caBundle"] = base64.b64encode(ca_pem).decode()
        await kube.replace(MUTATING_WEBHOOK_CONFIGURATIONS, config)
        await webhook.refresh()
        kept = await kube.get(MUTATING_WEBHOOK_CONFIGURATIONS, CONFIGURATION_NAME)
        assert kept["webhooks"][0]["clientConfig"]["caBundle"] == base64.b64encode(ca_pem).decode()
        assert (await served_certificate(webhook.address[1])).serial_number == first.serial_number
        created = await kube.create(r.PODS, pod("cert-manager", BARE), namespace="default")
        assert created["spec"]["schedulerName"] == "tensor-fusion-scheduler"
        await anyio.sleep(0.05)  # a new mtime
        second = write_cert()
        await webhook.refresh()
        assert (await served_certificate(webhook.address[1])).serial_number == second.serial_number


DEPLOYMENTS = r.ApiResource("apps", "v1", "deployments", "Deployment", True)
REPLICASETS = r.ApiResource("apps", "v1", "replicasets", "ReplicaSet", True)
TEMPLATE = {"metadata": {"labels": {"app": "train"}},
            "spec": {"containers": [{"name": "app", "image": "pytorch"}]}}


async def owned_pod(kube: KubeClient, name: str, rs: dict[str, Any], notes: dict[str, str]) -> dict[str, Any]:
    """A pod of `rs` named `name`; a name ending in "-" is a generateName, as the ReplicaSet controller sends."""
    body = pod(name, notes, labels={"app": "train", "pod-template-hash": "abc123"})
    if name.endswith("-"):
        body["metadata"]["generateName"] = body["metadata"].pop("name")
    body["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                            "name": rs["metadata"]["name"], "uid": rs["metadata"]["uid"],
                                            "controller": True, "blockOwnerDeletion": True}]
    return await kube.create(r.PODS, body, namespace="default")


async def deployment_and_replicaset(kube: KubeClient, replicas: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Deployment "train" and its ReplicaSet "train-abc123", as kube-controller-manager makes them."""
    selector = {"matchLabels": {"app": "train"}}
    deployment = await kube.create(DEPLOYMENTS, {"metadata": {"name": "train", "namespace": "default"}, "spec": {
        "replicas": replicas, "selector": selector, "template": TEMPLATE}}, namespace="default")
    rs = await kube.create(REPLICASETS, {"metadata": {
        "name": "train-abc123", "namespace": "default", "labels": {"app": "train"},
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "train",
                             "uid": deployment["metadata"]["uid"], "controller": True}]},
        "spec": {"replicas": replicas, "selector": selector, "template": TEMPLATE}}, namespace="default")
    return deployment, rs


async def test_deployment_pods_share_one_workload_and_grey_release_counts(apiserver: Any, kube: KubeClient,
                                                                           tmp_path: Path) -> None:
    deployment, rs = await deployment_and_replicaset(kube, 3)
    async with controllers() as tg:
        ctl = await serve_webhook(tg, kube, webhook_settings(apiserver, tmp_path))
        notes = {**BARE, tfa.GANG_ENABLED: "true", tfa.ENABLED_REPLICAS: "2"}
        first = await owned_pod(kube, "train-abc123-a", rs, notes)
        second = await owned_pod(kube, "train-abc123-b", rs, notes)
        third = await owned_pod(kube, "train-abc123-c", rs, notes)
        for created in (first, second):
            assert created["metadata"]["labels"][tfa.WORKLOAD] == "train"
            assert created["metadata"]["annotations"][tfa.GANG_DESIRED_MEMBERS] == "3"
            assert created["metadata"]["annotations"][tfa.POD_COUNTER_KEY] == tfa.tf_counter_key("abc123")
            assert tfa.PENDING_OWNED_WORKLOAD not in created["metadata"]["annotations"]
        assert "schedulerName" not in third["spec"] or third["spec"]["schedulerName"] != "tensor-fusion-scheduler"
        assert tfa.WORKLOAD not in third["metadata"]["labels"], "past enabled-replicas: left as written"
        counted = await kube.get(REPLICASETS, "train-abc123", namespace="default")
        assert counted["metadata"]["annotations"][tfa.tf_counter_key("abc123")] == "2"
        workload = await kube.get(r.TENSORFUSIONWORKLOADS, "train", namespace="default")
        (owner,) = workload["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"]) == ("Deployment", "train", deployment["metadata"]["uid"])
        assert ctl.runtime.webhook.owners.lookups == 1, "the ReplicaSet is looked up once"  # type: ignore[union-attr]


async def test_pods_of_one_replicaset_admitted_together_look_up_and_create_once(apiserver: Any, kube: KubeClient,
                                                                                tmp_path: Path) -> None:
    """A ReplicaSet creates its pods back to back: the first pod's owner lookup and workload create
    serve the others, which arrive before either answer is in the cache."""
    _, rs = await deployment_and_replicaset(kube, 8)
    async with controllers() as tg:
        ctl = await serve_webhook(tg, kube, webhook_settings(apiserver, tmp_path))
        async with anyio.create_task_group() as pods:
            for i in range(8):
                pods.start_soon(owned_pod, kube, f"train-abc123-{i}", rs, BARE)
        created = [p for p in await kube.list(r.PODS, namespace="default") if p["metadata"]["name"].startswith("train")]
        assert len(created) == 8 and all(p["metadata"]["labels"][tfa.WORKLOAD] == "train" for p in created)
        webhook = ctl.runtime.webhook
        assert webhook is not None
        assert webhook.owners.lookups == 1, "one ReplicaSet read for the eight pods"
        assert webhook.workloads.writes == 1, "one create for the eight pods, no AlreadyExists and re-read"


async def test_replicas_admitted_together_are_analysed_once(apiserver: Any, kube: KubeClient,
                                                            tmp_path: Path) -> None:
    """The pods a ReplicaSet makes from its template are alike (generateName): the first one's
    analysis is kept at once (its owner asks for eight) and serves the seven others, also those
    that waited for its owner lookup. Their workload has no awaiting-pod mark: it goes with the
    Deployment that owns it."""
    _, rs = await deployment_and_replicaset(kube, 8)
    async with controllers() as tg:
        ctl = await serve_webhook(tg, kube, webhook_settings(apiserver, tmp_path))
        async with anyio.create_task_group() as pods:
            for _ in range(8):
                pods.start_soon(owned_pod, kube, "train-abc123-", rs, BARE)
        webhook = ctl.runtime.webhook
        assert webhook is not None
        # every pod after the first found the kept plan (a miss: found, but the cluster's state had
        # moved meanwhile, e.g. a namespace the controller made arriving in its cache late)
        assert (webhook.memo.hits + webhook.memo.misses, len(webhook.memo)) == (7, 1)
        # one rendering served them all, each with its own index written in (memo.py)
        indexes = {podindex.decode_pod_index(name, int(count)) for p in await kube.list(r.PODS, namespace="default")
                   for name, count in p["spec"]["containers"][0]["resources"]["limits"].items()}
        assert len(indexes) == 8
        with anyio.fail_after(30):  # as created (the workload reconciler may have written it since)
            async for kind, workload in kube.watch(r.TENSORFUSIONWORKLOADS, namespace="default",
                                                   resource_version=rs["metadata"]["resourceVersion"]):
                if kind == "ADDED" and workload["metadata"]["name"] == "train":
                    break
        assert AWAITING_POD not in (workload["metadata"].get("annotations") or {})
        assert workload["metadata"]["finalizers"] == [tfa.FINALIZER]
