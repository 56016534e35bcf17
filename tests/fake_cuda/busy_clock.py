"""Reads the simulated machine's busy-time clock (busy_clock.h) that the fake CUDA driver advances
with each launch and the fake NVML turns into utilisation: tests measure what the limiter let
through over a window of their own, independently of what the hypervisor saw."""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass
from pathlib import Path

DEVICES = 8
ENTRIES = 64
_ENTRY = struct.Struct(f"<Q{DEVICES}Q")
_TOTALS = struct.Struct(f"<{DEVICES}Q")
SIZE = _TOTALS.size + ENTRIES * _ENTRY.size + _TOTALS.size  # the totals, the entries, busy_until_ns[8]


@dataclass(frozen=True)
class Reading:
    at: float  # time.monotonic()
    device_ns: tuple[int, ...]
    process_ns: dict[int, tuple[int, ...]]  # pid -> busy ns per device

    def of(self, pids: set[int], device: int) -> int:
        return sum(ns[device] for pid, ns in self.process_ns.items() if pid in pids)


def read(path: Path) -> Reading:
    """The clock now (all zeroes while no launch has created the file)."""
    at = time.monotonic()
    data = path.read_bytes() if path.exists() else b""
    data = data.ljust(SIZE, b"\0")
    totals = _TOTALS.unpack_from(data, 0)
    processes = {}
    for i in range(ENTRIES):
        pid, *ns = _ENTRY.unpack_from(data, _TOTALS.size + i * _ENTRY.size)
        if pid:
            processes[pid] = tuple(ns)
    return Reading(at, totals, processes)


def percent(before: Reading, after: Reading, device: int, pids: set[int] | None = None) -> float:
    """The busy share (percent) of `device` between two readings, of `pids` or of all processes."""
    elapsed_ns = (after.at - before.at) * 1e9
    if pids is None:
        busy = after.device_ns[device] - before.device_ns[device]
    else:
        busy = after.of(pids, device) - before.of(pids, device)
    return 100.0 * busy / elapsed_ns


def measure(path: Path, seconds: float, device: int = 0, pids: set[int] | None = None) -> float:
    before = read(path)
    time.sleep(seconds)
    return percent(before, read(path), device, pids)
