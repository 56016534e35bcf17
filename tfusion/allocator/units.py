"""Conversions between the allocator's integers and Kubernetes quantity strings.

Inside the allocator TFLOPS are milli-TFLOPS (`int`), VRAM is bytes (`int`) and compute
percentages are milli-percent (`int`, 50 % == 50_000). Quantities are parsed once when an object
enters and formatted only when a status, a view or an explanation leaves; this module is that edge.
"""

from __future__ import annotations

from tfusion.api.quantity import Quantity

MILLI = 1000
PERCENT_SCALE = 100 * MILLI  # milli-percent in 100 %


def tflops_str(milli: int) -> str:
    """Canonical quantity text for milli-TFLOPS (989000 -> "989", 20500 -> "20500m")."""
    return str(Quantity.from_milli(milli))


def vram_str(size: int) -> str:
    """Canonical binary quantity text for bytes (8589934592 -> "8Gi")."""
    return str(Quantity.from_int(size, "BinarySI"))


def percent_str(milli_percent: int) -> str:
    """Canonical quantity text for a compute percentage in milli-percent (50000 -> "50")."""
    return str(Quantity.from_milli(milli_percent))


def ratio_str(numerator: int, denominator: int) -> str:
    """`numerator / denominator * 100` with two decimals, floored at 0 (quota availablePercent)."""
    if denominator <= 0:
        return "100"
    value = max(0.0, numerator / denominator * 100.0)
    return f"{value:.2f}"
