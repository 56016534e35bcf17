"""The one duration grammar, in its two dialects (Go's for annotations, days and bare seconds for flags)."""

from __future__ import annotations

import pytest

from tfusion.api.durations import DurationError, format_duration, parse_duration


@pytest.mark.parametrize(("text", "seconds"), [("30s", 30.0), ("1h30m", 5400.0), ("1.5h", 5400.0), (".5s", 0.5),
                                               ("500ms", 0.5), ("250us", 0.00025), ("3µs", 3e-6), ("7ns", 7e-9),
                                               ("0", 0.0), ("2h0m0s", 7200.0), (" 5m ", 300.0)])
def test_go_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "5", "5d", "-5s", "5 s", "s", "1h-30m", "1x", "5s5"])
def test_go_dialect_rejects(text: str) -> None:
    with pytest.raises(DurationError, match=r"expected a duration such as 30s, 5m or 1h30m, got"):
        parse_duration(text)


def test_days_and_bare_seconds_only_when_asked() -> None:
    assert parse_duration("30d", allow_days=True) == 30 * 86400.0
    assert parse_duration("1d12h", allow_days=True) == 36 * 3600.0
    assert parse_duration("15", bare_seconds=True) == 15.0
    assert parse_duration("2.5", bare_seconds=True) == 2.5
    with pytest.raises(DurationError, match="or 30d, got '1w'"):
        parse_duration("1w", allow_days=True)


def test_a_duration_error_is_a_value_error() -> None:
    assert issubclass(DurationError, ValueError)


@pytest.mark.parametrize("seconds", [0.0, 90.0, 0.5, 43200.0])
def test_format_reads_back(seconds: float) -> None:
    assert parse_duration(format_duration(seconds)) == seconds
