"""Soft isolation on this node: each soft worker's shared-memory file, kept current every 500 ms.

Why: the in-container limiter enforces a soft worker's share by itself, from what this file tells
it — the device limits, the pod's VRAM in use, a token bucket it draws kernel launches from, a
heartbeat (a stale one makes it deny kernels) and the PIDs registered for the pod. This service
is the hypervisor's side of that contract (reference hypervisor §5):

- a soft worker with an allocation on this node gets `<shm-root>/<namespace>/<pod>/shm`: opened as
  it is when it exists (a restarted hypervisor keeps the buckets the limiter is using), created
  when it does not (or when it is not a V2 file: the hypervisor owns its workers' files); only
  root and the identity the pod runs as may open it (`shm_owner`; `store.py` says how) or, for a
  pod that names no user, the user of the first process it registers (`hand_to_caller`);
- every tick (500 ms): the heartbeat, each device's `pod_memory_used` (the GPU processes whose PID
  is registered in the file or that /proc ties to the worker; a one-device worker whose per-device
  sum is 0 gets its total over all devices, as upstream), the limits when the allocation changed,
  exited PIDs dropped from the PID set, and one ERL step per device (`erl.py`, steered by
  `pod_utilisation`): the refill rate and capacity written, the tokens refilled and drained with
  compare-and-swap;
- a worker that is no longer tracked (deleted, finished, left the node) has its file and directory
  removed; a worker still tracked that lost its allocation (a device vanished) keeps its file and
  heartbeat, so the pod's bind mount of its directory stays valid;
- every 5 minutes, once the worker tracker has synced, files under the root that belong to no
  tracked worker are removed (what a crash or a missed delete left behind).

The HTTP routes use `ensure_for` (open, create only when missing, never truncate an unreadable file)
and `register_pid`. Readiness: `shm-sync` and `rate-limiter` conditions, set after every tick.

`limiter_views` reads back, per (worker, device), what the limiter sees in the file — the bucket and
the heartbeat's age — for /metrics: the hypervisor cannot ask the limiter whether it is throttled or
frozen, but both follow from those fields (`limiter_frozen`), and each tick counts the interval as
throttled when the bucket it is about to refill holds less than one launch.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import anyio

from tfusion.api import annotations as keys
from tfusion.hypervisor.devices.model import DeviceInfo, GpuProcess
from tfusion.hypervisor.devices.registry import DeviceRegistry
from tfusion.hypervisor.limiter import erl
from tfusion.hypervisor.shm import layout
from tfusion.hypervisor.shm.state import DeviceConfig, SharedState, ShmError, pid_alive
from tfusion.hypervisor.shm.store import ShmOwner, ShmStore
from tfusion.hypervisor.workers.allocation import compute_up_limit, vram_limit
from tfusion.hypervisor.workers.model import WorkerAllocation
from tfusion.hypervisor.workers.tracker import WorkerTracker
from tfusion.web import Readiness

log = logging.getLogger(__name__)

SYNC_INTERVAL_S = 0.5
SWEEP_INTERVAL_S = 300.0
#: the limiter's default TF_LIMITER_HEARTBEAT_GRACE_S (native/limiter/compute.c); the hypervisor
#: cannot see a worker's override, so its frozen verdict assumes the default
LIMITER_HEARTBEAT_GRACE_S = 10
#: the cheapest kernel launch costs one token (compute.c's launch_cost)
MIN_LAUNCH_TOKENS = 1.0

#: CUDA cores per SM by compute capability (major.minor, else major)
_CORES_PER_SM = {"2.0": 32, "2.1": 48, "3": 192, "5": 128, "6.0": 64, "6.1": 128, "6.2": 128, "7": 64,
                 "8.0": 64, "8.6": 128, "8.7": 128, "8.9": 128, "9.0": 128, "10": 128, "11": 128, "12": 128}


def cuda_cores(device: DeviceInfo) -> int:
    """SMs x cores per SM for the device's compute capability; 0 when either is unknown."""
    capability = device.compute_capability.strip()
    per_sm = _CORES_PER_SM.get(capability) or _CORES_PER_SM.get(capability.split(".")[0], 0)
    return device.sm_count * per_sm


