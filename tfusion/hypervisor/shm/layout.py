"""The byte layout of the soft limiter's shared-memory file: the original's `SharedDeviceState::V2`.

Why: the in-container limiter (`libcuda_limiter.so`: the original's, or ours in native/limiter)
maps this file and reads it at fixed offsets, so the layout is a wire format kept to the byte
(reference hypervisor §5.2): a Rust `#[repr(C)]` enum, little-endian, natural alignment on x86-64,
35,504 bytes in all. The ctypes Structures below state it once; the offsets the rest of the package
uses are read off them, and a unit test pins each one to the documented number.

    0      u32 discriminant (1 = V2) + 4 pad
    8      DeviceEntryV2 devices[16], 136 bytes each, slot = device index
    2184   u32 device_count + 4 pad
    2192   u64 last_heartbeat (unix seconds)
    2200   ShmMutex<PIDSet>: usize lock_holder_pid; usize values[2048]; u64 bitmap[2048];
           usize len; usize owner_pid (32,792 bytes)
    34992  u8 pad[512]
"""

from __future__ import annotations

import ctypes

FILE_SIZE = 35504
#: the V1 file's size: refused with its own message
LEGACY_FILE_SIZE = 35496
DISCRIMINANT_V2 = 1
MAX_DEVICES = 16
UUID_BYTES = 64
PID_CAPACITY = 2048
PID_BITMAP_WORDS = 2048  # oversized on purpose upstream (32 words would do); kept for the layout


class DeviceEntryV2(ctypes.Structure):
    _fields_ = [
        ("uuid", ctypes.c_char * UUID_BYTES),
        ("up_limit", ctypes.c_uint32),
        ("mem_limit", ctypes.c_uint64),
        ("total_cuda_cores", ctypes.c_uint32),
        ("pod_memory_used", ctypes.c_uint64),
        ("erl_token_refill_rate", ctypes.c_double),
        ("erl_token_capacity", ctypes.c_double),
        ("erl_current_tokens", ctypes.c_double),
        ("erl_last_token_update", ctypes.c_double),
        ("is_active", ctypes.c_uint32),
    ]


class PidSetMutex(ctypes.Structure):
    _fields_ = [
        ("lock_holder_pid", ctypes.c_size_t),
        ("values", ctypes.c_size_t * PID_CAPACITY),
        ("bitmap", ctypes.c_uint64 * PID_BITMAP_WORDS),
        ("len", ctypes.c_size_t),
        ("owner_pid", ctypes.c_size_t),
    ]


class SharedDeviceStateV2(ctypes.Structure):
    _fields_ = [
        ("discriminant", ctypes.c_uint32),
        ("devices", DeviceEntryV2 * MAX_DEVICES),
        ("device_count", ctypes.c_uint32),
        ("last_heartbeat", ctypes.c_uint64),
        ("pids", PidSetMutex),
        ("pad", ctypes.c_uint8 * 512),
    ]


def _offset(struct: type[ctypes.Structure], name: str) -> int:
    return int(getattr(struct, name).offset)


DEVICE_ENTRY_SIZE = ctypes.sizeof(DeviceEntryV2)
DEVICES_OFFSET = _offset(SharedDeviceStateV2, "devices")
DEVICE_COUNT_OFFSET = _offset(SharedDeviceStateV2, "device_count")
HEARTBEAT_OFFSET = _offset(SharedDeviceStateV2, "last_heartbeat")
PIDS_OFFSET = _offset(SharedDeviceStateV2, "pids")
PAD_OFFSET = _offset(SharedDeviceStateV2, "pad")

#: offsets inside one DeviceEntryV2
DEVICE_FIELDS = {spec[0]: _offset(DeviceEntryV2, spec[0]) for spec in DeviceEntryV2._fields_}
#: offsets of the PID set's words, from the start of the file
PID_LOCK_OFFSET = PIDS_OFFSET + _offset(PidSetMutex, "lock_holder_pid")
PID_VALUES_OFFSET = PIDS_OFFSET + _offset(PidSetMutex, "values")
PID_BITMAP_OFFSET = PIDS_OFFSET + _offset(PidSetMutex, "bitmap")
PID_LEN_OFFSET = PIDS_OFFSET + _offset(PidSetMutex, "len")
PID_OWNER_OFFSET = PIDS_OFFSET + _offset(PidSetMutex, "owner_pid")


def device_offset(slot: int, field: str) -> int:
    """The file offset of `field` of the device entry in `slot` (0..15)."""
    if not 0 <= slot < MAX_DEVICES:
        raise ValueError(f"device slot {slot} is out of range; the layout has slots 0 to {MAX_DEVICES - 1}")
    return DEVICES_OFFSET + slot * DEVICE_ENTRY_SIZE + DEVICE_FIELDS[field]


def bitmap_bit(slot: int) -> tuple[int, int]:
    """(word index, mask) of PID-set slot `slot`: most significant bit first within each word."""
    return slot // 64, (1 << 63) >> (slot & 63)


assert ctypes.sizeof(SharedDeviceStateV2) == FILE_SIZE, ctypes.sizeof(SharedDeviceStateV2)
