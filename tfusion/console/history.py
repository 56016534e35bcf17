"""Usage and cost over time, per namespace, pool or workload, from what tfusion already records.

Why: the console's charts answer "what did this namespace cost this week" and "how much of what it
asks for does it use" without a database of its own. The facts are the tables the roles write
(tfusion/metrics/tables.py): the controller's `tf_worker_resources` (requests and `raw_cost`, the
cost billed since the worker's previous row) and the hypervisors' `tf_worker_usage` (TFLOPS and
VRAM in use). A `HistorySource` reads them from wherever they went: the metrics files (the default,
`file_history`), Prometheus (`prometheus_history`) or InfluxDB 1.x (`influx_history`).

What a value means, whatever the source: `cost` is the sum of what was billed in a bucket;
`tflops_requested` (`tflops_request * gpu_count` of every worker), `tflops_used` and `vram_used` are
the mean over the bucket's recorder ticks of the per-tick sum over the group (a tick where a group
had no row counts as 0). A bucket in which nothing was recorded at all has no point, so a gap is not
drawn as zero.

The files can be 100 MB with ten rotations each, so the file source never reads one twice: it keeps
per-bucket sums in three resolutions (a minute for two hours, 15 minutes for two days, an hour for
eight days; older buckets are dropped, which bounds memory) and on each query reads only what was
appended since the last one. It follows a rotation by inode (the file it was reading is now `.1`:
it reads that one's tail and then the new file); a file it was reading that is gone or shrank
starts that file's sums over from its rotations.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, get_args

import anyio.to_thread
import httpx
import orjson

from tfusion.metrics.tables import CONTROLLER_TABLES, HYPERVISOR_TABLES, WORKER_TABLE, WORKER_USAGE_TABLE

Metric = Literal["cost", "tflops_used", "vram_used", "tflops_requested"]
GroupBy = Literal["namespace", "pool", "workload"]
METRICS: tuple[Metric, ...] = get_args(Metric)
GROUPS: tuple[GroupBy, ...] = get_args(GroupBy)

#: window name -> (length, step) in seconds
WINDOWS: dict[str, tuple[float, float]] = {"hour": (3600.0, 60.0), "day": (86400.0, 900.0),
                                           "week": (604800.0, 3600.0)}
#: the series that sums every group past the `top` largest
OTHER = "other"
#: a group whose tag is missing (a hypervisor row without a pool, line protocol dropping an empty tag)
UNKNOWN = "unknown"
NO_DATA = "no metrics recorded in this window yet"

_SUMMED: frozenset[Metric] = frozenset({"cost"})
#: which role's ticks a metric is recorded on
_FAMILY: dict[Metric, str] = {"cost": "controller", "tflops_requested": "controller",
                              "tflops_used": "hypervisor", "vram_used": "hypervisor"}


@dataclass(frozen=True)
class Series:
    label: str  # the group's value ("default"; "namespace/workload" when grouped by workload)
    points: tuple[tuple[float, float], ...]  # (unix seconds at the bucket's start, value), ascending


@dataclass(frozen=True)
class History:
    metric: Metric
    group_by: GroupBy
    since: float
    until: float
    step: float  # the bucket length the values were computed for (may be coarser than asked)
    series: tuple[Series, ...]  # largest total first, at most `top`; the rest summed as "other" (last)
    source: str  # "files: <dir>", "prometheus: <url>"
    note: str = ""  # why there is no data, what was skipped

    @property
    def empty(self) -> bool:
        return not any(s.points for s in self.series)


class HistorySource(Protocol):
    name: str

    async def query(self, metric: Metric, group_by: GroupBy, since: float, until: float, step: float, *,
                    top: int = 8) -> History: ...


class HistoryError(Exception):
    """A source that cannot answer; the message names the source and why."""


def check_query(metric: str, group_by: str, since: float, until: float, step: float, top: int) -> None:
    """ValueError naming the argument, its value and what is allowed."""
    if metric not in METRICS:
        raise ValueError(f"metric {metric!r}: expected one of {', '.join(METRICS)}")
    if group_by not in GROUPS:
        raise ValueError(f"group_by {group_by!r}: expected one of {', '.join(GROUPS)}")
    if not (math.isfinite(since) and math.isfinite(until)) or until <= since:
        raise ValueError(f"since={since!r}, until={until!r}: expected finite unix seconds with since < until")
    if not math.isfinite(step) or step <= 0:
        raise ValueError(f"step {step!r}: expected a positive number of seconds")
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise ValueError(f"top {top!r}: expected an integer of at least 1")


def rank(values: Mapping[str, Mapping[float, float]], starts: Sequence[float], top: int) -> tuple[Series, ...]:
    """One series per label over `starts` (0 where a label has no value), largest total first; past
    `top` series the smallest are summed into one "other" series, placed last."""
    totals = {label: sum(by_start.values()) for label, by_start in values.items()}
    order = sorted(values, key=lambda label: (-totals[label], label))
    keep, rest = (order, []) if len(order) <= top else (order[:top - 1], order[top - 1:])
    series = [Series(label, tuple((s, values[label].get(s, 0.0)) for s in starts)) for label in keep]
    if rest:
        other = OTHER if OTHER not in keep else f"{OTHER} (rest)"
        series.append(Series(other, tuple((s, sum(values[label].get(s, 0.0) for label in rest)) for s in starts)))
    return tuple(series)


def group_label(group_by: GroupBy, namespace: str, pool: str, workload: str) -> str:
    if group_by == "namespace":
        return namespace or UNKNOWN
    if group_by == "pool":
        return pool or UNKNOWN
    return f"{namespace or UNKNOWN}/{workload or UNKNOWN}"


# --- parsing the metrics files ----------------------------------------------------------------------

Row = tuple[str, dict[str, str], dict[str, float], int]  # measure, tags, numeric fields, ts in ms


def _unescape_until(line: str, start: int, stops: str) -> tuple[str, int]:
    """The text from `start` up to the first unescaped character in `stops` (or the end), unescaped."""
    out: list[str] = []
    i = start
    while i < len(line):
        char = line[i]
        if char == "\\" and i + 1 < len(line):
            nxt = line[i + 1]
            out.append("\n" if nxt == "n" else nxt)
            i += 2
            continue
        if char in stops:
            break
        out.append(char)
        i += 1
    return "".join(out), i


def _number(text: str) -> float:
    """A line-protocol field value (not a string) as a number; ValueError when malformed."""
    if text.endswith(("i", "u")):
        return float(int(text[:-1]))
    if text in ("true", "t", "T", "True", "TRUE"):
        return 1.0
    if text in ("false", "f", "F", "False", "FALSE"):
        return 0.0
    return float(text)


def _influx_slow(line: str) -> Row | None:
    """Line protocol with escapes or string fields (rare in tfusion's files: tag values with spaces,
    commas or '=')."""
    measure, i = _unescape_until(line, 0, ", ")
    tags: dict[str, str] = {}
    while i < len(line) and line[i] == ",":
        key, i = _unescape_until(line, i + 1, "=")
        value, i = _unescape_until(line, i + 1, ", ")
        tags[key] = value
    if i >= len(line) or line[i] != " ":
        return None
    fields: dict[str, float] = {}
    i += 1
    while True:
        key, i = _unescape_until(line, i, "=")
        i += 1
        if line[i:i + 1] == '"':  # a string field: skipped, but its quotes may hold spaces and commas
            _, i = _unescape_until(line, i + 1, '"')
            i += 1
        else:
            raw, i = _unescape_until(line, i, ", ")
            fields[key] = _number(raw)
        if line[i:i + 1] != ",":
            break
        i += 1
    ts = line[i:].strip()
    return (measure, tags, fields, int(ts)) if ts else None


def parse_influx(line: str) -> Row | None:
    """One line of InfluxDB line protocol (as tfusion/metrics/points.py writes it); None when it has
    no timestamp. Raises ValueError on a malformed number."""
    if "\\" in line or '"' in line:
        return _influx_slow(line)
    parts = line.split(" ")
    if len(parts) != 3:
        return None
    head, body, ts = parts
    measure, *pairs = head.split(",")
    tags = dict(pair.split("=", 1) for pair in pairs)
    fields: dict[str, float] = {}
    for pair in body.split(","):
        key, value = pair.split("=", 1)
        fields[key] = _number(value)
    return measure, tags, fields, int(ts)


def parse_json(line: str) -> Row | None:
    """One JSON line ({"measure", "tag", "field", "ts"}); None when it is not such an object."""
    data = orjson.loads(line)
    if not isinstance(data, dict):
        return None
    measure, tags, fields, ts = data.get("measure"), data.get("tag"), data.get("field"), data.get("ts")
    if not isinstance(measure, str) or not isinstance(tags, dict) or not isinstance(fields, dict) \
            or not isinstance(ts, int) or isinstance(ts, bool):
        return None
    numbers = {k: float(v) for k, v in fields.items() if isinstance(v, int | float)}
    return measure, {str(k): str(v) for k, v in tags.items()}, numbers, ts


_FAMILIES = {**dict.fromkeys(CONTROLLER_TABLES, "controller"), **dict.fromkeys(HYPERVISOR_TABLES, "hypervisor")}
#: the two metrics a row of each table gives, in the order `_values` returns them
_METRICS_OF: dict[str, tuple[Metric, Metric]] = {WORKER_TABLE: ("cost", "tflops_requested"),
                                                 WORKER_USAGE_TABLE: ("tflops_used", "vram_used")}
#: the fields `_values` reads, per table
_FIELDS = {WORKER_TABLE: ("raw_cost", "tflops_request", "gpu_count"),
           WORKER_USAGE_TABLE: ("compute_tflops", "memory_bytes")}


def _values(measure: str, fields: Mapping[str, float]) -> tuple[float, float]:
    if measure == WORKER_TABLE:
        return fields.get("raw_cost", 0.0), fields.get("tflops_request", 0.0) * fields.get("gpu_count", 1.0)
    return fields.get("compute_tflops", 0.0), fields.get("memory_bytes", 0.0)


_TAGS = ("namespace", "pool", "workload")


def _pick(text: str, key: str) -> str:
    """The value of `key` in a `k=v,k=v` text without escapes ("" when absent): found, not split,
    since a row has many more fields than the history reads."""
    needle = key + "="
    at = text.find(needle)
    while at > 0 and text[at - 1] != ",":
        at = text.find(needle, at + 1)
    if at < 0:
        return ""
    start = at + len(needle)
    end = text.find(",", start)
    return text[start:] if end < 0 else text[start:end]


def _fast_influx(line: str) -> tuple[str, int, str, str] | None:
    """(measure, ts, tags text, fields text) of a line without escapes or string fields, the
    common case, without parsing what is not needed; None when it is not such a line."""
    if "\\" in line or '"' in line:
        return None
    first, last = line.find(" "), line.rfind(" ")
    if first < 0 or first == last:
        return None
    head = line[:first]
    comma = head.find(",")
    measure, tags = (head, "") if comma < 0 else (head[:comma], head[comma + 1:])
    return measure, int(line[last + 1:]), tags, line[first + 1:last]


# --- per-bucket sums ---------------------------------------------------------------------------------

BASE_STEP = 60
Key = tuple[Metric, GroupBy]


class _Tier:
    """Sums and ticks per bucket of `step` seconds, kept for `keep` seconds."""

    def __init__(self, step: int, keep: int) -> None:
        self.step = step
        self.keep = keep
        self.sums: dict[int, dict[Key, dict[str, float]]] = {}
        self.ticks: dict[int, dict[str, set[int]]] = {}

    def merge(self, sums: Mapping[tuple[int, Metric, GroupBy], Mapping[str, float]],
              ticks: Mapping[tuple[int, str], set[int]]) -> None:
        for (minute, metric, group_by), labels in sums.items():
            into = self.sums.setdefault(minute // self.step * self.step, {}).setdefault((metric, group_by), {})
            for label, value in labels.items():
                into[label] = into.get(label, 0.0) + value
        for (minute, family), stamps in ticks.items():
            self.ticks.setdefault(minute // self.step * self.step, {}).setdefault(family, set()).update(stamps)

    def prune(self, now: float) -> None:
        oldest = now - self.keep
        for start in [s for s in self.ticks if s + self.step < oldest]:
            del self.ticks[start]
            self.sums.pop(start, None)


def _tiers() -> list[_Tier]:
    """Finest first; each kept long enough for the window it serves (WINDOWS) plus slack."""
    return [_Tier(60, 2 * 3600), _Tier(900, 2 * 86400), _Tier(3600, 8 * 86400)]


KEEP_S = 8 * 86400
READ_CHUNK = 4 << 20
HEAD_BYTES = 128
MAX_INTERNED = 100_000


def _head(path: Path, size: int) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read(size)
    except OSError:
        return b""


class _FileFollower:
    """One metrics file and its rotations (`name`, `name.1` ... `name.N`), read incrementally into
    its own sums (so a restart of this file forgets only what came from it)."""

    def __init__(self, directory: Path, name: str, clock: Callable[[], float], labels: dict[str, str]) -> None:
        self.directory = directory
        self.name = name
        self.clock = clock
        self.labels = labels  # shared interning of label strings: one object per distinct label
        self.reset()

    def reset(self) -> None:
        self.tiers = _tiers()
        #: (st_dev, st_ino, offset consumed, the file's first bytes): an inode number can be reused by
        #: a new file once the old one is deleted, so the first bytes must match as well
        self.position: tuple[int, int, int, bytes] | None = None
        self.bad_lines = 0
        self.otel_lines = 0
        self.resets = 0
        self.bytes_read = 0  # how much was read since the last reset (a test's way to see no re-read)

    def paths(self) -> list[Path]:
        """Existing files, oldest first (`name.N` ... `name.1`, `name`)."""
        rotated: list[tuple[int, Path]] = []
        prefix = self.name + "."
        try:
            entries = list(os.scandir(self.directory))
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise HistoryError(f"files: {self.directory}: cannot list the directory: {exc}") from None
        current = None
        for entry in entries:
            if entry.name == self.name:
                current = Path(entry.path)
            elif entry.name.startswith(prefix) and entry.name[len(prefix):].isdigit():
                rotated.append((int(entry.name[len(prefix):]), Path(entry.path)))
        ordered = [path for _, path in sorted(rotated, reverse=True)]
        return ordered + ([current] if current is not None else [])

    def refresh(self) -> None:
        paths = self.paths()
        stats = []
        for path in paths:
            try:
                stats.append((path, path.stat()))
            except FileNotFoundError:
                continue
        if not stats:
            if self.position is not None:
                self.reset()
            return
        start = 0
        offset = 0
        if self.position is not None:
            dev, ino, consumed, head = self.position
            found = [i for i, (_, st) in enumerate(stats) if (st.st_dev, st.st_ino) == (dev, ino)]
            if not found or stats[found[0]][1].st_size < consumed or _head(stats[found[0]][0], len(head)) != head:
                resets = self.resets + 1
                self.reset()  # the file we read was replaced or truncated: its sums start over
                self.resets = resets
            else:
                start, offset = found[0], consumed
        following = self.position is not None
        batch = _Batch()
        horizon = self.clock() - KEEP_S
        for index in range(start, len(stats)):
            path, st = stats[index]
            newest = index == len(stats) - 1
            if not newest and not (following and index == start) and st.st_mtime < horizon:
                continue  # every line of an old rotation is older than the week we keep
            consumed = self._read(path, offset if index == start else 0, newest, horizon, batch)
            if newest:
                self.position = (st.st_dev, st.st_ino, consumed, _head(path, HEAD_BYTES))
        self._merge(batch)

    def _merge(self, batch: _Batch) -> None:
        if len(self.labels) > MAX_INTERNED:  # workloads come and go: interning is only a saving
            self.labels.clear()
        sums: dict[tuple[int, Metric, GroupBy], dict[str, float]] = {}
        for (minute, measure, namespace, pool, workload), values in batch.rows.items():
            metrics = _METRICS_OF[measure]
            for group_by in GROUPS:
                label = group_label(group_by, namespace, pool, workload)
                label = self.labels.setdefault(label, label)
                for metric, value in zip(metrics, values, strict=True):
                    into = sums.setdefault((minute, metric, group_by), {})
                    into[label] = into.get(label, 0.0) + value
        now = self.clock()
        for tier in self.tiers:
            tier.merge(sums, batch.ticks)
            tier.prune(now)
        batch.rows.clear()
        batch.ticks.clear()

    def _read(self, path: Path, offset: int, newest: bool, horizon: float, batch: _Batch) -> int:
        """Add the complete lines from `offset` on; the offset after the last one read. The newest
        file's unfinished last line waits for its newline (a writer may be halfway through it)."""
        try:
            handle = open(path, "rb")  # noqa: SIM115 - closed below; the reading loop needs the handle
        except FileNotFoundError:
            return offset
        except OSError as exc:
            raise HistoryError(f"files: {path}: cannot read it: {exc}") from None
        with handle:
            handle.seek(offset)
            consumed = offset
            pending = b""
            while True:
                chunk = handle.read(READ_CHUNK)
                if not chunk:
                    break
                self.bytes_read += len(chunk)
                data = pending + chunk
                cut = data.rfind(b"\n") + 1
                pending = data[cut:]
                if cut:
                    self._lines(data[:cut], horizon, batch)
                    consumed += cut
                if len(batch.rows) > 200_000:
                    self._merge(batch)
            if pending and not newest:
                self._lines(pending, horizon, batch)
                consumed += len(pending)
        return consumed

    def _lines(self, data: bytes, horizon: float, batch: _Batch) -> None:
        horizon_ms = horizon * 1000
        rows, ticks = batch.rows, batch.ticks
        last_tick: tuple[int, str] | None = None
        for line in data.decode("utf-8", errors="replace").splitlines():
            if not line:
                continue
            tags: Mapping[str, str]
            fields: Mapping[str, float]
            try:
                fast = None if line[0] == "{" else _fast_influx(line)
                if fast is not None:
                    measure, ts, tag_text, field_text = fast
                    if measure not in _FAMILIES or ts < horizon_ms:
                        continue
                    if measure in _METRICS_OF:
                        tags = {key: _pick(tag_text, key) for key in _TAGS}
                        fields = {key: _number(text) for key in _FIELDS[measure] if (text := _pick(field_text, key))}
                else:
                    if line.startswith('{"resourceMetrics"'):
                        self.otel_lines += 1
                        continue
                    row = parse_json(line) if line[0] == "{" else parse_influx(line)
                    if row is None:
                        raise ValueError("not a metrics row")
                    measure, tags, fields, ts = row
                    if measure not in _FAMILIES or ts < horizon_ms:
                        continue
            except ValueError:
                self.bad_lines += 1
                continue
            minute = ts // 1000 // BASE_STEP * BASE_STEP
            if (ts, measure) != last_tick:  # a tick writes many rows with one time
                ticks.setdefault((minute, _FAMILIES[measure]), set()).add(ts)
                last_tick = (ts, measure)
            if measure not in _METRICS_OF:
                continue
            first, second = _values(measure, fields)
            key = (minute, measure, tags.get("namespace", ""), tags.get("pool", ""), tags.get("workload", ""))
            into = rows.get(key)
            if into is None:
                rows[key] = [first, second]
            else:
                into[0] += first
                into[1] += second


