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

import anyio
import httpx
import kr8s.asyncio
import pytest
from kr8s.asyncio.objects import ConfigMap

from tfusion.apiserver import security
from tfusion.apiserver.embedded import EmbeddedApiServer
from tfusion.apiserver.tokens import TokenAuthority
from tfusion.web import bind_socket, serve

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
    async with httpx.AsyncClient(base_url=apiserver.url, timeout=15) as client:
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
            assert as_sa.status_code == 200  # service-account tokens authenticate too
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
class Hook:
    """An HTTPS admission webhook: labels every pod it sees, or denies names starting with "deny"."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        review = json.loads(body)
        request = review["request"]
        self.calls.append(request)
        response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
        name = request["object"]["metadata"].get("name", "")
        if name.startswith("deny"):
            response = {
                "uid": request["uid"],
                "allowed": False,
                "status": {"code": 403, "message": "names starting with deny are not welcome"},
            }
        else:
            labels = request["object"]["metadata"].get("labels")
            ops = [{"op": "add", "path": "/metadata/labels", "value": {}}] if not labels else []
            ops.append({"op": "add", "path": "/metadata/labels/mutated", "value": request["operation"].lower()})
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(json.dumps(ops).encode()).decode()
        answer = json.dumps(
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}
        ).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": answer})


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
    cert, key = security.self_signed("hook.default.svc")
    (tmp_path / "tls.crt").write_bytes(cert)
    (tmp_path / "tls.key").write_bytes(key)
    hook = Hook()
    sock = bind_socket("127.0.0.1:0")
    port = sock.getsockname()[1]
    ca_bundle = base64.b64encode(cert).decode()
    async with anyio.create_task_group() as tg:
        await tg.start(
            lambda task_status: serve(
                hook,
                sock,
                ssl_certfile=str(tmp_path / "tls.crt"),
                ssl_keyfile=str(tmp_path / "tls.key"),
                task_status=task_status,
            )
        )
        config = webhook_config(
            "by-url",
            {"url": f"https://127.0.0.1:{port}/mutate", "caBundle": ca_bundle},
            object_selector={"matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}]},
        )
        assert (await http.post(HOOKS, json=config)).status_code == 201
        created = await http.post(PODS, json=pod_body("mutated"))
        assert created.status_code == 201, created.text
        assert created.json()["metadata"]["labels"] == {"mutated": "create"}
        assert hook.calls[-1]["operation"] == "CREATE" and hook.calls[-1]["namespace"] == "default"
        updated = await http.patch(
            f"{PODS}/mutated",
            content=b'{"metadata":{"annotations":{"a":"b"}}}',
            headers={"content-type": "application/merge-patch+json"},
        )
        assert updated.json()["metadata"]["labels"] == {"mutated": "update"}
        generated = await http.post(PODS, json={**pod_body(""), "metadata": {"generateName": "gen-"}})
        assert generated.status_code == 201 and generated.json()["metadata"]["labels"] == {"mutated": "create"}
        assert not hook.calls[-1].get("name") and hook.calls[-1]["object"]["metadata"]["generateName"] == "gen-"
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
        tg.cancel_scope.cancel()


async def test_webhook_failure_policy(http: httpx.AsyncClient) -> None:
    sock = bind_socket("127.0.0.1:0")
    dead_port = sock.getsockname()[1]
    sock.close()  # nothing listens there
    await http.post(HOOKS, json=webhook_config("failing", {"url": f"https://127.0.0.1:{dead_port}/"}))
    refused = await http.post(PODS, json=pod_body("blocked"))
    assert refused.status_code == 500 and 'failed calling webhook "failing.example.com"' in refused.json()["message"]
    await http.delete(f"{HOOKS}/failing")
    await http.post(
        HOOKS, json=webhook_config("ignored", {"url": f"https://127.0.0.1:{dead_port}/"}, failure_policy="Ignore")
    )
    assert (await http.post(PODS, json=pod_body("allowed"))).status_code == 201
