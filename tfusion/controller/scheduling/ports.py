"""Host port allocators: cluster-wide for pods labelled `host-port: auto`, per node for workers.

Why: a pod that asks for `<domain>/host-port: auto` gets a host port on its named container port
(`<domain>/port-name`) that no other such pod in the cluster has, from `--cluster-host-port-range`
(default 42000-62000, the end excluded); workers the controller creates take ports from
`--host-port-range` (40000-42000) per node. The leader owns both; they are rebuilt from the pods
in the cache at the start of each leadership term (the `<domain>/port-number` annotation), a port
is released as soon as its pod is deleted or finishes, and a fresh assignment is reserved for
`reservation_ttl` seconds until its pod shows up in the cache (so a pod whose creation failed
after admission does not keep its port for ever). Assignment is the lowest free port.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from tfusion.api import annotations as tfa
from tfusion.api.accessors import Pod
from tfusion.controller.scheduling.claims import Claims

RESERVATION_TTL_S = 60.0


class NoFreePort(Exception):
    """Every port of the range is held."""


class PortPool:
    """One range [start, end) and the claims on its ports (claims.py); the lowest free one is given."""

    def __init__(self, start: int, end: int, *, reservation_ttl: float = RESERVATION_TTL_S,
                 now: Callable[[], float] = time.monotonic) -> None:
        if not 0 < start < end <= 65536:
            raise ValueError(f"port range {start}-{end} is invalid; expected 0 < start < end <= 65536")
        self.start, self.end = start, end
        self.claims = Claims(ttl=reservation_ttl, now=now)

    def assign(self, key: str) -> int:
        known = self.claims.reservation(key)
        if known is not None:
            return known
        port = self.claims.first_free(range(self.start, self.end))
        if port is not None:
            self.claims.reserve(key, port)
            return port
        raise NoFreePort(f"no available port in {self.start}-{self.end} ({self.claims.in_use()} held)")

    def occupy(self, holder: str, port: int, key: str = "") -> None:
        """A live pod holds `port`; its reservation under `key` is no longer needed."""
        if self.start <= port < self.end:
            self.claims.occupy(holder, port, key)

    def release(self, holder: str) -> bool:
        return self.claims.release(holder)

    def held(self) -> dict[str, int]:
        return self.claims.held()


def pod_port(pod: Pod) -> int | None:
    value = pod.meta.annotation(tfa.PORT_NUMBER)
    try:
        return tfa.parse_port_number(value) if value else None
    except ValueError:
        return None


def wants_cluster_port(pod: Pod) -> bool:
    return pod.meta.label(tfa.HOST_PORT) == tfa.HOST_PORT_AUTO


class PortAllocator:
    """The cluster pool and one pool per node."""

    def __init__(self, cluster_range: tuple[int, int], node_range: tuple[int, int], *,
                 reservation_ttl: float = RESERVATION_TTL_S, now: Callable[[], float] = time.monotonic) -> None:
        self.cluster = PortPool(*cluster_range, reservation_ttl=reservation_ttl, now=now)
        self.node_range = node_range
        self.reservation_ttl = reservation_ttl
        self.now = now
        self.nodes: dict[str, PortPool] = {}

    def node(self, name: str) -> PortPool:
        if name not in self.nodes:
            self.nodes[name] = PortPool(*self.node_range, reservation_ttl=self.reservation_ttl, now=self.now)
        return self.nodes[name]

    def observe(self, uid: str, pod: Pod) -> None:
        """Record the port a live pod holds (cluster range for host-port=auto pods, else its node's)."""
        port = pod_port(pod)
        if port is None or not uid:
            return
        key = f"{pod.namespace}/{pod.name}"
        if wants_cluster_port(pod):
            self.cluster.occupy(uid, port, key)
            return
        if pod.node_name:
            self.node(pod.node_name).occupy(uid, port, key)

    def release(self, uid: str) -> bool:
        released = self.cluster.release(uid)
        for pool in self.nodes.values():
            released = pool.release(uid) or released
        return released
