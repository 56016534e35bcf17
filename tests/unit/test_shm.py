"""The soft limiter's shared-memory file on a real temp file: the V2 offsets as documented, create /
open / ensure without truncating, refused names and sizes, the PID set and its lock (including a dead
holder), and what a C program reading the same file sees."""

from __future__ import annotations

import os
import struct
import subprocess
import threading
from pathlib import Path

import pytest

from tests import c as creader
from tfusion.hypervisor.shm import layout
from tfusion.hypervisor.shm.state import DeviceConfig, ShmError, ShmLockTimeout
from tfusion.hypervisor.shm.store import ACCOUNTING_FILE, ShmPathError, ShmStore

A100 = DeviceConfig(slot=0, uuid="GPU-5f3a1c2e-0000-4000-8000-000000000a00", up_limit=30, mem_limit=16 << 30,
                    total_cuda_cores=6912)
H100 = DeviceConfig(slot=2, uuid="GPU-9b1d7e44-1111-4111-8111-000000000b01", up_limit=100, mem_limit=80 << 30)


@pytest.fixture(scope="module")
def reader(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if creader.gcc() is None:
        pytest.skip("no C compiler")
    return creader.build(tmp_path_factory.mktemp("shm-reader"))


def test_offsets_are_the_documented_v2_layout() -> None:
    assert layout.FILE_SIZE == 35504 and layout.DEVICE_ENTRY_SIZE == 136
    assert (layout.DEVICES_OFFSET, layout.DEVICE_COUNT_OFFSET, layout.HEARTBEAT_OFFSET, layout.PIDS_OFFSET,
            layout.PAD_OFFSET) == (8, 2184, 2192, 2200, 34992)
    assert layout.DEVICE_FIELDS == {"uuid": 0, "up_limit": 64, "mem_limit": 72, "total_cuda_cores": 80,
                                    "pod_memory_used": 88, "erl_token_refill_rate": 96, "erl_token_capacity": 104,
                                    "erl_current_tokens": 112, "erl_last_token_update": 120, "is_active": 128}
    assert (layout.PID_LOCK_OFFSET, layout.PID_VALUES_OFFSET, layout.PID_BITMAP_OFFSET, layout.PID_LEN_OFFSET,
            layout.PID_OWNER_OFFSET) == (2200, 2208, 18592, 34976, 34984)
    assert layout.device_offset(15, "is_active") == 8 + 15 * 136 + 128
    assert layout.bitmap_bit(0) == (0, 1 << 63) and layout.bitmap_bit(65) == (1, 1 << 62)
    with pytest.raises(ValueError, match="slot 16 is out of range"):
        layout.device_offset(16, "uuid")


def test_create_writes_the_initial_state_little_endian(tmp_path: Path) -> None:
    store = ShmStore(tmp_path)
    state = store.create("ml", "train-0", [A100, H100])
    raw = (tmp_path / "ml" / "train-0" / "shm").read_bytes()
    assert len(raw) == 35504
    assert struct.unpack_from("<I", raw, 0)[0] == 1
    assert struct.unpack_from("<I", raw, 2184)[0] == 2
    assert raw[8:8 + 64].rstrip(b"\0") == A100.uuid.encode()
    assert struct.unpack_from("<IxxxxQI", raw, 8 + 64) == (30, 16 << 30, 6912)
    assert struct.unpack_from("<dddd", raw, 8 + 96)[:3] == (10.0, 100.0, 100.0)
    assert struct.unpack_from("<I", raw, 8 + 2 * 136 + 128)[0] == 1
    assert struct.unpack_from("<I", raw, 8 + 1 * 136 + 128)[0] == 0  # slot 1 unused
    assert abs(struct.unpack_from("<Q", raw, 2192)[0] - state.last_heartbeat) == 0 and state.last_heartbeat > 0
    assert os.stat(state.path).st_mode & 0o777 == 0o600  # no owner given: root (the hypervisor) only
    state.close()


def test_open_never_truncates_and_refuses_other_layouts(tmp_path: Path) -> None:
    store = ShmStore(tmp_path)
    first = store.create("ml", "p", [A100])
    first.update_tokens(0, lambda _: 42.0)
    first.close()
    again, created = store.ensure("ml", "p", [H100])
    assert not created and again.device(0).tokens == 42.0 and again.device(0).uuid == A100.uuid
    again.close()

    legacy = tmp_path / "ml" / "legacy" / "shm"
    legacy.parent.mkdir(parents=True)
    legacy.write_bytes(b"\0" * 35496)
    with pytest.raises(ShmError, match="legacy V1 layout"):
        store.ensure("ml", "legacy", [A100])
    assert legacy.stat().st_size == 35496  # not "repaired"
    odd = tmp_path / "ml" / "odd" / "shm"
    odd.parent.mkdir(parents=True)
    odd.write_bytes(b"\1" * 100)
    with pytest.raises(ShmError, match="100 bytes"):
        store.ensure("ml", "odd", [A100])
    v1 = tmp_path / "ml" / "v1" / "shm"
    v1.parent.mkdir(parents=True)
    v1.write_bytes(b"\0" * 35504)
    with pytest.raises(ShmError, match="discriminant 0"):
        store.open("ml", "v1")
    with pytest.raises(FileNotFoundError):
        store.open("ml", "missing")


@pytest.mark.parametrize(("namespace", "pod"), [("a/b", "p"), ("ns", "..") , ("ns", "x..y"), ("ns", "a\\b"),
                                                 ("", "p"), ("ns", "")])
def test_names_that_are_not_one_path_component_are_refused(tmp_path: Path, namespace: str, pod: str) -> None:
    with pytest.raises(ShmPathError, match=r"no '/', '\\' or '\.\.'"):
        ShmStore(tmp_path).create(namespace, pod, [A100])
    assert list(tmp_path.iterdir()) == []


def test_limits_follow_the_allocation(tmp_path: Path) -> None:
    state = ShmStore(tmp_path).create("ml", "p", [A100])
    state.update_tokens(0, lambda _: 7.0)
    assert state.apply_limits([A100]) is False
    assert state.apply_limits([DeviceConfig(0, A100.uuid, 50, 8 << 30), H100]) is True
    assert state.device(0).up_limit == 50 and state.device(0).mem_limit == 8 << 30
    assert state.device(0).tokens == 7.0  # a changed limit keeps the bucket the limiter is using
    assert state.device(2).is_active and state.device(2).tokens == 100.0 and state.device_count == 2
    assert state.apply_limits([H100]) is True
    assert not state.device(0).is_active and state.device(0).tokens == 0.0 and state.active_slots() == [2]
    state.close()


def test_pid_set_add_remove_and_lock(tmp_path: Path) -> None:
    state = ShmStore(tmp_path).create("ml", "p", [A100])
    assert state.add_pid(4242) and state.add_pid(7) and not state.add_pid(4242)
    assert state.pids() == [7, 4242] and state.u64(layout.PID_LEN_OFFSET) == 2
    assert state.remove_pids(lambda pid: pid == 4242) == [4242]
    assert state.pids() == [7] and state.u64(layout.PID_LEN_OFFSET) == 1
    assert state.u64(layout.PID_LOCK_OFFSET) == 0  # released after each use

    # a live holder: we wait, then give up with a clear error
    state.set_u64(layout.PID_LOCK_OFFSET, os.getppid())
    with pytest.raises(ShmLockTimeout, match=f"held by live process {os.getppid()}"), state.pid_lock(timeout=0.05):
        pass
    # a dead holder is reclaimed
    child = subprocess.Popen(["true"])
    child.wait()
    state.set_u64(layout.PID_LOCK_OFFSET, child.pid)
    assert state.add_pid(99) and state.u64(layout.PID_LOCK_OFFSET) == 0
    state.close()


def test_token_updates_are_atomic_against_concurrent_takers(tmp_path: Path) -> None:
    state = ShmStore(tmp_path).create("ml", "p", [A100])
    state.update_tokens(0, lambda _: 0.0)
    rounds = 2000

    def add() -> None:
        for _ in range(rounds):
            state.update_tokens(0, lambda t: t + 1.0)

    threads = [threading.Thread(target=add) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert state.device(0).tokens == 4 * rounds
    state.close()


def test_the_c_reader_sees_what_python_wrote(tmp_path: Path, reader: Path) -> None:
    state = ShmStore(tmp_path).create("ml", "p", [A100, H100])
    state.set_pod_memory_used(2, 3 << 30)
    state.set_bucket(0, 33.5, 200.0)
    state.add_pid(4242)
    seen = creader.run(reader, state.path)
    assert seen["discriminant"] == 1 and seen["device_count"] == 2 and seen["last_heartbeat"] == state.last_heartbeat
    assert [d["slot"] for d in seen["devices"]] == [0, 2]
    first, second = seen["devices"]
    assert (first["uuid"], first["up_limit"], first["mem_limit"], first["total_cuda_cores"]) == (
        A100.uuid, 30, 16 << 30, 6912)
    assert (first["refill_rate"], first["capacity"], first["tokens"]) == (33.5, 200.0, 100.0)
    assert second["pod_memory_used"] == 3 << 30 and second["uuid"] == H100.uuid
    assert seen["pids"] == [4242] and seen["pid_len"] == 1 and seen["pid_owner"] == os.getpid()

    assert creader.run(reader, state.path, "take", 0, 60) == {"taken": True, "before": 100.0, "after": 40.0}
    assert creader.run(reader, state.path, "take", 0, 60)["taken"] is False
    assert state.device(0).tokens == 40.0
    assert creader.run(reader, state.path, "pids")["pids"] == [4242]
    # the C side exits holding the lock: Python reclaims it from the dead holder
    holder = creader.run(reader, state.path, "lock-and-exit")["holder"]
    assert state.u64(layout.PID_LOCK_OFFSET) == holder
    assert state.add_pid(5) and state.pids() == [5, 4242]
    state.close()


def test_remove_and_strays(tmp_path: Path) -> None:
    store = ShmStore(tmp_path)
    for pod in ("a", "b"):
        store.create("ml", pod, [A100]).close()
    store.create("other", "c", [A100]).close()
    assert store.listed() == [("ml", "a"), ("ml", "b"), ("other", "c")]
    assert store.strays({("ml", "a")}) == [("ml", "b"), ("other", "c")]
    assert store.remove("other", "c") and not (tmp_path / "other").exists()
    assert store.remove("ml", "b") and (tmp_path / "ml" / "a" / "shm").exists()
    assert not store.remove("ml", "b")


def test_remove_takes_the_limiters_accounting_file_with_it(tmp_path: Path) -> None:
    store = ShmStore(tmp_path)
    store.create("ml", "a", [A100]).close()
    (tmp_path / "ml" / "a" / ACCOUNTING_FILE).write_bytes(b"\0" * 16)
    assert store.remove("ml", "a") and not (tmp_path / "ml").exists()
