"""The one producer and parser of Kubernetes timestamps.

Kubernetes writes `metav1.Time` as RFC 3339 in UTC with seconds precision ("2025-01-31T12:00:00Z":
creationTimestamp, conditions, Events, the last-sync annotations) and `metav1.MicroTime` with exactly
six fractional digits (Lease renewTime, Event eventTime). Writing both here keeps every producer
(the embedded API server, the kubelet, events, leases, annotations) byte-for-byte alike.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime


def _moment(moment: datetime | float | None) -> datetime:
    if moment is None:
        return datetime.now(UTC)
    if isinstance(moment, int | float):
        return datetime.fromtimestamp(moment, UTC)
    return moment.astimezone(UTC)


#: (the Unix second, its `rfc3339` text) of the latest "now": a server stamps several times per write
_now_text: tuple[int, str] = (-1, "")


def rfc3339(moment: datetime | float | None = None) -> str:
    """`metav1.Time`: RFC 3339, UTC, whole seconds, a trailing Z. `moment` is a datetime (a naive
    one is taken as local time), Unix seconds, or None for now."""
    global _now_text
    if moment is None:
        second = int(time.time())
        if _now_text[0] != second:  # a tuple swapped whole: a thread reading it sees one pair or the other
            _now_text = (second, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(second)))
        return _now_text[1]
    return _moment(moment).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_time(moment: datetime | float | None = None) -> str:
    """`metav1.MicroTime`: like `rfc3339` with exactly six fractional digits."""
    return _moment(moment).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_rfc3339(text: str) -> datetime:
    """An RFC 3339 time with a zone ("Z" or "+02:00", fractions allowed) as an aware datetime.

    Raises ValueError naming the text when it is not one, or has no zone.
    """
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"expected an RFC 3339 time such as 2025-01-31T12:00:00Z, got {text!r}") from None
    if moment.tzinfo is None:
        raise ValueError(f"expected an RFC 3339 time with a zone (Z or +hh:mm), got {text!r}")
    return moment
