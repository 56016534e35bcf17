"""The pieces the local backend uses to recognise its own process groups after a restart:
/proc/<pid>/stat parsing (a command name may hold spaces and parentheses) and the persisted
group record, which is ignored rather than trusted when it is malformed."""

from __future__ import annotations

import os
from typing import Any

import pytest

from tfusion.hypervisor.workers.procfs import ProcFS, parse_stat
from tfusion.hypervisor.workers.supervisor import ProcessGroup

TAIL = "20 0 1 0 {start} 3133440 365 18446744073709551615 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0"


def stat_line(pid: int, comm: str, state: str, ppid: int, pgrp: int, start: int) -> str:
    return f"{pid} ({comm}) {state} {ppid} {pgrp} {pgrp} 0 -1 4194304 98 0 0 0 0 0 0 0 " + TAIL.format(start=start)


@pytest.mark.parametrize("comm", ["sleep", "my prog", "a) S 1 2 3 (b", ""])
def test_stat_fields_survive_any_command_name(comm: str) -> None:
    stat = parse_stat(42, stat_line(42, comm, "S", 7, 40, 65012))
    assert stat is not None
    assert (stat.state, stat.ppid, stat.pgrp, stat.session, stat.start_time, stat.alive) == ("S", 7, 40, 40, 65012,
                                                                                             True)


def test_zombies_are_not_alive_and_garbage_is_none() -> None:
    zombie = parse_stat(42, stat_line(42, "sh", "Z", 1, 42, 9))
    assert zombie is not None and not zombie.alive
    assert parse_stat(1, "") is None
    assert parse_stat(1, "1 (x) S 1 2") is None
    assert parse_stat(1, stat_line(1, "x", "S", 1, 1, 5).replace(" 1 1 1 ", " one 1 1 ", 1)) is None


def test_this_process_reads_its_own_stat() -> None:
    stat = ProcFS().stat(os.getpid())
    assert stat is not None and stat.pgrp == os.getpgrp() and stat.start_time > 0
    assert ProcFS().start_time(os.getpid()) == stat.start_time
    assert os.getpid() in ProcFS().group_members(os.getpgrp())


@pytest.mark.parametrize(("raw", "expected"), [
    ({"pgid": 1234, "leaderStartTime": 99}, ProcessGroup(1234, 99)),
    ({"pgid": 1234, "leaderStartTime": 0}, ProcessGroup(1234, 0)),
    ({"pgid": 1, "leaderStartTime": 99}, None),  # init's group is never ours
    ({"pgid": 0, "leaderStartTime": 99}, None),
    ({"pgid": True, "leaderStartTime": 99}, None),
    ({"pgid": "1234", "leaderStartTime": 99}, None),
    ({"pgid": 1234, "leaderStartTime": -1}, None),
    ({"pgid": 1234}, None),
    ("1234", None),
    (None, None),
])
def test_group_records_are_checked(raw: Any, expected: ProcessGroup | None) -> None:
    assert ProcessGroup.from_wire(raw) == expected
    if expected is not None:
        assert ProcessGroup.from_wire(expected.to_wire()) == expected
