"""Pods and contexts for the webhook's mutate() unit tests."""

from __future__ import annotations

from typing import Any

from tfusion.api import annotations as tfa
from tfusion.controller.webhook.mutate import Context, Owner

POOL = "pool-a"


def pool(name: str = POOL, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "annotations": {tfa.IS_DEFAULT_POOL: "true"}},
            "spec": {"nodeManagerConfig": {"defaultVendor": "NVIDIA"}, **spec}}


PROVIDER = {"metadata": {"name": "nvidia"}, "spec": {
    "vendor": "NVIDIA", "images": {"middleware": "mw:1"}, "inUseResourceNames": ["nvidia.com/gpu"]}}


def ctx(**changes: Any) -> Context:
    base: dict[str, Any] = {"pools": [pool()], "provider_configs": [PROVIDER]}
    base.update(changes)
    return Context(**base)


def tf_pod(notes: dict[str, str] | None = None, *, labels: dict[str, str] | None = None,
           containers: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "labels": {tfa.ENABLED: "true", **(labels or {})},
                         "annotations": dict(notes or {})},
            "spec": {"containers": containers or [{"name": "app", "image": "python"}]}}


BARE = {tfa.TFLOPS_REQUEST: "20", tfa.VRAM_REQUEST: "8Gi"}


OWNER = Owner(workload_name="p")


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}
