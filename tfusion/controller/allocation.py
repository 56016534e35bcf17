"""AllocatorService: the controller's owner of the pure `GpuAllocator`, fed from and written back to the API.

Why it exists: the allocator (tfusion/allocator) has no I/O; something has to keep it in step with
the cluster, rebuild it after a restart, and persist what it decides. That is this module. It runs
on the leader only (followers keep no allocator state; each leadership term rebuilds it), as four
pieces registered with the process's Manager:

- **Feed** (informer handlers, acting only while this replica holds a recovered allocator):
  GPUResourceQuota spec -> `set_quota`/`remove_quota`; a GPUPool's
  `spec.schedulingConfigTemplate` (its template's `spec.placement.mode`) and
  `spec.capacityConfig.oversubscription` -> `set_pool_config`; worker pods: a bound worker the
  allocator does not know (bound by another process) is adopted from its annotations, and one
  naming a GPU that does not exist yet is adopted when that GPU appears.
- **Recovery** (the leader-only runnable `run_leader`, once per term, after the caches synced):
  rebuild everything from the informer caches: pools, GPUs, quotas, and every worker pod
  (label `<domain>/component=worker`, `spec.nodeName` set, annotation `<domain>/gpu-ids`
  present, not finished, and not (deleting with our finalizer gone)) through `restore`. Until
  then every allocation request waits on a gate (`wait_ready`). Then the orphan sweep runs every
  3 minutes: allocations whose pod is gone (confirmed with a GET), replaced or finished are
  released, assumed allocations older than the assume TTL (30 minutes) expire, except those of gang
  members held at Permit (`keep_assumed`, set by the scheduler: a gang may wait longer).
- **Status reconcilers** `gpu-status` and `quota-status` (reconcilers/gpu_status.py and
  reconcilers/quota_status.py) write the ledger back into the GPU and quota statuses.
- **Release**: `release(uid, reason)` is the one release of what a pod holds: its GPUs in the ledger
  and, through `release_hooks`, its pod index, its host port and its billing. The pod reconciler
  (reconcilers/pod.py) calls it, from a worker's finalizer, for a finished pod and for a pod that is
  confirmed gone; the orphan sweep and the drift audit call it for an allocation whose pod they
  confirmed gone with a GET. The informer handlers here never release (a pod that leaves the pod
  informer may only have lost its label), except with ENABLE_CR_CONTROLLER=false: then no pod
  reconciler and no finalizer exist, and a pod is released when the informer reports it finished
  or gone.

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
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from typing import TYPE_CHECKING

import anyio
from prometheus_client import Counter, Gauge

from tfusion.allocator import (
    AllocRequest,
    GpuAllocator,
    GpuObjectError,
    PlacementModeError,
    PoolConfig,
    QuotaSpecError,
    RequestError,
    gpu_from_object,
    quota_from_object,
)
from tfusion.allocator.allocator import DEFAULT_ASSUME_TTL, DEFAULT_MAX_WORKERS_PER_NODE
from tfusion.allocator.topology import STAGE as TOPOLOGY_STAGE
from tfusion.api.accessors import Body, Gpu, GpuPool, Pod, section, text
from tfusion.api.annotations import AnnotationError
from tfusion.api.documents import collector_paused, freeze_long_lived
from tfusion.api.jsontypes import JsonMapping
from tfusion.controller.reconcilers.gpu_status import GpuStatusReconciler
from tfusion.controller.reconcilers.holdings import (
    gpu_names,
    knows_gpu,
    partition_catalog,
    pod_ref,
    reported_partitions,
    worker_request,
)
from tfusion.controller.reconcilers.quota_status import QuotaStatusReconciler
from tfusion.controller.scheduling.config import SchedulerConfigError, load_scheduler_args
from tfusion.errors import RoleError
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient, KubeError, NotFound
from tfusion.kube.pacing import batches, paced
from tfusion.kube.reconciler import Controller
from tfusion.settings import NotImplementedSettingError

if TYPE_CHECKING:
    from tfusion.controller.reconcilers.drift import DriftReport
    from tfusion.controller.runtime import ControllerRuntime
    from tfusion.controller.scheduling.explain import Why
    from tfusion.controller.scheduling.scheduler import Scheduler

log = logging.getLogger(__name__)

CONDITION = "allocator"
ORPHAN_SWEEP_INTERVAL = 180.0
#: how long an allocation request waits for leader recovery before 503
READY_TIMEOUT = 30.0
RECOVERY_RETRY_S = 5.0
#: recovered allocations restored per allocator call (each call rescores the nodes it touched)
RESTORE_BATCH = 2048
#: how often allocator changes are handed to the reconcilers (each then waits --sync-interval)
FLUSH_INTERVAL_S = 0.5

#: what else goes with a released pod, by its UID (its index and host port, its billing); idempotent
ReleaseHook = Callable[[str], Awaitable[None]]


class AllocatorMetrics:
    """The `tfusion_allocator_*` families."""

    def __init__(self, service: AllocatorService) -> None:
        registry = service.runtime.registry
        self.allocations = Counter(
            "tfusion_allocator_allocations", "allocations recorded by the leader, by result "
            "(restored at recovery, adopted from a bound pod, scheduled; failed = refused)",
            ["result"], registry=registry)
        self.topology = Counter(
            "tfusion_allocator_topology_placements", "multi-GPU placements judged by GPU topology, by outcome "
            "(satisfied: within the allowed tier; fallback: placed worse under soft mode; unsatisfied: "
            "refused under hard mode)", ["outcome"], registry=registry)
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
        #: set by configure() once the scheduler is built (simulate-schedule asks it about native-GPU pods)
        self.scheduler: Scheduler | None = None
        self._allocator: GpuAllocator | None = None
        self._ready = anyio.Event()
        self._quota_names: dict[str, str] = {}  # namespace -> name of the quota fed to the allocator
        #: live workers naming a GPU the allocator does not know yet (uid -> pod): adopted when it appears
        self._waiting: dict[str, Pod] = {}
        self.metrics = AllocatorMetrics(self)
        #: run by `release` for every released pod (the index and port allocators', the billing's)
        self.release_hooks: list[ReleaseHook] = []
        self.gpu_status: Controller | None = None
        self.quota_status: Controller | None = None
        self.recovered: list[str] = []  # pod UIDs restored by the last recovery
        self.skipped: list[tuple[str, str]] = []  # (pod, reason) the last recovery could not restore
        #: the drift audit's last result (tfusion/controller/reconcilers/drift.py), for /api/allocation
        self.last_drift: DriftReport | None = None
        #: (pool, succeeded) -> placements counted by `count_allocation` since the process started
        self.allocation_tally: dict[tuple[str, bool], int] = {}
        #: (pool, outcome) -> multi-GPU placements counted by `count_topology` (topology.OUTCOMES)
        self.topology_tally: dict[tuple[str, str], int] = {}
        #: pods whose assumed reservation the sweep must keep: gang members waiting at Permit
        #: (set by the scheduler's gang coordinator, scheduling/gang_runtime.py)
        self.keep_assumed: Callable[[], Collection[str]] = frozenset

    # --- wiring ---------------------------------------------------------------------------------

    def attach(self) -> AllocatorService:
        from tfusion.controller.allocation_http import allocation_handlers

        rt = self.runtime
        # the informers deliver raw objects; each handler reads them through a view from here on
        rt.informer(r.GPURESOURCEQUOTAS).add_handler(
            on_add=lambda obj: self._on_quota(Body(obj)),
            on_update=lambda old, new: self._on_quota_update(old and Body(old), Body(new)),
            on_delete=lambda obj: self._on_quota_delete(Body(obj)))
        rt.informer(r.GPUPOOLS).add_handler(
            on_add=lambda obj: self._on_pool(GpuPool(obj)),
            on_update=lambda old, new: self._on_pool_update(old and GpuPool(old), GpuPool(new)),
            on_delete=lambda obj: self._on_pool_delete(GpuPool(obj)))
        rt.informer(r.SCHEDULINGCONFIGTEMPLATES).add_handler(
            on_add=lambda obj: self._on_template(Body(obj)), on_update=lambda _, new: self._on_template(Body(new)),
            on_delete=lambda obj: self._on_template(Body(obj)))
        rt.informer(r.PROVIDERCONFIGS).add_handler(
            on_add=lambda _: self._on_providers(), on_update=lambda _, __: self._on_providers(),
            on_delete=lambda _: self._on_providers())
        # adoption only: what a pod holds is released by the pod reconciler (see the module docstring)
        rt.informer(r.PODS).add_handler(on_add=lambda obj: self._on_pod(Pod(obj)),
                                        on_update=lambda _, new: self._on_pod(Pod(new)))
        if not self.settings.enable_cr_controller:  # no pod reconciler, no finalizer: the informer's word
            rt.informer(r.PODS).add_handler(on_update=lambda _, new: self._release_finished(Pod(new)),
                                            on_delete=lambda obj: self._release_deleted(Pod(obj)))
        self.gpu_status = GpuStatusReconciler(self).controller
        self.quota_status = QuotaStatusReconciler(self).controller
        rt.add_leader_task(self.run_leader)
        rt.routes.extend(allocation_handlers(self))
        if self.settings.leader_elect:
            rt.readiness.set(CONDITION, True, "standby: not the leader")
        else:
            rt.readiness.set(CONDITION, False, "leader: waiting for the informers to sync")
        return self

    @property
    def allocator(self) -> GpuAllocator | None:
        """The recovered allocator while this replica leads, else None."""
        return self._allocator

    @property
    def client(self) -> KubeClient:
        return self.runtime.client

    def dirty_count(self) -> int:
        return len(self._allocator.dirty_gpus()) if self._allocator is not None else 0

    def live_count(self) -> int:
        return len(self._allocator.allocations()) if self._allocator is not None else 0

    def count_allocation(self, ok: bool, pool: str = "") -> None:
        """For the scheduler: one placement recorded (ok) or refused, in `pool` (tf_system_metrics)."""
        self.metrics.allocations.labels("scheduled" if ok else "failed").inc()
        self.allocation_tally[(pool, ok)] = self.allocation_tally.get((pool, ok), 0) + 1

    def count_topology(self, req: AllocRequest, gpus: Sequence[str] = (), why: Why | None = None) -> None:
        """For the scheduler: how a multi-GPU pod fared with topology in play (placed on `gpus`, or
        not placed, `why`, where a node refused it for its GPU topology); nothing for other pods."""
        allocator = self._allocator
        if allocator is None or req.count < 2:
            return
        refused = why is not None and any(reason["stage"] == TOPOLOGY_STAGE for status in why.nodes.values()
                                          for reason in status["reasons"])
        if why is not None and not refused:
            return
        found = allocator.topology_outcome(req, gpus, refused=refused)
        if found:
            self.metrics.topology.labels(found).inc()
            key = (req.pool, found)
            self.topology_tally[key] = self.topology_tally.get(key, 0) + 1

    async def wait_ready(self, timeout: float | None = None) -> GpuAllocator | None:
        """The allocator once recovered; None when this replica is not the leader.

        Raises TimeoutError when this replica leads but recovery does not finish within `timeout`
        (default `ready_timeout`)."""
        allocator = self._allocator
        if allocator is not None:  # every reconcile and admission asks: no timeout scope when ready
            return allocator
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
            # Recovery makes a few objects per pod (its request, the ledger's entries), none in a
            # cycle, that live for the term: the collector is kept off while they are made (at
            # 100,000 pods it ran a dozen full collections over them, 2 s), and they leave its walks
            # before it is back on (documents.freeze_long_lived; else its first pass walks them all).
            with collector_paused():
                allocator = await self._recover()
                freeze_long_lived(collect=False)
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
                return await self._rebuild()
            except Exception as exc:  # a bug: say so on /readyz and retry rather than end leadership
                log.exception("allocator recovery failed; retrying in %.0f s", RECOVERY_RETRY_S)
                self.runtime.readiness.set(CONDITION, False, f"leader: recovery failed: {exc!r}")
            await anyio.sleep(RECOVERY_RETRY_S)

    def _end_term(self) -> None:
        self._allocator = None
        self._quota_names.clear()
        self._waiting.clear()
        gate, self._ready = self._ready, anyio.Event()
        gate.set()  # wake waiters: they see no allocator and re-check leadership
        if self.settings.leader_elect:
            self.runtime.readiness.set(CONDITION, True, "standby: not the leader")
        else:
            self.runtime.readiness.set(CONDITION, False, "stopped")

    async def _rebuild(self) -> GpuAllocator:
        """A fresh allocator from the informer caches as they were when it started, built paced
        (kube/pacing.py): the allocator is not served before it is done, and everything the
        informers deliver meanwhile reaches the reconcilers, which wait for it (`wait_ready`) and
        then compare the cache as it is by then with the ledger."""
        rt = self.runtime
        args = self.scheduler_args
        allocator = GpuAllocator(max_workers_per_node=self.settings.max_workers_per_node
                                 or args.max_workers_per_node or DEFAULT_MAX_WORKERS_PER_NODE,
                                 weights=args.weights, assume_ttl=self.assume_ttl, topology=args.topology,
                                 isolation_policy=self.settings.isolation_mode_policy)
        self._quota_names.clear()
        for pool in rt.informer(r.GPUPOOLS).list():
            self._apply_pool(allocator, GpuPool(pool))
        self.apply_providers(allocator)
        gpus = rt.informer(r.GPUS).list()
        pods = rt.informer(r.PODS).list()
        async for gpu in paced(gpus):
            self.apply_gpu(allocator, Gpu(gpu))
        for quota in rt.informer(r.GPURESOURCEQUOTAS).list():
            self.apply_quota(allocator, Body(quota))
        self._waiting.clear()
        entries, pods_by_uid, skipped = await self._recoverable(allocator, pods)
        names = {req.pod_uid: f"{req.namespace}/{req.pod_name}" for req, _ in entries}
        reported = reported_partitions(Gpu(obj) for obj in gpus)
        async for batch in paced(batches(entries, RESTORE_BATCH)):
            for uid, reason in allocator.restore(batch, reported):
                skipped.append((names.get(uid, uid), reason))
                self.runtime.events.warning(pods_by_uid[uid], "AllocationNotRecovered", reason)
        for ref, reason in skipped:
            log.warning("recovery: cannot restore the allocation of pod %s: %s", ref, reason)
        self._report_mode_conflicts(allocator)
        self.recovered = sorted(uid for uid in names if allocator.has_allocation(uid))
        self.skipped = skipped
        self.metrics.allocations.labels("restored").inc(len(self.recovered))
        self.metrics.allocations.labels("failed").inc(len(skipped))
        allocator.take_dirty()  # the reconcilers compare every GPU with the ledger when the term starts
        allocator.take_dirty_quotas()
        return allocator

    def _report_mode_conflicts(self, allocator: GpuAllocator, among: Sequence[str] | None = None) -> None:
        """A Warning event on each GPU (of `among`, else all) whose recovered or adopted pods disagree
        on the isolation mode (dynamic policy)."""
        for name, modes in allocator.mode_conflicts().items():
            if among is not None and name not in among:
                continue
            gpu = self.runtime.informer(r.GPUS).get(name)
            message = (f"the pods on this GPU ask isolation modes {', '.join(modes)} under the dynamic isolation "
                       "policy; it takes no new pod until they agree (dynamicIsolationConflict)")
            log.warning("recovery: GPU %s: %s", name, message)
            if gpu is not None:
                self.runtime.events.warning(Gpu(gpu), "DynamicIsolationConflict", message)

    async def _recoverable(self, allocator: GpuAllocator, pods: Iterable[JsonMapping],
                           ) -> tuple[list[tuple[AllocRequest, tuple[str, ...]]], dict[str, Pod],
                                      list[tuple[str, str]]]:
        """The live workers' allocations to restore, their pods by UID, and the ones skipped (why)."""
        entries: list[tuple[AllocRequest, tuple[str, ...]]] = []
        skipped: list[tuple[str, str]] = []
        pods_by_uid: dict[str, Pod] = {}
        async for obj in paced(pods):
            pod = Pod(obj)
            if not pod.holds_gpus:
                continue
            try:
                req, gpus = worker_request(pod, allocator)
            except RequestError as exc:
                skipped.append((pod_ref(pod), str(exc)))
                self.runtime.events.warning(pod, "AllocationNotRecovered", f"cannot read the GPUs it holds: {exc}")
                continue
            pods_by_uid[req.pod_uid] = pod
            if not all(knows_gpu(allocator, g) for g in gpus):
                self._waiting[req.pod_uid] = pod
                skipped.append((pod_ref(pod), f"unknown GPU(s) in {list(gpus)}; adopted when they appear"))
                continue
            entries.append((req, gpus))
        return entries, pods_by_uid, skipped

    # --- feeding --------------------------------------------------------------------------------

    def apply_gpu(self, allocator: GpuAllocator, gpu: Gpu) -> None:
        """Feed one cached GPU to the allocator. An unreadable object is skipped with a log line;
        an AllocatorError propagates (the GPU reconciler reports it and retries)."""
        if not gpu.capacity:
            # The hypervisor creates a GPU, then reports its status in a second write: nothing to use yet.
            log.debug("GPU %s has no reported capacity yet", gpu.name)
            return
        try:
            allocator.upsert_gpu(gpu_from_object(gpu))
        except GpuObjectError as exc:
            log.warning("ignoring GPU %s: %s", gpu.name, exc)
            self.runtime.events.warning(gpu, "InvalidGPU", f"ignored by the allocator: {exc}")

    def adopt_waiting_for(self, allocator: GpuAllocator, name: str) -> None:
        """Workers that named GPU `name` before it existed are adopted now that it does."""
        for pod in list(self._waiting.values()):
            try:
                names = gpu_names(pod)
            except AnnotationError:
                continue
            if name in names:
                self._adopt(allocator, pod)

    def quota_name(self, namespace: str) -> str | None:
        """The GPUResourceQuota of `namespace` fed to the allocator (one per namespace)."""
        return self._quota_names.get(namespace)

    def apply_quota(self, allocator: GpuAllocator, quota: Body) -> None:
        try:
            namespace, spec = quota_from_object(quota)
        except QuotaSpecError as exc:
            log.warning("ignoring GPUResourceQuota %s/%s: %s", quota.namespace, quota.name, exc)
            self.runtime.events.warning(quota, "InvalidQuota", str(exc))
            return
        allocator.set_quota(namespace, spec)
        self._quota_names[namespace] = quota.name

    def forget_quota(self, namespace: str, name: str) -> None:
        """The quota `name` is gone: the allocator stops enforcing it (unless another one replaced it)."""
        if self._allocator is not None and self._quota_names.get(namespace) == name:
            self._allocator.remove_quota(namespace)
            del self._quota_names[namespace]

    def _on_quota(self, quota: Body) -> None:
        if self._allocator is not None:
            self.apply_quota(self._allocator, quota)

    def _on_quota_update(self, old: Body | None, new: Body) -> None:
        if old is not None and old.spec == new.spec:
            return  # our own status write coming back
        self._on_quota(new)

    def _on_quota_delete(self, quota: Body) -> None:
        self.forget_quota(quota.namespace, quota.name)

    def apply_providers(self, allocator: GpuAllocator) -> None:
        """Feed the partition templates of every ProviderConfig (a config that cannot be read is left
        out, with a log line and a Warning event)."""
        providers = [Body(obj) for obj in self.runtime.informer(r.PROVIDERCONFIGS).list()]
        catalog, problems = partition_catalog(providers)
        for problem in problems:
            log.warning("partition templates ignored: %s", problem)
            name = problem.removeprefix("ProviderConfig ").split(":", 1)[0]
            for provider in providers:
                if provider.name == name:
                    self.runtime.events.warning(provider, "InvalidPartitionTemplates", problem)
        allocator.set_partition_catalog(catalog)

    def _on_providers(self) -> None:
        if self._allocator is not None:
            self.apply_providers(self._allocator)

    def _pool_config(self, pool: GpuPool) -> PoolConfig:
        mode = PoolConfig().placement_mode
        template_name = text(pool.spec, "schedulingConfigTemplate")
        if template_name:
            template = self.runtime.informer(r.SCHEDULINGCONFIGTEMPLATES).get(template_name)
            if template is None:
                log.info("pool %s: SchedulingConfigTemplate %s not found; using %s", pool.name, template_name, mode)
            else:
                mode = section(template, "spec", "placement").get("mode") or mode
        over = section(pool.capacity_config, "oversubscription")
        defaults = PoolConfig()
        return PoolConfig(
            placement_mode=str(mode),
            tflops_oversell_ratio=int(over.get("tflopsOversellRatio", defaults.tflops_oversell_ratio)),
            vram_expand_to_host_mem=int(over.get("vramExpandToHostMem", defaults.vram_expand_to_host_mem)),
            vram_expand_to_host_disk=int(over.get("vramExpandToHostDisk", defaults.vram_expand_to_host_disk)),
        )

    def _apply_pool(self, allocator: GpuAllocator, pool: GpuPool) -> None:
        try:
            allocator.set_pool_config(pool.name, self._pool_config(pool))
        except (PlacementModeError, TypeError, ValueError) as exc:
            log.error("pool %s: %s; keeping its previous placement settings", pool.name, exc)
            self.runtime.events.warning(pool, "InvalidSchedulingConfig", str(exc))

    def _on_pool(self, pool: GpuPool) -> None:
        if self._allocator is not None:
            self._apply_pool(self._allocator, pool)

    def _on_pool_update(self, old: GpuPool | None, new: GpuPool) -> None:
        if old is not None and old.spec == new.spec:
            return
        self._on_pool(new)

    def _on_pool_delete(self, pool: GpuPool) -> None:
        if self._allocator is not None:
            self._allocator.set_pool_config(pool.name, PoolConfig())

    def _on_template(self, template: Body) -> None:
        allocator = self._allocator
        if allocator is None:
            return
        for obj in self.runtime.informer(r.GPUPOOLS).list():
            pool = GpuPool(obj)
            if text(pool.spec, "schedulingConfigTemplate") == template.name:
                self._apply_pool(allocator, pool)

    # --- pods: adoption -------------------------------------------------------------------------

    def _on_pod(self, pod: Pod) -> None:
        allocator = self._allocator
        if allocator is not None and pod.uid and pod.holds_gpus and not allocator.has_allocation(pod.uid) \
                and not allocator.was_released(pod.uid):  # e.g. a preempted pod still terminating
            self._adopt(allocator, pod)

    def _adopt(self, allocator: GpuAllocator, pod: Pod) -> None:
        """A bound worker the allocator does not know: record what its annotations say it holds."""
        uid = pod.uid
        try:
            req, names = worker_request(pod, allocator)
        except RequestError as exc:
            self._waiting.pop(uid, None)
            log.warning("pod %s holds GPUs the allocator cannot read: %s", pod_ref(pod), exc)
            self.runtime.events.warning(pod, "AllocationNotAdopted", f"cannot read the GPUs it holds: {exc}")
            return
        if not all(knows_gpu(allocator, g) for g in names):
            if uid not in self._waiting:
                log.info("pod %s holds GPU(s) %s not known yet; adopting it when they appear",
                         pod_ref(pod), ",".join(names))
            self._waiting[uid] = pod
            return
        self._waiting.pop(uid, None)
        gpus = self.runtime.informer(r.GPUS)
        skipped = allocator.restore([(req, names)], reported_partitions(
            Gpu(obj) for obj in (gpus.get(name) for name in names) if obj is not None))
        if skipped:
            log.warning("pod %s: cannot adopt its allocation: %s", pod_ref(pod), skipped[0][1])
            self.runtime.events.warning(pod, "AllocationNotAdopted", skipped[0][1])
            self.metrics.allocations.labels("failed").inc()
        else:
            log.info("adopted the allocation of pod %s on %s", pod_ref(pod), ",".join(names))
            self.metrics.allocations.labels("adopted").inc()
            self._report_mode_conflicts(allocator, names)

    # --- the one release ------------------------------------------------------------------------

    async def release(self, uid: str, reason: str) -> bool:
        """Release everything pod `uid` holds: its GPUs in the ledger, then every release hook (its
        index and host port, its billing). True when the ledger held GPUs for it; False when it held
        none or this replica does not lead. Idempotent: the ledger and the hooks' allocators answer
        a second call with nothing to do. The UID is remembered, so a late bind cannot resurrect it.
        A hook that raises propagates (the caller retries; nothing is half-released for good)."""
        allocator = self._allocator
        if allocator is None or not uid:
            return False
        self._waiting.pop(uid, None)
        for hook in self.release_hooks:
            await hook(uid)
        if allocator is not self._allocator:
            return False  # leadership ended while a hook ran: the next term rebuilds from the pods
        released = allocator.release(uid)
        if released:
            self.metrics.releases.labels(reason).inc()
            log.info("released the allocation of pod %s (%s)", uid, reason)
            self.flush()
        return released

    async def _release_finished(self, pod: Pod) -> None:
        if pod.finished:
            await self.release(pod.uid, "finished")

    async def _release_deleted(self, pod: Pod) -> None:
        await self.release(pod.uid, "deleted")

    def held_by(self, namespace: str, name: str) -> list[str]:
        """The UIDs the ledger holds GPUs for under the pod name namespace/name (assumed ones too)."""
        allocator = self._allocator
        if allocator is None:
            return []
        return [uid for uid, info in allocator.allocations().items()
                if info.request.namespace == namespace and info.request.pod_name == name]

    # --- the reconcilers ------------------------------------------------------------------------

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
            if cached is not None and pod_alive(Pod(cached), uid):
                continue
            try:
                found = await self.client.get(r.PODS, req.pod_name, namespace=req.namespace)
            except NotFound:
                found = None
            except KubeError as exc:
                log.warning("orphan sweep: cannot read pod %s/%s: %s", req.namespace, req.pod_name, exc)
                continue
            if allocator is not self._allocator:
                return gone
            if (found is None or not pod_alive(Pod(found), uid)) and await self.release(uid, "orphan"):
                log.info("orphan sweep: released pod %s/%s (%s)", req.namespace, req.pod_name, uid)
                gone.append(uid)
        for uid in allocator.expire_assumed(keep=set(self.keep_assumed())):
            self.metrics.releases.labels("expired").inc()
            log.info("orphan sweep: assumed allocation of pod %s expired", uid)
            gone.append(uid)
        return gone


def pod_alive(pod: Pod, uid: str) -> bool:
    """`pod` is the pod `uid` and has not finished."""
    return pod.uid == uid and not pod.finished
