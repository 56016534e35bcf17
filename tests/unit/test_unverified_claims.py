"""`kube.auth.unverified_claims`, the one reader of a JWT's claims that does not check the token:
it must read a token however stale (its exp ends a cache entry; an expired one must still say so)
and whoever signed it, and answer None rather than raise for what is not a JWT."""

from __future__ import annotations

import pytest

from tfusion.apiserver.tokens import TokenAuthority
from tfusion.controller.scheduling.assignments import _jwt_subject
from tfusion.kube.auth import token_expiry, unverified_claims


@pytest.fixture(scope="module")
def authority() -> TokenAuthority:
    return TokenAuthority.load_or_create(None)


def test_an_expired_token_of_an_unknown_key_is_still_read(authority: TokenAuthority) -> None:
    token, exp = authority.issue(namespace="ns1", service_account="runner", sa_uid="u1",
                                 expiration_seconds=600, now=1_000_000)
    assert authority.verify(token) is None, "long expired for the authority itself"
    claims = unverified_claims(token)
    assert claims is not None and claims["exp"] == exp == 1_000_600
    assert token_expiry(token) == 1_000_600.0
    assert _jwt_subject(token) == "system:serviceaccount:ns1:runner"


@pytest.mark.parametrize("token", ["", "a.b", "not-a-jwt", "e30.W10.", "x" * 20_000, "!!!.###.$$$"])
def test_what_is_not_a_jwt_reads_as_none(token: str) -> None:
    assert unverified_claims(token) is None
    assert _jwt_subject(token) == ""
