"""Cron schedules as CronJobs write them: five fields (minute hour day-of-month month day-of-week)
with `*`, ranges `a-b`, lists `a,b`, steps `*/n` and `a-b/n`, month and weekday names, and the
macros @yearly/@annually/@monthly/@weekly/@daily/@midnight/@hourly.

Why it exists here: the API server refuses a bad schedule (422 naming spec.schedule) and the
CronJob controller computes the next run from the same parse, so both agree on what is valid.
A schedule is read in the wall-clock time of a zone (`zone`: an IANA name through zoneinfo; UTC
when the CronJob names none). A run is every instant whose local time matches: across a
daylight-saving change a time the clocks skip has no run, and a time they repeat matches twice.
`split_zone` reads the `CRON_TZ=`/`TZ=` prefix older CronJobs may carry.
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

MACROS = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *", "@weekly": "0 0 * * 0",
          "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *"}
_MONTHS = {name.lower(): i for i, name in enumerate(calendar.month_abbr) if name}
_DAYS = {"sun": 0, "mon": 1, "tue": 2, "wed": 3, "thu": 4, "fri": 5, "sat": 6}
#: (name, lowest, highest, names) of the five fields
_FIELDS: tuple[tuple[str, int, int, dict[str, int]], ...] = (
    ("minute", 0, 59, {}), ("hour", 0, 23, {}), ("day of month", 1, 31, {}), ("month", 1, 12, _MONTHS),
    ("day of week", 0, 7, _DAYS))
#: what one part of a zone name may hold (as kube checks before looking a zone up)
_ZONE_PART = re.compile(r"^[A-Za-z.\-_0-9+]{1,14}$")
_ZONE_PREFIX = re.compile(r"^(CRON_TZ|TZ)=(\S*)\s+")


class CronError(ValueError):
    """A schedule that does not parse; the message says which field and why."""


@dataclass(frozen=True)
class Schedule:
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    any_day: bool
    any_weekday: bool

    def matches(self, at: datetime) -> bool:
        if at.minute not in self.minutes or at.hour not in self.hours or at.month not in self.months:
            return False
        day_ok, weekday_ok = at.day in self.days, (at.isoweekday() % 7) in self.weekdays
        if self.any_day or self.any_weekday:
            return day_ok and weekday_ok
        return day_ok or weekday_ok  # cron: both restricted means either matches

    def next_after(self, epoch_s: float, zone: tzinfo = UTC) -> float:
        """The first scheduled instant strictly after `epoch_s`, reading the schedule in `zone`'s
        wall-clock time (within about five years, else inf)."""
        at = datetime.fromtimestamp(epoch_s, UTC).replace(second=0, microsecond=0) + timedelta(minutes=1)
        end = at + timedelta(days=5 * 366)
        while at < end:
            local = at.astimezone(zone)
            if not (local.month in self.months and self._day_ok(local)):
                at = _next_local_midnight(local, zone)
                continue
            if local.hour in self.hours:
                for minute in sorted(m for m in self.minutes if m >= local.minute):
                    found = at + timedelta(minutes=minute - local.minute)
                    if self.matches(found.astimezone(zone)):  # the offset did not change on the way
                        return found.timestamp()
            at += timedelta(minutes=60 - local.minute)
        return float("inf")

    def _day_ok(self, at: datetime) -> bool:
        return self.matches(at.replace(minute=min(self.minutes), hour=min(self.hours)))


def _next_local_midnight(local: datetime, zone: tzinfo) -> datetime:
    """The first instant of the next local day (a midnight the clocks skip maps past the gap)."""
    midnight = datetime.combine(local.date() + timedelta(days=1), time(0), tzinfo=zone)
    return midnight.astimezone(UTC)


class ZoneError(CronError):
    """A time zone name that is not an IANA zone known here."""


def zone(name: str | None) -> tzinfo:
    """The zone `name` names (UTC for None); ZoneError says why a name is refused."""
    if name is None:
        return UTC
    if not name:
        raise ZoneError("timeZone must be nil or non-empty string")
    if any(part in (".", "..") or part.startswith("-") or not _ZONE_PART.match(part) for part in name.split("/")):
        raise ZoneError(f"unknown time zone {name}")
    if name.lower() == "local":
        raise ZoneError("timeZone must be an explicit time zone as defined in https://www.iana.org/time-zones")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ZoneError(f"unknown time zone {name}") from None


def split_zone(text: str) -> tuple[str | None, str]:
    """(zone name, the rest) of a schedule with a `CRON_TZ=`/`TZ=` prefix; (None, text) without one."""
    found = _ZONE_PREFIX.match(text.strip())
    if found is None:
        return None, text
    return found.group(2), text.strip()[found.end():]


def names_zone(text: str) -> bool:
    """Whether a schedule mentions TZ (kube refuses that in new schedules: timeZone replaces it)."""
    return "TZ" in text


def parse(text: str) -> Schedule:
    spec = MACROS.get(text.strip().lower(), text) if text.strip().startswith("@") else text
    if spec.strip().startswith("@"):
        raise CronError(f"unknown macro {text.strip()!r} (one of {', '.join(MACROS)})")
    parts = spec.split()
    if len(parts) != 5:
        raise CronError(f"expected exactly 5 fields, found {len(parts)}: {text!r}")
    values = [_field(part, *field) for part, field in zip(parts, _FIELDS, strict=True)]
    weekdays = frozenset(d % 7 for d in values[4])
    return Schedule(values[0], values[1], values[2], values[3], weekdays,
                    any_day=parts[2] in ("*", "?"), any_weekday=parts[4] in ("*", "?"))


def _field(text: str, name: str, low: int, high: int, names: dict[str, int]) -> frozenset[int]:
    found: set[int] = set()
    for item in text.split(","):
        base, _, step_text = item.partition("/")
        step = _number(step_text, name, names) if step_text else 1
        if step < 1:
            raise CronError(f"{name}: step must be at least 1 in {item!r}")
        if base in ("*", "?"):
            first, last = low, high
        else:
            first_text, dash, last_text = base.partition("-")
            first = _number(first_text, name, names)
            last = _number(last_text, name, names) if dash else (high if step_text else first)
        if not low <= first <= last <= high:
            raise CronError(f"{name}: {item!r} is outside {low}-{high} (or its range is reversed)")
        found.update(range(first, last + 1, step))
    return frozenset(found)


def _number(text: str, name: str, names: dict[str, int]) -> int:
    if text.isdigit():
        return int(text)
    if text.lower() in names:
        return names[text.lower()]
    raise CronError(f"{name}: {text!r} is not a number" + (" or a name" if names else ""))
