"""TokenReviewer against the embedded API server's TokenRequest and TokenReview.

Tokens: a genuine pod-bound token from TokenRequest; a forged one (same claims, signed with
another RSA key); an expired one (signed with the server's own key, read from its state, issued
an hour ago, because TokenRequest refuses lifetimes under 10 minutes); a malformed one; and one
for a pod that was deleted. Plus the cache (successes 30 min, failures 5 s, LRU bound) and the
rule that a token that could not be reviewed is never accepted.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.helpers import Clock
from tfusion.apiserver.tokens import TokenAuthority
from tfusion.kube import resources as r
from tfusion.kube.auth import ReviewedToken, ReviewUnavailable, TokenReviewer, Unauthenticated
from tfusion.kube.client import KubeClient

pytestmark = pytest.mark.anyio


@pytest.fixture
async def kube(kube: KubeClient) -> KubeClient:
    """The shared client (tests/apiserver_fixture.py), with namespace auth and its `worker` account."""
    await kube.create(r.NAMESPACES, {"metadata": {"name": "auth"}})
    await kube.create(r.SERVICEACCOUNTS, {"metadata": {"name": "worker", "namespace": "auth"}})
    return kube


async def make_pod(kube: KubeClient, name: str) -> dict[str, Any]:
    return await kube.create(r.PODS, {"metadata": {"name": name, "namespace": "auth"},
                                      "spec": {"serviceAccountName": "worker",
                                               "containers": [{"name": "c", "image": "x"}]}})


async def pod_token(kube: KubeClient, pod: dict[str, Any]) -> str:
    return await kube.request_token("auth", "worker", bound_pod={"name": pod["metadata"]["name"],
                                                                 "uid": pod["metadata"]["uid"]})


def claims_for(sa: dict[str, Any], pod: dict[str, Any]) -> dict[str, Any]:
    return {"namespace": "auth", "service_account": "worker", "sa_uid": sa["metadata"]["uid"],
            "pod_name": pod["metadata"]["name"], "pod_uid": pod["metadata"]["uid"]}


async def test_genuine_token_names_the_pod(kube: KubeClient) -> None:
    pod = await make_pod(kube, "p1")
    reviewer = TokenReviewer(kube)
    who = await reviewer.review(await pod_token(kube, pod))
    assert who == ReviewedToken(username="system:serviceaccount:auth:worker", namespace="auth",
                                service_account="worker", pod_name="p1", pod_uid=pod["metadata"]["uid"],
                                uid=who.uid, groups=who.groups)
    assert "system:serviceaccounts" in who.groups


async def test_forged_expired_malformed_and_orphaned_tokens_are_refused(apiserver: Any, kube: KubeClient) -> None:
    pod = await make_pod(kube, "p2")
    sa = await kube.get(r.SERVICEACCOUNTS, "worker", namespace="auth")
    forger = TokenAuthority.load_or_create(None)
    forged, _ = forger.issue(**claims_for(sa, pod), expiration_seconds=3600)
    await pod_token(kube, pod)  # the server creates its signing key when it first issues a token
    server_key = apiserver.call(lambda: apiserver.server.store.get_meta("sa.key"))
    assert server_key is not None
    authority = TokenAuthority.load_or_create(server_key)
    expired, _ = authority.issue(**claims_for(sa, pod), expiration_seconds=600, now=time.time() - 3600)
    still_valid, _ = authority.issue(**claims_for(sa, pod), expiration_seconds=600)
    reviewer = TokenReviewer(kube)
    assert (await reviewer.review(still_valid)).pod_name == "p2", "the server's key is the right one"
    for token in (forged, expired, "not-a-jwt", forged.rsplit(".", 1)[0] + ".", ""):
        with pytest.raises(Unauthenticated) as refused:
            await reviewer.review(token)
        assert refused.value.reason and not isinstance(refused.value, ReviewUnavailable)

    orphan_pod = await make_pod(kube, "gone")
    orphan_token = await pod_token(kube, orphan_pod)
    await kube.delete(r.PODS, "gone", namespace="auth", grace_period_seconds=0)
    with pytest.raises(Unauthenticated):
        await TokenReviewer(kube).review(orphan_token)


async def test_cache_ttls_and_lru_bound(kube: KubeClient) -> None:
    clock = Clock()
    reviewer = TokenReviewer(kube, clock=clock, cache_size=2)
    pods = [await make_pod(kube, f"c{i}") for i in range(3)]
    tokens = [await pod_token(kube, pod) for pod in pods]
    await reviewer.review(tokens[0])
    await reviewer.review(f"Bearer {tokens[0]}")
    assert reviewer.reviews == 1, "a success is cached"
    clock.now += 1799
    await reviewer.review(tokens[0])
    assert reviewer.reviews == 1
    clock.now += 2
    await reviewer.review(tokens[0])
    assert reviewer.reviews == 2, "successes expire after 30 minutes"

    for _ in range(3):
        with pytest.raises(Unauthenticated):
            await reviewer.review("forged.token.value")
    assert reviewer.reviews == 3, "a failure is cached too"
    clock.now += 5.1
    with pytest.raises(Unauthenticated):
        await reviewer.review("forged.token.value")
    assert reviewer.reviews == 4, "failures expire after 5 seconds"

    await reviewer.review(tokens[1])
    await reviewer.review(tokens[2])
    assert len(reviewer) == 2
    await reviewer.review(tokens[2])
    assert reviewer.reviews == 6
    await reviewer.review(tokens[0])  # evicted (least recently used) -> asked again
    assert reviewer.reviews == 7


async def test_unreviewable_token_is_never_accepted(apiserver: Any, kube: KubeClient) -> None:
    pod = await make_pod(kube, "u")
    known, unknown = await pod_token(kube, pod), await pod_token(kube, pod)
    reviewer = TokenReviewer(kube)
    await reviewer.review(known)
    apiserver.stop()
    for _ in range(2):
        with pytest.raises(ReviewUnavailable, match="token review failed"):
            await reviewer.review(unknown)
    assert reviewer.reviews == 3, "an unreviewable token is not cached; each call asks again"
    assert len(reviewer) == 1
    assert (await reviewer.review(known)).pod_name == "u", "cached successes still answer"
