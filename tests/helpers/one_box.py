"""A simulated node and a Manager running the controllers a test names, on the test's API server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio

from tfusion.embedded.devices import DevicePlan
from tfusion.embedded.kubelet import SimulatedKubelet
from tfusion.kube.client import KubeClient
from tfusion.kube.manager import Manager
from tfusion.settings import Settings


@asynccontextmanager
async def simulated_node(kube: KubeClient, node: str,
                         register: Callable[[Manager], object]) -> AsyncIterator[KubeClient]:
    """A simulated kubelet for `node` (no GPUs) and a leader Manager with what `register` adds to it
    (the workload controllers, the Endpoints controller, ...), running until the block ends."""
    settings = Settings.load({}, env={}, roles=("all",)).replace(node_name=node, leader_elect=False)
    manager = Manager(settings, kube)
    kubelet = SimulatedKubelet(manager, node, DevicePlan("auto", (), "none", "no GPUs in this test"))
    register(manager)
    async with anyio.create_task_group() as tg:
        await tg.start(kubelet.run)
        await tg.start(manager.run)
        yield kube
        tg.cancel_scope.cancel()
