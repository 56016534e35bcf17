"""Where metrics lines go: a size-capped rotating file and/or an HTTP push to a time-series database.

Why: the original appends to a file that a Vector sidecar ships to GreptimeDB. tfusion keeps the
file (same rotation idea: size cap, a few backups, backups older than `metricsTTL` removed) and can
also push the lines itself to GreptimeDB's InfluxDB line-protocol endpoint or an InfluxDB 1.x
`/write` URL, so no sidecar is needed. A slow or absent database must never block or crash a role:
`PushSender.offer` only appends to a bounded in-memory buffer; a background task sends batches,
retries failures with exponential backoff and keeps the failed batch at the head of the buffer, and
when the buffer is full the oldest lines are dropped and counted in `tfusion_metrics_dropped_total`.
"""

from __future__ import annotations

import base64
import collections
import logging
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import anyio
import httpx
from prometheus_client import CollectorRegistry, Counter, Gauge

from tfusion.kube.backoff import Backoff, Failures
from tfusion.kube.pacing import batches, paced
from tfusion.metrics.points import Point, encode
from tfusion.settings import Settings, parse_duration

log = logging.getLogger(__name__)

ROTATE_BYTES = 100 * 1024 * 1024
ROTATE_BACKUPS = 10
PUSH_BATCH_LINES = 5000
PUSH_TIMEOUT_S = 10.0
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 30.0
BACKOFF = Backoff(base=BACKOFF_FIRST_S, cap=BACKOFF_MAX_S)


class SinkMetrics:
    """The `tfusion_metrics_*` families, one set per Prometheus registry (in --role=all the
    controller and the hypervisor share the Manager's registry; `role` tells them apart)."""

    _by_registry: weakref.WeakKeyDictionary[CollectorRegistry, SinkMetrics] = weakref.WeakKeyDictionary()

    def __init__(self, registry: CollectorRegistry) -> None:
        self.lines = Counter("tfusion_metrics_lines", "metrics lines written, by role and sink (file, push)",
                             ["role", "sink"], registry=registry)
        self.dropped = Counter("tfusion_metrics_dropped", "metrics lines lost, by role and reason (buffer_full: "
                               "the push buffer overflowed; rejected: the database refused the batch; "
                               "file_error: the file could not be written)", ["role", "reason"], registry=registry)
        self.push_errors = Counter("tfusion_metrics_push_errors", "failed push attempts (each is retried)",
                                   ["role"], registry=registry)
        self.buffered = Gauge("tfusion_metrics_push_buffered_lines", "lines waiting to be pushed", ["role"],
                              registry=registry)

    @classmethod
    def of(cls, registry: CollectorRegistry) -> SinkMetrics:
        found = cls._by_registry.get(registry)
        if found is None:
            found = cls._by_registry[registry] = cls(registry)
        return found


class RotatingFile:
    """Appends lines to `path`; past `max_bytes` the file becomes `path.1` (older ones shift up,
    `backups` kept). Backups older than `ttl_s` (when set) are removed at rotation time."""

    def __init__(self, path: Path, *, max_bytes: int = ROTATE_BYTES, backups: int = ROTATE_BACKUPS,
                 ttl_s: float | None = None, create_parent: bool = True) -> None:
        self.path = path
        #: False for a default path outside our state (the original's /logs): never make that directory
        self.create_parent = create_parent
        self.max_bytes = max_bytes
        self.backups = backups
        self.ttl_s = ttl_s

    def write(self, lines: Sequence[str]) -> None:
        """Blocking (call it in a worker thread); raises OSError when the file cannot be written."""
        if not lines:
            return
        if self.create_parent:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._rotate_if_needed()
        with open(self.path, "a", encoding="utf-8") as out:
            out.write("\n".join(lines) + "\n")

    def backup(self, n: int) -> Path:
        return self.path.with_name(f"{self.path.name}.{n}")

    def _rotate_if_needed(self) -> None:
        try:
            if self.path.stat().st_size < self.max_bytes:
                return
        except FileNotFoundError:
            return
        self.backup(self.backups).unlink(missing_ok=True)
        for n in range(self.backups - 1, 0, -1):
            if self.backup(n).exists():
                self.backup(n).replace(self.backup(n + 1))
        self.path.replace(self.backup(1))
        self._expire_backups()

    def _expire_backups(self) -> None:
        if not self.ttl_s:
            return
        oldest = time.time() - self.ttl_s
        for n in range(1, self.backups + 1):
            try:
                if self.backup(n).stat().st_mtime < oldest:
                    self.backup(n).unlink()
            except FileNotFoundError:
                continue


