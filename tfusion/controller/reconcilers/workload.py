"""TensorFusionWorkload reconciler: a workload's worker pods, and a status that counts them.

- **Dynamic** workloads (no `spec.replicas`): the workers are the pods the webhook made workers of
  it (local GPU mode) or the dedicated workers of its connections (remote vGPU mode, created by the
  connection reconciler); this reconciler only counts them. Their finalizer has nothing to wait
  for, so it goes at once.
- **Fixed** workloads (`spec.replicas` set, remote vGPU mode): exactly that many worker pods
  (GenerateName `<workload>-tf-worker-`, labels `component=worker`, `workload`, `gpupool`,
  `pod-template-hash`, the finalizer and the workload as controller; see workers.py). The template
  hash of the pool's worker config and the spec is stored in `status.podTemplateHash` first;
  workers of another hash are deleted, oldest first, and replaced; finished workers are deleted and
  replaced; extra workers are deleted (not yet scheduled first, then pending, then not ready, then
  the newest), missing ones created. Pods created or deleted are remembered until the cache shows
  them, so a pass on a stale cache never creates twice. Deleting the workload deletes its workers
  and keeps the finalizer until none is left.
- Triggers: the workload, its worker pods, and spec changes of pools (a pool's worker template is
  part of the hash).
- Status: workerCount (workers not being deleted), readyWorkers (Running and Ready), phase Failed
  when a worker failed, Running when it has all its workers (dynamic: at least one) and all are
  ready, else Pending (reason NoWorkers, ScaledToZero or WaitingForWorkers); condition Ready follows.
  A dynamic workload of `LARGE_WORKLOAD` workers or more is counted at most once a second (its
  status lags its pods by up to that), so a large Deployment being scheduled costs one status write
  per second, not one per pod event. A count reads no pod: the pod informer keeps, besides the
  workers of each workload, an index of those that are ready, failed or being deleted (`TALLY_INDEX`,
  kept as the pods change), so a count is three index lookups whatever the workload's size (a
  workload with gang status still reads its workers).
  Of `status.gang` (the scheduler writes it, scheduling/gang_runtime.py) this controller owns
  readyMembers and the phases Running (the required members are ready) and Failed (one failed).
- A workload the pod webhook created for a bare remote client is marked `awaiting-pod-since`
  (webhook/workloads.py; a bare local pod's is created by the pod reconciler, owned by its pod):
  once a pod of it exists (a worker labelled with it, or a remote client that selected it) and, for a bare
  pod, has become its owner (its pending-owned-workload annotation gone; until then the workload is
  never deleted), the mark goes; when none has appeared `admission_grace` seconds after the mark,
  the workload is deleted (the pod it was made for never came, or went before adopting it). Every
  workload is reconciled when the leader starts, so a mark left by a controller killed meanwhile is
  acted on then.
"""

from __future__ import annotations

import datetime as dt
import logging
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tfusion.api import annotations as tfa
from tfusion.api.accessors import Body, GpuPool, Pod, Workload
from tfusion.api.jsontypes import JsonObject
from tfusion.api.timestamps import rfc3339
from tfusion.controller.reconcilers.common import (
    FAILED,
    FINALIZER,
    PENDING,
    RUNNING,
    condition,
    controlled_by,
    merge_conditions,
    write_status,
)
from tfusion.controller.reconcilers.workers import TemplateError, template_hash, worker_pod
from tfusion.controller.runtime import component_selector
from tfusion.controller.scheduling.gang import GANG_PHASES, MEMBER_FAILED, Phase, controller_phase, gang_spec
from tfusion.controller.webhook.workloads import AWAITING_POD, awaiting_pod_since
from tfusion.kube import resources as r
from tfusion.kube.client import Conflict, NotFound
from tfusion.kube.informer import Informer
from tfusion.kube.ownership import controller_reference
from tfusion.kube.reconciler import Result, ensure_finalizer, generation_changed

if TYPE_CHECKING:
    from tfusion.controller.runtime import ControllerRuntime
    from tfusion.controller.scheduling.assignments import Assignments

log = logging.getLogger(__name__)

