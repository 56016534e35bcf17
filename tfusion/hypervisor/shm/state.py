"""One worker's mapped shared-memory file, read and written field by field with atomics.

Why: the hypervisor and the in-container limiter share this memory at the same time, so nothing
here copies the file in or out: each accessor is one atomic load or store at the field's offset
(`atomics.py` says how), and the read-modify-write updates (the token bucket, the PID-set lock)
are compare-and-swap loops, as the limiter's are. f64 fields are stored as their raw IEEE-754 bits
in a u64 word. The 64-byte UUID is written with a plain copy: the limiter reads it once, when it
starts, and the hypervisor writes it only when the allocation changes.

The PID set (`values[2048]`, `bitmap`, `len`) is changed only under the ShmMutex: compare-and-swap
the lock word from 0 to our PID; a holder that no longer exists (`kill(pid, 0)` fails) is swapped
back to 0 and we try again; a live holder makes us yield and retry, for at most `LOCK_TIMEOUT_S`.
A PID is in the set when its slot's bitmap bit is set; `values[slot]` holds it and `len` counts the
set bits.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tfusion.hypervisor.shm import layout as lay
from tfusion.hypervisor.shm.atomics import Atomics, atomics

#: how long taking the PID-set lock may wait for a live holder before giving up
LOCK_TIMEOUT_S = 2.0
#: the token bucket a fresh slot starts with (the original's initial values)
INITIAL_CAPACITY = 100.0
INITIAL_REFILL_RATE = 10.0
INITIAL_TOKENS = 100.0


class ShmError(RuntimeError):
    """The file cannot be used as a V2 shared-memory file; the message says why."""


class ShmLockTimeout(ShmError):
    """The PID-set lock stayed held by a live process."""


@dataclass(frozen=True)
class DeviceConfig:
    """What the hypervisor writes for one of a worker's devices."""

    slot: int  # the device index
    uuid: str
    up_limit: int  # percent of the device
    mem_limit: int  # bytes
    total_cuda_cores: int = 0


@dataclass(frozen=True)
class DeviceSnapshot:
    """One slot's fields as read now (for the API and tests)."""

    uuid: str
    up_limit: int
    mem_limit: int
    total_cuda_cores: int
    pod_memory_used: int
    refill_rate: float
    capacity: float
    tokens: float
    last_token_update: float
    is_active: bool


def _bits(value: float) -> int:
    return int(struct.unpack("<Q", struct.pack("<d", float(value)))[0])


def _float(bits: int) -> float:
    return float(struct.unpack("<d", struct.pack("<Q", bits))[0])


