"""Where the shared-memory files live and how they come and go: `<root>/<namespace>/<pod>/shm`.

Why: the worker pod mounts `<root>/<namespace>/<pod>` (hostPath, subPathExpr) at
`/run/tensor-fusion/shm`, so the limiter finds its file at `/run/tensor-fusion/shm/shm`. The
namespace and pod name become path components, so a name holding `/`, `\\` or `..` (or an empty
one) is refused before any path is built. `--shm-root` is `/run/tensor-fusion/shm` (the tmpfs the
hypervisor pod's init container mounts) by default, and `<state dir>/shm` in `--role=all`.

- `create` truncates: a new file of 35,504 zero bytes, then the V2 header and device entries;
- `open` never changes a file: it must be 35,504 bytes (35,496 is the legacy V1 layout, refused
  by name) with discriminant 1;
- `ensure` opens, and creates only when the file does not exist; any other problem is raised,
  never "fixed" by truncating a file a limiter may be reading;
- `remove` deletes the file and the pod's directory (and the namespace's, once empty);
- `strays` lists files whose namespace/pod is not a worker any more, for the periodic sweep.
"""

from __future__ import annotations

import errno
import mmap
import os
from collections.abc import Collection, Sequence
from pathlib import Path

from tfusion.hypervisor.shm import layout as lay
from tfusion.hypervisor.shm.state import DeviceConfig, SharedState, ShmError

SHM_FILE = "shm"
DEFAULT_ROOT = "/run/tensor-fusion/shm"


class ShmPathError(ShmError, ValueError):
    """A namespace or pod name that cannot be a path component."""


def check_component(kind: str, value: str) -> str:
    """`value` as a safe path component, or ShmPathError naming the field and what is allowed."""
    if not value or value in (".", "..") or "/" in value or "\\" in value or ".." in value or "\0" in value:
        raise ShmPathError(f"{kind} {value!r} cannot name a shared-memory directory: it must be non-empty "
                           "and contain no '/', '\\' or '..'")
    return value


class ShmStore:
    """The files under one root."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, namespace: str, pod: str) -> Path:
        return self.root / check_component("namespace", namespace) / check_component("pod name", pod) / SHM_FILE

    def exists(self, namespace: str, pod: str) -> bool:
        return self.path(namespace, pod).is_file()

    def create(self, namespace: str, pod: str, devices: Sequence[DeviceConfig]) -> SharedState:
        path = self.path(namespace, pod)
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o666)
        try:
            os.fchmod(fd, 0o666)  # the limiter in the pod may run as any user; umask must not narrow it
            os.ftruncate(fd, lay.FILE_SIZE)
            mapping = mmap.mmap(fd, lay.FILE_SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        state = SharedState(path, mapping)
        state.initialize(devices)
        return state

    def open(self, namespace: str, pod: str) -> SharedState:
        """An existing file; raises FileNotFoundError when there is none and ShmError when it is not V2."""
        path = self.path(namespace, pod)
        fd = os.open(path, os.O_RDWR)
        try:
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

    def ensure(self, namespace: str, pod: str, devices: Sequence[DeviceConfig]) -> tuple[SharedState, bool]:
        """(state, created): open the file, or create it when (and only when) it does not exist."""
        try:
            return self.open(namespace, pod), False
        except FileNotFoundError:
            return self.create(namespace, pod, devices), True

    def remove(self, namespace: str, pod: str) -> bool:
        """Delete the file and its now-empty directories; False when there was none."""
        path = self.path(namespace, pod)
        try:
            path.unlink()
            removed = True
        except FileNotFoundError:
            removed = False
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
