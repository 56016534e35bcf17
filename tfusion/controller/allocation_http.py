"""Litestar handlers for the allocator's diagnostic routes on the controller (:8080).

- `GET /api/allocation`: `{gpuStore, nodeWorkerStore, allocation, gpuToWorkerMap}` built by
  `views.build` from the leader's allocator (GPU keys are plain names, not the original's
  "/<name>"). A follower answers with empty stores, as the original does. On the leader the answer
  waits until the allocations have been recovered from the worker pods.
- `POST /api/simulate-schedule`: the body is a Pod manifest in JSON or YAML (any Content-Type;
  JSON is tried first, then YAML). 400 `{"error": ...}` when the body is unreadable or not a Pod,
  or a field the scheduler reads is wrong (`podcheck`; its model is also the documented body), or
  `spec.schedulerName` is not `tensor-fusion-scheduler` (`simulate.foreign_scheduler`; the original
  answers 500 `scheduler framework not found` there, a caller's mistake answered as a server
  fault), or the pod webhook would refuse the Pod (the resolver's Denial, in the webhook's words:
  e.g. it asks for no GPU resources); otherwise `simulate_schedule`'s answer. Nothing is
  reserved or changed. A follower answers 503: only the leader holds the GPU state.
Both answer 503 when this replica leads but its recovery has not finished in time.

The bodies are msgspec Structs so that the OpenAPI document describes them; their inner objects
stay free-form maps because `views` and `simulate` own that JSON. Their field names are
the wire keys, hence camelCase; `forbid_unknown_fields` makes a key they add fail loudly in tests
instead of vanishing from the answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, cast

import msgspec
from litestar import Request, get, post
from litestar.openapi.spec import Operation, Reference

from tfusion.api.accessors import Pod
from tfusion.controller import views
from tfusion.controller.scheduling.podcheck import PodManifest, manifest_schema
from tfusion.controller.scheduling.simulate import (
    POD_MANIFEST_MAX_BYTES,
    SCHEDULER_NAME,
    ManifestError,
    cached_sources,
    foreign_scheduler,
    read_pod_manifest,
    simulate_schedule,
)
from tfusion.kube import resources as r
from tfusion.web import ErrorBody, HttpError, decode_body, error_responses, raw_body

if TYPE_CHECKING:
    from tfusion.allocator import GpuAllocator
    from tfusion.controller.allocation import AllocatorService

NOT_LEADER = ("this controller replica is not the leader and holds no GPU state; ask the leader "
              "(its address is in the ConfigMap tensor-fusion-operator-leader-info)")
RECOVERING = "the allocator is still recovering the allocations from the worker pods; retry shortly"
POD_MEDIA_TYPES = ("application/json", "application/yaml", "application/x-yaml", "text/yaml")


def _described(text: str) -> msgspec.Meta:
    return msgspec.Meta(description=text)


class AllocationView(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """The allocator's state as the original's `/api/allocation` shows it (committed allocations)."""

    gpuStore: Annotated[dict[str, dict[str, Any]], _described(
        "GPU name -> the GPU object (apiVersion, kind, metadata, status) as the allocator sees it")]
    nodeWorkerStore: Annotated[dict[str, dict[str, bool]], _described(
        "node name -> {\"<namespace>/<pod>\": true} for each worker pod placed there")]
    allocation: Annotated[dict[str, dict[str, Any]], _described(
        "pod UID -> its allocation request with the original's Go field names (PoolName, Request, "
        "Limit, GPUNames, PodMeta, QoS, Isolation, ...)")]
    gpuToWorkerMap: Annotated[dict[str, list[dict[str, Any]]], _described(
        "GPU name -> [{request, limit, podName, podUID, namespace}] of the workers on it")]
    drift: Annotated[dict[str, Any] | None, _described(
        "The last drift audit (checkedAt, found, byKind, findings, recent, total); absent before the first")] = None


EMPTY_VIEW = AllocationView(gpuStore={}, nodeWorkerStore={}, allocation={}, gpuToWorkerMap={})


class SimulateScheduleResult(msgspec.Struct, forbid_unknown_fields=True):
    """What the GPU filters and scores decided for the Pod; nothing was reserved."""

    scheduleResult: Annotated[dict[str, Any], _described(
        "SuggestedHost, EvaluatedNodes and FeasibleNodes")]
    filterDetail: Annotated[dict[str, Any], _described(
        "FilterStageDetails: each filter stage and the GPUs it kept or dropped, with reasons")]
    error: Annotated[dict[str, Any] | None, _described(
        "Why the Pod does not fit (null when it fits)")]
    cycleState: Annotated[Any, _described("Always null (kept for the original's shape)")]
    gpuSchedulerState: Annotated[dict[str, Any], _described(
        "NodeGPUs, NodeScores, FinalGPUs and the pool's ScoringStrategy")]
    progressiveNodeNames: Annotated[dict[str, Any] | None, _described(
        "For a native-GPU pod (progressive migration): {count, nodes}, the nodes that run no "
        "TensorFusion worker; null for every other pod")]
    suggestions: Annotated[list[dict[str, Any]], _described(
        "When the Pod does not fit: the smallest changes that would make it fit now, each "
        "{kind, message, target, changes, pods?, node?}; kind is smaller-request, other-model, other-pool, "
        "quota or preempt-lower-qos; target says what `changes` applies to (annotations: pod annotation "
        "-> value; quota: GPUResourceQuota field -> value; pods: delete `pods`). [] when it fits")] = \
        msgspec.field(default_factory=list)


def _pod_manifest_body() -> dict[str, Any]:
    """`raw_body` keywords whose documented schema is `podcheck.manifest_schema` (see there why)."""
    documented = raw_body(PodManifest, POD_MEDIA_TYPES,
                          description="A Pod manifest in JSON or YAML (any Content-Type; JSON is tried first)")
    base = cast("type[Operation]", documented["operation_class"])
    schema = manifest_schema(SCHEDULER_NAME)

    @dataclass
    class PodManifestOperation(base):  # type: ignore[valid-type,misc]
        def __post_init__(self) -> None:
            super().__post_init__()
            if self.request_body is not None and not isinstance(self.request_body, Reference):
                for media in (self.request_body.content or {}).values():
                    media.schema = schema  # a plain dict serializes as it is

    return {**documented, "operation_class": PodManifestOperation}


async def _leader_allocator(service: AllocatorService) -> GpuAllocator | None:
    try:
        return await service.wait_ready()
    except TimeoutError:
        raise HttpError(503, RECOVERING) from None


def allocation_handlers(service: AllocatorService) -> list[Any]:
    @get("/api/allocation", summary="The GPU allocator's state (leader)",
         responses=error_responses({503: "This replica leads but has not recovered the allocations yet"}))
    async def api_allocation() -> AllocationView:
        allocator = await _leader_allocator(service)
        if allocator is None:
            return EMPTY_VIEW
        gpus, pods = service.runtime.informer(r.GPUS), service.runtime.informer(r.PODS)
        view = views.build(allocator, gpu_object=gpus.get,
                                     pod_object=lambda namespace, name: pods.get(f"{namespace}/{name}"))
        return msgspec.convert({**view, "drift": service.last_drift}, AllocationView)

    @post("/api/simulate-schedule", summary="Filter and score a Pod without reserving anything", status_code=200,
          request_max_body_size=POD_MANIFEST_MAX_BYTES, responses=error_responses({
              400: ("The body is not a readable Pod manifest, its GPU annotations are invalid, "
                    f"`spec.schedulerName` is not {SCHEDULER_NAME}, or the pod webhook would refuse the Pod "
                    "(it asks for no GPU resources, or names a GPUPool or WorkloadProfile that does not "
                    "exist): the message is the webhook's"),
              503: "This replica is not the leader, or has not recovered the allocations yet"}),
          **_pod_manifest_body())
    async def api_simulate_schedule(request: Request[Any, Any, Any]) -> SimulateScheduleResult:
        try:
            pod = await decode_body(request, read_pod_manifest)
        except ManifestError as exc:
            raise HttpError(400, str(exc)) from None
        if foreign := foreign_scheduler(Pod(pod).spec):
            raise HttpError(400, ErrorBody(error=foreign, field="spec.schedulerName"))
        allocator = await _leader_allocator(service)
        if allocator is None:
            raise HttpError(503, NOT_LEADER)
        sources = cached_sources(service.runtime.informer, Pod(pod).namespace or "default")
        status, body = simulate_schedule(allocator, pod, sources=sources, scheduler=service.scheduler)
        if status != 200:
            raise HttpError(status, msgspec.convert(body, ErrorBody))
        return msgspec.convert(body, SimulateScheduleResult)

    return [api_allocation, api_simulate_schedule]