def pid_alive(pid: int) -> bool:
    """Whether a process with this PID exists (a permission error still means it exists)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class SharedState:
    """A mapped V2 file. Use `ShmStore` to create or open one; `close()` unmaps it."""

    def __init__(self, path: Path, mapping: mmap.mmap, atomic: Atomics | None = None) -> None:
        self.path = path
        self._map = mapping
        self._anchor = (ctypes.c_ubyte * lay.FILE_SIZE).from_buffer(mapping)
        self._base = ctypes.addressof(self._anchor)
        self._atomic = atomic or atomics()

    def close(self) -> None:
        if self._map.closed:
            return
        del self._anchor  # the exported buffer must go before the mapping can close
        self._map.close()

    @property
    def closed(self) -> bool:
        return self._map.closed

    # --- words ---------------------------------------------------------------------------------------

    def _addr(self, offset: int) -> int:
        if self._map.closed:
            raise ShmError(f"{self.path}: the mapping is closed")
        return self._base + offset

    def u32(self, offset: int) -> int:
        return self._atomic.load32(self._addr(offset))

    def set_u32(self, offset: int, value: int) -> None:
        self._atomic.store32(self._addr(offset), value)

    def u64(self, offset: int) -> int:
        return self._atomic.load64(self._addr(offset))

    def set_u64(self, offset: int, value: int) -> None:
        self._atomic.store64(self._addr(offset), value)

    def f64(self, offset: int) -> float:
        return _float(self.u64(offset))

    def set_f64(self, offset: int, value: float) -> None:
        self.set_u64(offset, _bits(value))

    def update_f64(self, offset: int, change: Callable[[float], float]) -> float:
        """Apply `change` to the value atomically (CAS loop); returns the value written."""
        address = self._addr(offset)
        seen = self._atomic.load64(address)
        while True:
            new = _bits(change(_float(seen)))
            swapped, current = self._atomic.cas64(address, seen, new)
            if swapped:
                return _float(new)
            seen = current

    # --- header --------------------------------------------------------------------------------------

    @property
    def discriminant(self) -> int:
        return self.u32(0)

    @property
    def device_count(self) -> int:
        return self.u32(lay.DEVICE_COUNT_OFFSET)

    @property
    def last_heartbeat(self) -> int:
        return self.u64(lay.HEARTBEAT_OFFSET)

    def heartbeat(self, now: float | None = None) -> None:
        self.set_u64(lay.HEARTBEAT_OFFSET, int(time.time() if now is None else now))

    # --- devices -------------------------------------------------------------------------------------

    def _uuid(self, slot: int) -> str:
        start = lay.device_offset(slot, "uuid")
        raw = bytes(self._map[start:start + lay.UUID_BYTES])
        return raw.split(b"\0", 1)[0].decode(errors="replace")

    def _set_uuid(self, slot: int, uuid: str) -> None:
        start = lay.device_offset(slot, "uuid")
        data = uuid.encode()[:lay.UUID_BYTES - 1]
        self._map[start:start + lay.UUID_BYTES] = data + b"\0" * (lay.UUID_BYTES - len(data))

    def device(self, slot: int) -> DeviceSnapshot:
        def field(name: str) -> int:
            return lay.device_offset(slot, name)

        return DeviceSnapshot(
            uuid=self._uuid(slot), up_limit=self.u32(field("up_limit")), mem_limit=self.u64(field("mem_limit")),
            total_cuda_cores=self.u32(field("total_cuda_cores")),
            pod_memory_used=self.u64(field("pod_memory_used")),
            refill_rate=self.f64(field("erl_token_refill_rate")), capacity=self.f64(field("erl_token_capacity")),
            tokens=self.f64(field("erl_current_tokens")),
            last_token_update=self.f64(field("erl_last_token_update")),
            is_active=self.u32(field("is_active")) != 0)

    def active_slots(self) -> list[int]:
        return [s for s in range(lay.MAX_DEVICES) if self.u32(lay.device_offset(s, "is_active"))]

    def initialize(self, devices: Sequence[DeviceConfig], now: float | None = None) -> None:
        """A fresh file's contents: discriminant, each device's limits and initial bucket, heartbeat."""
        now = time.time() if now is None else now
        self.set_u32(0, lay.DISCRIMINANT_V2)
        for config in devices:
            self._write_limits(config)
            self.set_f64(lay.device_offset(config.slot, "erl_token_capacity"), INITIAL_CAPACITY)
            self.set_f64(lay.device_offset(config.slot, "erl_token_refill_rate"), INITIAL_REFILL_RATE)
            self.set_f64(lay.device_offset(config.slot, "erl_current_tokens"), INITIAL_TOKENS)
            self.set_f64(lay.device_offset(config.slot, "erl_last_token_update"), now)
        self.set_u32(lay.DEVICE_COUNT_OFFSET, len(devices))
        self.set_u64(lay.PID_OWNER_OFFSET, os.getpid())
        self.heartbeat(now)

    def _write_limits(self, config: DeviceConfig) -> None:
        if self._uuid(config.slot) != config.uuid[:lay.UUID_BYTES - 1]:
            self._set_uuid(config.slot, config.uuid)
        self.set_u32(lay.device_offset(config.slot, "up_limit"), config.up_limit)
        self.set_u64(lay.device_offset(config.slot, "mem_limit"), config.mem_limit)
        self.set_u32(lay.device_offset(config.slot, "total_cuda_cores"), config.total_cuda_cores)
        self.set_u32(lay.device_offset(config.slot, "is_active"), 1)

    def apply_limits(self, devices: Sequence[DeviceConfig], now: float | None = None) -> bool:
        """Bring the limits up to date with the allocation; a slot that is new gets the initial bucket,
        a slot no longer allocated is deactivated and its tokens zeroed. True when anything changed."""
        wanted = {c.slot: c for c in devices}
        changed = False
        for slot in range(lay.MAX_DEVICES):
            config = wanted.get(slot)
            active = self.u32(lay.device_offset(slot, "is_active")) != 0
            if config is None:
                if active:
                    self.set_u32(lay.device_offset(slot, "is_active"), 0)
                    self.set_f64(lay.device_offset(slot, "erl_current_tokens"), 0.0)
                    self.set_f64(lay.device_offset(slot, "erl_last_token_update"), 0.0)
                    changed = True
                continue
            snap = self.device(slot)
            if active and (snap.uuid, snap.up_limit, snap.mem_limit, snap.total_cuda_cores) == (
                    config.uuid[:lay.UUID_BYTES - 1], config.up_limit, config.mem_limit, config.total_cuda_cores):
                continue
            self._write_limits(config)
            if not active:
                stamp = time.time() if now is None else now
                self.set_f64(lay.device_offset(slot, "erl_token_capacity"), INITIAL_CAPACITY)
                self.set_f64(lay.device_offset(slot, "erl_token_refill_rate"), INITIAL_REFILL_RATE)
                self.set_f64(lay.device_offset(slot, "erl_current_tokens"), INITIAL_TOKENS)
                self.set_f64(lay.device_offset(slot, "erl_last_token_update"), stamp)
            changed = True
        if self.device_count != len(devices):
            self.set_u32(lay.DEVICE_COUNT_OFFSET, len(devices))
            changed = True
        return changed

    def set_pod_memory_used(self, slot: int, used: int) -> None:
        self.set_u64(lay.device_offset(slot, "pod_memory_used"), max(0, used))

    def set_bucket(self, slot: int, refill_rate: float, capacity: float) -> None:
        self.set_f64(lay.device_offset(slot, "erl_token_refill_rate"), refill_rate)
        self.set_f64(lay.device_offset(slot, "erl_token_capacity"), capacity)

    def update_tokens(self, slot: int, change: Callable[[float], float]) -> float:
        return self.update_f64(lay.device_offset(slot, "erl_current_tokens"), change)

    def set_last_token_update(self, slot: int, when: float) -> None:
        self.set_f64(lay.device_offset(slot, "erl_last_token_update"), when)

    def take_tokens(self, slot: int, cost: float) -> bool:
        """What the limiter does per kernel launch: subtract `cost` only when that many are there."""
        address = self._addr(lay.device_offset(slot, "erl_current_tokens"))
        seen = self._atomic.load64(address)
        while True:
            current = _float(seen)
            if current < cost:
                return False
            swapped, now_seen = self._atomic.cas64(address, seen, _bits(current - cost))
            if swapped:
                return True
            seen = now_seen

    def drain_tokens(self, slot: int, want: float) -> float:
        """Take up to `want` tokens (a limiter launching kernels until it runs short); returns the number taken."""
        taken = 0.0

        def take(current: float) -> float:
            nonlocal taken
            taken = max(0.0, min(current, want))
            return current - taken

        self.update_tokens(slot, take)
        return taken

    # --- the PID set -----------------------------------------------------------------------------------

    @contextmanager
    def pid_lock(self, timeout: float = LOCK_TIMEOUT_S) -> Iterator[None]:
        """Hold the ShmMutex (see the module docstring)."""
        me = os.getpid()
        address = self._addr(lay.PID_LOCK_OFFSET)
        deadline = time.monotonic() + timeout
        while True:
            swapped, holder = self._atomic.cas64(address, 0, me)
            if swapped:
                break
            if holder != me and not pid_alive(holder):
                self._atomic.cas64(address, holder, 0)  # reclaim from a dead holder, then try again
                continue
            if time.monotonic() > deadline:
                raise ShmLockTimeout(f"{self.path}: the PID-set lock is held by live process {holder}")
            time.sleep(0.0005)
        try:
            yield
        finally:
            self._atomic.cas64(address, me, 0)

    def _set_slot(self, slot: int, used: bool) -> None:
        word, mask = lay.bitmap_bit(slot)
        offset = lay.PID_BITMAP_OFFSET + word * 8
        bits = self.u64(offset)
        self.set_u64(offset, bits | mask if used else bits & ~mask & 0xFFFF_FFFF_FFFF_FFFF)

    def _pids_unlocked(self) -> dict[int, int]:
        """{slot: pid} of the set bits; only the words that can hold slots 0..2047 are read."""
        held = {}
        for word in range((lay.PID_CAPACITY + 63) // 64):
            bits = self.u64(lay.PID_BITMAP_OFFSET + word * 8)
            if not bits:
                continue
            for bit in range(64):
                if bits & ((1 << 63) >> bit):
                    slot = word * 64 + bit
                    held[slot] = self.u64(lay.PID_VALUES_OFFSET + slot * 8)
        return held

    def pids(self) -> list[int]:
        """The registered PIDs (read under the lock, so never half-changed)."""
        with self.pid_lock():
            return sorted(self._pids_unlocked().values())

    def add_pid(self, pid: int) -> bool:
        """Register a host PID; False when it was already there. Raises ShmError when the set is full."""
        with self.pid_lock():
            held = self._pids_unlocked()
            if pid in held.values():
                return False
            free = next((s for s in range(lay.PID_CAPACITY) if s not in held), None)
            if free is None:
                raise ShmError(f"{self.path}: the PID set is full ({lay.PID_CAPACITY} processes)")
            self.set_u64(lay.PID_VALUES_OFFSET + free * 8, pid)
            self._set_slot(free, True)
            self.set_u64(lay.PID_LEN_OFFSET, len(held) + 1)
            return True

    def remove_pids(self, gone: Callable[[int], bool]) -> list[int]:
        """Drop every registered PID for which `gone(pid)` is true; returns them."""
        with self.pid_lock():
            held = self._pids_unlocked()
            removed = []
            for slot, pid in held.items():
                if gone(pid):
                    self._set_slot(slot, False)
                    self.set_u64(lay.PID_VALUES_OFFSET + slot * 8, 0)
                    removed.append(pid)
            if removed:
                self.set_u64(lay.PID_LEN_OFFSET, len(held) - len(removed))
            return sorted(removed)
