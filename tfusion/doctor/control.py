"""The control plane: a controller leads, and something places GPU pods.

Why: every reconciler, the allocator and the built-in scheduler run only on the leader, so without
a held Lease nothing happens and no event says why. GPU pods name `tensor-fusion-scheduler`
(the webhook sets it); the leader places them itself (`--scheduler=builtin`), or a kube-scheduler
with that profile calls the leader's extender routes (deploy/overlays/kube-scheduler), which holds
a Lease of that name in tfusion's namespace.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tfusion.api import annotations as tfa
from tfusion.api.accessors import Pod, section, text
from tfusion.api.timestamps import parse_rfc3339
from tfusion.doctor.context import Context
from tfusion.doctor.findings import Finding, error, ok, warning
from tfusion.kube import resources as r
from tfusion.kube.client import NotFound
from tfusion.kube.leader import LEASE_NAME

SCHEDULER_LEASE = tfa.SCHEDULER_NAME  # deploy/overlays/kube-scheduler: leaderElection.resourceName
#: a GPU pod unscheduled for longer than this is worth a line
PENDING_AFTER_S = 60.0


@dataclass(frozen=True)
class LeaseState:
    holder: str
    age_s: float | None  # since the last renewal; None when never renewed
    duration_s: float

    @property
    def held(self) -> bool:
        return bool(self.holder) and self.age_s is not None and self.age_s <= self.duration_s


def lease_state(lease: Mapping[str, object], now: float) -> LeaseState:
    spec = section(lease, "spec")
    renewed = text(spec, "renewTime") or text(spec, "acquireTime")
    duration = spec.get("leaseDurationSeconds")
    age = None
    if renewed:
        try:
            age = max(0.0, now - parse_rfc3339(renewed).timestamp())
        except ValueError:
            age = None
    return LeaseState(text(spec, "holderIdentity"), age,
                      float(duration) if isinstance(duration, int | float) and not isinstance(duration, bool) else 15.0)


async def _lease(ctx: Context, name: str) -> LeaseState | None:
    try:
        return lease_state(await ctx.client.get(r.LEASES, name, namespace=ctx.namespace), ctx.server_now())
    except NotFound:
        return None


def _controller_fix(ctx: Context) -> str:
    return (f"check the controller: `kubectl -n {ctx.namespace} get deploy,pods -l "
            "app.kubernetes.io/name=tensor-fusion-controller` and its log; if tfusion runs in another namespace "
            "pass --operator-namespace")


async def check_leader(ctx: Context) -> list[Finding]:
    state = await _lease(ctx, LEASE_NAME)
    if state is None:
        return [error("controller", f"no controller has ever led: no Lease {ctx.namespace}/{LEASE_NAME}",
                      _controller_fix(ctx))]
    if not state.held:
        since = f"{state.age_s:.0f} s ago" if state.age_s is not None else "never"
        return [error("controller", f"no controller leads: Lease {LEASE_NAME} was last renewed {since} by "
                                    f"{state.holder or 'nobody'} (it lasts {state.duration_s:.0f} s); nothing is "
                                    "reconciled, allocated or scheduled", _controller_fix(ctx))]
    return [ok("controller", f"{state.holder} leads (Lease renewed {state.age_s:.0f} s ago)")]


async def check_scheduler(ctx: Context) -> list[Finding]:
    extender = await _lease(ctx, SCHEDULER_LEASE)
    if extender is not None:
        finding = (ok("scheduler", f"extender mode: kube-scheduler profile {tfa.SCHEDULER_NAME} runs "
                                   f"({extender.holder} holds its Lease)") if extender.held else
                   error("scheduler", f"extender mode, but no kube-scheduler with profile {tfa.SCHEDULER_NAME} runs: "
                                      f"its Lease {ctx.namespace}/{SCHEDULER_LEASE} is not renewed",
                         f"check `kubectl -n {ctx.namespace} get pods` for the tensor-fusion scheduler and its "
                         "log (deploy/overlays/kube-scheduler)"))
    else:
        leader = await _lease(ctx, LEASE_NAME)
        finding = (ok("scheduler", "built-in mode: the leading controller places GPU pods")
                   if leader is not None and leader.held else
                   error("scheduler", f"built-in mode (no {SCHEDULER_LEASE} Lease), but no controller leads: GPU pods "
                                      "are not placed", _controller_fix(ctx)))
    return [finding, *await _waiting_pods(ctx)]


async def _waiting_pods(ctx: Context) -> list[Finding]:
    now = ctx.server_now()
    waiting = []
    for raw in await ctx.client.list(r.PODS, field_selector="status.phase=Pending"):
        pod = Pod(raw)
        if pod.scheduler_name != tfa.SCHEDULER_NAME or pod.node_name:
            continue
        try:
            age = now - parse_rfc3339(pod.meta.creation_timestamp).timestamp()
        except ValueError:
            continue
        if age > PENDING_AFTER_S:
            waiting.append(f"{pod.namespace}/{pod.name}")
    if not waiting:
        return []
    shown = ", ".join(waiting[:5]) + (f" and {len(waiting) - 5} more" if len(waiting) > 5 else "")
    namespace, _, name = waiting[0].partition("/")
    return [warning("scheduler", f"{len(waiting)} GPU pod(s) unscheduled for more than {PENDING_AFTER_S:.0f} s: "
                                 f"{shown}",
                    f"`tfusion why -n {namespace} {name}` says why and what would make it fit")]
