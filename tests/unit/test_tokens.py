"""Service-account JWTs: issue, verify, and TokenReview, including attacker-made tokens."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import json
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa

from tfusion.apiserver.tokens import ISSUER, NODE_NAME_EXTRA, NODE_UID_EXTRA, POD_NAME_EXTRA, TokenAuthority

NOW = 1_800_000_000


@pytest.fixture(scope="module")
def authority() -> TokenAuthority:
    return TokenAuthority.load_or_create(None)


@pytest.fixture(scope="module")
def attacker() -> TokenAuthority:
    return TokenAuthority.load_or_create(None)


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def parts(token: str) -> tuple[dict[str, Any], dict[str, Any], str]:
    h, p, s = token.split(".")
    return json.loads(unb64(h)), json.loads(unb64(p)), s


class Store:
    """What the REST layer's storage would answer."""

    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], dict[str, Any]] = {("ns1", "worker"): {"metadata": {"uid": "pod-uid-1"}}}
        self.sas: dict[tuple[str, str], dict[str, Any]] = {("ns1", "runner"): {"metadata": {"uid": "sa-uid-1"}}}

    def pod(self, ns: str, name: str) -> dict[str, Any] | None:
        return self.pods.get((ns, name))

    def sa(self, ns: str, name: str) -> dict[str, Any] | None:
        return self.sas.get((ns, name))


def issue(auth: TokenAuthority, **overrides: Any) -> tuple[str, int]:
    args: dict[str, Any] = {
        "namespace": "ns1",
        "service_account": "runner",
        "sa_uid": "sa-uid-1",
        "pod_name": "worker",
        "pod_uid": "pod-uid-1",
        "now": NOW,
    }
    args.update(overrides)
    return auth.issue(**args)


def review(auth: TokenAuthority, token: str, store: Store | None = None, **kw: Any) -> dict[str, Any]:
    store = store or Store()
    kw.setdefault("now", NOW + 10)
    return auth.review(token, lookup_pod=store.pod, lookup_service_account=store.sa, **kw)


def test_issued_token_claims(authority: TokenAuthority) -> None:
    token, exp = issue(authority, expiration_seconds=7200)
    header, claims, _ = parts(token)
    assert header == {"alg": "RS256", "kid": authority.key_id}
    assert exp == NOW + 7200
    assert claims["iss"] == ISSUER == "https://kubernetes.default.svc.cluster.local"
    assert claims["sub"] == "system:serviceaccount:ns1:runner"
    assert claims["aud"] == ["https://kubernetes.default.svc"]
    assert (claims["exp"], claims["iat"], claims["nbf"]) == (NOW + 7200, NOW, NOW)
    assert len(claims["jti"]) == 36
    assert claims["kubernetes.io"] == {
        "namespace": "ns1",
        "serviceaccount": {"name": "runner", "uid": "sa-uid-1"},
        "pod": {"name": "worker", "uid": "pod-uid-1"},
    }
    assert authority.verify(token, now=NOW + 1) == claims


def test_key_id_is_sha256_of_public_key(authority: TokenAuthority) -> None:
    der = serialization.load_pem_public_key(authority.public_key_pem).public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    assert authority.key_id == b64(hashlib.sha256(der).digest())
    jwk = authority.jwks()["keys"][0]
    assert jwk["kid"] == authority.key_id and jwk["alg"] == "RS256" and jwk["e"] == "AQAB"


def test_review_of_valid_bound_token(authority: TokenAuthority) -> None:
    token, _ = issue(authority)
    jti = parts(token)[1]["jti"]
    status = review(authority, token)
    assert status == {
        "authenticated": True,
        "user": {
            "username": "system:serviceaccount:ns1:runner",
            "uid": "sa-uid-1",
            "groups": ["system:serviceaccounts", "system:serviceaccounts:ns1", "system:authenticated"],
            "extra": {
                "authentication.kubernetes.io/pod-name": ["worker"],
                "authentication.kubernetes.io/pod-uid": ["pod-uid-1"],
                "authentication.kubernetes.io/credential-id": [f"JTI={jti}"],
            },
        },
        "audiences": ["https://kubernetes.default.svc"],
    }


def test_review_of_unbound_token_has_no_pod_extra(authority: TokenAuthority) -> None:
    token, _ = issue(authority, pod_name=None, pod_uid=None)
    status = review(authority, token)
    assert status["authenticated"] is True
    assert set(status["user"]["extra"]) == {"authentication.kubernetes.io/credential-id"}


def test_key_survives_reload(authority: TokenAuthority) -> None:
    token, _ = issue(authority)
    reloaded = TokenAuthority.load_or_create(authority.private_key_pem)
    assert reloaded.key_id == authority.key_id
    assert reloaded.verify(token, now=NOW) is not None


def test_token_from_another_key_is_refused(authority: TokenAuthority, attacker: TokenAuthority) -> None:
    forged, _ = issue(attacker)
    assert authority.verify(forged, now=NOW) is None
    status = review(authority, forged)
    assert status["authenticated"] is False
    assert "unknown key" in status["error"]


