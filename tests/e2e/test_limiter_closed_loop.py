"""The compute limit's closed loop, without a GPU: a `--backend=local --devices=nvml` hypervisor on
the fake NVML, soft workers running the probe under `libcuda_limiter.so` on the fake CUDA driver.

The loop under test: the probe launches as fast as the limiter lets it; each launch advances the
simulated device's busy-time clock (a file the fake driver writes); the fake NVML reports the
utilisation (device and per process) from that clock; the hypervisor's ERL reads it every 500 ms and
refills the worker's token bucket in its shared-memory file; the limiter takes a token per launch.
The tests measure the busy share from the clock themselves, over a window after the loop settled.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests import fake_cuda, fake_nvml
from tests.fake_cuda import busy_clock
from tests.helpers.hypervisor_process import free_port, start, stop, wait_ready
from tfusion.hypervisor.shm.store import ShmStore

#: one launch of 1 x 1 thread costs 1 token and keeps the simulated device busy for 100 µs
LAUNCH_NS = 100_000
GRACE_S = 2
SETTLE_DEADLINE_S = 90.0
SETTLED_WITHIN = 5.0  # percentage points
GIB = 1 << 30


@dataclass
class Machine:
    """A simulated GPU box: the built fakes, the limiter and one hypervisor process at a time."""

    root: Path
    binaries: fake_cuda.Binaries
    nvml: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    worker_pids: list[int] = field(default_factory=list)
    starts: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def clock(self) -> Path:
        return self.root / "busy-clock"

    def start_hypervisor(self) -> None:
        self.starts += 1
        log = self.root / f"hypervisor-{self.starts}.log"
        self.proc = start(["--role=hypervisor", "--backend=local", "--devices=nvml", "--port", str(self.port),
                           "--state-dir", str(self.root / "state"), "--metrics-output-path", str(self.root / "m.log"),
                           "--node-name", "box", "--limiter-library", str(self.binaries.limiter)], log,
                          env=fake_nvml.subprocess_env(self.nvml, FAKE_GPU_BUSY_CLOCK=str(self.clock),
                                                       FAKE_NVML_GPU_COUNT="1"))
        wait_ready(self.proc, self.url, log)

    def kill_hypervisor(self) -> None:
        """SIGKILL: no clean shutdown, its workers keep running (as after a crash)."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=10)

    def device(self) -> str:
        devices = httpx.get(f"{self.url}/api/v1/devices").json()["data"]
        assert devices[0]["UUID"] == fake_nvml.GPU0_UUID.lower()
        return str(devices[0]["UUID"])

    def worker_env(self) -> dict[str, str]:
        """What a local soft worker needs to run on the simulated device (the hypervisor preloads the
        limiter: --limiter-library)."""
        return {"LD_LIBRARY_PATH": str(self.binaries.driver_dir),
                "FAKE_CUDA_UUIDS": fake_nvml.GPU0_UUID, "FAKE_GPU_BUSY_CLOCK": str(self.clock),
                "FAKE_CUDA_NS_PER_THREAD": str(LAUNCH_NS), "TF_LIMITER_HEARTBEAT_GRACE_S": str(GRACE_S)}

    def create_worker(self, name: str, percent: int, command: str, vram: str = "4Gi") -> dict[str, Any]:
        share = {"computePercent": str(percent), "vram": vram}
        created = httpx.post(f"{self.url}/api/v1/workers", json={
            "name": name, "requests": share, "limits": share, "gpuIds": [self.device()], "isolation": "soft",
            "command": command, "env": self.worker_env()})
        assert created.status_code == 201, created.text
        info: dict[str, Any] = created.json()["data"]["WorkerInfo"]
        self.worker_pids.append(int(info["WorkerRunningInfo"]["pid"]))
        return info

    def saturate(self) -> str:
        return f"{self.binaries.probe_runtime} saturate 1 1"

    def close(self) -> None:
        if self.proc is not None:
            stop(self.proc)
        for pid in self.worker_pids:  # those a killed hypervisor left behind
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[fake_cuda.Binaries, Path]:
    if fake_cuda.gcc() is None or fake_cuda.make() is None:
        pytest.skip("no C compiler or make on PATH: cannot build the limiter and the fakes")
    out = tmp_path_factory.mktemp("closed-loop-build")
    return fake_cuda.build(out / "cuda"), fake_nvml.build(out / "nvml")


@pytest.fixture
def machine(tmp_path: Path, built: tuple[fake_cuda.Binaries, Path]) -> Iterator[Machine]:
    box = Machine(tmp_path, *built)
    box.start_hypervisor()
    yield box
    box.close()


def settle(measure: Callable[[], float], target: float, what: str) -> list[float]:
    """Measure 2 s windows until one lands within SETTLED_WITHIN of `target`; the windows seen."""
    seen: list[float] = []
    deadline = time.monotonic() + SETTLE_DEADLINE_S
    while time.monotonic() < deadline:
        seen.append(round(measure(), 1))
        if abs(seen[-1] - target) <= SETTLED_WITHIN:
            return seen
    pytest.fail(f"{what} did not settle at {target} % within {SETTLE_DEADLINE_S} s: 2 s windows {seen}")


