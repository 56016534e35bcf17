"""The GPU model table: fp16 TFLOPS (which NVML cannot report) and the facts the simulator needs.

The table ships as `gpu_info.yaml` next to this module. `TF_PROVIDER_HARDWARE_METADATA` (a JSON list of
`{model, fullModelName, fp16TFlops}` rows, injected from the ProviderConfig) overrides it; its rows
are matched first. Matching is case-insensitive on the model name as NVML reports it, on that name
without a leading vendor word ("NVIDIA A100-SXM4-80GB" -> "A100-SXM4-80GB"), and on the row's short
model id and aliases.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

import orjson
import yaml

log = logging.getLogger(__name__)

_VENDOR_WORDS = ("nvidia ", "tesla ", "nvidia geforce ", "geforce ")


class HardwareMetadataError(ValueError):
    """TF_PROVIDER_HARDWARE_METADATA is not a JSON list of model rows; the message says where."""


@dataclass(frozen=True)
class GpuModel:
    """One row of the table."""

    model: str
    full_model_name: str
    fp16_tflops: float
    vendor: str = "NVIDIA"
    memory_mib: int = 0
    sm_count: int = 0
    compute_capability: str = ""
    aliases: tuple[str, ...] = field(default_factory=tuple)

    @property
    def names(self) -> tuple[str, ...]:
        return (self.model, self.full_model_name, *self.aliases)


def _normalise(name: str) -> str:
    return " ".join(name.strip().lower().split())


def _without_vendor(name: str) -> str:
    lowered = _normalise(name)
    for word in sorted(_VENDOR_WORDS, key=len, reverse=True):
        if lowered.startswith(word):
            return lowered[len(word):]
    return lowered


def _row(raw: dict[str, Any], where: str) -> GpuModel:
    if not isinstance(raw, dict):
        raise HardwareMetadataError(f"{where}: expected an object, got {type(raw).__name__}")
    model = raw.get("model") or ""
    full = raw.get("fullModelName") or ""
    if not isinstance(model, str) or not isinstance(full, str) or not (model or full):
        raise HardwareMetadataError(f"{where}: needs a string 'model' or 'fullModelName'")
    tflops = raw.get("fp16TFlops", 0)
    try:
        tflops_value = float(tflops)
    except (TypeError, ValueError):
        raise HardwareMetadataError(f"{where}.fp16TFlops: expected a number, got {tflops!r}") from None
    if tflops_value < 0:
        raise HardwareMetadataError(f"{where}.fp16TFlops: must not be negative, got {tflops!r}")
    return GpuModel(
        model=model, full_model_name=full, fp16_tflops=tflops_value,
        vendor=str(raw.get("vendor") or "NVIDIA"),
        memory_mib=int(raw.get("memoryMiB") or 0), sm_count=int(raw.get("smCount") or 0),
        compute_capability=str(raw.get("computeCapability") or ""),
        aliases=tuple(str(a) for a in raw.get("aliases") or ()))


@cache
def shipped_models() -> tuple[GpuModel, ...]:
    text = resources.files("tfusion.hypervisor.devices").joinpath("gpu_info.yaml").read_text("utf-8")
    rows = yaml.safe_load(text)
    return tuple(_row(raw, f"gpu_info.yaml[{i}]") for i, raw in enumerate(rows))


def parse_hardware_metadata(text: str) -> tuple[GpuModel, ...]:
    """Rows of TF_PROVIDER_HARDWARE_METADATA; empty text means none."""
    if not text.strip():
        return ()
    try:
        rows = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise HardwareMetadataError(f"TF_PROVIDER_HARDWARE_METADATA: not JSON ({exc})") from None
    if not isinstance(rows, list):
        raise HardwareMetadataError("TF_PROVIDER_HARDWARE_METADATA: expected a JSON list of model rows")
    return tuple(_row(raw, f"TF_PROVIDER_HARDWARE_METADATA[{i}]") for i, raw in enumerate(rows))


class GpuInfoTable:
    """Looks a device model up in the overrides, then in the shipped table."""

    def __init__(self, overrides: tuple[GpuModel, ...] = ()) -> None:
        self._overrides = overrides
        self._warned: set[str] = set()

    @classmethod
    def from_metadata(cls, text: str) -> GpuInfoTable:
        return cls(parse_hardware_metadata(text))

    def find(self, device_model: str) -> GpuModel | None:
        """The first row whose names match `device_model` (overrides with fp16TFlops 0 are skipped)."""
        wanted = {_normalise(device_model), _without_vendor(device_model)}
        for row in (*[r for r in self._overrides if r.fp16_tflops > 0], *shipped_models()):
            for name in row.names:
                if name and (_normalise(name) in wanted or _without_vendor(name) in wanted):
                    return row
        return None

    def fp16_tflops(self, device_model: str) -> float:
        """TFLOPS for a model; 0 (with one warning per model) when the table does not know it."""
        row = self.find(device_model)
        if row is None:
            if device_model not in self._warned:
                self._warned.add(device_model)
                log.warning("GPU model %r is not in the gpu-info table; reporting 0 TFLOPS "
                            "(set TF_PROVIDER_HARDWARE_METADATA to give its fp16TFlops)", device_model)
            return 0.0
        return row.fp16_tflops
