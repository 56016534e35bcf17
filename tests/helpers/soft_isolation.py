"""A hypervisor with soft isolation and the node and pool it serves."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from pathlib import Path

import httpx

from tests.apiserver_fixture import ApiServerHandle
from tests.helpers.kube_hypervisor import kube_hypervisor
from tfusion.kube.client import KubeClient
from tfusion.kube.resources import GPUNODES, GPUPOOLS, SERVICEACCOUNTS

NODE = "gpu-node-soft"


SPEC = "sim:2xA100-SXM4-80GB,1xH100-SXM5-80GB"


def hypervisor(apiserver: ApiServerHandle, state: Path) -> AbstractAsyncContextManager[httpx.AsyncClient]:
    """A hypervisor on this module's node, its shared memory under `state`."""
    return kube_hypervisor(apiserver, state, node=NODE, devices=SPEC)


async def setup_node(kube: KubeClient) -> None:
    pool = await kube.create(GPUPOOLS, {"metadata": {"name": "pool-soft"}, "spec": {"nodeManagerConfig": {}}})
    await kube.create(GPUNODES, {"metadata": {"name": NODE, "ownerReferences": [{
        "apiVersion": "tensor-fusion.ai/v1", "kind": "GPUPool", "name": "pool-soft",
        "uid": pool["metadata"]["uid"], "controller": True}]}, "spec": {}})
    try:
        await kube.create(SERVICEACCOUNTS, {"metadata": {"name": "default", "namespace": "default"}})
    except Exception:  # the API server may have made it
        pass
