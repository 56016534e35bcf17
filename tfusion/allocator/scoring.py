"""Placement strategies: how nodes and GPUs are ranked.

Three modes, as the pool's SchedulingConfigTemplate names them:

| mode                    | node score (pick the node) | GPU score (pick GPUs on it) |
|-------------------------|----------------------------|-----------------------------|
| CompactFirst            | used %  (pack)             | used %  (pack)              |
| LowLoadFirst            | free %  (spread)           | free %  (spread)            |
| NodeCompactGPULowLoad   | used %  (pack)             | free %  (spread)  (default) |

A GPU's score is `clamp(round(vram% * vramWeight + tflops% * tflopsWeight), 0, 100)` (weights 0.7 and
0.3 by default, rounding half up). A node's score is the integer mean of its GPUs' node-level scores,
a Pending GPU counting a quarter. Neither depends on the request, which is what lets the allocator
keep nodes ordered by score between requests. Ties go to the smaller node name, then GPU name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tfusion.allocator.errors import PlacementModeError

COMPACT_FIRST = "CompactFirst"
LOW_LOAD_FIRST = "LowLoadFirst"
NODE_COMPACT_GPU_LOW_LOAD = "NodeCompactGPULowLoad"
DEFAULT_MODE = NODE_COMPACT_GPU_LOW_LOAD
PLACEMENT_MODES = (COMPACT_FIRST, LOW_LOAD_FIRST, NODE_COMPACT_GPU_LOW_LOAD)

USED = "used"  # score the used share: pack
FREE = "free"  # score the free share: spread


@dataclass(frozen=True, slots=True)
class Weights:
    """GPUResourcesFit's vramWeight and tflopsWeight."""

    vram: float = 0.7
    tflops: float = 0.3


def mode_variants(mode: str) -> tuple[str, str]:
    """(node-level variant, GPU-level variant) for a placement mode; unknown modes are an error."""
    if mode == NODE_COMPACT_GPU_LOW_LOAD:
        return USED, FREE
    if mode == COMPACT_FIRST:
        return USED, USED
    if mode == LOW_LOAD_FIRST:
        return FREE, FREE
    raise PlacementModeError(
        f"placement mode {mode!r} is not supported; allowed: {', '.join(PLACEMENT_MODES)}")


def normalize(vram_percent: float, tflops_percent: float, weights: Weights) -> int:
    value = math.floor(vram_percent * weights.vram + tflops_percent * weights.tflops + 0.5)
    return 0 if value < 0 else 100 if value > 100 else value


def gpu_score(avail_t: int, cap_t: int, avail_v: int, cap_v: int, variant: str, weights: Weights) -> int:
    """Score of one GPU from its free and total TFLOPS and VRAM (a zero capacity counts as full)."""
    free_t = avail_t / cap_t * 100.0 if cap_t > 0 else 0.0
    free_v = avail_v / cap_v * 100.0 if cap_v > 0 else 0.0
    if variant == USED:
        return normalize(100.0 - free_v, 100.0 - free_t, weights)
    return normalize(free_v, free_t, weights)
