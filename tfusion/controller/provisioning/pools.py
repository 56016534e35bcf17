"""Pool provisioning (`provisioningMode: Provisioned` or `Karpenter`): the pool reconciler asks this
module, on every pass, whether the pool lacks capacity, and it creates the cheapest GPUNodeClaims
that close the gap (plan.py decides; this module reads the cluster and writes claims).

The gap is measured against `capacityConfig.minResources` (total) and `warmResources` (available),
capped by `maxResources`, with claims in flight counted as if their nodes were there. A claim is in
flight until its node's GPUNode reports capacity, so a node that just joined is not counted twice.
At most `maxInFlightNodes` (dynamic config, 15) claims of a pool are in flight. Claims are the
record: nothing here is remembered that the cluster cannot tell again, except the names just
created, which are waited for until the informer has them (no duplicate claims on a quick requeue).

`/api/provision?enable=false` (the `ProvisioningSwitch`) stops new claims from here and from the
expander; claims already made go on.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio

from tfusion.api import annotations as tfa
from tfusion.api.accessors import Body, GpuNodeClaim, GpuPool, items, text
from tfusion.api.kinds.pool import GPUPool
from tfusion.api.types import ManifestError, decode_as
from tfusion.controller.provisioning import plan
from tfusion.controller.provisioning.catalog import ON_DEMAND, SPOT, InstanceType
from tfusion.controller.provisioning.claims import BOUND, joined_node, new_claim, offered
from tfusion.controller.provisioning.cloud import AUTO_SELECT, Providers, ProviderUnavailable
from tfusion.controller.reconcilers.common import byte_count, milli_tflops
from tfusion.kube import resources as r
from tfusion.kube.client import AlreadyExists

if TYPE_CHECKING:
    from tfusion.controller.runtime import ControllerRuntime

log = logging.getLogger(__name__)

#: status.provisioningPhase values
PHASE_NONE, PROVISIONING, COMPLETED = "None", "Provisioning", "Completed"
INSTANCE_TYPE_KEY, CAPACITY_TYPE_KEY = "node.kubernetes.io/instance-type", "karpenter.sh/capacity-type"
DEFAULT_MAX_IN_FLIGHT = 15


@dataclass
class ProvisioningSwitch:
    """The kill switch behind `/api/provision?enable=`: off stops every new claim until it is on again."""

    enabled: bool = True


@dataclass(frozen=True)
class PoolProvisioning:
    """What one pass decided: the phase to write and when to look again (None: on the next event)."""

    phase: str
    requeue_after: float | None = None


@dataclass
class PoolProvisioner:
    runtime: ControllerRuntime
    providers: Providers
    switch: ProvisioningSwitch
    _expected: dict[str, set[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.claims = self.runtime.informer(r.GPUNODECLAIMS)
        self.gpunodes = self.runtime.informer(r.GPUNODES)
        self.nodes = self.runtime.informer(r.NODES)
        self._claims_by_pool = self.claims.add_label_index(tfa.MANAGED_BY)
        self._nodes_by_claim = self.nodes.add_label_index(tfa.NODE_PROVISIONER)

    def pool_claims(self, pool: str) -> list[GpuNodeClaim]:
        return [GpuNodeClaim(c) for c in self.claims.by_index(self._claims_by_pool, pool)]

    def max_in_flight(self) -> int:
        value = self.runtime.dynamic_config.current.get("maxInFlightNodes", DEFAULT_MAX_IN_FLIGHT)
        return value if isinstance(value, int) and not isinstance(value, bool) else DEFAULT_MAX_IN_FLIGHT

    def node_of(self, claim: GpuNodeClaim) -> str:
        """The Node that joined for `claim` ("" before one has)."""
        return joined_node(self.nodes, self._nodes_by_claim, claim)

    def in_flight(self, claim: GpuNodeClaim) -> bool:
        """A claim whose node is not yet counted in the pool's capacity (not Bound, or its GPUNode has
        not reported yet)."""
        if claim.meta.deleting:
            return False
        if claim.phase != BOUND:
            return True
        node = self.node_of(claim)
        gpunode = self.gpunodes.get(node) if node else None
        return gpunode is None or milli_tflops(Body(gpunode).status.get("totalTFlops")) == 0

    def capacity(self, pool: GpuPool, members: list[Body]) -> plan.PoolCapacity:
        total = plan.Capacity(sum(milli_tflops(m.status.get("totalTFlops")) for m in members),
                              sum(byte_count(m.status.get("totalVRAM")) for m in members))
        available = plan.Capacity(sum(milli_tflops(m.status.get("availableTFlops")) for m in members),
                                  sum(byte_count(m.status.get("availableVRAM")) for m in members))
        flying = [offered(c) for c in self.pool_claims(pool.name) if self.in_flight(c)]
        return plan.PoolCapacity(total, available, plan.Capacity(sum(t for t, _ in flying), sum(v for _, v in flying)))

    async def reconcile(self, pool: GpuPool, members: list[Body]) -> PoolProvisioning | None:
        """One pass for `pool` (its GPUNodes are `members`); None for pools that are not provisioned."""
        if pool.provisioning_mode == AUTO_SELECT or pool.meta.deleting:
            return None
        expected = self._expected.get(pool.name, set())
        if expected - set(self.claims.keys()):
            return PoolProvisioning(PROVISIONING, requeue_after=1.0)  # our last claims are not in the cache yet
        self._expected.pop(pool.name, None)
        capacity = self.capacity(pool, members)
        try:
            spec = decode_as(GPUPool, pool.raw).spec
            targets = plan.targets_of(spec.capacity_config if spec is not None else None)
        except ManifestError as exc:  # the API server validated it; an older schema may not have
            self.runtime.events.warning(pool, "InvalidCapacityConfig", str(exc))
            return PoolProvisioning(PHASE_NONE)
        need = plan.gap(capacity, targets)
        flying = [c for c in self.pool_claims(pool.name) if self.in_flight(c)]
        if need.is_zero:
            return PoolProvisioning(PROVISIONING if flying else COMPLETED)
        if not self.switch.enabled:
            return PoolProvisioning(PROVISIONING if flying else PHASE_NONE)
        try:
            provider = await self.providers.for_pool(pool)
        except ProviderUnavailable as exc:
            self.runtime.events.warning(pool, "ProviderUnavailable", str(exc))
            return PoolProvisioning(PROVISIONING if flying else PHASE_NONE, requeue_after=30.0)
        allowed = self.max_in_flight() - len(flying)
        types, capacity_type = self.offered_types(pool, list(provider.catalog().types))
        # a large user catalog can take the exact search most of a second: off the event loop
        chosen = await anyio.to_thread.run_sync(functools.partial(
            plan.cheapest_claims, need, types, capacity_type=capacity_type, room=plan.room(capacity, targets),
            max_claims=max(allowed, 0)))
        if not chosen.closed:
            self.runtime.events.warning(pool, "MaxResourceConstraintReached" if "maxResources" in chosen.reason
                                        else "ProvisioningShort", f"{plan.capacity_text(chosen.shortfall)} "
                                        f"of the {plan.capacity_text(need)} the pool lacks stays open: {chosen.reason}")
        names = await self._create(pool, chosen, need)
        if names:
            self._expected[pool.name] = names
        return PoolProvisioning(PROVISIONING if names or flying else PHASE_NONE,
                                requeue_after=None if chosen.closed else 60.0)

    async def _create(self, pool: GpuPool, chosen: plan.ClaimPlan, need: plan.Capacity) -> set[str]:
        made: set[str] = set()
        region = self.region(pool)
        for planned in chosen.claims:
            claim = new_claim(pool, planned.instance_type, capacity_type=planned.capacity_type,
                              price=planned.price, region=region)
            try:
                await self.runtime.client.create(r.GPUNODECLAIMS, claim)
            except AlreadyExists:
                continue
            made.add(text(claim, "metadata", "name"))
        if made:
            kinds = ", ".join(sorted(p.instance_type.name for p in chosen.claims))
            self.runtime.events.normal(pool, "ProvisioningNodes", f"created {len(made)} GPUNodeClaim(s) ({kinds}, "
                                       f"${chosen.price:g}/h) for the {plan.capacity_text(need)} the pool lacks "
                                       "against minResources/warmResources")
            log.info("GPUPool %s: created GPUNodeClaims %s", pool.name, ", ".join(sorted(made)))
        return made

    def region(self, pool: GpuPool) -> str:
        cluster = self.providers.cluster_of(pool)
        return text(cluster.raw if cluster else None, "spec", "computingVendor", "params", "defaultRegion")

    @staticmethod
    def offered_types(pool: GpuPool, types: list[InstanceType]) -> tuple[list[InstanceType], str]:
        """The catalog narrowed by the pool's `nodeProvisioner.gpuRequirements` (instance type In/NotIn),
        and the capacity type they ask for (Spot when `karpenter.sh/capacity-type` allows only spot)."""
        capacity_type = ON_DEMAND
        for req in items(pool.node_manager_config, "nodeProvisioner", "gpuRequirements"):
            key, operator = text(req, "key"), text(req, "operator")
            values = [v for v in items(req, "values") if isinstance(v, str)]
            if key == INSTANCE_TYPE_KEY and operator == "In":
                types = [t for t in types if t.name in values]
            elif key == INSTANCE_TYPE_KEY and operator == "NotIn":
                types = [t for t in types if t.name not in values]
            elif key == CAPACITY_TYPE_KEY and operator == "In" and values and all(v.lower() == "spot" for v in values):
                capacity_type = SPOT
        return types, capacity_type
