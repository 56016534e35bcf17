"""Cron windows of cronScalingRules (tfusion.controller.autoscaler.cron): next/previous against a
minute-by-minute reference over random expressions and zones, daylight-saving days, parse errors,
and which rule is in force."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfusion.allocator.request import Resources
from tfusion.controller.autoscaler.cron import CronSchedule, active_rule
from tfusion.controller.autoscaler.policy import CronRule

NEW_YORK = ZoneInfo("America/New_York")
ZONES = ("", "CRON_TZ=America/New_York ", "TZ=Europe/Berlin ", "CRON_TZ=Australia/Lord_Howe ",
         "CRON_TZ=Asia/Kolkata ")
MINUTE = timedelta(minutes=1)
WINDOW = timedelta(days=3)


def field(low: int, high: int, names: tuple[str, ...] = ()) -> st.SearchStrategy[str]:
    number = st.integers(low, high)
    ranged = st.tuples(number, number).map(lambda ab: f"{min(ab)}-{max(ab)}")
    named = st.sampled_from(names) if names else number.map(str)
    return st.one_of(
        st.just("*"), number.map(str), named, ranged,
        st.integers(1, max(1, high - low)).map(lambda n: f"*/{n}"),
        st.tuples(ranged, st.integers(1, 7)).map(lambda rs: f"{rs[0]}/{rs[1]}"),
        st.lists(number, min_size=2, max_size=3).map(lambda xs: ",".join(map(str, xs))),
    )


EXPRESSIONS = st.tuples(
    st.sampled_from(ZONES), field(0, 59), field(0, 23), st.one_of(st.just("*"), field(1, 28)),
    st.one_of(st.just("*"), field(1, 12, ("JAN", "mar", "Oct"))),
    st.one_of(st.just("*"), field(0, 6, ("SUN", "mon", "Fri"))),
).map(lambda parts: parts[0] + " ".join(parts[1:]))
MOMENTS = st.datetimes(min_value=datetime(2025, 1, 1), max_value=datetime(2027, 12, 31)).map(
    lambda at: at.replace(tzinfo=UTC))


def fires(schedule: CronSchedule, minute: datetime) -> bool:
    return schedule.schedule.matches(minute.astimezone(schedule.zone))


def same_instant(a: datetime | None, b: datetime | None) -> bool:
    return (a is None) == (b is None) and (a is None or b is None or a.timestamp() == b.timestamp())


def brute_next(schedule: CronSchedule, after: datetime) -> datetime | None:
    minute = after.replace(second=0, microsecond=0) + MINUTE
    while minute <= after + WINDOW:
        if fires(schedule, minute):
            return minute
        minute += MINUTE
    return None


def brute_previous(schedule: CronSchedule, at: datetime) -> datetime | None:
    minute = at.replace(second=0, microsecond=0)
    while minute >= at - WINDOW:
        if fires(schedule, minute):
            return minute
        minute -= MINUTE
    return None


#: daylight-saving changes in 2026: New York (spring, autumn), Berlin (spring), Lord Howe (30-minute steps)
CHANGES = (datetime(2026, 3, 8, 7, tzinfo=UTC), datetime(2026, 11, 1, 6, tzinfo=UTC),
           datetime(2026, 3, 29, 1, tzinfo=UTC), datetime(2026, 4, 4, 15, tzinfo=UTC))
NEAR_CHANGES = st.tuples(st.sampled_from(CHANGES), st.integers(-2 * 1440, 2 * 1440)).map(
    lambda c: c[0] + timedelta(minutes=c[1], seconds=17))


@settings(max_examples=150, deadline=None)
@given(expression=EXPRESSIONS, at=MOMENTS)
def test_next_and_previous_agree_with_a_minute_by_minute_search(expression: str, at: datetime) -> None:
    check_against_search(expression, at)


@settings(max_examples=100, deadline=None)
@given(expression=EXPRESSIONS, at=NEAR_CHANGES)
def test_next_and_previous_agree_with_the_search_around_daylight_saving_changes(expression: str,
                                                                                at: datetime) -> None:
    check_against_search(expression, at)


def check_against_search(expression: str, at: datetime) -> None:
    schedule = CronSchedule.parse(expression)
    expected_next, expected_previous = brute_next(schedule, at), brute_previous(schedule, at)
    try:
        found_next: datetime | None = schedule.next(at)
    except ValueError:
        found_next = None
    found_previous = schedule.previous(at)
    if expected_next is None:
        assert found_next is None or found_next > at + WINDOW
    else:
        assert same_instant(found_next, expected_next)
    if expected_previous is None:
        assert found_previous is None or found_previous < at - WINDOW
    else:
        assert same_instant(found_previous, expected_previous)


def local(year: int, month: int, day: int, hour: int, minute: int = 0, *, fold: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=NEW_YORK, fold=fold)


def test_a_local_time_the_clocks_skip_never_fires() -> None:
    schedule = CronSchedule.parse("CRON_TZ=America/New_York 30 2 * * *")
    assert schedule.previous(local(2026, 3, 8, 12)) == local(2026, 3, 7, 2, 30)
    assert schedule.next(local(2026, 3, 7, 12)) == local(2026, 3, 9, 2, 30)


def test_a_local_time_the_clocks_repeat_fires_twice() -> None:
    schedule = CronSchedule.parse("CRON_TZ=America/New_York 30 1 * * *")
    first = schedule.next(local(2026, 11, 1, 0))
    second = schedule.next(first)
    # same-zone datetime arithmetic and equality ignore `fold`: compare instants
    assert second.timestamp() - first.timestamp() == 3600
    assert (first.utcoffset(), second.utcoffset()) == (timedelta(hours=-4), timedelta(hours=-5))
    later = schedule.previous(local(2026, 11, 1, 1, 45, fold=1))
    earlier = schedule.previous(local(2026, 11, 1, 1, 20, fold=1))
    assert later is not None and later.timestamp() == second.timestamp()
    assert earlier is not None and earlier.timestamp() == first.timestamp()


def test_the_zone_keeps_the_local_hour_and_results_are_in_it() -> None:
    schedule = CronSchedule.parse("TZ=Europe/Berlin 0 9 * * MON-FRI")
    found = schedule.next(datetime(2026, 7, 3, 8, 0, tzinfo=UTC))  # a Friday, 10:00 in Berlin
    assert (found.weekday(), found.hour, found.utcoffset()) == (0, 9, timedelta(hours=2))


def test_a_fire_time_exactly_now_is_the_previous_one() -> None:
    schedule = CronSchedule.parse("@hourly")
    at = datetime(2026, 5, 5, 10, 0, tzinfo=UTC)
    assert schedule.previous(at) == at
    assert schedule.next(at) == at + timedelta(hours=1)
    assert schedule.previous(at.replace(tzinfo=None)) == at  # naive is UTC


def test_day_of_month_or_day_of_week_when_both_are_restricted() -> None:
    schedule = CronSchedule.parse("0 0 13 * FRI")
    found = schedule.next(datetime(2026, 2, 1, tzinfo=UTC))
    assert found == datetime(2026, 2, 6, tzinfo=UTC)  # the first Friday comes before the 13th


@pytest.mark.parametrize(("expression", "named"), [
    ("61 * * * *", "minute"), ("* 24 * * *", "hour"), ("* * 0 * *", "day of month"), ("* * * 13 *", "month"),
    ("* * * * FUN", "day of week"), ("* * *", "5 fields"), ("@often", "macro"),
    ("CRON_TZ=Mars/Olympus 0 * * * *", "time zone"), ("0 0 31 2 *", "never fires"), ("0 0 30,31 FEB *", "never"),
])
def test_a_bad_expression_is_refused_naming_the_field(expression: str, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        CronSchedule.parse(expression)


def test_a_rare_day_is_accepted() -> None:
    assert CronSchedule.parse("0 0 29 2 *").next(datetime(2026, 1, 1, tzinfo=UTC)).year == 2028
    assert CronSchedule.parse("0 0 31 2 MON").next(datetime(2026, 1, 1, tzinfo=UTC)).weekday() == 0


def rule(name: str, start: str, end: str) -> CronRule:
    amounts = Resources(tflops=1000, vram=1 << 30)
    return CronRule(name, CronSchedule.parse(start), CronSchedule.parse(end), amounts, amounts)


def test_a_rule_is_in_force_between_its_start_and_its_end() -> None:
    office = rule("office", "0 9 * * MON-FRI", "0 17 * * MON-FRI")
    monday = datetime(2026, 6, 1, tzinfo=UTC)
    assert active_rule([office], monday.replace(hour=8, minute=59)) is None
    assert active_rule([office], monday.replace(hour=9)) is office
    assert active_rule([office], monday.replace(hour=16, minute=59)) is office
    assert active_rule([office], monday.replace(hour=17)) is None
    assert active_rule([office], datetime(2026, 6, 6, 12, tzinfo=UTC)) is None  # Saturday


def test_a_window_across_midnight_in_a_zone() -> None:
    night = rule("night", "CRON_TZ=America/New_York 0 22 * * *", "CRON_TZ=America/New_York 0 6 * * *")
    assert active_rule([night], local(2026, 3, 8, 3)) is night  # across the spring change
    assert active_rule([night], local(2026, 3, 8, 7)) is None


def test_the_first_rule_in_force_wins_and_equal_times_leave_a_rule_closed() -> None:
    same = rule("same", "0 * * * *", "0 * * * *")
    always_a = rule("a", "* * * * *", "0 0 1 1 *")
    always_b = rule("b", "* * * * *", "0 0 1 1 *")
    at = datetime(2026, 6, 1, 12, 30, tzinfo=UTC)
    assert active_rule([same], at) is None
    assert active_rule([same, always_a, always_b], at) is always_a


def test_a_rule_whose_start_has_not_fired_is_not_in_force() -> None:
    leap = rule("leap", "0 0 29 2 *", "0 1 29 2 *")
    assert active_rule([leap], datetime(2028, 2, 29, 0, 30, tzinfo=UTC)) is leap
    assert active_rule([leap], datetime(2028, 2, 29, 1, 30, tzinfo=UTC)) is None


DAILY = st.tuples(st.sampled_from(("", "TZ=Europe/Berlin ")), st.one_of(st.just("*"), field(1, 31)),
                  field(1, 12, ("FEB", "jun", "Dec")), st.one_of(st.just("*"), field(0, 6, ("SAT", "sun")))).map(
    lambda parts: f"{parts[0]}0 0 {parts[1]} {parts[2]} {parts[3]}")


@settings(max_examples=80, deadline=None)
@given(expression=DAILY, at=MOMENTS)
def test_previous_agrees_with_a_day_by_day_search_over_a_year(expression: str, at: datetime) -> None:
    try:
        schedule = CronSchedule.parse(expression)
    except ValueError:
        return  # a day no chosen month has (such as 31 in FEB only): refused at parse, tested above
    zone = schedule.zone
    day = at.astimezone(zone).replace(hour=0, minute=0, second=0, microsecond=0)
    expected = None
    for back in range(800):
        midnight = (day - timedelta(days=back)).replace(tzinfo=None).replace(tzinfo=zone)
        if midnight <= at and schedule.schedule.matches(midnight):
            expected = midnight
            break
    found = schedule.previous(at)
    if expected is None:
        assert found is None or found.timestamp() < (at - timedelta(days=790)).timestamp()
    else:
        assert found is not None and found.timestamp() == expected.timestamp()
