"""Wiring: the provisioning parts on the controller's runtime (after the reconcilers and the scheduler)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tfusion.controller.provisioning.catalog import CatalogError
from tfusion.controller.provisioning.claims import ClaimReconciler
from tfusion.controller.provisioning.cloud import Providers
from tfusion.controller.provisioning.compaction import Compaction, register_compaction
from tfusion.controller.provisioning.expander import NodeExpander
from tfusion.controller.provisioning.http import provisioning_routes
from tfusion.controller.provisioning.pools import PoolProvisioner, ProvisioningSwitch
from tfusion.errors import RoleError

if TYPE_CHECKING:
    from tfusion.controller.reconcilers import Reconcilers
    from tfusion.controller.role import ControllerRole
    from tfusion.controller.scheduling.scheduler import Scheduler


@dataclass
class Provisioning:
    providers: Providers
    switch: ProvisioningSwitch
    pools: PoolProvisioner
    claims: ClaimReconciler
    expander: NodeExpander | None
    compaction: Compaction


def attach_provisioning(runtime: ControllerRole, reconcilers: Reconcilers | None,
                        scheduler: Scheduler | None) -> Provisioning | None:
    """Providers, pool provisioning, the claim reconciler, the expander (with --enable-auto-expander and
    the built-in scheduler), compaction and the routes. None without the reconcilers
    (ENABLE_CR_CONTROLLER=false): claims would then have nobody to follow them."""
    if reconcilers is None:
        return None
    try:
        providers = Providers(runtime)
    except CatalogError as exc:
        raise RoleError(f"controller: --provisioning-catalog: {exc}") from None
    switch = ProvisioningSwitch()
    pools = PoolProvisioner(runtime, providers, switch)
    reconcilers.pool.provisioner = pools
    claims = ClaimReconciler(runtime, providers)
    expander = None
    if runtime.settings.enable_auto_expander:
        if scheduler is None:
            raise RoleError("controller: --enable-auto-expander needs the built-in scheduler (ENABLE_SCHEDULER)")
        expander = NodeExpander(runtime, scheduler, providers, pools, switch).attach()
    runtime.routes.extend(provisioning_routes(runtime, switch, expander))
    compaction = register_compaction(runtime, runtime.settings)
    return Provisioning(providers, switch, pools, claims, expander, compaction)
