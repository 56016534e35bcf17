"""Who may open a soft worker's shared-memory file (issue 23): the pod's identity and root, never
every local user, whatever the umask; a file an older run left 0666 is narrowed when opened; and
the pod's identity comes from its securityContext.

A pod reaches its file through a bind mount of its own directory. The tests stand in for that mount
with a directory descriptor: a forked child that becomes the pod's user opens `shm` relative to it,
so only the pod directory's and the file's permissions decide, as they do inside the container."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import file_mode, widest_umask
from tfusion.api.accessors import Pod
from tfusion.hypervisor.shm.state import DeviceConfig
from tfusion.hypervisor.shm.store import ACCOUNTING_FILE, ShmOwner, ShmStore
from tfusion.hypervisor.workers.kubernetes import pod_identity, worker_from_pod

A100 = DeviceConfig(slot=0, uuid="GPU-5f3a1c2e-0000-4000-8000-000000000a00", up_limit=30, mem_limit=16 << 30)
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="changing a file's owner needs root")


@pytest.fixture
def open_umask() -> Iterator[None]:
    with widest_umask():
        yield


def owner(path: Path) -> tuple[int, int]:
    info = os.stat(path)
    return info.st_uid, info.st_gid


def open_as(directory: Path, uid: int, gid: int, groups: tuple[int, ...] = (), name: str = "shm") -> int:
    """0 when a process of `uid`/`gid` (with supplementary `groups`) can open `name` read-write
    through a descriptor of `directory` (as through the pod's mount), else the errno it got."""
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        child = os.fork()
        if child == 0:  # pragma: no cover - runs in the child
            code = 0
            try:
                os.setgroups(list(groups))
                os.setgid(gid)
                os.setuid(uid)
                os.close(os.open(name, os.O_RDWR, dir_fd=dir_fd))
            except OSError as exc:
                code = exc.errno or 1
            os._exit(code)
        _, status = os.waitpid(child, 0)
        return os.waitstatus_to_exitcode(status)
    finally:
        os.close(dir_fd)


def test_without_an_identity_only_the_hypervisor_may_open_it(tmp_path: Path, open_umask: None) -> None:
    store = ShmStore(tmp_path / "shm")
    state = store.create("ml", "train-0", [A100])
    state.close()
    assert file_mode(state.path) == 0o600
    assert file_mode(state.path.parent) == 0o700  # the pod's directory
    assert file_mode(state.path.parent.parent) == 0o700  # the namespace's: no container crosses it
    assert file_mode(tmp_path / "shm") == 0o700  # the root, which this store created
    assert owner(state.path) == (os.geteuid(), os.getegid())


@as_root
def test_the_pods_user_and_group_may_open_it_and_nobody_else(tmp_path: Path, open_umask: None) -> None:
    store = ShmStore(tmp_path)
    with_group = store.create("ml", "grouped", [A100], ShmOwner(uid=4100, gid=4200))
    with_group.close()
    assert (owner(with_group.path), file_mode(with_group.path)) == ((4100, 4200), 0o660)
    assert (owner(with_group.path.parent), file_mode(with_group.path.parent)) == ((4100, 4200), 0o750)
    pod_dir = with_group.path.parent
    assert open_as(pod_dir, 4100, 4200) == 0  # the pod's user
    assert open_as(pod_dir, 4300, 4300, groups=(4200,)) == 0  # another container, with the fsGroup
    assert open_as(pod_dir, 4300, 4300) == errno.EACCES  # any other local user
    # the limiter's accounting file: the same owner and mode, so the same processes may open it
    accounting = pod_dir / ACCOUNTING_FILE
    assert (owner(accounting), file_mode(accounting)) == ((4100, 4200), 0o660)
    assert open_as(pod_dir, 4300, 4300, groups=(4200,), name=ACCOUNTING_FILE) == 0
    assert open_as(pod_dir, 4300, 4300, name=ACCOUNTING_FILE) == errno.EACCES

    user_only = store.create("ml", "user-only", [A100], ShmOwner(uid=4100))
    user_only.close()
    assert (owner(user_only.path), file_mode(user_only.path)) == ((4100, 0), 0o600)
    assert (owner(user_only.path.parent), file_mode(user_only.path.parent)) == ((4100, 0), 0o700)
    assert open_as(user_only.path.parent, 4100, 4100) == 0
    assert open_as(user_only.path.parent, 4300, 0) == errno.EACCES  # root's group is no key

    nobody = store.create("ml", "root-only", [A100])
    nobody.close()
    assert open_as(nobody.path.parent, 4100, 4200) == errno.EACCES
    # handed to the user its process runs as; opening it again without an owner keeps that user
    store.hand_over("ml", "root-only", ShmOwner(uid=4100))
    store.open("ml", "root-only").close()
    assert (owner(nobody.path), file_mode(nobody.path), store.owner_uid("ml", "root-only")) == ((4100, 0), 0o600, 4100)
    assert open_as(nobody.path.parent, 4100, 4100) == 0 and open_as(nobody.path.parent, 4300, 0) == errno.EACCES


@as_root
def test_open_narrows_what_an_older_run_left_and_keeps_the_contents(tmp_path: Path) -> None:
    store = ShmStore(tmp_path)
    state = store.create("ml", "old", [A100])
    state.close()
    before = state.path.read_bytes()
    os.chmod(state.path, 0o666)
    os.chmod(state.path.parent, 0o755)
    os.chmod(state.path.parent.parent, 0o755)
    again, created = store.ensure("ml", "old", [], ShmOwner(uid=4100, gid=4200))
    again.close()
    assert not created and state.path.read_bytes() == before
    assert (owner(state.path), file_mode(state.path)) == ((4100, 4200), 0o660)
    assert file_mode(state.path.parent) == 0o750 and file_mode(state.path.parent.parent) == 0o700
    assert file_mode(state.path.with_name(ACCOUNTING_FILE)) == 0o660


def pod(spec: dict[str, Any]) -> Pod:
    return Pod({"metadata": {"name": "p", "namespace": "ml", "uid": "u-1"}, "spec": spec})


@pytest.mark.parametrize(("spec", "identity"), [
    ({"containers": [{"name": "a"}]}, (None, None)),
    ({"securityContext": {"runAsUser": 1000, "runAsGroup": 3000, "fsGroup": 2000},
      "containers": [{"name": "a"}, {"name": "b"}]}, (1000, 2000)),
    ({"securityContext": {"runAsUser": 1000, "runAsGroup": 3000},
      "containers": [{"name": "a"}]}, (1000, 3000)),
    # a container's own setting wins over the pod's
    ({"securityContext": {"runAsUser": 1000}, "containers": [{"name": "a", "securityContext": {"runAsUser": 7}}]},
     (7, None)),
    # containers that run as different users: no one user, the fsGroup still shared
    ({"securityContext": {"runAsUser": 1000, "fsGroup": 2000},
      "containers": [{"name": "a"}, {"name": "b", "securityContext": {"runAsUser": 1001, "runAsGroup": 9}}]},
     (None, 2000)),
    ({"securityContext": {"runAsGroup": 3000},
      "containers": [{"name": "a"}, {"name": "b", "securityContext": {"runAsGroup": 3001}}]}, (None, None)),
    # values that are not user ids are not trusted
    ({"securityContext": {"runAsUser": -1, "fsGroup": "2000", "runAsGroup": True},
      "containers": [{"name": "a"}]}, (None, None)),
    ({"securityContext": {"runAsUser": 0}, "containers": [{"name": "a"}]}, (0, None)),
])
def test_the_pods_identity_comes_from_its_security_context(spec: dict[str, Any],
                                                          identity: tuple[int | None, int | None]) -> None:
    assert pod_identity(pod(spec)) == identity
    worker = worker_from_pod(pod(spec))
    assert (worker.run_as_user, worker.shared_group) == identity
