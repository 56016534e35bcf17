"""Mutating admission end to end: a MutatingWebhookConfiguration created with kr8s against the
embedded API server, a webhook served by a real HTTPS server started here, and Pods created and
updated through the API."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kr8s
import kr8s.asyncio
import pytest
from kr8s.asyncio.objects import Namespace, Pod, Service, new_class

from tests.admission_helpers import (
    POD_RULE,
    CertificateAuthority,
    WebhookServer,
    review_response,
    webhook_server,
)
from tests.helpers import closed_port

pytestmark = pytest.mark.anyio

MutatingWebhookConfiguration = new_class(
    "MutatingWebhookConfiguration", "admissionregistration.k8s.io/v1", namespaced=False
)
LABEL_PATCH = [{"op": "add", "path": "/metadata/labels/tensor-fusion.ai~1injected", "value": "true"}]


@pytest.fixture
async def api(apiserver: Any) -> Any:
    return await kr8s.asyncio.api(kubeconfig=apiserver.kubeconfig)


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[WebhookServer]:
    async with webhook_server(tmp_path, CertificateAuthority()) as srv:
        yield srv


def labelling(server: WebhookServer) -> None:
    async def handler(path: str, review: dict[str, Any]) -> tuple[int, bytes]:
        return 200, review_response(review, patch=LABEL_PATCH)

    server.handler = handler


def webhook(name: str, client_config: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "clientConfig": client_config,
        "rules": [POD_RULE],
        **extra,
    }


async def register(api: Any, name: str, *webhooks: dict[str, Any]) -> Any:
    config = MutatingWebhookConfiguration(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": list(webhooks),
        },
        api=api,
    )
    await config.create()
    return config


def pod_spec(name: str, namespace: str = "default", labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {"app": "demo"}},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }


async def create_pod(api: Any, name: str, **kw: Any) -> Any:
    pod = Pod(pod_spec(name, **kw), api=api)
    await pod.create()
    return pod


def status_of(error: kr8s.ServerError) -> dict[str, Any]:
    """The metav1.Status body the server answered with."""
    assert error.response is not None
    body: dict[str, Any] = error.response.json()
    assert body["kind"] == "Status"
    return body


async def stored_labels(api: Any, name: str, namespace: str = "default") -> dict[str, str]:
    pod = await Pod.get(name, namespace=namespace, api=api)
    return dict(pod.raw["metadata"].get("labels") or {})


async def test_url_webhook_mutates_created_pod(api: Any, server: WebhookServer) -> None:
    labelling(server)
    await register(api, "tf-injector", webhook("inject.tf.test", {"url": server.url(), "caBundle": server.ca.bundle}))
    pod = await create_pod(api, "p1")
    assert pod.raw["metadata"]["labels"]["tensor-fusion.ai/injected"] == "true"
    assert await stored_labels(api, "p1") == {"app": "demo", "tensor-fusion.ai/injected": "true"}
    [(_, _, review)] = server.requests
    request = review["request"]
    assert request["operation"] == "CREATE" and request["namespace"] == "default" and request["name"] == "p1"
    assert request["kind"] == {"group": "", "version": "v1", "kind": "Pod"}
    assert request["object"]["spec"]["containers"][0]["image"] == "busybox"


async def test_update_calls_webhook_with_old_object(api: Any, server: WebhookServer) -> None:
    await create_pod(api, "p1")  # before registration: not mutated
    labelling(server)
    await register(api, "tf-injector", webhook("inject.tf.test", {"url": server.url(), "caBundle": server.ca.bundle}))
    pod = await Pod.get("p1", namespace="default", api=api)
    await pod.patch({"metadata": {"annotations": {"touched": "yes"}}})
    assert (await stored_labels(api, "p1"))["tensor-fusion.ai/injected"] == "true"
    request = server.requests[-1][2]["request"]
    assert request["operation"] == "UPDATE"
    assert "tensor-fusion.ai/injected" not in request["oldObject"]["metadata"]["labels"]
    assert request["object"]["metadata"]["annotations"] == {"touched": "yes"}


async def test_service_webhook_resolved_to_loopback_with_service_dns_name(api: Any, server: WebhookServer) -> None:
    labelling(server)
    await Namespace({"metadata": {"name": "tf-test"}}, api=api).create()
    await Service(
        {
            "metadata": {"name": "webhook", "namespace": "tf-test"},
            "spec": {"ports": [{"port": 443, "targetPort": server.port}]},
        },
        api=api,
    ).create()
    client_config = {
        "service": {"namespace": "tf-test", "name": "webhook", "path": "/mutate"},
        "caBundle": server.ca.bundle,
    }
    await register(api, "tf-injector", webhook("inject.tf.test", client_config))
    await create_pod(api, "p1")
    assert (await stored_labels(api, "p1"))["tensor-fusion.ai/injected"] == "true"
    assert server.requests[0][0] == "/mutate"


async def test_fail_policy_rejects_and_ignore_admits_when_webhook_is_down(api: Any) -> None:
    ca = CertificateAuthority()
    dead = {"url": f"https://127.0.0.1:{closed_port()}/mutate", "caBundle": ca.bundle}
    config = await register(api, "tf-dead", webhook("dead.tf.test", dead))
    with pytest.raises(kr8s.ServerError) as info:
        await create_pod(api, "refused")
    assert info.value.response is not None and info.value.response.status_code == 500
    status = status_of(info.value)
    assert status["reason"] == "InternalError"
    assert status["message"].startswith('Internal error occurred: failed calling webhook "dead.tf.test"')
    assert "refused" not in [p.name async for p in api.async_get(Pod, namespace="default")]

    await config.patch([{"op": "add", "path": "/webhooks/0/failurePolicy", "value": "Ignore"}], type="json")
    await create_pod(api, "admitted")
    assert await stored_labels(api, "admitted") == {"app": "demo"}


async def test_timeout_ignore_admits_unmutated(api: Any, server: WebhookServer) -> None:
    import anyio

    async def slow(path: str, review: dict[str, Any]) -> tuple[int, bytes]:
        await anyio.sleep(3)
        return 200, review_response(review, patch=LABEL_PATCH)

    server.handler = slow
    client_config = {"url": server.url(), "caBundle": server.ca.bundle}
    await register(api, "tf-slow", webhook("slow.tf.test", client_config, timeoutSeconds=1, failurePolicy="Ignore"))
    with anyio.fail_after(2.5):
        await create_pod(api, "p1")
    assert await stored_labels(api, "p1") == {"app": "demo"}


async def test_denial_reaches_the_client(api: Any, server: WebhookServer) -> None:
    async def deny(path: str, review: dict[str, Any]) -> tuple[int, bytes]:
        status = {"code": 403, "reason": "Forbidden", "message": "pool is full"}
        return 200, review_response(review, allowed=False, status=status)

    server.handler = deny
    await register(api, "tf-deny", webhook("deny.tf.test", {"url": server.url(), "caBundle": server.ca.bundle}))
    with pytest.raises(kr8s.ServerError) as info:
        await create_pod(api, "p1")
    assert info.value.response is not None and info.value.response.status_code == 403
    body = info.value.response.json()
    assert body["kind"] == "Status" and body["code"] == 403
    assert body["message"] == 'admission webhook "deny.tf.test" denied the request: pool is full'


async def test_wrong_ca_bundle_is_a_failure(api: Any, server: WebhookServer) -> None:
    labelling(server)
    stranger = CertificateAuthority("stranger")
    await register(api, "tf-mitm", webhook("mitm.tf.test", {"url": server.url(), "caBundle": stranger.bundle}))
    with pytest.raises(kr8s.ServerError) as info:
        await create_pod(api, "p1")
    assert "certificate verify failed" in status_of(info.value)["message"]
    assert server.requests == []


async def test_namespace_and_object_selectors(api: Any, server: WebhookServer) -> None:
    labelling(server)
    await Namespace(
        {"metadata": {"name": "gpu-team", "labels": {"tensor-fusion.ai/enabled": "true"}}}, api=api
    ).create()
    await Namespace({"metadata": {"name": "other-team"}}, api=api).create()
    client_config = {"url": server.url(), "caBundle": server.ca.bundle}
    await register(
        api,
        "tf-selective",
        webhook(
            "selective.tf.test",
            client_config,
            namespaceSelector={"matchLabels": {"tensor-fusion.ai/enabled": "true"}},
            objectSelector={"matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}]},
        ),
    )
    await create_pod(api, "in-scope", namespace="gpu-team")
    await create_pod(api, "skipped", namespace="gpu-team", labels={"skip": "1"})
    await create_pod(api, "elsewhere", namespace="other-team")
    assert "tensor-fusion.ai/injected" in await stored_labels(api, "in-scope", "gpu-team")
    assert "tensor-fusion.ai/injected" not in await stored_labels(api, "skipped", "gpu-team")
    assert "tensor-fusion.ai/injected" not in await stored_labels(api, "elsewhere", "other-team")
    assert [r[2]["request"]["name"] for r in server.requests] == ["in-scope"]


async def test_patch_is_applied_once_per_webhook_in_name_order(api: Any, server: WebhookServer) -> None:
    async def handler(path: str, review: dict[str, Any]) -> tuple[int, bytes]:
        annotations = review["request"]["object"]["metadata"].get("annotations") or {}
        order = annotations.get("order", "")
        value = f"{order},{path.strip('/')}" if order else path.strip("/")
        op = "replace" if annotations else "add"
        patch = [{"op": op, "path": "/metadata/annotations", "value": {"order": value}}]
        return 200, review_response(review, patch=patch)

    server.handler = handler
    ca_bundle = server.ca.bundle
    await register(api, "z-last", webhook("z.tf.test", {"url": server.url("/z"), "caBundle": ca_bundle}))
    await register(api, "a-first", webhook("a.tf.test", {"url": server.url("/a"), "caBundle": ca_bundle}))
    pod = await create_pod(api, "p1")
    assert pod.raw["metadata"]["annotations"] == {"order": "a,z"}


def test_review_response_helper_encodes_patch() -> None:
    body = json.loads(review_response({"apiVersion": "admission.k8s.io/v1", "request": {"uid": "u"}}, patch=[]))
    assert base64.b64decode(body["response"]["patch"]) == b"[]"


async def test_webhook_configuration_is_stored_with_kube_defaults(api: Any) -> None:
    service_ref = {"service": {"namespace": "default", "name": "hook"}, "caBundle": ""}
    rule = {key: value for key, value in POD_RULE.items() if key != "scope"}
    config = await register(api, "tf-defaults", webhook("defaults.tf.test", service_ref, rules=[rule]))
    stored = config.raw["webhooks"][0]
    assert stored["failurePolicy"] == "Fail"
    assert stored["matchPolicy"] == "Equivalent"
    assert stored["timeoutSeconds"] == 10
    assert stored["reinvocationPolicy"] == "Never"
    assert stored["namespaceSelector"] == {} and stored["objectSelector"] == {}
    assert stored["clientConfig"]["service"]["port"] == 443
    assert stored["rules"][0]["scope"] == "*"
