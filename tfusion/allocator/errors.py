"""Errors the allocator raises. Every "no" carries structured reasons.

`Unschedulable` says which filter stage emptied the candidate set and, per node, why nothing on it
fits; `QuotaExceeded` says which quota limit, the request, what is already used and by how much it
falls short; `InvalidAllocation` is a caller's mistake (unknown GPU, pod already allocated, ...).
The scheduler extender's failedNodes, scheduler events and `/api/simulate-schedule` are all built
from these fields, so they never re-derive reasons from message text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


class AllocatorError(Exception):
    """Base of every error the allocator raises on purpose."""


class InvalidAllocation(AllocatorError, ValueError):
    """The caller asked for something impossible: unknown GPU or pod, wrong count, duplicate pod."""


class PlacementModeError(AllocatorError, ValueError):
    """A pool's placement mode is not one of the known scoring strategies."""


@dataclass(frozen=True, slots=True)
class Removal:
    """One GPU removed by one filter stage, with the human-readable reason."""

    gpu: str
    node: str
    reason: str


@dataclass(slots=True)
class FilterStage:
    """One stage of the filter chain: how many GPUs went in, how many came out, and who was dropped.

    `before_gpus`/`after_gpus` are the GPU names in and out (filled when an explanation was asked).
    """

    name: str
    before: int
    after: int
    removed: list[Removal] = field(default_factory=list)
    before_gpus: list[str] = field(default_factory=list)
    after_gpus: list[str] = field(default_factory=list)


class Unschedulable(AllocatorError):
    """No node can take the request.

    `stage` is the filter stage that removed the last candidates ("" when the failure is not a
    filter, e.g. an empty pool), `nodes` maps each node of the pool to the reasons it was rejected,
    `stages` is the whole filter trail and `unresolvable` says that retrying cannot help (a single
    quota limit is smaller than the request).
    """

    def __init__(
        self,
        message: str,
        *,
        stage: str = "",
        nodes: Mapping[str, Sequence[str]] | None = None,
        stages: Sequence[FilterStage] = (),
        unresolvable: bool = False,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.stage = stage
        self.nodes: dict[str, list[str]] = {k: list(v) for k, v in (nodes or {}).items()}
        self.stages = list(stages)
        self.unresolvable = unresolvable


class QuotaExceeded(Unschedulable):
    """A GPUResourceQuota limit would be exceeded.

    `resource` is the limit's name (e.g. `total.max.vram.request`); `requested`, `used` and `limit`
    are in allocator units (milli-TFLOPS, bytes, GPUs or workers) and `shortfall` is by how much the
    limit is too small. Per-workload (`single.*`) limits are unresolvable.
    """

    def __init__(
        self,
        message: str,
        *,
        namespace: str,
        resource: str,
        requested: int,
        used: int,
        limit: int,
        unresolvable: bool,
    ) -> None:
        super().__init__(message, stage="QuotaCheck", unresolvable=unresolvable)
        self.namespace = namespace
        self.resource = resource
        self.requested = requested
        self.used = used
        self.limit = limit
        self.shortfall = used + requested - limit
