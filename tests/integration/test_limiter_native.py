"""tfusion's limiter (`native/limiter/libcuda_limiter.so`) preloaded into CUDA programs that run
on a fake driver: the shared-memory file is the real one the hypervisor's code writes, the programs
call the driver directly or the way the CUDA 12 runtime does (dlopen + cuGetProcAddress)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import fake_cuda, fake_nvml
from tfusion.hypervisor.shm import layout
from tfusion.hypervisor.shm.state import DeviceConfig, SharedState
from tfusion.hypervisor.shm.store import ShmStore

pytestmark = pytest.mark.skipif(fake_cuda.gcc() is None or fake_cuda.make() is None,
                                reason="building the limiter needs gcc and make")

MIB = 1 << 20
LIMIT = 10 * MIB
CORES = 128
HOW = ["linked", "runtime"]
KINDS = ["plain", "managed", "pitch", "async", "pool", "create", "array", "array3d"]


@pytest.fixture(scope="module")
def binaries(tmp_path_factory: pytest.TempPathFactory) -> fake_cuda.Binaries:
    return fake_cuda.build(tmp_path_factory.mktemp("limiter"))


@pytest.fixture
def shm(tmp_path: Path) -> Iterator[SharedState]:
    state = ShmStore(tmp_path / "shm").create("ns", "pod", [DeviceConfig(
        slot=0, uuid=fake_cuda.DEVICE_UUID.format(0), up_limit=30, mem_limit=LIMIT, total_cuda_cores=CORES)])
    yield state
    state.close()


def env(binaries: fake_cuda.Binaries, shm: SharedState, **extra: str) -> dict[str, str]:
    return fake_cuda.environment(binaries, shm.path, **extra)


def alloc_args(kind: str, bytes_each: int, count: int, *more: str) -> list[str]:
    return ["alloc", kind, str(bytes_each), str(count), *more]


# --- memory ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("how", HOW)
def test_allocations_past_the_limit_fail_with_out_of_memory(binaries: fake_cuda.Binaries, shm: SharedState,
                                                            how: str) -> None:
    lines, _ = fake_cuda.run(binaries.probe(how), alloc_args("plain", MIB, 20), env(binaries, shm))
    assert lines[0] == {"granted": 10, "refused": 2}
    assert lines[1] == {"freed": 10, "free": LIMIT, "total": LIMIT, "result": 0}


@pytest.mark.parametrize("kind", KINDS)
def test_every_allocation_call_counts_against_the_limit(binaries: fake_cuda.Binaries, shm: SharedState,
                                                        kind: str) -> None:
    lines, _ = fake_cuda.run(binaries.probe_runtime, alloc_args(kind, MIB, 20), env(binaries, shm))
    assert lines[0] == {"granted": 10, "refused": 2}
    assert lines[1]["freed"] == 10
    assert lines[1]["free"] == LIMIT, "every free gave its bytes back"


def test_a_driver_that_hands_out_private_entry_points_is_still_limited(binaries: fake_cuda.Binaries,
                                                                       shm: SharedState) -> None:
    lines, _ = fake_cuda.run(binaries.probe_runtime, alloc_args("plain", MIB, 20),
                             env(binaries, shm, FAKE_CUDA_PRIVATE_ENTRY_POINTS="1"))
    assert lines[0] == {"granted": 10, "refused": 2}


def test_four_processes_of_one_pod_never_overshoot(binaries: fake_cuda.Binaries, shm: SharedState) -> None:
    probes = [fake_cuda.Probe(binaries.probe_linked, alloc_args("plain", MIB // 4, 1000, "hold"),
                              env(binaries, shm)) for _ in range(4)]
    try:
        first = [probe.line() for probe in probes]
        assert sum(line["granted"] for line in first) == LIMIT // (MIB // 4)
        assert all(line["refused"] == 2 for line in first)
    finally:
        for probe in probes:
            probe.release()
        for probe in probes:
            probe.finish()
    lines, _ = fake_cuda.run(binaries.probe_linked, ["info"], env(binaries, shm))
    assert lines[0]["free"] == LIMIT, "all four gave their bytes back"


def test_a_killed_process_bytes_are_reclaimed(binaries: fake_cuda.Binaries, shm: SharedState) -> None:
    holder = fake_cuda.Probe(binaries.probe_linked, alloc_args("plain", MIB, 8, "hold"), env(binaries, shm))
    assert holder.line() == {"granted": 8, "refused": 0}
    holder.process.send_signal(signal.SIGKILL)
    holder.process.wait(timeout=20)
    lines, _ = fake_cuda.run(binaries.probe_linked, alloc_args("plain", MIB, 20), env(binaries, shm))
    assert lines[0] == {"granted": 10, "refused": 2}


@pytest.mark.parametrize("how", HOW)
def test_mem_get_info_reports_the_pods_share(binaries: fake_cuda.Binaries, shm: SharedState, how: str) -> None:
    holder = fake_cuda.Probe(binaries.probe_linked, alloc_args("plain", MIB, 3, "hold"), env(binaries, shm))
    try:
        assert holder.line()["granted"] == 3
        lines, _ = fake_cuda.run(binaries.probe(how), ["info"], env(binaries, shm))
        assert lines[0] == {"free": LIMIT - 3 * MIB, "total": LIMIT, "result": 0}
    finally:
        holder.finish()


NVML_MEMORY = """
import json, pynvml
pynvml.nvmlInit()
out = []
for index in range(pynvml.nvmlDeviceGetCount()):
    memory = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index))
    out.append([memory.total, memory.used, memory.free])
