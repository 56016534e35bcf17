"""A GPUPool that sets component fields tfusion does not honour says so: one Warning Event per field
and the ComponentConfigHonoured condition naming each, following the spec as fields come and go;
fields tfusion honours, and fields at their inert default, are not reported."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.apiserver_fixture import apply_crds
from tests.helpers import eventually
from tests.helpers.controller import controllers, kube_client, settings_for, start_controller
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient

pytestmark = pytest.mark.anyio

IMAGE = "spec.componentConfig.hypervisor.image"
AUTO_UPDATE = "spec.nodeManagerConfig.nodePoolRollingUpdatePolicy.autoUpdateHypervisor"
SELECTOR = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["yes"]}]}]}


async def _condition(kube: KubeClient, pool: str) -> dict[str, Any] | None:
    found = await kube.get(r.GPUPOOLS, pool)
    conditions = (found.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == "ComponentConfigHonoured"), None)


async def _warnings(kube: KubeClient, pool: str) -> list[str]:
    return sorted(e["message"] for e in await kube.list(r.EVENTS, namespace="default")
                  if e["involvedObject"].get("name") == pool and e.get("reason") == "ComponentConfigIgnored")


async def test_each_unhonoured_field_is_named_in_an_event_and_the_condition(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube, controllers() as tg:
        await kube.create(r.GPUPOOLS, {"metadata": {"name": "odd"}, "spec": {
            "nodeManagerConfig": {"nodeSelector": SELECTOR, "nodePoolRollingUpdatePolicy": {
                "autoUpdateHypervisor": True, "batchPercentage": 100}},
            "componentConfig": {"hypervisor": {"image": "example/hv:1", "portNumber": 8001},
                                "client": {"image": "example/client:1"}}}})
        await kube.create(r.GPUPOOLS, {"metadata": {"name": "plain"}, "spec": {
            "nodeManagerConfig": {"nodeSelector": SELECTOR},
            "componentConfig": {"worker": {"image": "example/worker:1"}}}})
        await start_controller(tg, settings_for(apiserver, tmp_path))

        async def both_named() -> bool:
            found = await _condition(kube, "odd")
            return found is not None and IMAGE in found["message"] and len(await _warnings(kube, "odd")) == 2

        await eventually(both_named, what="the condition and one Warning per unhonoured field")
        found = await _condition(kube, "odd")
        assert found is not None
        assert (found["status"], found["reason"]) == ("False", "FieldsNotHonoured")
        assert AUTO_UPDATE in found["message"] and "one hypervisor DaemonSet" in found["message"]
        for kept in ("batchPercentage", "portNumber", "client.image"):
            assert kept not in found["message"]
        warnings = await _warnings(kube, "odd")
        assert warnings[0].startswith(f"{IMAGE} is set but tfusion does not honour it: ")
        assert warnings[1].startswith(f"{AUTO_UPDATE} is set")
        plain = await kube.get(r.GPUPOOLS, "plain")
        assert (plain.get("status") or {}).get("conditions"), "the plain pool has been reconciled"
        assert await _condition(kube, "plain") is None, "a pool that sets none gets no condition"

        await kube.patch(r.GPUPOOLS, "odd", {"spec": {"componentConfig": {"hypervisor": {"image": None}}}})

        async def image_gone() -> bool:
            found = await _condition(kube, "odd")
            return found is not None and IMAGE not in found["message"] and AUTO_UPDATE in found["message"]

        await eventually(image_gone, what="the condition following the spec")
        await kube.patch(r.GPUPOOLS, "odd", {"spec": {"nodeManagerConfig": {
            "nodePoolRollingUpdatePolicy": {"autoUpdateHypervisor": False}}}})

        async def honoured() -> bool:
            found = await _condition(kube, "odd")
            return found is not None and (found["status"], found["reason"]) == ("True", "AllFieldsHonoured")

        await eventually(honoured, what="the condition True once no such field is set")
        assert len(await _warnings(kube, "odd")) == 2, "no new Event for fields already reported"
