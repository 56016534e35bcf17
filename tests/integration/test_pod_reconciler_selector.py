"""The pod reconciler declares the pods it reconciles (ours: those with the component label) and
gets exactly those from the Manager's cache, though the scheduler in the same Manager watches
every pod: a pod of someone else's, there before the controller starts or created after, is never
reconciled, and the pod reconciler's cache does not hold it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.apiserver_fixture import apply_crds
from tests.helpers import eventually, no_error_logged_fixture
from tests.helpers.controller import controllers, kube_client, settings_for, start_controller
from tfusion.api import annotations as tfa
from tfusion.controller.role import ControllerRole, configure
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient
from tfusion.kube.reconciler import Result

pytestmark = pytest.mark.anyio

no_error_logged = no_error_logged_fixture(autouse=True)


def pod(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "default", "labels": labels},
            "spec": {"containers": [{"name": "c", "image": "app"}]}}


def noting_pod_reconciles(reconciled: list[str]) -> Any:
    """configure(), then the pod reconciler's own reconcile runs as before and its keys are noted."""

    def prepare(runtime: ControllerRole) -> None:
        configure(runtime)
        assert runtime.reconcilers is not None
        controller = runtime.reconcilers.pod.controller
        reconcile = controller.reconcile

        async def noted(key: str) -> Result | None:
            reconciled.append(key)
            return await reconcile(key)

        controller.reconcile = noted

    return prepare


async def has_finalizer(kube: KubeClient, name: str) -> bool:
    found = await kube.get(r.PODS, name, namespace="default")
    return tfa.FINALIZER in (found["metadata"].get("finalizers") or [])


async def test_the_pod_reconciler_is_not_called_for_a_pod_that_is_not_ours(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    reconciled: list[str] = []
    async with kube_client(apiserver) as kube, controllers() as tg:
        await kube.create(r.PODS, pod("theirs-before", {"app": "web"}))
        ctl = await start_controller(tg, settings_for(apiserver, tmp_path), prepare=noting_pod_reconciles(reconciled))
        # created in this order: a widened cache would hand the reconciler `theirs-after` first
        await kube.create(r.PODS, pod("theirs-after", {"app": "web"}))
        await kube.create(r.PODS, pod("ours", {tfa.COMPONENT: tfa.COMPONENT_WORKER, tfa.WORKLOAD: "ours"}))
        await eventually(lambda: has_finalizer(kube, "ours"), what="our worker reconciled (its finalizer)")
        scheduler = ctl.runtime.scheduler
        assert scheduler is not None and ctl.runtime.reconcilers is not None

        async def seen_by_the_scheduler() -> bool:
            return {"default/theirs-before", "default/theirs-after"} <= set(scheduler.pods.keys())

        await eventually(seen_by_the_scheduler, what="their pods in the scheduler's every-pod informer")
        assert "default/ours" in reconciled
        assert [key for key in reconciled if "theirs" in key] == [], "only the pods it asked for"
        primary = ctl.runtime.reconcilers.pod.controller.primary
        assert primary is ctl.runtime.informer(r.PODS) and primary is not scheduler.pods
        assert sorted(primary.keys()) == ["default/ours"]
        assert not await has_finalizer(kube, "theirs-after")
        ready = (await ctl.http.get("/readyz")).json()["conditions"]
        named = {c["name"]: c["ready"] for c in ready}
        assert named["informer pods"] and named["scheduler informer pods"], "/readyz waits for both"