def device_configs(allocation: WorkerAllocation) -> list[DeviceConfig]:
    """The shm entries of a worker's devices (slot = device index; indices beyond 15 do not fit)."""
    configs = []
    for device in allocation.devices:
        if device.index >= layout.MAX_DEVICES:
            log.warning("worker %s/%s: device %s has index %d; the shared-memory layout has slots 0 to %d",
                        allocation.worker.namespace, allocation.worker.name, device.uuid, device.index,
                        layout.MAX_DEVICES - 1)
            continue
        configs.append(DeviceConfig(slot=device.index, uuid=device.native_uuid,
                                    up_limit=compute_up_limit(allocation.worker, device),
                                    mem_limit=vram_limit(allocation.worker, device),
                                    total_cuda_cores=cuda_cores(device)))
    return configs


def pod_utilisation(uuid: str, device_percent: float, processes: Sequence[GpuProcess],
                    ours: Sequence[GpuProcess]) -> float:
    """What the ERL steers for a worker on one device (percent): the SM utilisation of the worker's
    own processes when the backend reports any per-process utilisation on the device, else the
    whole device's (upstream always uses the whole device; then two soft workers sharing a device
    each see the other's load, and the one with the lower limit is pushed to the floor)."""
    if not any(p.compute_percent > 0 for p in processes if p.device_uuid == uuid):
        return device_percent
    return min(100.0, sum(p.compute_percent for p in ours if p.device_uuid == uuid))


def shm_owner(allocation: WorkerAllocation) -> ShmOwner:
    """Who besides root may open the worker's file: the identity its pod runs as (store.py says how)."""
    return ShmOwner(uid=allocation.worker.run_as_user, gid=allocation.worker.shared_group)


def names_no_identity(allocation: WorkerAllocation) -> bool:
    return allocation.worker.run_as_user is None and allocation.worker.shared_group is None


def limiter_frozen(heartbeat: int, now: float, refill_rate: float, tokens: float,
                   grace_s: float = LIMITER_HEARTBEAT_GRACE_S) -> bool:
    """Whether the limiter lets no launch through: it waits while the heartbeat is older than the
    grace (compute.c compares whole seconds: fresh while `heartbeat + grace >= now`), and a bucket
    that holds less than one launch and is never refilled stays that way."""
    stale = heartbeat + grace_s < math.floor(now)
    return stale or (refill_rate <= 0 and tokens < MIN_LAUNCH_TOKENS)


@dataclass(frozen=True)
class LimiterView:
    """One soft worker's limiter on one device, as its shared-memory file says now."""

    allocation: WorkerAllocation
    device: DeviceInfo
    tokens: float
    capacity: float
    refill_rate: float  # tokens per second
    heartbeat_age_s: float
    frozen: bool
    throttled_s: float  # sampled seconds with less than one launch left, since this hypervisor began


@dataclass
class _Handle:
    namespace: str
    name: str
    state: SharedState
    configs: list[DeviceConfig] = field(default_factory=list)


