"""A straightforward GPU allocator, written from the reference's rules, to check the fast one.

It keeps a plain dict per GPU and, for every pod, scans every GPU: applies each filter rule, groups
the survivors by node, drops nodes with too few GPUs or too many workers, scores every node as the
integer mean of its GPUs' node-level scores (Pending GPUs a quarter), takes the highest score
(ties: smaller node name) and the best GPUs on it by GPU-level score (ties: smaller GPU name).
No indexes, no caching, no shared code with tfusion.allocator beyond the request dataclass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tfusion.allocator import AllocRequest, GpuInfo


@dataclass
class RefGpu:
    info: GpuInfo
    used_t: int = 0
    used_v: int = 0
    shared_by: str | None = None
    pods: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def avail_t(self) -> int:
        return 0 if self.shared_by else max(0, self.info.capacity_tflops - self.used_t)

    @property
    def avail_v(self) -> int:
        return 0 if self.shared_by else max(0, self.info.capacity_vram - self.used_v)


def _round_half_up(x: float) -> int:
    return math.floor(x + 0.5)


class ReferenceAllocator:
    def __init__(self, mode: str = "NodeCompactGPULowLoad", max_workers: int = 256,
                 vram_weight: float = 0.7, tflops_weight: float = 0.3) -> None:
        self.mode = mode
        self.max_workers = max_workers
        self.vw = vram_weight
        self.tw = tflops_weight
        self.gpus: dict[str, RefGpu] = {}
        self.workers: dict[str, set[str]] = {}
        self.pods: dict[str, tuple[str, list[str], bool]] = {}

    def add_gpu(self, info: GpuInfo) -> None:
        self.gpus[info.name] = RefGpu(info)

    # -- rules
    @staticmethod
    def need_tflops(req: AllocRequest, gpu: RefGpu) -> int:
        if req.tflops_request:
            return req.tflops_request
        return req.percent_request * gpu.info.capacity_tflops // 100_000

    def passes(self, gpu: RefGpu, req: AllocRequest) -> bool:
        info = gpu.info
        if info.pool != req.pool:
            return False
        if info.isolation_policy not in ("", "Static", "static"):
            return False
        if req.isolation != "shared" and info.isolation_mode not in ("", req.isolation):
            return False
        if info.phase != "Running" or info.used_by not in ("", "tensor-fusion"):
            return False
        if req.indices and info.index not in req.indices:
            return False
        if info.virtualization is not None and req.isolation not in info.virtualization:
            return False
        if gpu.shared_by is not None:  # a GPU held whole by a shared pod takes nobody else
            return False
        if req.isolation == "shared" and gpu.pods:
            return False
        if req.isolation == "partitioned":
            return False
        if gpu.avail_t < self.need_tflops(req, gpu) or gpu.avail_v < req.vram_request:
            return False
        if req.gpu_model and info.model != req.gpu_model:
            return False
        return not (req.vendor and info.vendor != req.vendor)

    def _score(self, gpu: RefGpu, pack: bool) -> int:
        cap_t, cap_v = gpu.info.capacity_tflops, gpu.info.capacity_vram
        free_t = gpu.avail_t / cap_t * 100 if cap_t else 0.0
        free_v = gpu.avail_v / cap_v * 100 if cap_v else 0.0
        if pack:
            v, t = 100 - free_v, 100 - free_t
        else:
            v, t = free_v, free_t
        return min(100, max(0, _round_half_up(v * self.vw + t * self.tw)))

    def node_score(self, node: str) -> int:
        pack = self.mode in ("CompactFirst", "NodeCompactGPULowLoad")
        scores = []
        for gpu in self.gpus.values():
            if gpu.info.node == node:
                s = self._score(gpu, pack)
                scores.append(s // 4 if gpu.info.phase == "Pending" else s)
        return sum(scores) // len(scores)

    def _candidates(self, req: AllocRequest) -> dict[str, list[RefGpu]]:
        by_node: dict[str, list[RefGpu]] = {}
        for gpu in self.gpus.values():
            if self.passes(gpu, req):
                by_node.setdefault(gpu.info.node, []).append(gpu)
        return by_node

    def feasible(self, req: AllocRequest) -> set[str]:
        """Nodes with enough passing GPUs and room for one more worker."""
        return {n for n, gs in self._candidates(req).items()
                if len(gs) >= req.count and len(self.workers.get(n, ())) < self.max_workers}

    def select(self, req: AllocRequest) -> tuple[str, tuple[str, ...]] | None:
        by_node = self._candidates(req)
        feasible = [n for n, gs in by_node.items()
                    if len(gs) >= req.count and len(self.workers.get(n, ())) < self.max_workers]
        if not feasible:
            return None
        best = min(feasible, key=lambda n: (-self.node_score(n), n))
        pack_gpu = self.mode == "CompactFirst"
        ranked = sorted(by_node[best], key=lambda g: (-self._score(g, pack_gpu), g.info.name))
        return best, tuple(g.info.name for g in ranked[: req.count])

    def allocate(self, req: AllocRequest) -> tuple[str, tuple[str, ...]] | None:
        choice = self.select(req)
        if choice is None:
            return None
        node, names = choice
        for name in names:
            gpu = self.gpus[name]
            charge = (self.need_tflops(req, gpu), req.vram_request)
            gpu.pods[req.pod_uid] = charge
            if req.isolation == "shared":
                gpu.shared_by = req.pod_uid
            else:
                gpu.used_t += charge[0]
                gpu.used_v += charge[1]
        self.workers.setdefault(node, set()).add(req.pod_uid)
        self.pods[req.pod_uid] = (node, list(names), req.isolation == "shared")
        return choice

    def release(self, uid: str) -> None:
        node, names, shared = self.pods.pop(uid)
        for name in names:
            gpu = self.gpus[name]
            charge = gpu.pods.pop(uid)
            if shared:
                gpu.shared_by = None
            else:
                gpu.used_t -= charge[0]
                gpu.used_v -= charge[1]
        self.workers[node].discard(uid)
