"""Service-account tokens: the signed JWTs behind TokenRequest and TokenReview.

kube-apiserver signs bound service-account tokens with RS256 using the service-account key, and
answers TokenReview by checking the signature, the time window, the audiences, and that the
service account (and the pod the token is bound to) still exist with the UIDs the token names.
A token bound to a pod on a node, or bound to a Node directly, also names that node (as kube 1.30 and
later do), and its review carries the node's name and uid as user extras: a ValidatingAdmissionPolicy
can then hold a node agent to its own node's objects (policies.py).
This module does the same, with no HTTP in it: the REST layer calls `issue` for
`POST .../serviceaccounts/<sa>/token` and `review` for `POST .../tokenreviews`, passing lookups
into its storage. Policy that belongs to the REST layer stays there (for example kube-apiserver
raising `expirationSeconds` below 600 to 600); `issue` takes any positive lifetime so tests can
reach expiry without waiting.

Unlike the upstream TensorFusion quirk of accepting unsigned JWTs, `verify` accepts only RS256
tokens signed by this authority: `alg: none`, HMAC algorithms, other keys, tampered payloads,
and tokens outside [nbf, exp) are all refused (give or take the minute of clock skew that
kube-apiserver also allows).

The JOSE work (encoding, signing, parsing a compact token, checking its RS256 signature) is
PyJWT's, a maintained library, rather than code of our own; what is Kubernetes' is here: the
claims, their time window against an injectable clock, audiences and the bound objects.
"""

from __future__ import annotations

import base64
import hashlib
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tfusion.api.timestamps import parse_rfc3339

if TYPE_CHECKING:
    from jwt.types import Options

__all__ = [
    "DEFAULT_AUDIENCES",
    "ISSUER",
    "InvalidToken",
    "NODE_NAME_EXTRA",
    "NODE_UID_EXTRA",
    "TokenAuthority",
]

ISSUER = "https://kubernetes.default.svc.cluster.local"
DEFAULT_AUDIENCES: tuple[str, ...] = ("https://kubernetes.default.svc",)
SERVICE_ACCOUNT_GROUP = "system:serviceaccounts"
AUTHENTICATED_GROUP = "system:authenticated"
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
NODE_UID_EXTRA = "authentication.kubernetes.io/node-uid"
CREDENTIAL_ID_EXTRA = "authentication.kubernetes.io/credential-id"

CLOCK_SKEW_LEEWAY_SECONDS = 60

# kube-apiserver keeps honouring tokens of a pod or service account for a minute after its
# deletion started (the object is terminating, not gone).
_DELETION_GRACE_SECONDS = 60

Lookup = Callable[[str, str], Mapping[str, Any] | None]


class InvalidToken(Exception):
    """Why a token was refused; the message goes into TokenReview status.error."""


def _b64encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


#: what PyJWT checks on decoding: the signature only. The time claims are checked here against
#: the caller's clock (`now`, which PyJWT cannot take), the audiences by `review` (which reports
#: the ones that matched), the issuer and subject with Kubernetes' own messages.
_SIGNATURE_ONLY: Options = {"verify_signature": True, "verify_exp": False, "verify_nbf": False,
                             "verify_iat": False,
                             "verify_aud": False, "verify_iss": False, "verify_sub": False, "verify_jti": False}


def _now(now: float | None) -> int:
    return int(time.time() if now is None else now)


