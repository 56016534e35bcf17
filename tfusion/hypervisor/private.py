"""Files, directories and sockets of the hypervisor that only its own user may use.

Why: `workers.json` holds each worker's command line and env (tokens, passwords), a worker's log
holds whatever it prints, and whoever can connect to a device plugin's socket can ask it for any
pod's devices. They are created with their mode given explicitly and set again with fchmod/chmod,
so neither the umask nor a wider file left by an older run decides who uses them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

PRIVATE_FILE_MODE = 0o600
PRIVATE_DIR_MODE = 0o700


def private_directory(path: Path) -> None:
    """`path` and any missing parents, created 0700. A directory that exists is left as it is:
    it may be one the user shares (the working directory, home)."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for directory in reversed(missing):
        directory.mkdir(mode=PRIVATE_DIR_MODE, exist_ok=True)
        os.chmod(directory, PRIVATE_DIR_MODE)


def open_private_append(path: Path) -> BinaryIO:
    """`path` opened for appending, created 0600 (an existing file is narrowed to 0600), in a
    private directory."""
    private_directory(path.parent)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, PRIVATE_FILE_MODE)
    try:
        os.fchmod(fd, PRIVATE_FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "ab")


def private_socket(path: Path) -> None:
    """A unix socket a server just bound: only its owner may connect. (Connecting needs write
    permission, which the umask's usual 0755 already denies to others; 0600 also hides it from reads.)"""
    os.chmod(path, PRIVATE_FILE_MODE)
