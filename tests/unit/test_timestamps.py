"""The one timestamp helper: metav1.Time and MicroTime spelling, from datetimes and Unix seconds."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone

import pytest

from tfusion.api import timestamps

MOMENT = datetime(2025, 1, 31, 12, 0, 5, 123456, tzinfo=UTC)


def test_rfc3339_is_utc_whole_seconds_with_a_z() -> None:
    assert timestamps.rfc3339(MOMENT) == "2025-01-31T12:00:05Z"
    shifted = MOMENT.astimezone(timezone(timedelta(hours=2)))
    assert timestamps.rfc3339(shifted) == "2025-01-31T12:00:05Z"
    assert timestamps.rfc3339(MOMENT.timestamp()) == "2025-01-31T12:00:05Z"
    assert timestamps.rfc3339(0) == "1970-01-01T00:00:00Z"


def test_micro_time_has_exactly_six_fractional_digits() -> None:
    assert timestamps.micro_time(MOMENT) == "2025-01-31T12:00:05.123456Z"
    assert timestamps.micro_time(MOMENT.replace(microsecond=0)) == "2025-01-31T12:00:05.000000Z"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", timestamps.micro_time())


def test_now_is_the_current_utc_time() -> None:
    before = datetime.now(UTC).replace(microsecond=0)
    parsed = timestamps.parse_rfc3339(timestamps.rfc3339())
    after = datetime.now(UTC)
    assert before <= parsed <= after


@pytest.mark.parametrize("text", ["2025-01-31T12:00:05Z", "2025-01-31T14:00:05+02:00",
                                  "2025-01-31T12:00:05.123456Z"])
def test_parse_reads_what_kubernetes_writes(text: str) -> None:
    assert timestamps.parse_rfc3339(text).replace(microsecond=0) == MOMENT.replace(microsecond=0)


def test_parse_round_trips_both_spellings() -> None:
    assert timestamps.parse_rfc3339(timestamps.micro_time(MOMENT)) == MOMENT
    assert timestamps.parse_rfc3339(timestamps.rfc3339(MOMENT)) == MOMENT.replace(microsecond=0)


@pytest.mark.parametrize(("text", "needle"), [("yesterday", "RFC 3339"), ("", "RFC 3339"),
                                              ("2025-01-31T12:00:05", "with a zone")])
def test_parse_rejects_naming_the_text(text: str, needle: str) -> None:
    with pytest.raises(ValueError, match=needle) as info:
        timestamps.parse_rfc3339(text)
    assert repr(text) in str(info.value)
