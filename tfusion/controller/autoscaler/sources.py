"""Where the autoscaler's per-worker GPU usage samples come from (`--autoscaler-usage-source`).

Every source yields the `tf_worker_usage` rows: one `UsageSample` per (worker pod, GPU) and time,
with TFLOPS in milli-TFLOPS and memory in bytes. Rows without a workload are skipped (the tables
write the placeholder "unknown" for those, so a workload literally named "unknown" is skipped too).
`worker` is the pod's name in every source: Prometheus has no UID label.

- `hypervisor` (default): `GET /api/v1/usage` on each Running GPUNode's hypervisor (the Node's
  InternalIP and --port, as the drift audit reaches it), a bounded number at a time, each with a
  bounded timeout. It keeps no history (`keeps_history` False): it answers the usage now, and the
  autoscaler keeps its own checkpoint. One unreachable hypervisor is skipped with a log line rather
  than failing the pass: a node that is down or being drained must not stop every other workload's
  recommendation (its workers simply add no samples this time; the GPUNode reconciler reports the
  node). Only when every hypervisor fails is it an error, since then nothing was measured.
- `prometheus`: PromQL `query_range` over the hypervisors' `tfusion_worker_compute_used_tflops` and
  `tfusion_worker_memory_used_bytes` for (since, until], at a step that keeps each series at most
  `MAX_POINTS` points, the two joined per (namespace, workload, pod, gpu, time).
- `influxdb` (1.x): InfluxQL over the `tf_worker_usage` measurement the hypervisor pushes.
- `greptimedb`: SQL over GreptimeDB's HTTP API (`POST /v1/sql?db=`) on the `tf_worker_usage` table
  its InfluxDB line-protocol endpoint made (time index `greptime_timestamp`).

Every answer is read up to `MAX_RESPONSE_BYTES` within a timeout; every failure (unreachable,
an error status, an answer of another shape, more rows than allowed) raises `UsageSourceError`
saying what and where. Identifiers are quoted and values escaped in each query language.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import anyio
import httpx
import msgspec
import orjson

from tfusion.controller.hypervisors import HYPERVISOR_TIMEOUT_S, hypervisor_urls
from tfusion.metrics.usage import WorkerUsageList
from tfusion.settings import Settings

if TYPE_CHECKING:
    from tfusion.controller.runtime import ControllerRuntime

log = logging.getLogger(__name__)
T = TypeVar("T")

TABLE = "tf_worker_usage"
#: the tables' workload tag for a worker without one
NO_WORKLOAD = "unknown"
COMPUTE_FIELD, MEMORY_FIELD = "compute_tflops", "memory_bytes"
PROM_COMPUTE = "tfusion_worker_compute_used_tflops"
PROM_MEMORY = "tfusion_worker_memory_used_bytes"
GREPTIME_TIME = "greptime_timestamp"
#: the most bytes one answer may have (a week of 30 s samples of a few thousand workers fits)
MAX_RESPONSE_BYTES = 64 * 1024 * 1024
#: answers from this size on are parsed in a worker thread
THREAD_PARSE_BYTES = 256 * 1024
#: the most rows one history query may return; beyond it the pass fails instead of silently truncating
MAX_ROWS = 2_000_000
#: Prometheus: the most points one series may have in a range (its own limit is 11,000)
MAX_POINTS = 1000
QUERY_TIMEOUT_S = 30.0
#: hypervisors asked at once
HYPERVISOR_CONCURRENCY = 16


class UsageSourceError(Exception):
    """A usage source could not answer; the message says which source, where and why."""


@dataclass(frozen=True)
class UsageSample:
    """One worker pod's use of one GPU at `at` (unix seconds)."""

    at: float
    namespace: str
    workload: str
    worker: str  # the worker pod's name
    tflops_milli: float
    vram_bytes: float
    gpu: str = ""  # the GPU's UUID


class UsageSource(Protocol):
    name: str
    keeps_history: bool

    async def samples(self, since: float, until: float) -> list[UsageSample]:
        """History sources: the rows in (since, until]; the hypervisor source: the usage now."""
        ...


# --- HTTP, bounded --------------------------------------------------------------------------------

