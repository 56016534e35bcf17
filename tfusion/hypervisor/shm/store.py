"""Where the shared-memory files live and how they come and go: `<root>/<namespace>/<pod>/shm`.

Why: the worker pod mounts `<root>/<namespace>/<pod>` (hostPath, subPathExpr) at
`/run/tensor-fusion/shm`, so the limiter finds its file at `/run/tensor-fusion/shm/shm`. The
namespace and pod name become path components, so a name holding `/`, `\\` or `..` (or an empty
one) is refused before any path is built. `--shm-root` is `/run/tensor-fusion/shm` (the tmpfs the
hypervisor pod's init container mounts) by default, and `<state dir>/shm` in `--role=all`.

- `create` truncates: a new file of 35,504 zero bytes, then the V2 header and device entries;
- `open` never changes a file's contents: it must be 35,504 bytes (35,496 is the legacy V1 layout, refused
  by name) with discriminant 1;
- `ensure` opens, and creates only when the file does not exist; any other problem is raised,
  never "fixed" by truncating a file a limiter may be reading;
- `remove` deletes the file and the pod's directory (and the namespace's, once empty);
- `strays` lists files whose namespace/pod is not a worker any more, for the periodic sweep.

Who may open a file (the file holds the pod's limits and token bucket: a process that can write it
can lift them). The pod reaches its file through a bind mount of its own directory, so no directory
above that one is ever crossed from inside a container: the root (when we create it) and the
namespace directories are 0700. The pod directory and the file belong to the pod's identity
(`ShmOwner`, from its securityContext) and root, never to every local user:

- owner: the pod's user when every container runs as the same `runAsUser`, else the hypervisor's;
- group: the pod's `fsGroup` (every container has it), else a `runAsGroup` all containers share,
  else the hypervisor's;
- modes: 0660 file / 0750 directory with a pod group, 0600 / 0700 without.

Ownership is changed only when the hypervisor runs as root (as the DaemonSet does); the modes are
set with fchmod/chmod, whatever the umask, on `create` and on `open` too, so a file an older run
left 0666 is narrowed. `open` without an owner leaves the file's owner as it is, so a file handed
over with `hand_over` (the limiter/soft.py fallback for a pod that names no user) stays its user's.
"""

from __future__ import annotations

import errno
import mmap
import os
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from tfusion.hypervisor.shm import layout as lay
from tfusion.hypervisor.shm.state import DeviceConfig, SharedState, ShmError

SHM_FILE = "shm"
#: the pod's own VRAM accounting, created beside the file by tfusion's limiter (native/limiter)
ACCOUNTING_FILE = "limiter-accounting"
DEFAULT_ROOT = "/run/tensor-fusion/shm"


class ShmPathError(ShmError, ValueError):
    """A namespace or pod name that cannot be a path component."""


def check_component(kind: str, value: str) -> str:
    """`value` as a safe path component, or ShmPathError naming the field and what is allowed."""
    if not value or value in (".", "..") or "/" in value or "\\" in value or ".." in value or "\0" in value:
        raise ShmPathError(f"{kind} {value!r} cannot name a shared-memory directory: it must be non-empty "
                           "and contain no '/', '\\' or '..'")
    return value


@dataclass(frozen=True)
class ShmOwner:
    """The numeric identity, besides root, that may open a pod's file; None: the hypervisor's own."""

    uid: int | None = None
    gid: int | None = None

    @property
    def file_mode(self) -> int:
        return 0o660 if self.gid is not None else 0o600

    @property
    def dir_mode(self) -> int:
        return 0o750 if self.gid is not None else 0o700


ROOT_ONLY = ShmOwner()
#: the root and namespace directories: only the hypervisor crosses them (pods see their own directory)
PRIVATE_DIR_MODE = 0o700


def _hand_over(fd: int, owner: ShmOwner, mode: int) -> None:
    """Give an open file or directory its owner (as root only) and its mode, whatever the umask."""
    if os.geteuid() == 0 and (owner.uid is not None or owner.gid is not None):
        os.fchown(fd, -1 if owner.uid is None else owner.uid, -1 if owner.gid is None else owner.gid)
    os.fchmod(fd, mode)


def _accounting_file(shm_path: Path, owner: ShmOwner) -> None:
    """The limiter's accounting file beside the shm file: created empty when missing (the limiter
    sizes and fills it; an existing one keeps its contents) and given the shm file's owner and mode,
    so that every process of the pod that may open the shm file may open this one read-write, even
    where it cannot create files in the pod's directory (another container that shares only the
    pod's group)."""
    fd = os.open(shm_path.with_name(ACCOUNTING_FILE), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, owner.file_mode)
    try:
        _hand_over(fd, owner, owner.file_mode)
    finally:
        os.close(fd)