WORKLOAD_INDEX = "workload"
WORKER_INFIX = "-tf-worker-"
#: how soon a pass that waits for the cache to show its own creates and deletes comes back
EXPECTATION_RETRY_S = 0.5
#: how long an expectation is honoured (a create whose pod never shows up is forgotten then)
EXPECTATION_TTL_S = 30.0
ADMITTED_INDEX = "admitted-workload"
#: "<workload key>\t<state>" -> its workers in that state (READY, FAILED_STATE, DELETING)
TALLY_INDEX = "workload-tally"
READY, FAILED_STATE, DELETING = "ready", "failed", "deleting"
#: how long a workload the webhook created waits for its pod before it is deleted
ADMISSION_GRACE_S = 60.0
#: how soon a workload whose bare pod is still to adopt it is looked at again
ADOPTION_RETRY_S = 3.0
#: a dynamic workload with at least this many workers is counted at most once per RECOUNT_INTERVAL_S
LARGE_WORKLOAD = 100
RECOUNT_INTERVAL_S = 1.0


def workload_key(pod: Pod) -> list[str]:
    """"namespace/name" of the workload a worker pod belongs to (the pod index and the watch map)."""
    name = pod.meta.label(tfa.WORKLOAD)
    if not name or not pod.is_worker:
        return []
    return [f"{pod.namespace}/{name}"]


def admitted_key(pod: Pod) -> list[str]:
    """"namespace/name" of the workload the webhook made this pod part of: a worker's, or the one a
    remote client selected."""
    if pod.is_worker:
        name = pod.meta.label(tfa.WORKLOAD)
    elif pod.is_client:
        name = pod.meta.annotation(tfa.SELECTED_WORKLOAD)
    else:
        return []
    return [f"{pod.namespace}/{name}"] if name else []


def tally_key(pod: Pod) -> list[str]:
    """The tally entries of a worker pod (see TALLY_INDEX): most pods being scheduled have none;
    the others share one string per workload and state (interned), not one each."""
    keys = workload_key(pod)
    if not keys:
        return []
    if pod.meta.deleting:
        state = DELETING
    elif pod.phase == FAILED:
        state = FAILED_STATE
    elif is_ready(pod):
        state = READY
    else:
        return []
    return [sys.intern(f"{keys[0]}\t{state}")]


@dataclass(frozen=True, slots=True)
class Tally:
    """What a workload's status counts of its workers (those not being deleted)."""

    workers: int
    ready: int
    failed: int

    @classmethod
    def of(cls, workers: list[Pod]) -> Tally:
        return cls(len(workers), sum(1 for p in workers if is_ready(p)), sum(1 for p in workers if p.phase == FAILED))


def is_ready(pod: Pod) -> bool:
    ready = pod.condition("Ready")
    return pod.phase == RUNNING and ready is not None and ready.get("status") == "True"


def gang_status(workload: Workload, workers: list[Pod]) -> JsonObject | None:
    """status.gang with the parts the workload controller owns: readyMembers, and the phases
    Running (the required members are ready) and Failed (a member failed). The scheduler writes the
    rest (scheduling/gang_runtime.py); None until it has written some."""
    current = workload.status.get("gang")
    if not isinstance(current, dict):
        return None
    members = [p for p in workers if p.meta.annotations.get(tfa.GANG_GROUP_KEY)]
    try:
        spec = gang_spec(members[0].meta.annotations, workload.spec) if members else None
    except tfa.AnnotationError:
        spec = None
    ready = sum(1 for p in members if is_ready(p))
    failed = sum(1 for p in members if p.phase == FAILED)
    before: Phase = next((p for p in GANG_PHASES if p == current.get("phase")), "Pending")
    reason = current.get("reason")
    phase = controller_phase(before, reason if isinstance(reason, str) else "", ready, failed,
                             spec.required if spec is not None else 0)
    wanted: JsonObject = {**current, "readyMembers": ready, "phase": phase}
    if phase != before:
        wanted["lastTransitionTime"] = rfc3339()
        if phase == RUNNING:
            wanted["reason"], wanted["message"] = "MembersReady", f"{ready} member(s) ready"
        elif phase == FAILED:
            wanted["reason"], wanted["message"] = MEMBER_FAILED, f"{failed} member(s) failed"
        else:
            wanted["reason"], wanted["message"] = "MembersNotReady", f"{ready} member(s) ready"
    return wanted


