"""Errors shared across layers. A leaf module: it imports nothing of tfusion, so any layer (roles,
embedded stage, controller, hypervisor) can raise these without import cycles."""

from __future__ import annotations


class RoleError(RuntimeError):
    """A role cannot run (not built, or failed to start); the message says which and why. The CLI
    prints it as one line and exits 1."""
