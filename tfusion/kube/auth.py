"""Bearer-token authentication through the API server's TokenReview.

Pods call the controller and the hypervisor with their service-account token; only the API
server can say whether such a token is genuine, unexpired and bound to a pod that still exists.
`TokenReviewer` asks it (authentication.k8s.io/v1 TokenReview) and remembers the answer: a
success for 30 minutes, a refusal for 5 seconds, in an LRU of 20,000 tokens (hashed; the cache
never holds a token in clear). A token it could not review, because the API server failed or
did not answer, is never accepted and never cached.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tfusion.kube.client import KubeClient, KubeError

log = logging.getLogger(__name__)

POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"


class Unauthenticated(Exception):
    """The token was refused; `reason` says why (the API server's words where it gave some)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class ReviewUnavailable(Unauthenticated):
    """The token could not be reviewed (API server error); not the caller's fault, never cached."""


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


def _first(extra: dict[str, Any], key: str) -> str:
    values = extra.get(key) or []
    if isinstance(values, str):
        return values
    return str(values[0]) if values else ""


def parse_review(review: dict[str, Any]) -> ReviewedToken:
    """A TokenReview response to the identity, or Unauthenticated with the server's reason."""
    status = review.get("status") or {}
    if not status.get("authenticated"):
        raise Unauthenticated(str(status.get("error") or "token not authenticated"))
    user = status.get("user") or {}
    username = str(user.get("username") or "")
    namespace = service_account = ""
    if username.startswith(SERVICE_ACCOUNT_PREFIX):
        parts = username[len(SERVICE_ACCOUNT_PREFIX):].split(":")
        if len(parts) == 2:
            namespace, service_account = parts
    extra = user.get("extra") or {}
    return ReviewedToken(username=username, namespace=namespace, service_account=service_account,
                         pod_name=_first(extra, POD_NAME_EXTRA), pod_uid=_first(extra, POD_UID_EXTRA),
                         uid=str(user.get("uid") or ""), groups=tuple(user.get("groups") or ()))


class TokenReviewer:
    """`await reviewer.review(token)` → ReviewedToken, or raises Unauthenticated."""

    def __init__(self, client: KubeClient, *, audiences: list[str] | None = None, cache_size: int = 20_000,
                 success_ttl: float = 1800.0, failure_ttl: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.audiences = audiences
        self.cache_size = cache_size
        self.success_ttl = success_ttl
        self.failure_ttl = failure_ttl
        self._clock = clock
        self._cache: OrderedDict[bytes, tuple[float, ReviewedToken | Unauthenticated]] = OrderedDict()
        self.reviews = 0  # TokenReviews actually sent (for tests and metrics)

    @staticmethod
    def _key(token: str) -> bytes:
        return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()

    def _cached(self, key: bytes) -> ReviewedToken | Unauthenticated | None:
        entry = self._cache.get(key)
        if entry is None:
            return None
        expires, outcome = entry
        if self._clock() >= expires:
            del self._cache[key]
            return None
        self._cache.move_to_end(key)
        return outcome

    def _store(self, key: bytes, outcome: ReviewedToken | Unauthenticated, ttl: float) -> None:
        self._cache[key] = (self._clock() + ttl, outcome)
        self._cache.move_to_end(key)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)

    def __len__(self) -> int:
        return len(self._cache)

    async def review(self, token: str) -> ReviewedToken:
        token = token.strip()
        if token.lower().startswith("bearer "):
            token = token[7:].strip()
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
            raise ReviewUnavailable(f"token review failed: {exc.message}") from None
        try:
            reviewed = parse_review(response)
        except Unauthenticated as exc:
            self._store(key, exc, self.failure_ttl)
            raise
        self._store(key, reviewed, self.success_ttl)
        return reviewed
