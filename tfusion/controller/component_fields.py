"""The GPUPool fields about components that tfusion does not honour, and what it does instead.

Why: the original runs each node's hypervisor from its pool's `componentConfig.hypervisor` and rolls
components per pool; tfusion runs one hypervisor DaemonSet for all nodes (deploy/base), discovers
GPUs in the hypervisor, and injects its own worker sidecar. A pool that sets one of these fields
would otherwise be ignored silently, so the pool reconciler names each one in an Event and in the
pool's ComponentConfigHonoured condition. What tfusion does honour: `componentConfig.client.image`,
`remoteModeImage`, `operatorEndpoint`, `patchToPod`, `patchToContainer`; `componentConfig.worker.image`
and `podTemplate`; `componentConfig.hypervisor.portNumber` (the port workers and clients are told).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tfusion.api.accessors import GpuPool

_ONE_DAEMONSET = ("tfusion runs one hypervisor DaemonSet for every node (deploy/base); set it there, in a kustomize "
                  "overlay of your own")
_NO_DISCOVERY = "tfusion runs no discovery job: each node's hypervisor finds its own GPUs"
_NO_VECTOR = ("tfusion runs no vector sidecar: the hypervisor writes or pushes its metrics itself "
              "(--metrics-output-path, --metrics-push-url)")
_OWN_SIDECAR = ("in local mode tfusion injects its own worker sidecar, seeded from componentConfig.worker.podTemplate; "
                "this field is not applied")
_NO_ROLLOUT = ("tfusion does not roll components per pool: the DaemonSet's and the Deployment's updateStrategy "
               "roll them")


@dataclass(frozen=True, slots=True)
class Unhonoured:
    path: tuple[str, ...]
    #: the value that changes nothing (the CRD's default, or empty): a field holding it is not reported
    inert: object
    why: str

    @property
    def name(self) -> str:
        return "spec." + ".".join(self.path)


UNHONOURED: tuple[Unhonoured, ...] = (
    Unhonoured(("componentConfig", "hypervisor", "image"), "", _ONE_DAEMONSET),
    Unhonoured(("componentConfig", "hypervisor", "podTemplate"), None, _ONE_DAEMONSET),
    Unhonoured(("componentConfig", "hypervisor", "vectorImage"), "", _NO_VECTOR),
    Unhonoured(("componentConfig", "hypervisor", "enableVector"), False, _NO_VECTOR),
    Unhonoured(("componentConfig", "nodeDiscovery", "image"), "", _NO_DISCOVERY),
    Unhonoured(("componentConfig", "nodeDiscovery", "podTemplate"), None, _NO_DISCOVERY),
    Unhonoured(("componentConfig", "client", "embeddedModeImage"), "", _OWN_SIDECAR),
    Unhonoured(("componentConfig", "client", "patchToEmbeddedWorkerContainer"), None, _OWN_SIDECAR),
    Unhonoured(("componentConfig", "client", "patchEmbeddedWorkerToPod"), None, _OWN_SIDECAR),
    *(Unhonoured(("nodeManagerConfig", "nodePoolRollingUpdatePolicy", name), inert, _NO_ROLLOUT)
      for name, inert in (("autoUpdateHypervisor", False), ("autoUpdateWorker", False), ("autoUpdateClient", False),
                          ("batchPercentage", 100), ("batchInterval", "1s"), ("maxDuration", "10m"),
                          ("maintenanceWindow", None))),
)


def unhonoured_fields(pool: GpuPool) -> list[Unhonoured]:
    """The fields of UNHONOURED that `pool` sets to something other than their inert value."""
    found = []
    for field in UNHONOURED:
        value: object = pool.spec
        for step in field.path:
            value = value.get(step) if isinstance(value, Mapping) else None
        if value is not None and value != field.inert and value not in ("", {}, []):
            found.append(field)
    return found