def test_the_simulated_device_is_at_most_fully_busy(tmp_path: Path, built: tuple[fake_cuda.Binaries, Path]) -> None:
    """Without the limiter a process asking for all the compute gets the whole device, and no more:
    the device runs one launch at a time and a full launch queue makes the launcher wait."""
    binaries, _ = built
    clock = tmp_path / "busy-clock"
    env = {**os.environ, "LD_LIBRARY_PATH": str(binaries.driver_dir), "FAKE_GPU_BUSY_CLOCK": str(clock),
           "FAKE_CUDA_NS_PER_THREAD": str(LAUNCH_NS)}
    env.pop("LD_PRELOAD", None)
    probe = subprocess.Popen([str(binaries.probe_runtime), "saturate", "1", "1"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        seen = settle(lambda: busy_clock.measure(clock, 2.0, pids={probe.pid}), 100, "the unlimited process")
        assert all(window <= 100 + SETTLED_WITHIN for window in seen), seen
    finally:
        probe.kill()
        probe.wait(timeout=10)


def test_a_local_soft_worker_is_refused_past_its_vram_and_settles_at_its_compute_share(machine: Machine) -> None:
    """The issue's done-when: a 4 GiB / 30 % worker under the limiter, asking for 5 GiB, then all
    the compute it can get."""
    alloc_out = machine.root / "alloc.json"
    probe = machine.binaries.probe_runtime
    info = machine.create_worker("trainer", 30, f"sh -c '{probe} alloc plain {5 * GIB} 1 > {alloc_out}; "
                                                f"{probe} alloc plain {GIB} 3 >> {alloc_out}; "
                                                f"exec {probe} saturate 1 1'")
    pid = int(info["WorkerRunningInfo"]["pid"])
    settle(lambda: busy_clock.measure(machine.clock, 2.0, pids={pid}), 30, "the 30 % worker")
    lines = [json.loads(line) for line in alloc_out.read_text().splitlines()]
    assert lines[0] == {"granted": 0, "refused": 2}  # 5 GiB > 4 GiB: CUDA_ERROR_OUT_OF_MEMORY
    assert lines[2] == {"granted": 3, "refused": 0}
    settled = busy_clock.measure(machine.clock, 10.0, pids={pid})
    assert abs(settled - 30) <= SETTLED_WITHIN, f"{settled:.1f} % over 10 s after settling"


def test_two_workers_on_one_device_keep_their_ratio(machine: Machine) -> None:
    """30 % and 60 % on one device: each is steered by its own processes' utilisation, so neither is
    pushed down by the other's load."""
    low = int(machine.create_worker("low", 30, machine.saturate())["WorkerRunningInfo"]["pid"])
    high = int(machine.create_worker("high", 60, machine.saturate())["WorkerRunningInfo"]["pid"])

    def both() -> tuple[float, float]:
        before = busy_clock.read(machine.clock)
        time.sleep(2.0)
        after = busy_clock.read(machine.clock)
        return busy_clock.percent(before, after, 0, {low}), busy_clock.percent(before, after, 0, {high})

    seen: list[tuple[float, float]] = []
    deadline = time.monotonic() + SETTLE_DEADLINE_S
    while not seen or abs(seen[-1][0] - 30) > SETTLED_WITHIN or abs(seen[-1][1] - 60) > SETTLED_WITHIN:
        assert time.monotonic() < deadline, f"(30 %, 60 %) did not settle; 2 s windows {seen}"
        low_window, high_window = both()
        seen.append((round(low_window, 1), round(high_window, 1)))
    before = busy_clock.read(machine.clock)
    time.sleep(10.0)
    after = busy_clock.read(machine.clock)
    low_pct, high_pct = busy_clock.percent(before, after, 0, {low}), busy_clock.percent(before, after, 0, {high})
    assert abs(low_pct - 30) <= SETTLED_WITHIN and abs(high_pct - 60) <= SETTLED_WITHIN, (low_pct, high_pct)
    assert 1.6 <= high_pct / low_pct <= 2.5, (low_pct, high_pct)


def test_launches_stop_when_the_hypervisor_dies_and_resume_when_it_returns(machine: Machine) -> None:
    pid = int(machine.create_worker("job", 30, machine.saturate())["WorkerRunningInfo"]["pid"])
    settle(lambda: busy_clock.measure(machine.clock, 2.0, pids={pid}), 30, "the 30 % worker")

    machine.kill_hypervisor()
    state = ShmStore(machine.root / "state" / "shm").open("default", "job")
    try:
        deadline = time.monotonic() + 30
        while time.time() - state.last_heartbeat <= GRACE_S + 1:  # whole seconds in the file
            assert time.monotonic() < deadline, "the heartbeat did not age"
            time.sleep(0.2)
        # past the grace period a full bucket does not help: the limiter hands out nothing
        capacity = state.device(0).capacity
        assert capacity > 0
        state.update_tokens(0, lambda _: capacity)
        assert busy_clock.measure(machine.clock, 2.0, pids={pid}) == 0.0
        assert state.device(0).tokens == capacity
    finally:
        state.close()

    machine.start_hypervisor()  # same state dir: the worker is adopted, its file kept, the heartbeat fresh
    settle(lambda: busy_clock.measure(machine.clock, 2.0, pids={pid}), 30, "the worker after the restart")