class ShmStore:
    """The files under one root."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _pod_directory(self, path: Path, owner: ShmOwner) -> None:
        """Create the file's directories, private up to the pod's own, which `owner` may cross."""
        if not self.root.exists():
            self.root.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
        namespace_dir = path.parent.parent
        namespace_dir.mkdir(mode=PRIVATE_DIR_MODE, exist_ok=True)
        os.chmod(namespace_dir, PRIVATE_DIR_MODE)
        path.parent.mkdir(mode=owner.dir_mode, exist_ok=True)
        fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            _hand_over(fd, owner, owner.dir_mode)
        finally:
            os.close(fd)

    def path(self, namespace: str, pod: str) -> Path:
        return self.root / check_component("namespace", namespace) / check_component("pod name", pod) / SHM_FILE

    def exists(self, namespace: str, pod: str) -> bool:
        return self.path(namespace, pod).is_file()

    def create(self, namespace: str, pod: str, devices: Sequence[DeviceConfig],
               owner: ShmOwner = ROOT_ONLY) -> SharedState:
        path = self.path(namespace, pod)
        self._pod_directory(path, owner)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, owner.file_mode)
        try:
            _hand_over(fd, owner, owner.file_mode)
            os.ftruncate(fd, lay.FILE_SIZE)
            mapping = mmap.mmap(fd, lay.FILE_SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        _accounting_file(path, owner)
        state = SharedState(path, mapping)
        state.initialize(devices)
        return state

    def open(self, namespace: str, pod: str, owner: ShmOwner = ROOT_ONLY) -> SharedState:
        """An existing file, its owner and modes made `owner`'s; raises FileNotFoundError when there
        is none and ShmError when it is not V2 (its contents are never changed)."""
        path = self.path(namespace, pod)
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        try:
            self._pod_directory(path, owner)
            _hand_over(fd, owner, owner.file_mode)
            _accounting_file(path, owner)
            size = os.fstat(fd).st_size
            if size == lay.LEGACY_FILE_SIZE:
                raise ShmError(f"{path}: {size} bytes is the legacy V1 layout; this hypervisor writes V2 "
                               f"({lay.FILE_SIZE} bytes)")
            if size != lay.FILE_SIZE:
                raise ShmError(f"{path}: {size} bytes; a V2 shared-memory file has {lay.FILE_SIZE}")
            mapping = mmap.mmap(fd, lay.FILE_SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        state = SharedState(path, mapping)
        if state.discriminant != lay.DISCRIMINANT_V2:
            found = state.discriminant
            state.close()
            raise ShmError(f"{path}: discriminant {found}; a V2 shared-memory file has {lay.DISCRIMINANT_V2}")
        return state

    def owner_uid(self, namespace: str, pod: str) -> int:
        """The user that owns the file now."""
        return os.stat(self.path(namespace, pod), follow_symlinks=False).st_uid

    def hand_over(self, namespace: str, pod: str, owner: ShmOwner) -> None:
        """Give an existing file and its pod directory to `owner` (contents unchanged)."""
        path = self.path(namespace, pod)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            self._pod_directory(path, owner)
            _hand_over(fd, owner, owner.file_mode)
            _accounting_file(path, owner)
        finally:
            os.close(fd)

    def ensure(self, namespace: str, pod: str, devices: Sequence[DeviceConfig],
               owner: ShmOwner = ROOT_ONLY) -> tuple[SharedState, bool]:
        """(state, created): open the file, or create it when (and only when) it does not exist."""
        try:
            return self.open(namespace, pod, owner), False
        except FileNotFoundError:
            return self.create(namespace, pod, devices, owner), True

    def remove(self, namespace: str, pod: str) -> bool:
        """Delete the file and its now-empty directories; False when there was none."""
        path = self.path(namespace, pod)
        try:
            path.unlink()
            removed = True
        except FileNotFoundError:
            removed = False
        path.with_name(ACCOUNTING_FILE).unlink(missing_ok=True)  # else the directory stays behind
        for directory in (path.parent, path.parent.parent):
            try:
                directory.rmdir()
            except OSError as exc:
                if exc.errno not in (errno.ENOENT, errno.ENOTEMPTY, errno.EEXIST):
                    raise
                break
        return removed

    def listed(self) -> list[tuple[str, str]]:
        """Every (namespace, pod) with a file under the root."""
        found: list[tuple[str, str]] = []
        try:
            namespaces = sorted(p for p in self.root.iterdir() if p.is_dir())
        except OSError:
            return []
        for ns_dir in namespaces:
            try:
                pods = sorted(p for p in ns_dir.iterdir() if p.is_dir())
            except OSError:
                continue
            found.extend((ns_dir.name, pod_dir.name) for pod_dir in pods if (pod_dir / SHM_FILE).is_file())
        return found

    def strays(self, known: Collection[tuple[str, str]]) -> list[tuple[str, str]]:
        return [key for key in self.listed() if key not in known]
