"""Cron schedules read in a time zone (tfusion.api.cron) and the CronJob controller's choice of the
run to start (tfusion.embedded.workloads.cronjob): daylight-saving changes, zone names kube
refuses, CRON_TZ prefixes, and missed runs with and without a starting deadline."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from tfusion.api import cron
from tfusion.embedded.workloads.cronjob import due_time, latest_due, missed_count, rfc1123z

NEW_YORK = ZoneInfo("America/New_York")


def at(year: int, month: int, day: int, hour: int, minute: int = 0, zone: ZoneInfo = NEW_YORK) -> float:
    return datetime(year, month, day, hour, minute, tzinfo=zone).timestamp()


def runs(schedule: str, start: float, count: int, zone: ZoneInfo = NEW_YORK) -> list[datetime]:
    parsed, found, now = cron.parse(schedule), [], start
    for _ in range(count):
        now = parsed.next_after(now, zone)
        found.append(datetime.fromtimestamp(now, UTC))
    return found


def test_a_daily_run_keeps_its_local_hour_across_the_spring_change() -> None:
    first, second, third = runs("0 9 * * *", at(2026, 3, 7, 0), 3)
    assert [t.hour for t in (first, second, third)] == [14, 13, 13]  # 09:00 EST, then 09:00 EDT
    assert second - first == timedelta(hours=23)


def test_a_time_the_clocks_skip_has_no_run() -> None:
    found = runs("30 2 * * *", at(2026, 3, 7, 12), 2)
    assert [t.astimezone(NEW_YORK).day for t in found] == [9, 10]  # 8 March has no 02:30


def test_a_time_the_clocks_repeat_runs_at_both_instants() -> None:
    first, second, third = runs("30 1 * * *", at(2026, 10, 31, 12), 3)
    assert second - first == timedelta(hours=1)
    assert {first.astimezone(NEW_YORK).hour, second.astimezone(NEW_YORK).hour} == {1}
    assert third - second == timedelta(hours=24)


def test_utc_is_the_default_zone() -> None:
    [found] = runs("0 9 * * *", at(2026, 3, 7, 0, zone=ZoneInfo("UTC")), 1, ZoneInfo("UTC"))
    assert (found.day, found.hour) == (7, 9)
    assert cron.zone(None) is UTC


def test_a_half_hour_zone_is_read_in_its_own_minutes() -> None:
    kolkata = ZoneInfo("Asia/Kolkata")
    [found] = runs("0 9 * * *", at(2026, 1, 1, 0, zone=kolkata), 1, kolkata)
    assert (found.hour, found.minute) == (3, 30)


@pytest.mark.parametrize(("name", "message"), [
    ("Mars/Olympus_Mons", "unknown time zone Mars/Olympus_Mons"),
    ("", "timeZone must be nil or non-empty string"),
    ("Local", "must be an explicit time zone"),
    ("../../etc/passwd", "unknown time zone ../../etc/passwd"),
    ("America/-x", "unknown time zone America/-x"),
    ("Europe/A_Name_Far_Too_Long", "unknown time zone"),
])
def test_zone_names_kube_refuses_are_refused(name: str, message: str) -> None:
    with pytest.raises(cron.ZoneError, match=message):
        cron.zone(name)


@pytest.mark.parametrize("name", ["Europe/Berlin", "Etc/UTC", "UTC", "America/Argentina/Buenos_Aires", "Etc/GMT+5"])
def test_iana_zone_names_are_known(name: str) -> None:
    assert cron.zone(name) is not None


def test_a_cron_tz_prefix_is_split_off() -> None:
    assert cron.split_zone("CRON_TZ=Europe/Paris 0 6 * * *") == ("Europe/Paris", "0 6 * * *")
    assert cron.split_zone("TZ=UTC @daily") == ("UTC", "@daily")
    assert cron.split_zone("0 6 * * *") == (None, "0 6 * * *")
    assert cron.names_zone("CRON_TZ=UTC 0 * * * *") and not cron.names_zone("0 * * * *")


def test_only_the_latest_missed_run_is_due() -> None:
    every_five = cron.parse("*/5 * * * *")
    last, now = at(2026, 5, 1, 10), at(2026, 5, 1, 10, 23)
    assert due_time(every_five, last, now, UTC) == at(2026, 5, 1, 10, 20)
    assert latest_due(every_five, last, now, UTC) == at(2026, 5, 1, 10, 20)
    assert missed_count(every_five, last, now, UTC) == 4
    assert due_time(every_five, now, now + 60, UTC) is None


def test_a_long_outage_is_counted_only_up_to_the_limit_and_the_latest_run_found_quickly() -> None:
    every_minute = cron.parse("* * * * *")
    last, now = at(2026, 1, 1, 0), at(2026, 3, 1, 0, 7)
    assert missed_count(every_minute, last, now, UTC) == 101
    assert latest_due(every_minute, last, now, UTC) == at(2026, 3, 1, 0, 7)


def test_a_missed_time_is_printed_as_kube_prints_event_times() -> None:
    assert rfc1123z(at(2026, 3, 8, 9, zone=ZoneInfo("UTC"))) == "Sun, 08 Mar 2026 09:00:00 +0000"


#: zones with odd offsets or changes: 30-minute DST (Lord Howe), 45-minute offsets (Chatham),
#: half-hour offsets, southern-hemisphere DST, and changes at midnight (Santiago)
ODD_ZONES = ("America/New_York", "Australia/Lord_Howe", "Pacific/Chatham", "Asia/Kolkata", "America/Santiago",
             "Europe/London", "UTC")
FREQUENT = ("*/15 * * * *", "30 2 * * *", "0,30 1-3 * * *", "45 * * * *", "0 0 * * *", "59 23 * * *",
            "0 */2 * * *", "*/7 0-4 * * *")


def first_match_by_minutes(schedule: cron.Schedule, start: float, zone: ZoneInfo) -> float:
    """The slow, obvious answer: try every minute after `start` (within three days)."""
    at = datetime.fromtimestamp(start, UTC).replace(second=0, microsecond=0) + timedelta(minutes=1)
    for _ in range(3 * 24 * 60):
        if schedule.matches(at.astimezone(zone)):
            return at.timestamp()
        at += timedelta(minutes=1)
    raise AssertionError("no match within three days")


def offset_changes(zone: ZoneInfo) -> list[float]:
    """The instants of 2026 at which `zone`'s offset changes (to within a quarter hour)."""
    at, found = datetime(2026, 1, 1, tzinfo=UTC), []
    while at.year == 2026:
        after = at + timedelta(minutes=15)
        if at.astimezone(zone).utcoffset() != after.astimezone(zone).utcoffset():
            found.append(after.timestamp())
        at = after
    return found


@pytest.mark.parametrize("zone_name", ODD_ZONES)
def test_the_next_run_is_the_first_minute_whose_local_time_matches(zone_name: str) -> None:
    zone, rng = ZoneInfo(zone_name), random.Random(zone_name)
    near = offset_changes(zone) or [datetime(2026, 6, 1, tzinfo=UTC).timestamp()]
    for _ in range(60):  # starts within three hours of a change, where a wrong step would show
        schedule = cron.parse(rng.choice(FREQUENT))
        start = rng.choice(near) + rng.uniform(-3 * 3600, 3 * 3600)
        assert schedule.next_after(start, zone) == first_match_by_minutes(schedule, start, zone), start
