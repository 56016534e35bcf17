"""The Job controller of `--role=all`: run pods until enough succeed or it fails.

Why it exists: batch users try TensorFusion with a Job. It runs up to `parallelism` pods until
`completions` succeeded; failed pods (and container restarts under restartPolicy OnFailure) count
against backoffLimit, then the Job fails (conditions FailureTarget and Failed, reason
BackoffLimitExceeded); activeDeadlineSeconds fails it with DeadlineExceeded; success sets
SuccessCriteriaMet and Complete. As in kube, the first condition (FailureTarget,
SuccessCriteriaMet) comes as soon as the outcome is known and its remaining pods are stopped; the
terminal one (Failed, Complete, with the same reason) once none of them is running.
startTime, completionTime, active, ready, succeeded and failed are in its status. `suspend` stops
its pods. Indexed Jobs (one pod per completion index, with per-index retries and success policies)
are described in `indexed`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from tfusion.api.accessors import Body, Pod, sequence_of_maps, text
from tfusion.api.jsontypes import JsonMapping, JsonObject, json_object
from tfusion.api.timestamps import rfc3339
from tfusion.embedded.workloads.common import (
    Workbench,
    deletion_rank,
    is_active,
    is_ready,
    set_condition,
    since,
    status_int,
)
from tfusion.embedded.workloads.indexed import (
    completed_indexes,
    create_indexed_pods,
    failed_indexes,
    format_indexes,
    index_failures,
    indexed_verdict,
    is_indexed,
    missing_indexes,
    parse_indexes,
)
from tfusion.kube import resources as r
from tfusion.kube.reconciler import Result


def _restarts(pod: Pod) -> int:
    return sum(int(c.get("restartCount") or 0) for c in pod.container_statuses)


#: the condition that announces an outcome -> the terminal condition that follows it
_TERMINAL = {"FailureTarget": "Failed", "SuccessCriteriaMet": "Complete"}


def _conditions(status: JsonObject) -> Sequence[JsonMapping]:
    """The conditions of the status being built (it starts as a copy of the Job's)."""
    return sequence_of_maps(status.get("conditions"))


def _ending(job: Body) -> str | None:
    """FailureTarget or SuccessCriteriaMet when the Job's outcome is known but not yet final."""
    for target in _TERMINAL:
        condition = job.condition(target)
        if condition is not None and condition.get("status") == "True":
            return target
    return None


def _announced(status: JsonObject) -> bool:
    """Whether the status being written announces an outcome (FailureTarget or SuccessCriteriaMet)."""
    return any(c.get("type") in _TERMINAL and c.get("status") == "True" for c in _conditions(status))


def job_failure(job: Body, started: float | None, failures: int, now_s: float) -> tuple[str, str] | None:
    """(reason, message) when the Job has failed: too many failures, or active past its deadline."""
    backoff_limit = int(job.spec.get("backoffLimit", 6))
    if failures > backoff_limit:
        return "BackoffLimitExceeded", "Job has reached the specified backoff limit"
    deadline = job.spec.get("activeDeadlineSeconds")
    if deadline is not None and started is not None and now_s - started >= int(deadline):
        return "DeadlineExceeded", "Job was active longer than specified deadline"
    return None


class JobController:
    """Registers itself with the bench's Manager (leader-only, as in kube-controller-manager)."""

    def __init__(self, bench: Workbench) -> None:
        self.bench = bench
        bench.manager.controller("job").for_(r.JOBS).owns(r.PODS).complete(self.reconcile)

    async def reconcile(self, key: str) -> Result | None:
        bench = self.bench
        raw = bench.jobs.get(key)
        expectation_key = f"{r.JOBS.plural}/{key}"
        if raw is None:
            bench.expectations.forget(expectation_key)
            return None
        job = Body(raw)
        if job.meta.deleting:
            return None
        pods = bench.pods_of(job)
        active = [p for p in pods if is_active(p)]
        status = json_object(job.status)
        finished = job.condition("Complete") or job.condition("Failed")
        spec = job.spec
        now = rfc3339()
        succeeded = max(status_int(job, "succeeded"), sum(1 for p in pods if p.phase == "Succeeded"))
        if is_indexed(job):
            completed = completed_indexes(job, pods)
            succeeded = len(completed)
            status["completedIndexes"] = format_indexes(completed)
            if spec.get("backoffLimitPerIndex") is not None:
                status["failedIndexes"] = format_indexes(failed_indexes(job, pods, completed))
        failed = max(status_int(job, "failed"), sum(1 for p in pods if p.phase == "Failed"))
        on_failure = text(spec, "template", "spec", "restartPolicy") == "OnFailure"
        restarts = sum(_restarts(p) for p in active) if on_failure else 0
        result: Result | None = None
        ending = _ending(job)
        if finished is not None and finished.get("status") == "True":
            if active:
                await bench.delete_pods(job, r.JOBS, active)
        elif ending is not None:
            self._conclude(job, status, pods, ending, now)
        elif spec.get("suspend"):
            status["conditions"] = list(set_condition(_conditions(status), "Suspended", "True",
                                                      "JobSuspended", "Job suspended", now))
            if active:
                await bench.delete_pods(job, r.JOBS, active)
        else:
            result = await self._run(job, expectation_key, status, pods, active, succeeded, failed + restarts)
        status.update(active=len(active), ready=sum(1 for p in active if is_ready(p)), succeeded=succeeded,
                      failed=failed)
        status.setdefault("uncountedTerminatedPods", {})
        await bench.write_status(r.JOBS, job, status)
        if active and (finished is None or finished.get("status") != "True") and _announced(status):
            # stopped only once the outcome is written: a write that fails (a stale read) stops nothing
            await bench.delete_pods(job, r.JOBS, active)
        return result

    async def _run(self, job: Body, expectation_key: str, status: JsonObject, pods: list[Pod],
                   active: list[Pod], succeeded: int, failures: int) -> Result | None:
        """A Job neither finished nor suspended: finish it, or keep its pods running; `status` is updated."""
        bench, spec = self.bench, job.spec
        now_s, now = time.time(), rfc3339()
        status.setdefault("startTime", now)
        if job.condition("Suspended"):
            status["conditions"] = list(set_condition(_conditions(status), "Suspended", "False",
                                                      "JobResumed", "Job resumed", now))
        failure = job_failure(job, since(status.get("startTime")), failures, now_s)
        completions = spec.get("completions")
        done = succeeded >= completions if completions is not None else succeeded > 0 and not active
        success = "CompletionsReached", "Reached expected number of succeeded pods"
        verdict = self._indexed_verdict(job, status) if failure is None else None
        if verdict is not None:
            kind, reason, message = verdict
            failure, done = ((reason, message), False) if kind == "Failed" else (None, True)
            success = (reason, message) if kind == "Complete" else success
        result: Result | None = None
        if failure is not None:
            reason, message = failure
            status["conditions"] = list(set_condition(_conditions(status), "FailureTarget", "True", reason, message,
                                                      now))
            bench.event(job, reason, message, warning=True)
            self._conclude(job, status, pods, "FailureTarget", now)
        elif done:
            status["conditions"] = list(set_condition(_conditions(status), "SuccessCriteriaMet", "True", *success,
                                                      now))
            self._conclude(job, status, pods, "SuccessCriteriaMet", now)
        elif bench.expectations.satisfied(expectation_key, {p.name for p in pods}):
            result = await self._run_pods(job, active, succeeded)
        deadline = spec.get("activeDeadlineSeconds")
        if failure is None and not done and deadline is not None:
            started = since(status.get("startTime")) or now_s
            result = Result(requeue_after=max(0.1, started + int(deadline) - now_s))
        return result

    def _conclude(self, job: Body, status: JsonObject, pods: list[Pod], target: str, now: str) -> None:
        """The outcome `target` is known (reconcile stops the pods still running once that is
        written): with every pod finished (those being deleted too, as kube waits for terminating
        pods) add the terminal condition with the target's reason and message (and completionTime
        on success)."""
        if any(not p.finished for p in pods):
            return  # each pod's end brings the Job back here
        marked = next(c for c in _conditions(status) if c.get("type") == target)
        final = _TERMINAL[target]
        status["conditions"] = list(set_condition(_conditions(status), final, "True", str(marked.get("reason", "")),
                                                  str(marked.get("message", "")), now))
        if final == "Complete":
            status.setdefault("completionTime", now)
            self.bench.event(job, "Completed", "Job completed")

    @staticmethod
    def _indexed_verdict(job: Body, status: JsonObject) -> tuple[str, str, str] | None:
        """How an Indexed Job's indexes end it (failed indexes, a success policy), None otherwise."""
        if not is_indexed(job):
            return None
        return indexed_verdict(job, parse_indexes(status.get("completedIndexes")),
                               parse_indexes(status.get("failedIndexes")))

    async def _run_pods(self, job: Body, active: list[Pod], succeeded: int) -> Result | None:
        if is_indexed(job):
            return await self._run_indexed(job, active)
        spec = job.spec
        parallelism = int(spec.get("parallelism", 1))
        completions = spec.get("completions")
        if completions is None:
            wanted = parallelism if succeeded == 0 else 0
        else:
            wanted = min(parallelism, int(completions) - succeeded)
        wanted = max(0, wanted)
        if len(active) < wanted:
            failure = await self.bench.create_pods(job, r.JOBS, wanted - len(active))
            if failure is not None:
                return Result(requeue=True)
        elif len(active) > wanted:
            await self.bench.delete_pods(job, r.JOBS, sorted(active, key=deletion_rank)[:len(active) - wanted])
        return None

    async def _run_indexed(self, job: Body, active: list[Pod]) -> Result | None:
        """Start pods for the lowest indexes that have none, up to parallelism running."""
        room = max(0, int(job.spec.get("parallelism", 1)) - len(active))
        pods = self.bench.pods_of(job)
        completed = completed_indexes(job, pods)
        missing = missing_indexes(job, completed, active, failed_indexes(job, pods, completed))
        if room and missing and await create_indexed_pods(self.bench, job, missing[:room],
                                                          index_failures(pods)) is not None:
            return Result(requeue=True)
        return None
