"""The controller's shared plumbing, which every controller service is built on.

A separate module from `role.py` so that the services (allocation, webhook, scheduler,
reconcilers, metrics) depend on this and nothing depends on them but `role.py`, which builds them
in order and hands each the others it uses: no service reaches into a bag of optional peers, and
the controller's modules import one another without a cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from tfusion.controller.dynamic_config import DynamicConfig
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient
from tfusion.kube.events import EventRecorder
from tfusion.kube.informer import Informer
from tfusion.kube.manager import Manager
from tfusion.settings import Settings
from tfusion.web import HttpError, Readiness

__all__ = ["ControllerRuntime", "Task", "component_selector"]

Task = Callable[[], Coroutine[Any, Any, None]]


@dataclass
class ControllerRuntime:
    """What the controller's services share: the process's Manager (client, cache, registry,
    events, leadership) plus the role's own routes, tasks and readiness. It holds no service: a
    service that needs another gets it as a constructor argument from `role.configure()`."""

    settings: Settings
    manager: Manager
    readiness: Readiness
    dynamic_config: DynamicConfig
    #: the informers the controller reads, resolved once from the shared cache (pods: ours only)
    informers: dict[r.ApiResource, Informer]
    #: Litestar handlers served on --controller-listen
    routes: list[Any] = field(default_factory=list)
    #: leader-only runnables added through `add_leader_task` (also registered with the Manager)
    leader_tasks: list[Task] = field(default_factory=list)
    #: run on every replica for the life of the process
    tasks: list[Task] = field(default_factory=list)
    #: (host, port) the HTTP server is bound to, once serving
    address: tuple[str, int] | None = None
    #: (host, port) of the probe server (--health-probe-bind-address), once serving
    probe_address: tuple[str, int] | None = None
    #: True when this runtime made its Manager and so must run it (a controller-only process)
    owns_manager: bool = False
    #: informers a service reads besides `informers` (other selectors on one of their resources,
    #: such as the scheduler's on every pod), by their /readyz condition
    other_informers: dict[str, Informer] = field(default_factory=dict)

    @property
    def client(self) -> KubeClient:
        return self.manager.client

    @client.setter
    def client(self, client: KubeClient) -> None:
        self.manager.client = client

    @property
    def registry(self) -> CollectorRegistry:
        return self.manager.registry

    @property
    def events(self) -> EventRecorder:
        return self.manager.recorder

    @property
    def identity(self) -> str:
        return self.manager.identity

    @property
    def is_leader(self) -> bool:
        return self.manager.is_leader

    def informer(self, resource: r.ApiResource) -> Informer:
        return self.informers[resource]

    def not_leader(self, holds: str) -> HttpError:
        """The 503 a leader-only route answers on a follower, naming the leader when it is known."""
        elector = self.manager.elector
        holder = elector.observed_holder if elector is not None else ""
        where = f" ({holder} leads)" if holder else ""
        return HttpError(503, f"this controller replica is not the leader{where}; only the leader {holds} "
                              f"(its address is in the ConfigMap tensor-fusion-operator-leader-info)")

    def track_readiness(self, informer: Informer, condition: str) -> None:
        """/readyz waits for `informer` too, under `condition` (for one not in `informers`)."""
        self.other_informers[condition] = informer

    def add_leader_task(self, task: Task) -> None:
        self.leader_tasks.append(task)
        self.manager.add(task, leader_only=True, name=getattr(task, "__qualname__", repr(task)))


def component_selector(settings: Settings) -> str:
    """Our pods carry `<domain>/component`; the controller's pod informer watches only those (the
    scheduler, which must count every pod on a node, has its own on every pod)."""
    return f"{settings.domain}/component"
