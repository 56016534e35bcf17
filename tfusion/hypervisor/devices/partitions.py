"""Hardware partitions (NVIDIA MIG): what a backend is asked to create and what it reports back.

Why a module of its own: the NVML backend, the sim backend and the hypervisor's partitioner share
these shapes, and the sim backend needs MIG's real slot geometry (which start slots each GPU-instance
profile may occupy, and how many slots it covers) to refuse the placements real hardware refuses.
The geometry is NVIDIA's, from the MIG user guide's profile tables (`nvidia-smi mig -lgip`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tfusion.hypervisor.devices.backend import DeviceBackendError
from tfusion.hypervisor.devices.model import DeviceInfo, VirtualizationCapabilities


class PartitionError(DeviceBackendError):
    """A partition cannot be created or removed; the message names the GPU, the profile and why."""


@dataclass(frozen=True)
class PartitionProfile:
    """What to create: a profile name such as `1g.10gb`, and NVML's GPU-instance profile ID when known
    (ProviderConfig's `nvmlProfileId`); a backend matches the ID first, else the name."""

    name: str
    nvml_profile_id: int | None = None

    def describe(self) -> str:
        return self.name if self.nvml_profile_id is None else f"{self.name} (NVML profile {self.nvml_profile_id})"


@dataclass(frozen=True)
class Partition:
    """One partition on a GPU: its UUID exactly as the driver gives it (`MIG-...`), its parent's
    lowercase UUID, the profile, and the slots `[slot_start, slot_end)` it occupies."""

    uuid: str
    parent_uuid: str
    profile_name: str
    profile_id: int
    slot_start: int
    slot_end: int
    memory_bytes: int = 0
    gpu_instance_id: int = 0
    compute_instance_id: int = 0

    def device(self, parent: DeviceInfo, compute_fraction: float) -> DeviceInfo:
        """The partition as a device of its own (what `/api/v1/devices` and an allocation list)."""
        return DeviceInfo(
            native_uuid=self.uuid, vendor=parent.vendor, model=f"{parent.model} MIG {self.profile_name}",
            index=parent.index, numa_node=parent.numa_node,
            total_memory_bytes=self.memory_bytes, max_tflops=round(parent.max_tflops * compute_fraction, 3),
            driver_version=parent.driver_version, healthy=parent.healthy,
            capabilities=VirtualizationCapabilities(supports_soft_isolation=False, supports_hard_isolation=False),
            extra_properties=(("migProfile", self.profile_name), ("migSlots", f"{self.slot_start}-{self.slot_end}")),
            parent_uuid=self.parent_uuid)


@dataclass(frozen=True)
class MigShape:
    """One GPU-instance profile of a model: NVML profile ID, slots covered, allowed start slots,
    memory, and compute slices (of 7)."""

    name: str
    profile_id: int
    size: int
    starts: tuple[int, ...]
    memory_mib: int
    compute_slices: int


def _shapes(gb: int) -> tuple[MigShape, ...]:
    """The seven-slice GA100/GH100 layout, memory scaled by the card's size (80 or 40 GB)."""
    unit = gb // 8  # one memory slice: 10 GB on an 80 GB card, 5 GB on a 40 GB card
    return (
        MigShape(f"1g.{unit}gb", 19, 1, (0, 1, 2, 3, 4, 5, 6), unit * 1024, 1),
        MigShape(f"1g.{unit * 2}gb", 15, 2, (0, 2, 4, 6), unit * 2 * 1024, 1),
        MigShape(f"2g.{unit * 2}gb", 14, 2, (0, 2, 4), unit * 2 * 1024, 2),
        MigShape(f"3g.{unit * 4}gb", 9, 4, (0, 4), unit * 4 * 1024, 3),
        MigShape(f"4g.{unit * 4}gb", 5, 4, (0,), unit * 4 * 1024, 4),
        MigShape(f"7g.{gb}gb", 0, 8, (0,), gb * 1024, 7),
    )


#: slot geometry per MIG-capable model family (A100 80 GB, A100 40 GB, H100 80 GB)
MIG_MODELS: dict[str, tuple[MigShape, ...]] = {"a100-80gb": _shapes(80), "a100-40gb": _shapes(40),
                                               "h100-80gb": _shapes(80)}
MIG_SLOTS = 8


def mig_family(model: str) -> str | None:
    """The MIG_MODELS key of a driver model name (`NVIDIA A100-SXM4-80GB`, `NVIDIA H100 80GB HBM3`)."""
    text = model.lower()
    if "a100" in text:
        return "a100-80gb" if "80" in text else "a100-40gb"
    if "h100" in text and ("80" in text or "pcie" in text):
        return "h100-80gb"
    return None


def canonical(name: str) -> str:
    """A template or profile name in one spelling, as the original compares them: lowercase, `.`, `_`,
    space and `/` as `-`, repeated `-` collapsed, ends trimmed, an optional `mig-` prefix dropped."""
    text = re.sub(r"-+", "-", re.sub(r"[._ /]", "-", name.strip().lower())).strip("-")
    return text[4:] if text.startswith("mig-") else text


def find_shape(shapes: tuple[MigShape, ...], profile: PartitionProfile) -> MigShape | None:
    if profile.nvml_profile_id is not None:
        by_id = next((s for s in shapes if s.profile_id == profile.nvml_profile_id), None)
        if by_id is not None:
            return by_id
    wanted = canonical(profile.name)
    return next((s for s in shapes if canonical(s.name) == wanted), None)


class MigLayout:
    """The occupied slots of one simulated GPU: placements follow the profile's allowed starts and
    never overlap, as the hardware enforces."""

    def __init__(self, gpu: str, shapes: tuple[MigShape, ...]) -> None:
        self.gpu = gpu
        self.shapes = shapes
        self.used: dict[int, MigShape] = {}  # start slot -> shape

    def _free(self, start: int, size: int) -> bool:
        return all(start + size <= s or s + shape.size <= start for s, shape in self.used.items())

    def place(self, shape: MigShape, start: int | None) -> int:
        """The start slot the partition gets (`start` when given, else the first free allowed one)."""
        if start is not None:
            if start not in shape.starts:
                raise PartitionError(f"GPU {self.gpu}: profile {shape.name} cannot start at slot {start}; "
                                     f"allowed start slots: {', '.join(map(str, shape.starts))}")
            if not self._free(start, shape.size):
                raise PartitionError(f"GPU {self.gpu}: slots {start}-{start + shape.size} for {shape.name} overlap "
                                     f"a partition already there (used: {self.describe()})")
            return start
        for candidate in shape.starts:
            if self._free(candidate, shape.size):
                return candidate
        raise PartitionError(f"GPU {self.gpu}: no free placement for {shape.name} (used: {self.describe()})")

    def describe(self) -> str:
        return ", ".join(f"{s.name}@{start}" for start, s in sorted(self.used.items())) or "none"
