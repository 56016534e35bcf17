"""Runs one local worker's command and keeps it running, without ever running it twice.

- The command gets its own session, so it leads its own process group (pgid == its PID) and a
  shell's children are signalled together with it.
- Every process of the worker carries `TF_LOCAL_WORKER=<marker>` in its environment (children
  inherit it), so tfusion can tell its own processes from strangers that reuse a PID or a group.
- The group (pgid and the leader's start time from /proc) is what the caller persists. After a
  restart of tfusion the caller passes it back as `adopt=` when the leader is still the same
  process: the supervisor then watches it (by polling /proc: it is not our child, so it cannot be
  waited for) instead of starting a second copy.
- When the leader exits, what is left of its group is stopped, then the command is restarted
  after 3 s, doubling up to 60 s.
- `stop()` sends SIGTERM to the group, then SIGKILL after a grace period, until no member is left.

Output (stdout and stderr) is appended to `<log-dir>/worker-<name>.log` (0600, in 0700 directories:
`tfusion.hypervisor.private`).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import TaskStatus

from tfusion.hypervisor.private import open_private_append
from tfusion.hypervisor.workers.model import RunningInfo
from tfusion.hypervisor.workers.procfs import ProcFS
from tfusion.kube.backoff import Backoff

log = logging.getLogger(__name__)

BACKOFF_START_S = 3.0
BACKOFF_MAX_S = 60.0
BACKOFF = Backoff(base=BACKOFF_START_S, cap=BACKOFF_MAX_S)
STOP_GRACE_S = 5.0
#: how long to wait for a group to vanish after SIGKILL before giving up on it
KILL_WAIT_S = 5.0
#: how often an adopted leader (not our child) is checked for having exited
ADOPTED_POLL_S = 0.5
#: how often a group being stopped is checked for members left
GROUP_POLL_S = 0.1

MARKER_ENV = "TF_LOCAL_WORKER"


def backoff_delay(restarts: int, start: float = BACKOFF_START_S, cap: float = BACKOFF_MAX_S) -> float:
    """The wait before restart number `restarts` (1-based): 3 s, 6 s, 12 s, ... capped at 60 s."""
    return Backoff(base=start, cap=cap).delay(max(1, restarts))


@dataclass(frozen=True)
class ProcessGroup:
    """A worker's process group: its id (the leader's PID) and the leader's start time in clock
    ticks after boot (0 when unknown). PID and start time together name one process for good."""

    pgid: int
    leader_start: int

    def to_wire(self) -> dict[str, int]:
        return {"pgid": self.pgid, "leaderStartTime": self.leader_start}

    @classmethod
    def from_wire(cls, raw: Any) -> ProcessGroup | None:
        """The persisted record, or None when there is none or it is not one of ours."""
        if not isinstance(raw, dict):
            return None
        pgid, start = raw.get("pgid"), raw.get("leaderStartTime")
        if isinstance(pgid, bool) or not isinstance(pgid, int) or pgid <= 1:
            return None
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            return None
        return cls(pgid, start)


def leader_is_alive(procfs: ProcFS, group: ProcessGroup) -> bool:
    """The group's leader is still the very process that was recorded (not a zombie, not a reuse)."""
    return group.leader_start > 0 and procfs.start_time(group.pgid) == group.leader_start


def group_is_ours(procfs: ProcFS, group: ProcessGroup, marker: str) -> bool:
    """Signalling the group reaches our processes: its recorded leader lives, or a live member
    carries our marker (a group id cannot be reused while any member is alive)."""
    if leader_is_alive(procfs, group):
        return True
    return any(procfs.environ(pid).get(MARKER_ENV) == marker for pid in procfs.group_members(group.pgid))


