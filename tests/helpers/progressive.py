"""Running TensorFusion workers and native GPU requests for the progressive-migration tests."""

from __future__ import annotations

from typing import Any

from tfusion.api import annotations as tfa

#: what the NVIDIA device plugin advertises on these nodes
NATIVE_GPUS = {"nvidia.com/gpu": "2"}


def running_worker(name: str, node: str) -> dict[str, Any]:
    """A TensorFusion worker already bound to `node` (as the scheduler leaves one)."""
    return {"metadata": {"name": name, "namespace": "default", "labels": {tfa.COMPONENT: "worker"}},
            "spec": {"nodeName": node, "containers": [{"name": "w", "image": "worker"}]}}
