"""The checks in the order a user should fix what they find: nothing works without the CRDs, no GPU
pod is admitted without the webhook, none placed without a leader and a scheduler, none runs
without a hypervisor; the rest (heartbeats, permissions, clocks, capacity) explains degradations;
last, what tfusion would make of an original TensorFusion operator found in the cluster.

A check that the user's credentials may not run (403) is a warning saying so, not an error; a kind
the API server does not serve (404: its CRD is missing) and any other failure of the API server are
errors of that check, and the next check still runs.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

import httpx

from tfusion.doctor import cluster, control, crds, nodes, original, rbac, webhook
from tfusion.doctor.context import Context
from tfusion.doctor.findings import Finding, error, warning
from tfusion.kube.client import Forbidden, KubeError, NotFound

log = logging.getLogger(__name__)

Check = Callable[[Context], Awaitable[list[Finding]]]

CHECKS: Sequence[tuple[str, Check]] = (
    ("crds", crds.check),
    ("webhook", webhook.check),
    ("controller", control.check_leader),
    ("scheduler", control.check_scheduler),
    ("hypervisors", nodes.check_hypervisors),
    ("device-plugins", nodes.check_device_plugins),
    ("heartbeats", nodes.check_heartbeats),
    ("rbac", rbac.check),
    ("clock", cluster.check_clock),
    ("pools", cluster.check_pools),
    ("tensorfusion", original.check),
)


async def run_checks(ctx: Context, checks: Sequence[tuple[str, Check]] = CHECKS) -> list[Finding]:
    """Every check in order; the clock skew is measured first, so ages are on the API server's clock."""
    if ctx.clock_skew_s is None:
        try:
            ctx.clock_skew_s = await cluster.measure_skew(ctx.client)
        except (KubeError, httpx.HTTPError, OSError) as exc:
            log.debug("clock skew not measured: %s", exc)
    findings: list[Finding] = []
    for name, check in checks:
        try:
            findings.extend(await check(ctx))
        except NotFound as exc:  # without the CRD, a list of its kind is a 404
            findings.append(error(name, f"cannot check: {exc}", "install what is missing first (see the crds check)"))
        except Forbidden as exc:
            findings.append(warning(name, f"cannot check: your credentials may not read what it needs ({exc})",
                                    "run tfusion doctor as a cluster administrator (or with a kubeconfig "
                                    "that may list cluster-wide objects)"))
        except (KubeError, httpx.HTTPError, OSError) as exc:
            findings.append(error(name, f"cannot check: the API server failed: {exc}",
                                  "check that --kube names a reachable API server"))
    return findings
