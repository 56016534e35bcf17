"""The node expander (`--enable-auto-expander`, leader only): TensorFusion pods that the scheduler
cannot place for lack of GPU get a node made for them.

A pod counts when it fits nowhere but not because of quota, taints, node affinity or cordoned
nodes (a new node would not change those), is not pinned to a node, and its pool is provisioned
(`Provisioned` or `Karpenter`). Such pods are buffered for `BUFFER_S` so that pods arriving together
are planned together; then, per pool, `plan.choose_expansions` places them on GPUs already in flight
or picks new instances (a clone of an existing node's type when it fits, else the cheapest per pod)
and this module creates those GPUNodeClaims (label `tensor-fusion.ai/expansion-source`). A pod
given a node is "pre-scheduled": its explanation says "a node is being provisioned for this pod
(claim X, type Y, ready in ~N s)" until it binds; if its node is not there `PRESCHEDULE_GRACE_S`
after the claim's estimate, the promise is dropped and the pod is planned again.

What it holds is soft state (a new leader starts empty and re-buffers the pods still pending); the
claims themselves are in the cluster. `GET /api/node-scaler` shows it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from tfusion.allocator.request import AllocRequest, RequestError
from tfusion.api import annotations as tfa
from tfusion.api.accessors import Body, GpuNodeClaim, GpuPool, Pod, text
from tfusion.controller.provisioning import plan
from tfusion.controller.provisioning.catalog import InstanceType
from tfusion.controller.provisioning.claims import new_claim
from tfusion.controller.provisioning.cloud import AUTO_SELECT, Providers, ProviderUnavailable
from tfusion.controller.provisioning.pools import PoolProvisioner, ProvisioningSwitch
from tfusion.controller.scheduling.unschedulable import pod_key
from tfusion.kube import resources as r
from tfusion.kube.client import AlreadyExists

if TYPE_CHECKING:
    from tfusion.controller.runtime import ControllerRuntime
    from tfusion.controller.scheduling.explain import Why
    from tfusion.controller.scheduling.scheduler import Decision, Scheduler

log = logging.getLogger(__name__)

BUFFER_S = 2.0
PRESCHEDULE_GRACE_S = 120.0
#: node checks a new node would fail as well: pods refused only by these are not expanded for
NOT_FOR_EXPANSION = frozenset({"NodeReady", "NodeUnschedulable", "TaintToleration", "NodeAffinity", "QuotaCheck"})
NOTE_PREFIX = "node expander:"


@dataclass(frozen=True)
class Promise:
    """A pre-scheduled pod: the claim whose node it waits for."""

    pool: str
    claim: str
    node: str
    instance_type: str
    ready_at: float  # wall-clock estimate of the node being Ready
    created: bool  # True when this pass created the claim, False when it joined one in flight


def pod_need(key: str, req: AllocRequest) -> plan.PodNeed:
    """What a pod needs of a new node's GPUs. A share in percent fits any whole GPU: it asks no TFLOPS."""
    return plan.PodNeed(key=key, pool=req.pool, tflops_per_gpu=0 if req.percent_request else req.tflops_request,
                        vram_per_gpu=req.vram_request, gpu_count=req.count, gpu_model=req.gpu_model)


def short_of_gpu(why: Why) -> bool:
    """True when a new node could help: no reason of quota, taints, affinity or readiness alone."""
    for node, status in why.nodes.items():
        stages = {reason.get("stage", "") for reason in status.get("reasons", [])} or {status.get("stage", "")}
        if node == "*" and stages & {"QuotaCheck"}:
            return False
        if not stages & NOT_FOR_EXPANSION:
            return True
    return not why.nodes  # nothing named at all: no node exists yet


