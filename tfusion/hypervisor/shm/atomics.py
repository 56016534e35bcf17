"""Atomic 32- and 64-bit loads, stores and compare-and-swap on shared memory, from Python.

Why: the in-container limiter (Rust/C) reads and writes the same shm words with atomic
instructions, subtracting tokens and taking the PID-set lock with compare-and-swap. Python has no
atomics of its own, and a plain `struct.pack_into` writes a little-endian u64 byte by byte, which
a concurrent reader could see half-written. So every access goes through GCC's atomic runtime,
`libatomic.so.1` (`__atomic_load_N`, `__atomic_store_N`, `__atomic_compare_exchange_N`), called
with ctypes on the mapped address. For naturally aligned 4- and 8-byte words on x86-64 and arm64
these are the lock-free instructions (`mov`/`lock cmpxchg`, `ldar`/`stlr`/`casal`) that the
limiter's own atomics use, so the two sides interoperate; every call is sequentially consistent.

Where libatomic is missing, `NativeAtomics` is not available and `FallbackAtomics` is used (a
warning is logged): aligned loads and stores through ctypes' native-width fields (one machine
store each, so still untorn on these platforms) and a compare-and-swap that is atomic only among
this process's threads. The hypervisor is then correct on its own side, but a limiter racing on
the token word or the lock word could lose an update; install libatomic1 to avoid that.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading
from typing import Any, Protocol

log = logging.getLogger(__name__)

SEQ_CST = 5  # __ATOMIC_SEQ_CST


class Atomics(Protocol):
    """Atomic access to the words at absolute addresses (inside a live mapping)."""

    name: str

    def load32(self, address: int) -> int: ...

    def store32(self, address: int, value: int) -> None: ...

    def load64(self, address: int) -> int: ...

    def store64(self, address: int, value: int) -> None: ...

    def cas64(self, address: int, expected: int, desired: int) -> tuple[bool, int]:
        """Swap in `desired` if the word holds `expected`; (swapped, value seen)."""
        ...


def _symbol(lib: ctypes.CDLL, name: str) -> Any:
    # getattr, not `lib.__name`: inside a class body Python would mangle the double underscore
    return getattr(lib, name)


class NativeAtomics:
    """libatomic's functions (see the module docstring)."""

    name = "libatomic"

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._load32 = _symbol(lib, "__atomic_load_4")
        self._load32.argtypes = [ctypes.c_void_p, ctypes.c_int]
        self._load32.restype = ctypes.c_uint32
        self._store32 = _symbol(lib, "__atomic_store_4")
        self._store32.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int]
        self._store32.restype = None
        self._load64 = _symbol(lib, "__atomic_load_8")
        self._load64.argtypes = [ctypes.c_void_p, ctypes.c_int]
        self._load64.restype = ctypes.c_uint64
        self._store64 = _symbol(lib, "__atomic_store_8")
        self._store64.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int]
        self._store64.restype = None
        self._cas64 = _symbol(lib, "__atomic_compare_exchange_8")
        self._cas64.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int, ctypes.c_int]
        self._cas64.restype = ctypes.c_bool

    def load32(self, address: int) -> int:
        return int(self._load32(address, SEQ_CST))

    def store32(self, address: int, value: int) -> None:
        self._store32(address, value, SEQ_CST)

    def load64(self, address: int) -> int:
        return int(self._load64(address, SEQ_CST))

    def store64(self, address: int, value: int) -> None:
        self._store64(address, value, SEQ_CST)

    def cas64(self, address: int, expected: int, desired: int) -> tuple[bool, int]:
        seen = ctypes.c_uint64(expected)
        swapped = bool(self._cas64(address, ctypes.addressof(seen), desired, SEQ_CST, SEQ_CST))
        return swapped, int(seen.value)


class FallbackAtomics:
    """Untorn aligned loads and stores, and a CAS atomic only within this process."""

    name = "fallback (no libatomic: compare-and-swap is not atomic against the limiter)"

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def load32(self, address: int) -> int:
        return int(ctypes.c_uint32.from_address(address).value)

    def store32(self, address: int, value: int) -> None:
        ctypes.c_uint32.from_address(address).value = value

    def load64(self, address: int) -> int:
        return int(ctypes.c_uint64.from_address(address).value)

    def store64(self, address: int, value: int) -> None:
        ctypes.c_uint64.from_address(address).value = value

    def cas64(self, address: int, expected: int, desired: int) -> tuple[bool, int]:
        with self._lock:
            word = ctypes.c_uint64.from_address(address)
            seen = int(word.value)
            if seen != expected:
                return False, seen
            word.value = desired
            return True, seen


_ATOMICS: Atomics | None = None


def atomics() -> Atomics:
    """The process's atomics: libatomic when it loads, else the fallback (logged once)."""
    global _ATOMICS
    if _ATOMICS is None:
        _ATOMICS = _load()
    return _ATOMICS


def _load() -> Atomics:
    for name in ("libatomic.so.1", ctypes.util.find_library("atomic")):
        if not name:
            continue
        try:
            return NativeAtomics(ctypes.CDLL(name))
        except (OSError, AttributeError):
            continue
    log.warning("libatomic.so.1 not found: shared-memory compare-and-swap is atomic only inside the "
                "hypervisor; install libatomic1 so token updates and the PID-set lock are atomic "
                "against the in-container limiter")
    return FallbackAtomics()
