"""The body of the hypervisor's `GET /api/v1/usage`: every worker's current per-GPU usage.

Why here: the hypervisor serves it and the controller's autoscaler decodes it, and the two roles may
not import each other; both may import `tfusion.metrics`. The values are the `tf_worker_usage`
points' (`tfusion/hypervisor/metrics.py` `worker_samples`), one row per (worker pod, GPU), with the
units of that table: TFLOPS as a float, memory in bytes.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

#: what a row may say at most; a hypervisor holds at most a few hundred workers, each on a few GPUs
MAX_ROWS = 100_000


class WorkerGpuUsage(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """One worker's use of one GPU, from the hypervisor's last device sample."""

    namespace: str
    pod: Annotated[str, msgspec.Meta(description="The worker pod's name")]
    worker: Annotated[str, msgspec.Meta(description="The worker pod's UID")]
    workload: Annotated[str, msgspec.Meta(description="The worker's TensorFusionWorkload; empty when it has none")]
    gpu: Annotated[str, msgspec.Meta(description="The GPU's lowercase UUID")]
    compute_tflops: Annotated[float, msgspec.Meta(ge=0, description="TFLOPS the worker's processes use")]
    memory_bytes: Annotated[int, msgspec.Meta(ge=0, description="GPU memory the worker's processes use")]


class WorkerUsageList(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """`GET /api/v1/usage`: the node, when the sample was read (unix seconds) and the rows."""

    node: str
    at: Annotated[float, msgspec.Meta(description="Unix seconds of this answer")]
    data: Annotated[list[WorkerGpuUsage], msgspec.Meta(max_length=MAX_ROWS)]
