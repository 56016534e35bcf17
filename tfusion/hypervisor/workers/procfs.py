"""Reading /proc to tie host processes to workers: environ (POD_NAME, ...), NSpid (the PID inside the
container), the cgroup's pod UID, the parent chain, and `stat` (state, process group and start
time, which the local backend uses to recognise its own process groups after a restart). The root
is injectable so tests can use a fake tree; every read tolerates processes that vanish or that we
may not read.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

_POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/<pid>/stat we use.

    `start_time` (field 22, clock ticks after boot) never changes for a process and differs for a
    later process that reuses the PID, so (pid, start_time) names one process for good."""

    pid: int
    state: str
    ppid: int
    pgrp: int
    session: int
    start_time: int

    @property
    def alive(self) -> bool:
        """Running or sleeping, not a zombie waiting to be reaped (or dead)."""
        return self.state not in ("Z", "X", "x")


def parse_stat(pid: int, raw: str) -> ProcStat | None:
    # comm (field 2) is in parentheses and may itself hold spaces and ')': split after the last ')'
    _, sep, rest = raw.rpartition(")")
    fields = rest.split()
    if not sep or len(fields) < 20:
        return None
    try:
        return ProcStat(pid=pid, state=fields[0], ppid=int(fields[1]), pgrp=int(fields[2]),
                        session=int(fields[3]), start_time=int(fields[19]))
    except ValueError:
        return None


class ProcFS:
    def __init__(self, root: Path = Path("/proc")) -> None:
        self.root = root

    def pids(self) -> Iterator[int]:
        try:
            entries = sorted(int(p.name) for p in self.root.iterdir() if p.name.isdigit())
        except OSError:
            return
        yield from entries

    def _read(self, pid: int, name: str) -> bytes | None:
        try:
            return (self.root / str(pid) / name).read_bytes()
        except OSError:
            return None

    def stat(self, pid: int) -> ProcStat | None:
        raw = self._read(pid, "stat")
        return parse_stat(pid, raw.decode(errors="replace")) if raw else None

    def start_time(self, pid: int) -> int | None:
        """The process's start time in clock ticks after boot; None when it is gone or a zombie."""
        stat = self.stat(pid)
        return stat.start_time if stat is not None and stat.alive else None

    def group_members(self, pgid: int) -> list[int]:
        """Live (non-zombie) processes whose process group is `pgid`."""
        members = []
        for pid in self.pids():
            stat = self.stat(pid)
            if stat is not None and stat.pgrp == pgid and stat.alive:
                members.append(pid)
        return members

    def environ(self, pid: int) -> dict[str, str]:
        raw = self._read(pid, "environ")
        if not raw:
            return {}
        result = {}
        for item in raw.split(b"\0"):
            key, sep, value = item.partition(b"=")
            if sep and key:
                result[key.decode(errors="replace")] = value.decode(errors="replace")
        return result

    def status_field(self, pid: int, field: str) -> list[str]:
        raw = self._read(pid, "status")
        if not raw:
            return []
        for line in raw.decode(errors="replace").splitlines():
            if line.startswith(field + ":"):
                return line.split(":", 1)[1].split()
        return []

    def effective_uid(self, pid: int) -> int | None:
        """The user a process acts as (the second `Uid:` field, as the host sees it); None when gone."""
        fields = self.status_field(pid, "Uid")
        try:
            return int(fields[1]) if len(fields) > 1 else None
        except ValueError:
            return None

    def container_pid(self, pid: int) -> int:
        """The innermost PID namespace's PID (last NSpid field); the host PID when unknown."""
        fields = self.status_field(pid, "NSpid")
        try:
            return int(fields[-1]) if fields else pid
        except ValueError:
            return pid

    def parent(self, pid: int) -> int:
        fields = self.status_field(pid, "PPid")
        try:
            return int(fields[0]) if fields else 0
        except ValueError:
            return 0

    def ancestors(self, pid: int, limit: int = 64) -> Iterator[int]:
        current = pid
        for _ in range(limit):
            current = self.parent(current)
            if current <= 0:
                return
            yield current

    def pod_uid(self, pid: int) -> str:
        raw = self._read(pid, "cgroup")
        if not raw:
            return ""
        match = _POD_UID.search(raw.decode(errors="replace"))
        return match.group(1).replace("_", "-") if match else ""

    def find_container_process(self, namespace: str, pod: str, container: str, container_pid: int) -> int | None:
        """The host PID of `container_pid` in a pod's container, matched by environ and NSpid."""
        for pid in self.pids():
            env = self.environ(pid)
            if (env.get("POD_NAMESPACE") == namespace and env.get("POD_NAME") == pod
                    and env.get("CONTAINER_NAME") == container and self.container_pid(pid) == container_pid):
                return pid
        return None
