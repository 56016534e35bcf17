"""The controller's pod webhook served in a test (settings, registration) and the pods tests send through it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.apiserver_fixture import apply_crds
from tests.helpers import eventually
from tests.helpers.controller import Controller, kube_client, settings_for, start_controller
from tfusion.api import annotations as tfa
from tfusion.controller.webhook.registration import CONFIGURATION_NAME, MUTATING_WEBHOOK_CONFIGURATIONS
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient, KubeError
from tfusion.settings import Settings

OPS = "tf-ops"


SERVICE = "tensor-fusion-webhook"


POOL = "pool-a"


PRIORITY_CLASSES = r.ApiResource("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", False)


BARE = {tfa.TFLOPS_REQUEST: "20", tfa.VRAM_REQUEST: "8Gi"}


async def create_pool_and_provider(client: KubeClient) -> None:
    """The operator namespace, the default pool POOL and an NVIDIA ProviderConfig: what the webhook reads."""
    await client.create(r.NAMESPACES, {"metadata": {"name": OPS}})
    await client.create(r.GPUPOOLS, {"metadata": {"name": POOL, "annotations": {tfa.IS_DEFAULT_POOL: "true"}},
                                     "spec": {"nodeManagerConfig": {}}})
    await client.create(r.PROVIDERCONFIGS, {"metadata": {"name": "nvidia"}, "spec": {
        "vendor": "NVIDIA", "images": {"middleware": "mw:1"}, "inUseResourceNames": ["nvidia.com/gpu"]}})


@pytest.fixture(name="kube")
async def kube_with_webhook_objects(apiserver: Any) -> AsyncIterator[KubeClient]:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as client:
        await create_pool_and_provider(client)
        for name, value in (("high", 10000), ("critical", 100000)):
            await client.create(PRIORITY_CLASSES, {"metadata": {"name": f"tensor-fusion-{name}"}, "value": value})
        yield client


def webhook_settings(apiserver: Any, tmp_path: Path, **changes: Any) -> Settings:
    return settings_for(apiserver, tmp_path, dynamic_config_interval=0.1, **changes)


async def serve_webhook(tg: Any, kube: KubeClient, settings: Settings) -> Controller:
    """A controller whose webhook is reachable through the Service, registered with a caBundle."""
    ctl = await start_controller(tg, settings)
    webhook = ctl.runtime.webhook
    assert webhook is not None
    service: dict[str, Any] = {"metadata": {"name": SERVICE, "namespace": OPS},
               "spec": {"ports": [{"port": 443, "targetPort": webhook.address[1]}]}}
    try:
        await kube.create(r.SERVICES, service, namespace=OPS)
    except KubeError:
        current = await kube.get(r.SERVICES, SERVICE, namespace=OPS)
        await kube.replace(r.SERVICES, {**current, "spec": {**current["spec"], **service["spec"]}}, namespace=OPS)

    async def registered() -> bool:
        try:
            config = await kube.get(MUTATING_WEBHOOK_CONFIGURATIONS, CONFIGURATION_NAME)
        except KubeError:
            return False
        return bool(config["webhooks"][0]["clientConfig"].get("caBundle") == webhook.certs.ca_bundle)

    await eventually(registered, what="the MutatingWebhookConfiguration with the caBundle")
    return ctl


def pod(name: str, notes: dict[str, str] | None = None, *, labels: dict[str, str] | None = None,
        containers: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": {tfa.ENABLED: "true", **(labels or {})},
                         "annotations": dict(notes or {})},
            "spec": {"containers": containers or [{"name": "app", "image": "python:3.11-slim"}]}}