class SoftIsolation:
    """The shm files of this node's soft workers (see the module docstring)."""

    def __init__(self, store: ShmStore, registry: DeviceRegistry, workers: WorkerTracker, *,
                 params: erl.ErlParams | None = None, readiness: Readiness | None = None,
                 synced: Callable[[], bool] = lambda: True, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.registry = registry
        self.workers = workers
        self.params = params or erl.ErlParams()
        self.readiness = readiness
        self.synced = synced
        self.clock = clock
        self._handles: dict[str, _Handle] = {}  # worker UID -> its mapped file
        self._erl: dict[tuple[str, str], erl.ErlState] = {}  # (worker UID, device UUID) -> controller
        self._throttled: dict[tuple[str, str], float] = {}  # (worker UID, device UUID) -> seconds
        self.interval = SYNC_INTERVAL_S  # what one tick's throttle sample stands for
        self.ticks = 0
        self.last_sweep: list[tuple[str, str]] = []
        if readiness is not None:
            readiness.set("shm-sync", False, "the shared-memory sync loop has not run yet")
            readiness.set("rate-limiter", False, "the rate limiter has not run yet")

    # --- reads --------------------------------------------------------------------------------------

    def state(self, uid: str) -> SharedState | None:
        handle = self._handles.get(uid)
        return handle.state if handle else None

    def erl_state(self, uid: str, uuid: str) -> erl.ErlState | None:
        return self._erl.get((uid, uuid))

    def limiter_views(self) -> list[LimiterView]:
        """What each mapped worker's limiter sees on each of its allocated devices (read from the
        mapped files: a handful of atomic loads per device, nothing else)."""
        now = self.clock()
        views = []
        for allocation in self._soft_allocations():
            uid = allocation.worker.uid
            handle = self._handles.get(uid)
            if handle is None or handle.state.closed:
                continue
            slots = {config.slot for config in handle.configs}
            heartbeat = handle.state.last_heartbeat
            for device in allocation.devices:
                if device.index not in slots:
                    continue
                snap = handle.state.device(device.index)
                views.append(LimiterView(
                    allocation, device, tokens=snap.tokens, capacity=snap.capacity, refill_rate=snap.refill_rate,
                    heartbeat_age_s=max(0.0, now - heartbeat),
                    frozen=limiter_frozen(heartbeat, now, snap.refill_rate, snap.tokens),
                    throttled_s=self._throttled.get((uid, device.native_uuid.lower()), 0.0)))
        return views

    def _soft_allocations(self) -> list[WorkerAllocation]:
        return [a for a in self.workers.allocations() if a.worker.isolation == keys.ISOLATION_SOFT]

    # --- files ----------------------------------------------------------------------------------------

    def ensure_for(self, allocation: WorkerAllocation) -> SharedState:
        """The worker's file for the HTTP routes: the mapped one, else opened, else created when it
        does not exist. Raises ShmError (or OSError) for a file that exists but cannot be used."""
        uid = allocation.worker.uid
        handle = self._live_handle(uid)
        if handle is not None:
            return handle.state
        configs = device_configs(allocation)
        state, created = self.store.ensure(allocation.worker.namespace, allocation.worker.name, configs,
                                           shm_owner(allocation))
        if not created:
            state.apply_limits(configs)
        self._handles[uid] = _Handle(allocation.worker.namespace, allocation.worker.name, state, configs)
        return state

    def register_pid(self, allocation: WorkerAllocation, host_pid: int) -> list[int]:
        """Add a host PID to the worker's PID set (dropping exited ones first); returns the set."""
        state = self.ensure_for(allocation)
        state.remove_pids(lambda pid: not pid_alive(pid))
        state.add_pid(host_pid)
        return state.pids()

    def hand_to_caller(self, allocation: WorkerAllocation, uid: int) -> bool:
        """A pod whose securityContext names no user runs as its image's user, which the hypervisor
        learns only when the limiter registers a process (`POST /api/v1/process`): the file, still
        root's, goes to that user (0600). Only once, only as root, never to root's own processes;
        returns whether it was handed over."""
        if not names_no_identity(allocation) or uid == 0 or os.geteuid() != 0:
            return False
        ns, name = allocation.worker.namespace, allocation.worker.name
        self.ensure_for(allocation)
        if self.store.owner_uid(ns, name) != os.geteuid():
            return False
        self.store.hand_over(ns, name, ShmOwner(uid=uid))
        log.info("shared memory of worker %s/%s handed to user %d, which its registered process runs as "
                 "(the pod's securityContext names no user)", ns, name, uid)
        return True

    def _handle(self, allocation: WorkerAllocation) -> _Handle:
        """The mapped file of a soft worker, opened or created, with its limits current (path (a))."""
        uid = allocation.worker.uid
        configs = device_configs(allocation)
        handle = self._live_handle(uid)
        if handle is None:
            ns, name, owner = allocation.worker.namespace, allocation.worker.name, shm_owner(allocation)
            try:
                state = self.store.open(ns, name, owner)
                state.apply_limits(configs)
                log.info("opened shared memory %s of worker %s/%s", state.path, ns, name)
            except FileNotFoundError:
                state = self.store.create(ns, name, configs, owner)
                log.info("created shared memory %s for worker %s/%s", state.path, ns, name)
            except ShmError as exc:
                log.warning("%s; creating it again", exc)
                state = self.store.create(ns, name, configs, owner)
            handle = self._handles[uid] = _Handle(ns, name, state, configs)
        elif handle.configs != configs:
            handle.state.apply_limits(configs)
            handle.configs = configs
        return handle

    def _live_handle(self, uid: str) -> _Handle | None:
        """The worker's mapping, unless its file was deleted under it (then it is closed and forgotten)."""
        handle = self._handles.get(uid)
        if handle is None:
            return None
        if not handle.state.path.is_file():
            log.warning("shared memory %s was deleted; creating it again", handle.state.path)
            handle.state.close()
            del self._handles[uid]
            return None
        return handle

    def _drop(self, uid: str) -> None:
        handle = self._handles.pop(uid)
        handle.state.close()
        self._erl = {k: v for k, v in self._erl.items() if k[0] != uid}
        self._throttled = {k: v for k, v in self._throttled.items() if k[0] != uid}
        self.store.remove(handle.namespace, handle.name)
        log.info("removed shared memory of worker %s/%s", handle.namespace, handle.name)

    def sweep(self) -> list[tuple[str, str]]:
        """Remove files that belong to no tracked worker; returns the (namespace, pod) removed."""
        known = {(h.namespace, h.name) for h in self._handles.values()}
        known |= {(a.worker.namespace, a.worker.name) for a in self.workers.allocations()}
        removed = []
        for namespace, pod in self.store.strays(known):
            self.store.remove(namespace, pod)
            removed.append((namespace, pod))
        if removed:
            log.info("removed %d stray shared-memory file(s): %s", len(removed),
                     ", ".join(f"{ns}/{pod}" for ns, pod in removed))
        self.last_sweep = removed
        return removed

    def close(self) -> None:
        for handle in self._handles.values():
            handle.state.close()
        self._handles.clear()

    # --- one tick -------------------------------------------------------------------------------------

    async def tick(self) -> None:
        allocations = self._soft_allocations()
        if allocations:
            await self.registry.sample()
        now = self.clock()
        current = {a.worker.uid for a in allocations}
        for uid in [u for u in self._handles if u not in current and not self.workers.tracks(u)]:
            self._drop(uid)
        errors: list[str] = []
        for allocation in allocations:
            try:
                handle = self._handle(allocation)
                self._sync(handle, allocation, now)
            except (ShmError, OSError) as exc:
                errors.append(f"{allocation.worker.namespace}/{allocation.worker.name}: {exc}")
                log.warning("shared memory of worker %s/%s: %s", allocation.worker.namespace,
                            allocation.worker.name, exc)
        for uid, handle in self._handles.items():
            if uid not in current:  # tracked, but without an allocation now: keep the limiter alive
                handle.state.heartbeat(now)
        self.ticks += 1
        self._report(errors)

    def _sync(self, handle: _Handle, allocation: WorkerAllocation, now: float) -> None:
        state = handle.state
        state.heartbeat(now)
        registered = set(state.pids())
        if registered:
            state.remove_pids(lambda pid: not pid_alive(pid))
        uid = allocation.worker.uid
        processes = self.registry.processes()
        ours = [p for p in processes if p.pid in registered or self.workers.worker_for_pid(p.pid) == uid]
        self._write_memory(state, handle.configs, ours)
        self._rate_limit(state, allocation, handle.configs, now, processes, ours)

    def _write_memory(self, state: SharedState, configs: Sequence[DeviceConfig], ours: Sequence[GpuProcess]) -> None:
        by_uuid: dict[str, int] = {}
        for proc in ours:
            by_uuid[proc.device_uuid] = by_uuid.get(proc.device_uuid, 0) + proc.used_memory_bytes
        total = sum(by_uuid.values())
        for config in configs:
            used = by_uuid.get(config.uuid.lower(), 0)
            if len(configs) == 1 and used == 0:
                used = total
            state.set_pod_memory_used(config.slot, used)

    def _rate_limit(self, state: SharedState, allocation: WorkerAllocation, configs: Sequence[DeviceConfig],
                    now: float, processes: Sequence[GpuProcess], ours: Sequence[GpuProcess]) -> None:
        metrics = self.registry.metrics()
        for config in configs:
            sample = metrics.get(config.uuid.lower())
            if sample is None:
                continue
            key = (allocation.worker.uid, config.uuid.lower())
            target = config.up_limit / 100
            used = pod_utilisation(config.uuid.lower(), sample.utilization_percent, processes, ours)
            controller, capacity = erl.step(self._erl.get(key, erl.ErlState()), target=target,
                                            utilisation=used / 100, params=self.params)
            self._erl[key] = controller
            before = state.device(config.slot)
            if before.tokens < MIN_LAUNCH_TOKENS:  # what the limiter left since the last refill
                self._throttled[key] = self._throttled.get(key, 0.0) + self.interval
            state.set_bucket(config.slot, controller.rate, capacity)
            refill = functools.partial(erl.rebalance_tokens, capacity=capacity,
                                       last_update=before.last_token_update, now=now,
                                       rate=controller.rate, target=target, smoothed=controller.smoothed)
            tokens = state.update_tokens(config.slot, refill)
            state.set_last_token_update(config.slot, now)
            log.debug("ERL [%s:%s] util=%.1f%% pod=%.1f%% smooth=%.1f%% target=%.1f%% rate=%.2f cap=%.2f tokens=%.2f "
                      "integral=%.3f", *key, sample.utilization_percent, used, controller.smoothed * 100, target * 100,
                      controller.rate, capacity, tokens, controller.integral)

    def _report(self, errors: list[str]) -> None:
        if self.readiness is None:
            return
        files = len(self._handles)
        if errors:
            self.readiness.set("shm-sync", False, "; ".join(errors))
        else:
            self.readiness.set("shm-sync", True, f"{files} shared-memory file(s) under {self.store.root}, "
                                                 f"synced every {SYNC_INTERVAL_S:g}s")
        controlled = len(self._erl)
        self.readiness.set("rate-limiter", True, f"{controlled} (worker, device) pair(s) under rate control")

    # --- running --------------------------------------------------------------------------------------

    async def run(self, *, interval: float = SYNC_INTERVAL_S, sweep_interval: float = SWEEP_INTERVAL_S) -> None:
        """Tick every `interval` and sweep every `sweep_interval` (the first sweep once the worker
        tracker has synced and the devices are discovered) until cancelled."""
        next_sweep = 0.0
        self.interval = interval
        try:
            while True:
                try:
                    await self.tick()
                except Exception as exc:  # one bad tick must not end soft isolation for every worker
                    log.exception("shared-memory sync failed")
                    if self.readiness is not None:
                        self.readiness.set("shm-sync", False, f"sync failed: {exc}")
                if self.synced() and self.registry.discovered and time.monotonic() >= next_sweep:
                    self.sweep()
                    next_sweep = time.monotonic() + sweep_interval
                await anyio.sleep(interval)
        finally:
            self.close()
