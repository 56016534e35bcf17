"""TokenRequest and TokenReview end to end against the embedded API server, with kr8s.

Expiry: kube-apiserver raises a TokenRequest's expirationSeconds below 600 to 600, so an issued
token cannot expire within a test. The expired token here is made the way an old token would
have been: signed with the server's own service-account key (read from its state), issued two
hours ago. The server then judges it with its real clock.
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import kr8s
import kr8s.asyncio
import pytest
from kr8s.asyncio.objects import Node, Pod, ServiceAccount, new_class

from tfusion.apiserver.tokens import TokenAuthority

pytestmark = pytest.mark.anyio

TokenReview = new_class("TokenReview", "authentication.k8s.io/v1", namespaced=False)


@pytest.fixture
async def api(apiserver: Any) -> Any:
    return await kr8s.asyncio.api(kubeconfig=apiserver.kubeconfig)


@pytest.fixture
async def workload(api: Any) -> tuple[Any, Any]:
    account = ServiceAccount({"metadata": {"name": "runner", "namespace": "default"}}, api=api)
    await account.create()
    pod = Pod(
        {
            "metadata": {"name": "worker", "namespace": "default"},
            "spec": {"serviceAccountName": "runner", "containers": [{"name": "main", "image": "busybox"}]},
        },
        api=api,
    )
    await pod.create()
    return account, pod


async def request_token(api: Any, sa: str = "runner", **spec: Any) -> dict[str, Any]:
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
    async with api.call_api(
        "POST", version="v1", namespace="default", url=f"serviceaccounts/{sa}/token", json=body
    ) as r:
        assert r.status_code == 201
        result: dict[str, Any] = r.json()
    return result


async def review(api: Any, token: str, audiences: list[str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"token": token}
    if audiences:
        spec["audiences"] = audiences
    obj = TokenReview({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}, api=api)
    await obj.create()
    status: dict[str, Any] = obj.raw["status"]
    return status


def bound_to(pod: Any) -> dict[str, Any]:
    return {"boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": pod.name, "uid": pod.metadata.uid}}


def claims_of(token: str) -> dict[str, Any]:
    payload = token.split(".")[1]
    decoded: dict[str, Any] = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    return decoded


async def test_bound_token_is_authenticated_with_pod_identity(api: Any, workload: tuple[Any, Any]) -> None:
    account, pod = workload
    issued = await request_token(api, **bound_to(pod))
    token = issued["status"]["token"]
    assert issued["spec"]["expirationSeconds"] == 3600
    assert issued["status"]["expirationTimestamp"].endswith("Z")
    claims = claims_of(token)
    assert claims["kubernetes.io"]["pod"] == {"name": "worker", "uid": pod.metadata.uid}
    status = await review(api, token)
    assert status["authenticated"] is True
    user = status["user"]
    assert user["username"] == "system:serviceaccount:default:runner"
    assert user["uid"] == account.metadata.uid
    assert user["groups"] == [
        "system:serviceaccounts",
        "system:serviceaccounts:default",
        "system:authenticated",
    ]
    assert user["extra"]["authentication.kubernetes.io/pod-name"] == ["worker"]
    assert user["extra"]["authentication.kubernetes.io/pod-uid"] == [pod.metadata.uid]
    assert user["extra"]["authentication.kubernetes.io/credential-id"] == [f"JTI={claims['jti']}"]
    assert status["audiences"] == ["https://kubernetes.default.svc"]


async def test_short_lifetime_is_raised_to_ten_minutes(api: Any, workload: tuple[Any, Any]) -> None:
    issued = await request_token(api, expirationSeconds=60)
    assert issued["spec"]["expirationSeconds"] == 600
    claims = claims_of(issued["status"]["token"])
    assert claims["exp"] - claims["iat"] == 600


async def test_audiences(api: Any, workload: tuple[Any, Any]) -> None:
    _, pod = workload
    token = (await request_token(api, audiences=["tensor-fusion"], **bound_to(pod)))["status"]["token"]
    status = await review(api, token, ["tensor-fusion", "unrelated"])
    assert status["authenticated"] is True and status["audiences"] == ["tensor-fusion"]
    refused = await review(api, token)
    assert refused["authenticated"] is False and "audiences" in refused["error"]


async def test_forged_tokens_are_not_authenticated(api: Any, workload: tuple[Any, Any]) -> None:
    account, pod = workload
    attacker = TokenAuthority.load_or_create(None)
    forged, _ = attacker.issue(
        namespace="default",
        service_account="runner",
        sa_uid=account.metadata.uid,
        pod_name="worker",
        pod_uid=pod.metadata.uid,
    )
    status = await review(api, forged)
    assert status["authenticated"] is False and "error" in status and "user" not in status

    genuine = (await request_token(api, **bound_to(pod)))["status"]["token"]
    header, payload, signature = genuine.split(".")
    claims = claims_of(genuine)
    claims["kubernetes.io"]["serviceaccount"]["name"] = "admin"
    claims["sub"] = "system:serviceaccount:default:admin"
    tampered_payload = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    tampered = await review(api, f"{header}.{tampered_payload}.{signature}")
    assert tampered["authenticated"] is False and "signature" in tampered["error"]

    none_header = base64.urlsafe_b64encode(b'{"alg":"none"}').rstrip(b"=").decode()
    unsigned = await review(api, f"{none_header}.{payload}.")
    assert unsigned["authenticated"] is False

    assert (await review(api, "not-a-jwt"))["authenticated"] is False


async def test_expired_token_is_not_authenticated(apiserver: Any, api: Any, workload: tuple[Any, Any]) -> None:
    account, pod = workload
    await request_token(api)  # the server creates its signing key on first use
    key = apiserver.call(lambda: apiserver.server.store.get_meta("sa.key"))
    assert key is not None
    server_key = TokenAuthority.load_or_create(key)
    two_hours_ago = time.time() - 7200
    args = {
        "namespace": "default",
        "service_account": "runner",
        "sa_uid": account.metadata.uid,
        "pod_name": "worker",
        "pod_uid": pod.metadata.uid,
    }
    expired, _ = server_key.issue(**args, expiration_seconds=3600, now=two_hours_ago)
    status = await review(api, expired)
    assert status == {"authenticated": False, "error": "invalid bearer token: service account token has expired"}
    # the same key and claims, still within their lifetime, are accepted: only the clock differs
    current, _ = server_key.issue(**args, expiration_seconds=3600, now=time.time() - 60)
    assert (await review(api, current))["authenticated"] is True


async def test_token_of_deleted_pod_is_not_authenticated(api: Any, workload: tuple[Any, Any]) -> None:
    _, pod = workload
    token = (await request_token(api, **bound_to(pod)))["status"]["token"]
    assert (await review(api, token))["authenticated"] is True
    await pod.delete(grace_period=0)
    await pod.wait("delete", timeout=10)
    status = await review(api, token)
    assert status["authenticated"] is False
    assert "pod default/worker has been deleted" in status["error"]

    # a new pod with the same name is a different pod: the old token stays invalid
    again = Pod(
        {
            "metadata": {"name": "worker", "namespace": "default"},
            "spec": {"containers": [{"name": "m", "image": "x"}]},
        },
        api=api,
    )
    await again.create()
    status = await review(api, token)
    assert status["authenticated"] is False and "does not match claim" in status["error"]


async def test_token_of_deleted_service_account_is_not_authenticated(api: Any, workload: tuple[Any, Any]) -> None:
    account, _ = workload
    token = (await request_token(api))["status"]["token"]
    assert (await review(api, token))["authenticated"] is True
    await account.delete()
    status = await review(api, token)
    assert status["authenticated"] is False and "service account default/runner has been deleted" in status["error"]


async def test_token_request_errors(api: Any, workload: tuple[Any, Any]) -> None:
    with pytest.raises(kr8s.ServerError) as missing_sa:
        await request_token(api, sa="nobody")
    assert missing_sa.value.response is not None and missing_sa.value.response.status_code == 404
    with pytest.raises(kr8s.ServerError) as missing_pod:
        await request_token(api, boundObjectRef={"kind": "Pod", "apiVersion": "v1", "name": "ghost"})
    assert missing_pod.value.response is not None and missing_pod.value.response.status_code == 404
    with pytest.raises(kr8s.ServerError) as bad_kind:
        await request_token(api, boundObjectRef={"kind": "Deployment", "apiVersion": "apps/v1", "name": "x"})
    assert bad_kind.value.response is not None and bad_kind.value.response.status_code == 422
    assert '"Node", "Pod"' in bad_kind.value.response.json()["message"]
    with pytest.raises(kr8s.ServerError) as missing_node:
        await request_token(api, boundObjectRef={"kind": "Node", "apiVersion": "v1", "name": "ghost"})
    assert missing_node.value.response is not None and missing_node.value.response.status_code == 404


NODE_NAME = "authentication.kubernetes.io/node-name"
NODE_UID = "authentication.kubernetes.io/node-uid"


async def pod_on(api: Any, name: str, node: str) -> Any:
    pod = Pod({"metadata": {"name": name, "namespace": "default"},
               "spec": {"nodeName": node, "serviceAccountName": "runner",
                        "containers": [{"name": "main", "image": "busybox"}]}}, api=api)
    await pod.create()
    return pod


async def extra_of(api: Any, pod: Any) -> dict[str, Any]:
    """The user extras of a token bound to `pod`."""
    token = (await request_token(api, **bound_to(pod)))["status"]["token"]
    extra: dict[str, Any] = (await review(api, token))["user"]["extra"]
    return extra


async def test_a_pod_on_a_node_gets_a_token_naming_the_node(api: Any, workload: tuple[Any, Any]) -> None:
    node = Node({"metadata": {"name": "gpu-1"}}, api=api)
    await node.create()
    pod = await pod_on(api, "placed", "gpu-1")
    token = (await request_token(api, **bound_to(pod)))["status"]["token"]
    assert claims_of(token)["kubernetes.io"]["node"] == {"name": "gpu-1", "uid": node.metadata.uid}
    status = await review(api, token)
    assert status["authenticated"] is True
    assert status["user"]["extra"][NODE_NAME] == ["gpu-1"]
    assert status["user"]["extra"][NODE_UID] == [node.metadata.uid]
    # what the API server's own authentication (RBAC, admission) sees of the user carries it too
    async with api.call_api("POST", base="/apis/authentication.k8s.io", version="v1", url="selfsubjectreviews",
                            json={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
                            headers={"authorization": f"Bearer {token}"}) as r:
        assert r.json()["status"]["userInfo"]["extra"][NODE_NAME] == ["gpu-1"]
    # a pod bound to a node that has no Node object names the node without a uid; one on no node, none
    unregistered = await pod_on(api, "early", "not-registered")
    extra = await extra_of(api, unregistered)
    assert extra[NODE_NAME] == ["not-registered"] and NODE_UID not in extra
    _, unplaced = workload
    assert NODE_NAME not in await extra_of(api, unplaced)


async def test_a_token_bound_to_a_node_lives_as_long_as_the_node(api: Any, workload: tuple[Any, Any]) -> None:
    node = Node({"metadata": {"name": "gpu-2"}}, api=api)
    await node.create()
    issued = await request_token(api, boundObjectRef={"kind": "Node", "apiVersion": "v1", "name": "gpu-2",
                                                      "uid": node.metadata.uid})
    token = issued["status"]["token"]
    assert "pod" not in claims_of(token)["kubernetes.io"]
    status = await review(api, token)
    assert status["authenticated"] is True
    assert status["user"]["extra"][NODE_NAME] == ["gpu-2"] and status["user"]["extra"][NODE_UID] == [node.metadata.uid]
    with pytest.raises(kr8s.ServerError) as stale:
        await request_token(api, boundObjectRef={"kind": "Node", "apiVersion": "v1", "name": "gpu-2", "uid": "other"})
    assert stale.value.response is not None and stale.value.response.status_code == 409
    await node.delete()
    gone = await review(api, token)
    assert gone["authenticated"] is False and "node gpu-2 has been deleted" in gone["error"]
    again = Node({"metadata": {"name": "gpu-2"}}, api=api)
    await again.create()
    recreated = await review(api, token)
    assert recreated["authenticated"] is False and "does not match claim" in recreated["error"]