def write_url(url: str, database: str) -> str:
    """The push URL with the database and ms precision in its query (kept when already there):
    `db=` for 1.x-style endpoints (InfluxDB `/write`, GreptimeDB `/v1/influxdb/write`), `bucket=`
    for 2.x-style ones (`.../api/v2/write`)."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    db_key = "bucket" if parts.path.rstrip("/").endswith("/api/v2/write") else "db"
    if database:
        query.setdefault(db_key, database)
    query.setdefault("precision", "ms")
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(query), parts.fragment))


@dataclass(frozen=True)
class PushConfig:
    """Where and how to push: `url` is the database's write endpoint."""

    url: str
    database: str = "public"
    user: str = ""
    password: str = ""
    buffer_lines: int = 100_000
    batch_lines: int = PUSH_BATCH_LINES
    timeout_s: float = PUSH_TIMEOUT_S
    backoff_first_s: float = BACKOFF_FIRST_S
    backoff_max_s: float = BACKOFF_MAX_S


class PushSender:
    """The bounded buffer and its sender task (`run`); see the module docstring."""

    def __init__(self, config: PushConfig, metrics: SinkMetrics, role: str) -> None:
        self.config = config
        self.url = write_url(config.url, config.database)
        self.metrics = metrics
        self.role = role
        self._buffer: collections.deque[str] = collections.deque()
        self._wake = anyio.Event()
        self.sent = 0
        self.failures = 0
        self.last_error = ""
        #: metricsTTL as written ("30d"): GreptimeDB applies it to the tables it creates on first write
        #: (the `x-greptime-hints` header; other databases ignore the header)
        self.ttl = ""

    def __len__(self) -> int:
        return len(self._buffer)

    def offer(self, lines: Sequence[str]) -> None:
        """Queue lines for the sender; never blocks. Overflow drops the oldest lines (counted)."""
        self._buffer.extend(lines)
        overflow = len(self._buffer) - self.config.buffer_lines
        if overflow > 0:
            for _ in range(overflow):
                self._buffer.popleft()
            self.metrics.dropped.labels(self.role, "buffer_full").inc(overflow)
            log.warning("metrics push buffer full (%d lines): dropped the %d oldest", self.config.buffer_lines,
                        overflow)
        self.metrics.buffered.labels(self.role).set(len(self._buffer))
        self._wake.set()

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "text/plain; charset=utf-8"}
        if self.ttl:
            headers["x-greptime-hints"] = f"ttl={self.ttl}"
        if self.config.user:
            token = base64.b64encode(f"{self.config.user}:{self.config.password}".encode()).decode()
            headers["Authorization"] = f"Basic {token}"
        return headers

    async def run(self) -> None:
        """Send until cancelled. A batch leaves the buffer only once the database took it (2xx) or
        refused it for good (4xx other than 408/429: it would be refused forever)."""
        retry = Failures(Backoff(base=self.config.backoff_first_s, cap=self.config.backoff_max_s))
        async with httpx.AsyncClient(timeout=self.config.timeout_s) as http:
            while True:
                if not self._buffer:
                    self._wake = anyio.Event()
                    await self._wake.wait()
                    continue
                batch = [self._buffer[i] for i in range(min(len(self._buffer), self.config.batch_lines))]
                outcome = await self._send(http, batch)
                if outcome == "retry":
                    self.failures += 1
                    self.metrics.push_errors.labels(self.role).inc()
                    await anyio.sleep(retry.fail())
                    continue
                retry.reset()
                self._take(batch, outcome)

    def _take(self, batch: list[str], outcome: str) -> None:
        """Remove the batch from the head of the buffer (unless overflow already dropped its lines)."""
        for line in batch:
            if self._buffer and self._buffer[0] is line:
                self._buffer.popleft()
        if outcome == "sent":
            self.sent += len(batch)
            self.metrics.lines.labels(self.role, "push").inc(len(batch))
        else:
            self.metrics.dropped.labels(self.role, "rejected").inc(len(batch))
        self.metrics.buffered.labels(self.role).set(len(self._buffer))

    async def _send(self, http: httpx.AsyncClient, batch: list[str]) -> str:
        try:
            response = await http.post(self.url, content="\n".join(batch).encode(), headers=self._headers())
        except httpx.HTTPError as exc:
            self._note_error(f"{type(exc).__name__}: {exc}")
            return "retry"
        if response.is_success:
            self.last_error = ""
            return "sent"
        self._note_error(f"HTTP {response.status_code}: {response.text[:300]}")
        if 400 <= response.status_code < 500 and response.status_code not in (408, 429):
            log.error("metrics push to %s refused %d line(s) for good: %s", self.url, len(batch), self.last_error)
            return "rejected"
        return "retry"

    def _note_error(self, message: str) -> None:
        if message != self.last_error:
            log.warning("metrics push to %s failed (retrying with backoff): %s", self.url, message)
        self.last_error = message


