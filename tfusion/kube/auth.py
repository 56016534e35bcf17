"""Bearer-token authentication through the API server's TokenReview.

Pods call the controller and the hypervisor with their service-account token; only the API
server can say whether such a token is genuine, unexpired and bound to a pod that still exists.
`TokenReviewer` asks it (authentication.k8s.io/v1 TokenReview) and remembers the answer briefly,
in an LRU of 20,000 tokens (hashed; the cache never holds a token in clear):

- a success for 30 s (at most 60 s), and never past the token's own `exp`, so an expired token,
  or one whose ServiceAccount or pod was deleted, is refused again within that short window;
- `forget_pod(uid)` drops at once every success that named that pod (the hypervisor calls it
  when the pod is deleted or leaves the node);
- a refusal for 2 s, so a burst of bad requests costs one review;
- a token that could not be reviewed (the API server failed or did not answer) is never
  accepted and never cached.

The `exp` claim is read without checking the signature: it can only shorten a cache entry,
never make a token acceptable; the API server alone decides that.

`authenticate()` is the one step every token route takes (`GET /api/connection`, the assign
routes, the hypervisor's `/api/v1/pod` and `/api/v1/process`): it reads the Authorization header,
reviews the token and refuses with one exception type whose `status` (401, or 503 when the API
server could not review the token) and `message` each route answers as it answers errors, so a
caller gets the same words from every route for the same mistake.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import jwt

from tfusion.api.accessors import Body, section
from tfusion.api.jsontypes import JsonObject
from tfusion.kube.client import KubeClient, KubeError

log = logging.getLogger(__name__)

POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"

#: how long a successful review is trusted (capped by the token's exp)
SUCCESS_TTL_S = 30.0
#: the most a caller may ask for: a deleted ServiceAccount's token is refused within this
MAX_SUCCESS_TTL_S = 60.0
#: how long a refusal is remembered, and the most a caller may ask for
FAILURE_TTL_S = 2.0
MAX_FAILURE_TTL_S = 5.0
#: the longest token whose claims we decode to find its exp (kube tokens are ~1 KiB)
_MAX_DECODED_TOKEN = 16 * 1024
#: the Authorization header forms the token routes accept (the original also takes the raw token)
AUTH_FORMS = "'Bearer <service-account token>' or the raw token"
#: the request field a refusal names (ErrorBody.field)
AUTH_FIELD = "Authorization"


class Unauthenticated(Exception):
    """The token was refused; `reason` says why (the API server's words where it gave some).

    `status` and `message` are what a route answers, so every route words a refusal alike."""

    status: ClassVar[int] = 401

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)

    @property
    def message(self) -> str:
        return f"unauthorized: {self.reason}"


class ReviewUnavailable(Unauthenticated):
    """The token could not be reviewed (API server error); not the caller's fault, never cached."""

    status: ClassVar[int] = 503

    @property
    def message(self) -> str:
        return self.reason


@dataclass(frozen=True)
class ReviewedToken:
    """Who a genuine token belongs to. Pod fields are "" for a token not bound to a pod."""

    username: str
    namespace: str = ""
    service_account: str = ""
    pod_name: str = ""
    pod_uid: str = ""
    uid: str = ""
    groups: tuple[str, ...] = ()


def _first(values: Any) -> str:
    """The first value of a user's `extra` entry (a list of strings; a bare string is taken as one)."""
    if isinstance(values, str):
        return values
    return str(values[0]) if isinstance(values, list) and values else ""


def parse_review(review: Body) -> ReviewedToken:
    """A TokenReview response to the identity, or Unauthenticated with the server's reason."""
    status = review.status
    if not status.get("authenticated"):
        raise Unauthenticated(str(status.get("error") or "token not authenticated"))
    user = section(status, "user")
    username = str(user.get("username") or "")
    namespace = service_account = ""
    if username.startswith(SERVICE_ACCOUNT_PREFIX):
        parts = username[len(SERVICE_ACCOUNT_PREFIX):].split(":")
        if len(parts) == 2:
            namespace, service_account = parts
    extra = section(user, "extra")
    return ReviewedToken(username=username, namespace=namespace, service_account=service_account,
                         pod_name=_first(extra.get(POD_NAME_EXTRA)), pod_uid=_first(extra.get(POD_UID_EXTRA)),
                         uid=str(user.get("uid") or ""), groups=tuple(user.get("groups") or ()))


def unverified_claims(token: str) -> JsonObject | None:
    """A JWT's claims as PyJWT decodes them, without checking its signature or times; None when it
    is not a JWT (or a larger one than any Kubernetes issues).

    Only for what authorizes nothing: when a cache entry ends, the name a token of our own gives."""
    if len(token) > _MAX_DECODED_TOKEN:
        return None
    try:
        claims: JsonObject = jwt.decode(token, options={"verify_signature": False})
    except (jwt.PyJWTError, ValueError, RecursionError):
        return None
    return claims


def token_expiry(token: str) -> float | None:
    """The JWT's `exp` (seconds since the epoch), or None when it has none or is not a JWT.

    Not verified: used only to end a cache entry early."""
    claims = unverified_claims(token)
    exp = claims.get("exp") if claims is not None else None
    if isinstance(exp, bool) or not isinstance(exp, (int, float)):
        return None
    try:
        value = float(exp)
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


@dataclass(frozen=True)
class _Entry:
    expires: float  # on the `now` clock
    outcome: ReviewedToken | Unauthenticated


class TokenReviewer:
    """`await reviewer.review(token)` → ReviewedToken, or raises Unauthenticated.

    `now` is the cache's clock (monotonic); `wall_clock` is compared with the token's `exp`.
    """

    def __init__(self, client: KubeClient, *, audiences: list[str] | None = None, cache_size: int = 20_000,
                 success_ttl: float = SUCCESS_TTL_S, failure_ttl: float = FAILURE_TTL_S,
                 now: Callable[[], float] = time.monotonic, wall_clock: Callable[[], float] = time.time) -> None:
        if not 0 <= success_ttl <= MAX_SUCCESS_TTL_S:
            raise ValueError(f"success_ttl: {success_ttl!r} is invalid; allowed: 0 to {MAX_SUCCESS_TTL_S:g} seconds")
        if not 0 <= failure_ttl <= MAX_FAILURE_TTL_S:
            raise ValueError(f"failure_ttl: {failure_ttl!r} is invalid; allowed: 0 to {MAX_FAILURE_TTL_S:g} seconds")
        self.client = client
        self.audiences = audiences
        self.cache_size = cache_size
        self.success_ttl = success_ttl
        self.failure_ttl = failure_ttl
        self._now = now
        self._wall_clock = wall_clock
        self._cache: OrderedDict[bytes, _Entry] = OrderedDict()
        self.reviews = 0  # TokenReviews actually sent (for tests and metrics)

    @staticmethod
    def _key(token: str) -> bytes:
        return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()

    def _cached(self, key: bytes) -> ReviewedToken | Unauthenticated | None:
        entry = self._cache.get(key)
        if entry is None:
            return None
        if self._now() >= entry.expires:
            del self._cache[key]
            return None
        self._cache.move_to_end(key)
        return entry.outcome

    def _store(self, key: bytes, outcome: ReviewedToken | Unauthenticated, ttl: float) -> None:
        if ttl <= 0:
            self._cache.pop(key, None)
            return
        self._cache[key] = _Entry(self._now() + ttl, outcome)
        self._cache.move_to_end(key)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)

    def _success_life(self, token: str) -> float:
        """The success TTL, cut short by the token's exp (a token without exp gets the TTL)."""
        exp = token_expiry(token)
        if exp is None:
            return self.success_ttl
        return min(self.success_ttl, exp - self._wall_clock())

    def __len__(self) -> int:
        return len(self._cache)

    def forget_pod(self, uid: str) -> int:
        """Drop every cached success whose review named pod `uid`; returns how many were dropped."""
        if not uid:
            return 0
        stale = [key for key, entry in self._cache.items()
                 if isinstance(entry.outcome, ReviewedToken) and entry.outcome.pod_uid == uid]
        for key in stale:
            del self._cache[key]
        return len(stale)

    async def review(self, token: str) -> ReviewedToken:
        """The identity of a bare token (`authenticate` takes it out of the header)."""
        token = token.strip()
        if not token:
            raise Unauthenticated("no bearer token")
        key = self._key(token)
        cached = self._cached(key)
        if isinstance(cached, ReviewedToken):
            return cached
        if isinstance(cached, Unauthenticated):
            raise Unauthenticated(cached.reason)
        self.reviews += 1
        try:
            response = await self.client.create_token_review(token, self.audiences)
        except KubeError as exc:
            log.warning("TokenReview failed: %s", exc)
            raise ReviewUnavailable(f"token review failed, retry later: {exc.message}") from None
        try:
            reviewed = parse_review(Body(response))
        except Unauthenticated as exc:
            self._store(key, exc, self.failure_ttl)
            raise
        self._store(key, reviewed, self._success_life(token))
        return reviewed


