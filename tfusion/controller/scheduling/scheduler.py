"""The built-in scheduler (`--scheduler=builtin`, the default; the leader only), and the state it
shares with the extender (`--scheduler=extender`): per-node pod totals and each pending pod's
explanation.

Why a scheduler of our own: GPU worker pods (`spec.schedulerName: tensor-fusion-scheduler`, which
the pod webhook sets) need GPUs chosen by the allocator; without a kube-scheduler profile that
calls us, nothing would ever bind them. With `--scheduler=extender` a stock kube-scheduler does the
node part and calls the routes in http.py; then this loop does not run, so only one of the two
ever binds.

One scheduling cycle at a time (a pod, then the next), as kube-scheduler's:
1. parse the pod (`request_from_pod`; a pod naming no pool gets the default pool); a pod
   without the worker label `tensor-fusion.ai/component=worker` and without GPU annotations is
   placed by the node checks alone (no GPUs); one with GPU annotations but without the label is
   refused (leader recovery only restores worker pods, so its GPUs would leak); a native-GPU pod
   (progressive migration, progressive.py) is placed by the node checks and its native GPU
   resources, only onto nodes that run no TensorFusion worker;
2. PreFilter (quota, pool);
3. Filter: the GPU framework over every Node, then the node checks (nodes.py) on the nodes the
   GPUs allow: Ready, cordon, taints, nodeSelector/affinity, CPU, memory, pod count;
4. Score (framework, 0..100), the best node (ties: the first name);
5. Reserve on it, and count its CPU/memory/pod on the node at once.
Binding (binder.py: annotations and Binding in one write, then PreBind = commit) runs in the
background on `MAX_CONCURRENT_BINDS` binder tasks fed by a queue (a task per bind cost the
controller several times more CPU than the queue), while the next cycle runs; a failed bind
rolls back and backs off. Bindings go on a lean path with a request budget of their own (QPS
1000, burst 2000, as the original's scheduler profile), so binds and the reconcilers do not
throttle each other.

A pod that fits nowhere is parked in the queue (queue.py) until an event can make it fit, and
says why: its explanation is built here from the framework's and the node checks' statuses,
rendered by explain.py, and reported (kept for `GET /api/why`, a FailedScheduling event, the
PodScheduled condition) by unschedulable.py.

The pod index: the webhook assigns it (scheduling/indexes.py); the allocator holds it per node for
as long as the pod holds GPUs (Filter and Reserve skip a node where another pod holds it), and the
binding writes `tensor-fusion.ai/index` after a last check of that node-level lock (binder.py).
With the embedded API server it also places default-scheduler pods, without GPUs (default_pods.py).
Gang scheduling (gang.py, gang_runtime.py) hooks in before Filter (PreEnqueue) and after Reserve
(Permit: a member waits, reserved and unbound, until its gang is complete; then every member binds;
a bind that fails after that does not stop the others, as in the original). Preemption
(preemption.py) is the PostFilter: a GPU worker that fits nowhere may evict pods of lower priority
and binds once they are gone.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from prometheus_client import Counter, Gauge, Histogram

from tfusion.allocator import AllocRequest, GpuAllocator, GpuPlacement, RequestError, request_from_pod
from tfusion.allocator.framework import Code, Explanation, Framework, Status
from tfusion.api import annotations as tfa
from tfusion.api.accessors import Body, Gpu, Node, Pod
from tfusion.controller.defaults import default_pool_name
from tfusion.controller.scheduling import default_pods, hints, progressive
from tfusion.controller.scheduling import nodes as nc
from tfusion.controller.scheduling.binder import BindResult, bind_annotations, index_conflict, post_binding
from tfusion.controller.scheduling.explain import Why, node_failure_status, node_suggestions, why_of, why_text
from tfusion.controller.scheduling.gang_runtime import GangCoordinator, Member
from tfusion.controller.scheduling.podcheck import pod_problem
from tfusion.controller.scheduling.preemption import Preemption
from tfusion.controller.scheduling.queue import QueueClosed, SchedulingQueue
from tfusion.controller.scheduling.unschedulable import Reports, as_pod, pod_key
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient
from tfusion.kube.informer import Informer, node_name_index
from tfusion.kube.pacing import paced

if TYPE_CHECKING:
    from tfusion.controller.allocation import AllocatorService
    from tfusion.controller.provisioning.expander import NodeExpander
    from tfusion.controller.runtime import ControllerRuntime

log = logging.getLogger(__name__)

SCHEDULER_NAME = "tensor-fusion-scheduler"
BUILTIN, EXTENDER = "builtin", "extender"
#: Bindings in flight at once (each on its own kept-alive connection): with 16, binds fell seconds
#: behind a burst of 600 creates a second (p99 4-5 s); with 64 they keep up (p99 about 0.2 s)
MAX_CONCURRENT_BINDS = 64
WORKER = tfa.COMPONENT_WORKER


def is_ours(pod: Pod) -> bool:
    return pod.scheduler_name == SCHEDULER_NAME


GPU_REQUEST_KEYS = ("TFLOPS_REQUEST", "TFLOPS_LIMIT", "VRAM_REQUEST", "VRAM_LIMIT", "COMPUTE_PERCENT_REQUEST",
                    "COMPUTE_PERCENT_LIMIT", "GPU_COUNT", "GPU_INDICES", "GPU_POOL")


def asks_for_gpus(pod: Pod) -> bool:
    """The worker label, or any GPU request annotation (read through tfa: keys follow the domain).
    A remote vGPU client keeps its request annotations but holds no GPU (its workers do), so it is
    placed as a plain pod even when it names tensor-fusion-scheduler, as the original's GPU plugins
    skip every pod that is not a worker."""
    if pod.is_client:
        return False
    return pod.is_worker or any(getattr(tfa, k) in pod.meta.annotations for k in GPU_REQUEST_KEYS)


def viewed(view: type[Body], handler: Callable[..., None]) -> Callable[..., None]:
    """An informer handler that gets the cached objects as `view`s (an absent old object stays None)."""
    return lambda *objs: handler(*(view(o) if o is not None else None for o in objs))


def priority(pod: Pod) -> int:
    value = pod.spec.get("priority")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


# --- metrics -------------------------------------------------------------------------------------


class SchedulerMetrics:
    def __init__(self, registry: Any) -> None:
        self.attempts = Counter("tfusion_scheduler_attempts", "scheduling attempts by result "
                                "(scheduled, unschedulable, error)", ["result"], registry=registry)
        self.binding = Histogram("tfusion_scheduler_binding_duration_seconds",
                                 "from reserve to a bound and committed pod", registry=registry,
                                 buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
        self.pending = Gauge("tfusion_scheduler_pending_pods", "pods in the scheduling queue, by queue",
                             ["queue"], registry=registry)


# --- the decision --------------------------------------------------------------------------------


@dataclass
class Decision:
    """One cycle's outcome: a node (and GPUs) to bind, or why not."""

    node: str = ""
    placement: GpuPlacement | None = None
    req: AllocRequest | None = None
    demand: nc.PodDemand | None = None
    why: Why | None = None
    error: str = ""
    #: native GPU resources (e.g. nvidia.com/gpu) the pod takes on the node, when it asks for any
    native: Mapping[str, int] = field(default_factory=dict)


