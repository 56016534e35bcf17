"""Asking an external scaler (a workload's `spec.autoScalingConfig.externalScaler`) for its share.

Why it exists: some teams decide GPU sizes with their own service (traffic forecasts, schedules,
cost rules). The autoscaler asks it over HTTP, in the original's protocol so existing scalers work
unchanged, and treats every way the call can go wrong alike: an `ExternalScalerError` with a message
a person can act on, which the autoscaler records as a condition while changing nothing.

The protocol (per GPU; quantities are Kubernetes quantity strings):

    POST <url>
    Content-Type: application/json
    Authorization: Bearer <API key>          (only when a Secret is named)

    {"workloadName": "llm", "namespace": "team-a",
     "currentResources": {"requests": {"tflops": "40", "vram": "8Gi"},
                          "limits":   {"tflops": "80", "vram": "16Gi"}}}

A share held as a compute percent is sent as `"tflops": "0", "compute": "50"`. The answer, status 200:

    {"needScaleUp": false, "needScaleDown": true, "reason": "quiet hours",
     "recommendedResources": {"requests": {"tflops": "10", "vram": "2Gi"},
                              "limits":   {"tflops": "20", "vram": "4Gi"}}}

Neither `needScaleUp` nor `needScaleDown` true, or `recommendedResources` all zero: "no change"
(`None`). `limits` may be left out: it is then the same as `requests`. Bounds: the whole call
(connect, send, answer) within `timeout_s`; an answer body over 64 KiB is refused.

The API key: the Secret `secret_namespace/secret_name` (read through the KubeClient), its data key
`apiKey`, else `token`, else `key` (the original's order), else the Secret's only key; an empty
`secret_name` sends no Authorization header.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx
import orjson

from tfusion.allocator.request import Resources
from tfusion.api.accessors import Workload
from tfusion.controller.autoscaler.policy import PolicyError, resources_of
from tfusion.controller.autoscaler.recommender import Share
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient, KubeError, NotFound

MAX_ANSWER_BYTES = 64 * 1024
#: data keys of the API-key Secret, tried in this order (then the Secret's only key)
API_KEY_FIELDS = ("apiKey", "token", "key")
PERCENT_MAX_MILLI = 100_000


class ExternalScalerError(Exception):
    """The external scaler could not be asked or its answer not used; the message says why."""


def request_body(workload: Workload, request: Resources, limit: Resources) -> dict[str, Any]:
    """What is POSTed (see the module docstring)."""
    return {"workloadName": workload.name, "namespace": workload.namespace,
            "currentResources": Share(request, limit).to_status()}


def parse_side(side: object, where: str) -> Resources:
    """`{"tflops", "vram", "compute"?}` of the answer in allocator units, by the rule that reads every
    Resources block of the autoscaler (policy.resources_of)."""
    try:
        return resources_of(side, where)
    except PolicyError as exc:
        raise ExternalScalerError(str(exc)) from None


def parse_answer(data: object) -> tuple[Resources, Resources] | None:
    """The scaler's answer as (request, limit), or None for "no change"."""
    if not isinstance(data, Mapping):
        raise ExternalScalerError(f"the answer is {type(data).__name__}, not a JSON object")
    for flag in ("needScaleUp", "needScaleDown"):
        if not isinstance(data.get(flag, False), bool):
            raise ExternalScalerError(f"{flag}: {data.get(flag)!r} is not a boolean (allowed: true or false)")
    if not data.get("needScaleUp") and not data.get("needScaleDown"):
        return None
    recommended = data.get("recommendedResources")
    if recommended is None:
        return None
    if not isinstance(recommended, Mapping):
        raise ExternalScalerError(f"recommendedResources: {recommended!r} is not an object "
                                  "(allowed: {\"requests\": {...}, \"limits\": {...}})")
    if "requests" not in recommended:
        raise ExternalScalerError("recommendedResources.requests: missing (allowed: "
                                  '{"tflops": "...", "vram": "..."})')
    request = parse_side(recommended["requests"], "recommendedResources.requests")
    limits = recommended.get("limits")
    limit = request if limits is None else parse_side(limits, "recommendedResources.limits")
    if request == limit == Resources():
        return None
    return request, limit


