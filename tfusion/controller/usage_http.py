"""`GET /api/usage` on the controller: what every worker uses of every GPU now, from every hypervisor.

Why on the controller: only it knows where each node's hypervisor answers (Running GPUNodes and
their Nodes' InternalIP, hypervisors.py), and the hypervisors are reachable from the cluster, not
from a user's laptop. The console (and anyone with the controller's URL) asks here instead of
asking each node. The hypervisors are asked with the autoscaler's own machinery
(`autoscaler/sources.HypervisorUsage`: bounded concurrency and timeout, one node's failure does not
fail the others); the answer is kept for `CACHE_S`, and requests that arrive while a round is
running wait for that round, so a console polling every second costs at most one round per second
however many pages are open. Served by the leader only (503 on a follower, as `/api/why`), so one
replica answers for the cluster.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import anyio
import msgspec
from litestar import get

from tfusion.controller.autoscaler.sources import HypervisorUsage
from tfusion.controller.hypervisors import hypervisor_urls
from tfusion.metrics.usage import MAX_ROWS, WorkerGpuUsage, WorkerUsageList
from tfusion.web import error_responses

if TYPE_CHECKING:
    from tfusion.controller.runtime import ControllerRuntime

#: how long one round's answer is served again
CACHE_S = 1.0


class NodeWorkerGpuUsage(WorkerGpuUsage, frozen=True):
    """One worker's use of one GPU, with the node whose hypervisor reported it."""

    node: Annotated[str, msgspec.Meta(description="The node (GPUNode name) whose hypervisor reported the row")]


class UsageAnswer(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """`GET /api/usage`: every worker's current use of every GPU, by node."""

    data: Annotated[list[NodeWorkerGpuUsage], msgspec.Meta(
        description="One row per (worker pod, GPU), ordered by node, namespace, pod and GPU",
        max_length=MAX_ROWS)]
    at: Annotated[float, msgspec.Meta(description="Unix seconds when the hypervisors were asked")]
    unreachable: Annotated[dict[str, str], msgspec.Meta(
        description="Node -> why its hypervisor gave no answer this round (its workers are missing from data)")]


def usage_answer(answers: dict[str, WorkerUsageList], problems: dict[str, str], at: float) -> UsageAnswer:
    """The body for what the hypervisors answered (`HypervisorUsage.gather`)."""
    rows = [NodeWorkerGpuUsage(**msgspec.structs.asdict(row), node=node)
            for node in sorted(answers) for row in answers[node].data]
    rows.sort(key=lambda row: (row.node, row.namespace, row.pod, row.gpu))
    return UsageAnswer(data=rows, at=at, unreachable=dict(sorted(problems.items())))


class UsageRoute:
    """The cached answer and the route; see the module docstring."""

    def __init__(self, runtime: ControllerRuntime, source: HypervisorUsage, *,
                 cache_s: float = CACHE_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.runtime = runtime
        self.source = source
        self.cache_s = cache_s
        self.clock = clock
        self._lock = anyio.Lock()
        self._answer: UsageAnswer | None = None
        self._asked_at = 0.0
        #: rounds asked of the hypervisors (tests read it to see the cache work)
        self.rounds = 0

    async def current(self) -> UsageAnswer:
        async with self._lock:  # one round at a time: the others wait for it and share its answer
            if self._answer is None or self.clock() - self._asked_at >= self.cache_s:
                started = self.clock()
                answers, problems = await self.source.gather()
                self.rounds += 1
                self._answer, self._asked_at = usage_answer(answers, problems, time.time()), started
            return self._answer

    def handler(self) -> Any:
        @get("/api/usage", summary="Every worker's current GPU usage, from every hypervisor (leader)",
             description=f"Asks each Running GPUNode's hypervisor (`GET /api/v1/usage`) at most once per "
                         f"{CACHE_S:g} s; a hypervisor that does not answer is listed in `unreachable`.",
             responses=error_responses({503: "This replica is not the leader"}))
        async def api_usage() -> UsageAnswer:
            if not self.runtime.is_leader:
                raise self.runtime.not_leader("asks the hypervisors for usage")
            return await self.current()

        return api_usage

    def attach(self) -> UsageRoute:
        self.runtime.routes.append(self.handler())
        return self


def attach_usage_route(runtime: ControllerRuntime) -> UsageRoute:
    """Serve GET /api/usage on this replica (answering only while it leads)."""
    return UsageRoute(runtime, HypervisorUsage(lambda: hypervisor_urls(runtime))).attach()
