"""The console's questions to the leader's HTTP API: explanations (`GET /api/why`) and current usage
(`GET /api/usage`).

Why a small client with its own short caches: every open page polls about once a second, and a
Pending page may show dozens of pods; the leader must see at most one usage request and one
explanation request per pod per interval, however many tabs are open. Answers the leader cannot
give become an error sentence the page shows, never an exception.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import httpx
import orjson

from tfusion.console.views import Usage, usage_from_answer

#: how long an answer is reused
FRESH_S = 1.0
#: explanations asked at once, and at most per page
WHY_CONCURRENCY = 8
WHY_MAX = 50
TIMEOUT_S = 3.0


class ControllerLink:
    """Reads from the controller at `url` (see the module docstring)."""

    def __init__(self, url: str, *, how: str = "given", timeout_s: float = TIMEOUT_S) -> None:
        self.url = url.rstrip("/")
        self.how = how
        self._http = httpx.AsyncClient(base_url=self.url, timeout=timeout_s)
        self._usage: tuple[float, Usage] | None = None
        self._whys: dict[str, tuple[float, Mapping[str, Any] | None, str]] = {}
        self._usage_lock = anyio.Lock()
        #: grows when the usage answer changes (a page that shows it is current while this holds)
        self.usage_version = 0

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _get(self, path: str, params: Mapping[str, str] | None = None) -> tuple[Any, str]:
        try:
            response = await self._http.get(path, params=params)
        except httpx.HTTPError as exc:
            return None, f"the controller at {self.url} did not answer ({type(exc).__name__}: {exc})"
        try:
            body = orjson.loads(response.content)
        except orjson.JSONDecodeError:
            return None, f"the controller at {self.url} answered {response.status_code} with non-JSON"
        if response.status_code != 200:
            error = body.get("error", body) if isinstance(body, dict) else body
            return None, f"the controller at {self.url} answered {response.status_code}: {error}"
        return body, ""

    async def usage(self) -> Usage:
        """Every worker's current use of each GPU (reused for FRESH_S)."""
        async with self._usage_lock:
            now = time.monotonic()
            if self._usage is not None and now - self._usage[0] < FRESH_S:
                return self._usage[1]
            body, error = await self._get("/api/usage")
            usage = usage_from_answer(body if isinstance(body, dict) else None, error)
            if self._usage is None or usage != self._usage[1]:
                self.usage_version += 1
            else:
                usage = self._usage[1]
            self._usage = (time.monotonic(), usage)
            return usage

    async def explanations(self, keys: Sequence[str]) -> tuple[dict[str, Mapping[str, Any]], str]:
        """The leader's `/api/why` answers for up to WHY_MAX pods ("ns/name"), and the first error."""
        now = time.monotonic()
        wanted = [k for k in keys[:WHY_MAX] if not (k in self._whys and now - self._whys[k][0] < FRESH_S)]
        limiter = anyio.CapacityLimiter(WHY_CONCURRENCY)

        async def ask(key: str) -> None:
            namespace, _, name = key.partition("/")
            async with limiter:
                body, error = await self._get("/api/why", {"namespace": namespace, "name": name})
            self._whys[key] = (time.monotonic(), body if isinstance(body, dict) else None, error)

        async with anyio.create_task_group() as tg:
            for key in wanted:
                tg.start_soon(ask, key)
        for stale in [k for k in self._whys if k not in keys]:
            del self._whys[stale]
        answers = {k: self._whys[k][1] for k in keys[:WHY_MAX] if self._whys.get(k, (0, None, ""))[1]}
        errors = [self._whys[k][2] for k in keys[:WHY_MAX] if k in self._whys and self._whys[k][2]]
        return {k: v for k, v in answers.items() if v is not None}, (errors[0] if errors else "")