async def stop_group(procfs: ProcFS, group: ProcessGroup, marker: str, grace: float) -> None:
    """SIGTERM the group, SIGKILL it after `grace`, and return once none of ours is left in it.

    Before each signal the group is checked to still be ours, so a stranger that took over the
    group id after ours vanished is never signalled."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, KILL_WAIT_S)):
        if not group_is_ours(procfs, group, marker):
            return
        try:
            os.killpg(group.pgid, sig)
        except ProcessLookupError:
            return
        except PermissionError as exc:
            log.error("cannot signal process group %d: %s", group.pgid, exc)
            return
        with anyio.move_on_after(wait):
            while group_is_ours(procfs, group, marker):
                await anyio.sleep(GROUP_POLL_S)
            return
    log.error("process group %d is still there after SIGKILL", group.pgid)


class ProcessSupervisor:
    def __init__(self, *, name: str, argv: list[str], env: Mapping[str, str], cwd: str | None, log_dir: Path,
                 on_change: Callable[[], None] | None = None, backoff_start: float = BACKOFF_START_S,
                 backoff_max: float = BACKOFF_MAX_S, stop_grace: float = STOP_GRACE_S, marker: str = "",
                 adopt: ProcessGroup | None = None, restarts: int = 0, procfs: ProcFS | None = None) -> None:
        self.name = name
        self.argv = argv
        self.marker = marker or f"{name}#{uuid.uuid4().hex}"
        self.env = {**env, MARKER_ENV: self.marker}
        self.cwd = cwd
        self.log_path = log_dir / f"worker-{name}.log"
        self.on_change = on_change
        self.backoff_start = backoff_start
        self.backoff_max = backoff_max
        self.stop_grace = stop_grace
        self.procfs = procfs or ProcFS()
        self.restarts = restarts
        self.pid = 0
        self.exit_code: int | None = None
        self.error = ""
        #: the group that may still have members (persisted by the caller); None once it is gone
        self.group: ProcessGroup | None = None
        self._adopt = adopt
        self._live = False
        self._stopping = False
        self._started = False
        self._task_status: TaskStatus[None] | None = None
        self._done = anyio.Event()

    @property
    def running(self) -> bool:
        return self._live

    def update(self, info: RunningInfo) -> None:
        info.pid = self.pid if self.running else 0
        info.is_running = self.running
        info.restarts = self.restarts
        info.exit_code = self.exit_code

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run (or watch the adopted group) and restart until stopped; `task_status.started()` once
        the first start was tried. Cancelled, it stops the group before returning."""
        self._started = True
        self._task_status = task_status
        adopted, self._adopt = self._adopt, None
        try:
            while not self._stopping:
                if adopted is not None:
                    await self._watch_adopted(adopted)
                    adopted = None
                else:
                    await self._run_once()
                if self._stopping:
                    break
                await self._stop_group()  # what the leader left behind must not outlive it
                self.restarts += 1
                delay = backoff_delay(self.restarts, self.backoff_start, self.backoff_max)
                log.warning("local worker %s exited with %s; restart %d in %.0f s", self.name,
                            "an unknown status" if self.exit_code is None else self.exit_code, self.restarts, delay)
                self._changed()
                with anyio.move_on_after(delay):
                    while not self._stopping:
                        await anyio.sleep(0.1)
        finally:
            with anyio.CancelScope(shield=True):
                await self._stop_group()
            self._done.set()

    async def _run_once(self) -> None:
        with open_private_append(self.log_path) as out:
            try:
                process = await anyio.open_process(self.argv, env=self.env, cwd=self.cwd, stdin=subprocess.DEVNULL,
                                                   stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            except OSError as exc:
                self.error = f"cannot start {self.argv[0]!r}: {exc.strerror or exc}"
                self.exit_code = 127
                log.error("local worker %s: %s", self.name, self.error)
                self._signal_started()
                return
        stat = self.procfs.stat(process.pid)
        self.group = ProcessGroup(process.pid, stat.start_time if stat is not None else 0)
        self.pid = process.pid
        self.exit_code = None
        self.error = ""
        self._live = True
        log.info("local worker %s started as pid %d", self.name, process.pid)
        self._signal_started()
        self._changed()  # persisted at once: a crash from here on finds the group recorded
        try:
            if self._stopping:  # stop() came while the process was being started
                await self._stop_group()
            self.exit_code = await process.wait()
        finally:
            self._live = False

    async def _watch_adopted(self, group: ProcessGroup) -> None:
        self.group = group
        self.pid = group.pgid
        self.exit_code = None
        self._live = True
        log.info("local worker %s: adopted its running process group %d", self.name, group.pgid)
        self._signal_started()
        self._changed()
        try:
            while leader_is_alive(self.procfs, group):
                await anyio.sleep(ADOPTED_POLL_S)
        finally:
            self._live = False

    def _signal_started(self) -> None:
        if self._task_status is not None:
            self._task_status.started()
            self._task_status = None

    async def _stop_group(self) -> None:
        group = self.group
        if group is None:
            return
        await stop_group(self.procfs, group, self.marker, self.stop_grace)
        if self.group is group and not group_is_ours(self.procfs, group, self.marker):
            self.group = None

    async def stop(self) -> None:
        """Stop the process group (SIGTERM, then SIGKILL) and the restart loop."""
        self._stopping = True
        await self._stop_group()
        if not self._started:
            return
        with anyio.move_on_after(self.stop_grace + KILL_WAIT_S + 1):
            await self._done.wait()
