"""Authentication and admission on the embedded API server: HTTPS with a bearer token, TokenRequest and
TokenReview, and mutating webhooks served by a real HTTPS server in the test."""

from __future__ import annotations

import base64
import json
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import kr8s.asyncio
import pytest
from kr8s.asyncio.objects import ConfigMap

from tests.admission_helpers import CertificateAuthority, review_response, webhook_server
from tests.helpers import closed_port
from tfusion.apiserver.embedded import EmbeddedApiServer
from tfusion.apiserver.tokens import TokenAuthority

pytestmark = pytest.mark.anyio

PODS = "/api/v1/namespaces/default/pods"
REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
HOOKS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"


def pod_body(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"containers": [{"name": "main", "image": "busybox:1.36"}]},
    }


@pytest.fixture
async def http(apiserver: Any) -> AsyncIterator[httpx.AsyncClient]:
    async with apiserver.http(timeout=15) as client:
        yield client


async def test_https_requires_bearer_token(tmp_path: Path) -> None:
    server = EmbeddedApiServer(
        tmp_path / "s.db", listen="127.0.0.1:0", tls=True, kubeconfig_path=tmp_path / "kubeconfig"
    )
    async with server:
        assert server.url.startswith("https://") and server.token
        ca = tmp_path / "ca.crt"
        assert server.ca_pem is not None
        ca.write_bytes(server.ca_pem)
        verify = ssl.create_default_context(cafile=str(ca))
        async with httpx.AsyncClient(base_url=server.url, verify=verify, timeout=10) as client:
            anonymous = await client.get("/api/v1/namespaces")
            assert anonymous.status_code == 401 and anonymous.json()["reason"] == "Unauthorized"
            wrong = await client.get("/api/v1/namespaces", headers={"authorization": "Bearer nope"})
            assert wrong.status_code == 401
            assert (await client.get("/version")).status_code == 200
            admin = {"authorization": f"Bearer {server.token}"}
            issued = await client.post(
                "/api/v1/namespaces/default/serviceaccounts/default/token", json={"spec": {}}, headers=admin
            )
            sa_token = issued.json()["status"]["token"]
            as_sa = await client.get("/api/v1/namespaces", headers={"authorization": f"Bearer {sa_token}"})
            # service-account tokens authenticate too (403, not 401): RBAC grants a bare one discovery only
            assert as_sa.status_code == 403 and as_sa.json()["reason"] == "Forbidden"
            discovery = await client.get("/api", headers={"authorization": f"Bearer {sa_token}"})
            assert discovery.status_code == 200
        api = await kr8s.asyncio.api(kubeconfig=str(tmp_path / "kubeconfig"))
        cm = ConfigMap({"metadata": {"name": "secure", "namespace": "default"}}, api=api)
        await cm.create()
        assert await cm.exists()
        token = server.token
    async with EmbeddedApiServer(tmp_path / "s.db", listen="127.0.0.1:0", tls=True) as again:
        assert again.token == token and again.ca_pem == server.ca_pem  # kept in the state file


