"""The one parser of Go-style durations ("30s", "1h30m", "500ms"), used by annotations, flags and config.

Annotations follow Go's `time.ParseDuration` exactly; flags, environment variables and the dynamic
config file also accept days ("30d", as the original's metricsTTL does) and bare seconds ("15").
Both dialects share this grammar so that "what is a duration" is answered in one place. It lives in
`tfusion.api` because that is the lowest layer; it imports nothing of tfusion.
"""

from __future__ import annotations

import re
from typing import Final

_PART: Final = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h|d)")
_BARE_NUMBER: Final = re.compile(r"\d+(?:\.\d*)?|\.\d+")
_SECONDS_PER_UNIT: Final = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0,
                            "h": 3600.0, "d": 86400.0}


class DurationError(ValueError):
    """The text is not a duration; the message quotes it and says what is expected."""


def parse_duration(text: str, *, allow_days: bool = False, bare_seconds: bool = False) -> float:
    """Seconds in `text`, never negative. "0" is always allowed (Go allows it without a unit).

    `allow_days` accepts the unit "d" (24h); `bare_seconds` reads a number without a unit as seconds.
    """
    stripped = text.strip()
    if stripped == "0" or (bare_seconds and _BARE_NUMBER.fullmatch(stripped)):
        return float(stripped)
    pos, total = 0, 0.0
    for match in _PART.finditer(stripped):
        if match.start() != pos or (match.group(2) == "d" and not allow_days):
            break
        total += float(match.group(1)) * _SECONDS_PER_UNIT[match.group(2)]
        pos = match.end()
    if not stripped or pos != len(stripped):
        raise DurationError(f"expected a duration such as {example(allow_days=allow_days)}, got {text!r}")
    return total


def example(*, allow_days: bool = False) -> str:
    """A few durations of the dialect, for error messages."""
    return "30s, 5m, 1h30m or 30d" if allow_days else "30s, 5m or 1h30m"


def format_duration(seconds: float) -> str:
    """A duration the parser reads back: whole seconds as "90s", fractions as "0.5s"."""
    return f"{int(seconds)}s" if float(seconds).is_integer() else f"{seconds}s"
