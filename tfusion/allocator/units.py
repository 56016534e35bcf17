"""Conversions between the allocator's integers and Kubernetes quantity strings.

Inside the allocator TFLOPS are milli-TFLOPS (`int`), VRAM is bytes (`int`) and compute
percentages are milli-percent (`int`, 50 % == 50_000). Quantities are parsed once when an object
enters and formatted only when a status, a view or an explanation leaves; this module is that edge.
"""

from __future__ import annotations

import functools

from tfusion.api.quantity import Quantity

MILLI = 1000
PERCENT_SCALE = 100 * MILLI  # milli-percent in 100 %
MIB = 1 << 20


# The text of an amount is remembered: statuses, views and audits format the same few request sizes and
# capacities over and over (every app of every GPU's runningApps), and a Quantity's canonical text
# takes microseconds to make.
@functools.lru_cache(maxsize=1 << 14)
def tflops_str(milli: int) -> str:
    """Canonical quantity text for milli-TFLOPS (989000 -> "989", 20500 -> "20500m")."""
    return str(Quantity.from_milli(milli))


@functools.lru_cache(maxsize=1 << 14)
def vram_str(size: int) -> str:
    """Canonical binary quantity text for bytes (8589934592 -> "8Gi")."""
    return str(Quantity.from_int(size, "BinarySI"))


def vram_mib_str(size: int) -> str:
    """Bytes floored to whole MiB, canonical ("245399Mi"), for a status figure derived from
    percentages of host RAM and disk (virtual VRAM): unfloored, it prints as a bare twelve-digit
    byte count beside the MiB-whole totals; less than a MiB of it is never usable anyway."""
    return vram_str(max(0, size) // MIB * MIB)


def amount(resource: str | None, value: int) -> str | int:
    """An amount in its resource's unit, as every explanation shows it: quantity text for VRAM and
    memory (bytes, "80Gi"), TFLOPS (milli-TFLOPS, "5k") and CPU (milli-CPU, "500m"), including
    quota limits named after them ("total.max.vram.request"); counts (GPUs, workers, pods, index,
    extended resources) stay integers."""
    name = resource or ""
    if "vram" in name or name == "memory":
        return vram_str(value)
    if "tflops" in name or name == "cpu":
        return str(Quantity.from_milli(value))
    return value


@functools.lru_cache(maxsize=1 << 14)
def percent_str(milli_percent: int) -> str:
    """Canonical quantity text for a compute percentage in milli-percent (50000 -> "50")."""
    return str(Quantity.from_milli(milli_percent))


def ratio_str(numerator: int, denominator: int) -> str:
    """`numerator / denominator * 100` with two decimals, floored at 0 (quota availablePercent)."""
    if denominator <= 0:
        return "100"
    value = max(0.0, numerator / denominator * 100.0)
    return f"{value:.2f}"
