"""Preemption in the built-in scheduler, in-process controller against the embedded API server over
real HTTP: a `critical` pod on a GPU full of `low` pods evicts one (Eviction API), with a Preempted
event on the victim naming the preemptor, a Preempting event and an explanation on the preemptor,
its nominatedNodeName, and its binding only once the victim is gone; a protected pod is never
chosen and the preemptor says why it waits; victims stay in the namespace unless preemption is
cluster-wide; a PodDisruptionBudget that allows no disruption keeps its pods; a pod never preempts
one of its own priority; a pod whose preemptionPolicy is Never preempts nothing; the namespace
quota is judged with the victims' usage subtracted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.apiserver_fixture import apply_crds
from tests.helpers import eventually
from tests.helpers.controller import controllers, create_gpu, create_pool, kube_client, settings_for, start_controller
from tests.helpers.preemption import events_with, node_of, pod_names, priority_classes, qos_pod
from tests.helpers.scheduler import create_node, events_for, scheduled_condition
from tfusion.api import annotations as tfa
from tfusion.controller.scheduling.preemption import PDBS
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient

pytestmark = pytest.mark.anyio

HOLD = "example.com/hold"


async def one_gpu(kube: KubeClient, vram: str = "16Gi") -> None:
    await apply_priority_and_pool(kube)
    await create_node(kube, "node-a")
    await create_gpu(kube, "gpu-a1", "node-a", vram=vram)


async def apply_priority_and_pool(kube: KubeClient) -> None:
    await priority_classes(kube)
    await create_pool(kube)


async def all_bound(kube: KubeClient, names: list[str], namespace: str = "default") -> bool:
    return all([await node_of(kube, n, namespace) for n in names])


async def deleting(kube: KubeClient, namespace: str = "default") -> list[str]:
    return sorted(p["metadata"]["name"] for p in await kube.list(r.PODS, namespace=namespace)
                  if p["metadata"].get("deletionTimestamp"))


async def waiting_note(kube: KubeClient, name: str, text: str) -> dict[str, Any] | None:
    condition = await scheduled_condition(kube, name)
    return condition if condition is not None and text in condition["message"] else None


async def test_a_critical_pod_preempts_one_low_pod_and_binds_once_it_is_gone(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube:
        await one_gpu(kube)
        async with controllers() as tg:
            ctl = await start_controller(tg, settings_for(apiserver, tmp_path))
            lows = [f"low-{i}" for i in range(4)]
            for name in lows:  # 4 x 4Gi: the 16Gi GPU is full
                await kube.create(r.PODS, qos_pod(name, "low", vram="4Gi", extra={}))
            await eventually(lambda: all_bound(kube, lows), what="the low pods bound")
            for name in lows:  # the victim stays until the test lets it go
                await kube.patch(r.PODS, name, [{"op": "add", "path": "/metadata/finalizers/-", "value": HOLD}],
                                 namespace="default", patch_type="json")
            await kube.create(r.PODS, qos_pod("crit", "critical", vram="4Gi"))

            victims = await eventually(lambda: deleting(kube), what="a low pod evicted")
            assert len(victims) == 1 and victims[0] in lows
            victim = victims[0]
            preempted = await eventually(lambda: events_for(kube, victim, "Preempted"), what="Preempted event")
            assert preempted[0]["message"] == "Preempted by pod default/crit on node node-a"
            preempting = await eventually(lambda: events_for(kube, "crit", "Preempting"), what="Preempting event")
            assert f"default/{victim} (priority 0)" in preempting[0]["message"]
            assert "node node-a" in preempting[0]["message"]

            async def nominated() -> str | None:
                pod = await kube.get(r.PODS, "crit", namespace="default")
                return (pod.get("status") or {}).get("nominatedNodeName")

            assert await eventually(nominated, what="nominatedNodeName") == "node-a"
            why = (await ctl.http.get("/api/why", params={"namespace": "default", "name": "crit"})).json()
            assert f"preemption: preempted default/{victim} (priority 0) on node node-a" in why["message"]
            assert why["scheduled"] is False
            await anyio.sleep(0.3)  # the victim is still there (held by a finalizer): no bind yet
            assert await node_of(kube, "crit") is None

            for name in lows:
                pod = await kube.get(r.PODS, name, namespace="default")
                kept = [f for f in pod["metadata"]["finalizers"] if f != HOLD]
                await kube.patch(r.PODS, name, {"metadata": {"finalizers": kept}}, namespace="default")
            assert await eventually(lambda: node_of(kube, "crit"), what="crit bound") == "node-a"
            names = await pod_names(kube)
            assert victim not in names and set(lows) - {victim} <= names
            assert await deleting(kube) == []
            pod = await kube.get(r.PODS, "crit", namespace="default")
            assert pod["metadata"]["annotations"][tfa.GPU_IDS] == "gpu-a1"


async def test_a_protected_low_pod_is_never_chosen(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube:
        await one_gpu(kube)
        async with controllers() as tg:
            await start_controller(tg, settings_for(apiserver, tmp_path))
            # the protected pod has the lower priority: it alone would be kube's first choice
            await kube.create(r.PODS, qos_pod("guarded", "low", vram="8Gi", extra={tfa.EVICTION_PROTECTION: "1h"}))
            await kube.create(r.PODS, qos_pod("plain", "high", vram="8Gi"))
            await eventually(lambda: all_bound(kube, ["guarded", "plain"]), what="both bound")
            await kube.create(r.PODS, qos_pod("crit-1", "critical", vram="8Gi"))
            assert await eventually(lambda: node_of(kube, "crit-1"), what="crit-1 bound") == "node-a"
            names = await pod_names(kube)
            assert "guarded" in names and "plain" not in names

            await kube.create(r.PODS, qos_pod("crit-2", "critical", vram="8Gi"))
            condition = await eventually(lambda: waiting_note(kube, "crit-2", "preemption:"), what="the note")
            assert "preemption: 1 pod(s) on node-a are protected until " in condition["message"]
            assert condition["message"].startswith("0/1 nodes are available: 1 GPU VRAM too small.")
            assert "guarded" in await pod_names(kube)
            assert not await events_for(kube, "guarded", "Preempted")


@pytest.mark.parametrize("cluster_wide", [False, True])
async def test_victims_stay_in_the_namespace_unless_preemption_is_cluster_wide(
        apiserver: Any, tmp_path: Path, cluster_wide: bool) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube:
        await one_gpu(kube)
        await kube.create(r.NAMESPACES, {"metadata": {"name": "other"}})
        async with controllers() as tg:
            await start_controller(tg, settings_for(apiserver, tmp_path, preempt_cluster_wide=cluster_wide))
            await kube.create(r.PODS, qos_pod("theirs", "low", vram="16Gi", namespace="other"))
            await eventually(lambda: all_bound(kube, ["theirs"], "other"), what="theirs bound")
            await kube.create(r.PODS, qos_pod("crit", "critical", vram="8Gi"))
            if cluster_wide:
                assert await eventually(lambda: node_of(kube, "crit"), what="crit bound") == "node-a"
                assert "theirs" not in await pod_names(kube, "other")
                return
            condition = await eventually(lambda: waiting_note(kube, "crit", "preemption:"), what="the note")
            assert condition["message"].endswith("preemption: 1 pod(s) on node-a are in another namespace "
                                                 "(TF_SCHEDULER_PREEMPT_CLUSTER_WIDE=false).")
            assert "theirs" in await pod_names(kube, "other")


async def test_a_budget_that_allows_no_disruption_keeps_its_pod(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube:
        await one_gpu(kube)
        await kube.create(PDBS, {"metadata": {"name": "keep-train", "namespace": "default"},
                                 "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "train"}}}})
        # the disruption controller of --role=all is not running here: the status says it
        await kube.patch(PDBS, "keep-train", {"status": {"disruptionsAllowed": 0, "currentHealthy": 1,
                                                         "desiredHealthy": 1, "expectedPods": 1}},
                         namespace="default", subresource="status")
        async with controllers() as tg:
            await start_controller(tg, settings_for(apiserver, tmp_path))
            await kube.create(r.PODS, qos_pod("train", "low", vram="16Gi", labels={"app": "train"}))
            await eventually(lambda: all_bound(kube, ["train"]), what="train bound")
            await kube.create(r.PODS, qos_pod("crit", "critical", vram="8Gi"))
            condition = await eventually(lambda: waiting_note(kube, "crit", "preemption:"), what="the note")
            assert condition["message"].endswith("preemption: 1 pod(s) on node-a have a PodDisruptionBudget "
                                                 "that allows no disruption (keep-train).")
            await kube.patch(PDBS, "keep-train", {"status": {"disruptionsAllowed": 1}}, namespace="default",
                             subresource="status")
            assert await eventually(lambda: node_of(kube, "crit"), what="crit bound once allowed") == "node-a"


async def test_a_pod_never_preempts_one_of_its_own_priority_nor_with_policy_never(
        apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube:
        await one_gpu(kube)
        async with controllers() as tg:
            await start_controller(tg, settings_for(apiserver, tmp_path))
            await kube.create(r.PODS, qos_pod("low", "low", vram="8Gi"))
            await kube.create(r.PODS, qos_pod("first", "critical", vram="8Gi"))
            await eventually(lambda: all_bound(kube, ["low", "first"]), what="both bound")
            # medium and low share priority 0 (no PriorityClass is shipped for either)
            await kube.create(r.PODS, qos_pod("medium", "medium", vram="8Gi"))
            condition = await eventually(lambda: scheduled_condition(kube, "medium"), what="medium waits")
            assert condition["message"] == "0/1 nodes are available: 1 GPU VRAM too small."
            await kube.create(r.PODS, qos_pod("polite", "critical", vram="8Gi", policy="Never"))
            condition = await eventually(lambda: waiting_note(kube, "polite", "preemption:"), what="the note")
            assert condition["message"].endswith("preemption: the pod's preemptionPolicy is Never.")
            await kube.create(r.PODS, qos_pod("second", "critical", vram="16Gi"))
            condition = await eventually(lambda: scheduled_condition(kube, "second"), what="second waits")
            # `first` has its priority: evicting `low` alone would not make room, and nothing else may go
            assert condition["message"].endswith("preemption: evicting every lower-priority pod would not make "
                                                 "room on any of the 1 node(s) holding some.")
            assert await pod_names(kube) >= {"low", "first", "medium", "polite", "second"}
            assert await deleting(kube) == []
            assert not await events_with(kube, "Preempted")


async def test_quota_is_judged_with_the_victims_usage_subtracted(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube:
        await apply_priority_and_pool(kube)
        await kube.create(r.NAMESPACES, {"metadata": {"name": "other"}})
        await create_node(kube, "node-a")
        await create_node(kube, "node-b")
        await create_gpu(kube, "gpu-a1", "node-a", vram="40Gi")
        await create_gpu(kube, "gpu-b1", "node-b", vram="16Gi")
        await kube.create(r.GPURESOURCEQUOTAS, {"metadata": {"name": "budget", "namespace": "default"},
                                                "spec": {"total": {"requests": {"tflops": "1000", "vram": "16Gi"}}}})
        async with controllers() as tg:
            await start_controller(tg, settings_for(apiserver, tmp_path))
            mine = qos_pod("mine", "low", vram="12Gi")
            mine["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "node-a"}
            await kube.create(r.PODS, mine)
            theirs = qos_pod("theirs", "low", vram="16Gi", namespace="other")
            theirs["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "node-b"}
            await kube.create(r.PODS, theirs)
            await eventually(lambda: all_bound(kube, ["mine"]), what="mine bound")
            await eventually(lambda: all_bound(kube, ["theirs"], "other"), what="theirs bound")
            # node-a has 28Gi free but the quota (12 of 16Gi used) refuses 8Gi more; evicting
            # `theirs` would free node-b's GPU but not this namespace's quota: `mine` goes
            await kube.create(r.PODS, qos_pod("crit", "critical", vram="8Gi"))
            assert await eventually(lambda: node_of(kube, "crit"), what="crit bound") == "node-a"
            assert "mine" not in await pod_names(kube)
            assert "theirs" in await pod_names(kube, "other")


async def test_the_extender_preempt_verb_answers_gpu_aware_victims(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube:
        await apply_priority_and_pool(kube)
        for node in ("node-a", "node-b"):
            await create_node(kube, node)
            await create_gpu(kube, f"gpu-{node}", node, vram="16Gi")
        async with controllers() as tg:
            ctl = await start_controller(tg, settings_for(apiserver, tmp_path, scheduler="extender"))
            uids: dict[str, str] = {}
            for name, node, notes in (("low-a1", "node-a", {}), ("low-a2", "node-a", {tfa.EVICTION_PROTECTION: "1h"}),
                                      ("low-b", "node-b", {tfa.EVICTION_PROTECTION: "1h"})):
                size = "16Gi" if node == "node-b" else "8Gi"
                pod = qos_pod(name, "low", vram=size, extra=notes)
                pod["spec"]["schedulerName"] = "default-scheduler"
                created = await kube.create(r.PODS, pod)
                uids[name] = created["metadata"]["uid"]

                async def bound_by_extender(name: str = name, node: str = node) -> bool:
                    args = {"PodName": name, "PodNamespace": "default", "PodUID": uids[name], "Node": node}
                    answer: Any = (await ctl.http.post("/scheduler/bind", json=args)).json()
                    return bool(answer == {"Error": ""})

                await eventually(bound_by_extender, what=f"{name} bound through the extender")
            crit = qos_pod("crit", "critical", vram="8Gi")
            crit["spec"]["schedulerName"] = "default-scheduler"
            crit = await kube.create(r.PODS, crit)
            empty = {"Pods": [], "NumPDBViolations": 0}
            meta = {"Pod": crit, "NodeNameToMetaVictims": {"node-a": empty, "node-b": empty}}
            answer = (await ctl.http.post("/scheduler/preempt", json=meta)).json()
            # node-b's only pod is protected: dropped; on node-a the unprotected half goes
            assert answer == {"NodeNameToMetaVictims": {"node-a": {"Pods": [{"UID": uids["low-a1"]}],
                                                                   "NumPDBViolations": 0}}}
            kept = await kube.get(r.PODS, "low-a1", namespace="default")  # kube's own pick is kept
            full = {"Pod": crit, "NodeNameToVictims": {"node-a": {"Pods": [kept], "NumPDBViolations": 1}}}
            answer = (await ctl.http.post("/scheduler/preempt", json=full)).json()
            assert answer == {"NodeNameToMetaVictims": {"node-a": {"Pods": [{"UID": uids["low-a1"]}],
                                                                   "NumPDBViolations": 1}}}
            guarded = await kube.get(r.PODS, "low-a2", namespace="default")  # kube knows no protection
            full = {"Pod": crit, "NodeNameToVictims": {"node-a": {"Pods": [guarded], "NumPDBViolations": 0}}}
            assert (await ctl.http.post("/scheduler/preempt", json=full)).json() == {"NodeNameToMetaVictims": {}}
            low = await kube.get(r.PODS, "low-b", namespace="default")
            answer = (await ctl.http.post("/scheduler/preempt", json={**meta, "Pod": low})).json()
            assert answer == {"NodeNameToMetaVictims": {}}  # a low pod preempts nothing
            assert (await ctl.http.post("/scheduler/preempt", json={"NodeNameToMetaVictims": {}})).status_code == 400


async def test_an_eviction_the_api_server_refuses_ends_the_attempt_and_says_so(apiserver: Any,
                                                                                tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube:
        await one_gpu(kube)
        await kube.create(PDBS, {"metadata": {"name": "keep-train", "namespace": "default"},
                                 "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "train"}}}})
        # a stale status: the budget seems to allow one, but the pod is its only healthy one
        await kube.patch(PDBS, "keep-train", {"status": {"disruptionsAllowed": 1}}, namespace="default",
                         subresource="status")
        async with controllers() as tg:
            await start_controller(tg, settings_for(apiserver, tmp_path))
            await kube.create(r.PODS, qos_pod("train", "low", vram="16Gi", labels={"app": "train"}))
            await eventually(lambda: all_bound(kube, ["train"]), what="train bound")
            await kube.patch(r.PODS, "train", {"status": {"phase": "Running", "conditions": [
                {"type": "Ready", "status": "True"}]}}, namespace="default", subresource="status")
            await kube.create(r.PODS, qos_pod("crit", "critical", vram="8Gi"))
            refused = await eventually(lambda: waiting_note(kube, "crit", "could not be evicted"), what="the 429")
            assert "preemption: pod default/train on node node-a could not be evicted (a PodDisruptionBudget " \
                   "forbids it); trying again later." in refused["message"]
            # the eviction wrote the budget's true status: the next attempt does not even try
            await eventually(lambda: waiting_note(kube, "crit", "allows no disruption (keep-train)"),
                             what="the budget's note")
            assert "train" in await pod_names(kube)
            assert not await events_for(kube, "train", "Preempted")


async def test_a_victim_that_does_not_go_in_time_is_named_and_the_pod_tried_again(
        apiserver: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tfusion.controller.scheduling import preemption

    monkeypatch.setattr(preemption, "VICTIM_WAIT_MARGIN_S", 0.5)
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube:
        await one_gpu(kube)
        async with controllers() as tg:
            ctl = await start_controller(tg, settings_for(apiserver, tmp_path))
            low = qos_pod("slow", "low", vram="16Gi")
            low["spec"]["terminationGracePeriodSeconds"] = 0
            low["metadata"]["finalizers"] = [HOLD]
            created = await kube.create(r.PODS, low)
            await eventually(lambda: all_bound(kube, ["slow"]), what="slow bound")
            await kube.create(r.PODS, qos_pod("crit", "critical", vram="8Gi"))
            condition = await eventually(lambda: waiting_note(kube, "crit", "did not leave"), what="the timeout")
            assert "preemption: pod(s) default/slow did not leave node node-a in time; trying again later." \
                in condition["message"]
            # a pod being deleted holds no share, so the retry places the pod on the room it left
            assert await eventually(lambda: node_of(kube, "crit"), what="crit bound on retry") == "node-a"
            assert "slow" in await pod_names(kube)
            allocator = ctl.service.allocator
            assert allocator is not None and allocator.allocation(created["metadata"]["uid"]) is None
            await kube.patch(r.PODS, "slow", {"metadata": {"finalizers": []}}, namespace="default")


async def test_no_preemption_onto_a_node_the_pod_may_not_use(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube:
        await one_gpu(kube)
        async with controllers() as tg:
            await start_controller(tg, settings_for(apiserver, tmp_path))
            await kube.create(r.PODS, qos_pod("low", "low", vram="16Gi"))
            await eventually(lambda: all_bound(kube, ["low"]), what="low bound")
            taint = {"key": "dedicated", "value": "batch", "effect": "NoSchedule"}
            await kube.patch(r.NODES, "node-a", {"spec": {"taints": [taint]}})
            await kube.create(r.PODS, qos_pod("crit", "critical", vram="8Gi"))
            condition = await eventually(lambda: waiting_note(kube, "crit", "preemption:"), what="the note")
            assert condition["message"].endswith("preemption: the 1 node(s) where evictions would make GPU room "
                                                 "fail the pod's node checks.")
            assert "low" in await pod_names(kube)


async def test_a_critical_gang_member_that_preempted_still_waits_for_its_gang(apiserver: Any,
                                                                              tmp_path: Path) -> None:
    """Preemption reserves the freed share, then Permit holds the member until its gang is complete:
    one member preempts the only unprotected low pod and waits unbound while the other finds no
    victim; when room appears for the other, both bind."""
    await apply_crds(apiserver)
    gang = {tfa.GANG_GROUP_KEY: "default/train", tfa.GANG_REQUIRED_MEMBERS: "2",
            tfa.GANG_DESIRED_MEMBERS: "2", tfa.GANG_TIMEOUT: "0"}
    async with kube_client(apiserver) as kube:
        await one_gpu(kube)
        async with controllers() as tg:
            await start_controller(tg, settings_for(apiserver, tmp_path))
            lows = [f"low-{i}" for i in range(4)]
            for name in lows:  # 4 x 4Gi: the 16Gi GPU is full; only low-0 may be preempted
                extra = {} if name == "low-0" else {tfa.EVICTION_PROTECTION: "1h"}
                await kube.create(r.PODS, qos_pod(name, "low", vram="4Gi", extra=extra))
            await eventually(lambda: all_bound(kube, lows), what="the low pods bound")
            for name in ("crit-1", "crit-2"):
                await kube.create(r.PODS, qos_pod(name, "critical", vram="4Gi", extra=gang))
            await eventually(lambda: _gone(kube, "low-0"), what="low-0 preempted")
            held = await eventually(lambda: _one_waiting(kube), what="a member held at Permit")
            assert await node_of(kube, "crit-1") is None and await node_of(kube, "crit-2") is None
            assert "1 more member" in held
            await kube.delete(r.PODS, "low-1", namespace="default")  # room for the other member
            await eventually(lambda: all_bound(kube, ["crit-1", "crit-2"]), what="the gang bound together")


async def _gone(kube: KubeClient, name: str) -> bool:
    return name not in await pod_names(kube)


async def _one_waiting(kube: KubeClient) -> str | None:
    """The message of the one member told it waits for its gang, when exactly one is."""
    found = [c["message"] for n in ("crit-1", "crit-2")
             if (c := await scheduled_condition(kube, n)) is not None and "more member" in c["message"]]
    return found[0] if len(found) == 1 else None
