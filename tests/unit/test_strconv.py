"""Go's strconv integer grammar (tfusion.api.strconv): what ParseInt/ParseUint(s, 10, 64) take and refuse."""

from __future__ import annotations

import pytest

from tfusion.api.strconv import INT64_MAX, INT64_MIN, UINT64_MAX, IntegerError, parse_int64, parse_uint64

INT64_CASES: list[tuple[str, int | str]] = [
    ("0", 0),
    ("5", 5),
    ("+5", 5),
    ("-5", -5),
    ("007", 7),
    ("-0", 0),
    ("9223372036854775807", INT64_MAX),
    ("-9223372036854775808", INT64_MIN),
    ("+0009223372036854775807", INT64_MAX),
    ("9223372036854775808", "value out of range"),
    ("-9223372036854775809", "value out of range"),
    ("9" * 5000, "value out of range"),
    ("", "invalid syntax"),
    ("+", "invalid syntax"),
    ("-", "invalid syntax"),
    ("+-5", "invalid syntax"),
    (" 5", "invalid syntax"),
    ("5 ", "invalid syntax"),
    ("5\n", "invalid syntax"),
    ("1_000", "invalid syntax"),
    ("1e3", "invalid syntax"),
    ("5.0", "invalid syntax"),
    ("0x10", "invalid syntax"),
    ("\u0665", "invalid syntax"),  # ARABIC-INDIC DIGIT FIVE: int() takes it, Go does not
    ("\uff15", "invalid syntax"),  # FULLWIDTH DIGIT FIVE
    ("nan", "invalid syntax"),
    ("inf", "invalid syntax"),
]


@pytest.mark.parametrize(("text", "expected"), INT64_CASES)
def test_parse_int64(text: str, expected: int | str) -> None:
    if isinstance(expected, int):
        assert parse_int64(text) == expected
    else:
        with pytest.raises(IntegerError) as caught:
            parse_int64(text)
        assert caught.value.reason == expected


UINT64_CASES: list[tuple[str, int | str]] = [
    ("0", 0),
    ("42", 42),
    ("18446744073709551615", UINT64_MAX),
    ("18446744073709551616", "value out of range"),
    ("+1", "invalid syntax"),
    ("-1", "invalid syntax"),
    ("1.5", "invalid syntax"),
    ("abc", "invalid syntax"),
    ("", "invalid syntax"),
]


@pytest.mark.parametrize(("text", "expected"), UINT64_CASES)
def test_parse_uint64(text: str, expected: int | str) -> None:
    if isinstance(expected, int):
        assert parse_uint64(text) == expected
    else:
        with pytest.raises(IntegerError) as caught:
            parse_uint64(text)
        assert caught.value.reason == expected
