"""Prepare a freshly started embedded API server for the other roles: CRDs first, then the defaults,
then the controller's and the hypervisor's ServiceAccounts and RBAC (identities.py).

Runs after the embedded API server serves and before the controller and hypervisor start (their
informers list the tensor-fusion.ai kinds at once). Safe to run on every start: CRDs are written
only when this version's differ, defaults only when never created before (see crd_install.py, defaults.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from tfusion.embedded.crd_install import CrdReport, install_crds
from tfusion.embedded.defaults import DefaultsReport, create_defaults
from tfusion.kube.client import KubeClient
from tfusion.settings import Settings

log = logging.getLogger(__name__)


@dataclass
class BootstrapReport:
    crds: CrdReport
    defaults: DefaultsReport


async def bootstrap(client: KubeClient, settings: Settings) -> BootstrapReport:
    crds = await install_crds(client, hash_annotation=f"{settings.domain}/crd-spec-hash")
    log.info("CRDs: %s; all tensor-fusion.ai kinds are served", crds.describe())
    defaults = await create_defaults(client, settings)
    log.info("defaults: %s", defaults.describe())
    from tfusion.embedded.identities import apply_rbac

    written = await apply_rbac(client, settings.operator_namespace)
    log.info("RBAC: the controller's and the hypervisor's ServiceAccounts and roles from deploy/ (%d written)",
             written)
    return BootstrapReport(crds, defaults)
