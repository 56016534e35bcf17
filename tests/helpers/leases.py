"""Taking a Lease away from a running leader, as another replica would."""

from __future__ import annotations

from tfusion.kube import resources as r
from tfusion.kube.client import Conflict, KubeClient
from tfusion.kube.leader import micro_time


async def steal_lease(kube: KubeClient, name: str, identity: str, *, namespace: str,
                      duration_s: int | None = None) -> None:
    """Make `identity` the holder of Lease `name` (for `duration_s`, if given). The holder renews every
    retry period, so its write can land between our read and write: then read again (409)."""
    while True:
        lease = await kube.get(r.LEASES, name, namespace=namespace)
        lease["spec"].update(holderIdentity=identity, renewTime=micro_time())
        if duration_s is not None:
            lease["spec"]["leaseDurationSeconds"] = duration_s
        try:
            await kube.replace(r.LEASES, lease, namespace=namespace)
            return
        except Conflict:
            continue
