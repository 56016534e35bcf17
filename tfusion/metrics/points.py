"""One metrics point and its encodings: InfluxDB line protocol (ms precision), a JSON line, OTLP JSON.

Why: the original writes `measure,tag=v field=1i <ms>` lines (or `{"measure","tag","field","ts"}`
objects) that GreptimeDB and InfluxDB 1.x ingest as they are. Line protocol has rules a hand-written
f-string gets wrong (escaping of spaces, commas and '=' in tags, quoting of string fields, the `i`
suffix of integers, no empty tag values, no NaN), so every writer goes through `influx_line`.

`otel` writes one line per batch: an OTLP/JSON ExportMetricsServiceRequest (what an OpenTelemetry
collector's OTLP/HTTP receiver takes) with scope `operator`, as the original does. Each numeric
field becomes a gauge named `<measure>_<field>` with the tags as string attributes and the point's
time as `timeUnixNano` (and `startTimeUnixNano`); integers and booleans are `asInt` (a decimal
string, as OTLP/JSON writes 64-bit integers), floats `asDouble`. String fields, NaN and infinities
have no gauge value and are left out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import orjson

from tfusion.api.jsontypes import JsonObject, JsonValue

FieldValue = float | int | bool | str

FORMATS = ("influx", "json", "otel")
OTEL_SCOPE = "operator"


@dataclass(frozen=True, slots=True)
class Point:
    """One row of a table: `measure` (the table), `tags` (indexed strings), `fields` (values), `ts_ms`."""

    measure: str
    tags: Mapping[str, str]
    fields: Mapping[str, FieldValue]
    ts_ms: int = 0
    #: not written: the point's meaning for readers inside the process (e.g. the worker's UID)
    extra: Mapping[str, str] = field(default_factory=dict, compare=False)


class _Escaped(dict[str, str]):
    """Text escaped for one position of line protocol (`specials` get a backslash, as do backslash
    and newline), remembered: every tick writes the same tag keys, pools, nodes, worker names and
    field keys again. A dict lookup costs a fraction of an lru_cache call, which counted at 100,000
    workers a tick (about 20 per row); emptied when it holds `size` texts (names come and go)."""

    def __init__(self, specials: str, size: int = 1 << 18) -> None:
        super().__init__()
        self.specials = specials
        self.size = size

    def __missing__(self, text: str) -> str:
        out = text.replace("\\", "\\\\").replace("\n", "\\n")
        for char in self.specials:
            out = out.replace(char, f"\\{char}")
        if len(self) >= self.size:
            self.clear()
        self[text] = out
        return out


_NAME = _Escaped(", ")  # a measurement
_KEY = _Escaped(", =")  # a tag key, tag value or field key


def _field_value(value: FieldValue) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return f"{value}i"
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else repr(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def influx_line(point: Point) -> str | None:
    """The point as one line of line protocol; None when it has no writable field (such a line is
    invalid). Tags with an empty value are left out (line protocol cannot carry them; readers see
    the tag as empty). Tags and fields are sorted by key, as InfluxDB recommends."""
    key = _KEY
    tags = "".join([f",{key[k]}={key[v]}" for k, v in sorted(point.tags.items()) if v])
    fields = []
    for name, value in sorted(point.fields.items()):
        text = _field_value(value)
        if text is not None:
            fields.append(f"{key[name]}={text}")
    if not fields:
        return None
    return f"{_NAME[point.measure]}{tags} {','.join(fields)} {point.ts_ms}"


def _json_field(value: FieldValue) -> FieldValue | None:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    return value


def json_line(point: Point) -> str:
    """The point as the original's JSON object: {"measure", "tag", "field", "ts"} (ts in ms)."""
    fields = {k: v for k, v in point.fields.items() if _json_field(v) is not None}
    return orjson.dumps({"measure": point.measure, "tag": dict(point.tags), "field": fields, "ts": point.ts_ms},
                        option=orjson.OPT_SORT_KEYS).decode()


def _gauge_value(value: FieldValue) -> JsonObject | None:
    if isinstance(value, bool | int):
        return {"asInt": str(int(value))}
    if isinstance(value, float) and not (math.isnan(value) or math.isinf(value)):
        return {"asDouble": value}
    return None


def _gauges(point: Point) -> list[JsonValue]:
    """One OTLP gauge per numeric field of the point."""
    attributes: list[JsonValue] = [{"key": k, "value": {"stringValue": v}} for k, v in sorted(point.tags.items())]
    nanos = str(point.ts_ms * 1_000_000)
    gauges: list[JsonValue] = []
    for key, value in sorted(point.fields.items()):
        number = _gauge_value(value)
        if number is not None:
            gauges.append({"name": f"{point.measure}_{key}", "gauge": {"dataPoints": [
                {"attributes": attributes, "timeUnixNano": nanos, "startTimeUnixNano": nanos, **number}]}})
    return gauges


def otel_line(points: Iterable[Point]) -> str | None:
    """The points as one OTLP/JSON metrics request; None when none has a numeric field."""
    metrics = [gauge for point in points for gauge in _gauges(point)]
    if not metrics:
        return None
    return orjson.dumps({"resourceMetrics": [{"resource": {"attributes": []}, "scopeMetrics": [
        {"scope": {"name": OTEL_SCOPE}, "metrics": metrics}]}]}).decode()


def encode(points: Iterable[Point], fmt: str) -> list[str]:
    """Lines in `fmt` (influx, json or otel); points without a writable field are skipped."""
    if fmt == "json":
        return [json_line(p) for p in points]
    if fmt == "otel":
        line = otel_line(points)
        return [] if line is None else [line]
    if fmt != "influx":
        raise ValueError(f"metrics format {fmt!r}: expected one of {', '.join(FORMATS)}")
    return [line for line in map(influx_line, points) if line is not None]