print(json.dumps(out))
"""


def test_nvml_reports_the_pods_share_of_a_limited_device(binaries: fake_cuda.Binaries, tmp_path: Path) -> None:
    nvml = fake_nvml.build(tmp_path / "nvml")
    state = ShmStore(tmp_path / "nvml-shm").create("ns", "pod", [DeviceConfig(
        slot=0, uuid=fake_nvml.GPU0_UUID, up_limit=30, mem_limit=LIMIT)])
    try:
        state.set_pod_memory_used(0, 3 * MIB)

        def memory(preload: bool) -> list[list[int]]:
            env = fake_nvml.subprocess_env(nvml, TF_SHM_PATH=str(state.path))
            if preload:
                env["LD_PRELOAD"] = str(binaries.limiter)
            result = subprocess.run([sys.executable, "-c", NVML_MEMORY], env=env, capture_output=True, text=True,
                                    timeout=60)
            assert result.returncode == 0, result.stderr
            assert result.stderr == ""
            value = json.loads(result.stdout)
            assert isinstance(value, list)
            return value

        whole, shared = memory(False), memory(True)
        assert whole[0][0] > LIMIT
        assert shared[0] == [LIMIT, 3 * MIB, LIMIT - 3 * MIB]
        assert shared[1:] == whole[1:], "a device in no slot is reported as it is"
    finally:
        state.close()


# --- compute -----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("how", "kind", "grid", "block", "cost"), [
    ("linked", "kernel", 4, 256, 8), ("runtime", "kernel", 4, 256, 8), ("runtime", "ex", 1, 100, 1),
    ("linked", "cooperative", 2, 1024, 16), ("runtime", "graph", 64, 1024, 1)])
def test_launches_take_tokens_by_their_cost(binaries: fake_cuda.Binaries, shm: SharedState, how: str,
                                            kind: str, grid: int, block: int, cost: int) -> None:
    before = shm.device(0).tokens
    lines, _ = fake_cuda.run(binaries.probe(how), ["launch", "3", str(grid), str(block), kind], env(binaries, shm))
    assert lines[-1] == {"launched": 3}
    assert shm.device(0).tokens == pytest.approx(before - 3 * cost)


def test_per_thread_stream_variants_are_limited_too(binaries: fake_cuda.Binaries, shm: SharedState) -> None:
    per_thread = env(binaries, shm, PROBE_PER_THREAD="1")
    lines, _ = fake_cuda.run(binaries.probe_runtime, alloc_args("async", MIB, 20), per_thread)
    assert lines[0] == {"granted": 10, "refused": 2}
    assert lines[1]["free"] == LIMIT
    fake_cuda.run(binaries.probe_runtime, ["launch", "2", "4", "256", "kernel"], per_thread)
    assert shm.device(0).tokens == 100.0 - 2 * 8


def test_launches_wait_while_the_bucket_is_short(binaries: fake_cuda.Binaries, shm: SharedState) -> None:
    shm.update_tokens(0, lambda _: 0.0)
    probe = fake_cuda.Probe(binaries.probe_runtime, ["launch", "1", "4", "256"],
                            env(binaries, shm, PROBE_SAY_READY="1"))
    try:
        assert probe.line() == {"ready": True}
        assert probe.quiet_for(0.5), "a launch went with an empty bucket"
        shm.update_tokens(0, lambda _: 8.0)
        assert probe.line() == {"launched": 1}
        assert shm.device(0).tokens == 0.0
    finally:
        probe.process.kill()
        probe.process.wait(timeout=20)


def test_a_stale_heartbeat_stops_launches_until_it_is_fresh(binaries: fake_cuda.Binaries, shm: SharedState) -> None:
    shm.heartbeat(time.time() - 60)
    probe = fake_cuda.Probe(binaries.probe_linked, ["launch", "1", "1", "1"],
                            env(binaries, shm, TF_LIMITER_HEARTBEAT_GRACE_S="10", PROBE_SAY_READY="1"))
    try:
        assert probe.line() == {"ready": True}
        assert probe.quiet_for(0.5), "a launch went while the hypervisor was gone"
        assert shm.device(0).tokens == 100.0
        shm.heartbeat()
        assert probe.line() == {"launched": 1}
        assert shm.device(0).tokens == 99.0
    finally:
        probe.process.kill()
        probe.process.wait(timeout=20)


def test_a_bad_grace_period_is_named_and_the_default_used(binaries: fake_cuda.Binaries, shm: SharedState) -> None:
    lines, errors = fake_cuda.run(binaries.probe_linked, ["launch", "1", "1", "1"],
                                  env(binaries, shm, TF_LIMITER_HEARTBEAT_GRACE_S="soon"))
    assert lines == [{"launched": 1}]
    assert "TF_LIMITER_HEARTBEAT_GRACE_S=soon is not a positive whole number of seconds; using 10" in errors


# --- fail-safe ---------------------------------------------------------------------------------------

def _wrong_size(path: Path) -> None:
    with path.open("r+b") as f:
        f.truncate(layout.LEGACY_FILE_SIZE)


def _wrong_discriminant(path: Path) -> None:
    with path.open("r+b") as f:
        f.write((0).to_bytes(4, "little"))


@pytest.mark.parametrize(("case", "says"), [
    ("missing", "cannot open TF_SHM_PATH"), ("wrong-size", "35496 bytes"),
    ("wrong-discriminant", "discriminant 0"), ("disabled", "DISABLE_GPU_LIMITER=true"),
    ("unset", "TF_SHM_PATH is not set")])
def test_without_a_usable_file_the_process_runs_unlimited_and_says_so_once(
        binaries: fake_cuda.Binaries, shm: SharedState, case: str, says: str) -> None:
    path: Path | None = shm.path
    extra: dict[str, str] = {}
    if case == "missing":
        path = shm.path.with_name("absent")
    elif case == "wrong-size":
        _wrong_size(shm.path)
    elif case == "wrong-discriminant":
        _wrong_discriminant(shm.path)
    elif case == "disabled":
        extra["DISABLE_GPU_LIMITER"] = "true"
    else:
        path = None
    lines, errors = fake_cuda.run(binaries.probe_runtime, alloc_args("plain", MIB, 20),
                                  fake_cuda.environment(binaries, path, **extra))
    assert lines[0] == {"granted": 20, "refused": 0}
    assert len(errors.splitlines()) == 1, errors
    assert errors.startswith("tfusion-limiter[") and says in errors and "without GPU limits" in errors


def test_each_device_is_held_to_the_slot_that_names_its_uuid(binaries: fake_cuda.Binaries, tmp_path: Path) -> None:
    # the container's device 1 is the host's device 3: the slot is the host index, found by UUID
    state = ShmStore(tmp_path / "two").create("ns", "pod", [
        DeviceConfig(slot=0, uuid=fake_cuda.DEVICE_UUID.format(0), up_limit=30, mem_limit=LIMIT),
        DeviceConfig(slot=3, uuid=fake_cuda.DEVICE_UUID.format(1), up_limit=30, mem_limit=4 * MIB)])
    try:
        granted = {}
        for device in (0, 1):
            lines, _ = fake_cuda.run(binaries.probe_runtime, alloc_args("plain", MIB, 20),
                                     env(binaries, state, FAKE_CUDA_DEVICES="2", PROBE_DEVICE=str(device)))
            granted[device] = lines[0]["granted"]
    finally:
        state.close()
    assert granted == {0: 10, 1: 4}


def test_a_uuid_written_without_prefix_in_upper_case_still_matches(binaries: fake_cuda.Binaries,
                                                                   tmp_path: Path) -> None:
    bare = fake_cuda.DEVICE_UUID.format(0).removeprefix("GPU-").upper()
    state = ShmStore(tmp_path / "bare").create("ns", "pod", [DeviceConfig(
        slot=0, uuid=bare, up_limit=30, mem_limit=LIMIT)])
    try:
        lines, errors = fake_cuda.run(binaries.probe_linked, alloc_args("plain", MIB, 20), env(binaries, state))
    finally:
        state.close()
    assert lines[0] == {"granted": 10, "refused": 2}
    assert errors == ""


def test_a_device_in_no_slot_is_not_limited_and_said_once(binaries: fake_cuda.Binaries, tmp_path: Path) -> None:
    state = ShmStore(tmp_path / "other").create("ns", "pod", [DeviceConfig(
        slot=0, uuid="GPU-00000000-0000-4000-8000-00000000ffff", up_limit=30, mem_limit=LIMIT)])
    try:
        lines, errors = fake_cuda.run(binaries.probe_linked, alloc_args("plain", MIB, 20), env(binaries, state))
    finally:
        state.close()
    assert lines[0] == {"granted": 20, "refused": 0}
    assert len(errors.splitlines()) == 1 and "is in no slot" in errors, errors


def test_a_program_that_never_calls_cuda_is_left_alone(binaries: fake_cuda.Binaries) -> None:
    result = subprocess.run(["/bin/sh", "-c", "echo hi"], env=fake_cuda.environment(binaries, None),
                            capture_output=True, text=True, timeout=20)
    assert (result.returncode, result.stdout, result.stderr) == (0, "hi\n", "")


def test_dlsym_rtld_next_still_means_after_the_caller(binaries: fake_cuda.Binaries, shm: SharedState) -> None:
    lines, _ = fake_cuda.run(binaries.probe_linked, ["next-dlsym"], env(binaries, shm))
    assert lines == [{"next_is_interposer": True}]


def test_the_library_needs_only_libc(binaries: fake_cuda.Binaries) -> None:
    readelf = subprocess.run(["readelf", "-d", str(binaries.limiter)], capture_output=True, text=True, timeout=20)
    if readelf.returncode != 0:
        pytest.skip(f"readelf is not usable here: {readelf.stderr.strip()}")
    needed = {line.split("[", 1)[1].rstrip("]") for line in readelf.stdout.splitlines() if "(NEEDED)" in line}
    assert needed <= {"libc.so.6", "libdl.so.2", "libpthread.so.0"}, needed
    assert os.access(binaries.limiter, os.R_OK)