def is_dynamic(workload: Workload) -> bool:
    return workload.spec.get("replicas") is None


def deletion_order(pods: list[Pod]) -> list[Pod]:
    """kube's ActivePods order (the first goes first): unscheduled, then pending, then not ready,
    then the most recently created."""
    newest_first = sorted(pods, key=_oldest_first, reverse=True)
    phase_rank = {"Pending": 0, "Unknown": 1, RUNNING: 2}
    return sorted(newest_first, key=lambda p: (1 if p.node_name else 0, phase_rank.get(p.phase, 0),
                                               1 if is_ready(p) else 0))


def workloads_of_pool(workloads: Informer, pool: str) -> list[str]:
    """"namespace/name" of the workloads that use `pool`."""
    return [f"{w.namespace}/{w.name}" for w in map(Workload, workloads.list()) if w.pool_name == pool]


def _oldest_first(pod: Pod) -> tuple[str, str]:
    return pod.meta.creation_timestamp, pod.name


class WorkloadReconciler:
    """See the module docstring. Key: "namespace/name"."""

    def __init__(self, runtime: ControllerRuntime, assignments: Assignments) -> None:
        self.runtime = runtime
        self.assignments = assignments
        self.workloads = runtime.informer(r.TENSORFUSIONWORKLOADS)
        self.pods = runtime.informer(r.PODS)
        # informer indexes and watch maps are given the raw object: each is read through the view
        self.pods.add_index(WORKLOAD_INDEX, lambda pod: workload_key(Pod(pod)))
        self.pods.add_index(ADMITTED_INDEX, lambda pod: admitted_key(Pod(pod)))
        self.pods.add_index(TALLY_INDEX, lambda pod: tally_key(Pod(pod)))
        self.admission_grace = ADMISSION_GRACE_S
        self.pools = runtime.informer(r.GPUPOOLS)
        self.providers = runtime.informer(r.PROVIDERCONFIGS)
        self.controller = runtime.manager.controller("tensorfusionworkload").for_(r.TENSORFUSIONWORKLOADS) \
            .watches(r.PODS, lambda pod: [*workload_key(Pod(pod)), *admitted_key(Pod(pod))],
                     label_selector=component_selector(runtime.settings)) \
            .watches(r.GPUPOOLS, lambda pool: workloads_of_pool(self.workloads, Body(pool).name),
                     predicates=[generation_changed]).complete(self)
        #: workload key -> (names created, names deleted, when) not yet seen in the cache
        self._expected: dict[str, tuple[set[str], set[str], float]] = {}
        self.created = self.deleted = 0  # worker pods (tests read them)
        #: workload key -> when its workers were last counted (large dynamic workloads only)
        self._counted: dict[str, float] = {}

    async def reconcile(self, key: str) -> Result | None:
        cached = self.workloads.get(key)
        if cached is None:
            self._expected.pop(key, None)
            self._counted.pop(key, None)
            return None
        workload = Workload(cached)
        wait: float | None = None
        if workload.meta.annotation(AWAITING_POD) is not None and not workload.meta.deleting:
            deleted, wait = await self._awaiting_pod(key, workload)
            if deleted:
                return None
        result = await self._reconcile(key, workload)
        return result if result is not None or wait is None else Result(requeue_after=wait)

    async def _awaiting_pod(self, key: str, workload: Workload) -> tuple[bool, float | None]:
        """A workload the webhook created: (deleted, seconds until the grace ends). The mark goes
        once a pod of it exists; the workload goes when none came within the grace."""
        namespace = workload.namespace
        pods = [Pod(p) for p in self.pods.by_index(ADMITTED_INDEX, key)]
        # a pod that asks to own no workload, or one that owns this one already
        if any(p.meta.annotation(tfa.PENDING_OWNED_WORKLOAD) is None or controlled_by(workload, p.uid)
               for p in pods):
            await self.runtime.client.patch(r.TENSORFUSIONWORKLOADS, workload.name, {"metadata": {
                "annotations": {AWAITING_POD: None}}}, namespace=namespace)
            return False, None
        if pods:  # a bare pod the pod reconciler has yet to make the owner: confirmed once it has
            return False, ADOPTION_RETRY_S
        since = awaiting_pod_since(workload) or dt.datetime.now(dt.UTC)
        left = self.admission_grace - (dt.datetime.now(dt.UTC) - since).total_seconds()
        if left > 0:
            return False, left
        version = {"uid": workload.uid, "resourceVersion": workload.meta.resource_version}
        try:  # only this version: an adoption or any other write meanwhile keeps it for another look
            await self.runtime.client.delete(r.TENSORFUSIONWORKLOADS, workload.name, namespace=namespace,
                                             preconditions=version)
        except NotFound:
            return True, None
        except Conflict:
            return False, EXPECTATION_RETRY_S
        log.info("TensorFusionWorkload %s deleted: the webhook created it for a pod that did not appear within "
                 "%.0f s", key, self.admission_grace)
        return True, None

    async def _reconcile(self, key: str, workload: Workload) -> Result | None:
        dynamic = is_dynamic(workload)
        current = await ensure_finalizer(self.runtime.client, r.TENSORFUSIONWORKLOADS, workload, FINALIZER,
                                         self._cleanup)
        if current is None:
            return None if dynamic else Result(requeue_after=1.0)
        if dynamic:
            wait = self._recount_wait(key)
            if wait > 0:
                return Result(requeue_after=wait)
            gang = isinstance(current.status.get("gang"), dict)
            await self._write_status(current, self._workers(key) if gang else self._tally(key), None, {})
            return None
        return await self._fixed(key, current)

    def _recount_wait(self, key: str) -> float:
        """Seconds until a large dynamic workload's workers may be counted again (0: now). Each
        count reads every worker, and each of its pods' events asks for one: a Deployment of
        thousands of pods being scheduled would otherwise be counted thousands of times, each
        count costing more. A small workload is counted at once, every time."""
        now = self.runtime.manager.clock.now()
        if self.pods.count_by_index(WORKLOAD_INDEX, key) < LARGE_WORKLOAD:
            self._counted.pop(key, None)
            return 0.0
        last = self._counted.get(key)
        if last is not None and now - last < RECOUNT_INTERVAL_S:
            return last + RECOUNT_INTERVAL_S - now
        self._counted[key] = now
        return 0.0

    def _workers(self, key: str, owner: Workload | None = None) -> list[Pod]:
        pods = (Pod(p) for p in self.pods.by_index(WORKLOAD_INDEX, key))
        return [p for p in pods if not p.meta.deleting and (owner is None or controlled_by(p, owner.uid))]

    def _tally(self, key: str) -> Tally:
        """The counts of a dynamic workload's workers from the informer's indexes (no pod read)."""
        count = self.pods.count_by_index
        deleting = count(TALLY_INDEX, f"{key}\t{DELETING}")
        return Tally(count(WORKLOAD_INDEX, key) - deleting, count(TALLY_INDEX, f"{key}\t{READY}"),
                     count(TALLY_INDEX, f"{key}\t{FAILED_STATE}"))

    async def _write_status(self, workload: Workload, workers: list[Pod] | Tally, desired: int | None,
                            extra: JsonObject) -> None:
        """The status from the workers (their list, or their counts when no gang status needs them)."""
        tally = workers if isinstance(workers, Tally) else Tally.of(workers)
        count, ready, failed = tally.workers, tally.ready, tally.failed
        if failed:
            phase, reason, message = FAILED, "WorkerFailed", f"{failed} of {count} worker(s) failed"
        elif desired == 0:
            phase, reason, message = PENDING, "ScaledToZero", "replicas is 0"
        elif not count:
            phase, reason, message = PENDING, "NoWorkers", "no worker pod yet"
        elif ready == count and (desired is None or ready == desired):
            phase, reason, message = RUNNING, "WorkersReady", f"{ready} worker(s) ready"
        else:
            phase, reason, message = PENDING, "WaitingForWorkers", \
                f"{ready} of {desired if desired is not None else count} worker(s) ready"
        old = workload.conditions
        gang = gang_status(workload, workers) if isinstance(workers, list) else None
        if gang is not None:
            extra = {**extra, "gang": gang}
        wanted: JsonObject = {
            **extra, "workerCount": count, "readyWorkers": ready, "phase": phase,
            "conditions": merge_conditions(old, [condition(old, "Ready", phase == RUNNING, reason, message,
                                                           generation=workload.meta.generation)]),
        }
        await write_status(self.runtime.client, r.TENSORFUSIONWORKLOADS, workload, wanted)

    async def _cleanup(self, workload: Workload) -> bool:
        """Dynamic: nothing to wait for. Fixed: delete the workers; done once none is left."""
        if is_dynamic(workload):
            return True
        key = f"{workload.namespace}/{workload.name}"
        owned = [p for p in map(Pod, self.pods.by_index(WORKLOAD_INDEX, key)) if controlled_by(p, workload.uid)]
        for pod in owned:
            if not pod.meta.deleting:
                await self._delete(pod)
        return not owned

    # --- fixed replicas -----------------------------------------------------------------------

    def _waiting_for_cache(self, key: str, workers: list[Pod]) -> bool:
        """Whether creates or deletes of an earlier pass are not in the cache yet (then wait)."""
        expected = self._expected.get(key)
        if expected is None:
            return False
        created, deleted, since = expected
        present = {p.name for p in workers}
        created.difference_update(present)
        deleted.intersection_update(present)
        if (not created and not deleted) or self.runtime.manager.clock.now() - since > EXPECTATION_TTL_S:
            self._expected.pop(key, None)
            return False
        return True

    def _expect(self, key: str, *, created: str = "", deleted: str = "") -> None:
        names = self._expected.setdefault(key, (set(), set(), self.runtime.manager.clock.now()))
        if created:
            names[0].add(created)
        if deleted:
            names[1].add(deleted)

    async def _fixed(self, key: str, workload: Workload) -> Result | None:
        desired = max(0, workload.replicas or 0)
        found_pool = self.pools.get(workload.pool_name)
        pool = GpuPool(found_pool) if found_pool is not None else None
        wanted_hash = template_hash(pool, workload)
        if workload.status.get("podTemplateHash") != wanted_hash:
            await write_status(self.runtime.client, r.TENSORFUSIONWORKLOADS, workload,
                               {"podTemplateHash": wanted_hash, "workerCount": workload.status.get("workerCount", 0)})
        workers = self._workers(key, workload)
        if self._waiting_for_cache(key, workers):
            return Result(requeue_after=EXPECTATION_RETRY_S)
        outdated = sorted((p for p in workers if p.meta.label(tfa.POD_TEMPLATE_HASH) != wanted_hash or p.finished),
                          key=_oldest_first)
        for pod in outdated:
            await self._delete(pod)
            self._expect(key, deleted=pod.name)
        active = [p for p in workers if p not in outdated]
        if len(active) > desired:
            for pod in deletion_order(active)[:len(active) - desired]:
                await self._delete(pod)
                self._expect(key, deleted=pod.name)
        for _ in range(desired - len(active)):
            await self._create(key, workload, pool, wanted_hash)
        await self._write_status(workload, workers, desired, {"podTemplateHash": wanted_hash})
        return None

    async def _create(self, key: str, workload: Workload, pool: GpuPool | None, wanted_hash: str) -> None:
        namespace = workload.namespace
        index = None
        assignments = self.assignments
        if assignments.indexes is not None:
            index = assignments.indexes.assign(f"{namespace}/{workload.name}{WORKER_INFIX}{self.created}")
        try:
            pod = worker_pod(workload, pool, self.providers.list(), generate_name=f"{workload.name}{WORKER_INFIX}",
                             template=wanted_hash, owner=controller_reference(workload, r.TENSORFUSIONWORKLOADS),
                             index=index, limiter_image=self.runtime.settings.limiter_image)
        except TemplateError as exc:
            self.runtime.events.warning(workload, "WorkerTemplateInvalid", str(exc))
            return
        created = await self.runtime.client.create(r.PODS, pod, namespace=namespace)
        self.created += 1
        self._expect(key, created=Body(created).name)

    async def _delete(self, pod: Pod) -> None:
        try:
            await self.runtime.client.delete(r.PODS, pod.name, namespace=pod.namespace)
            self.deleted += 1
        except NotFound:
            pass