def api_key(secret: Mapping[str, Any], ref: str) -> str:
    """The API key a Secret holds (see the module docstring)."""
    data = secret.get("data") or {}
    if not isinstance(data, Mapping) or not data:
        raise ExternalScalerError(f"Secret {ref} holds no data (allowed keys: {', '.join(API_KEY_FIELDS)}, "
                                  "or a single key)")
    field = next((f for f in API_KEY_FIELDS if f in data), None)
    if field is None:
        if len(data) != 1:
            raise ExternalScalerError(f"Secret {ref} has keys {', '.join(sorted(map(str, data)))} and none of "
                                      f"{', '.join(API_KEY_FIELDS)} (allowed: one of those, or a single key)")
        field = str(next(iter(data)))
    try:
        key = base64.b64decode(str(data[field]), validate=True).decode("utf-8").strip()
    except (binascii.Error, UnicodeDecodeError):
        raise ExternalScalerError(f"Secret {ref} key {field}: not base64 of UTF-8 text") from None
    if not key:
        raise ExternalScalerError(f"Secret {ref} key {field}: empty")
    return key


def check_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ExternalScalerError(f"externalScaler.url: {url!r} is not an http(s) URL (allowed: "
                                  "http://host[:port]/path or https://...)")
    return url


class ExternalScaler:
    """Asks external scalers; one instance serves every workload (see the module docstring)."""

    def __init__(self, client: KubeClient, *, timeout_s: float = 5.0) -> None:
        self.client = client
        self.timeout_s = timeout_s

    async def recommend(self, workload: Workload, *, url: str, secret_namespace: str, secret_name: str,
                        request: Resources, limit: Resources) -> tuple[Resources, Resources] | None:
        """The scaler's (request, limit) per GPU, or None when it says "no change"; raises
        ExternalScalerError on any failure."""
        check_url(url)
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if secret_name:
            headers["Authorization"] = f"Bearer {await self._api_key(secret_namespace, secret_name)}"
        body = orjson.dumps(request_body(workload, request, limit))
        with anyio.move_on_after(self.timeout_s) as scope:
            status, answer = await self._post(url, headers, body)
        if scope.cancelled_caught:
            raise ExternalScalerError(f"external scaler {url}: no answer within {self.timeout_s:g} s")
        if status != 200:
            raise ExternalScalerError(f"external scaler {url} answered HTTP {status}: "
                                      f"{answer[:200].decode('utf-8', 'replace')}")
        try:
            data = orjson.loads(answer)
        except orjson.JSONDecodeError as exc:
            raise ExternalScalerError(f"external scaler {url}: the answer is not JSON ({exc})") from None
        try:
            return parse_answer(data)
        except ExternalScalerError as exc:
            raise ExternalScalerError(f"external scaler {url}: {exc}") from None

    async def _api_key(self, namespace: str, name: str) -> str:
        ref = f"{namespace}/{name}"
        try:
            secret = await self.client.get(r.SECRETS, name, namespace=namespace)
        except NotFound:
            raise ExternalScalerError(f"externalScaler.apiKeySecretRef: Secret {ref} not found") from None
        except KubeError as exc:
            raise ExternalScalerError(f"externalScaler.apiKeySecretRef: cannot read Secret {ref}: {exc}") from None
        return api_key(secret, ref)

    async def _post(self, url: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        try:
            async with httpx.AsyncClient(timeout=self.timeout_s, follow_redirects=False) as http, \
                    http.stream("POST", url, headers=headers, content=body) as response:
                chunks: list[bytes] = []
                size = 0
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    if size > MAX_ANSWER_BYTES:
                        raise ExternalScalerError(f"external scaler {url}: the answer is over "
                                                  f"{MAX_ANSWER_BYTES} bytes")
                    chunks.append(chunk)
                return response.status_code, b"".join(chunks)
        except httpx.HTTPError as exc:
            raise ExternalScalerError(f"external scaler {url}: {type(exc).__name__}: {exc}") from None
