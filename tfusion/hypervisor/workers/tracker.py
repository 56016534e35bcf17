"""What the HTTP API and the metrics need from a worker backend (local or Kubernetes)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from tfusion.api.jsontypes import JsonMapping
from tfusion.hypervisor.workers.model import RunningInfo, WorkerAllocation


class WorkerTracker(Protocol):
    #: "local" or "kubernetes"
    kind: str

    def allocations(self) -> list[WorkerAllocation]:
        """Workers that hold devices on this node."""
        ...

    def get(self, worker_id: str) -> WorkerAllocation | None:
        """A worker by UID (the local backend also accepts its name)."""
        ...

    def tracks(self, uid: str) -> bool:
        """Whether the worker still exists on this node (with or without an allocation): its
        shared memory is removed only once this is false."""
        ...

    def running_info(self, uid: str) -> RunningInfo | None:
        """The supervised process of a local worker; None for pods."""
        ...

    def worker_for_pid(self, pid: int) -> str | None:
        """The UID of the worker a host process belongs to, if any."""
        ...


@runtime_checkable
class WorkerFactory(Protocol):
    """A backend whose workers are created and deleted over HTTP (the local one; pods are not)."""

    async def create(self, body: JsonMapping) -> WorkerAllocation:
        """Place and start a worker from a `POST /api/v1/workers` body."""
        ...

    async def remove(self, worker_id: str) -> WorkerAllocation | None:
        """Stop and release a worker by UID or name; None when there is none."""
        ...
