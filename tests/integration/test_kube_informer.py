"""Informers against the embedded API server: the cache and the handler events end up exactly
like a fresh list after the server closes the stream and after a forced 410, with no lost and no
duplicated notifications; indexes; the shared factory; metrics."""

from __future__ import annotations

import gc
from collections import Counter
from typing import Any

import anyio
import pytest
from prometheus_client import CollectorRegistry

from tfusion.kube import informer as informer_module
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient, object_key
from tfusion.kube.informer import Informer, InformerFactory, node_name_index
from tfusion.kube.transforms import transform_for

pytestmark = pytest.mark.anyio


@pytest.fixture
async def kube(kube: KubeClient) -> KubeClient:
    """The shared client (tests/apiserver_fixture.py), with this module's namespace created."""
    await kube.create(r.NAMESPACES, {"metadata": {"name": "inf"}})
    return kube


def cm(name: str, **data: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "inf", "labels": {"tier": name[-1]}}, "data": data}


class Recorder:
    """Applies handler notifications to its own view; counts (key, resourceVersion) deliveries."""

    def __init__(self, informer: Informer) -> None:
        self.view: dict[str, str] = {}
        self.deliveries: Counter[tuple[str, str, str]] = Counter()
        informer.add_handler(on_add=self.added, on_update=self.updated, on_delete=self.deleted)

    def _note(self, kind: str, obj: dict[str, Any]) -> None:
        self.deliveries[(kind, object_key(obj), obj["metadata"]["resourceVersion"])] += 1

    def added(self, obj: dict[str, Any]) -> None:
        key = object_key(obj)
        assert key not in self.view, f"add for {key} that the handler already has"
        self.view[key] = obj["metadata"]["resourceVersion"]
        self._note("ADDED", obj)

    async def updated(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        key = object_key(new)
        assert self.view.get(key) == old["metadata"]["resourceVersion"], "update must follow what we saw"
        assert old["metadata"]["resourceVersion"] != new["metadata"]["resourceVersion"]
        self.view[key] = new["metadata"]["resourceVersion"]
        self._note("MODIFIED", new)

    def deleted(self, obj: dict[str, Any]) -> None:
        key = object_key(obj)
        assert key in self.view, f"delete for {key} that the handler never had"
        del self.view[key]
        self._note("DELETED", obj)


async def truth(kube: KubeClient) -> dict[str, str]:
    listed = await kube.list(r.CONFIGMAPS, namespace="inf")
    return {object_key(o): o["metadata"]["resourceVersion"] for o in listed}


def cache(informer: Informer) -> dict[str, str]:
    return {object_key(o): o["metadata"]["resourceVersion"] for o in informer.list()}


async def converge(kube: KubeClient, informer: Informer, recorder: Recorder, timeout: float = 10) -> None:
    expected = await truth(kube)
    with anyio.fail_after(timeout):
        while cache(informer) != expected or recorder.view != expected:
            await anyio.sleep(0.02)


def assert_no_duplicates(recorder: Recorder) -> None:
    duplicated = {k: n for k, n in recorder.deliveries.items() if n > 1}
    assert not duplicated, f"notified more than once: {duplicated}"


def closed_streams(registry: CollectorRegistry, informer: Informer) -> float | None:
    return registry.get_sample_value("tfusion_informer_watch_restarts_total",
                                     {"informer": informer.name, "cause": "closed"})


async def test_survives_closed_stream_without_loss_or_duplicates(apiserver: Any, kube: KubeClient) -> None:
    for i in range(5):
        await kube.create(r.CONFIGMAPS, cm(f"c{i}", v="0"))
    registry = CollectorRegistry()
    informer = Informer(kube, r.CONFIGMAPS, namespace="inf", registry=registry, page_size=2)
    recorder = Recorder(informer)
    async with anyio.create_task_group() as tg:
        await tg.start(informer.run)
        with anyio.fail_after(5):
            await informer.wait_synced()
        await converge(kube, informer, recorder)
        # a change seen proves the watch after the list is open: the first close must find it
        await kube.patch(r.CONFIGMAPS, "c0", {"data": {"v": "listed"}}, namespace="inf")
        await converge(kube, informer, recorder)
        for round_ in range(3):
            apiserver.close_watches()
            with anyio.fail_after(5):  # the informer saw this stream end (the next close finds its new one)
                while (closed_streams(registry, informer) or 0) < round_ + 1:
                    await anyio.sleep(0.02)
            await kube.create(r.CONFIGMAPS, cm(f"n{round_}"))
            await kube.patch(r.CONFIGMAPS, f"c{round_}", {"data": {"v": str(round_ + 1)}}, namespace="inf")
            await kube.delete(r.CONFIGMAPS, f"c{4 - round_}", namespace="inf")
            await converge(kube, informer, recorder)
        tg.cancel_scope.cancel()
    assert_no_duplicates(recorder)
    assert registry.get_sample_value("tfusion_informer_relists_total", {"informer": informer.name}) == 1
    closed = closed_streams(registry, informer)
    assert closed is not None and closed >= 3
    assert registry.get_sample_value("tfusion_informer_events_total",
                                     {"informer": informer.name, "type": "DELETED"}) == 3
    assert registry.get_sample_value("tfusion_informer_objects", {"informer": informer.name}) == 5


async def test_forced_410_relists_and_emits_only_the_differences(apiserver: Any, kube: KubeClient) -> None:
    for i in range(6):
        await kube.create(r.CONFIGMAPS, cm(f"c{i}", v="0"))
    # The informer's own client allows 1 request/s after a burst of 2 (list + watch): after the
    # server closes its stream it cannot reconnect for about a second. The changes below happen
    # in that gap and the event log is compacted, so the reconnect gets 410 and must re-list.
    slow = await KubeClient.connect(str(apiserver.kubeconfig), qps=1, burst=2)
    registry = CollectorRegistry()
    informer = Informer(slow, r.CONFIGMAPS, namespace="inf", registry=registry)
    recorder = Recorder(informer)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(informer.run)
            with anyio.fail_after(5):
                await informer.wait_synced()
            await kube.create(r.CONFIGMAPS, cm("probe"))
            await converge(kube, informer, recorder)  # the watch is open: it delivered "probe"
            before = dict(recorder.deliveries)
            apiserver.close_watches()
            await kube.create(r.CONFIGMAPS, cm("new"))
            await kube.patch(r.CONFIGMAPS, "c1", {"data": {"v": "1"}}, namespace="inf")
            await kube.delete(r.CONFIGMAPS, "c2", namespace="inf")
            await kube.patch(r.CONFIGMAPS, "c3", {"data": {"v": "1"}}, namespace="inf")
            await kube.delete(r.CONFIGMAPS, "c3", namespace="inf")  # changed, then gone
            apiserver.compact()
            await converge(kube, informer, recorder, timeout=15)
            tg.cancel_scope.cancel()
    finally:
        await slow.close()
    gone = registry.get_sample_value("tfusion_informer_watch_restarts_total",
                                     {"informer": informer.name, "cause": "gone"})
    assert gone == 1, "the reconnect must have hit 410"
    assert registry.get_sample_value("tfusion_informer_relists_total", {"informer": informer.name}) == 2
    after = {k: n for k, n in recorder.deliveries.items() if k not in before}
    kinds = sorted((kind, key) for kind, key, _ in after)
    assert kinds == [("ADDED", "inf/new"), ("DELETED", "inf/c2"), ("DELETED", "inf/c3"),
                     ("MODIFIED", "inf/c1")], "unchanged objects must not be re-announced"
    assert_no_duplicates(recorder)


async def test_indexes_follow_changes(kube: KubeClient) -> None:
    informer = Informer(kube, r.PODS)
    informer.add_index("node", node_name_index)
    tier = informer.add_label_index("tier")
    for name, node in (("p1", "n1"), ("p2", "n1"), ("p3", "n2")):
        await kube.create(r.PODS, {"metadata": {"name": name, "namespace": "inf", "labels": {"tier": name}},
                                   "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]}})
    async with anyio.create_task_group() as tg:
        await tg.start(informer.run)
        await informer.wait_synced()
        assert sorted(o["metadata"]["name"] for o in informer.by_index("node", "n1")) == ["p1", "p2"]
        assert [o["metadata"]["name"] for o in informer.by_index(tier, "p3")] == ["p3"]
        assert len(informer.by_index("namespace", "inf")) == 3
        assert informer.count_by_index("namespace", "inf") == 3 and informer.count_by_index("node", "n9") == 0
        await kube.patch(r.PODS, "p3", {"metadata": {"labels": {"tier": "gold"}}}, namespace="inf")
        await kube.delete(r.PODS, "p1", namespace="inf", grace_period_seconds=0)
        with anyio.fail_after(5):
            while informer.by_index(tier, "p3") or informer.get("inf/p1") is not None:
                await anyio.sleep(0.02)
        assert [o["metadata"]["name"] for o in informer.by_index(tier, "gold")] == ["p3"]
        assert [o["metadata"]["name"] for o in informer.by_index("node", "n1")] == ["p2"]
        assert informer.count_by_index("node", "n1") == 1 and informer.count_by_index(tier, "p3") == 0
        assert sorted(informer.index_values("node")) == ["n1", "n2"]
        with pytest.raises(KeyError, match="no index 'zone'"):
            informer.by_index("zone", "a")
        with pytest.raises(KeyError, match="no index 'zone'"):
            informer.count_by_index("zone", "a")
        tg.cancel_scope.cancel()


async def test_slow_handler_does_not_delay_the_cache_or_other_handlers(kube: KubeClient) -> None:
    informer = Informer(kube, r.CONFIGMAPS, namespace="inf")
    release = anyio.Event()
    fast: list[str] = []

    async def stuck(obj: dict[str, Any]) -> None:
        await release.wait()

    informer.add_handler(on_add=stuck)
    informer.add_handler(on_add=lambda obj: fast.append(obj["metadata"]["name"]))
    async with anyio.create_task_group() as tg:
        await tg.start(informer.run)
        await informer.wait_synced()
        for i in range(20):
            await kube.create(r.CONFIGMAPS, cm(f"s{i}"))
        with anyio.fail_after(5):
            while len(fast) < 20 or len(informer) < 20:
                await anyio.sleep(0.02)
        release.set()
        tg.cancel_scope.cancel()


async def test_handler_added_late_gets_the_existing_objects_and_failures_are_contained(
        kube: KubeClient) -> None:
    for i in range(3):
        await kube.create(r.CONFIGMAPS, cm(f"e{i}"))
    informer = Informer(kube, r.CONFIGMAPS, namespace="inf")
    seen: list[str] = []

    def broken(obj: dict[str, Any]) -> None:
        raise RuntimeError("handler bug")

    async with anyio.create_task_group() as tg:
        await tg.start(informer.run)
        await informer.wait_synced()
        informer.add_handler(on_add=broken)
        informer.add_handler(on_add=lambda obj: seen.append(obj["metadata"]["name"]))
        await kube.create(r.CONFIGMAPS, cm("e3"))
        with anyio.fail_after(5):
            while len(seen) < 4:
                await anyio.sleep(0.02)
        tg.cancel_scope.cancel()
    assert sorted(seen) == ["e0", "e1", "e2", "e3"]


def pod(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "inf", "labels": labels},
            "spec": {"containers": [{"name": "c", "image": "x"}]}}


async def test_factory_gives_each_selector_exactly_its_objects_and_starts_late_ones(kube: KubeClient) -> None:
    """One informer per (resource, namespace, selectors): the same ask gets the same informer;
    two consumers that ask for pods with different label selectors each see exactly the pods
    their selector matches, before and after a change moves a pod from one to the other; an ask
    after the start gets an informer of its own, started at once."""
    factory = InformerFactory(kube)
    workers = factory.informer(r.PODS, label_selector="tensor-fusion.ai/component=worker")
    assert factory.informer(r.PODS, label_selector="tensor-fusion.ai/component=worker") is workers
    clients = factory.informer(r.PODS, label_selector="tensor-fusion.ai/component=client")
    assert clients is not workers
    assert workers.key.label_selector == "tensor-fusion.ai/component=worker", "not widened"
    for name, component in (("w1", "worker"), ("w2", "worker"), ("c1", "client")):
        await kube.create(r.PODS, pod(name, **{"tensor-fusion.ai/component": component}))
    await kube.create(r.PODS, pod("theirs"))
    async with anyio.create_task_group() as tg:
        await tg.start(factory.run)
        with anyio.fail_after(5):
            await factory.wait_synced()
        assert sorted(workers.keys()) == ["inf/w1", "inf/w2"]
        assert clients.keys() == ["inf/c1"]
        await kube.patch(r.PODS, "w2", {"metadata": {"labels": {"tensor-fusion.ai/component": "client"}}},
                         namespace="inf")
        await kube.create(r.PODS, pod("c2", **{"tensor-fusion.ai/component": "client"}))
        await kube.create(r.PODS, pod("w3", **{"tensor-fusion.ai/component": "worker"}))
        await kube.create(r.PODS, pod("theirs-too"))
        every = factory.informer(r.PODS)  # asked after the start: an informer of its own
        assert every not in (workers, clients)
        with anyio.fail_after(5):
            await every.wait_synced()
            while "inf/w3" not in workers or "inf/c2" not in clients or "inf/w2" in workers \
                    or "inf/w3" not in every:
                await anyio.sleep(0.02)
        assert sorted(workers.keys()) == ["inf/w1", "inf/w3"]
        assert sorted(clients.keys()) == ["inf/c1", "inf/c2", "inf/w2"]
        assert {"inf/theirs", "inf/theirs-too"} <= set(every.keys())
        assert factory.informer(r.PODS) is every
        tg.cancel_scope.cancel()


async def test_informer_events_drive_a_controller(kube: KubeClient) -> None:
    from tfusion.kube.reconciler import Controller

    informer = Informer(kube, r.CONFIGMAPS, namespace="inf")
    reconciled: list[tuple[str, bool]] = []

    async def reconcile(key: str) -> None:
        reconciled.append((key, key in informer))  # level-triggered: read the cache, not the event

    controller = Controller("configmaps", reconcile, workers=2)
    controller.watch(informer)
    await kube.create(r.CONFIGMAPS, cm("before"))
    async with anyio.create_task_group() as tg:
        await tg.start(informer.run)
        await tg.start(controller.run)
        await informer.wait_synced()
        await kube.create(r.CONFIGMAPS, cm("during"))
        with anyio.fail_after(5):
            while not {("inf/before", True), ("inf/during", True)} <= set(reconciled):
                await anyio.sleep(0.02)
        await kube.delete(r.CONFIGMAPS, "before", namespace="inf")
        with anyio.fail_after(5):
            while ("inf/before", False) not in reconciled:
                await anyio.sleep(0.02)
        tg.cancel_scope.cancel()


async def test_survives_an_api_server_restart(apiserver: Any, kube: KubeClient) -> None:
    await kube.create(r.CONFIGMAPS, cm("r0"))
    informer = Informer(kube, r.CONFIGMAPS, namespace="inf", backoff_base=0.05)
    recorder = Recorder(informer)
    async with anyio.create_task_group() as tg:
        await tg.start(informer.run)
        await informer.wait_synced()
        await anyio.to_thread.run_sync(apiserver.restart)
        await kube.create(r.CONFIGMAPS, cm("r1"))
        await kube.delete(r.CONFIGMAPS, "r0", namespace="inf")
        await converge(kube, informer, recorder)
        tg.cancel_scope.cancel()
    assert_no_duplicates(recorder)


async def test_siblings_share_transformed_objects(kube: KubeClient) -> None:
    """Informers of one resource in one factory cache one object per (key, resourceVersion): the
    scheduler's informer on every pod and the controller's on its own pods hold the same dict,
    transformed once (kube/transforms.py), before and after a change."""
    factory = InformerFactory(kube)
    factory.set_transform(r.PODS, transform_for(r.PODS))
    ours = factory.informer(r.PODS, label_selector="tensor-fusion.ai/component")
    every = factory.informer(r.PODS)
    spec = {"containers": [{"name": "c", "image": "i", "terminationMessagePath": "/dev/termination-log"}],
            "volumes": [{"name": "v", "emptyDir": {}}]}
    await kube.create(r.PODS, {**pod("shared", **{"tensor-fusion.ai/component": "worker"}), "spec": spec})
    async with anyio.create_task_group() as tg:
        await tg.start(factory.run)
        with anyio.fail_after(5):
            await factory.wait_synced()
        first = ours.get("inf/shared")
        assert first is not None and every.get("inf/shared") is first
        assert "volumes" not in first["spec"] and "terminationMessagePath" not in first["spec"]["containers"][0]
        changed = await kube.patch(r.PODS, "shared", {"metadata": {"labels": {"x": "y"}}}, namespace="inf")
        rv = changed["metadata"]["resourceVersion"]
        with anyio.fail_after(5):
            while any((inf.get("inf/shared") or {})["metadata"]["resourceVersion"] != rv for inf in (ours, every)):
                await anyio.sleep(0.02)
        assert ours.get("inf/shared") is every.get("inf/shared")
        tg.cancel_scope.cancel()


async def test_the_initial_list_is_applied_page_by_page(kube: KubeClient) -> None:
    """Each page is in the cache before the next is fetched (a 100,000-pod list never sits in
    memory whole), the cyclic collector is paused while the list runs, and the synced cache holds
    every object at the list's resourceVersion."""
    for i in range(7):
        await kube.create(r.CONFIGMAPS, cm(f"p{i}"))
    informer = Informer(kube, r.CONFIGMAPS, namespace="inf", page_size=2)
    cached_when_fetched: list[int] = []
    collector_on: list[bool] = []
    pages = kube.list_pages

    def watching_pages(*args: Any, **kwargs: Any) -> Any:
        async def each() -> Any:
            async for page in pages(*args, **kwargs):
                cached_when_fetched.append(len(informer))
                collector_on.append(gc.isenabled())
                yield page
        return each()

    kube.list_pages = watching_pages  # type: ignore[method-assign]
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(informer.run)
            with anyio.fail_after(5):
                await informer.wait_synced()
            tg.cancel_scope.cancel()
    finally:
        del kube.list_pages
    assert cached_when_fetched == [0, 2, 4, 6]
    assert collector_on == [False] * 4 and gc.isenabled()
    assert sorted(informer.keys()) == [f"inf/p{i}" for i in range(7)]
    assert informer.resource_version == (await kube.list(r.CONFIGMAPS, namespace="inf")).resource_version


async def test_a_large_first_list_leaves_the_collector_before_it_is_back_on(
        kube: KubeClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """A first list of `FREEZE_AT` objects or more is frozen (out of the cyclic collector's walks)
    while the collector is still paused: switched back on first, its first pass would walk every
    object the list made. A later list (after a 410) freezes nothing."""
    for i in range(3):
        await kube.create(r.CONFIGMAPS, cm(f"z{i}"))
    frozen_with_collector: list[bool] = []
    monkeypatch.setattr(informer_module, "FREEZE_AT", 3)
    monkeypatch.setattr(informer_module, "freeze_long_lived",
                        lambda collect=True: frozen_with_collector.append(gc.isenabled()))
    informer = Informer(kube, r.CONFIGMAPS, namespace="inf", page_size=2)
    async with anyio.create_task_group() as tg:
        await tg.start(informer.run)
        with anyio.fail_after(5):
            await informer.wait_synced()
        await informer._relist()
        tg.cancel_scope.cancel()
    assert frozen_with_collector == [False] and gc.isenabled()


async def test_a_listed_pod_is_cached_as_its_whole_json_transformed(kube: KubeClient) -> None:
    """The list's pages are decoded without managedFields (kube/transforms.py `pruned_decoder`): the
    cached pod equals the transform of the pod as the API server has it, every field but the
    dropped ones intact, and a ConfigMap (a kind with fields outside spec and status) keeps its data."""
    spec = {"containers": [{"name": "c", "image": "i"}], "hostname": "h"}
    await kube.create(r.PODS, {**pod("listed", app="x"), "spec": spec})
    await kube.create(r.CONFIGMAPS, cm("listed", v="kept"))
    whole = await kube.get(r.PODS, "listed", namespace="inf")
    assert whole["metadata"].get("managedFields"), "the API server stamps managedFields on create"
    factory = InformerFactory(kube)
    factory.set_transform(r.PODS, transform_for(r.PODS))
    pods, maps = factory.informer(r.PODS), factory.informer(r.CONFIGMAPS)
    async with anyio.create_task_group() as tg:
        await tg.start(factory.run)
        with anyio.fail_after(5):
            await factory.wait_synced()
        tg.cancel_scope.cancel()
    assert pods.get("inf/listed") == transform_for(r.PODS)(whole)
    assert (maps.get("inf/listed") or {}).get("data") == {"v": "kept"}


def mine(informer: Informer) -> list[str]:
    """The keys of this test's pods (named f-...) in `informer`."""
    keys = informer.keys()
    return sorted(key for key in keys if key.startswith("inf/f-"))


async def test_a_label_selected_informer_follows_the_unselected_one(kube: KubeClient) -> None:
    """Where a factory holds an informer of a resource without selectors, one that selects by
    labels alone takes its objects from it (one list and watch for both), whichever was asked for
    first: it holds exactly the pods its selector matches, the same dicts; its handlers see a pod
    whose labels start matching as added and one whose labels stop matching, or that is deleted,
    as deleted; it is synced with its source."""
    factory = InformerFactory(kube)
    ours = factory.informer(r.PODS, label_selector="tensor-fusion.ai/component")
    every = factory.informer(r.PODS)
    late = factory.informer(r.PODS, label_selector="tier in (a)")
    assert ours.source is every and late.source is every and every.source is None
    seen: list[tuple[str, str]] = []
    ours.add_handler(on_add=lambda o: seen.append(("add", object_key(o))),
                     on_update=lambda _o, n: seen.append(("update", object_key(n))),
                     on_delete=lambda o: seen.append(("delete", object_key(o))))
    await kube.create(r.PODS, pod("f-w1", **{"tensor-fusion.ai/component": "worker"}))
    await kube.create(r.PODS, pod("f-theirs"))
    async with anyio.create_task_group() as tg:
        await tg.start(factory.run)
        with anyio.fail_after(5):
            await factory.wait_synced()
        assert mine(ours) == ["inf/f-w1"]
        assert ours.get("inf/f-w1") is every.get("inf/f-w1")
        assert ours.resource_version == every.resource_version
        await kube.patch(r.PODS, "f-theirs", {"metadata": {"labels": {"tensor-fusion.ai/component": "client"}}},
                         namespace="inf")
        await kube.patch(r.PODS, "f-w1", {"metadata": {"labels": {"tensor-fusion.ai/component": None}}},
                         namespace="inf")
        await kube.create(r.PODS, pod("f-w2", **{"tensor-fusion.ai/component": "worker"}))
        await kube.patch(r.PODS, "f-w2", {"metadata": {"labels": {"x": "y"}}}, namespace="inf")
        await kube.delete(r.PODS, "f-w2", namespace="inf")
        wanted = [("add", "inf/f-w1"), ("add", "inf/f-theirs"), ("delete", "inf/f-w1"), ("add", "inf/f-w2"),
                  ("update", "inf/f-w2"), ("delete", "inf/f-w2")]
        with anyio.fail_after(5):
            while [e for e in seen if e[1].startswith("inf/f-")] != wanted:
                await anyio.sleep(0.02)
        assert mine(ours) == ["inf/f-theirs"]
        assert "inf/f-w1" in every and "inf/f-w1" not in ours
        tg.cancel_scope.cancel()
