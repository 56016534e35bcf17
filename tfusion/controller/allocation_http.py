"""Litestar handlers for the allocator's diagnostic routes on the controller (:8080).

- `GET /api/allocation`: `{gpuStore, nodeWorkerStore, allocation, gpuToWorkerMap}` built by
  `allocation_view.build` from the leader's allocator (GPU keys are plain names, not the original's
  "/<name>"). A follower answers with empty stores, as the original does. On the leader the answer
  waits until the allocations have been recovered from the worker pods.
- `POST /api/simulate-schedule`: the body is a Pod manifest in JSON or YAML (any Content-Type;
  JSON is tried first, then YAML). 400 `{"error": ...}` when the body is unreadable or not a Pod;
  500 `{"error": "scheduler framework not found"}` when `spec.schedulerName` is not
  `tensor-fusion-scheduler` (as the original); otherwise `simulate_schedule`'s answer. Nothing is
  reserved or changed. A follower answers 503: only the leader holds the GPU state.
Both answer 503 when this replica leads but its recovery has not finished in time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from litestar import Request, Response, get, post

from tfusion.controller import allocation_view
from tfusion.controller.scheduling.simulate import (
    FRAMEWORK_NOT_FOUND,
    SCHEDULER_NAME,
    ManifestError,
    read_pod_manifest,
    simulate_schedule,
)

if TYPE_CHECKING:
    from tfusion.allocator import GpuAllocator
    from tfusion.controller.allocation import AllocatorService

EMPTY_VIEW: dict[str, Any] = {"gpuStore": {}, "nodeWorkerStore": {}, "allocation": {}, "gpuToWorkerMap": {}}
NOT_LEADER = ("this controller replica is not the leader and holds no GPU state; ask the leader "
              "(its address is in the ConfigMap tensor-fusion-operator-leader-info)")
RECOVERING = "the allocator is still recovering the allocations from the worker pods; retry shortly"


def _error(status: int, message: str) -> Response[dict[str, Any]]:
    return Response({"error": message}, status_code=status)


async def _leader_allocator(service: AllocatorService) -> tuple[GpuAllocator | None, Response[dict[str, Any]] | None]:
    try:
        return await service.wait_ready(), None
    except TimeoutError:
        return None, _error(503, RECOVERING)


def allocation_handlers(service: AllocatorService) -> list[Any]:
    @get("/api/allocation", summary="The GPU allocator's state (leader)")
    async def api_allocation() -> Response[dict[str, Any]]:
        allocator, failure = await _leader_allocator(service)
        if failure is not None:
            return failure
        if allocator is None:
            return Response(EMPTY_VIEW, status_code=200)
        return Response(allocation_view.build(allocator), status_code=200)

    @post("/api/simulate-schedule", summary="Filter and score a Pod without reserving anything")
    async def api_simulate_schedule(request: Request[Any, Any, Any]) -> Response[dict[str, Any]]:
        try:
            pod = read_pod_manifest(await request.body())
        except ManifestError as exc:
            return _error(400, str(exc))
        if pod["spec"].get("schedulerName") != SCHEDULER_NAME:
            return _error(500, FRAMEWORK_NOT_FOUND)
        allocator, failure = await _leader_allocator(service)
        if failure is not None:
            return failure
        if allocator is None:
            return _error(503, NOT_LEADER)
        status, body = simulate_schedule(allocator, pod)
        return Response(body, status_code=status)

    return [api_allocation, api_simulate_schedule]
