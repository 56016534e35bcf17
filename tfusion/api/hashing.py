"""Short content hashes of JSON-shaped values, as labels and annotations carry them: a pool's
client config (the pods' template hash), a worker's template, a pool's node selectors.

The bytes hashed are the ones Python's `json.dumps(value, sort_keys=True, separators=(",", ":"))`
wrote when tfusion still used it: compact, keys sorted, every character outside printable ASCII
escaped as `\\uXXXX`. Keeping them means an upgrade finds the hashes already written unchanged
(a changed worker template hash replaces the workers). orjson writes the JSON, as everywhere else
in tfusion (msgspec and orjson are its two JSON libraries); it leaves those characters as UTF-8,
so they are escaped here. (One difference remains: a float below 1e-4 is written `0.00001`, not
`1e-05`; Kubernetes objects keep such amounts as quantity strings.)
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import orjson

__all__ = ["content_hash"]

#: what json's ensure_ascii escapes and orjson does not: DEL and everything beyond ASCII
_UNESCAPED = re.compile(r"[^\x00-\x7e]")
#: as `json.dumps(..., default=str)`: datetimes and dataclasses are hashed as their str()
_OPTIONS = orjson.OPT_SORT_KEYS | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS


def _escape(match: re.Match[str]) -> str:
    units = match.group().encode("utf-16-be")  # a character beyond the BMP is two units, as in JSON
    return "".join(f"\\u{int.from_bytes(units[i:i + 2], 'big'):04x}" for i in range(0, len(units), 2))


def content_hash(value: Any, length: int) -> str:
    """The first `length` hex digits of the SHA-256 of `value`'s canonical JSON."""
    text = _UNESCAPED.sub(_escape, orjson.dumps(value, default=str, option=_OPTIONS).decode())
    return hashlib.sha256(text.encode("ascii")).hexdigest()[:length]
