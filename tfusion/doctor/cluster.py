"""The clock against the API server's, and the pools' capacity against what is allocated.

Why the clock: leases, heartbeats and certificates are judged by timestamps other machines wrote;
this machine's clock far from the API server's makes such ages wrong (here too: every age the other
checks print is measured on the API server's clock, corrected by the skew found here). Why the
pools: a GPU whose `available` is below zero or above its capacity means the allocator's ledger
and the GPU's status disagree (the drift the controller's audit repairs); a pool that is not
Running says which of its nodes are not.
"""

from __future__ import annotations

import time
from email.utils import parsedate_to_datetime

from tfusion.api.accessors import Body, section, text
from tfusion.api.quantity import Quantity, QuantityError
from tfusion.doctor.context import Context
from tfusion.doctor.findings import Finding, error, ok, warning
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient

#: skew worth a warning (leases last 15 s) and worth an error (certificates are back-dated 5 minutes)
SKEW_WARNING_S = 10.0
SKEW_ERROR_S = 300.0


async def measure_skew(client: KubeClient) -> float | None:
    """This machine's clock minus the API server's (from its `Date` header), in seconds; None when the
    server sends no Date. The header has whole seconds, so the answer is within about a second."""
    before = time.time()
    async with client.api.call_api("GET", version="v1", url="namespaces/default", raise_for_status=False) as response:
        header = response.headers.get("date", "")
    after = time.time()
    if not header:
        return None
    try:
        server = parsedate_to_datetime(header).timestamp() + 0.5  # the middle of the second it names
    except (TypeError, ValueError):
        return None
    return (before + after) / 2 - server


async def check_clock(ctx: Context) -> list[Finding]:
    skew = ctx.clock_skew_s
    if skew is None:
        return [warning("clock", "the API server sent no Date header: the clock skew cannot be measured")]
    direction = "ahead of" if skew > 0 else "behind"
    said = f"this machine's clock is {abs(skew):.0f} s {direction} the API server's"
    fix = "synchronise the clocks (NTP: `timedatectl status` says whether it is on) on this machine and the nodes"
    if abs(skew) > SKEW_ERROR_S:
        return [error("clock", f"{said}: certificates may look not yet valid and leases expired", fix)]
    if abs(skew) > SKEW_WARNING_S:
        return [warning("clock", f"{said}", fix)]
    return [ok("clock", f"{said} (within {SKEW_WARNING_S:.0f} s)")]


def _quantity(value: object) -> Quantity | None:
    try:
        return Quantity.parse(value) if isinstance(value, str | int) and not isinstance(value, bool) else None
    except QuantityError:
        return None


def gpu_drift(gpu: Body) -> str:
    """"" when each of the GPU's available TFLOPS and VRAM lies within 0..capacity, else what is off."""
    problems = []
    for resource in ("tflops", "vram"):
        available = _quantity(section(gpu.status, "available").get(resource))
        capacity = _quantity(section(gpu.status, "capacity").get(resource))
        if available is None or capacity is None:
            continue
        if available < 0:
            problems.append(f"{resource} available {available} is below zero (over-allocated)")
        elif capacity < available:
            problems.append(f"{resource} available {available} exceeds its capacity {capacity}")
    return "; ".join(problems)


async def check_pools(ctx: Context) -> list[Finding]:
    findings = []
    for raw in await ctx.client.list(r.GPUPOOLS):
        pool = Body(raw)
        if pool.phase != "Running":
            said = text(pool.condition("Ready"), "message")
            findings.append(warning("pools", f"GPUPool {pool.name} is {pool.phase or 'without a phase'}"
                                             + (f": {said}" if said else ""),
                                    f"`kubectl describe gpupool {pool.name}`; its nodes are in the checks above"))
    gpus = [Body(raw) for raw in await ctx.client.list(r.GPUS)]
    for gpu in gpus:
        if problem := gpu_drift(gpu):
            findings.append(error("pools", f"GPU {gpu.name}: {problem}: the allocator's ledger and the GPU's status "
                                           "disagree", "the controller's drift audit repairs this within "
                                                       "--drift-check-interval; if it stays, restart the controller "
                                                       "(it rebuilds the ledger from the pods)"))
    return findings or [ok("pools", f"every pool is Running and each of the {len(gpus)} GPU(s) has 0 <= available "
                                    "<= capacity")]
