"""The one parser of Go-style durations ("30s", "1h30m", "500ms"), used by annotations, flags and config.

The grammar is Go's `time.ParseDuration`: an optional sign, then one or more decimal numbers each
with a unit (ns, us, µs or μs, ms, s, m, h), or "0" alone; at most 2^63-1 nanoseconds (about 292
years). The original reads its duration annotations (`eviction-protection`, `gang-timeout`) with
exactly that function, so annotations take exactly that grammar. Flags, environment variables and
the dynamic config file also accept days ("30d", as the original's metricsTTL does) and bare
seconds ("15"). Every consumer here wants a span of time, so a negative duration ("-5s", which Go
reads) is refused; "-0s" is zero. Both dialects share this code so that "what is a duration" is
answered in one place. It lives in `tfusion.api` because that is the lowest layer; it imports
nothing of tfusion.
"""

from __future__ import annotations

import re
from typing import Final

_PART: Final = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h|d)")
_BARE_NUMBER: Final = re.compile(r"\d+(?:\.\d*)?|\.\d+")
_SECONDS_PER_UNIT: Final = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0,
                            "h": 3600.0, "d": 86400.0}
#: Go's time.Duration is an int64 of nanoseconds; ParseDuration refuses what does not fit
MAX_SECONDS: Final = (2**63 - 1) / 1e9


class DurationError(ValueError):
    """The text is not a duration; the message quotes it and says what is expected."""


def parse_duration(text: str, *, allow_days: bool = False, bare_seconds: bool = False) -> float:
    """Seconds in `text`, never negative. "0" is always allowed (Go allows it without a unit).

    `allow_days` accepts the unit "d" (24h); `bare_seconds` reads a number without a unit as seconds.
    """
    stripped = text.strip()
    sign, body = (stripped[0], stripped[1:]) if stripped[:1] in ("+", "-") else ("", stripped)
    seconds = _unsigned(body, allow_days=allow_days, bare_seconds=bare_seconds)
    if seconds is None or seconds > MAX_SECONDS or (sign == "-" and seconds):
        why = " (it is negative)" if seconds and sign == "-" else " (it is too long)" if seconds else ""
        raise DurationError(f"expected a duration such as {example(allow_days=allow_days)}, got {text!r}{why}")
    return seconds


def _unsigned(body: str, *, allow_days: bool, bare_seconds: bool) -> float | None:
    """The seconds of `body` (no sign), or None when it is not a duration of the dialect."""
    if body == "0" or (bare_seconds and _BARE_NUMBER.fullmatch(body)):
        return float(body)
    pos, total = 0, 0.0
    for match in _PART.finditer(body):
        if match.start() != pos or (match.group(2) == "d" and not allow_days):
            break
        total += float(match.group(1)) * _SECONDS_PER_UNIT[match.group(2)]
        pos = match.end()
    return total if body and pos == len(body) else None


def example(*, allow_days: bool = False) -> str:
    """A few durations of the dialect, for error messages."""
    return "30s, 5m, 1h30m or 30d" if allow_days else "30s, 5m or 1h30m"


def format_duration(seconds: float) -> str:
    """A duration the parser reads back: whole seconds as "90s", fractions as "0.5s"."""
    return f"{int(seconds)}s" if float(seconds).is_integer() else f"{seconds}s"
