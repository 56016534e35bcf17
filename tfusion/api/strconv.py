"""Go's strconv grammar for base-10 integers, for every value a Kubernetes component reads with
`strconv.ParseInt(s, 10, 64)` or `strconv.ParseUint(s, 10, 64)`.

Query parameters of kube-apiserver (limit, timeoutSeconds, gracePeriodSeconds, ...) and
resourceVersions are read that way, so a value Go refuses must be refused here too, and one Go takes
must be taken: Python's `int()` is wrong in both directions (it takes " 5", "1_000" and other
scripts' digits, and numbers beyond 64 bits). One parser here, in a module everything may import, so
that the API server, the controller and the hypervisor agree on what an integer parameter is.
"""

from __future__ import annotations

import re

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
UINT64_MAX = 2**64 - 1
#: what an int64 parameter may be, for error messages
INT64_ALLOWED = f"an optional sign and decimal digits, from {INT64_MIN} to {INT64_MAX}"
UINT64_ALLOWED = f"decimal digits, from 0 to {UINT64_MAX}"

_SIGNED = re.compile(r"[+-]?[0-9]+", re.ASCII)
_UNSIGNED = re.compile(r"[0-9]+", re.ASCII)


class IntegerError(ValueError):
    """`text` is not an integer Go would read; `reason` is Go's word for why."""

    def __init__(self, text: str, reason: str) -> None:
        super().__init__(f"parsing {text[:100]!r}: {reason}")
        self.text = text
        self.reason = reason


def parse_int64(text: str) -> int:
    """`text` as strconv.ParseInt(text, 10, 64): an optional sign and ASCII digits, within int64."""
    if not _SIGNED.fullmatch(text):
        raise IntegerError(text, "invalid syntax")
    return _in_range(text, INT64_MIN, INT64_MAX)


def parse_uint64(text: str) -> int:
    """`text` as strconv.ParseUint(text, 10, 64): ASCII digits only (no sign), within uint64."""
    if not _UNSIGNED.fullmatch(text):
        raise IntegerError(text, "invalid syntax")
    return _in_range(text, 0, UINT64_MAX)


def _in_range(text: str, low: int, high: int) -> int:
    # more than 20 significant digits is out of range whatever they are; int() of them is never needed
    if len(text.lstrip("+-").lstrip("0")) > 20:
        raise IntegerError(text, "value out of range")
    value = int(text)
    if not low <= value <= high:
        raise IntegerError(text, "value out of range")
    return value