def test_token_from_another_key_without_kid_fails_signature(
    authority: TokenAuthority, attacker: TokenAuthority
) -> None:
    forged, _ = issue(attacker)
    _, payload, _ = forged.split(".")
    header = b64(json.dumps({"alg": "RS256"}).encode())
    key = serialization.load_pem_private_key(attacker.private_key_pem, password=None)
    assert isinstance(key, rsa.RSAPrivateKey)
    sig = key.sign(f"{header}.{payload}".encode(), padding.PKCS1v15(), hashes.SHA256())
    status = review(authority, f"{header}.{payload}.{b64(sig)}")
    assert status == {"authenticated": False, "error": "invalid bearer token: signature verification failed"}


def test_alg_none_is_refused(authority: TokenAuthority) -> None:
    token, _ = issue(authority)
    _, payload, _ = token.split(".")
    for header in ({"alg": "none"}, {"alg": "None", "kid": authority.key_id}):
        unsigned = f"{b64(json.dumps(header).encode())}.{payload}."
        assert authority.verify(unsigned, now=NOW) is None
        assert "only RS256" in review(authority, unsigned)["error"]


def test_hmac_with_public_key_is_refused(authority: TokenAuthority) -> None:
    """The classic key-confusion attack: HS256 keyed with the public key."""
    token, _ = issue(authority)
    _, payload, _ = token.split(".")
    header = b64(json.dumps({"alg": "HS256", "kid": authority.key_id}).encode())
    sig = hmac.new(authority.public_key_pem, f"{header}.{payload}".encode(), hashlib.sha256).digest()
    assert authority.verify(f"{header}.{payload}.{b64(sig)}", now=NOW) is None


def test_tampered_payload_is_refused(authority: TokenAuthority) -> None:
    token, _ = issue(authority)
    header, payload, sig = token.split(".")
    claims = json.loads(unb64(payload))
    claims["kubernetes.io"]["serviceaccount"]["name"] = "admin"
    claims["sub"] = "system:serviceaccount:ns1:admin"
    tampered = f"{header}.{b64(json.dumps(claims).encode())}.{sig}"
    assert authority.verify(tampered, now=NOW) is None
    assert review(authority, tampered)["error"] == "invalid bearer token: signature verification failed"


@pytest.mark.parametrize(
    "garbage",
    [
        "",
        "abc",
        "a.b",
        "a.b.c.d",
        "!!!.###.$$$",
        "e30.e30.e30",
        "eyJhbGciOiJSUzI1NiJ9.bm90IGpzb24.AAAA",
        "x" * 5000,
    ],
)
def test_garbled_tokens_are_refused(authority: TokenAuthority, garbage: str) -> None:
    assert authority.verify(garbage, now=NOW) is None
    status = review(authority, garbage)
    assert status["authenticated"] is False and status["error"].startswith("invalid bearer token: ")


def test_expiry_and_not_before_with_a_minute_of_clock_skew(authority: TokenAuthority) -> None:
    token, exp = issue(authority, expiration_seconds=600)
    assert authority.verify(token, now=exp - 1) is not None
    assert authority.verify(token, now=exp + 59) is not None, "kube-apiserver allows 60 s of skew"
    assert authority.verify(token, now=exp + 60) is None
    expired = review(authority, token, now=exp + 61)
    assert expired == {"authenticated": False, "error": "invalid bearer token: service account token has expired"}
    assert authority.verify(token, now=NOW - 59) is not None
    assert authority.verify(token, now=NOW - 61) is None
    assert "not valid yet" in review(authority, token, now=NOW - 120)["error"]


def test_issued_in_the_future_is_refused(authority: TokenAuthority) -> None:
    token, _ = issue(authority)
    header, payload, _ = token.split(".")
    claims = json.loads(unb64(payload))
    claims["iat"] = NOW + 3600
    key = serialization.load_pem_private_key(authority.private_key_pem, password=None)
    assert isinstance(key, rsa.RSAPrivateKey)
    body = b64(json.dumps(claims).encode())
    sig = key.sign(f"{header}.{body}".encode(), padding.PKCS1v15(), hashes.SHA256())
    status = review(authority, f"{header}.{body}.{b64(sig)}")
    assert status == {
        "authenticated": False,
        "error": "invalid bearer token: service account token is issued in the future",
    }


def test_deleted_or_replaced_pod_invalidates_token(authority: TokenAuthority) -> None:
    token, _ = issue(authority)
    store = Store()
    del store.pods[("ns1", "worker")]
    assert review(authority, token, store) == {
        "authenticated": False,
        "error": "invalid bearer token: pod ns1/worker has been deleted",
    }
    store.pods[("ns1", "worker")] = {"metadata": {"uid": "pod-uid-2"}}
    assert "pod UID (pod-uid-2) does not match claim (pod-uid-1)" in review(authority, token, store)["error"]


