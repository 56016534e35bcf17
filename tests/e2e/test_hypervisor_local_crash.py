"""kill -9 of `tfusion --role=hypervisor --backend=local`: a worker's command never runs twice and
nothing is left running that tfusion does not track.

The worker is a shell that appends its PID to a file, starts a `sleep` child (so its process group
has two members) and waits. After each kill -9 and restart, exactly one copy must be alive and it
must be the one the hypervisor reports; deleting the worker, and SIGTERM, must leave no member of
its group behind. Liveness is read from /proc (a zombie is not alive).
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import wait_until
from tests.helpers.hypervisor_process import free_port, start, stop, wait_ready

WAIT_S = 20.0


def alive(pid: int) -> bool:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return raw.rpartition(")")[2].split()[0] not in ("Z", "X")


def group_members(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def marked_processes(state: Path) -> list[int]:
    """Processes carrying this state dir's worker marker (TF_LOCAL_WORKER=<state-dir>#<uid>)."""
    prefix = f"TF_LOCAL_WORKER={state.resolve()}#".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if any(item.startswith(prefix) for item in environ.split(b"\0")) and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def pids_in(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()] if path.exists() else []


class Box:
    """One state dir and port; hypervisors are started on it one after another."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.state = tmp_path / "state"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> subprocess.Popen[bytes]:
        self.starts += 1
        log = self.tmp / f"hypervisor-{self.starts}.log"
        self.proc = start(["--role=hypervisor", "--backend=local", "--devices=sim:1xA100-SXM4-80GB",
                           "--port", str(self.port), "--state-dir", str(self.state),
                           "--metrics-output-path", str(self.tmp / "metrics.log"), "--node-name", "crash-box"], log)
        wait_ready(self.proc, self.url, log)
        return self.proc

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def worker(self, name: str) -> dict[str, Any]:
        response = httpx.get(f"{self.url}/api/v1/workers/{name}", timeout=10)
        assert response.status_code == 200, response.text
        info: dict[str, Any] = response.json()["data"]["allocation"]["WorkerInfo"]
        return info

    def create(self, name: str) -> tuple[Path, Path]:
        """A worker whose shell logs its PID to <name>.pids and its sleep child's to <name>.kids."""
        pids, kids = self.tmp / f"{name}.pids", self.tmp / f"{name}.kids"
        script = f"echo $$ >> {pids}; sleep 600 & echo $! >> {kids}; wait"
        created = httpx.post(f"{self.url}/api/v1/workers", timeout=10, json={
            "name": name, "requests": {"tflops": "10", "vram": "1Gi"}, "command": ["sh", "-c", script]})
        assert created.status_code == 201, created.text
        wait_until(lambda: len(pids_in(kids)) == 1, WAIT_S, f"{name} started")
        return pids, kids


@pytest.fixture
def box(tmp_path: Path) -> Iterator[Box]:
    box = Box(tmp_path)
    yield box
    if box.proc is not None:
        stop(box.proc)
    for pid in marked_processes(box.state):  # a failed test must not leave workers behind
        try:
            os.killpg(os.getpgid(pid), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def assert_runs_once(box: Box, name: str, pids: Path, kids: Path) -> int:
    """Exactly one copy of the worker's shell (and of its child) is alive, and it is the one reported."""
    live = [pid for pid in pids_in(pids) if alive(pid)]
    assert len(live) == 1, f"{name}: live copies {live} of {pids_in(pids)}"
    assert len([pid for pid in pids_in(kids) if alive(pid)]) == 1
    running = box.worker(name)["WorkerRunningInfo"]
    assert running["isRunning"] and running["pid"] == live[0]
    assert sorted(group_members(live[0])) == sorted([live[0], pids_in(kids)[-1]])
    return live[0]


def test_kill_9_cycles_neither_double_run_nor_orphan(box: Box) -> None:
    box.start()
    pids, kids = box.create("w1")
    first = assert_runs_once(box, "w1", pids, kids)

    for _ in range(2):  # kill -9, restart: the running group is adopted, not started again
        box.kill9()
        assert alive(first), "kill -9 of the hypervisor alone does not stop the worker"
        box.start()
        assert assert_runs_once(box, "w1", pids, kids) == first
        assert pids_in(pids) == [first]

    # the adopted process exits: the hypervisor notices (it is not its child) and restarts it once
    os.killpg(first, signal.SIGKILL)
    wait_until(lambda: len(pids_in(pids)) == 2 and len(pids_in(kids)) == 2, WAIT_S,
               "the adopted worker running again")
    second = assert_runs_once(box, "w1", pids, kids)
    assert box.worker("w1")["WorkerRunningInfo"]["restarts"] == 1

    box.kill9()  # a restarted (not adopted) group is recorded too
    box.start()
    assert assert_runs_once(box, "w1", pids, kids) == second

    deleted = httpx.delete(f"{box.url}/api/v1/workers/w1", timeout=30)  # by name
    assert deleted.status_code == 200, deleted.text
    assert not [pid for pid in pids_in(pids) + pids_in(kids) if alive(pid)]
    assert group_members(second) == [] and marked_processes(box.state) == []

    pids2, kids2 = box.create("w2")
    box.kill9()
    box.start()
    leader = assert_runs_once(box, "w2", pids2, kids2)
    assert box.proc is not None
    assert stop(box.proc) == 0  # SIGTERM: every worker group goes down with the hypervisor
    assert not [pid for pid in pids_in(pids2) + pids_in(kids2) if alive(pid)]
    assert group_members(leader) == [] and marked_processes(box.state) == []


def test_a_process_left_with_our_marker_is_stopped_at_start(box: Box) -> None:
    """kill -9 between starting a worker and recording its group: the process still carries the
    state dir's marker, and the next start stops it (here: one that escaped into its own session)."""
    box.state.mkdir()
    env = {**os.environ, "TF_LOCAL_WORKER": f"{box.state.resolve()}#no-such-worker"}
    stray = subprocess.Popen(["sleep", "600"], env=env, start_new_session=True)
    try:
        box.start()
        wait_until(lambda: stray.poll() is not None, WAIT_S, "the stray process stopped")
        assert marked_processes(box.state) == []
    finally:
        if stray.poll() is None:
            stray.kill()
        stray.wait(timeout=5)
