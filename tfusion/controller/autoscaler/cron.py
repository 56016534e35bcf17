"""Cron schedules of `cronScalingRules`, and which rule is in force now.

Why it exists: a cron scaling rule is a window, opened by its `start` schedule and closed by its
`end` schedule, so the autoscaler needs the latest fire time of each at a given moment, not only the
next one. The grammar and its matching are `tfusion.api.cron` (the API server's and the CronJob
controller's): five fields (minute hour day-of-month month day-of-week) with names, ranges, steps,
lists and `*`; the macros @hourly @daily @weekly @monthly @yearly (@annually, @midnight); cron's rule
that a day matches when day-of-month OR day-of-week matches if both are restricted. An optional
`CRON_TZ=<zone> ` or `TZ=<zone> ` prefix reads the schedule in that IANA zone's wall-clock time
(UTC without one): across a daylight-saving change a local time the clocks skip never fires and one
they repeat fires twice. A schedule that can never fire (such as "0 0 31 2 *") is refused.

Times: aware datetimes (a naive one is read as UTC); results are in the schedule's zone.
"""

from __future__ import annotations

import calendar
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta, tzinfo
from typing import TYPE_CHECKING, Final

from tfusion.api import cron

if TYPE_CHECKING:
    from tfusion.controller.autoscaler.policy import CronRule

#: how far previous() and next() look (the API's next_after looks about five years ahead)
SEARCH_SPAN: Final = timedelta(days=5 * 366)
_MINUTE: Final = timedelta(minutes=1)


@dataclass(frozen=True)
class CronSchedule:
    """One parsed expression: its text, the matching rules and the zone it is read in."""

    expression: str
    schedule: cron.Schedule
    zone: tzinfo

    @classmethod
    def parse(cls, expr: str) -> CronSchedule:
        """ValueError (cron.CronError) naming the field and the value when `expr` is not a schedule."""
        zone_name, rest = cron.split_zone(expr)
        zone = cron.zone(zone_name) if zone_name is not None else UTC
        schedule = cron.parse(rest)
        _check_fires(schedule, expr)
        return cls(expr.strip(), schedule, zone)

    def __str__(self) -> str:
        return self.expression

    def next(self, after: datetime) -> datetime:
        """The first fire time strictly after `after`; ValueError when none within five years."""
        found = self.schedule.next_after(_aware(after).timestamp(), self.zone)
        if found == float("inf"):
            raise ValueError(f"cron schedule {self.expression!r} does not fire within five years of {after}")
        return datetime.fromtimestamp(found, self.zone)

    def previous(self, at: datetime) -> datetime | None:
        """The latest fire time at or before `at` (None when none within five years before it)."""
        moment = _aware(at).astimezone(UTC).replace(second=0, microsecond=0)
        stop = moment - SEARCH_SPAN
        schedule, zone = self.schedule, self.zone
        while moment > stop:
            local = moment.astimezone(zone)
            if local.month not in schedule.months:
                moment = _local_day_start(local.replace(day=1), zone) - _MINUTE
                continue
            if not _day_matches(schedule, local):
                moment = _local_day_start(local, zone) - _MINUTE
                continue
            if local.hour in schedule.hours:
                for minute in sorted((m for m in schedule.minutes if m <= local.minute), reverse=True):
                    candidate = moment - timedelta(minutes=local.minute - minute)
                    if schedule.matches(candidate.astimezone(zone)):
                        return candidate.astimezone(zone)
            moment -= timedelta(minutes=local.minute + 1)
        return None


def _aware(at: datetime) -> datetime:
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def _day_matches(schedule: cron.Schedule, local: datetime) -> bool:
    """Whether some minute of `local`'s day (its day of month and day of week) can fire."""
    return schedule.matches(local.replace(hour=min(schedule.hours), minute=min(schedule.minutes)))


def _local_day_start(local: datetime, zone: tzinfo) -> datetime:
    """The first instant (UTC) of `local`'s day in `zone` (past a skipped midnight if need be),
    never later than `local` itself."""
    start = datetime.combine(local.date(), time(0), tzinfo=zone).astimezone(UTC)
    return min(start, local.astimezone(UTC))


def _check_fires(schedule: cron.Schedule, expr: str) -> None:
    """Refuse a day-of-month list no chosen month has (only when day-of-week does not rescue it)."""
    if not schedule.any_weekday and not schedule.any_day:
        return  # day-of-month OR day-of-week: every week has every weekday
    if schedule.any_day:
        return
    longest = {month: calendar.monthrange(2024, month)[1] for month in schedule.months}  # 2024: 29 February
    if not any(day <= longest[month] for month in schedule.months for day in schedule.days):
        raise cron.CronError(f"day of month: {expr.strip()!r} names no day that exists in its months, "
                             "so it never fires")


def active_rule(rules: Sequence[CronRule], now: datetime) -> CronRule | None:
    """The rule in force at `now`: one whose latest start is later than its latest end (a start
    and an end at the same minute leave the rule closed); the first such rule in order wins."""
    for rule in rules:
        started = rule.start.previous(now)
        if started is None:
            continue
        ended = rule.end.previous(now)
        if ended is None or started > ended:
            return rule
    return None