class TokenAuthority:
    """Signs and checks service-account JWTs with one RSA key (like --service-account-key-file)."""

    def __init__(self, private_key: rsa.RSAPrivateKey, *, api_audiences: Sequence[str] = DEFAULT_AUDIENCES):
        self._key = private_key
        self._public = private_key.public_key()
        public_der = self._public.public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        self.key_id = _b64encode(hashlib.sha256(public_der).digest())
        self.api_audiences: tuple[str, ...] = tuple(api_audiences)
        #: kube-apiserver's header: the algorithm and key id, no "typ"
        self._headers: dict[str, Any] = {"kid": self.key_id, "typ": None}

    @classmethod
    def load_or_create(
        cls, private_key_pem: bytes | None, *, api_audiences: Sequence[str] = DEFAULT_AUDIENCES
    ) -> TokenAuthority:
        """Load a PEM RSA private key, or generate a 2048-bit one when none is given."""
        if private_key_pem is None:
            return cls(rsa.generate_private_key(public_exponent=65537, key_size=2048), api_audiences=api_audiences)
        try:
            key = serialization.load_pem_private_key(private_key_pem, password=None)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"service-account signing key: not an unencrypted PEM private key ({exc})") from None
        if not isinstance(key, rsa.RSAPrivateKey):
            raise ValueError(f"service-account signing key: must be RSA, got {type(key).__name__}")
        if key.key_size < 2048:
            raise ValueError(f"service-account signing key: RSA key of {key.key_size} bits, at least 2048 needed")
        return cls(key, api_audiences=api_audiences)

    @property
    def private_key_pem(self) -> bytes:
        return self._key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    @property
    def public_key_pem(self) -> bytes:
        return self._public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)

    def jwks(self) -> dict[str, Any]:
        """The public key as a JWK set (what /openid/v1/jwks serves)."""
        numbers = self._public.public_numbers()

        def unsigned(n: int) -> str:
            return _b64encode(n.to_bytes((n.bit_length() + 7) // 8, "big"))

        key = {"use": "sig", "kty": "RSA", "kid": self.key_id, "alg": "RS256"}
        return {"keys": [{**key, "n": unsigned(numbers.n), "e": unsigned(numbers.e)}]}

    # -- issuing -------------------------------------------------------------------------------

    def issue(
        self,
        *,
        namespace: str,
        service_account: str,
        sa_uid: str,
        pod_name: str | None = None,
        pod_uid: str | None = None,
        node_name: str | None = None,
        node_uid: str | None = None,
        audiences: Iterable[str] | None = DEFAULT_AUDIENCES,
        expiration_seconds: int = 3600,
        now: float | None = None,
    ) -> tuple[str, int]:
        """Sign a token for namespace/service_account (bound to a pod when pod_name is given).

        `node_name` (with `node_uid` when the Node exists) is the node the pod runs on; without a pod
        the token is bound to that Node itself. Returns (token, exp) with exp in Unix seconds.
        """
        for field, value in (
            ("namespace", namespace),
            ("service_account", service_account),
            ("sa_uid", sa_uid),
        ):
            if not value:
                raise ValueError(f"{field}: required, got {value!r}")
        if (pod_name is None) != (pod_uid is None) or pod_name == "" or pod_uid == "":
            raise ValueError(f"pod_name and pod_uid go together, got {pod_name!r} and {pod_uid!r}")
        if node_name == "" or (node_uid is not None and not node_name) or node_uid == "":
            raise ValueError(f"node_uid needs a node_name, neither may be empty: got {node_name!r} and {node_uid!r}")
        if node_name is not None and pod_name is None and node_uid is None:
            raise ValueError(f"a token bound to node {node_name!r} needs the Node's uid")
        if isinstance(expiration_seconds, bool) or not isinstance(expiration_seconds, int) or expiration_seconds <= 0:
            raise ValueError(f"expiration_seconds: must be a positive integer, got {expiration_seconds!r}")
        aud = list(self.api_audiences if audiences is None else audiences) or list(self.api_audiences)
        issued = _now(now)
        exp = issued + expiration_seconds
        kubernetes: dict[str, Any] = {
            "namespace": namespace,
            "serviceaccount": {"name": service_account, "uid": sa_uid},
        }
        if pod_name is not None:
            kubernetes["pod"] = {"name": pod_name, "uid": pod_uid}
        if node_name is not None:
            kubernetes["node"] = {"name": node_name, **({"uid": node_uid} if node_uid else {})}
        claims = {
            "aud": aud,
            "exp": exp,
            "iat": issued,
            "iss": ISSUER,
            "jti": str(uuid.uuid4()),
            "kubernetes.io": kubernetes,
            "nbf": issued,
            "sub": f"system:serviceaccount:{namespace}:{service_account}",
        }
        return jwt.encode(claims, self._key, algorithm="RS256", headers=self._headers), exp

    # -- checking ------------------------------------------------------------------------------

    def verify(self, token: str, *, now: float | None = None) -> dict[str, Any] | None:
        """The claims of a genuine, current token; None for anything else."""
        try:
            return self.check(token, now=now)
        except InvalidToken:
            return None

    def check(self, token: str, *, now: float | None = None) -> dict[str, Any]:
        """Like verify, but raises InvalidToken saying why a token is refused."""
        if not isinstance(token, str):
            raise InvalidToken("malformed token: not a string")
        try:
            # the header first, unverified, to say why a token of another algorithm or key is refused
            header = jwt.get_unverified_header(token)
            if header.get("alg") != "RS256":
                raise InvalidToken(f"unsupported signing algorithm {header.get('alg')!r}; only RS256 is accepted")
            if "kid" in header and header["kid"] != self.key_id:
                raise InvalidToken("token was signed by an unknown key")
            claims: dict[str, Any] = jwt.decode(token, self._public, algorithms=["RS256"], options=_SIGNATURE_ONLY)
        except jwt.InvalidSignatureError:
            raise InvalidToken("signature verification failed") from None
        except jwt.PyJWTError as exc:
            raise InvalidToken(f"malformed token: {exc}") from None
        self._check_claims(claims, _now(now))
        return claims

    @staticmethod
    def _check_claims(claims: Mapping[str, Any], now: int) -> None:
        if claims.get("iss") != ISSUER:
            raise InvalidToken(f"token issuer {claims.get('iss')!r} is not {ISSUER!r}")
        for name in ("exp", "nbf", "iat"):
            value = claims.get(name)
            if name == "exp" and value is None:
                raise InvalidToken("token has no expiry (exp)")
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
                raise InvalidToken(f"claim {name} must be a number, got {value!r}")
        # kube-apiserver (go-jose) allows a minute of clock skew on every time claim
        if now - CLOCK_SKEW_LEEWAY_SECONDS >= claims["exp"]:
            raise InvalidToken("service account token has expired")
        if claims.get("nbf") is not None and now + CLOCK_SKEW_LEEWAY_SECONDS < claims["nbf"]:
            raise InvalidToken("service account token is not valid yet")
        if claims.get("iat") is not None and now + CLOCK_SKEW_LEEWAY_SECONDS < claims["iat"]:
            raise InvalidToken("service account token is issued in the future")
        private = claims.get("kubernetes.io")
        if not isinstance(private, Mapping) or not isinstance(private.get("serviceaccount"), Mapping):
            raise InvalidToken("token carries no kubernetes.io service-account claims")

    def review(
        self,
        token: str,
        *,
        audiences: Sequence[str] | None = None,
        lookup_pod: Lookup,
        lookup_service_account: Lookup,
        lookup_node: Lookup | None = None,
        now: float | None = None,
    ) -> dict[str, Any]:
        """The `status` of a TokenReview for `token` (audiences: spec.audiences, or the API's).

        Nodes are looked up with namespace "" (and only for tokens bound to a Node, which stop
        working with it); without `lookup_node` such tokens are refused.
        """
        try:
            return self._review(token, audiences, lookup_pod, lookup_service_account, lookup_node, _now(now))
        except InvalidToken as exc:
            return {"authenticated": False, "error": f"invalid bearer token: {exc}"}

    def _review(
        self,
        token: str,
        audiences: Sequence[str] | None,
        lookup_pod: Lookup,
        lookup_service_account: Lookup,
        lookup_node: Lookup | None,
        now: int,
    ) -> dict[str, Any]:
        claims = self.check(token, now=now)
        wanted = list(audiences) if audiences else list(self.api_audiences)
        token_aud = claims.get("aud")
        token_audiences = [token_aud] if isinstance(token_aud, str) else list(token_aud or [])
        matched = [a for a in wanted if a in token_audiences]
        if not matched:
            raise InvalidToken(f"token audiences {token_audiences} are invalid for the target audiences {wanted}")
        private = claims["kubernetes.io"]
        namespace = private.get("namespace")
        sa = private["serviceaccount"]
        sa_name, sa_uid = sa.get("name"), sa.get("uid")
        if not isinstance(namespace, str) or not isinstance(sa_name, str) or not isinstance(sa_uid, str):
            raise InvalidToken("token carries malformed kubernetes.io service-account claims")
        if claims.get("sub") != f"system:serviceaccount:{namespace}:{sa_name}":
            raise InvalidToken("token subject does not match its service-account claims")
        account = lookup_service_account(namespace, sa_name)
        _check_alive(account, "service account", namespace, sa_name, sa_uid, now)
        extra: dict[str, list[str]] = {}
        pod = private.get("pod")
        if pod is not None:
            if not isinstance(pod, Mapping) or not isinstance(pod.get("name"), str):
                raise InvalidToken("token carries a malformed pod claim")
            _check_alive(lookup_pod(namespace, pod["name"]), "pod", namespace, pod["name"], pod.get("uid"), now)
            extra[POD_NAME_EXTRA] = [pod["name"]]
            extra[POD_UID_EXTRA] = [str(pod.get("uid"))]
        extra.update(_node_extra(private.get("node"), pod is None, lookup_node, now))
        if isinstance(claims.get("jti"), str):
            extra[CREDENTIAL_ID_EXTRA] = [f"JTI={claims['jti']}"]
        return {
            "authenticated": True,
            "user": {
                "username": f"system:serviceaccount:{namespace}:{sa_name}",
                "uid": sa_uid,
                "groups": [
                    SERVICE_ACCOUNT_GROUP,
                    f"{SERVICE_ACCOUNT_GROUP}:{namespace}",
                    AUTHENTICATED_GROUP,
                ],
                "extra": extra,
            },
            "audiences": matched,
        }


def _node_extra(node: Any, node_bound: bool, lookup_node: Lookup | None, now: int) -> dict[str, list[str]]:
    """The node extras of a token's node claim; a token bound to the Node itself lives only as long
    as that Node does (a pod's node claim is informational: the pod claim is what binds it)."""
    if node is None:
        return {}
    if not isinstance(node, Mapping) or not isinstance(node.get("name"), str) or not node["name"]:
        raise InvalidToken("token carries a malformed node claim")
    uid = node.get("uid")
    if uid is not None and not isinstance(uid, str):
        raise InvalidToken("token carries a malformed node claim")
    if node_bound:
        if not uid:
            raise InvalidToken(f"token bound to node {node['name']} carries no node uid")
        if lookup_node is None:
            raise InvalidToken(f"token bound to node {node['name']}: nodes cannot be looked up here")
        _check_alive(lookup_node("", node["name"]), "node", "", node["name"], uid, now)
    extra = {NODE_NAME_EXTRA: [node["name"]]}
    if uid:
        extra[NODE_UID_EXTRA] = [uid]
    return extra


def _check_alive(obj: Mapping[str, Any] | None, what: str, namespace: str, name: str, uid: Any, now: int) -> None:
    """The object a token names must exist, have the token's UID, and not be long terminating."""
    where = f"{namespace}/{name}" if namespace else name
    if obj is None:
        raise InvalidToken(f"{what} {where} has been deleted")
    meta = obj.get("metadata") or {}
    if meta.get("uid") != uid:
        raise InvalidToken(f"{what} UID ({meta.get('uid')}) does not match claim ({uid})")
    deleting = meta.get("deletionTimestamp")
    if isinstance(deleting, str) and _parse_time(deleting) + _DELETION_GRACE_SECONDS <= now:
        raise InvalidToken(f"{what} {where} is being deleted")


def _parse_time(text: str) -> float:
    try:
        return parse_rfc3339(text).timestamp()
    except ValueError:
        return 0.0
