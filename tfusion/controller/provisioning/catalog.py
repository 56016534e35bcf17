"""Instance types a provider can launch: GPUs (model, count, TFLOPS, VRAM), CPU and memory, and the
price per hour per capacity type. A catalog is a YAML file the user may edit (`--provisioning-catalog`);
the packaged default (`catalog.yaml`) has A100, H100 and L4 types with list prices.

Amounts are in the allocator's units: TFLOPS in milli-TFLOPS, memory in bytes (ints).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tfusion.api.quantity import Quantity, QuantityError

DEFAULT_CATALOG = Path(__file__).with_name("catalog.yaml")
#: the capacity types a claim may name (the GPUNodeClaim's `capacityType`; Karpenter's are lower-case)
ON_DEMAND, SPOT = "OnDemand", "Spot"
CAPACITY_TYPES = (ON_DEMAND, SPOT)


class CatalogError(ValueError):
    """A catalog file that cannot be used; the message names the entry, the field and the value."""


@dataclass(frozen=True)
class InstanceType:
    name: str  # the cloud's name, e.g. "p4d.24xlarge"
    gpu_model: str  # as NVML (and the simulated devices) name it, e.g. "A100-SXM4-80GB"
    gpu_count: int
    tflops_per_gpu: int  # milli-TFLOPS (fp16 dense)
    vram_per_gpu: int  # bytes
    cpu_milli: int
    memory_bytes: int
    prices: Mapping[str, float] = field(default_factory=dict)  # capacity type -> dollars per hour
    zones: tuple[str, ...] = ()  # empty: every zone of the region
    boot_seconds: float = 120.0  # typical time from launch to a Ready node (the expander's "ready in ~N s")

    @property
    def tflops(self) -> int:
        return self.tflops_per_gpu * self.gpu_count

    @property
    def vram(self) -> int:
        return self.vram_per_gpu * self.gpu_count

    def price(self, capacity_type: str = ON_DEMAND) -> float | None:
        """Dollars per hour for `capacity_type`; None when this type is not sold that way."""
        return self.prices.get(capacity_type)


@dataclass(frozen=True)
class Catalog:
    types: tuple[InstanceType, ...]

    def get(self, name: str) -> InstanceType | None:
        return next((t for t in self.types if t.name == name), None)

    def names(self) -> list[str]:
        return [t.name for t in self.types]

    def only(self, names: Iterable[str]) -> Catalog:
        keep = set(names)
        return Catalog(tuple(t for t in self.types if t.name in keep))


def load(path: Path = DEFAULT_CATALOG) -> Catalog:
    """Read a catalog file; CatalogError names the bad entry and field."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise CatalogError(f"cannot read the instance catalog {path}: {exc}") from None
    entries = data.get("instanceTypes") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise CatalogError(f"{path}: expected a mapping with a non-empty list 'instanceTypes'")
    types = [_instance_type(path, i, entry) for i, entry in enumerate(entries)]
    names = [t.name for t in types]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise CatalogError(f"{path}: instance type names must be unique; repeated: {', '.join(dupes)}")
    return Catalog(tuple(types))


def _instance_type(path: Path, index: int, entry: object) -> InstanceType:
    where = f"{path}: instanceTypes[{index}]"
    if not isinstance(entry, dict):
        raise CatalogError(f"{where}: expected a mapping, got {entry!r}")

    def text(key: str) -> str:
        value = entry.get(key)
        if not isinstance(value, str) or not value:
            raise CatalogError(f"{where}.{key}: {value!r} is not allowed; expected a non-empty string")
        return value

    def amount(key: str, milli: bool) -> int:
        value = entry.get(key)
        try:
            parsed = Quantity.parse(value) if isinstance(value, str | int) else None
        except QuantityError:
            parsed = None
        if parsed is None or parsed.nanos <= 0:
            raise CatalogError(f"{where}.{key}: {value!r} is not allowed; expected a positive quantity")
        return parsed.milli_value() if milli else parsed.value()

    count = entry.get("gpuCount")
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise CatalogError(f"{where}.gpuCount: {count!r} is not allowed; expected a positive integer")
    prices = entry.get("pricePerHour") or {}
    if not isinstance(prices, dict) or not prices or any(
            k not in CAPACITY_TYPES or isinstance(v, bool) or not isinstance(v, int | float) or v < 0
            for k, v in prices.items()):
        raise CatalogError(f"{where}.pricePerHour: {prices!r} is not allowed; expected a mapping of "
                           f"{' / '.join(CAPACITY_TYPES)} to non-negative dollars per hour")
    zones = entry.get("zones") or []
    if not isinstance(zones, list) or not all(isinstance(z, str) and z for z in zones):
        raise CatalogError(f"{where}.zones: {zones!r} is not allowed; expected a list of zone names")
    boot = entry.get("bootSeconds", 120)
    if isinstance(boot, bool) or not isinstance(boot, int | float) or boot < 0:
        raise CatalogError(f"{where}.bootSeconds: {boot!r} is not allowed; expected a non-negative number")
    return InstanceType(name=text("name"), gpu_model=text("gpuModel"), gpu_count=count,
                        tflops_per_gpu=amount("tflopsPerGpu", True), vram_per_gpu=amount("vramPerGpu", False),
                        cpu_milli=amount("cpu", True), memory_bytes=amount("memory", False),
                        prices={k: float(v) for k, v in prices.items()}, zones=tuple(zones),
                        boot_seconds=float(boot))
