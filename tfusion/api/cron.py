"""Cron schedules as CronJobs write them: five fields (minute hour day-of-month month day-of-week)
with `*`, ranges `a-b`, lists `a,b`, steps `*/n` and `a-b/n`, month and weekday names, and the
macros @yearly/@annually/@monthly/@weekly/@daily/@midnight/@hourly.

Why it exists here: the API server refuses a bad schedule (422 naming spec.schedule) and the
CronJob controller computes the next run from the same parse, so both agree on what is valid.
Times are UTC unless the CronJob names a timeZone (only UTC/Etc/UTC are known here).
"""

from __future__ import annotations

import calendar
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

MACROS = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *", "@weekly": "0 0 * * 0",
          "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *"}
_MONTHS = {name.lower(): i for i, name in enumerate(calendar.month_abbr) if name}
_DAYS = {"sun": 0, "mon": 1, "tue": 2, "wed": 3, "thu": 4, "fri": 5, "sat": 6}
#: (name, lowest, highest, names) of the five fields
_FIELDS: tuple[tuple[str, int, int, dict[str, int]], ...] = (
    ("minute", 0, 59, {}), ("hour", 0, 23, {}), ("day of month", 1, 31, {}), ("month", 1, 12, _MONTHS),
    ("day of week", 0, 7, _DAYS))


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

    def next_after(self, epoch_s: float) -> float:
        """The first scheduled minute strictly after `epoch_s` (within about five years, else inf)."""
        at = datetime.fromtimestamp(epoch_s, UTC).replace(second=0, microsecond=0) + timedelta(minutes=1)
        for _ in range(5 * 366 * 24):
            if at.month in self.months and self._day_ok(at) and at.hour in self.hours:
                for minute in sorted(self.minutes):
                    if minute >= at.minute:
                        return at.replace(minute=minute).timestamp()
            at = at.replace(minute=0) + timedelta(hours=1)
        return float("inf")

    def _day_ok(self, at: datetime) -> bool:
        return self.matches(at.replace(minute=min(self.minutes), hour=min(self.hours)))


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