def bearer_token(authorization: str) -> str | None:
    """The token in an Authorization header: `Bearer <token>` or, as the original accepts, the
    raw `<token>`; None for any other scheme (`Basic ...`) or an empty value."""
    value = authorization.strip()
    scheme, space, rest = value.partition(" ")
    if not space:  # a bare "Bearer" is a scheme without its token
        return value if value and value.lower() != "bearer" else None
    return (rest.strip() or None) if scheme.lower() == "bearer" else None


async def authenticate(reviewer: TokenReviewer | None, authorization: str | None, *,
                       pod_bound: bool = False) -> ReviewedToken:
    """The identity behind an Authorization header, or Unauthenticated (401) / ReviewUnavailable
    (503) with the words every token route answers.

    Checked in this order: a header at all, its form, a reviewer to ask (None: no API server),
    the review, and with `pod_bound` a token bound to a pod (a client pod's own token, not one
    of its ServiceAccount alone). Who may call a route (its owner, its node) is the route's rule."""
    if not authorization:
        raise Unauthenticated(f"no Authorization header; send {AUTH_FORMS}")
    token = bearer_token(authorization)
    if token is None:
        raise Unauthenticated(f"the Authorization header must be {AUTH_FORMS}")
    if reviewer is None:
        raise ReviewUnavailable("no API server to review the token with")
    reviewed = await reviewer.review(token)
    if pod_bound and not reviewed.pod_uid:
        raise Unauthenticated(f"the token of {reviewed.username or 'an unknown user'} is not bound to a pod; "
                              "use the calling pod's ServiceAccount token")
    return reviewed