class Scheduler:
    """See the module docstring. `attach()` wires it into a controller runtime."""

    def __init__(self, runtime: ControllerRuntime, service: AllocatorService) -> None:
        self.runtime = runtime
        self.service = service
        self.settings = runtime.settings
        self.mode = str(getattr(self.settings, "scheduler", BUILTIN))
        self.serve_default = bool(getattr(self.settings, "schedule_default_pods", False))
        self.usage = nc.NodeUsage()
        self.verdicts = nc.StaticVerdicts()
        self._allocatable: dict[str, tuple[str, nc.Allocatable]] = {}
        self.reports = Reports(runtime.manager)
        self.queue: SchedulingQueue | None = None
        self._framework: Framework | None = None
        self._binds: TaskGroup | None = None
        #: the binder tasks' queue while this replica leads (`bind_later`)
        self._bind_requests: MemoryObjectSendStream[tuple[Member, Framework]] | None = None
        #: pods decided but not yet seen bound: uid -> (node, is a TensorFusion worker, native GPUs)
        self._in_flight: dict[str, tuple[str, bool, Mapping[str, int]]] = {}
        self.metrics = SchedulerMetrics(runtime.registry)
        self.preemption: Preemption | None = None
        #: provisioning/expander.NodeExpander when --enable-auto-expander (it sets itself here)
        self.expander: NodeExpander | None = None
        self.pods: Informer
        self.nodes: Informer
        self.gangs: GangCoordinator

    # --- wiring ---------------------------------------------------------------------------------

    def attach(self) -> Scheduler:
        rt = self.runtime
        cache = rt.manager.cache
        # every pod, not only ours: CPU/memory/pod-count fit counts every pod on a node. This is an
        # informer of its own beside the runtime's (our pods only), which the reconcilers read
        self.pods = cache.informer(r.PODS)
        rt.track_readiness(self.pods, "scheduler informer pods")
        self.pods.add_index("node", node_name_index)
        self.pods.add_index(progressive.WORKER_NODE_INDEX, progressive.worker_node_index)
        self.nodes = rt.informer(r.NODES)
        self.pods.add_handler(on_add=viewed(Pod, self._on_pod), on_update=viewed(Pod, self._on_pod_update),
                              on_delete=viewed(Pod, self._on_pod_delete))
        self.nodes.add_handler(on_add=self._move, on_update=viewed(Node, self._on_node_update))
        rt.informer(r.GPUS).add_handler(on_add=self._move, on_update=viewed(Gpu, self._on_gpu_update))
        rt.informer(r.GPURESOURCEQUOTAS).add_handler(on_add=self._move, on_update=viewed(Body, self._on_quota_update),
                                                    on_delete=self._move)
        from tfusion.controller.scheduling.http import scheduler_handlers

        rt.routes.extend(scheduler_handlers(self))
        self.gangs = GangCoordinator(self).attach()
        self.preemption = Preemption(self).attach()  # the built-in PostFilter, the extender's preempt verb
        if self.mode == BUILTIN:
            rt.add_leader_task(self.run_leader)
        return self

    @property
    def client(self) -> KubeClient:
        """The process's one connection (reads, condition writes, Bindings)."""
        return self.runtime.client

    @property
    def leading(self) -> bool:
        return self.runtime.is_leader and self.service.allocator is not None

    def framework(self) -> Framework | None:
        allocator = self.service.allocator
        if allocator is None:
            return None
        if self._framework is None or self._framework.allocator is not allocator:
            self._framework = Framework(allocator)
        return self._framework

    def serves(self, pod: Pod) -> bool:
        """Ours, or with `Settings.schedule_default_pods` (embedded API server) every pod (default_pods.py)."""
        return self.serve_default or is_ours(pod)

    def pod(self, key: str) -> Pod | None:
        """The cached pod "namespace/name" (every pod, not only ours)."""
        raw = self.pods.get(key)
        return Pod(raw) if raw is not None else None

    # --- events ---------------------------------------------------------------------------------

    def _move(self, *_: object) -> None:
        if self.queue is not None:
            self.queue.move_all()

    def _on_pod(self, pod: Pod) -> None:
        key = pod_key(pod)
        pending = nc.is_pending(pod)
        # between terms nothing reads the counts, and a term's start counts every pod afresh
        # (`_queue_and_count`): a replica's initial list of 100,000 pods need not count them too
        counting = self.queue is not None or self.mode != BUILTIN
        # a pod being bound (or a gang member held at Permit) keeps its assumed CPU and memory
        if counting and not (pending and pod.uid in self._in_flight):
            self.usage.observe(pod)
        if not pending:
            self._in_flight.pop(pod.uid, None)
        if self.serves(pod) and pending:
            if self.queue is not None:
                self.queue.add(key, priority=priority(pod))
            return
        self._forget_pod(key)

    def _on_pod_update(self, old: Pod | None, new: Pod) -> None:
        self._on_pod(new)
        if old is not None and old.phase != new.phase and new.finished:
            self._move()  # a finished pod frees its node's CPU, memory and GPUs

    def _on_pod_delete(self, pod: Pod) -> None:
        self.usage.observe_delete(pod)
        self._forget_pod(pod_key(pod))
        self._in_flight.pop(pod.uid, None)
        self.reports.forget_uid(pod.uid)
        if pod.node_name:
            self._move()

    def _forget_pod(self, key: str) -> None:
        self.reports.forget(key)
        if self.queue is not None and self.queue.where(key) not in (None, "in-flight"):
            self.queue.delete(key)

    def _on_node_update(self, old: Node | None, new: Node) -> None:
        if hints.node_changed(old, new):
            self._move()

    def _on_gpu_update(self, old: Gpu | None, new: Gpu) -> None:
        if hints.gpu_grew(old, new):
            self._move()

    def _on_quota_update(self, old: Body | None, new: Body) -> None:
        if old is None or old.spec != new.spec:
            self._move()

    # --- the leader loop ------------------------------------------------------------------------

    async def run_leader(self) -> None:
        """Leader-only: schedule pending pods until leadership ends."""
        while True:
            try:
                allocator = await self.service.wait_ready()
            except TimeoutError:
                continue
            if allocator is not None:
                break
            await anyio.sleep(0.5)
        queue = self.queue = SchedulingQueue(clock=self.runtime.manager.clock)
        try:
            await self._queue_and_count(queue)
            log.info("built-in scheduler: %d pending pod(s) queued", len(queue))
            send, receive = anyio.create_memory_object_stream[tuple[Member, Framework]](math.inf)
            async with anyio.create_task_group() as tg, send, receive:
                self._binds, self._bind_requests = tg, send
                for _ in range(MAX_CONCURRENT_BINDS):
                    tg.start_soon(self._binder, receive)
                tg.start_soon(self._report_queue, queue)
                while True:
                    try:
                        key = await queue.pop()
                    except QueueClosed:
                        return
                    self._cycle(key, tg)
                    await anyio.lowlevel.checkpoint()
        finally:
            self.queue = None
            self._binds = self._bind_requests = None
            queue.close()

    async def _queue_and_count(self, queue: SchedulingQueue) -> None:
        """A term's start: every pending pod of ours queued, every bound pod's requests counted on
        its node. Paced (kube/pacing.py): the pod events delivered meanwhile queue and count
        pods as usual, and each pod is read here as the cache has it when its turn comes."""
        self.usage.clear()
        async for key in paced(self.pods.keys()):
            pod = self.pod(key)
            if pod is None:
                continue
            if self.serves(pod) and nc.is_pending(pod):
                queue.add(key, priority=priority(pod))
            self.usage.observe(pod)

    async def _report_queue(self, queue: SchedulingQueue) -> None:
        while True:
            for name, count in queue.counts().items():
                self.metrics.pending.labels(name).set(count)
            await self.runtime.manager.clock.sleep(1.0)

    def _cycle(self, key: str, tg: TaskGroup) -> None:
        queue = self.queue
        assert queue is not None
        pod = self.pod(key)
        fw = self.framework()
        if pod is None or not self.serves(pod) or not nc.is_pending(pod):
            queue.delete(key)
            return
        if fw is None:
            queue.error(key)
            return
        if self.gangs.holds_back(key, pod, tg):  # PreEnqueue of gang members (gang_runtime.py)
            return
        decision = self.decide(pod, fw)
        if decision.error:
            self.metrics.attempts.labels("error").inc()
            log.warning("cannot schedule pod %s: %s", key, decision.error)
            queue.error(key)
            return
        if decision.why is not None:
            self.metrics.attempts.labels("unschedulable").inc()
            if self.preemption is not None and self.preemption.post_filter(key, pod, decision, fw, tg):
                return  # PostFilter: victims are being evicted; the pod binds when they are gone
            if self.expander is not None:
                self.expander.on_unschedulable(key, pod, decision)  # may add a node for it, or a note
            queue.unschedulable(key)
            decision.why.attempts = queue.attempts(key)
            self.reports.report(pod, decision.why, tg)
            if decision.req is not None:
                self.service.count_allocation(False, decision.req.pool)
                self.service.count_topology(decision.req, why=decision.why)
            return
        self.assume(pod, decision)
        # Permit: a gang member waits (reserved, unbound) until its gang is complete; then all bind
        for member in self.gangs.permit(key, pod, decision, tg):
            self.bind_later(member, fw)

    def bind_later(self, member: Member, fw: Framework) -> None:
        """Hand a reserved, permitted pod to the binder tasks (only while this replica leads)."""
        assert self._bind_requests is not None, "binds are handed over only inside run_leader"
        self._bind_requests.send_nowait((member, fw))

    async def _binder(self, requests: MemoryObjectReceiveStream[tuple[Member, Framework]]) -> None:
        async for member, fw in requests:
            await self._bind(member, fw)

    def assume(self, pod: Pod, decision: Decision) -> None:
        """Count the pod on its node (CPU, memory, and as a worker or native-GPU pod) from now until
        the informer sees it bound; `bind` drops it again when binding fails. The extender's bind
        calls this too, so both paths see a pod whose bind is in flight."""
        demand = decision.demand or nc.pod_demand(pod)
        self.usage.assume(pod.uid, decision.node, demand.cpu_milli, demand.memory)
        self._in_flight[pod.uid] = (decision.node, decision.req is not None or pod.is_worker, decision.native)

    # --- deciding (synchronous: one consistent view) ---------------------------------------------

    def nodes_by_name(self) -> dict[str, Node]:
        return {node.name: node for node in map(Node, self.nodes.list())}

    def allocatable(self, node: Node) -> nc.Allocatable:
        meta = node.meta
        name, rv = meta.name, meta.resource_version
        cached = self._allocatable.get(name)
        if cached is not None and rv and cached[0] == rv:
            return cached[1]
        value = nc.allocatable(node)
        self._allocatable[name] = (rv, value)
        return value

    def node_failure(self, demand: nc.PodDemand, node: Node) -> nc.NodeFailure | None:
        return self.verdicts.check(demand, node) or nc.resource_check(demand, self.allocatable(node),
                                                                       self.usage.used(node.name))

    def request_of(self, pod: Pod) -> AllocRequest:
        """The pod's GPU request; a pod naming no pool gets the default pool (raises RequestError)."""
        pools = self.runtime.informer(r.GPUPOOLS).list()
        return request_from_pod(pod, default_pool=default_pool_name(pools))

    def decide(self, pod: Pod, fw: Framework) -> Decision:
        # the API server checks only the JSON types kube's decoding would; a field the readers below
        # cannot take (a node affinity of 3, a negative request) would otherwise fail the loop
        problem = pod_problem(pod.raw)
        if problem:
            return Decision(why=why_text(
                pod, f"0/{len(self.nodes)} nodes are available: the pod cannot be scheduled: {problem}.",
                Code.UNRESOLVABLE))
        demand = nc.pod_demand(pod)
        if not is_ours(pod):
            return default_pods.place(self, pod, demand)
        if not asks_for_gpus(pod):
            native = nc.extended_requests(pod, self.native_resource_names())
            if native:
                return self._decide_native(pod, demand, native, self.nodes_by_name())
            return self._decide_plain(pod, demand, self.nodes_by_name())
        if not pod.is_worker:
            return Decision(demand=demand, why=why_text(
                pod, f"0/{len(self.nodes)} nodes are available: the pod asks for GPUs but lacks the label "
                     f"{tfa.COMPONENT}={WORKER} (the pod webhook sets it).", Code.UNRESOLVABLE))
        try:
            req = self.request_of(pod)
        except RequestError as exc:
            return Decision(demand=demand, why=why_text(
                pod, f"0/{len(self.nodes)} nodes are available: {exc}.", Code.UNRESOLVABLE))
        if fw.pre_filter(req).ok:
            # Filter and Score at once, best first and lazily: the node checks run on the best
            # nodes only until one passes (scoring and sorting thousands of nodes per pod, or a
            # Status for each, would cost more than the rest of the cycle); the statuses are
            # built when nothing fits
            tries = 0
            for node in fw.ranked(req, self.nodes):
                raw = self.nodes.get(node)
                if raw is None or self.node_failure(demand, Node(raw)) is not None:
                    continue
                placement, status = fw.reserve(req, node)
                if placement is not None:
                    return Decision(node, placement, req, demand)
                if status.code is Code.ERROR:
                    return Decision(req=req, demand=demand, error=status.details())
                tries += 1
                if tries == 3:
                    break
        return Decision(req=req, demand=demand, why=self.explain(pod, req, demand, fw, self.nodes_by_name()))

    def _decide_plain(self, pod: Pod, demand: nc.PodDemand, by_name: Mapping[str, Node]) -> Decision:
        """A pod without GPUs: the node checks alone; the node with the fewest pods (spread)."""
        return self.place_by_nodes(pod, demand, by_name, lambda name, node: self.node_failure(demand, node))

    def place_by_nodes(self, pod: Pod, demand: nc.PodDemand, by_name: Mapping[str, Node],
                       check: Callable[[str, Node], nc.NodeFailure | None]) -> Decision:
        failures: dict[str, nc.NodeFailure] = {}
        fitting: list[str] = []
        for name, node in by_name.items():
            failure = check(name, node)
            if failure is None:
                fitting.append(name)
            else:
                failures[name] = failure
        if fitting:
            best = min(fitting, key=lambda n: (self.usage.used(n).pods, n))
            return Decision(best, demand=demand)
        statuses = {n: node_failure_status(f, n) for n, f in failures.items()}
        message = Explanation(statuses).message(len(by_name))
        return Decision(demand=demand, why=why_of(pod, message, statuses, [], Code.UNSCHEDULABLE))

    # --- native-GPU pods (progressive migration) --------------------------------------------------

    def native_resource_names(self) -> tuple[str, ...]:
        """The native GPU resources TensorFusion takes over: every ProviderConfig's inUseResourceNames."""
        from tfusion.controller.defaults import in_use_resource_names

        return in_use_resource_names(self.runtime.informer(r.PROVIDERCONFIGS).list())

    def nodes_with_workers(self) -> set[str]:
        """Nodes a TensorFusion worker is bound to (or being bound to by this scheduler)."""
        busy = set(self.pods.index_values(progressive.WORKER_NODE_INDEX))
        busy.update(node for node, worker, _ in self._in_flight.values() if worker)
        return busy

    def native_used(self, node: str, names: Sequence[str]) -> dict[str, int]:
        """The native GPU resources the live pods on `node` (and those being bound there) take."""
        used: dict[str, int] = {}
        seen: set[str] = set()
        for pod in map(Pod, self.pods.by_index("node", node)):
            if pod.finished:
                continue
            seen.add(pod.uid)
            _add(used, nc.extended_requests(pod, names).items())
        for uid, (where, _, native) in self._in_flight.items():
            if where == node and uid not in seen:
                _add(used, native.items())
        return used

    def native_check(self, demand: nc.PodDemand, native: Mapping[str, int],
                     busy: set[str]) -> Callable[[str, Node], nc.NodeFailure | None]:
        """A native-GPU pod's Filter, per node (simulate-schedule shows it too): no TensorFusion
        worker there, the node checks, its native GPU resources."""
        names = sorted(native)

        def check(name: str, node: Node) -> nc.NodeFailure | None:
            return (progressive.worker_failure(name, busy) or self.node_failure(demand, node)
                    or nc.extended_check(native, node, self.native_used(name, names)))

        return check

    def _decide_native(self, pod: Pod, demand: nc.PodDemand, native: Mapping[str, int],
                       by_name: Mapping[str, Node]) -> Decision:
        """A native-GPU pod: the node checks and its native GPU resources, on a node without
        TensorFusion workers; no GPU is taken from the allocator."""
        busy = self.nodes_with_workers()
        decision = self.place_by_nodes(pod, demand, by_name, self.native_check(demand, native, busy))
        decision.native = dict(native)
        if decision.why is not None and (note := progressive.busy_note(by_name, sorted(native), busy)):
            decision.why.message += " " + note
        return decision

    def explain(self, pod: Pod, req: AllocRequest, demand: nc.PodDemand, fw: Framework,
                by_name: Mapping[str, Node]) -> Why:
        """The whole story, built only for a pod that fits nowhere: the node checks of every node,
        the GPU reasons (with numbers) of the nodes that pass them, and the suggestions."""
        failures = {n: f for n, node in by_name.items() if (f := self.node_failure(demand, node)) is not None}
        passing = [n for n in by_name if n not in failures]
        expl = fw.explain(req, passing)
        merged: dict[str, Status] = {n: node_failure_status(f, n) for n, f in failures.items()}
        merged.update(expl.nodes)
        expl = replace(expl, nodes=merged)
        gpu_ok = [n for n, s in fw.filter(req, failures).items() if s.ok] if failures else []
        suggestions = list(expl.suggestions) + node_suggestions(failures, gpu_ok)
        codes = [s.code for s in merged.values() if not s.ok] or [expl.pre_filter.code]
        code = Code.UNRESOLVABLE if all(c is Code.UNRESOLVABLE for c in codes) else Code.UNSCHEDULABLE
        if not expl.pre_filter.ok:
            code = expl.pre_filter.code
        return why_of(pod, expl.message(len(by_name)), merged, suggestions, code, pre_filter=expl.pre_filter)

    # --- binding --------------------------------------------------------------------------------

    async def _bind(self, member: Member, fw: Framework) -> None:
        key, pod = member.key, member.pod
        started = self.runtime.manager.clock.now()
        result = await self.bind(pod, member.decision, fw)
        queue = self.queue
        if result.bound:
            self.metrics.attempts.labels("scheduled").inc()
            self.metrics.binding.observe(max(0.0, self.runtime.manager.clock.now() - started))
            if queue is not None:
                queue.done(key)
            return
        self.metrics.attempts.labels("error").inc()
        log.warning("pod %s: %s", key, result.error)
        self.gangs.bind_failed(pod)
        if queue is None:
            return
        if result.conflict:
            queue.delete(key)
        else:
            queue.error(key)

    async def bind(self, pod: Pod, decision: Decision, fw: Framework) -> BindResult:
        """Annotate + bind, then commit; on failure roll the reservation and the node totals back."""
        uid = pod.uid
        gpus = decision.placement.gpu_names if decision.placement is not None else ()
        notes = bind_annotations(pod, decision.req, gpus, fw.allocator)
        conflict = index_conflict(decision.req, decision.node, fw.allocator)
        result = BindResult(False, conflict) if conflict else \
            await post_binding(self.client, pod, decision.node, notes)
        if not result.bound:
            self._unassume(pod, decision, fw)
            return result
        if decision.req is not None:
            status = fw.pre_bind(uid)
            if not status.ok:
                # released meanwhile (deleted): nothing is held; a restart would restore from gpu-ids
                log.info("pod %s bound but not committed: %s", pod_key(pod), status.details())
            self.service.count_allocation(True, decision.req.pool)
            self.service.count_topology(decision.req, gpus)
            self.service.flush()
        self.reports.forget(pod_key(pod))
        where = f" (GPUs {tfa.format_gpu_ids(gpus)})" if gpus else ""
        self.runtime.events.normal(as_pod(pod), "Scheduled",
                                   f"Successfully assigned {pod_key(pod)} to {decision.node}{where}")
        return result

    def _unassume(self, pod: Pod, decision: Decision, fw: Framework) -> None:
        """A failed bind: the reservation goes, and the node totals count the pod as the cache has it."""
        self._in_flight.pop(pod.uid, None)
        if decision.req is not None:
            fw.unreserve(pod.uid)
            self.service.flush()
        current = self.pod(pod_key(pod))
        if current is not None and current.uid == pod.uid:
            self.usage.observe(current)
        else:
            self.usage.forget(pod.uid)


def _add(totals: dict[str, int], amounts: Iterable[tuple[str, int]]) -> None:
    for name, amount in amounts:
        totals[name] = totals.get(name, 0) + amount


def attach_scheduler(runtime: ControllerRuntime, service: AllocatorService) -> Scheduler | None:
    """configure()'s entry: nothing when ENABLE_SCHEDULER=false."""
    if not getattr(runtime.settings, "enable_scheduler", True):
        log.info("ENABLE_SCHEDULER=false: no scheduler runs and the extender routes are not served")
        return None
    return Scheduler(runtime, service).attach()


__all__ = ["BUILTIN", "EXTENDER", "SCHEDULER_NAME", "Decision", "GpuAllocator", "Scheduler", "Why",
           "attach_scheduler", "is_ours", "pod_key"]