async def _fetch(http: httpx.AsyncClient, what: str, method: str, url: str, **kwargs: Any) -> bytes:
    """The body of a 200 answer, read up to MAX_RESPONSE_BYTES; UsageSourceError otherwise."""
    try:
        async with http.stream(method, url, **kwargs) as response:
            chunks, size = [], 0
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > MAX_RESPONSE_BYTES:
                    raise UsageSourceError(f"{what}: {url} answered more than {MAX_RESPONSE_BYTES} bytes; "
                                           "shorten the history period")
                chunks.append(chunk)
            body = b"".join(chunks)
            if response.status_code != 200:
                raise UsageSourceError(f"{what}: {url} answered {response.status_code}: "
                                       f"{body[:500].decode(errors='replace')}")
            return body
    except httpx.TimeoutException:
        raise UsageSourceError(f"{what}: {url} did not answer within {http.timeout.read} s") from None
    except httpx.HTTPError as exc:
        raise UsageSourceError(f"{what}: cannot reach {url}: {exc}") from None


def _json(what: str, body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise UsageSourceError(f"{what}: the answer is not JSON: {exc}") from None


async def parsed_answer(what: str, body: bytes, parse: Callable[[str, Any], T]) -> T:
    """`parse` of the JSON answer; a large one in a worker thread, so the event loop (Lease renewals,
    the API) never waits on megabytes of history."""
    if len(body) < THREAD_PARSE_BYTES:
        return parse(what, _json(what, body))
    return await anyio.to_thread.run_sync(lambda: parse(what, _json(what, body)))


def _base(url: str) -> str:
    return url.rstrip("/")


def _ms(at: float) -> int:
    """Unix seconds as whole milliseconds (the push's precision), rounded down."""
    return math.floor(at * 1000)


def _has_workload(workload: str) -> bool:
    return workload not in ("", NO_WORKLOAD)


# --- hypervisor -----------------------------------------------------------------------------------

class HypervisorUsage:
    """The usage now, from each node's hypervisor; see the module docstring."""

    name = "hypervisor"
    keeps_history = False

    def __init__(self, targets: Callable[[], Mapping[str, str]], *, timeout_s: float = HYPERVISOR_TIMEOUT_S,
                 concurrency: int = HYPERVISOR_CONCURRENCY) -> None:
        self.targets = targets  # node name -> hypervisor base URL
        self.timeout_s = timeout_s
        self.concurrency = concurrency

    async def samples(self, since: float, until: float) -> list[UsageSample]:
        answers, problems = await self.gather()
        if problems and not answers:
            raise UsageSourceError("usage source hypervisor: no hypervisor answered: "
                                   + "; ".join(problems[n] for n in sorted(problems)))
        now = time.time()
        return [UsageSample(at=now, namespace=row.namespace, workload=row.workload, worker=row.pod,
                            tflops_milli=row.compute_tflops * 1000, vram_bytes=float(row.memory_bytes), gpu=row.gpu)
                for node in sorted(answers) for row in answers[node].data if _has_workload(row.workload)]

    async def gather(self) -> tuple[dict[str, WorkerUsageList], dict[str, str]]:
        """Every target's answer by node, and why each node that did not answer failed (also what
        the controller's `GET /api/usage` serves)."""
        targets = dict(self.targets())
        answers: dict[str, WorkerUsageList] = {}
        problems: dict[str, str] = {}
        limiter = anyio.CapacityLimiter(self.concurrency)

        async def ask(http: httpx.AsyncClient, node: str, base: str) -> None:
            async with limiter:
                try:
                    answers[node] = await self._node_usage(http, node, base)
                except UsageSourceError as exc:
                    problems[node] = str(exc)
                    log.info("usage source hypervisor: node %s skipped this pass: %s", node, exc)

        async with httpx.AsyncClient(timeout=self.timeout_s) as http, anyio.create_task_group() as tg:
            for node, base in targets.items():
                tg.start_soon(ask, http, node, base)
        return answers, problems

    @staticmethod
    async def _node_usage(http: httpx.AsyncClient, node: str, base: str) -> WorkerUsageList:
        what = f"hypervisor of node {node}"
        body = await _fetch(http, what, "GET", f"{base}/api/v1/usage")
        try:
            return msgspec.json.decode(body, type=WorkerUsageList)
        except msgspec.ValidationError as exc:
            raise UsageSourceError(f"{what}: unexpected answer from {base}/api/v1/usage: {exc}") from None
        except msgspec.DecodeError as exc:
            raise UsageSourceError(f"{what}: the answer of {base}/api/v1/usage is not JSON: {exc}") from None


# --- Prometheus -----------------------------------------------------------------------------------

def promql_string(value: str) -> str:
    """A PromQL double-quoted string literal."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def prometheus_query(metric: str) -> str:
    """One value per (namespace, workload, pod, gpu): a worker scraped through two jobs (the
    controller's /metrics shows the hypervisor's families in --role=all) is counted once."""
    return (f"max by (namespace, workload, pod, gpu) ({metric}{{workload!={promql_string('')},"
            f"workload!={promql_string(NO_WORKLOAD)}}})")


def prometheus_step(since: float, until: float) -> float:
    """Whole seconds, at least 1, and at most MAX_POINTS points in (since, until]."""
    return float(max(1, math.ceil((until - since) / MAX_POINTS)))


def prometheus_range(since: float, until: float, step: float) -> tuple[str, str]:
    """`start` and `end` in whole milliseconds (never after `until`): steps counted back from the end,
    so the newest point is at `until` (a coarse step counted from `since` could stop up to a step
    before it and miss the recent samples), the first one after `since`."""
    since_ms, end_ms, step_ms = _ms(since), _ms(until), round(step * 1000)
    start_ms = end_ms - (end_ms - since_ms) // step_ms * step_ms
    if start_ms <= since_ms:
        start_ms += step_ms
    return f"{start_ms / 1000:.3f}", f"{end_ms / 1000:.3f}"


class PrometheusUsage:
    """History from Prometheus' `query_range`; see the module docstring."""

    name = "prometheus"
    keeps_history = True

    def __init__(self, url: str, *, timeout_s: float = QUERY_TIMEOUT_S) -> None:
        self.url = _base(url)
        self.timeout_s = timeout_s

    async def samples(self, since: float, until: float) -> list[UsageSample]:
        if until <= since:
            return []
        step = prometheus_step(since, until)
        async with httpx.AsyncClient(timeout=self.timeout_s) as http:
            compute = await self._series(http, PROM_COMPUTE, since, until, step)
            memory = await self._series(http, PROM_MEMORY, since, until, step)
        rows = [UsageSample(at=key[4], namespace=key[0], workload=key[1], worker=key[2],
                            tflops_milli=value * 1000, vram_bytes=memory[key], gpu=key[3])
                for key, value in compute.items() if key in memory and key[4] > since]
        rows.sort(key=lambda s: (s.at, s.namespace, s.workload, s.worker, s.gpu))
        return rows

    async def _series(self, http: httpx.AsyncClient, metric: str, since: float, until: float, step: float,
                      ) -> dict[tuple[str, str, str, str, float], float]:
        what = f"usage source prometheus ({metric})"
        start, end = prometheus_range(since, until, step)
        body = await _fetch(http, what, "POST", f"{self.url}/api/v1/query_range", data={
            "query": prometheus_query(metric), "start": start, "end": end, "step": f"{step:g}"})
        return await parsed_answer(what, body, parse_prometheus_matrix)


def parse_prometheus_matrix(what: str, answer: Any) -> dict[tuple[str, str, str, str, float], float]:
    """(namespace, workload, pod, gpu, at) -> value from a `query_range` answer."""
    try:
        if answer["status"] != "success" or answer["data"]["resultType"] != "matrix":
            raise UsageSourceError(f"{what}: Prometheus answered {str(answer)[:500]}")
        values: dict[tuple[str, str, str, str, float], float] = {}
        for series in answer["data"]["result"]:
            labels = series["metric"]
            ident = (str(labels.get("namespace", "")), str(labels.get("workload", "")), str(labels.get("pod", "")),
                     str(labels.get("gpu", "")))
            for at, value in series["values"]:
                values[(*ident, float(at))] = float(value)
                if len(values) > MAX_ROWS:
                    raise UsageSourceError(f"{what}: more than {MAX_ROWS} points; shorten the history period")
        return values
    except (KeyError, TypeError, ValueError) as exc:
        raise UsageSourceError(f"{what}: unexpected answer shape ({type(exc).__name__}: {exc})") from None


# --- InfluxDB 1.x ---------------------------------------------------------------------------------

def influx_ident(name: str) -> str:
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def influx_string(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def influx_query(since: float, until: float) -> str:
    """InfluxQL for the rows in (since, until], in whole milliseconds (the push's precision)."""
    tags = ", ".join(influx_ident(t) for t in ("namespace", "workload", "pod_name", "uuid"))
    workload = influx_ident("workload")
    return (f"SELECT {influx_ident(COMPUTE_FIELD)}, {influx_ident(MEMORY_FIELD)} FROM {influx_ident(TABLE)} "
            f"WHERE time > {_ms(since)}ms AND time <= {_ms(until)}ms AND {workload} != {influx_string('')} "
            f"AND {workload} != {influx_string(NO_WORKLOAD)} GROUP BY {tags}")


class InfluxUsage:
    """History from InfluxDB 1.x; see the module docstring."""

    name = "influxdb"
    keeps_history = True

    def __init__(self, url: str, database: str, *, timeout_s: float = QUERY_TIMEOUT_S) -> None:
        self.url = _base(url)
        self.database = database
        self.timeout_s = timeout_s

    async def samples(self, since: float, until: float) -> list[UsageSample]:
        what = f"usage source influxdb (database {self.database!r})"
        async with httpx.AsyncClient(timeout=self.timeout_s) as http:
            body = await _fetch(http, what, "POST", f"{self.url}/query",
                                params={"db": self.database, "epoch": "ms"}, data={"q": influx_query(since, until)})
        return await parsed_answer(what, body, parse_influx)


def parse_influx(what: str, answer: Any) -> list[UsageSample]:
    try:
        if answer.get("error"):
            raise UsageSourceError(f"{what}: InfluxDB answered: {answer['error']}")
        (result,) = answer["results"]
        if result.get("error"):
            raise UsageSourceError(f"{what}: InfluxDB answered: {result['error']}")
        if result.get("partial"):
            raise UsageSourceError(f"{what}: InfluxDB returned a partial result (its max-row-limit); "
                                   "shorten the history period")
        rows = []
        for series in result.get("series") or []:
            tags, columns = series.get("tags") or {}, series["columns"]
            at_i, cpu_i, mem_i = columns.index("time"), columns.index(COMPUTE_FIELD), columns.index(MEMORY_FIELD)
            if not _has_workload(str(tags.get("workload", ""))):
                continue
            for row in series["values"]:
                if row[cpu_i] is None or row[mem_i] is None:
                    continue
                rows.append(UsageSample(at=row[at_i] / 1000, namespace=str(tags.get("namespace", "")),
                                        workload=str(tags["workload"]), worker=str(tags.get("pod_name", "")),
                                        tflops_milli=float(row[cpu_i]) * 1000, vram_bytes=float(row[mem_i]),
                                        gpu=str(tags.get("uuid", ""))))
                if len(rows) > MAX_ROWS:
                    raise UsageSourceError(f"{what}: more than {MAX_ROWS} rows; shorten the history period")
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise UsageSourceError(f"{what}: unexpected answer shape ({type(exc).__name__}: {exc})") from None
    rows.sort(key=lambda s: (s.at, s.namespace, s.workload, s.worker, s.gpu))
    return rows


# --- GreptimeDB -----------------------------------------------------------------------------------

def sql_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def sql_string(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


GREPTIME_COLUMNS = (GREPTIME_TIME, "namespace", "workload", "pod_name", "uuid", COMPUTE_FIELD, MEMORY_FIELD)


def greptime_query(since: float, until: float) -> str:
    """SQL for the rows in (since, until] (whole milliseconds), at most MAX_ROWS + 1 (to tell "too many")."""
    ts, workload = sql_ident(GREPTIME_TIME), sql_ident("workload")
    return (f"SELECT {', '.join(sql_ident(c) for c in GREPTIME_COLUMNS)} FROM {sql_ident(TABLE)} "
            f"WHERE {ts} > to_timestamp_millis({_ms(since)}) AND {ts} <= to_timestamp_millis({_ms(until)}) "
            f"AND {workload} NOT IN ({sql_string('')}, {sql_string(NO_WORKLOAD)}) "
            f"ORDER BY {ts} LIMIT {MAX_ROWS + 1}")


#: a GreptimeDB timestamp type -> its JSON integers per second
_TIME_UNITS = {"TimestampSecond": 1, "TimestampMillisecond": 1000, "TimestampMicrosecond": 1_000_000,
               "TimestampNanosecond": 1_000_000_000}


class GreptimeUsage:
    """History from GreptimeDB's SQL over HTTP; see the module docstring."""

    name = "greptimedb"
    keeps_history = True

    def __init__(self, url: str, database: str, *, timeout_s: float = QUERY_TIMEOUT_S) -> None:
        self.url = _base(url)
        self.database = database
        self.timeout_s = timeout_s

    def request(self, since: float, until: float) -> tuple[str, dict[str, str], dict[str, str]]:
        """The URL, query parameters and form of the query (what `samples` POSTs)."""
        return f"{self.url}/v1/sql", {"db": self.database}, {"sql": greptime_query(since, until)}

    async def samples(self, since: float, until: float) -> list[UsageSample]:
        what = f"usage source greptimedb (database {self.database!r})"
        url, params, form = self.request(since, until)
        async with httpx.AsyncClient(timeout=self.timeout_s) as http:
            body = await _fetch(http, what, "POST", url, params=params, data=form)
        return await parsed_answer(what, body, parse_greptime)


def _greptime_time(value: Any, per_second: int) -> float:
    if isinstance(value, str):  # some versions render timestamps as text; without a zone it is UTC
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()
    return int(value) / per_second


def greptime_records(what: str, answer: Any) -> tuple[list[str], dict[str, str], list[list[Any]]]:
    """A GreptimeDB `/v1/sql` answer's one result: column names, their types, the rows. Raises
    UsageSourceError for an error answer; a wrong shape raises KeyError/TypeError/ValueError."""
    if answer.get("error") or answer.get("code", 0) not in (0, None):
        raise UsageSourceError(f"{what}: GreptimeDB answered: {answer.get('error') or answer}")
    (output,) = answer["output"]
    records = output["records"]
    schema = records["schema"]["column_schemas"]
    return [c["name"] for c in schema], {c["name"]: c["data_type"] for c in schema}, records["rows"]


def parse_greptime(what: str, answer: Any) -> list[UsageSample]:
    try:
        columns, types, rows = greptime_records(what, answer)
        per_second = _TIME_UNITS[types[GREPTIME_TIME]]
        index = {name: columns.index(name) for name in GREPTIME_COLUMNS}
        if len(rows) > MAX_ROWS:
            raise UsageSourceError(f"{what}: more than {MAX_ROWS} rows; shorten the history period")
        samples = [_greptime_sample(row, index, per_second) for row in rows]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise UsageSourceError(f"{what}: unexpected answer shape ({type(exc).__name__}: {exc})") from None
    return [sample for sample in samples if sample is not None]


def _greptime_sample(row: list[Any], index: Mapping[str, int], per_second: int) -> UsageSample | None:
    """A row as a sample; None for a row without a workload or with an empty field."""
    def text(column: str) -> str:
        return str(row[index[column]] or "")

    compute, memory = row[index[COMPUTE_FIELD]], row[index[MEMORY_FIELD]]
    if not _has_workload(text("workload")) or compute is None or memory is None:
        return None
    return UsageSample(at=_greptime_time(row[index[GREPTIME_TIME]], per_second), namespace=text("namespace"),
                       workload=text("workload"), worker=text("pod_name"), tflops_milli=float(compute) * 1000,
                       vram_bytes=float(memory), gpu=text("uuid"))


# --- choosing one ---------------------------------------------------------------------------------

def usage_source(settings: Settings, runtime: ControllerRuntime) -> UsageSource:
    """The source `--autoscaler-usage-source` names (Settings.load already refused a history source
    without --autoscaler-usage-url)."""
    kind, url = settings.autoscaler_usage_source, settings.autoscaler_usage_url
    database = settings.autoscaler_usage_database or settings.metrics_push_database
    if kind == "hypervisor":
        return HypervisorUsage(lambda: hypervisor_urls(runtime))
    if not url:
        raise UsageSourceError(f"--autoscaler-usage-source={kind} needs --autoscaler-usage-url")
    if kind == "prometheus":
        return PrometheusUsage(url)
    if kind == "influxdb":
        return InfluxUsage(url, database)
    if kind == "greptimedb":
        return GreptimeUsage(url, database)
    raise UsageSourceError(f"--autoscaler-usage-source={kind!r} is not one of hypervisor, prometheus, influxdb, "
                           "greptimedb")