class NodeExpander:
    """See the module docstring."""

    def __init__(self, runtime: ControllerRuntime, scheduler: Scheduler, providers: Providers,
                 pools: PoolProvisioner, switch: ProvisioningSwitch, *, wall: Callable[[], float] = time.time) -> None:
        self.runtime, self.scheduler, self.providers = runtime, scheduler, providers
        self.pools_provisioner, self.switch, self.wall = pools, switch, wall
        self.pools = runtime.informer(r.GPUPOOLS)
        self.claims = runtime.informer(r.GPUNODECLAIMS)
        self.nodes = runtime.informer(r.NODES)
        self.buffered: dict[str, tuple[plan.PodNeed, float]] = {}
        self.promises: dict[str, Promise] = {}
        self.refusals: dict[str, str] = {}  # pod -> why no node can be made for it

    def attach(self) -> NodeExpander:
        self.scheduler.expander = self
        self.runtime.informer(r.PODS).add_handler(on_update=self._pod_changed, on_delete=self._pod_gone)
        self.runtime.add_leader_task(self.run)
        return self

    # --- the scheduler's side (synchronous, inside a scheduling cycle) -----------------------------

    def on_unschedulable(self, key: str, pod: Pod, decision: Decision) -> None:
        """A TensorFusion pod fits nowhere: buffer it, or say what it waits for."""
        req, why = decision.req, decision.why
        if req is None or why is None or pod.node_name or Body(pod.raw).status.get("nominatedNodeName"):
            return
        promise = self.promises.get(key)
        if promise is not None and self.wall() > promise.ready_at + PRESCHEDULE_GRACE_S:
            log.info("pod %s: node %s of claim %s is late; planning again", key, promise.node, promise.claim)
            self.promises.pop(key)
            promise = None
        if promise is not None:
            why.message = f"{why.message} {self.promise_note(promise)}"
            return
        if key in self.refusals:
            why.message = f"{why.message} {NOTE_PREFIX} {self.refusals[key]}"
        if not short_of_gpu(why):
            return
        if key not in self.buffered:
            self.buffered[key] = (pod_need(key, req), self.wall())

    def promise_note(self, promise: Promise) -> str:
        left = max(0, round(promise.ready_at - self.wall()))
        return (f"{NOTE_PREFIX} a node is being provisioned for this pod (claim {promise.claim}, type "
                f"{promise.instance_type}, ready in ~{left} s)")

    def _pod_changed(self, _old: Any, new: Any) -> None:
        pod = Pod(new)
        if pod.node_name or pod.finished:
            self._forget(pod_key(pod))

    def _pod_gone(self, old: Any) -> None:
        self._forget(pod_key(Pod(old)))

    def _forget(self, key: str) -> None:
        self.buffered.pop(key, None)
        self.promises.pop(key, None)
        self.refusals.pop(key, None)

    # --- the leader's loop --------------------------------------------------------------------------

    async def run(self) -> None:
        clock = self.runtime.manager.clock
        while True:
            await clock.sleep(BUFFER_S)
            await self.expand()

    async def expand(self) -> None:
        """Plan the buffered pods, pool by pool."""
        now = self.wall()
        due = {k: need for k, (need, seen) in self.buffered.items() if now - seen >= BUFFER_S}
        by_pool: dict[str, list[plan.PodNeed]] = {}
        for key, need in due.items():
            self.buffered.pop(key, None)
            by_pool.setdefault(need.pool, []).append(need)
        for pool_name, needs in sorted(by_pool.items()):
            found = self.pools.get(pool_name)
            if found is None or GpuPool(found).provisioning_mode == AUTO_SELECT:
                continue
            await self._expand_pool(GpuPool(found), needs, now)

    async def _expand_pool(self, pool: GpuPool, needs: list[plan.PodNeed], now: float) -> None:
        try:
            provider = await self.providers.for_pool(pool)
        except ProviderUnavailable as exc:
            self._refuse(needs, f"no node can be provisioned: {exc}")
            return
        catalog = provider.catalog()
        types, capacity_type = self.pools_provisioner.offered_types(pool, list(catalog.types))
        flying = [c for c in self.pools_provisioner.pool_claims(pool.name) if self.pools_provisioner.in_flight(c)]
        in_flight = [f for c in flying if (f := self._in_flight(c, catalog.get(c.instance_type))) is not None]
        allowed = max(0, self.pools_provisioner.max_in_flight() - len(flying))
        if not self.switch.enabled:
            allowed = 0
        expansions = plan.choose_expansions(needs, in_flight, self._clonable(pool, catalog.get), types,
                                            capacity_type=capacity_type, now=now, max_new=allowed)
        for expansion in expansions:
            await self._apply(pool, expansion, capacity_type, allowed)

    async def _apply(self, pool: GpuPool, expansion: plan.Expansion, capacity_type: str, allowed: int) -> None:
        if expansion.claim:
            claim = GpuNodeClaim(self.claims.get(expansion.claim) or {})
            self._promise(pool, expansion, claim.name, claim.node_name, claim.instance_type, created=False)
        elif expansion.instance_type is not None:
            await self._create(pool, expansion, expansion.instance_type, capacity_type)
        else:
            reason = expansion.reason
            if not allowed:
                reason = ("provisioning is disabled (/api/provision?enable=false)" if not self.switch.enabled
                          else f"{self.pools_provisioner.max_in_flight()} nodes are already in flight "
                               "(maxInFlightNodes)")
            self._refuse_keys(expansion.pods, f"no node can be provisioned for this pod: {reason}")

    async def _create(self, pool: GpuPool, expansion: plan.Expansion, instance_type: InstanceType,
                      capacity_type: str) -> None:
        price = instance_type.price(capacity_type) or 0.0
        claim = new_claim(pool, instance_type, capacity_type=capacity_type, price=price,
                          region=self.pools_provisioner.region(pool),
                          expansion_source=expansion.cloned_from or "catalog")
        name = text(claim, "metadata", "name")
        try:
            await self.runtime.client.create(r.GPUNODECLAIMS, claim)
        except AlreadyExists:  # a random name taken: the pods are planned again next pass
            return
        self._promise(pool, expansion, name, name, instance_type.name, created=True)
        source = f"cloned from node {expansion.cloned_from}" if expansion.cloned_from else "chosen from the catalog"
        self.runtime.events.normal(pool, "NodeExpansion", f"GPUNodeClaim {name} ({instance_type.name}, "
                                   f"{capacity_type}, ${price:g}/h, {source}) for pod(s) {', '.join(expansion.pods)}")
        log.info("node expander: GPUNodeClaim %s (%s) for %s", name, instance_type.name, ", ".join(expansion.pods))

    def _promise(self, pool: GpuPool, expansion: plan.Expansion, claim: str, node: str, instance_type: str, *,
                 created: bool) -> None:
        for key in expansion.pods:
            self.refusals.pop(key, None)
            self.promises[key] = Promise(pool.name, claim, node, instance_type, expansion.ready_at, created)
            self._report(key, self.promise_note(self.promises[key]))

    def _refuse(self, needs: list[plan.PodNeed], reason: str) -> None:
        self._refuse_keys(tuple(n.key for n in needs), reason)

    def _refuse_keys(self, keys: tuple[str, ...], reason: str) -> None:
        for key in keys:
            self.refusals[key] = reason
            self._report(key, f"{NOTE_PREFIX} {reason}")

    def _report(self, key: str, note: str) -> None:
        """The pod's current explanation with this note instead of an older one (events, condition,
        `tfusion why`)."""
        reports = self.scheduler.reports
        why, pod = reports.whys.get(key), self.scheduler.pod(key)
        if why is None or pod is None:
            return
        base = why.message.split(f" {NOTE_PREFIX} ")[0]
        reports.report(pod, replace(why, message=f"{base} {note}"), None)

    def _in_flight(self, claim: GpuNodeClaim, instance_type: InstanceType | None) -> plan.InFlight | None:
        if instance_type is None:
            return None
        gpus = [plan.FreeGpu(instance_type.tflops_per_gpu, instance_type.vram_per_gpu, instance_type.gpu_model)
                for _ in range(instance_type.gpu_count)]
        promised = [self.need_of(k) for k, p in self.promises.items() if p.claim == claim.name]
        for need in filter(None, promised):
            plan.place(need, gpus)  # what the pre-scheduled pods will use
        ready = min((p.ready_at for p in self.promises.values() if p.claim == claim.name),
                    default=self.wall() + instance_type.boot_seconds)
        return plan.InFlight(claim.name, instance_type, ready, tuple(gpus))

    def need_of(self, key: str) -> plan.PodNeed | None:
        pod = self.scheduler.pod(key)
        try:
            req = self.scheduler.request_of(pod) if pod is not None else None
        except RequestError:
            return None
        return pod_need(key, req) if req is not None else None

    def _clonable(self, pool: GpuPool, lookup: Callable[[str], InstanceType | None]) -> dict[str, InstanceType]:
        """The pool's provisioned nodes and their instance types (what a clone would launch)."""
        out: dict[str, InstanceType] = {}
        for found in self.claims.list():
            claim = GpuNodeClaim(found)
            node = self.pools_provisioner.node_of(claim)
            if claim.pool == pool.name and claim.phase == "Bound" and node and (t := lookup(claim.instance_type)):
                out[node] = t
        return out

    def state(self) -> dict[str, Any]:
        """`GET /api/node-scaler`'s `data`: the original's four keys."""
        now = self.wall()
        nodes: dict[str, Any] = {}
        claims: dict[str, Any] = {}
        for key, promise in sorted(self.promises.items()):
            entry = nodes.setdefault(promise.node, {"claim": promise.claim, "pool": promise.pool,
                                                    "instanceType": promise.instance_type,
                                                    "readyInSeconds": max(0, round(promise.ready_at - now)),
                                                    "pods": []})
            entry["pods"].append(key)
        for found in self.claims.list():
            claim = GpuNodeClaim(found)
            if claim.meta.label(tfa.EXPANSION_SOURCE) and self.pools_provisioner.in_flight(claim):
                claims[claim.name] = {"pool": claim.pool, "instanceType": claim.instance_type,
                                      "phase": claim.phase or "Pending", "instanceID": claim.instance_id,
                                      "node": claim.node_name,
                                      "expansionSource": claim.meta.label(tfa.EXPANSION_SOURCE) or ""}
        return {"inFlightNodes": nodes, "inFlightNodeClaims": claims,
                "preSchedulePods": {k: p.node for k, p in sorted(self.promises.items())},
                "preScheduleTimerNum": len(self.promises) + len(self.buffered),
                "provisioningEnabled": self.switch.enabled}
