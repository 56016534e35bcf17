"""The Manager and the one Reconciler shape, against the embedded API server over HTTP: the builder's
triggers (for_, owns, watches, predicates), level-triggered reads of the shared cache, a 409 that
requeues, an exception that backs off and counts, the finalizer protocol, leader-only runnables that
wait for the caches, and one informer per resource for every consumer of a process."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tfusion.api.accessors import Body
from tfusion.kube import resources as r
from tfusion.kube.client import Conflict, KubeClient
from tfusion.kube.manager import Manager, stable_identity
from tfusion.kube.reconciler import Result, ensure_finalizer, generation_changed
from tfusion.settings import Settings

pytestmark = pytest.mark.anyio

NS = "rec"
FINALIZER = "example.com/cleanup"


@pytest.fixture
async def kube(kube: KubeClient) -> KubeClient:
    await kube.create(r.NAMESPACES, {"metadata": {"name": NS}})
    return kube


def settings(**changes: Any) -> Settings:
    return Settings(roles=("controller",), leader_elect=False).replace(**changes)


def configmap(name: str, *, owner: dict[str, Any] | None = None, **data: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": NS}
    if owner is not None:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Secret", "name": owner["metadata"]["name"],
                                    "uid": owner["metadata"]["uid"], "controller": True}]
    return {"metadata": meta, "data": data}


async def until(check: Any, what: str, timeout: float = 10.0) -> None:
    with anyio.fail_after(timeout):
        while not check():
            await anyio.sleep(0.02)


async def test_builder_triggers_predicates_conflicts_and_errors(kube: KubeClient) -> None:
    manager = Manager(settings(), kube)
    seen: list[str] = []
    failures = {"rec/flaky": 2}

    async def reconcile(key: str) -> Result | None:
        seen.append(key)
        if failures.get(key, 0) > 0:
            failures[key] -= 1
            raise RuntimeError("transient")
        if key == "rec/conflicted" and seen.count(key) == 1:
            raise Conflict({"code": 409, "reason": "Conflict", "message": "changed"})
        return None

    controller = manager.controller("secrets").for_(r.SECRETS, predicates=[generation_changed]) \
        .owns(r.CONFIGMAPS) \
        .watches(r.SERVICEACCOUNTS, lambda sa: [f"{NS}/from-{Body(sa).name}"]) \
        .complete(reconcile)
    assert controller.primary is manager.cache.informer(r.SECRETS)
    owner = await kube.create(r.SECRETS, {"metadata": {"name": "owner", "namespace": NS}})
    async with anyio.create_task_group() as tg:
        await tg.start(manager.run)
        await until(lambda: "rec/owner" in seen, "initial key of an existing primary object")
        await kube.create(r.CONFIGMAPS, configmap("child", owner=owner))
        await until(lambda: seen.count("rec/owner") >= 2, "owns(): the owner of a new child")
        await kube.create(r.SERVICEACCOUNTS, {"metadata": {"name": "sa", "namespace": NS}})
        await until(lambda: "rec/from-sa" in seen, "watches(): the mapped key")
        await kube.create(r.SECRETS, {"metadata": {"name": "flaky", "namespace": NS}})
        await until(lambda: seen.count("rec/flaky") == 3, "an exception requeues with backoff")
        await kube.create(r.SECRETS, {"metadata": {"name": "conflicted", "namespace": NS}})
        await until(lambda: seen.count("rec/conflicted") == 2, "a 409 requeues")
        before = seen.count("rec/owner")
        # secrets have no generation: a label change does not pass generation_changed
        await kube.patch(r.SECRETS, "owner", {"metadata": {"labels": {"a": "b"}}}, namespace=NS)
        # the informer hands events on in order: once a later create is reconciled, the label
        # change before it has been through the predicate
        await kube.create(r.SECRETS, {"metadata": {"name": "later", "namespace": NS}})
        await until(lambda: "rec/later" in seen, "the key of an object created after the label change")
        assert seen.count("rec/owner") == before, "filtered by the predicate"
        tg.cancel_scope.cancel()
    registry = manager.registry
    assert registry.get_sample_value("tfusion_reconcile_errors_total", {"name": "secrets"}) == 2
    assert registry.get_sample_value("tfusion_reconcile_total", {"name": "secrets", "result": "conflict"}) == 1


async def test_finalizer_is_added_then_cleanup_runs_before_it_goes(kube: KubeClient) -> None:
    manager = Manager(settings(), kube)
    cleaned: list[str] = []
    ready_to_go = {"value": False}

    async def cleanup(obj: Body) -> bool:
        cleaned.append(obj.name)
        return ready_to_go["value"]

    cache = manager.cache.informer(r.CONFIGMAPS, field_selector=f"metadata.namespace={NS}")

    async def reconcile(key: str) -> Result | None:
        obj = cache.get(key)
        if obj is None:
            return None
        current = await ensure_finalizer(kube, r.CONFIGMAPS, Body(obj), FINALIZER, cleanup)
        return Result(requeue_after=0.05) if current is None else None

    controller = manager.controller("finalized").for_(r.CONFIGMAPS, field_selector=f"metadata.namespace={NS}") \
        .complete(reconcile)
    assert controller.primary is cache
    await kube.create(r.CONFIGMAPS, configmap("guarded"))
    async with anyio.create_task_group() as tg:
        await tg.start(manager.run)

        async def finalizers() -> list[str]:
            got = await kube.get(r.CONFIGMAPS, "guarded", namespace=NS)
            return list(got["metadata"].get("finalizers") or [])

        with anyio.fail_after(10):
            while await finalizers() != [FINALIZER]:
                await anyio.sleep(0.02)
        await kube.delete(r.CONFIGMAPS, "guarded", namespace=NS)
        await until(lambda: len(cleaned) >= 2, "cleanup runs, and again while it is not done")
        assert (await kube.get(r.CONFIGMAPS, "guarded", namespace=NS))["metadata"]["deletionTimestamp"]
        ready_to_go["value"] = True
        with anyio.fail_after(10):
            while (await kube.list(r.CONFIGMAPS, namespace=NS)).items:
                await anyio.sleep(0.02)
        tg.cancel_scope.cancel()
    assert set(cleaned) == {"guarded"}


async def test_leader_runnables_wait_for_every_cache_and_each_selector_has_one_informer(
        kube: KubeClient) -> None:
    manager = Manager(settings(), kube)
    pods_ours = manager.cache.informer(r.PODS, label_selector="tensor-fusion.ai/component")
    pods_node = manager.cache.informer(r.PODS, field_selector="spec.nodeName=n1")
    assert pods_ours is not pods_node, "different selectors: an informer each, none widened"
    assert manager.cache.informer(r.PODS, field_selector="spec.nodeName=n1") is pods_node, "same: shared"
    started: list[bool] = []
    late: list[str] = []

    async def leader_work() -> None:
        started.append(pods_ours.synced and pods_node.synced)
        await anyio.sleep_forever()

    async def every_replica() -> None:
        late.append("ran")

    manager.add(leader_work, leader_only=True)
    async with anyio.create_task_group() as tg:
        await tg.start(manager.run)
        await until(lambda: bool(started), "the leader-only runnable")
        assert started == [True], "started only once the caches synced"
        assert manager.is_leader and manager.terms == 1
        manager.add(every_replica, leader_only=False)  # added while running: starts at once
        await until(lambda: late == ["ran"], "a runnable added after start")
        assert manager.registry.get_sample_value("tfusion_kube_clients") is not None
        tg.cancel_scope.cancel()
    assert not manager.is_leader


def test_stable_identity() -> None:
    pod = Settings(roles=("controller",), pod_name="ctl-7d9f")
    assert stable_identity(pod) == "ctl-7d9f"
    embedded = Settings(roles=("all",), node_name="box", state="/tmp/a/state.db")
    assert stable_identity(embedded) == stable_identity(embedded), "the same installation, the same identity"
    assert stable_identity(embedded) != stable_identity(embedded.replace(state="/tmp/b/state.db"))
    by_hand = Settings(roles=("controller",))
    assert stable_identity(by_hand) != stable_identity(by_hand), "unique when nothing names the replica"
