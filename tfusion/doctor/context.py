"""What every check gets: the user's client, where tfusion runs, and a clock tests can set."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tfusion.kube.client import KubeClient


@dataclass
class Context:
    client: KubeClient
    #: tfusion's own namespace: its Lease, leader-info ConfigMap, webhook Service and certificate
    namespace: str
    #: the port each node's hypervisor serves on (its --port), probed at the Node's InternalIP
    hypervisor_port: int
    #: seconds a probe of a webhook or hypervisor may take
    timeout_s: float = 3.0
    #: this machine's clock minus the API server's (cluster.measure_skew); None when unknown
    clock_skew_s: float | None = None
    now: Callable[[], float] = field(default=time.time)

    def server_now(self) -> float:
        """Now on the API server's clock: what timestamps other machines wrote are compared with."""
        return self.now() - (self.clock_skew_s or 0.0)
