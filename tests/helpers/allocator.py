"""The GPUs and requests the allocator's unit tests build, and the filter reasons a request meets."""

from __future__ import annotations

from typing import Any

from tfusion.allocator import AllocRequest, GpuAllocator, GpuInfo

GIB = 1 << 30


def gpu(name: str, node: str = "n1", *, tflops: int = 100, vram: int = 16, pool: str = "p", **kw: Any) -> GpuInfo:
    return GpuInfo(name=name, node=node, pool=pool, capacity_tflops=tflops * 1000, capacity_vram=vram * GIB, **kw)


_uid = 0


def req(tflops: float = 10, vram: float = 2, *, count: int = 1, ns: str = "ns", uid: str | None = None,
        **kw: Any) -> AllocRequest:
    global _uid
    _uid += 1
    uid = uid or f"pod-{_uid}"
    fields: dict[str, Any] = dict(pod_uid=uid, pod_name=uid, namespace=ns, pool="p", workload=(ns, "wl"),
                                  tflops_request=int(tflops * 1000), tflops_limit=int(tflops * 2000),
                                  vram_request=int(vram * GIB), vram_limit=int(vram * 2 * GIB), count=count)
    fields.update(kw)
    return AllocRequest(**fields)


def removed_by(a: GpuAllocator, r: AllocRequest) -> dict[str, list[str]]:
    """stage name -> reasons, from an explained filter run."""
    return {s.name: [x.reason for x in s.removed] for s in a.filter(r, explain=True).stages}
