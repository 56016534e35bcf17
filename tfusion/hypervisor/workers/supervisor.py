"""Runs one local worker's command and keeps it running.

The process gets its own session (so a shell's children are stopped with it), its output goes to
`<log-dir>/worker-<name>.log`, and when it exits it is restarted after 3 s, doubling up to 60 s.
`stop()` sends SIGTERM to the process group, then SIGKILL after a grace period.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path

import anyio
from anyio.abc import Process, TaskStatus

from tfusion.hypervisor.workers.model import RunningInfo

log = logging.getLogger(__name__)

BACKOFF_START_S = 3.0
BACKOFF_MAX_S = 60.0
STOP_GRACE_S = 5.0


def backoff_delay(restarts: int, start: float = BACKOFF_START_S, cap: float = BACKOFF_MAX_S) -> float:
    """The wait before restart number `restarts` (1-based): 3 s, 6 s, 12 s, ... capped at 60 s."""
    return float(min(cap, start * 2.0 ** max(0, restarts - 1)))


class ProcessSupervisor:
    def __init__(self, *, name: str, argv: list[str], env: Mapping[str, str], cwd: str | None, log_dir: Path,
                 on_change: Callable[[], None] | None = None, backoff_start: float = BACKOFF_START_S,
                 backoff_max: float = BACKOFF_MAX_S, stop_grace: float = STOP_GRACE_S) -> None:
        self.name = name
        self.argv = argv
        self.env = dict(env)
        self.cwd = cwd
        self.log_path = log_dir / f"worker-{name}.log"
        self.on_change = on_change
        self.backoff_start = backoff_start
        self.backoff_max = backoff_max
        self.stop_grace = stop_grace
        self.restarts = 0
        self.pid = 0
        self.exit_code: int | None = None
        self.error = ""
        self._process: Process | None = None
        self._stopping = False
        self._started = False
        self._task_status: TaskStatus[None] | None = None
        self._done = anyio.Event()

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.returncode is None

    def update(self, info: RunningInfo) -> None:
        info.pid = self.pid if self.running else 0
        info.is_running = self.running
        info.restarts = self.restarts
        info.exit_code = self.exit_code

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run and restart until stopped; `task_status.started()` once the first start was tried."""
        self._started = True
        self._task_status = task_status
        try:
            while not self._stopping:
                await self._run_once()
                if self._stopping:
                    break
                self.restarts += 1
                delay = backoff_delay(self.restarts, self.backoff_start, self.backoff_max)
                log.warning("local worker %s exited with %s; restart %d in %.0f s", self.name, self.exit_code,
                            self.restarts, delay)
                self._changed()
                with anyio.move_on_after(delay):
                    while not self._stopping:
                        await anyio.sleep(0.1)
        finally:
            self._done.set()

    async def _run_once(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            try:
                process = await anyio.open_process(self.argv, env=self.env, cwd=self.cwd, stdin=subprocess.DEVNULL,
                                                   stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            except OSError as exc:
                self.error = f"cannot start {self.argv[0]!r}: {exc.strerror or exc}"
                self.exit_code = 127
                log.error("local worker %s: %s", self.name, self.error)
                self._signal_started()
                return
        self._process = process
        self.pid = process.pid
        self.error = ""
        log.info("local worker %s started as pid %d", self.name, process.pid)
        self._signal_started()
        self._changed()
        try:
            self.exit_code = await process.wait()
        finally:
            if process.returncode is None:  # cancelled: never leave it behind
                with anyio.CancelScope(shield=True):
                    await self._terminate(process)
            self._process = None

    def _signal_started(self) -> None:
        if self._task_status is not None:
            self._task_status.started()
            self._task_status = None

    async def _terminate(self, process: Process) -> None:
        for sig, wait in ((signal.SIGTERM, self.stop_grace), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                break
            except PermissionError:
                process.send_signal(sig)
            with anyio.move_on_after(wait):
                await process.wait()
                break
        self.exit_code = process.returncode

    async def stop(self) -> None:
        """Stop the process (SIGTERM, then SIGKILL) and the restart loop."""
        self._stopping = True
        process = self._process
        if process is not None and process.returncode is None:
            await self._terminate(process)
        if not self._started:
            return
        with anyio.move_on_after(self.stop_grace + 6):
            await self._done.wait()
