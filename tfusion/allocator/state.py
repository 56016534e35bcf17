"""What the allocator knows about one GPU, and how it is read from a GPU custom resource.

`GpuInfo` is the immutable, integer-only description of a GPU as the hypervisor reports it
(capacity, phase, model, node, pool, ...). It is built once per informer event by
`gpu_from_object`; the allocator keeps its own mutable bookkeeping (`GpuSlot`) next to it and never
takes `status.available`, `status.runningApps` or `status.allocatedPartitions` from the object,
because those fields are the allocator's output, not its input.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from tfusion.api import annotations as tfa
from tfusion.api.accessors import Gpu, items, text
from tfusion.api.quantity import Quantity, QuantityError

if TYPE_CHECKING:
    from tfusion.allocator.partitions import ModelPartitions, Partition

HOSTNAME_LABEL = "kubernetes.io/hostname"
PHASE_RUNNING = "Running"
PHASE_PENDING = "Pending"
USED_BY_TENSOR_FUSION = "tensor-fusion"
ISOLATION_MODES = tfa.ISOLATION_MODES

# virtualization-capabilities JSON key, lowercased -> isolation mode it allows. The hypervisor
# writes the Go field names (`SupportsSoftIsolation`); keys are matched ignoring case, as a Go
# struct decode does, so hand-written camelCase annotations mean the same.
_CAPABILITY_KEYS = {
    "supportssoftisolation": tfa.ISOLATION_SOFT,
    "supportshardisolation": tfa.ISOLATION_HARD,
    "supportspartitioning": tfa.ISOLATION_PARTITIONED,
}


class GpuObjectError(ValueError):
    """A GPU custom resource lacks a field the allocator needs, or holds an unreadable value."""


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """A GPU as reported: identity, placement, capacity (milli-TFLOPS, bytes) and capabilities.

    `virtualization` is the set of isolation modes the device supports according to the
    `virtualization-capabilities` annotation, or None when the hypervisor did not report it (then
    every mode is allowed, as upstream does).
    """

    name: str
    node: str
    pool: str
    capacity_tflops: int
    capacity_vram: int
    model: str = ""
    vendor: str = "NVIDIA"
    phase: str = PHASE_RUNNING
    used_by: str = USED_BY_TENSOR_FUSION
    index: int | None = None
    numa: int | None = None
    isolation_mode: str = ""
    isolation_policy: str = ""
    virtualization: frozenset[str] | None = None
    peer_tiers: tuple[tuple[str, int], ...] = ()
    """(peer GPU name, tier) from `status.topology.peers`, sorted; empty when the topology is unknown."""


def parse_peer_tiers(status: Any) -> tuple[tuple[str, int], ...]:
    """`status.topology.peers` as sorted (peer name, tier) pairs; entries without a peer or an integer
    tier are left out. Peer UUIDs are lowercased, as GPU objects are named."""
    pairs: dict[str, int] = {}
    for peer in items(status, "topology", "peers"):
        if not isinstance(peer, dict):
            continue
        uuid, tier = peer.get("peerGPUUUID"), peer.get("tier")
        if isinstance(uuid, str) and uuid and isinstance(tier, int) and not isinstance(tier, bool):
            pairs[uuid.lower()] = tier
    return tuple(sorted(pairs.items()))


def _quantity(gpu: str, path: str, value: Any, *, milli: bool) -> int:
    if value is None:
        raise GpuObjectError(f"GPU {gpu}: {path} is missing")
    try:
        q = Quantity.parse(value)
    except QuantityError as exc:
        raise GpuObjectError(f"GPU {gpu}: {path}: {exc}") from exc
    if q.sign() < 0:
        raise GpuObjectError(f"GPU {gpu}: {path} is negative ({value})")
    return q.milli_value() if milli else q.value()


def _optional_int(value: Any) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def parse_virtualization(raw: str | None) -> frozenset[str] | None:
    """Modes allowed by a `virtualization-capabilities` annotation; None when absent or unreadable."""
    if not raw:
        return None
    try:
        data = orjson.loads(raw)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    flags: dict[str, object] = {}
    for key, value in data.items():  # later duplicates win, as in a Go decode
        if isinstance(key, str) and key.lower() in _CAPABILITY_KEYS:
            flags[_CAPABILITY_KEYS[key.lower()]] = value
    return frozenset(mode for mode, value in flags.items() if value is True) | {tfa.ISOLATION_SHARED}


def gpu_from_object(gpu: Gpu) -> GpuInfo:
    """Build a `GpuInfo` from a GPU custom resource (read through its `Gpu` view).

    The node is `status.nodeSelector["kubernetes.io/hostname"]`, else the `managed-by` label; the
    pool is the `gpupool` label. Capacity must be present; the rest has the CRD's defaults.
    """
    from tfusion.api import annotations as tfa  # the domain prefix is configurable: read keys at call time

    meta, status = gpu.meta, gpu.status
    name = meta.name
    if not name:
        raise GpuObjectError("GPU object has no metadata.name")
    capacity = gpu.capacity
    return GpuInfo(
        name=name,
        node=gpu.node_selector.get(HOSTNAME_LABEL) or meta.label(tfa.MANAGED_BY) or "",
        pool=meta.label(tfa.GPU_POOL) or "",
        capacity_tflops=_quantity(name, "status.capacity.tflops", capacity.get("tflops"), milli=True),
        capacity_vram=_quantity(name, "status.capacity.vram", capacity.get("vram"), milli=False),
        model=gpu.gpu_model,
        vendor=text(status, "vendor") or "NVIDIA",
        phase=gpu.phase or PHASE_PENDING,
        used_by=gpu.used_by,
        index=_optional_int(status.get("index")),
        numa=_optional_int(status.get("numaNode")),
        isolation_mode=text(status, "isolationMode"),
        isolation_policy=text(status, "isolationPolicy"),
        virtualization=parse_virtualization(meta.annotation(tfa.VIRTUALIZATION_CAPABILITIES)),
        peer_tiers=parse_peer_tiers(status),
    )


class GpuSlot:
    """The allocator's mutable record for one GPU.

    `used_*` is the sum of the request charges of live allocations (assumed and committed) on it;
    `shared_by` is the pod holding it whole under shared isolation. Available is derived:
    0 while shared, else capacity minus used, never below 0. Under the dynamic isolation policy
    (`dynamic`), `active_mode`/`mode_conflict` follow from the pods on it (isolation.py).
    """

    __slots__ = ("active_mode", "allocs", "avail_t", "avail_v", "dynamic", "info", "mode_conflict", "name", "node",
                 "part_memo", "parts", "pool", "schedulable", "shared_by", "templates", "used_t", "used_v")

    def __init__(self, info: GpuInfo) -> None:
        self.info = info
        self.name = info.name
        self.node = info.node
        self.pool = info.pool
        self.used_t = 0
        self.used_v = 0
        self.shared_by: str | None = None
        self.allocs: dict[str, tuple[int, int]] = {}  # pod uid -> request charge (t, v) on this GPU
        self.avail_t = info.capacity_tflops
        self.avail_v = info.capacity_vram
        self.schedulable = True
        #: the dynamic isolation policy (isolation.py): on, the mode the GPU's pods hold, their disagreement
        self.dynamic = False
        self.active_mode = ""
        self.mode_conflict = False
        #: partitioned allocations on it (pod uid -> partition) and its model's templates (partitions.py)
        self.parts: dict[str, Partition] = {}
        self.templates: ModelPartitions | None = None
        #: partition request shape -> whether it fits, valid until the next refresh (partitions.fits)
        self.part_memo: dict[tuple[str, int, int, int], bool] | None = None
        self.refresh()

    def refresh(self) -> None:
        """Recompute the derived fields after a change of info or usage."""
        info = self.info
        self.part_memo = None
        if self.shared_by is not None:
            self.avail_t = 0
            self.avail_v = 0
        else:
            self.avail_t = max(0, info.capacity_tflops - self.used_t)
            self.avail_v = max(0, info.capacity_vram - self.used_v)
        self.schedulable = info.phase == PHASE_RUNNING and info.used_by in ("", USED_BY_TENSOR_FUSION)

    @property
    def idle(self) -> bool:
        return not self.allocs and self.shared_by is None
