"""TokenReviewer against the embedded API server's TokenRequest and TokenReview.

Tokens: a genuine pod-bound token from TokenRequest; a forged one (same claims, signed with
another RSA key); an expired one (signed with the server's own key, read from its state, issued
an hour ago, because TokenRequest refuses lifetimes under 10 minutes); a malformed one; and one
for a pod that was deleted. Plus the cache (successes 30 s and never past the token's exp,
failures 2 s, forget_pod, LRU bound) and the rule that a token that could not be reviewed is
never accepted. The cache's clocks are injected, so no test sleeps.
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import pytest

from tests.helpers import Clock
from tfusion.apiserver.tokens import TokenAuthority
from tfusion.kube import resources as r
from tfusion.kube.auth import (
    ReviewedToken,
    ReviewUnavailable,
    TokenReviewer,
    Unauthenticated,
    authenticate,
    token_expiry,
)
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
    reviewer = TokenReviewer(kube, now=clock, cache_size=2)
    pods = [await make_pod(kube, f"c{i}") for i in range(3)]
    tokens = [await pod_token(kube, pod) for pod in pods]
    await reviewer.review(tokens[0])
    await authenticate(reviewer, f"Bearer {tokens[0]}")
    assert reviewer.reviews == 1, "a success is cached, whichever form the header had"
    clock.now += 29
    await reviewer.review(tokens[0])
    assert reviewer.reviews == 1
    clock.now += 2
    await reviewer.review(tokens[0])
    assert reviewer.reviews == 2, "successes expire after 30 seconds"

    for _ in range(3):
        with pytest.raises(Unauthenticated):
            await reviewer.review("forged.token.value")
    assert reviewer.reviews == 3, "a failure is cached too"
    clock.now += 2.1
    with pytest.raises(Unauthenticated):
        await reviewer.review("forged.token.value")
    assert reviewer.reviews == 4, "failures expire after 2 seconds"

    await reviewer.review(tokens[1])
    await reviewer.review(tokens[2])
    assert len(reviewer) == 2
    await reviewer.review(tokens[2])
    assert reviewer.reviews == 6
    await reviewer.review(tokens[0])  # evicted (least recently used) -> asked again
    assert reviewer.reviews == 7


async def test_cache_entry_ends_at_the_tokens_exp(kube: KubeClient) -> None:
    """The reviewer's wall clock is set to 10 s before the token's exp (the server, on its real
    clock, still accepts it): the cached success must not outlive the exp."""
    token = await pod_token(kube, await make_pod(kube, "soon"))
    exp = token_expiry(token)
    assert exp is not None and exp > time.time() + 600
    clock, wall = Clock(), Clock()
    wall.now = exp - 10

    def advance(seconds: float) -> None:
        clock.now += seconds
        wall.now += seconds

    reviewer = TokenReviewer(kube, now=clock, wall_clock=wall)
    await reviewer.review(token)
    advance(9)
    await reviewer.review(token)
    assert reviewer.reviews == 1, "cached until its exp"
    advance(2)
    await reviewer.review(token)
    assert reviewer.reviews == 2, "re-reviewed once its exp has passed, although the TTL (30 s) has not"
    await reviewer.review(token)
    assert reviewer.reviews == 3, "a token already past its exp is not cached at all"


async def test_forget_pod_drops_its_entries(kube: KubeClient) -> None:
    leaving, staying = await make_pod(kube, "leaving"), await make_pod(kube, "staying")
    leaving_tokens = [await pod_token(kube, leaving) for _ in range(2)]
    staying_token = await pod_token(kube, staying)
    reviewer = TokenReviewer(kube)
    for token in (*leaving_tokens, staying_token):
        await reviewer.review(token)
    assert reviewer.reviews == 3 and len(reviewer) == 3
    assert reviewer.forget_pod(leaving["metadata"]["uid"]) == 2
    assert reviewer.forget_pod(leaving["metadata"]["uid"]) == 0
    assert reviewer.forget_pod("") == 0
    await reviewer.review(staying_token)
    assert reviewer.reviews == 3, "the other pod's entry stays"
    await kube.delete(r.PODS, "leaving", namespace="auth", grace_period_seconds=0)
    with pytest.raises(Unauthenticated):
        await reviewer.review(leaving_tokens[0])
    assert reviewer.reviews == 4, "a forgotten pod's token is reviewed again, and refused once the pod is gone"


async def test_deleted_service_accounts_token_is_refused_once_the_ttl_passes(kube: KubeClient) -> None:
    await kube.create(r.SERVICEACCOUNTS, {"metadata": {"name": "doomed", "namespace": "auth"}})
    token = await kube.request_token("auth", "doomed")
    clock = Clock()
    reviewer = TokenReviewer(kube, now=clock)
    assert (await reviewer.review(token)).service_account == "doomed"
    await kube.delete(r.SERVICEACCOUNTS, "doomed", namespace="auth")
    clock.now += 29
    assert (await reviewer.review(token)).service_account == "doomed", "still inside the short TTL"
    clock.now += 2
    with pytest.raises(Unauthenticated):
        await reviewer.review(token)
    assert reviewer.reviews == 2


def _jwt(claims: Any) -> str:
    payload = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    return f"eyJhbGciOiJub25lIn0.{payload}.sig"


@pytest.mark.parametrize(("token", "expected"), [
    (_jwt({"exp": 1_900_000_000}), 1_900_000_000.0),
    (_jwt({"exp": 1.5}), 1.5),
    (_jwt({"sub": "no exp"}), None),
    (_jwt({"exp": "1900000000"}), None),
    (_jwt({"exp": True}), None),
    (_jwt({"exp": 10**400}), None),
    (_jwt([1, 2]), None),
    ("eyJhbGciOiJub25lIn0.!!!.sig", None),
    ("not-a-jwt", None),
    ("a.b", None),
])
def test_token_expiry_reads_exp_only_when_it_is_a_number(token: str, expected: float | None) -> None:
    assert token_expiry(token) == expected


async def test_a_token_without_exp_gets_the_short_ttl(kube: KubeClient) -> None:
    reviewer = TokenReviewer(kube)
    assert reviewer._success_life(_jwt({"sub": "x"})) == 30.0
    assert reviewer._success_life("opaque-token") == 30.0
    far, near = TokenReviewer(kube, wall_clock=lambda: 1000.0), _jwt({"exp": 1012})
    assert far._success_life(near) == 12.0


@pytest.mark.parametrize(("success_ttl", "failure_ttl", "field"), [
    (1800.0, 2.0, "success_ttl"), (-1.0, 0.0, "success_ttl"), (30.0, 60.0, "failure_ttl"),
])
async def test_long_cache_lives_are_refused(kube: KubeClient, success_ttl: float, failure_ttl: float,
                                            field: str) -> None:
    with pytest.raises(ValueError, match=field):
        TokenReviewer(kube, success_ttl=success_ttl, failure_ttl=failure_ttl)


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
