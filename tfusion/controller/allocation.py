"""AllocatorService: the controller's owner of the pure `GpuAllocator`, fed from and written back to the API.

Why it exists: the allocator (tfusion/allocator) has no I/O; something has to keep it in step with
the cluster, rebuild it after a restart, and persist what it decides. That is this module. It runs
on the leader only (followers keep no allocator state; each leadership term rebuilds it), as four
pieces registered with the process's Manager:

- **Feed** (informer handlers, acting only while this replica holds a recovered allocator):
  GPUResourceQuota spec -> `set_quota`/`remove_quota`; a GPUPool's
  `spec.schedulingConfigTemplate` (its template's `spec.placement.mode`) and
  `spec.capacityConfig.oversubscription` -> `set_pool_config`; worker pods: a deleted or finished
  pod releases its allocation, a bound worker the allocator does not know (bound by another
  process) is adopted from its annotations, and one naming a GPU that does not exist yet is
  adopted when that GPU appears.
- **Recovery** (the leader-only runnable `run_leader`, once per term, after the caches synced):
  rebuild everything from the informer caches: pools, GPUs, quotas, and every worker pod
  (label `<domain>/component=worker`, `spec.nodeName` set, annotation `<domain>/gpu-ids`
  present, not finished, and not (deleting with our finalizer gone)) through `restore`. Until
  then every allocation request waits on a gate (`wait_ready`). Then the orphan sweep runs every
  3 minutes: allocations whose pod is gone (confirmed with a GET), replaced or finished are
  released, assumed allocations older than the assume TTL (30 minutes) expire.
- **GPU reconciler** `gpu-status` (level-triggered, key = GPU name): applies the cached GPU to the
  allocator (`upsert_gpu`/`remove_gpu`; a capacity change moves available by the same delta;
  `status.available`, `runningApps` and `allocatedPartitions` are the allocator's output and never
  read back), then writes `status.available`/`runningApps` from the ledger when the object says
  otherwise (GET + PUT on the status subresource on the read resourceVersion; a 409 re-reads and
  retries), and stamps the GPUNode's `<domain>/last-sync`. A hand edit of `status.available`
  is an update event, so it is rewritten at once; an `AllocatorError` (a GPU with allocations
  moved to another node) becomes a Warning event on the GPU and a retry with backoff.
- **Quota reconciler** `quota-status` (key = namespace/name): `status.used`, `availablePercent`,
  `conditions` (Ready; lastTransitionTime kept while the status does not change) and
  `lastUpdateTime`, written when they differ from the ledger.

Allocator changes (release, adopt, scheduling) mark GPUs and quotas dirty; `flush()` enqueues
them on the reconcilers after `--sync-interval`, so a burst of changes becomes one write per
object. Observability: readiness condition "allocator" (followers: ready, "standby"; leader: ready
once recovered); metrics `tfusion_allocator_*`, and the reconcilers' `tfusion_reconcile_*`.

HTTP (allocation_http.py) serves `GET /api/allocation` from `views.build` and
`POST /api/simulate-schedule`. Fixed against the original on purpose: its /api/allocation keyed
`gpuStore` by `NamespacedName.String()`, i.e. "/<name>" for these cluster-scoped GPU objects; here
every GPU key is the plain GPU name, the same key as in `gpuToWorkerMap` and `GPUNames`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import anyio
from prometheus_client import Counter, Gauge

from tfusion.allocator import (
    AllocatorError,
    AllocRequest,
    GpuAllocator,
    GpuObjectError,
    PlacementModeError,
    PoolConfig,
    QuotaSpecError,
    RequestError,
    gpu_from_object,
    quota_from_object,
    request_from_pod,
)
from tfusion.allocator.allocator import DEFAULT_ASSUME_TTL, DEFAULT_MAX_WORKERS_PER_NODE
from tfusion.api import annotations as tfa
from tfusion.api.annotations import AnnotationError
from tfusion.controller import views
from tfusion.controller.reconcilers.quota import report_alert_transition
from tfusion.controller.scheduling.config import SchedulerConfigError, load_scheduler_args
from tfusion.errors import RoleError
from tfusion.kube import resources as r
from tfusion.kube.client import Conflict, KubeClient, KubeError, NotFound
from tfusion.kube.reconciler import Controller, Result
from tfusion.settings import NotImplementedSettingError

if TYPE_CHECKING:
    from tfusion.controller.role import ControllerRuntime

log = logging.getLogger(__name__)

CONDITION = "allocator"
ORPHAN_SWEEP_INTERVAL = 180.0
#: how long an allocation request waits for leader recovery before 503
READY_TIMEOUT = 30.0
STATUS_WRITE_ATTEMPTS = 5
RECOVERY_RETRY_S = 5.0
#: how often allocator changes are handed to the reconcilers (each then waits --sync-interval)
FLUSH_INTERVAL_S = 0.5
#: a GPUNode's last-sync annotation is refreshed at most this often
LAST_SYNC_MIN_INTERVAL_S = 5.0
FINISHED_PHASES = ("Succeeded", "Failed")
WORKER = "worker"

Obj = dict[str, Any]


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def is_live_worker(pod: Mapping[str, Any]) -> bool:
    """A worker pod whose GPUs are still held: bound, with gpu-ids, not finished, not being
    deleted after our finalizer has gone (the recovery rule of the original, plus "not finished")."""
    meta = _meta(pod)
    if (meta.get("labels") or {}).get(tfa.COMPONENT) != WORKER:
        return False
    if not (pod.get("spec") or {}).get("nodeName"):
        return False
    if not (meta.get("annotations") or {}).get(tfa.GPU_IDS):
        return False
    if (pod.get("status") or {}).get("phase") in FINISHED_PHASES:
        return False
    return not (meta.get("deletionTimestamp") and tfa.FINALIZER not in (meta.get("finalizers") or []))


def worker_request(pod: Mapping[str, Any], allocator: GpuAllocator) -> tuple[AllocRequest, tuple[str, ...]]:
    """The allocation a bound worker pod holds, from its annotations (raises RequestError).

    A pod that names no pool gets the pool of its first GPU."""
    notes = _meta(pod).get("annotations") or {}
    try:
        names = tfa.parse_gpu_ids(notes[tfa.GPU_IDS], key=tfa.GPU_IDS)
    except AnnotationError as exc:
        raise RequestError(exc.key, exc.value, exc.allowed, detail=exc.detail) from None
    default_pool = allocator.gpu_info(names[0]).pool if knows_gpu(allocator, names[0]) else None
    req = request_from_pod(pod, default_pool=default_pool)
    return req, names


def knows_gpu(allocator: GpuAllocator, name: str) -> bool:
    try:
        allocator.gpu_info(name)
    except KeyError:
        return False
    return True


class AllocatorMetrics:
    """The `tfusion_allocator_*` families."""

    def __init__(self, service: AllocatorService) -> None:
        registry = service.runtime.registry
        self.allocations = Counter(
            "tfusion_allocator_allocations", "allocations recorded by the leader, by result "
            "(restored at recovery, adopted from a bound pod, scheduled; failed = refused)",
            ["result"], registry=registry)
        self.releases = Counter(
            "tfusion_allocator_releases", "allocations released, by reason", ["reason"], registry=registry)
        self.writes = Counter(
            "tfusion_allocator_status_writes", "status writes to the API, by object kind and result",
            ["kind", "result"], registry=registry)
        self.recovery_duration = Gauge(
            "tfusion_allocator_recovery_duration_seconds", "how long the last leader recovery took",
            registry=registry)
        dirty = Gauge("tfusion_allocator_dirty_gpus", "GPUs whose status awaits the next flush",
                      registry=registry)
        dirty.set_function(lambda: float(service.dirty_count()))
        live = Gauge("tfusion_allocator_live_allocations", "allocations held (assumed and committed)",
                     registry=registry)
        live.set_function(lambda: float(service.live_count()))


class AllocatorService:
    """Owns the leader's `GpuAllocator`; see the module docstring. Call `attach()` once, in
    `configure()`, before the runtime serves."""

    def __init__(self, runtime: ControllerRuntime, *, orphan_sweep_interval: float = ORPHAN_SWEEP_INTERVAL,
                 assume_ttl: float = DEFAULT_ASSUME_TTL, ready_timeout: float = READY_TIMEOUT) -> None:
        self.runtime = runtime
        self.settings = runtime.settings
        try:
            self.scheduler_args = load_scheduler_args(runtime.settings.scheduler_config)
        except (SchedulerConfigError, NotImplementedSettingError) as exc:
            raise RoleError(f"controller: {exc}") from None
        if self.scheduler_args.source:
            log.info("scheduler arguments from %s: %s", self.scheduler_args.source, self.scheduler_args)
        self.orphan_sweep_interval = orphan_sweep_interval
        self.assume_ttl = assume_ttl
        self.ready_timeout = ready_timeout
        self._allocator: GpuAllocator | None = None
        self._ready = anyio.Event()
        self._quota_names: dict[str, str] = {}  # namespace -> name of the quota fed to the allocator
        self._quota_retry: set[str] = set()
        #: live workers naming a GPU the allocator does not know yet (uid -> pod): adopted when it appears
        self._waiting: dict[str, Obj] = {}
        self.metrics = AllocatorMetrics(self)
        self._last_sync: dict[str, float] = {}  # GPUNode -> when its last-sync was written (clock)
        self.gpu_status: Controller | None = None
        self.quota_status: Controller | None = None
        self.recovered: list[str] = []  # pod UIDs restored by the last recovery
        self.skipped: list[tuple[str, str]] = []  # (pod, reason) the last recovery could not restore
        #: the drift audit's last result (tfusion/controller/reconcilers/drift.py), for /api/allocation
        self.last_drift: dict[str, Any] | None = None
        #: (pool, succeeded) -> placements counted by `count_allocation` since the process started
        self.allocation_tally: dict[tuple[str, bool], int] = {}

    # --- wiring ---------------------------------------------------------------------------------

    def attach(self) -> AllocatorService:
        from tfusion.controller.allocation_http import allocation_handlers

        rt = self.runtime
        rt.informer(r.GPURESOURCEQUOTAS).add_handler(on_add=self._on_quota, on_update=self._on_quota_update,
                                                     on_delete=self._on_quota_delete)
        rt.informer(r.GPUPOOLS).add_handler(on_add=self._on_pool, on_update=self._on_pool_update,
                                            on_delete=self._on_pool_delete)
        rt.informer(r.SCHEDULINGCONFIGTEMPLATES).add_handler(
            on_add=self._on_template, on_update=self._on_template_update, on_delete=self._on_template)
        rt.informer(r.PODS).add_handler(on_add=self._on_pod, on_update=self._on_pod_update,
                                        on_delete=self._on_pod_delete)
        self.gpu_status = rt.manager.controller("gpu-status").for_(r.GPUS).complete(self.reconcile_gpu)
        self.quota_status = rt.manager.controller("quota-status").for_(r.GPURESOURCEQUOTAS) \
            .complete(self.reconcile_quota)
        rt.add_leader_task(self.run_leader)
        rt.routes.extend(allocation_handlers(self))
        rt.allocation = self
        if self.settings.leader_elect:
            rt.readiness.set(CONDITION, True, "standby: not the leader")
        else:
            rt.readiness.set(CONDITION, False, "leader: waiting for the informers to sync")
        return self

    @property
    def allocator(self) -> GpuAllocator | None:
        """The recovered allocator while this replica leads, else None."""
        return self._allocator

    def dirty_count(self) -> int:
        return len(self._allocator.dirty_gpus()) if self._allocator is not None else 0

    def live_count(self) -> int:
        return len(self._allocator.allocations()) if self._allocator is not None else 0

    def count_allocation(self, ok: bool, pool: str = "") -> None:
        """For the scheduler: one placement recorded (ok) or refused, in `pool` (tf_system_metrics)."""
        self.metrics.allocations.labels("scheduled" if ok else "failed").inc()
        self.allocation_tally[(pool, ok)] = self.allocation_tally.get((pool, ok), 0) + 1

    async def wait_ready(self, timeout: float | None = None) -> GpuAllocator | None:
        """The allocator once recovered; None when this replica is not the leader.

        Raises TimeoutError when this replica leads but recovery does not finish within `timeout`
        (default `ready_timeout`)."""
        with anyio.fail_after(self.ready_timeout if timeout is None else timeout):
            while True:
                allocator = self._allocator
                if allocator is not None:
                    return allocator
                if not self.runtime.is_leader:
                    return None
                gate = self._ready
                with anyio.move_on_after(0.5):  # leadership may start or end without the gate moving
                    await gate.wait()

    # --- leader lifecycle -----------------------------------------------------------------------

    async def run_leader(self) -> None:
        """Leader-only task: recover, then sync and sweep until leadership ends (cancellation)."""
        rt = self.runtime
        try:
            rt.readiness.set(CONDITION, False, "leader: waiting for the informers to sync")
            informers = [rt.informer(res) for res in (r.GPUS, r.GPURESOURCEQUOTAS, r.GPUPOOLS,
                                                      r.SCHEDULINGCONFIGTEMPLATES, r.PODS)]
            for informer in informers:
                await informer.wait_synced()
            started = time.monotonic()
            allocator = await self._recover()
            self._allocator = allocator
            self._ready.set()
            self.metrics.recovery_duration.set(time.monotonic() - started)
            rt.readiness.set(CONDITION, True, f"leader: recovered {len(self.recovered)} allocation(s) on "
                                              f"{len(allocator.gpu_names())} GPU(s)")
            log.info("allocator recovered %d allocation(s), skipped %d, %d GPU(s), %d dirty",
                     len(self.recovered), len(self.skipped), len(allocator.gpu_names()),
                     len(allocator.dirty_gpus()))
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._flush_loop)
                tg.start_soon(self._sweep_loop)
        finally:
            self._end_term()

    async def _recover(self) -> GpuAllocator:
        while True:
            try:
                return self._rebuild()
            except Exception as exc:  # a bug: say so on /readyz and retry rather than end leadership
                log.exception("allocator recovery failed; retrying in %.0f s", RECOVERY_RETRY_S)
                self.runtime.readiness.set(CONDITION, False, f"leader: recovery failed: {exc!r}")
            await anyio.sleep(RECOVERY_RETRY_S)

    def _end_term(self) -> None:
        self._allocator = None
        self._quota_names.clear()
        self._quota_retry.clear()
        self._waiting.clear()
        gate, self._ready = self._ready, anyio.Event()
        gate.set()  # wake waiters: they see no allocator and re-check leadership
        if self.settings.leader_elect:
            self.runtime.readiness.set(CONDITION, True, "standby: not the leader")
        else:
            self.runtime.readiness.set(CONDITION, False, "stopped")

    def _rebuild(self) -> GpuAllocator:
        """A fresh allocator from the informer caches (no await: one consistent snapshot)."""
        rt = self.runtime
        args = self.scheduler_args
        allocator = GpuAllocator(max_workers_per_node=self.settings.max_workers_per_node
                                 or args.max_workers_per_node or DEFAULT_MAX_WORKERS_PER_NODE,
                                 weights=args.weights, assume_ttl=self.assume_ttl)
        self._quota_names.clear()
        for pool in rt.informer(r.GPUPOOLS).list():
            self._apply_pool(allocator, pool)
        gpu_cache = rt.informer(r.GPUS)
        for gpu in gpu_cache.list():
            self._apply_gpu(allocator, gpu)
        for quota in rt.informer(r.GPURESOURCEQUOTAS).list():
            self._apply_quota(allocator, quota)
        entries: list[tuple[AllocRequest, tuple[str, ...]]] = []
        skipped: list[tuple[str, str]] = []
        pods_by_uid: dict[str, Obj] = {}
        self._waiting.clear()
        for pod in rt.informer(r.PODS).list():
            if not is_live_worker(pod):
                continue
            try:
                req, gpus = worker_request(pod, allocator)
            except RequestError as exc:
                skipped.append((_pod_ref(pod), str(exc)))
                self.runtime.events.warning(pod, "AllocationNotRecovered", f"cannot read the GPUs it holds: {exc}")
                continue
            pods_by_uid[req.pod_uid] = pod
            if not all(knows_gpu(allocator, g) for g in gpus):
                self._waiting[req.pod_uid] = pod
                skipped.append((_pod_ref(pod), f"unknown GPU(s) in {list(gpus)}; adopted when they appear"))
                continue
            entries.append((req, gpus))
        names = {req.pod_uid: f"{req.namespace}/{req.pod_name}" for req, _ in entries}
        for uid, reason in allocator.restore(entries):
            skipped.append((names.get(uid, uid), reason))
            self.runtime.events.warning(pods_by_uid[uid], "AllocationNotRecovered", reason)
        for pod_ref, reason in skipped:
            log.warning("recovery: cannot restore the allocation of pod %s: %s", pod_ref, reason)
        self.recovered = sorted(uid for uid in names if allocator.has_allocation(uid))
        self.skipped = skipped
        self.metrics.allocations.labels("restored").inc(len(self.recovered))
        self.metrics.allocations.labels("failed").inc(len(skipped))
        allocator.take_dirty()  # the reconcilers compare every GPU with the ledger when the term starts
        allocator.take_dirty_quotas()
        return allocator

    # --- feeding --------------------------------------------------------------------------------

    def _apply_gpu(self, allocator: GpuAllocator, obj: Obj) -> None:
        """Feed one cached GPU to the allocator. An unreadable object is skipped with a log line;
        an AllocatorError propagates (the GPU reconciler reports it and retries)."""
        if not (obj.get("status") or {}).get("capacity"):
            # The hypervisor creates a GPU, then reports its status in a second write: nothing to use yet.
            log.debug("GPU %s has no reported capacity yet", _meta(obj).get("name"))
            return
        try:
            allocator.upsert_gpu(gpu_from_object(obj))
        except GpuObjectError as exc:
            log.warning("ignoring GPU %s: %s", _meta(obj).get("name"), exc)
            self.runtime.events.warning(obj, "InvalidGPU", f"ignored by the allocator: {exc}")

    def _adopt_waiting_for(self, allocator: GpuAllocator, name: str) -> None:
        """Workers that named GPU `name` before it existed are adopted now that it does."""
        for pod in list(self._waiting.values()):
            notes = _meta(pod).get("annotations") or {}
            try:
                names = tfa.parse_gpu_ids(str(notes.get(tfa.GPU_IDS, "")), key=tfa.GPU_IDS)
            except AnnotationError:
                continue
            if name in names:
                self._adopt(allocator, pod)

    def _apply_quota(self, allocator: GpuAllocator, obj: Obj) -> None:
        try:
            namespace, spec = quota_from_object(obj)
        except QuotaSpecError as exc:
            log.warning("ignoring GPUResourceQuota %s/%s: %s", _meta(obj).get("namespace"),
                        _meta(obj).get("name"), exc)
            self.runtime.events.warning(obj, "InvalidQuota", str(exc))
            return
        allocator.set_quota(namespace, spec)
        self._quota_names[namespace] = str(_meta(obj).get("name"))

    def _on_quota(self, obj: Obj) -> None:
        if self._allocator is not None:
            self._apply_quota(self._allocator, obj)

    def _on_quota_update(self, old: Obj | None, new: Obj) -> None:
        if old is not None and old.get("spec") == new.get("spec"):
            return  # our own status write coming back
        self._on_quota(new)

    def _on_quota_delete(self, obj: Obj) -> None:
        meta = _meta(obj)
        namespace = str(meta.get("namespace") or "")
        if self._allocator is not None and self._quota_names.get(namespace) == meta.get("name"):
            self._allocator.remove_quota(namespace)
            del self._quota_names[namespace]

    def _pool_config(self, pool: Mapping[str, Any]) -> PoolConfig:
        spec = pool.get("spec") or {}
        mode = PoolConfig().placement_mode
        template_name = spec.get("schedulingConfigTemplate")
        if template_name:
            template = self.runtime.informer(r.SCHEDULINGCONFIGTEMPLATES).get(str(template_name))
            if template is None:
                log.info("pool %s: SchedulingConfigTemplate %s not found; using %s",
                         _meta(pool).get("name"), template_name, mode)
            else:
                mode = ((template.get("spec") or {}).get("placement") or {}).get("mode") or mode
        over = ((spec.get("capacityConfig") or {}).get("oversubscription")) or {}
        defaults = PoolConfig()
        return PoolConfig(
            placement_mode=str(mode),
            tflops_oversell_ratio=int(over.get("tflopsOversellRatio", defaults.tflops_oversell_ratio)),
            vram_expand_to_host_mem=int(over.get("vramExpandToHostMem", defaults.vram_expand_to_host_mem)),
            vram_expand_to_host_disk=int(over.get("vramExpandToHostDisk", defaults.vram_expand_to_host_disk)),
        )

    def _apply_pool(self, allocator: GpuAllocator, pool: Mapping[str, Any]) -> None:
        name = str(_meta(pool).get("name"))
        try:
            allocator.set_pool_config(name, self._pool_config(pool))
        except (PlacementModeError, TypeError, ValueError) as exc:
            log.error("pool %s: %s; keeping its previous placement settings", name, exc)
            self.runtime.events.warning(dict(pool), "InvalidSchedulingConfig", str(exc))

    def _on_pool(self, obj: Obj) -> None:
        if self._allocator is not None:
            self._apply_pool(self._allocator, obj)

    def _on_pool_update(self, old: Obj | None, new: Obj) -> None:
        if old is not None and old.get("spec") == new.get("spec"):
            return
        self._on_pool(new)

    def _on_pool_delete(self, obj: Obj) -> None:
        if self._allocator is not None:
            self._allocator.set_pool_config(str(_meta(obj).get("name")), PoolConfig())

    def _on_template(self, obj: Obj) -> None:
        allocator = self._allocator
        if allocator is None:
            return
        name = _meta(obj).get("name")
        for pool in self.runtime.informer(r.GPUPOOLS).list():
            if (pool.get("spec") or {}).get("schedulingConfigTemplate") == name:
                self._apply_pool(allocator, pool)

    def _on_template_update(self, old: Obj | None, new: Obj) -> None:
        self._on_template(new)

    # --- pods -----------------------------------------------------------------------------------

    def _on_pod(self, pod: Obj) -> None:
        allocator = self._allocator
        if allocator is None:
            return
        uid = str(_meta(pod).get("uid") or "")
        phase = (pod.get("status") or {}).get("phase")
        if phase in FINISHED_PHASES:
            self._waiting.pop(uid, None)
            self._release(allocator, uid, "finished")
        elif is_live_worker(pod) and uid and not allocator.has_allocation(uid):
            self._adopt(allocator, pod)

    def _on_pod_update(self, old: Obj | None, new: Obj) -> None:
        self._on_pod(new)

    def _on_pod_delete(self, pod: Obj) -> None:
        self._waiting.pop(str(_meta(pod).get("uid") or ""), None)
        if self._allocator is not None:
            self._release(self._allocator, str(_meta(pod).get("uid") or ""), "deleted")

    def _adopt(self, allocator: GpuAllocator, pod: Obj) -> None:
        """A bound worker the allocator does not know: record what its annotations say it holds."""
        uid = str(_meta(pod).get("uid") or "")
        try:
            req, names = worker_request(pod, allocator)
        except RequestError as exc:
            self._waiting.pop(uid, None)
            log.warning("pod %s holds GPUs the allocator cannot read: %s", _pod_ref(pod), exc)
            self.runtime.events.warning(pod, "AllocationNotAdopted", f"cannot read the GPUs it holds: {exc}")
            return
        if not all(knows_gpu(allocator, g) for g in names):
            if uid not in self._waiting:
                log.info("pod %s holds GPU(s) %s not known yet; adopting it when they appear",
                         _pod_ref(pod), ",".join(names))
            self._waiting[uid] = pod
            return
        self._waiting.pop(uid, None)
        skipped = allocator.restore([(req, names)])
        if skipped:
            log.warning("pod %s: cannot adopt its allocation: %s", _pod_ref(pod), skipped[0][1])
            self.runtime.events.warning(pod, "AllocationNotAdopted", skipped[0][1])
            self.metrics.allocations.labels("failed").inc()
        else:
            log.info("adopted the allocation of pod %s on %s", _pod_ref(pod), ",".join(names))
            self.metrics.allocations.labels("adopted").inc()

    def release_pod(self, uid: str, reason: str) -> bool:
        """Release what a pod holds (for the pod reconciler: its finalizer goes once this is
        done). True when something was released; False when nothing was held or this replica
        does not lead. The UID is remembered, so a late bind cannot resurrect it."""
        allocator = self._allocator
        if allocator is None or not uid:
            return False
        released = allocator.release(uid)
        if released:
            self.metrics.releases.labels(reason).inc()
            log.info("released the allocation of pod %s (%s)", uid, reason)
            self.flush()
        return released

    def _release(self, allocator: GpuAllocator, uid: str, reason: str) -> None:
        if not uid:
            return
        # release even without an allocation: remembers the UID, so a late bind cannot resurrect it
        if allocator.release(uid):
            self.metrics.releases.labels(reason).inc()
            log.info("released the allocation of pod %s (%s)", uid, reason)

    # --- the reconcilers ------------------------------------------------------------------------

    @property
    def client(self) -> KubeClient:
        return self.runtime.client

    def flush(self) -> None:
        """Hand the GPUs and quotas the allocator changed to their reconcilers; each writes after
        --sync-interval, so a burst of changes to one object becomes one write."""
        allocator = self._allocator
        if allocator is None:
            return
        delay = self.settings.sync_interval
        if self.gpu_status is not None:
            for name in allocator.take_dirty():
                self.gpu_status.enqueue_after(name, delay)
        if self.quota_status is not None:
            for namespace in allocator.take_dirty_quotas():
                quota = self._quota_names.get(namespace)
                if quota is not None:
                    self.quota_status.enqueue_after(f"{namespace}/{quota}", delay)

    async def _flush_loop(self) -> None:
        while True:
            self.flush()
            await self.runtime.manager.clock.sleep(FLUSH_INTERVAL_S)

    async def reconcile_gpu(self, name: str) -> Result | None:
        """Level-triggered: the allocator knows the cached GPU, and the GPU's status says what the
        ledger says."""
        allocator = await self.wait_ready()
        if allocator is None:
            return None
        cached = self.runtime.informer(r.GPUS).get(name)
        if cached is None:
            allocator.remove_gpu(name)
            return None
        try:
            self._apply_gpu(allocator, cached)
        except AllocatorError as exc:
            self.runtime.events.warning(cached, "GPUNotApplied", str(exc))
            raise
        self._adopt_waiting_for(allocator, name)
        if not knows_gpu(allocator, name) or _status_matches(cached, views.gpu_status(allocator, name)):
            return None
        try:
            node = await self._write_gpu(allocator, name)
        except KubeError as exc:
            self.metrics.writes.labels("gpu", "error").inc()
            log.warning("cannot write the status of GPU %s: %s; retrying", name, exc)
            raise
        if node:
            await self._touch_gpu_node(node)
        return None

    async def reconcile_quota(self, key: str) -> Result | None:
        allocator = await self.wait_ready()
        if allocator is None:
            return None
        namespace, _, name = key.partition("/")
        cached = self.runtime.informer(r.GPURESOURCEQUOTAS).get(key)
        if cached is None:
            if self._quota_names.get(namespace) == name:
                allocator.remove_quota(namespace)
                del self._quota_names[namespace]
            return None
        if self._quota_names.get(namespace) != name:
            self._apply_quota(allocator, cached)
        if self._quota_names.get(namespace) == name:
            try:
                await self._write_quota(allocator, namespace, cached)
            except KubeError as exc:
                self.metrics.writes.labels("quota", "error").inc()
                log.warning("cannot write the status of GPUResourceQuota %s: %s; retrying", key, exc)
                raise
        return None

    async def _write_gpu(self, allocator: GpuAllocator, name: str) -> str | None:
        """GET + PUT status, retried on conflict. Returns the GPU's GPUNode, None if nothing written."""
        for _ in range(STATUS_WRITE_ATTEMPTS):
            try:
                obj = await self.client.get(r.GPUS, name)
            except NotFound:
                return None  # deleted: the informer will remove it
            if allocator is not self._allocator or not knows_gpu(allocator, name):
                return None
            status = dict(obj.get("status") or {})
            wanted = views.gpu_status(allocator, name)
            if status.get("available") == wanted["available"] and \
                    (status.get("runningApps") or []) == wanted["runningApps"]:
                return None
            status.update(wanted)
            obj["status"] = status
            try:
                await self.client.replace(r.GPUS, obj, subresource="status")
            except Conflict:
                self.metrics.writes.labels("gpu", "conflict").inc()
                continue
            except NotFound:
                return None
            self.metrics.writes.labels("gpu", "ok").inc()
            labels = _meta(obj).get("labels") or {}
            return str(labels.get(tfa.MANAGED_BY) or allocator.gpu_info(name).node or "") or None
        raise Conflict({"reason": "Conflict", "code": 409,
                        "message": f"GPU {name} changed {STATUS_WRITE_ATTEMPTS} times while its status "
                                   "was being written"})

    async def _touch_gpu_node(self, node: str) -> None:
        clock = self.runtime.manager.clock
        if clock.now() - self._last_sync.get(node, float("-inf")) < LAST_SYNC_MIN_INTERVAL_S:
            return
        self._last_sync[node] = clock.now()
        patch = {"metadata": {"annotations": {tfa.LAST_SYNC: tfa.now_rfc3339()}}}
        try:
            await self.client.patch(r.GPUNODES, node, patch)
            self.metrics.writes.labels("gpunode", "ok").inc()
        except NotFound:
            pass  # GPUs reported before their GPUNode exists
        except KubeError as exc:
            log.warning("cannot annotate GPUNode %s with %s: %s", node, tfa.LAST_SYNC, exc)
            self.metrics.writes.labels("gpunode", "error").inc()

    async def _write_quota(self, allocator: GpuAllocator, namespace: str, cached: Obj) -> None:
        """Write the quota's status when the ledger's differs from the cached one."""
        name = str(_meta(cached).get("name"))
        body = views.quota_status(allocator, namespace)
        old_status = cached.get("status") or {}
        if old_status.get("used") == body["used"] and old_status.get("availablePercent") == \
                body["availablePercent"] and _condition_statuses(old_status.get("conditions")) == \
                _condition_statuses(body["conditions"]):
            return
        now = tfa.now_rfc3339()
        old_conditions = (cached.get("status") or {}).get("conditions") or []
        conditions = []
        for condition in body["conditions"]:
            old = next((c for c in old_conditions if c.get("type") == condition["type"]), None)
            keep = old is not None and old.get("status") == condition["status"] and old.get("lastTransitionTime")
            conditions.append({**condition, "lastTransitionTime": old["lastTransitionTime"] if keep and old
                               else now,
                               "observedGeneration": int(_meta(cached).get("generation") or 0)})
        patch = {"status": {"used": body["used"], "availablePercent": body["availablePercent"],
                            "conditions": conditions, "lastUpdateTime": now}}
        try:
            await self.client.patch(r.GPURESOURCEQUOTAS, name, patch, namespace=namespace,
                                    subresource="status")
        except NotFound:
            return
        self.metrics.writes.labels("quota", "ok").inc()
        report_alert_transition(self.runtime.events, cached, old_conditions, conditions)

    # --- orphan sweep ---------------------------------------------------------------------------

    async def _sweep_loop(self) -> None:
        while True:
            await anyio.sleep(self.orphan_sweep_interval)
            try:
                await self.sweep_once()
            except Exception:
                log.exception("allocator orphan sweep failed")

    async def sweep_once(self) -> list[str]:
        """Release allocations whose pod is gone, replaced or finished; expire old assumed ones.
        Returns the released and expired pod UIDs.

        A pod the informer cache shows alive (same UID, not finished) is not asked for again; the
        others are read from the API server, so a missed deletion is confirmed before releasing."""
        allocator = self._allocator
        if allocator is None:
            return []
        pods = self.runtime.informer(r.PODS)
        gone: list[str] = []
        for uid, info in allocator.allocations(committed_only=True).items():
            req = info.request
            cached = pods.get(f"{req.namespace}/{req.pod_name}")
            if cached is not None and _pod_alive(cached, uid):
                continue
            try:
                pod = await self.client.get(r.PODS, req.pod_name, namespace=req.namespace)
            except NotFound:
                pod = None
            except KubeError as exc:
                log.warning("orphan sweep: cannot read pod %s/%s: %s", req.namespace, req.pod_name, exc)
                continue
            if allocator is not self._allocator:
                return gone
            if (pod is None or not _pod_alive(pod, uid)) and allocator.release(uid):
                self.metrics.releases.labels("orphan").inc()
                log.info("orphan sweep: released pod %s/%s (%s)", req.namespace, req.pod_name, uid)
                gone.append(uid)
        for uid in allocator.expire_assumed():
            self.metrics.releases.labels("expired").inc()
            log.info("orphan sweep: assumed allocation of pod %s expired", uid)
            gone.append(uid)
        return gone


def _status_matches(gpu: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    status = gpu.get("status") or {}
    return bool(status.get("available") == wanted["available"]
                and (status.get("runningApps") or []) == wanted["runningApps"])


def _condition_statuses(conditions: Any) -> list[tuple[Any, Any, Any, Any]]:
    return [(c.get("type"), c.get("status"), c.get("reason"), c.get("message"))
            for c in conditions or [] if isinstance(c, Mapping)]


def _pod_alive(pod: Mapping[str, Any], uid: str) -> bool:
    return _meta(pod).get("uid") == uid and (pod.get("status") or {}).get("phase") not in FINISHED_PHASES


def _pod_ref(pod: Mapping[str, Any]) -> str:
    meta = _meta(pod)
    return f"{meta.get('namespace')}/{meta.get('name')}"
