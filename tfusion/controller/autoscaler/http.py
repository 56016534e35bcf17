"""`GET /api/recommendation?namespace=&name=`: what the autoscaler knows and decided for one workload.

Why a route: a recommendation is a conclusion from history the API server never sees (the
histograms, the percentiles, the rule in force); the status shows the result, this shows the why.
`tfusion why workload/NAME` renders it. The leader answers (only it holds the histograms); a
follower answers 503 naming the leader; an unknown workload 404; a workload without autoscaling
200 with `enabled: false`. Quantities are Kubernetes quantity text, times RFC 3339.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import msgspec
from litestar import get
from litestar.params import Parameter

from tfusion.web import HttpError, error_responses

if TYPE_CHECKING:
    from tfusion.controller.autoscaler.service import Autoscaler


class Bounds(msgspec.Struct, forbid_unknown_fields=True):
    """Values at the policy's target, lower-bound and upper-bound percentiles."""

    target: str
    lower: str
    upper: str


class UsageView(msgspec.Struct, forbid_unknown_fields=True):
    """Per GPU: the usage percentiles (`observed`, no margin) and the estimates (margin added)."""

    tflops: Bounds
    vram: Bounds


class DecisionView(msgspec.Struct, forbid_unknown_fields=True):
    reason: Annotated[str, msgspec.Meta(description="CamelCase code of the decision")]
    message: Annotated[str, msgspec.Meta(description="what was decided and why, in one sentence")]
    changed: bool
    at: Annotated[str, msgspec.Meta(description="when it was decided")]
    share: Annotated[dict[str, dict[str, str]], msgspec.Meta(description="requests and limits decided, per GPU")]


class RecommendationAnswer(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """One workload's autoscaling state on the leader."""

    namespace: str
    name: str
    enabled: bool
    source: Annotated[str, msgspec.Meta(description="the usage source: hypervisor, prometheus, influxdb, "
                                                    "greptimedb")]
    samples: Annotated[int, msgspec.Meta(description="usage samples in the histograms (per worker and GPU)")] = 0
    firstSample: str = ""
    lastSample: str = ""
    rule: Annotated[str, msgspec.Meta(description="what decides now: percentile, external, request, or the "
                                                  "active cron rule's name")] = ""
    policy: Annotated[dict[str, Any], msgspec.Meta(description="the effective autoSetResources settings, "
                                                               "defaults filled in")] = {}
    observed: UsageView | None = None
    estimate: UsageView | None = None
    original: dict[str, dict[str, str]] = {}
    recommendation: dict[str, dict[str, str]] = {}
    decision: DecisionView | None = None
    workers: Annotated[dict[str, str], msgspec.Meta(description="worker pod -> the outcome of its last "
                                                                "resize")] = {}
    error: Annotated[str, msgspec.Meta(description="the last usage-source, scaler or config error")] = ""


def recommendation_route(autoscaler: Autoscaler) -> Any:
    @get("/api/recommendation", summary="A workload's autoscaling state and last decision (leader)",
         responses=error_responses({404: "No such workload", 503: "This replica is not the leader"}))
    async def api_recommendation(
            name: Annotated[str, Parameter(min_length=1, max_length=253, description="the workload's name")],
            namespace: Annotated[str, Parameter(max_length=63, description="the workload's namespace")] = "default",
    ) -> RecommendationAnswer:
        if not autoscaler.runtime.is_leader:
            raise autoscaler.runtime.not_leader("holds the autoscaler's usage histograms")
        answer = autoscaler.explain(namespace, name)
        if answer is None:
            raise HttpError(404, f"TensorFusionWorkload {namespace}/{name} not found")
        return answer

    return api_recommendation
