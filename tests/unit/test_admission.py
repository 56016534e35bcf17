"""Mutating webhooks: matching, the AdmissionReview sent, and calls to a real HTTPS server."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.admission_helpers import (
    POD_RULE,
    CertificateAuthority,
    WebhookServer,
    review_response,
    webhook_server,
)
from tests.helpers import closed_port
from tfusion.apiserver.admission import (
    AdmissionAttributes,
    AdmissionError,
    build_admission_review,
    run_mutating_webhooks,
    webhook_matches,
)

USER = {"username": "system:serviceaccount:ns1:sa", "uid": "u-1", "groups": ["system:authenticated"]}


def pod(labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "p1",
            "namespace": "ns1",
            "labels": labels if labels is not None else {"app": "x"},
        },
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }


def attrs(**overrides: Any) -> AdmissionAttributes:
    values: dict[str, Any] = {
        "operation": "CREATE",
        "group": "",
        "version": "v1",
        "resource": "pods",
        "subresource": "",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "namespace": "ns1",
        "name": "p1",
        "obj": pod(),
        "old_obj": None,
        "user_info": USER,
        "dry_run": False,
    }
    values.update(overrides)
    return AdmissionAttributes(**values)


# ------------------------------------------------------------------------------------------------
# matching (pure)


def hook(**extra: Any) -> dict[str, Any]:
    return {"name": "h.example.com", "rules": [POD_RULE], **extra}


@pytest.mark.parametrize(
    ("rule_changes", "attr_changes", "expected"),
    [
        ({}, {}, True),
        ({"operations": ["*"]}, {"operation": "DELETE"}, True),
        ({}, {"operation": "DELETE"}, False),
        ({"apiGroups": ["*"], "apiVersions": ["*"]}, {}, True),
        ({"apiGroups": ["apps"]}, {}, False),
        ({"apiVersions": ["v2"]}, {}, False),
        ({"resources": ["*"]}, {}, True),
        ({"resources": ["*"]}, {"subresource": "status"}, False),
        ({"resources": ["pods"]}, {"subresource": "status"}, False),
        ({"resources": ["pods/status"]}, {"subresource": "status"}, True),
        ({"resources": ["pods/status"]}, {}, False),
        ({"resources": ["pods/*"]}, {"subresource": "binding"}, True),
        ({"resources": ["pods/*"]}, {}, True),
        ({"resources": ["*/status"]}, {"subresource": "status"}, True),
        ({"resources": ["*/*"]}, {"subresource": "eviction"}, True),
        ({"resources": ["nodes"]}, {}, False),
        ({"scope": "Cluster"}, {}, False),
        ({"scope": "*"}, {}, True),
        ({"scope": "Namespaced"}, {"namespace": ""}, False),
    ],
)
def test_rules(rule_changes: dict[str, Any], attr_changes: dict[str, Any], expected: bool) -> None:
    webhook = {"name": "h", "rules": [{**POD_RULE, **rule_changes}]}
    assert webhook_matches(webhook, attrs(**attr_changes), {}) is expected


def test_any_rule_may_match() -> None:
    webhook = {"name": "h", "rules": [{**POD_RULE, "resources": ["nodes"]}, POD_RULE]}
    assert webhook_matches(webhook, attrs(), {})
    assert not webhook_matches({"name": "h", "rules": []}, attrs(), {})


def test_object_selector_uses_new_or_old_labels() -> None:
    selected = hook(objectSelector={"matchLabels": {"gpu": "yes"}})
    assert not webhook_matches(selected, attrs(), {})
    assert webhook_matches(selected, attrs(obj=pod({"gpu": "yes"})), {})
    update = attrs(operation="UPDATE", obj=pod({}), old_obj=pod({"gpu": "yes"}))
    assert webhook_matches(selected, update, {})
    delete_rule = {**POD_RULE, "operations": ["DELETE"]}
    deleting = attrs(operation="DELETE", obj=None, old_obj=pod({"gpu": "yes"}))
    assert webhook_matches({**selected, "rules": [delete_rule]}, deleting, {})
    expr = hook(objectSelector={"matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}]})
    assert webhook_matches(expr, attrs(), {}) and not webhook_matches(expr, attrs(obj=pod({"skip": "1"})), {})


def test_namespace_selector() -> None:
    selected = hook(namespaceSelector={"matchLabels": {"tensor-fusion.ai/enabled": "true"}})
    assert not webhook_matches(selected, attrs(), {"kubernetes.io/metadata.name": "ns1"})
    assert webhook_matches(selected, attrs(), {"tensor-fusion.ai/enabled": "true"})
    cluster_rule = {**POD_RULE, "resources": ["nodes"], "scope": "*"}
    node = attrs(resource="nodes", namespace="", kind={"group": "", "version": "v1", "kind": "Node"})
    assert webhook_matches({**selected, "rules": [cluster_rule]}, node, {}), "cluster-scoped: selector n/a"
    ns_rule = {**POD_RULE, "resources": ["namespaces"], "scope": "*"}
    namespace = {"metadata": {"name": "team", "labels": {"tensor-fusion.ai/enabled": "true"}}}
    ns_attrs = attrs(resource="namespaces", namespace="", name="team", obj=namespace)
    assert webhook_matches({**selected, "rules": [ns_rule]}, ns_attrs, {})
    ns_attrs.obj = {"metadata": {"name": "team"}}
    assert not webhook_matches({**selected, "rules": [ns_rule]}, ns_attrs, {})


def test_admission_review_request_shape() -> None:
    a = attrs(subresource="", dry_run=True, options={"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"})
    review = build_admission_review(a)
    request = review.pop("request")
    assert review == {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}
    assert len(request.pop("uid")) == 36
    assert request == {
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
        "requestResource": {"group": "", "version": "v1", "resource": "pods"},
        "name": "p1",
        "namespace": "ns1",
        "operation": "CREATE",
        "userInfo": USER,
        "object": pod(),
        "oldObject": None,
        "dryRun": True,
        "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
    }
    status = build_admission_review(attrs(subresource="status"), "v1beta1")
    assert status["apiVersion"] == "admission.k8s.io/v1beta1"
    assert status["request"]["subResource"] == status["request"]["requestSubResource"] == "status"


# ------------------------------------------------------------------------------------------------
# calling a real HTTPS webhook


@pytest.fixture(scope="module")
def ca() -> CertificateAuthority:
    return CertificateAuthority()


@pytest.fixture
async def server(tmp_path: Path, ca: CertificateAuthority) -> AsyncIterator[WebhookServer]:
    async with webhook_server(tmp_path, ca) as srv:
        yield srv


def url_hook(srv: WebhookServer, name: str = "label.tf.test", path: str = "/mutate", **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "clientConfig": {"url": srv.url(path), "caBundle": srv.ca.bundle},
        "rules": [POD_RULE],
        **extra,
    }


def config(name: str, *webhooks: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": list(webhooks),
    }


def no_service(namespace: str, name: str, port: int) -> str:
    raise AssertionError(f"no service lookup expected, got {namespace}/{name}:{port}")


async def run(configs: list[dict[str, Any]], a: AdmissionAttributes | None = None, **kw: Any) -> dict[str, Any]:
    kw.setdefault("namespace_labels", {})
    kw.setdefault("resolve_service", no_service)
    return await run_mutating_webhooks(configs, a or attrs(), **kw)


def patch_by_path(ops_for_path: dict[str, list[Any]]) -> Any:
    async def handler(path: str, review: dict[str, Any]) -> tuple[int, bytes]:
        return 200, review_response(review, patch=ops_for_path.get(path))

    return handler


@pytest.mark.anyio
async def test_patch_is_applied_and_request_is_complete(server: WebhookServer) -> None:
    server.handler = patch_by_path({"/mutate": [{"op": "add", "path": "/metadata/labels/mutated", "value": "yes"}]})
    original = attrs()
    result = await run([config("c1", url_hook(server))], original)
    assert result["metadata"]["labels"] == {"app": "x", "mutated": "yes"}
    # the caller hands its object over: the first webhook's patch is applied to it, not to a copy
    assert result is original.obj
    [(path, query, review)] = server.requests
    assert path == "/mutate" and query == "timeout=10s"
    request = review["request"]
    assert review["apiVersion"] == "admission.k8s.io/v1"
    assert request["operation"] == "CREATE" and request["object"] == pod() and request["userInfo"] == USER
    assert request["resource"] == {"group": "", "version": "v1", "resource": "pods"}


@pytest.mark.anyio
async def test_chain_order_by_configuration_name_and_patches_compose(server: WebhookServer) -> None:
    server.handler = patch_by_path(
        {
            "/first": [{"op": "add", "path": "/metadata/annotations", "value": {"order": "first"}}],
            "/second": [{"op": "replace", "path": "/metadata/annotations/order", "value": "second"}],
            "/third": [{"op": "add", "path": "/metadata/labels/third", "value": "1"}],
        }
    )
    configs = [
        config("b-config", url_hook(server, "second.tf.test", "/second")),
        config(
            "a-config",
            url_hook(server, "first.tf.test", "/first"),
            url_hook(server, "third.tf.test", "/third"),
        ),
    ]
    result = await run(configs)
    assert [p for p, _, _ in server.requests] == ["/first", "/third", "/second"]
    assert result["metadata"]["annotations"] == {"order": "second"}
    assert server.requests[2][2]["request"]["object"]["metadata"]["labels"]["third"] == "1"


@pytest.mark.anyio
async def test_non_matching_webhooks_are_not_called(server: WebhookServer) -> None:
    configs = [
        config("c", url_hook(server, rules=[{**POD_RULE, "resources": ["nodes"]}])),
        config("d", url_hook(server, objectSelector={"matchLabels": {"gpu": "yes"}})),
        config("e", url_hook(server, namespaceSelector={"matchLabels": {"team": "a"}})),
    ]
    assert await run(configs, namespace_labels={"team": "b"}) == pod()
    assert server.requests == []
    await run(configs, namespace_labels={"team": "a"})
    assert len(server.requests) == 1


@pytest.mark.anyio
async def test_service_reference_verifies_service_dns_name(server: WebhookServer) -> None:
    server.handler = patch_by_path({"/svc-path": [{"op": "add", "path": "/metadata/labels/via", "value": "svc"}]})
    seen: list[tuple[str, str, int]] = []

    def resolve(namespace: str, name: str, port: int) -> str:
        seen.append((namespace, name, port))
        return server.address

    svc_hook = url_hook(server)
    svc_hook["clientConfig"] = {
        "service": {"namespace": "tf-test", "name": "webhook", "path": "/svc-path"},
        "caBundle": server.ca.bundle,
    }
    result = await run([config("c", svc_hook)], resolve_service=resolve)
    assert result["metadata"]["labels"]["via"] == "svc"
    assert seen == [("tf-test", "webhook", 443)]
    # the certificate names webhook.tf-test.svc, not other.tf-test.svc
    svc_hook["clientConfig"]["service"] = {"namespace": "tf-test", "name": "other", "port": 8443}
    with pytest.raises(AdmissionError) as info:
        await run([config("c", svc_hook)], resolve_service=resolve)
    assert info.value.code == 500 and "certificate" in info.value.message.lower()
    assert seen[-1] == ("tf-test", "other", 8443)


@pytest.mark.anyio
async def test_denial(server: WebhookServer) -> None:
    async def deny(path: str, review: dict[str, Any]) -> tuple[int, bytes]:
        return 200, review_response(
            review, allowed=False, status={"code": 403, "reason": "Forbidden", "message": "no GPUs for you"}
        )

    server.handler = deny
    with pytest.raises(AdmissionError) as info:
        await run([config("c", url_hook(server, failurePolicy="Ignore"))])
    assert info.value.code == 403 and info.value.reason == "Forbidden"
    assert info.value.message == 'admission webhook "label.tf.test" denied the request: no GPUs for you'

    async def deny_bare(path: str, review: dict[str, Any]) -> tuple[int, bytes]:
        return 200, review_response(review, allowed=False)

    server.handler = deny_bare
    with pytest.raises(AdmissionError) as info:
        await run([config("c", url_hook(server))])
    assert info.value.code == 400
    assert info.value.message == 'admission webhook "label.tf.test" denied the request without explanation'


@pytest.mark.anyio
async def test_timeout_fail_and_ignore(server: WebhookServer) -> None:
    async def slow(path: str, review: dict[str, Any]) -> tuple[int, bytes]:
        await anyio.sleep(5)
        return 200, review_response(review)

    server.handler = slow
    with anyio.fail_after(4):
        with pytest.raises(AdmissionError) as info:
            await run([config("c", url_hook(server, timeoutSeconds=1))])
        assert info.value.code == 500 and info.value.reason == "InternalError"
        assert info.value.message.startswith('Internal error occurred: failed calling webhook "label.tf.test"')
        assert "context deadline exceeded" in info.value.message
        ignored = await run([config("c", url_hook(server, timeoutSeconds=1, failurePolicy="Ignore"))])
    assert ignored == pod()


@pytest.mark.anyio
async def test_connection_refused_fail_and_ignore(ca: CertificateAuthority) -> None:
    dead = {
        "name": "dead.tf.test",
        "sideEffects": "None",
        "clientConfig": {"url": f"https://127.0.0.1:{closed_port()}/m", "caBundle": ca.bundle},
        "rules": [POD_RULE],
    }
    with pytest.raises(AdmissionError) as info:
        await run([config("c", dead)])
    assert info.value.code == 500 and 'failed calling webhook "dead.tf.test"' in info.value.message
    assert await run([config("c", {**dead, "failurePolicy": "Ignore"})]) == pod()


@pytest.mark.anyio
async def test_ca_bundle_mismatch_is_rejected(server: WebhookServer) -> None:
    stranger = CertificateAuthority("someone-else")
    hook_ = url_hook(server)
    hook_["clientConfig"]["caBundle"] = stranger.bundle
    with pytest.raises(AdmissionError) as info:
        await run([config("c", hook_)])
    assert info.value.code == 500 and "certificate verify failed" in info.value.message
    assert server.requests == []
    hook_["clientConfig"]["caBundle"] = "!!not base64!!"
    with pytest.raises(AdmissionError, match="caBundle is not base64-encoded PEM"):
        await run([config("c", hook_)])
    hook_["clientConfig"]["caBundle"] = stranger.bundle
    hook_["failurePolicy"] = "Ignore"
    assert await run([config("c", hook_)]) == pod()


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        (500, b"{}", "received status code 500"),
        (200, b"not json", "is not JSON"),
        (200, b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}', "response was absent"),
        (200, b'{"apiVersion": "v1", "kind": "Status"}', "expected webhook response of admission.k8s.io/v1"),
        ("wrong-uid", b"", "expected response.uid"),
        ("no-allowed", b"", "allowed must be true or false"),
    ],
)
async def test_bad_responses_are_call_failures(server: WebhookServer, status: Any, body: bytes, message: str) -> None:
    async def answer(path: str, review: dict[str, Any]) -> tuple[int, bytes]:
        if status == "wrong-uid":
            return 200, review_response({**review, "request": {"uid": "other"}})
        if status == "no-allowed":
            doc = json.loads(review_response(review))
            del doc["response"]["allowed"]
            return 200, json.dumps(doc).encode()
        return int(status), body

    server.handler = answer
    with pytest.raises(AdmissionError, match=message) as info:
        await run([config("c", url_hook(server))])
    assert info.value.code == 500
    assert await run([config("c", url_hook(server, failurePolicy="Ignore"))]) == pod()


@pytest.mark.anyio
async def test_invalid_patch_fails_regardless_of_policy(server: WebhookServer) -> None:
    server.handler = patch_by_path({"/mutate": [{"op": "replace", "path": "/spec/missing", "value": 1}]})
    with pytest.raises(AdmissionError, match=r"invalid patch: op 0 \(replace /spec/missing\): path not found"):
        await run([config("c", url_hook(server, failurePolicy="Ignore"))])

    async def wrong_type(path: str, review: dict[str, Any]) -> tuple[int, bytes]:
        doc = json.loads(review_response(review, patch=[]))
        doc["response"]["patchType"] = "MergePatch"
        return 200, json.dumps(doc).encode()

    server.handler = wrong_type
    with pytest.raises(AdmissionError, match="unsupported patchType 'MergePatch'"):
        await run([config("c", url_hook(server))])


@pytest.mark.anyio
async def test_v1beta1_only_webhook_gets_v1beta1(server: WebhookServer) -> None:
    await run([config("c", url_hook(server, admissionReviewVersions=["v1beta1"]))])
    assert server.requests[0][2]["apiVersion"] == "admission.k8s.io/v1beta1"
    with pytest.raises(AdmissionError, match="accepts no AdmissionReview version"):
        await run([config("c", url_hook(server, admissionReviewVersions=["v2"]))])


@pytest.mark.anyio
async def test_dry_run_needs_side_effect_free_webhook(server: WebhookServer) -> None:
    dry = attrs(dry_run=True)
    assert await run([config("c", url_hook(server))], dry) == pod()
    assert server.requests[0][2]["request"]["dryRun"] is True
    with pytest.raises(AdmissionError) as info:
        await run([config("c", url_hook(server, sideEffects="Some"))], dry)
    assert info.value.code == 400 and "does not support dry run" in info.value.message


@pytest.mark.anyio
async def test_reinvocation_if_needed(server: WebhookServer) -> None:
    async def handler(path: str, review: dict[str, Any]) -> tuple[int, bytes]:
        labels = review["request"]["object"]["metadata"]["labels"]
        if path == "/count":  # records how many labels it saw
            return 200, review_response(
                review,
                patch=[{"op": "add", "path": "/metadata/annotations", "value": {"seen": str(len(labels))}}],
            )
        return 200, review_response(review, patch=[{"op": "add", "path": "/metadata/labels/late", "value": "1"}])

    server.handler = handler
    configs = [
        config("a", url_hook(server, "count.tf.test", "/count", reinvocationPolicy="IfNeeded")),
        config("b", url_hook(server, "late.tf.test", "/late")),
    ]
    result = await run(configs)
    assert [p for p, _, _ in server.requests] == ["/count", "/late", "/count"]
    assert result["metadata"]["annotations"] == {"seen": "2"}
    server.requests.clear()
    configs[0]["webhooks"][0]["reinvocationPolicy"] = "Never"
    assert (await run(configs))["metadata"]["annotations"] == {"seen": "1"}
    assert len(server.requests) == 2


@pytest.mark.anyio
async def test_warnings_are_collected(server: WebhookServer) -> None:
    async def warn(path: str, review: dict[str, Any]) -> tuple[int, bytes]:
        return 200, review_response(review, warnings=["deprecated field"])

    server.handler = warn
    warnings: list[str] = []
    await run([config("c", url_hook(server))], warnings=warnings)
    assert warnings == ["deprecated field"]


@pytest.mark.anyio
async def test_bad_client_config_and_selector_follow_failure_policy(server: WebhookServer) -> None:
    plain_http = url_hook(server)
    plain_http["clientConfig"]["url"] = server.url().replace("https://", "http://")
    with pytest.raises(AdmissionError, match="must be an https URL"):
        await run([config("c", plain_http)])
    bad_selector = url_hook(server, objectSelector={"matchExpressions": [{"key": "a", "operator": "Bogus"}]})
    with pytest.raises(AdmissionError, match="unsupported value 'Bogus'"):
        await run([config("c", bad_selector)])
    assert await run([config("c", {**bad_selector, "failurePolicy": "Ignore"})]) == pod()


def test_ca_bundle_is_base64_pem(ca: CertificateAuthority) -> None:
    assert base64.b64decode(ca.bundle).startswith(b"-----BEGIN CERTIFICATE-----")
