"""The CronJob controller of `--role=all`: a Job from the jobTemplate at each scheduled minute.

Why it exists: batch users schedule recurring training or evaluation runs with a CronJob. At each
time the schedule names (tfusion.api.cron) it creates the Job `<cronjob>-<minutes since epoch>`,
owned by the CronJob; concurrencyPolicy decides what happens while an earlier Job still runs
(Allow: run both, Forbid: skip this time, Replace: delete the running ones first); finished Jobs
beyond successfulJobsHistoryLimit / failedJobsHistoryLimit are deleted, oldest first; `suspend`
stops new runs. status.active, lastScheduleTime and lastSuccessfulTime follow. Time is read
through an injected `wall` (epoch seconds) so tests move it by hand instead of waiting minutes.

The schedule is read in spec.timeZone (UTC without one). Only the latest missed time runs: with
startingDeadlineSeconds, times older than the deadline are never started; when the latest one is
past it a MissSchedule warning says so once; over 100 missed times give a TooManyMissedTimes
warning, as kube-controller-manager writes them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, tzinfo
from email.utils import format_datetime

from tfusion.api import cron
from tfusion.api.accessors import Body, section
from tfusion.api.jsontypes import JsonObject, json_object
from tfusion.api.timestamps import rfc3339
from tfusion.embedded.workloads.common import Workbench, controller_uid, created_at, since
from tfusion.kube import resources as r
from tfusion.kube.client import AlreadyExists, KubeError, NotFound
from tfusion.kube.ownership import controller_reference
from tfusion.kube.reconciler import Result

SCHEDULED = "batch.kubernetes.io/cronjob-scheduled-timestamp"
#: how many missed start times are looked back over (kube gives up past 100 as well)
MAX_MISSED = 100


def _finished(job: Body) -> str | None:
    """"Complete" or "Failed" once the Job has finished, else None."""
    for kind in ("Complete", "Failed"):
        condition = job.condition(kind)
        if condition is not None and condition.get("status") == "True":
            return kind
    return None


def due_time(schedule: cron.Schedule, last: float, now: float, zone: tzinfo = UTC) -> float | None:
    """The latest scheduled time after `last` and not after `now`, None when there is none."""
    due, upcoming = None, schedule.next_after(last, zone)
    while upcoming <= now:
        due, upcoming = upcoming, schedule.next_after(upcoming, zone)
    return due


def missed_count(schedule: cron.Schedule, last: float, now: float, zone: tzinfo) -> int:
    """How many scheduled times lie after `last` and not after `now`, counted up to MAX_MISSED + 1."""
    count, upcoming = 0, schedule.next_after(last, zone)
    while upcoming <= now and count <= MAX_MISSED:
        count, upcoming = count + 1, schedule.next_after(upcoming, zone)
    return count


def latest_due(schedule: cron.Schedule, last: float, now: float, zone: tzinfo) -> float | None:
    """due_time without walking every missed time: the search starts from ever earlier points
    (an hour, a day, a month, a year back), so a long outage costs a few steps, not thousands."""
    for back in (3600, 86400, 32 * 86400, 367 * 86400):
        start = max(last, now - back)
        found = due_time(schedule, start, now, zone)
        if found is not None or start == last:
            return found
    return due_time(schedule, last, now, zone)


def rfc1123z(epoch_s: float) -> str:
    """The time as kube's events print it ("Mon, 02 Jan 2006 15:04:05 +0000")."""
    return format_datetime(datetime.fromtimestamp(epoch_s, UTC)).replace("-0000", "+0000")


def _note_last_run(status: JsonObject, jobs: list[Body]) -> None:
    """lastScheduleTime is at least the newest Job's scheduled time: a status read from a cache
    that lags our own write must not start (or skip) that run twice."""
    times = [since(j.meta.annotations.get(SCHEDULED)) for j in jobs]
    newest = max((t for t in times if t is not None), default=None)
    recorded = since(status.get("lastScheduleTime"))
    if newest is not None and (recorded is None or newest > recorded):
        status["lastScheduleTime"] = rfc3339(newest)


def job_name(cronjob: str, scheduled: float) -> str:
    return f"{cronjob}-{int(scheduled // 60)}"


