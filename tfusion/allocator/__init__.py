"""The GPU allocator: pure, synchronous GPU state, filters, scoring, ledger and quota.

No I/O and no await here: the controller feeds it informer events and asks it questions, the
hypervisor's single-node mode uses it directly. allocator.py is the facade (`GpuAllocator`) over
indexes.py (where GPUs are, how nodes rank), ledger.py (allocations, charges, quota usage) and
queries.py (read-only answers); framework.py holds the scheduler plugins (PreFilter, Filter, Score,
Reserve, PreBind with structured Status, vocabulary in reasons.py) both scheduling paths call;
explain.py judges nodes with numbers and suggest.py finds the changes that would make a pod fit.
"""

from tfusion.allocator.allocator import (
    AllocationInfo,
    FilterResult,
    GpuAllocator,
    GpuPlacement,
    PoolConfig,
)
from tfusion.allocator.errors import (
    AllocatorError,
    FilterStage,
    InvalidAllocation,
    PlacementModeError,
    QuotaExceeded,
    Removal,
    Unschedulable,
)
from tfusion.allocator.framework import Code, Explanation, Framework, Reason, Status, Suggestion
from tfusion.allocator.quota import QuotaSpec, QuotaSpecError, Usage, quota_from_object
from tfusion.allocator.request import AllocRequest, RequestError, Resources, request_from_pod
from tfusion.allocator.scoring import PLACEMENT_MODES, Weights
from tfusion.allocator.state import GpuInfo, GpuObjectError, gpu_from_object

__all__ = [
    "PLACEMENT_MODES",
    "AllocRequest",
    "AllocationInfo",
    "AllocatorError",
    "Code",
    "Explanation",
    "FilterResult",
    "FilterStage",
    "Framework",
    "GpuAllocator",
    "GpuInfo",
    "GpuPlacement",
    "GpuObjectError",
    "InvalidAllocation",
    "PlacementModeError",
    "PoolConfig",
    "QuotaExceeded",
    "QuotaSpec",
    "QuotaSpecError",
    "Reason",
    "Removal",
    "RequestError",
    "Resources",
    "Status",
    "Suggestion",
    "Unschedulable",
    "Usage",
    "Weights",
    "gpu_from_object",
    "quota_from_object",
    "request_from_pod",
]