async def _issue(
    http: httpx.AsyncClient, sa: str, pod: dict[str, Any] | None = None, audiences: list[str] | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {"expirationSeconds": 3600}
    if audiences:
        spec["audiences"] = audiences
    if pod is not None:
        spec["boundObjectRef"] = {
            "kind": "Pod",
            "apiVersion": "v1",
            "name": pod["metadata"]["name"],
            "uid": pod["metadata"]["uid"],
        }
    response = await http.post(
        f"/api/v1/namespaces/default/serviceaccounts/{sa}/token",
        json={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
    )
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


async def _review(http: httpx.AsyncClient, token: str, audiences: list[str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"token": token}
    if audiences:
        spec["audiences"] = audiences
    response = await http.post(
        REVIEWS, json={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}
    )
    assert response.status_code == 201, response.text
    status: dict[str, Any] = response.json()["status"]
    return status


async def test_token_request_and_review(apiserver: Any, http: httpx.AsyncClient) -> None:
    await http.post("/api/v1/namespaces/default/serviceaccounts", json={"metadata": {"name": "worker"}})
    pod = (await http.post(PODS, json=pod_body("tokened"))).json()
    issued = await _issue(http, "worker", pod)
    token = issued["status"]["token"]
    assert issued["status"]["expirationTimestamp"].endswith("Z")
    status = await _review(http, token)
    assert status["authenticated"] is True
    assert status["user"]["username"] == "system:serviceaccount:default:worker"
    assert status["user"]["extra"]["authentication.kubernetes.io/pod-name"] == ["tokened"]
    assert status["user"]["extra"]["authentication.kubernetes.io/pod-uid"] == [pod["metadata"]["uid"]]
    # forged: payload changed, signature kept
    header, payload, signature = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims["kubernetes.io"]["pod"]["name"] = "someone-else"
    forged_payload = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    assert (await _review(http, f"{header}.{forged_payload}.{signature}"))["authenticated"] is False
    unsigned = base64.urlsafe_b64encode(b'{"alg":"none"}').rstrip(b"=").decode()
    assert (await _review(http, f"{unsigned}.{payload}."))["authenticated"] is False
    assert (await _review(http, "not-a-token"))["authenticated"] is False
    # expired: signed with the server's own key, but already past its expiry
    key = apiserver.call(lambda: apiserver.server.store.get_meta("sa.key"))
    sa_uid = (await http.get("/api/v1/namespaces/default/serviceaccounts/worker")).json()["metadata"]["uid"]
    expired, _ = TokenAuthority.load_or_create(key).issue(
        namespace="default",
        service_account="worker",
        sa_uid=sa_uid,
        pod_name="tokened",
        pod_uid=pod["metadata"]["uid"],
        expiration_seconds=60,
        now=time.time() - 3600,
    )
    assert (await _review(http, expired))["authenticated"] is False
    # audiences
    scoped = (await _issue(http, "worker", pod, audiences=["tfusion"]))["status"]["token"]
    assert (await _review(http, scoped, ["tfusion"]))["authenticated"] is True
    assert (await _review(http, scoped))["authenticated"] is False
    # bound to a pod that no longer exists
    await http.request("DELETE", f"{PODS}/tokened", json={"gracePeriodSeconds": 0})
    assert (await _review(http, token))["authenticated"] is False


async def test_token_request_errors(http: httpx.AsyncClient) -> None:
    missing_sa = await http.post("/api/v1/namespaces/default/serviceaccounts/ghost/token", json={"spec": {}})
    assert missing_sa.status_code == 404
    missing_pod = await http.post(
        "/api/v1/namespaces/default/serviceaccounts/default/token",
        json={"spec": {"boundObjectRef": {"kind": "Pod", "name": "ghost"}}},
    )
    assert missing_pod.status_code == 404
    empty = await http.post(REVIEWS, json={"spec": {}})
    assert empty.status_code == 422


# ------------------------------------------------------------------------------------------ webhooks
async def mutate_or_deny(path: str, review: dict[str, Any]) -> tuple[int, bytes]:
    """Labels every pod it sees with the operation, or denies names starting with "deny"."""
    request = review["request"]
    if request["object"]["metadata"].get("name", "").startswith("deny"):
        status = {"code": 403, "message": "names starting with deny are not welcome"}
        return 200, review_response(review, allowed=False, status=status)
    labels = request["object"]["metadata"].get("labels")
    ops: list[Any] = [{"op": "add", "path": "/metadata/labels", "value": {}}] if not labels else []
    ops.append({"op": "add", "path": "/metadata/labels/mutated", "value": request["operation"].lower()})
    return 200, review_response(review, patch=ops)


def webhook_config(
    name: str,
    client_config: dict[str, Any],
    *,
    failure_policy: str = "Fail",
    object_selector: dict[str, Any] | None = None,
) -> dict[str, Any]:
    hook: dict[str, Any] = {
        "name": f"{name}.example.com",
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": failure_policy,
        "timeoutSeconds": 5,
        "clientConfig": client_config,
        "rules": [
            {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["pods"]}
        ],
    }
    if object_selector is not None:
        hook["objectSelector"] = object_selector
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [hook],
    }


async def test_mutating_webhook_over_https(tmp_path: Path, http: httpx.AsyncClient) -> None:
    ca = CertificateAuthority()
    async with webhook_server(tmp_path, ca, ["hook.default.svc"]) as hook:
        hook.handler = mutate_or_deny
        port, ca_bundle = hook.port, ca.bundle

        def last_request() -> dict[str, Any]:
            request: dict[str, Any] = hook.requests[-1][2]["request"]
            return request

        config = webhook_config(
            "by-url",
            {"url": f"https://127.0.0.1:{port}/mutate", "caBundle": ca_bundle},
            object_selector={"matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}]},
        )
        assert (await http.post(HOOKS, json=config)).status_code == 201
        created = await http.post(PODS, json=pod_body("mutated"))
        assert created.status_code == 201, created.text
        assert created.json()["metadata"]["labels"] == {"mutated": "create"}
        assert last_request()["operation"] == "CREATE" and last_request()["namespace"] == "default"
        updated = await http.patch(
            f"{PODS}/mutated",
            content=b'{"metadata":{"annotations":{"a":"b"}}}',
            headers={"content-type": "application/merge-patch+json"},
        )
        assert updated.json()["metadata"]["labels"] == {"mutated": "update"}
        generated = await http.post(PODS, json={**pod_body(""), "metadata": {"generateName": "gen-"}})
        assert generated.status_code == 201 and generated.json()["metadata"]["labels"] == {"mutated": "create"}
        assert not last_request().get("name") and last_request()["object"]["metadata"]["generateName"] == "gen-"
        skipped = await http.post(PODS, json=pod_body("skipped", {"skip": "1"}))
        assert skipped.json()["metadata"]["labels"] == {"skip": "1"}
        denied = await http.post(PODS, json=pod_body("deny-me"))
        assert denied.status_code == 403 and "denied the request" in denied.json()["message"]
        assert (await http.get(f"{PODS}/deny-me")).status_code == 404
        # cluster-internal service reference, resolved to loopback through the Service's targetPort
        await http.delete(f"{HOOKS}/by-url")
        await http.post(
            "/api/v1/namespaces/default/services",
            json={"metadata": {"name": "hook"}, "spec": {"ports": [{"port": 443, "targetPort": port}]}},
        )
        by_service = webhook_config(
            "by-service",
            {"service": {"namespace": "default", "name": "hook", "path": "/mutate"}, "caBundle": ca_bundle},
        )
        assert (await http.post(HOOKS, json=by_service)).status_code == 201
        via_service = await http.post(PODS, json=pod_body("via-service"))
        assert via_service.status_code == 201, via_service.text
        assert via_service.json()["metadata"]["labels"] == {"mutated": "create"}


async def test_webhook_failure_policy(http: httpx.AsyncClient) -> None:
    dead_port = closed_port()
    await http.post(HOOKS, json=webhook_config("failing", {"url": f"https://127.0.0.1:{dead_port}/"}))
    refused = await http.post(PODS, json=pod_body("blocked"))
    assert refused.status_code == 500 and 'failed calling webhook "failing.example.com"' in refused.json()["message"]
    await http.delete(f"{HOOKS}/failing")
    await http.post(
        HOOKS, json=webhook_config("ignored", {"url": f"https://127.0.0.1:{dead_port}/"}, failure_policy="Ignore")
    )
    assert (await http.post(PODS, json=pod_body("allowed"))).status_code == 201