def test_terminating_pod_is_honoured_for_a_minute(authority: TokenAuthority) -> None:
    deletion = int(dt.datetime(2027, 1, 15, 8, tzinfo=dt.UTC).timestamp())
    store = Store()
    store.pods[("ns1", "worker")]["metadata"]["deletionTimestamp"] = "2027-01-15T08:00:00Z"
    token, _ = issue(authority, now=deletion - 100, expiration_seconds=3600)
    assert review(authority, token, store, now=deletion + 30)["authenticated"] is True
    assert "pod ns1/worker is being deleted" in review(authority, token, store, now=deletion + 61)["error"]


def test_unknown_or_recreated_service_account(authority: TokenAuthority) -> None:
    token, _ = issue(authority)
    store = Store()
    store.sas.clear()
    assert "service account ns1/runner has been deleted" in review(authority, token, store)["error"]
    store.sas[("ns1", "runner")] = {"metadata": {"uid": "sa-uid-2"}}
    assert "service account UID (sa-uid-2) does not match claim (sa-uid-1)" in review(authority, token, store)["error"]


def test_audiences(authority: TokenAuthority) -> None:
    token, _ = issue(authority, audiences=["vault", "tensor-fusion"])
    assert review(authority, token, audiences=["tensor-fusion", "other"])["audiences"] == ["tensor-fusion"]
    refused = review(authority, token)
    assert refused["authenticated"] is False and "invalid for the target audiences" in refused["error"]
    default_token, _ = issue(authority, audiences=None)
    assert parts(default_token)[1]["aud"] == ["https://kubernetes.default.svc"]


def test_issue_validates_arguments(authority: TokenAuthority) -> None:
    with pytest.raises(ValueError, match="expiration_seconds"):
        issue(authority, expiration_seconds=0)
    with pytest.raises(ValueError, match="pod_name and pod_uid go together"):
        issue(authority, pod_uid=None)
    with pytest.raises(ValueError, match="namespace: required"):
        issue(authority, namespace="")


def test_load_rejects_bad_keys() -> None:
    with pytest.raises(ValueError, match="not an unencrypted PEM private key"):
        TokenAuthority.load_or_create(b"not a key")
    ec_pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    with pytest.raises(ValueError, match="must be RSA"):
        TokenAuthority.load_or_create(ec_pem)


NODE_NAME, NODE_UID = NODE_NAME_EXTRA, NODE_UID_EXTRA


def node_lookup(nodes: dict[str, dict[str, Any]]) -> Any:
    def find(namespace: str, name: str) -> dict[str, Any] | None:
        assert namespace == ""
        return nodes.get(name)

    return find


def test_a_pod_token_names_its_node_without_binding_to_it(authority: TokenAuthority) -> None:
    token, _ = issue(authority, node_name="gpu-1", node_uid="node-uid-1")
    assert parts(token)[1]["kubernetes.io"]["node"] == {"name": "gpu-1", "uid": "node-uid-1"}
    # the pod claim binds the token: a gone Node does not matter, so no node lookup is needed
    extra = review(authority, token)["user"]["extra"]
    assert extra[NODE_NAME] == ["gpu-1"] and extra[NODE_UID] == ["node-uid-1"]
    unregistered, _ = issue(authority, node_name="gpu-2")
    assert parts(unregistered)[1]["kubernetes.io"]["node"] == {"name": "gpu-2"}
    extra = review(authority, unregistered)["user"]["extra"]
    assert extra[NODE_NAME] == ["gpu-2"] and NODE_UID not in extra


def test_a_node_bound_token_needs_its_node_alive(authority: TokenAuthority) -> None:
    token, _ = issue(authority, pod_name=None, pod_uid=None, node_name="gpu-1", node_uid="node-uid-1")
    assert "pod" not in parts(token)[1]["kubernetes.io"]
    alive = node_lookup({"gpu-1": {"metadata": {"uid": "node-uid-1"}}})
    status = review(authority, token, lookup_node=alive)
    assert status["authenticated"] is True
    assert status["user"]["extra"][NODE_NAME] == ["gpu-1"] and POD_NAME_EXTRA not in status["user"]["extra"]
    gone = review(authority, token, lookup_node=node_lookup({}))
    assert gone == {"authenticated": False, "error": "invalid bearer token: node gpu-1 has been deleted"}
    replaced = review(authority, token, lookup_node=node_lookup({"gpu-1": {"metadata": {"uid": "node-uid-2"}}}))
    assert "node UID (node-uid-2) does not match claim (node-uid-1)" in replaced["error"]
    assert "nodes cannot be looked up" in review(authority, token)["error"]


def test_node_claims_are_checked(authority: TokenAuthority) -> None:
    with pytest.raises(ValueError, match="needs the Node's uid"):
        issue(authority, pod_name=None, pod_uid=None, node_name="gpu-1")
    with pytest.raises(ValueError, match="node_uid needs a node_name"):
        issue(authority, node_uid="node-uid-1")
    with pytest.raises(ValueError, match="neither may be empty"):
        issue(authority, node_name="")