class CronJobController:
    """Registers itself with the bench's Manager (leader-only, as in kube-controller-manager)."""

    def __init__(self, bench: Workbench, *, wall: Callable[[], float] = time.time) -> None:
        self.bench, self.wall = bench, wall
        #: per CronJob uid, the missed time a MissSchedule event was written for (written once)
        self._missed: dict[str, float] = {}
        self.cronjobs = bench.manager.cache.informer(r.CRONJOBS)
        bench.manager.controller("cronjob").for_(r.CRONJOBS).owns(r.JOBS).complete(self.reconcile)

    def jobs_of(self, cronjob: Body) -> list[Body]:
        jobs = (Body(raw) for raw in self.bench.jobs.list())
        owned = [j for j in jobs if j.namespace == cronjob.namespace and cronjob.uid in controller_uid(j)]
        return sorted(owned, key=created_at)

    async def reconcile(self, key: str) -> Result | None:
        raw = self.cronjobs.get(key)
        if raw is None or Body(raw).meta.deleting:
            return None
        cronjob = Body(raw)
        jobs = [j for j in self.jobs_of(cronjob) if not j.meta.deleting]
        active = [j for j in jobs if _finished(j) is None]
        await self._prune(cronjob, jobs)
        status = json_object(cronjob.status)
        done = [since(j.status.get("completionTime")) for j in jobs if _finished(j) == "Complete"]
        if any(t is not None for t in done):
            status["lastSuccessfulTime"] = rfc3339(max(t for t in done if t is not None))
        parsed = self._schedule(cronjob)
        if parsed is None:
            return None
        schedule, zone = parsed
        now = self.wall()
        _note_last_run(status, jobs)
        if not cronjob.spec.get("suspend"):
            active = await self._maybe_run(cronjob, schedule, zone, status, active, now)
        status["active"] = [self._reference(j) for j in active]
        if not status["active"]:
            del status["active"]
        await self.bench.write_status(r.CRONJOBS, cronjob, status)
        return Result(requeue_after=max(0.1, schedule.next_after(now, zone) - now))

    def _schedule(self, cronjob: Body) -> tuple[cron.Schedule, tzinfo] | None:
        """The parsed schedule and its zone (spec.timeZone, else a CRON_TZ= prefix, else UTC); None
        with a warning event when either cannot be used (stored before the rules refused it)."""
        prefix_zone, text = cron.split_zone(str(cronjob.spec.get("schedule", "")))
        named = cronjob.spec.get("timeZone")
        name = prefix_zone if named is None else str(named)
        try:
            zone = cron.zone(name)
        except cron.ZoneError as exc:
            self.bench.event(cronjob, "UnknownTimeZone", f"invalid timeZone {name!r}: {exc}", warning=True)
            return None
        try:
            return cron.parse(text), zone
        except cron.CronError as exc:
            self.bench.event(cronjob, "UnparseableSchedule", str(exc), warning=True)
            return None

    async def _maybe_run(self, cronjob: Body, schedule: cron.Schedule, zone: tzinfo, status: JsonObject,
                         active: list[Body], now: float) -> list[Body]:
        """Start the Job of the latest due time, as concurrencyPolicy allows; the active Jobs after it."""
        due = self._due(cronjob, schedule, zone, since(status.get("lastScheduleTime")) or created_at(cronjob), now)
        if due is None:
            return active
        policy = cronjob.spec.get("concurrencyPolicy") or "Allow"
        if active and policy == "Forbid":
            self.bench.event(cronjob, "JobAlreadyActive",
                             f"Skipped the run due at {rfc3339(due)}: a Job is still active (concurrencyPolicy Forbid)")
            return active  # lastScheduleTime stays, so the run still starts once the slot is free
        if policy == "Replace":
            for job in active:
                await self._delete(cronjob, job)
            active = []
        created = await self._create(cronjob, due)
        status["lastScheduleTime"] = rfc3339(due)
        return active + ([created] if created is not None else [])

    def _due(self, cronjob: Body, schedule: cron.Schedule, zone: tzinfo, last: float, now: float) -> float | None:
        """The time to start now: the latest missed one within startingDeadlineSeconds (all of them
        without a deadline); a MissSchedule warning, once, for a latest one past the deadline."""
        deadline = cronjob.spec.get("startingDeadlineSeconds")
        earliest = last if deadline is None else max(last, now - int(deadline))
        if missed_count(schedule, earliest, now, zone) > MAX_MISSED:
            self.bench.event(cronjob, "TooManyMissedTimes",
                             f"More than {MAX_MISSED} start times were missed: set or lower "
                             "spec.startingDeadlineSeconds, or check the clock", warning=True)
        due = latest_due(schedule, earliest, now, zone)
        if due is None and earliest > last:
            missed = latest_due(schedule, last, now, zone)
            if missed is not None and self._missed.get(cronjob.uid) != missed:
                self._missed[cronjob.uid] = missed
                self.bench.event(cronjob, "MissSchedule",
                                 f"Missed scheduled time to start a job: {rfc1123z(missed)} (more than "
                                 f"startingDeadlineSeconds={deadline} ago)", warning=True)
        return due

    async def _create(self, cronjob: Body, scheduled: float) -> Body | None:
        template = section(cronjob.spec, "jobTemplate")
        meta = json_object(section(template, "metadata"))
        meta.update(name=job_name(cronjob.name, scheduled), namespace=cronjob.namespace or None,
                    ownerReferences=[json_object(controller_reference(cronjob, r.CRONJOBS))])
        meta["annotations"] = {**json_object(section(meta, "annotations")),
                               SCHEDULED: rfc3339(scheduled)}
        body: JsonObject = {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta,
                            "spec": json_object(section(template, "spec"))}
        try:
            job = Body(await self.bench.client.create(r.JOBS, body, namespace=cronjob.namespace or None))
        except AlreadyExists:
            return None  # made by an earlier pass whose write the cache has not shown yet
        except KubeError as exc:
            self.bench.event(cronjob, "FailedCreate", f"Error creating job: {exc}", warning=True)
            return None
        self.bench.event(cronjob, "SuccessfulCreate", f"Created job {job.name}")
        return job

    async def _prune(self, cronjob: Body, jobs: list[Body]) -> None:
        """Delete the oldest finished Jobs beyond the history limits."""
        for kind, field, default in (("Complete", "successfulJobsHistoryLimit", 3),
                                     ("Failed", "failedJobsHistoryLimit", 1)):
            limit = cronjob.spec.get(field)
            keep = default if limit is None else int(limit)
            finished = [j for j in jobs if _finished(j) == kind]
            for job in finished[:max(0, len(finished) - keep)]:
                await self._delete(cronjob, job)

    async def _delete(self, cronjob: Body, job: Body) -> None:
        try:
            await self.bench.client.delete(r.JOBS, job.name, namespace=job.namespace or None,
                                           propagation_policy="Background", preconditions={"uid": job.uid})
        except NotFound:
            return
        self.bench.event(cronjob, "SuccessfulDelete", f"Deleted job {job.name}")

    @staticmethod
    def _reference(job: Body) -> JsonObject:
        return {"apiVersion": "batch/v1", "kind": "Job", "name": job.name, "namespace": job.namespace,
                "uid": job.uid, "resourceVersion": job.meta.resource_version}