#: points encoded between two turns of a paced encoding
ENCODE_BATCH = 512


async def encode_paced(points: Sequence[Point], fmt: str) -> list[str]:
    """`encode`, giving the event loop turns (kube/pacing.py): a controller's tick at 100,000 pods
    is 200,000 points. An OTLP document is one line, encoded at once."""
    if fmt == "otel":
        return encode(points, fmt)
    lines: list[str] = []
    async for batch in paced(batches(points, ENCODE_BATCH)):
        lines += encode(batch, fmt)
    return lines


class MetricsOutput:
    """One role's metrics transports: `emit(points)` writes the file (in `fmt`) and queues the
    push (always line protocol: the endpoints take nothing else). Run `run()` in the role's task
    group for the push sender; without a push URL it returns at once."""

    def __init__(self, *, role: str, registry: CollectorRegistry, file: RotatingFile | None = None,
                 push: PushConfig | None = None, fmt: str = "influx") -> None:
        self.role = role
        self.metrics = SinkMetrics.of(registry)
        self.file = file
        self.sender = PushSender(push, self.metrics, role) if push is not None else None
        self.fmt = fmt
        self._file_error = ""

    def set_ttl(self, ttl: str) -> None:
        """metricsTTL ("30d"; "" for none): old file backups are removed, and GreptimeDB gets it as the
        TTL of the tables it creates."""
        try:
            seconds = parse_duration(ttl) if ttl else 0.0
        except ValueError:
            seconds, ttl = 0.0, ""
        if self.file is not None:
            self.file.ttl_s = seconds or None
        if self.sender is not None:
            self.sender.ttl = ttl if seconds else ""

    async def emit(self, points: Sequence[Point]) -> None:
        if not points:
            return
        influx = await encode_paced(points, "influx") if self.sender is not None else None
        if self.sender is not None and influx is not None:
            self.sender.offer(influx)
        if self.file is not None:
            lines = influx if influx is not None and self.fmt == "influx" else await encode_paced(points, self.fmt)
            try:
                await anyio.to_thread.run_sync(self.file.write, lines)
            except OSError as exc:
                self.metrics.dropped.labels(self.role, "file_error").inc(len(lines))
                if str(exc) != self._file_error:
                    log.warning("cannot write metrics to %s: %s", self.file.path, exc)
                self._file_error = str(exc)
            else:
                self._file_error = ""
                self.metrics.lines.labels(self.role, "file").inc(len(lines))

    async def run(self) -> None:
        if self.sender is not None:
            await self.sender.run()


def push_config(settings: Settings) -> PushConfig | None:
    """The push target from --metrics-push-url and friends; None when no URL is set."""
    if not settings.metrics_push_url:
        return None
    password = ""
    if settings.metrics_push_password_file:
        path = Path(settings.metrics_push_password_file).expanduser()
        try:
            password = path.read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"--metrics-push-password-file={path}: cannot read it: {exc}") from None
    return PushConfig(url=settings.metrics_push_url, database=settings.metrics_push_database,
                      user=settings.metrics_push_user, password=password,
                      buffer_lines=settings.metrics_push_buffer)
