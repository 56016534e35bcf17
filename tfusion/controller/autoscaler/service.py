"""The autoscaler: the leader's loop that turns measured usage, cron rules and external scalers into
each workload's `status.recommendation`, and resizes its running workers to it.

Why a loop and not a reconciler: a recommendation depends on time (histograms decay, cron rules start
and end, intervals elapse) more than on object changes, and the usage samples of every workload come
in one read from the usage source (sources.py). Every `autoScalingInterval` (the dynamic config,
default 30 s; a workload's own `interval` when shorter) one pass:

1. reads the samples since the last pass and adds each to its workload's decaying histograms
   (recommender.WorkloadUsage: one TFLOPS and one VRAM histogram per workload, per GPU);
2. for each workload whose `spec.autoScalingConfig` enables anything, decides its share, in this
   order: the active cron rule (`activeCronScalingRule`), else the external scaler's answer (at its
   own interval, after its own initial delay; a failing scaler changes nothing and sets the condition
   False), else the percentile recommendation (recommender.recommend), else — nothing enabled is
   in force any more, e.g. a cron rule just ended — the workload's own request;
3. writes `status.recommendation`, `activeCronScalingRule`, `appliedRecommendedReplicas` and the
   `ResourcesRecommended` condition (reason and message say what was decided and why), with a
   `Recommended` event when the recommendation changes; new pods take it through the webhook;
4. resizes each running worker whose share differs (resize.WorkerResizer: in place where the isolation
   mode allows, refused with an event when the GPU or the quota cannot hold it; never below the VRAM
   the worker uses now).

State survives a leader change: a source that keeps history (Prometheus, InfluxDB, GreptimeDB) is
read back for the longest history period when the leader starts; with the hypervisor source the
histograms are checkpointed into the workload's `tensor-fusion.ai/autoscaler-checkpoint` annotation
(every CHECKPOINT_EVERY passes and whenever the recommendation changes) and read back from it.
`explain()` is what `GET /api/recommendation` and `tfusion why workload/NAME` show.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio
import orjson

from tfusion.allocator.request import Resources
from tfusion.allocator.units import tflops_str, vram_mib_str, vram_str
from tfusion.api import annotations as tfa
from tfusion.api.accessors import Pod, Workload, section
from tfusion.api.durations import parse_duration
from tfusion.api.jsontypes import JsonObject, json_object
from tfusion.api.timestamps import parse_rfc3339, rfc3339
from tfusion.controller.autoscaler.cron import active_rule
from tfusion.controller.autoscaler.external import ExternalScaler, ExternalScalerError
from tfusion.controller.autoscaler.http import (
    Bounds,
    DecisionView,
    RecommendationAnswer,
    UsageView,
    recommendation_route,
)
from tfusion.controller.autoscaler.policy import (
    ExternalScalerPolicy,
    PolicyError,
    ScalingPolicy,
    scaling_policy,
)
from tfusion.controller.autoscaler.recommender import Decision, Share, WorkloadUsage, recommend, rule_decision, share_of
from tfusion.controller.autoscaler.resize import WorkerResizer, share_text
from tfusion.controller.autoscaler.sources import UsageSample, UsageSource, UsageSourceError, usage_source
from tfusion.controller.reconcilers.common import condition, merge_conditions, write_status
from tfusion.controller.reconcilers.workload import WORKLOAD_INDEX, workload_key
from tfusion.kube import resources as r
from tfusion.kube.client import KubeError
from tfusion.kube.pacing import paced

if TYPE_CHECKING:
    from tfusion.controller.allocation import AllocatorService
    from tfusion.controller.runtime import ControllerRuntime

log = logging.getLogger(__name__)

CONDITION = "ResourcesRecommended"
#: decision reasons of the service (the recommender documents its own)
EXTERNAL_FAILED = "ExternalScalerFailed"
EXTERNAL_ANSWER = "ExternalScaler"
EXTERNAL_NO_CHANGE = "ExternalNoChange"
NO_RULE_IN_FORCE = "NoRuleInForce"
#: decisions that leave the condition False: something failed and nothing changed
FAILURES = frozenset({EXTERNAL_FAILED})
CHECKPOINT_EVERY = 10
#: a history source is read from this long before the last pass: a point the database ingested late
#: is still seen, and `Tracked.newest` keeps one seen before from counting twice
LATE_S = 60.0
#: workloads evaluated between two yields to the event loop (about 10 ms of work)
YIELD_EVERY = 200
MIN_TICK_S = 1.0
WORKLOAD_API = ("tensor-fusion.ai/v1", "TensorFusionWorkload")


@dataclass
class Tracked:
    """What the leader knows of one autoscaled workload between passes."""

    usage: WorkloadUsage
    half_life_s: float
    last_pass: float = 0.0
    last_external: float = 0.0
    passes_since_checkpoint: int = 0
    decision: Decision | None = None
    decided_at: float = 0.0
    rule: str = ""  # the cron rule in force, "external", "percentile" or "request"
    error: str = ""
    #: worker pod name -> the VRAM it used at its latest sample (bytes, the most over its GPUs)
    vram_in_use: dict[str, int] = field(default_factory=dict)
    workers: dict[str, str] = field(default_factory=dict)  # pod name -> the last resize outcome
    #: (worker, GPU) -> its newest sample's time: history windows overlap, a sample counts once
    newest: dict[tuple[str, str], float] = field(default_factory=dict)


def workload_body(raw: Mapping[str, object]) -> Workload:
    api_version, kind = WORKLOAD_API
    return Workload({**json_object(raw), "apiVersion": api_version, "kind": kind})


class Autoscaler:
    """See the module docstring. `run_leader` is registered leader-only on the Manager."""

    def __init__(self, runtime: ControllerRuntime, service: AllocatorService, *, source: UsageSource,
                 resizer: WorkerResizer, external: ExternalScaler, clock: Callable[[], float] = time.time) -> None:
        self.runtime = runtime
        self.service = service
        self.source = source
        self.resizer = resizer
        self.external = external
        self.clock = clock
        self.workloads = runtime.informer(r.TENSORFUSIONWORKLOADS)
        self.pods = runtime.informer(r.PODS)
        self.pods.add_index(WORKLOAD_INDEX, lambda pod: workload_key(Pod(pod)))
        self.tracked: dict[str, Tracked] = {}
        #: key -> (resourceVersion, its policy or why it is refused)
        self._parsed: dict[str, tuple[str, ScalingPolicy | PolicyError]] = {}
        #: the intervals the autoscaled workloads set themselves, as the last pass found them
        self._own_intervals: list[float] = []
        self.passes = 0
        self.source_error = ""
        self._since = 0.0

    # --- the loop --------------------------------------------------------------------------------------

    async def run_leader(self) -> None:
        self.tracked.clear()
        self.source_error = ""
        now = self.clock()
        await self._rebuild(now)
        self._since = now
        while True:
            await self.pass_once()
            await anyio.sleep(self.tick())

    def interval(self) -> float:
        raw = self.runtime.dynamic_config.current.get("autoScalingInterval") or "30s"
        try:
            return max(MIN_TICK_S, parse_duration(str(raw)))
        except ValueError:
            return 30.0

    def tick(self) -> float:
        """The global interval, or the shortest interval an autoscaled workload asked for at the last pass."""
        return max(MIN_TICK_S, min([self.interval(), *self._own_intervals]))

    def policy(self, workload: Workload) -> ScalingPolicy:
        """The workload's policy, parsed once per resourceVersion; PolicyError for a bad one."""
        key = f"{workload.namespace}/{workload.name}"
        version = workload.meta.resource_version
        cached = self._parsed.get(key)
        if cached is None or cached[0] != version:
            try:
                found: ScalingPolicy | PolicyError = scaling_policy(
                    section(workload.spec, "autoScalingConfig") or None, namespace=workload.namespace)
            except PolicyError as exc:
                found = exc
            cached = self._parsed[key] = (version, found)
        if isinstance(cached[1], PolicyError):
            raise cached[1]
        return cached[1]

    async def _autoscaled(self, refused: list[tuple[Workload, PolicyError]] | None = None
                          ) -> dict[str, tuple[Workload, ScalingPolicy]]:
        """Workloads whose policy enables anything, by key; `refused` collects the bad ones. Paced
        (kube/pacing.py): a first pass parses the policy of every workload, thousands of them."""
        found = {}
        async for raw in paced(self.workloads.list()):
            cached = Workload(raw)  # read in place: a copy only for the few a pass goes on with
            if cached.meta.deleting:
                continue
            try:
                policy = self.policy(cached)
            except PolicyError as exc:
                if refused is not None:
                    refused.append((workload_body(raw), exc))
                continue
            if policy.enabled:
                found[f"{cached.namespace}/{cached.name}"] = (workload_body(raw), policy)
        return found

    async def pass_once(self) -> None:
        now = self.clock()
        self.passes += 1
        refused: list[tuple[Workload, PolicyError]] = []
        autoscaled = await self._autoscaled(refused)
        self._own_intervals = [s for _, p in autoscaled.values() if (s := p.auto_set.interval_s)]
        for workload, exc in refused:
            await self._write(workload, None, None, reason="InvalidConfig", message=str(exc), ok=False,
                              decided=False)
        for gone in set(self.tracked) - set(autoscaled):
            del self.tracked[gone]
        self._parsed = {k: v for k, v in self._parsed.items() if self.workloads.get(k) is not None}
        if not autoscaled:  # nothing to read usage for
            self._since = now
            return
        since = self._since - LATE_S if self.source.keeps_history else self._since
        samples = await self._read(since, now)
        self._since = now
        for count, (key, (workload, policy)) in enumerate(autoscaled.items(), 1):
            tracked = self._track(key, workload, policy)
            self._feed(tracked, samples.get(key, ()), now - 2 * LATE_S)
            await self._evaluate(workload, policy, tracked, now)
            if count % YIELD_EVERY == 0:  # thousands of workloads: let Lease renewals and requests in
                await anyio.lowlevel.checkpoint()

    @staticmethod
    def _feed(tracked: Tracked, samples: Iterable[UsageSample], forget_before: float) -> None:
        """Add the samples not seen before; a worker's VRAM in use is the most it used over them, so a
        shrink never goes below a peak the pass saw. What is older than `forget_before` no window
        reaches again, so its newest-sample entries go."""
        in_use: dict[str, int] = {}
        newest = tracked.newest
        for sample in samples:
            key = (sample.worker, sample.gpu)
            if sample.at <= newest.get(key, float("-inf")):
                continue
            newest[key] = sample.at
            tracked.usage.add(sample.at, sample.tflops_milli, sample.vram_bytes)
            in_use[sample.worker] = max(in_use.get(sample.worker, 0), int(sample.vram_bytes))
        tracked.vram_in_use.update(in_use)
        for key in [k for k, at in newest.items() if at < forget_before]:
            del newest[key]

    async def _read(self, since: float, until: float) -> dict[str, list[UsageSample]]:
        try:
            samples = await self.source.samples(since, until)
        except UsageSourceError as exc:
            if str(exc) != self.source_error:
                log.warning("autoscaler: usage source %s: %s", self.source.name, exc)
            self.source_error = str(exc)
            self.runtime.readiness.set("autoscaler", True, f"usage source {self.source.name}: {exc}")
            return {}
        self.source_error = ""
        by_workload: dict[str, list[UsageSample]] = {}
        for sample in samples:
            by_workload.setdefault(f"{sample.namespace}/{sample.workload}", []).append(sample)
        self.runtime.readiness.set("autoscaler", True, f"{len(samples)} usage sample(s) from {self.source.name} "
                                                       f"in the last pass, {len(self.tracked)} workload(s)")
        return by_workload

    def _track(self, key: str, workload: Workload, policy: ScalingPolicy) -> Tracked:
        half_life = policy.auto_set.half_life_s
        tracked = self.tracked.get(key)
        if tracked is None or tracked.half_life_s != half_life:
            tracked = self.tracked[key] = Tracked(usage=WorkloadUsage(half_life), half_life_s=half_life)
            if not self.source.keeps_history:
                self._restore(tracked, workload)
        return tracked

    # --- leader start: history or checkpoints ----------------------------------------------------------

    async def _rebuild(self, now: float) -> None:
        if not self.source.keeps_history:
            return  # each workload's checkpoint is read when it is first tracked
        policies = {key: policy for key, (_, policy) in (await self._autoscaled()).items()}
        if not policies:
            return
        longest = max(p.auto_set.history_period_s for p in policies.values())
        samples = await self._read(now - longest, now)
        for key, policy in policies.items():
            raw = self.workloads.get(key)
            if raw is None:
                continue
            tracked = self._track(key, workload_body(raw), policy)
            start = now - policy.auto_set.history_period_s
            self._feed(tracked, (x for x in samples.get(key, ()) if x.at >= start), now - 2 * LATE_S)
        log.info("autoscaler: rebuilt %d workload(s) from %s history (%d s)", len(policies), self.source.name,
                 int(longest))

    def _restore(self, tracked: Tracked, workload: Workload) -> None:
        text = workload.meta.annotation(tfa.AUTOSCALER_CHECKPOINT)
        if not text:
            return
        try:
            tracked.usage = WorkloadUsage.from_checkpoint(tracked.half_life_s, orjson.loads(text))
        except ValueError as exc:
            log.warning("workload %s/%s: ignoring its autoscaler checkpoint: %s", workload.namespace,
                        workload.name, exc)

    async def _checkpoint(self, workload: Workload, tracked: Tracked, *, now_too: bool) -> None:
        tracked.passes_since_checkpoint += 1
        if self.source.keeps_history or not (now_too or tracked.passes_since_checkpoint >= CHECKPOINT_EVERY):
            return
        tracked.passes_since_checkpoint = 0
        text = orjson.dumps(tracked.usage.to_checkpoint()).decode()
        try:
            await self.runtime.client.patch(r.TENSORFUSIONWORKLOADS, workload.name, {
                "metadata": {"annotations": {tfa.AUTOSCALER_CHECKPOINT: text}}}, namespace=workload.namespace)
        except KubeError as exc:
            log.warning("workload %s/%s: cannot write the autoscaler checkpoint: %s", workload.namespace,
                        workload.name, exc)

    # --- one workload ----------------------------------------------------------------------------------

    async def _evaluate(self, workload: Workload, policy: ScalingPolicy, tracked: Tracked, now: float) -> None:
        own = policy.auto_set.interval_s
        if own and now - tracked.last_pass < own - 0.5 and tracked.decision is not None:
            return
        tracked.last_pass = now
        try:
            original = share_of(section(workload.spec, "resources"), "spec.resources")
            current = share_of(section(workload.status, "recommendation"), "status.recommendation")
        except PolicyError as exc:
            await self._write(workload, None, None, reason="InvalidResources", message=str(exc), ok=False,
                              decided=False)
            return
        if original is None:
            await self._write(workload, None, None, reason="NoRequest", ok=False, decided=False,
                              message="spec.resources has no requests to scale from")
            return
        decision, rule, raw_rule = await self._decide(workload, policy, tracked, original, current or original,
                                                       now)
        changed = tracked.decision is None or decision.share != tracked.decision.share
        tracked.decision, tracked.decided_at, tracked.rule = decision, now, rule
        # a workload that never had a recommendation gets one only when something moves it
        share = decision.share if decision.changed or current is not None else None
        # the status first: a worker recreated to resize it (isolation hard) gets the new share from it
        workers = self._workers(workload)
        on_share = sum(self._runs_with(pod, share) for pod in workers) if share else 0
        wrote = await self._write(workload, share, raw_rule, applied=on_share, reason=decision.reason,
                                  message=decision.message, ok=decision.reason not in FAILURES)
        if share is not None and on_share < len(workers):
            applied = await self._resize_workers(workers, tracked, share, decision.message)
            if applied != on_share:
                await self._write_applied(workload, applied)
        if wrote and changed and decision.changed:
            self.runtime.events.normal(workload, "Recommended", decision.message)
        await self._checkpoint(workload, tracked, now_too=changed)

    async def _decide(self, workload: Workload, policy: ScalingPolicy, tracked: Tracked, original: Share,
                      current: Share, now: float) -> tuple[Decision, str, JsonObject | None]:
        when = dt.datetime.fromtimestamp(now, dt.UTC)
        rule = active_rule(policy.cron_rules, when)
        if rule is not None:
            rules = section(workload.spec, "autoScalingConfig").get("cronScalingRules")
            named = [json_object(x) for x in rules if isinstance(x, Mapping) and x.get("name") == rule.name] \
                if isinstance(rules, list) else []
            raw: JsonObject = named[0] if named else {"name": rule.name}
            return rule_decision(rule, current), rule.name, raw
        external = policy.external
        if external is not None and external.enable:
            decided = await self._ask_external(workload, external, tracked, current, now)
            if decided is not None:
                return decided, "external", None
        if policy.auto_set.enable:
            capacity = self._capacity(workload)
            started = created_at(workload, now)
            decision = recommend(tracked.usage, policy.auto_set, original=original, current=current,
                                 capacity=capacity, started_at=started, now=now)
            return decision, "percentile", None
        return Decision(original, original != current, NO_RULE_IN_FORCE,
                        "no cron rule is in force and nothing else is enabled: the workload's own request", None), \
            "request", None

    async def _ask_external(self, workload: Workload, external: ExternalScalerPolicy, tracked: Tracked,
                            current: Share, now: float) -> Decision | None:
        started = created_at(workload, now)
        interval = external.interval_s or self.interval()
        if now < started + external.initial_delay_s or (tracked.last_external and
                                                         now - tracked.last_external < interval - 0.5):
            previous = tracked.decision
            return previous if previous is not None and tracked.rule == "external" else None
        tracked.last_external = now
        try:
            answer = await self.external.recommend(
                workload, url=external.url, secret_namespace=external.secret_namespace,
                secret_name=external.secret_name, request=current.request, limit=current.limit)
        except ExternalScalerError as exc:
            tracked.error = str(exc)
            self.runtime.events.warning(workload, "ExternalScalerFailed", str(exc))
            return Decision(current, False, EXTERNAL_FAILED, str(exc), None)
        tracked.error = ""
        if answer is None:
            return Decision(current, False, EXTERNAL_NO_CHANGE, f"the external scaler at {external.url} "
                            "asked for no change", None)
        share = Share(*answer)
        return Decision(share, share != current, EXTERNAL_ANSWER,
                        f"the external scaler at {external.url} recommends {share_text(*answer)}", None)

    def _capacity(self, workload: Workload) -> Resources | None:
        allocator = self.service.allocator
        pool = str(workload.spec.get("poolName") or "")
        if allocator is None or not pool:
            return None
        return allocator.largest_gpu(pool)

    # --- explaining ------------------------------------------------------------------------------------

    def explain(self, namespace: str, name: str) -> RecommendationAnswer | None:
        """What `GET /api/recommendation` answers; None for an unknown workload."""
        key = f"{namespace}/{name}"
        raw = self.workloads.get(key)
        if raw is None:
            return None
        workload = workload_body(raw)
        answer = RecommendationAnswer(namespace=namespace, name=name, enabled=False, source=self.source.name,
                                      error=self.source_error)
        try:
            original = share_of(section(workload.spec, "resources"), "spec.resources")
            answer.original = original.to_status() if original is not None else {}
            policy = self.policy(workload)
        except PolicyError as exc:
            answer.error = str(exc)
            return answer
        auto = policy.auto_set
        answer.enabled = policy.enabled
        answer.policy = {**dataclasses.asdict(auto), "half_life_s": auto.half_life_s}
        tracked = self.tracked.get(key)
        if tracked is None:
            return answer
        usage = tracked.usage
        answer.samples = usage.samples
        answer.firstSample = rfc3339(usage.first_at) if usage.first_at else ""
        answer.lastSample = rfc3339(usage.last_at) if usage.last_at else ""
        answer.rule = tracked.rule
        answer.error = tracked.error or self.source_error
        answer.workers = dict(tracked.workers)
        if not usage.tflops.empty or not usage.vram.empty:
            t = usage.tflops.percentiles(auto.target_compute, auto.lower_compute, auto.upper_compute)
            v = usage.vram.percentiles(auto.target_vram, auto.lower_vram, auto.upper_vram)
            answer.observed = UsageView(tflops=Bounds(*(tflops_str(int(x)) for x in t)),
                                        vram=Bounds(*(vram_mib_str(int(x)) for x in v)))
        decision = tracked.decision
        if decision is not None:
            answer.recommendation = decision.share.to_status()
            answer.decision = DecisionView(reason=decision.reason, message=decision.message,
                                           changed=decision.changed, at=rfc3339(tracked.decided_at),
                                           share=decision.share.to_status())
            e = decision.estimate
            if e is not None:
                answer.estimate = UsageView(
                    tflops=Bounds(tflops_str(e.tflops_target), tflops_str(e.tflops_lower), tflops_str(e.tflops_upper)),
                    vram=Bounds(vram_str(e.vram_target), vram_str(e.vram_lower), vram_str(e.vram_upper)))
        return answer

    # --- writing -------------------------------------------------------------------------------------------

    def _workers(self, workload: Workload) -> list[Pod]:
        """The workload's bound workers that hold an allocation."""
        allocator = self.service.allocator
        key = f"{workload.namespace}/{workload.name}"
        pods = (Pod(p) for p in self.pods.by_index(WORKLOAD_INDEX, key))
        return [p for p in pods if allocator is not None and not p.meta.deleting and p.node_name
                and allocator.allocation(p.uid) is not None]

    def _runs_with(self, pod: Pod, share: Share) -> bool:
        allocator = self.service.allocator
        held = allocator.allocation(pod.uid) if allocator is not None else None
        return held is not None and (held.request.request, held.request.limit) == (share.request, share.limit)

    async def _resize_workers(self, workers: list[Pod], tracked: Tracked, share: Share, why: str) -> int:
        """Resize the workers not on `share` yet; returns how many run with it afterwards."""
        applied = 0
        for pod in workers:
            if self._runs_with(pod, share):
                applied += 1
                continue
            outcome = await self.resizer.resize(pod, share.request, share.limit,
                                                vram_in_use=tracked.vram_in_use.get(pod.name, 0), reason=why)
            tracked.workers[pod.name] = outcome.message
            applied += outcome.applied and outcome.reason != "Recreated"
        return applied

    async def _write_applied(self, workload: Workload, applied: int) -> None:
        try:
            await self.runtime.client.patch(r.TENSORFUSIONWORKLOADS, workload.name, {
                "status": {"appliedRecommendedReplicas": applied}}, namespace=workload.namespace,
                subresource="status")
        except KubeError as exc:
            log.warning("workload %s/%s: cannot write appliedRecommendedReplicas: %s", workload.namespace,
                        workload.name, exc)

    async def _write(self, workload: Workload, share: Share | None, rule: JsonObject | None, *, applied: int = 0,
                     reason: str, message: str, ok: bool = True, decided: bool = True) -> bool:
        """The condition, and with `decided` the recommendation, the rule in force and the workers on it."""
        old = workload.conditions
        wanted: JsonObject = {"conditions": merge_conditions(old, [condition(
            old, CONDITION, ok, reason, message, generation=workload.meta.generation)])}
        if decided:
            wanted |= {"recommendation": json_object(share.to_status()) if share is not None else None,
                       "activeCronScalingRule": rule, "appliedRecommendedReplicas": applied}
        try:
            return await write_status(self.runtime.client, r.TENSORFUSIONWORKLOADS, workload, wanted)
        except KubeError as exc:
            log.warning("workload %s/%s: cannot write the recommendation: %s", workload.namespace, workload.name,
                        exc)
            return False


def created_at(workload: Workload, default: float) -> float:
    try:
        return parse_rfc3339(workload.meta.creation_timestamp).timestamp()
    except ValueError:
        return default


def attach_autoscaler(runtime: ControllerRuntime, service: AllocatorService) -> Autoscaler:
    """Build the autoscaler on the runtime: its source, resizer, external scaler, route and leader task."""
    autoscaler = Autoscaler(runtime, service, source=usage_source(runtime.settings, runtime),
                            resizer=WorkerResizer(runtime, service), external=ExternalScaler(runtime.client))
    runtime.routes.append(recommendation_route(autoscaler))
    runtime.add_leader_task(autoscaler.run_leader)
    return autoscaler
