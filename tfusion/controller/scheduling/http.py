"""The scheduler's routes on the controller port (:8080).

- `POST /scheduler/filter`, `/scheduler/prioritize`, `/scheduler/bind`, `/scheduler/preempt`: the
  kube-scheduler extender (extender.py, extender_preempt.py), in the extender v1 wire format. Served only with
  `--scheduler=extender` (409 otherwise: the built-in scheduler binds, and two binders must not
  both run) and only by the leader (503 on a follower: only the leader holds the GPU state). Both
  refusals come from a guard, before a byte of the body is read: the routes are unauthenticated,
  and filter and prioritize take bodies of up to `EXTENDER_MAX_BODY_BYTES` (a 5,000-node cluster,
  extender_sizing.py), which they decode in a worker thread with the Node objects kept as raw JSON.
- `GET /api/why?namespace=&name=`: why a pod is not scheduled: kube's message, per-node reasons
  with numbers and the suggestions, as the leader last computed them (`tfusion why` reads it).
  404 when the pod does not exist; 503 on a follower, naming the leader.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import msgspec
from litestar import Request, Response, get, post
from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler
from litestar.params import Parameter

from tfusion.allocator.framework import Framework
from tfusion.controller.scheduling.explain import StatusBody, SuggestionBody
from tfusion.controller.scheduling.extender import (
    Extender,
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    HostPriority,
    decode_extender_call,
)
from tfusion.controller.scheduling.extender_preempt import (
    ExtenderPreemptionArgs,
    ExtenderPreemptionResult,
    decode_preemption_args,
    preempt,
)
from tfusion.controller.scheduling.extender_sizing import SIZED_FOR_NODES
from tfusion.controller.scheduling.nodes import is_pending
from tfusion.web import HttpError, decode_json_body, error_responses, json_answer, raw_body

if TYPE_CHECKING:
    from tfusion.controller.scheduling.scheduler import Scheduler

#: without nodeCacheCapable kube-scheduler sends every candidate Node object: sized for 5,000 nodes
#: (SIZED_FOR_NODES) of 5,914 bytes each (extender_sizing.sample_node, a GPU node with 31 labels and
#: 10 images) = 28.2 MiB, plus a Pod as large as kube stores (1.5 MiB) = 29.7 MiB, rounded up
EXTENDER_MAX_BODY_BYTES = 32 * 1024 * 1024
NOT_EXTENDER = ("this controller runs the built-in scheduler (--scheduler=builtin), which binds the pods "
                "itself; run it with --scheduler=extender to serve a kube-scheduler extender")


class WhyAnswer(msgspec.Struct, forbid_unknown_fields=True):
    """Where a pod stands and, when pending, why."""

    namespace: str
    name: str
    uid: str
    phase: str
    nodeName: str
    scheduled: bool
    schedulerName: str
    message: Annotated[str, msgspec.Meta(description="kube-style: 0/N nodes are available: …")]
    code: Annotated[str, msgspec.Meta(description="Unschedulable or UnschedulableAndUnresolvable")]
    nodes: Annotated[dict[str, StatusBody], msgspec.Meta(
        description="node -> {code, stage, summary, reasons[{message, stage, gpu, resource, requested, "
                    "available, detail}]}; key \"*\" for a reason that is not per node (quota, pool)")]
    suggestions: Annotated[list[SuggestionBody], msgspec.Meta(
        description="{kind, message, target, changes, pods?, node?}: each change would make it fit now")]
    attempts: int
    updated: str


def _not_leader(scheduler: Scheduler) -> HttpError:
    return scheduler.runtime.not_leader("schedules and holds the GPU state")


def _leader_framework(scheduler: Scheduler) -> Framework:
    fw = scheduler.framework() if scheduler.runtime.is_leader else None
    if fw is None:
        raise _not_leader(scheduler)
    return fw


def _extender_framework(scheduler: Scheduler) -> Framework:
    if scheduler.mode != "extender":
        raise HttpError(409, NOT_EXTENDER)
    return _leader_framework(scheduler)


def scheduler_handlers(scheduler: Scheduler) -> list[Any]:
    extender = Extender(scheduler)
    refusals = error_responses({409: "The built-in scheduler is active (--scheduler=builtin)",
                                503: "This replica is not the leader"})
    args_body = raw_body(ExtenderArgs, description=f"ExtenderArgs (extender v1), at most {EXTENDER_MAX_BODY_BYTES} "
                                                   f"bytes: Nodes for {SIZED_FOR_NODES} nodes, or NodeNames")

    def serving(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
        """Refuse before the body is read (the connection is then closed: its body is never read)."""
        try:
            _extender_framework(scheduler)
        except HttpError as exc:
            exc.headers.setdefault("Connection", "close")
            raise

    @post("/scheduler/filter", summary="kube-scheduler extender: filter nodes by GPU", status_code=200,
          request_max_body_size=EXTENDER_MAX_BODY_BYTES, responses=refusals, guards=[serving], **args_body)
    async def scheduler_filter(request: Request[Any, Any, Any]) -> Response[ExtenderFilterResult]:
        call = await decode_json_body(request, decode_extender_call)
        # with Nodes, the answer holds the passing Node objects: as large as the request
        return await json_answer(extender.filter(call, _extender_framework(scheduler)))

    @post("/scheduler/prioritize", summary="kube-scheduler extender: score nodes 0..10", status_code=200,
          request_max_body_size=EXTENDER_MAX_BODY_BYTES, responses=refusals, guards=[serving], **args_body)
    async def scheduler_prioritize(request: Request[Any, Any, Any]) -> list[HostPriority]:
        call = await decode_json_body(request, decode_extender_call)
        return extender.prioritize(call, _extender_framework(scheduler))

    @post("/scheduler/bind", summary="kube-scheduler extender: reserve GPUs and bind", status_code=200,
          responses=refusals, guards=[serving])
    async def scheduler_bind(data: ExtenderBindingArgs) -> ExtenderBindingResult:
        return await extender.bind(data, _extender_framework(scheduler))

    @post("/scheduler/preempt", summary="kube-scheduler extender: GPU-aware preemption victims", status_code=200,
          request_max_body_size=EXTENDER_MAX_BODY_BYTES, responses=refusals, guards=[serving],
          **raw_body(ExtenderPreemptionArgs, description="ExtenderPreemptionArgs (extender v1)"))
    async def scheduler_preempt(request: Request[Any, Any, Any]) -> ExtenderPreemptionResult:
        args = await decode_json_body(request, decode_preemption_args)
        return preempt(scheduler, args, _extender_framework(scheduler))

    @get("/api/why", summary="Why a pod is not scheduled (leader)", responses=error_responses({
        404: "No such pod", 503: "This replica is not the leader"}))
    async def api_why(name: Annotated[str, Parameter(min_length=1, max_length=253, description="the pod's name")],
                      namespace: Annotated[str, Parameter(max_length=63, description="the pod's namespace")]
                      = "default") -> WhyAnswer:
        if not scheduler.runtime.is_leader:
            raise _not_leader(scheduler)
        key = f"{namespace}/{name}"
        pod = scheduler.pod(key)
        if pod is None:
            raise HttpError(404, f"pod {key} not found")
        why = scheduler.reports.whys.get(key)
        if why is not None and why.uid != pod.uid:
            why = None
        return WhyAnswer(
            namespace=namespace, name=name, uid=pod.uid, phase=pod.phase, nodeName=pod.node_name,
            scheduled=not is_pending(pod) and bool(pod.node_name),
            schedulerName=pod.scheduler_name or "default-scheduler",
            message=why.message if why else "", code=why.code if why else "",
            nodes=why.nodes if why else {}, suggestions=why.suggestions if why else [],
            attempts=why.attempts if why else 0, updated=why.updated if why else "")

    return [scheduler_filter, scheduler_prioritize, scheduler_bind, scheduler_preempt, api_why]