class _Batch:
    """Rows read and not yet merged into the tiers: their values summed per (minute, table,
    namespace, pool, workload), and the ticks' times per (minute, role)."""

    def __init__(self) -> None:
        self.rows: dict[tuple[int, str, str, str, str], list[float]] = {}
        self.ticks: dict[tuple[int, str], set[int]] = {}


class FileHistory:
    """The metrics files in one directory (`controller.log`, `hypervisor.log` and their rotations)."""

    def __init__(self, directory: Path, *, names: Sequence[str] = ("controller.log", "hypervisor.log"),
                 clock: Callable[[], float] = time.time) -> None:
        self.directory = directory
        self.name = f"files: {directory}"
        self.clock = clock
        self._labels: dict[str, str] = {}
        self.followers = [_FileFollower(directory, name, clock, self._labels) for name in names]
        self._lock = threading.Lock()

    async def query(self, metric: Metric, group_by: GroupBy, since: float, until: float, step: float, *,
                    top: int = 8) -> History:
        check_query(metric, group_by, since, until, step, top)
        return await anyio.to_thread.run_sync(self.answer, metric, group_by, since, until, step, top)

    def answer(self, metric: Metric, group_by: GroupBy, since: float, until: float, step: float,
               top: int = 8) -> History:
        """Blocking: read what was appended, then answer from the sums."""
        check_query(metric, group_by, since, until, step, top)
        with self._lock:
            for follower in self.followers:
                follower.refresh()
            return self._answer(metric, group_by, since, until, step, top)

    def _tier(self, since: float, step: float) -> tuple[int, int]:
        """(tier index, bucket length): the finest tier still holding `since`, its step rounded up to it."""
        now = self.clock()
        tiers = _tiers()
        for index, tier in enumerate(tiers):
            if since >= now - tier.keep or index == len(tiers) - 1:
                return index, max(tier.step, math.ceil(step / tier.step) * tier.step)
        raise AssertionError("unreachable")

    def _answer(self, metric: Metric, group_by: GroupBy, since: float, until: float, step: float,
                top: int) -> History:
        index, bucket = self._tier(since, step)
        family = _FAMILY[metric]
        first = math.floor(since / bucket) * bucket
        ticks: dict[float, set[int]] = {}
        sums: dict[str, dict[float, float]] = {}
        for follower in self.followers:
            tier = follower.tiers[index]
            for start, by_family in tier.ticks.items():
                at = float(start // bucket * bucket)
                if first <= at < until and family in by_family:
                    ticks.setdefault(at, set()).update(by_family[family])
            for start, by_key in tier.sums.items():
                at = float(start // bucket * bucket)
                labels = by_key.get((metric, group_by))
                if labels and first <= at < until:
                    for label, value in labels.items():
                        into = sums.setdefault(label, {})
                        into[at] = into.get(at, 0.0) + value
        if metric not in _SUMMED:
            sums = {label: {at: v / len(ticks[at]) for at, v in by_at.items() if ticks.get(at)}
                    for label, by_at in sums.items()}
        starts = sorted(ticks)
        series = rank(sums, starts, top)
        return History(metric=metric, group_by=group_by, since=since, until=until, step=float(bucket),
                       series=series, source=self.name, note=self._note(bool(starts)))

    def _note(self, has_data: bool) -> str:
        notes = []
        if not has_data:
            if not any(f.position for f in self.followers):
                names = ", ".join(f.name for f in self.followers)
                notes.append(f"no metrics files ({names}) in {self.directory} yet")
            else:
                notes.append(NO_DATA)
        otel = sum(f.otel_lines for f in self.followers)
        if otel:
            notes.append(f"{otel} otel line(s) skipped: the console reads the influx and json formats only")
        bad = sum(f.bad_lines for f in self.followers)
        if bad:
            notes.append(f"{bad} unreadable line(s) skipped")
        return "; ".join(notes)


def file_history(directory: Path, *, clock: Callable[[], float] = time.time) -> HistorySource:
    """The metrics files in `directory` (controller.log, hypervisor.log and their rotations)."""
    return FileHistory(directory, clock=clock)


# --- Prometheus --------------------------------------------------------------------------------------

_BY: dict[GroupBy, str] = {"namespace": "namespace", "pool": "pool", "workload": "namespace, workload"}
#: the families tfusion/metrics/prometheus.py exports for each metric (cost is a counter: `_total`)
_SERIES: dict[Metric, str] = {
    "cost": "tfusion_worker_cost_total",
    "tflops_requested": "tfusion_worker_tflops_request * tfusion_worker_gpus",
    "tflops_used": "tfusion_worker_compute_used_tflops",
    "vram_used": "tfusion_worker_memory_used_bytes",
}


def promql(metric: Metric, group_by: GroupBy, step: float) -> str:
    """The query whose value at time t is the bucket (t - step, t]."""
    window = f"{max(1, round(step))}s"
    if metric in _SUMMED:
        return f"sum by ({_BY[group_by]}) (increase({_SERIES[metric]}[{window}]))"
    return f"avg_over_time((sum by ({_BY[group_by]}) ({_SERIES[metric]}))[{window}:])"


class PrometheusHistory:
    """Prometheus's range query API over the families both roles export."""

    def __init__(self, url: str, *, timeout_s: float = 10.0, transport: httpx.AsyncBaseTransport | None = None,
                 ) -> None:
        self.url = url.rstrip("/")
        self.name = f"prometheus: {self.url}"
        self.timeout_s = timeout_s
        self.transport = transport

    async def query(self, metric: Metric, group_by: GroupBy, since: float, until: float, step: float, *,
                    top: int = 8) -> History:
        check_query(metric, group_by, since, until, step, top)
        step = float(max(1, round(step)))
        first_end = math.floor(since / step) * step + step
        params = {"query": promql(metric, group_by, step), "start": repr(first_end),
                  "end": repr(max(first_end, until)), "step": f"{step:g}"}
        result = await self._get("/api/v1/query_range", params)
        sums: dict[str, dict[float, float]] = {}
        starts: set[float] = set()
        for row in result:
            labels = row.get("metric") or {}
            label = group_label(group_by, labels.get("namespace", ""), labels.get("pool", ""),
                                labels.get("workload", ""))
            into = sums.setdefault(label, {})
            for at, text in row.get("values") or []:
                value = float(text)
                if math.isfinite(value):
                    into[float(at) - step] = into.get(float(at) - step, 0.0) + value
                    starts.add(float(at) - step)
        series = rank(sums, sorted(starts), top)
        return History(metric=metric, group_by=group_by, since=since, until=until, step=step, series=series,
                       source=self.name, note="" if starts else NO_DATA)

    async def _get(self, path: str, params: Mapping[str, str]) -> list[dict[str, Any]]:
        try:
            async with httpx.AsyncClient(timeout=self.timeout_s, transport=self.transport) as http:
                response = await http.get(self.url + path, params=params)
        except httpx.HTTPError as exc:
            raise HistoryError(f"{self.name}: cannot reach it: {type(exc).__name__}: {exc}") from None
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise HistoryError(f"{self.name}: HTTP {response.status_code}, not a Prometheus API answer: "
                               f"{response.text[:200]!r}")
        if body.get("status") != "success":
            raise HistoryError(f"{self.name}: {body.get('errorType') or response.status_code}: "
                               f"{body.get('error') or response.text[:200]}")
        data = body.get("data")
        if not isinstance(data, dict) or data.get("resultType") != "matrix" or not isinstance(data.get("result"), list):
            raise HistoryError(f"{self.name}: expected a matrix result, got {str(data)[:200]}")
        return [row for row in data["result"] if isinstance(row, dict)]


def prometheus_history(url: str) -> HistorySource:
    """Prometheus at `url` (its base URL, e.g. http://prometheus:9090) scraping tfusion's /metrics."""
    return PrometheusHistory(url)


# --- InfluxDB 1.x ------------------------------------------------------------------------------------

#: a table written once per tick by each role, whose rows count the ticks (per node for hypervisors)
_TICK_TABLES: dict[str, tuple[str, str]] = {"controller": ("tf_system_metrics", "total_nodes_cnt"),
                                            "hypervisor": ("tf_gpu_usage", "memory_bytes")}
_INFLUX_TAGS = '"namespace", "pool", "workload", "node"'


def influxql(metric: Metric, since_ms: int, until_ms: int, step: int) -> tuple[str, str]:
    """(values, ticks): the sum per bucket, group tags and node; the ticks per bucket and node (a
    tick's rows share one timestamp, and ticks are at least a second apart)."""
    where = f"time >= {since_ms}ms AND time < {until_ms}ms"
    group = f"GROUP BY time({step}s), {_INFLUX_TAGS} fill(none)"
    if metric == "cost":
        values = f'SELECT sum("raw_cost") AS "v" FROM "{WORKER_TABLE}" WHERE {where} {group}'
    elif metric == "tflops_requested":
        values = (f'SELECT sum("p") AS "v" FROM (SELECT "tflops_request" * "gpu_count" AS "p" FROM "{WORKER_TABLE}" '
                  f'WHERE {where} GROUP BY {_INFLUX_TAGS}) WHERE {where} {group}')
    else:
        field = "compute_tflops" if metric == "tflops_used" else "memory_bytes"
        values = f'SELECT sum("{field}") AS "v" FROM "{WORKER_USAGE_TABLE}" WHERE {where} {group}'
    table, field = _TICK_TABLES[_FAMILY[metric]]
    ticks = (f'SELECT count("c") AS "n" FROM (SELECT count("{field}") AS "c" FROM "{table}" WHERE {where} '
             f'GROUP BY time(1s), "node" fill(none)) WHERE {where} GROUP BY time({step}s), "node" fill(none)')
    return values, ticks


class InfluxHistory:
    """InfluxDB 1.x (InfluxQL over `/query`) holding the tables the roles push. With several
    hypervisors each node's ticks are its own: a group's mean is summed over the nodes' means."""

    def __init__(self, url: str, database: str, *, timeout_s: float = 10.0,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.url = url.rstrip("/")
        self.database = database
        self.name = f"influxdb: {self.url} (database {database})"
        self.timeout_s = timeout_s
        self.transport = transport

    async def query(self, metric: Metric, group_by: GroupBy, since: float, until: float, step: float, *,
                    top: int = 8) -> History:
        check_query(metric, group_by, since, until, step, top)
        seconds = max(1, round(step))
        first = math.floor(since / seconds) * seconds
        values_q, ticks_q = influxql(metric, first * 1000, math.ceil(until * 1000), seconds)
        ticks: dict[tuple[float, str], float] = {}
        for tags, at, count in await self._series(ticks_q):
            ticks[(at, tags.get("node", ""))] = count
        sums: dict[str, dict[float, float]] = {}
        for tags, at, value in await self._series(values_q):
            count = ticks.get((at, tags.get("node", ""))) or 0.0
            if not count:
                continue  # no tick of that node in the bucket: nothing to average over
            label = group_label(group_by, tags.get("namespace", ""), tags.get("pool", ""), tags.get("workload", ""))
            into = sums.setdefault(label, {})
            into[at] = into.get(at, 0.0) + (value if metric in _SUMMED else value / count)
        starts = sorted({at for at, _ in ticks})
        return History(metric=metric, group_by=group_by, since=since, until=until, step=float(seconds),
                       series=rank(sums, starts, top), source=self.name, note="" if starts else NO_DATA)

    async def _series(self, query: str) -> list[tuple[dict[str, str], float, float]]:
        """(tags, bucket start in seconds, value) of every row of the one statement's answer."""
        try:
            async with httpx.AsyncClient(timeout=self.timeout_s, transport=self.transport) as http:
                response = await http.post(f"{self.url}/query", params={"db": self.database, "epoch": "ms"},
                                           data={"q": query})
        except httpx.HTTPError as exc:
            raise HistoryError(f"{self.name}: cannot reach it: {type(exc).__name__}: {exc}") from None
        try:
            body = response.json()
        except ValueError:
            body = None
        results = body.get("results") if isinstance(body, dict) else None
        if not isinstance(results, list) or not results or not isinstance(results[0], dict):
            why = body.get("error") if isinstance(body, dict) and body.get("error") else response.text[:200]
            raise HistoryError(f"{self.name}: HTTP {response.status_code}, not an InfluxDB answer: {why}")
        if results[0].get("error"):
            raise HistoryError(f"{self.name}: {results[0]['error']}")
        rows = []
        for series in results[0].get("series") or []:
            tags = {str(k): str(v) for k, v in (series.get("tags") or {}).items()}
            for at, value in series.get("values") or []:
                if isinstance(value, int | float) and math.isfinite(value):
                    rows.append((tags, at / 1000, float(value)))
        return rows


def influx_history(url: str, database: str) -> HistorySource:
    """InfluxDB 1.x at `url` (e.g. http://influxdb:8086), database `database`, holding the pushed tables."""
    return InfluxHistory(url, database)


def window(name: str, now: float) -> tuple[float, float, float]:
    """(since, until, step) of a named window ending at `now`; ValueError for an unknown name."""
    if name not in WINDOWS:
        raise ValueError(f"window {name!r}: expected one of {', '.join(WINDOWS)}")
    length, step = WINDOWS[name]
    return now - length, now, step

