"""Alerting: the facts the shipped Prometheus rules need, and the dynamic config's `alertRules`.

Why it exists: the original evaluates alert rules itself and sends them to an Alertmanager; users
of the Prometheus Operator want rules of their own kind instead. tfusion does both:

- `AlertFactsCollector` exports, on every replica's /metrics, what deploy/alerts/tfusion.rules.yaml
  asks about and no other family says: each GPUNode's phase, each GPUResourceQuota's alert
  threshold condition, the oldest unscheduled GPU worker pod per namespace, and when the pod
  webhook's serving certificate expires. They are read from the informers at scrape time, so a
  follower exports them too (the rules take the `max` over replicas).
- `AlertEvaluator` (leader only, with --enable-alert) evaluates the dynamic config's `alertRules`.
  Every rule is a query that returns the instances in breach: with --alert-metrics-source=prometheus
  a PromQL instant query (each series of the vector is one instance, its labels go on the alert);
  with greptimedb the original's SQL (each row is one instance, its text columns become labels).
  `{{.Threshold}}` and `{{.Interval}}` are substituted into the query, and in SQL `{{.Conditions}}`
  becomes the time filter over the last evaluation interval. An instance that appears in
  `consecutiveCount` evaluations in a row fires; it is sent to the Alertmanager's v2 API
  (`POST /api/v2/alerts`) at every evaluation while it fires, and once more with `endsAt` when it
  no longer appears (or its rule is removed). A failed query changes nothing: an outage of the
  metrics server neither fires nor resolves anything. A rule that cannot be evaluated (a SQL query
  against Prometheus, an unknown key, a bad interval) is refused with a message naming the rule,
  the field and what is allowed; `GET /api/alerts` lists the rules, what fires and what was refused.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Protocol

import anyio
import httpx
import msgspec
import orjson
from cryptography import x509
from litestar import get
from prometheus_client import Counter, Gauge
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tfusion.api import annotations as tfa
from tfusion.api import timestamps
from tfusion.api.accessors import Body, Pod
from tfusion.controller.autoscaler.sources import (
    GREPTIME_TIME,
    UsageSourceError,
    _fetch,
    greptime_records,
    parsed_answer,
)
from tfusion.controller.reconcilers.quota_status import ALERT_REASON
from tfusion.controller.webhook.certs import TLS_CRT, DirectoryCertificates, SecretCertificates
from tfusion.kube import resources as r
from tfusion.settings import Settings, parse_duration

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from tfusion.controller.runtime import ControllerRuntime
    from tfusion.controller.webhook.service import WebhookService

log = logging.getLogger(__name__)

#: keys an alertRules entry may have (the original's), with their defaults
RULE_DEFAULTS: dict[str, Any] = {
    "name": "", "query": "", "threshold": 0, "evaluationInterval": "1m", "consecutiveCount": 1,
    "severity": "warning", "summary": "", "description": "", "runbookURL": "", "alertTargetInstance": ""}
MIN_INTERVAL_S = 1.0
QUERY_TIMEOUT_S = 10.0
#: an answer with more instances than this is refused (a query missing its filter, not an alert)
MAX_INSTANCES = 1000
_TEMPLATE = re.compile(r"\{\{\s*\.(\w+)\s*\}\}")
_SQL = re.compile(r"^\s*(select|with)\b", re.IGNORECASE)


# --- the facts the shipped rules read -------------------------------------------------------------

class AlertFactsCollector(Collector):
    """See the module docstring; `certs` gives the webhook's certificates (None without a webhook)."""

    def __init__(self, runtime: ControllerRuntime,
                 certs: Callable[[], SecretCertificates | DirectoryCertificates | None],
                 clock: Callable[[], float] = time.time) -> None:
        self.runtime = runtime
        self.certs = certs
        self.clock = clock

    @staticmethod
    def _families() -> dict[str, GaugeMetricFamily]:
        return {
            "phase": GaugeMetricFamily("tfusion_gpunode_phase", "1 for a GPUNode's current phase",
                                       labels=["node", "pool", "phase"]),
            "quota": GaugeMetricFamily("tfusion_quota_alert_threshold_reached", "1 while a GPUResourceQuota "
                                       "has less left than its alertThresholdPercent allows",
                                       labels=["namespace", "quota"]),
            "pending": GaugeMetricFamily("tfusion_gpu_pods_pending", "GPU worker pods not yet scheduled",
                                         labels=["namespace"]),
            "oldest": GaugeMetricFamily("tfusion_gpu_pods_pending_oldest_seconds", "how long the oldest "
                                        "unscheduled GPU worker pod of a namespace has existed",
                                        labels=["namespace"]),
            "cert": GaugeMetricFamily("tfusion_webhook_certificate_expiry_timestamp_seconds",
                                      "when the pod webhook's serving certificate expires (unix seconds)"),
        }

    def describe(self) -> Iterator[Metric]:
        yield from self._families().values()

    def collect(self) -> Iterator[Metric]:
        families = self._families()
        for raw in self.runtime.informer(r.GPUNODES).list():
            node = Body(raw)
            families["phase"].add_metric([node.name, node.meta.labels.get(tfa.MANAGED_BY, ""),
                                          node.phase or "Pending"], 1.0)
        for raw in self.runtime.informer(r.GPURESOURCEQUOTAS).list():
            quota = Body(raw)
            ready = quota.condition("Ready") or {}
            breached = ready.get("status") == "False" and ready.get("reason") == ALERT_REASON
            families["quota"].add_metric([quota.namespace, quota.name], 1.0 if breached else 0.0)
        now = self.clock()
        for namespace, (count, oldest) in sorted(self._pending(now).items()):
            families["pending"].add_metric([namespace], count)
            families["oldest"].add_metric([namespace], oldest)
        expiry = certificate_expiry(self.certs())
        if expiry is not None:
            families["cert"].add_metric([], expiry)
        yield from families.values()

    def _pending(self, now: float) -> dict[str, tuple[int, float]]:
        """Namespace -> (unscheduled worker pods, age of the oldest)."""
        out: dict[str, tuple[int, float]] = {}
        for raw in self.runtime.informer(r.PODS).list():
            pod = Pod(raw)
            if pod.meta.labels.get(tfa.COMPONENT) != tfa.COMPONENT_WORKER or pod.node_name or \
                    pod.meta.deleting or pod.phase not in ("", "Pending"):
                continue
            try:
                age = max(0.0, now - timestamps.parse_rfc3339(pod.meta.creation_timestamp).timestamp())
            except ValueError:
                age = 0.0
            count, oldest = out.get(pod.namespace, (0, 0.0))
            out[pod.namespace] = (count + 1, max(oldest, age))
        return out


def certificate_expiry(certs: SecretCertificates | DirectoryCertificates | None) -> float | None:
    """When the serving certificate expires (unix seconds); None when there is none yet."""
    if certs is None:
        return None
    try:
        if isinstance(certs, SecretCertificates):
            if certs.bundle is None:
                return None
            cert = certs.bundle.certificate()
        else:
            cert = x509.load_pem_x509_certificate(Path(certs.directory, TLS_CRT).read_bytes())
    except (OSError, ValueError):
        return None
    return cert.not_valid_after_utc.timestamp()


# --- rules ----------------------------------------------------------------------------------------

class RuleError(ValueError):
    """An alertRules entry tfusion cannot evaluate; the message names the rule, field and value."""


@dataclass(frozen=True)
class AlertRule:
    """One entry of `alertRules`, checked."""

    name: str
    query: str
    threshold: float
    interval: float
    consecutive: int
    severity: str
    summary: str
    description: str
    runbook_url: str
    target_instance: str

    def rendered_query(self, source: str) -> str:
        values: dict[str, object] = {"Threshold": _number_text(self.threshold), "Interval": f"{self.interval:g}s"}
        if source == "greptimedb":
            values["Conditions"] = f"{GREPTIME_TIME} >= now() - '{self.interval:g}s'::INTERVAL"
        return render(self.query, values)


def _number_text(value: float) -> str:
    return str(int(value)) if value == int(value) else repr(value)


def render(template: str, values: Mapping[str, object]) -> str:
    """`{{.Name}}` replaced by `values[Name]`; names it does not have become ""."""
    return _TEMPLATE.sub(lambda m: str(values.get(m.group(1), "")), template)


def parse_rule(index: int, raw: object, source: str) -> AlertRule:
    """An alertRules entry as an `AlertRule`, or RuleError saying what is wrong."""
    if not isinstance(raw, Mapping):
        raise RuleError(f"alertRules[{index}]: must be a mapping, got {type(raw).__name__}")
    name = raw.get("name")
    where = f"alertRules[{index}] ({name})"
    if not isinstance(name, str) or not name:
        raise RuleError(f"alertRules[{index}]: name: must be a non-empty string, got {name!r}")
    unknown = sorted(set(raw) - set(RULE_DEFAULTS))
    if unknown:
        raise RuleError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(RULE_DEFAULTS)}")
    values = {**RULE_DEFAULTS, **raw}
    query = values["query"]
    if not isinstance(query, str) or not query.strip():
        raise RuleError(f"{where}: query: must be a non-empty string")
    is_sql = bool(_SQL.match(query))
    if source == "prometheus" and is_sql:
        raise RuleError(f"{where}: query: looks like SQL (GreptimeDB), but --alert-metrics-source=prometheus "
                        "evaluates PromQL; rewrite it in PromQL or use --alert-metrics-source=greptimedb")
    if source == "greptimedb" and not is_sql:
        raise RuleError(f"{where}: query: --alert-metrics-source=greptimedb evaluates SQL (SELECT ...), "
                        f"got {query!r}")
    unknown_names = sorted({m.group(1) for m in _TEMPLATE.finditer(query)} - _template_names(source))
    if unknown_names:
        raise RuleError(f"{where}: query: unknown template value(s) {', '.join(unknown_names)}; allowed: "
                        f"{', '.join(sorted(_template_names(source)))}")
    return AlertRule(
        name=name, query=query, threshold=_threshold(where, values["threshold"]),
        interval=_interval(where, values["evaluationInterval"]),
        consecutive=_consecutive(where, values["consecutiveCount"]),
        severity=_text(where, "severity", values["severity"]) or "warning",
        summary=_text(where, "summary", values["summary"]),
        description=_text(where, "description", values["description"]),
        runbook_url=_text(where, "runbookURL", values["runbookURL"]),
        target_instance=_text(where, "alertTargetInstance", values["alertTargetInstance"]))


def _template_names(source: str) -> set[str]:
    return {"Threshold", "Interval", "Conditions"} if source == "greptimedb" else {"Threshold", "Interval"}


def _threshold(where: str, value: object) -> float:
    try:
        number = float(str(value)) if not isinstance(value, bool) else math.nan
    except ValueError:
        number = math.nan
    if not math.isfinite(number):
        raise RuleError(f"{where}: threshold: {value!r} is not a number")
    return number


def _interval(where: str, value: object) -> float:
    try:
        seconds = parse_duration(str(value))
    except ValueError:
        seconds = -1.0
    if seconds < MIN_INTERVAL_S:
        raise RuleError(f"{where}: evaluationInterval: {value!r} is not a duration of at least "
                        f"{MIN_INTERVAL_S:g}s (such as 30s or 1m)")
    return seconds


def _consecutive(where: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RuleError(f"{where}: consecutiveCount: {value!r} is not an integer of at least 1")
    return value


def _text(where: str, key: str, value: object) -> str:
    if not isinstance(value, str):
        raise RuleError(f"{where}: {key}: must be a string, got {value!r}")
    return value


def parse_rules(raw_rules: object, settings: Settings) -> tuple[list[AlertRule], dict[str, str]]:
    """The rules tfusion evaluates, and name -> why, for the ones it refuses."""
    rules: list[AlertRule] = []
    refused: dict[str, str] = {}
    entries = raw_rules if isinstance(raw_rules, list) else []
    for index, raw in enumerate(entries):
        label = str(raw.get("name") or f"alertRules[{index}]") if isinstance(raw, Mapping) else f"alertRules[{index}]"
        if not settings.enable_alert:
            refused[label] = "not evaluated: the controller runs without --enable-alert"
            continue
        try:
            rule = parse_rule(index, raw, settings.alert_metrics_source)
        except RuleError as exc:
            refused[label] = str(exc)
            continue
        if any(other.name == rule.name for other in rules):  # keyed by position: the name is the other's
            refused[f"alertRules[{index}]"] = f"alertRules[{index}] ({rule.name}): name: another rule has this name"
            continue
        rules.append(rule)
    return rules, refused


# --- metrics sources ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Breach:
    """One instance a rule's query returned: its labels and value."""

    labels: dict[str, str]
    value: float

    @property
    def key(self) -> tuple[tuple[str, str], ...]:
        return tuple(sorted(self.labels.items()))


class QuerySource(Protocol):
    name: str

    async def breaches(self, http: httpx.AsyncClient, query: str) -> list[Breach]: ...


class PrometheusQuery:
    """PromQL instant queries (`GET /api/v1/query`); every series of the vector is one instance."""

    name = "prometheus"

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    async def breaches(self, http: httpx.AsyncClient, query: str) -> list[Breach]:
        what = f"alert query on prometheus {self.url}"
        body = await _fetch(http, what, "GET", f"{self.url}/api/v1/query", params={"query": query})
        return await parsed_answer(what, body, parse_prometheus_vector)


def parse_prometheus_vector(what: str, answer: Any) -> list[Breach]:
    try:
        if answer["status"] != "success":
            raise UsageSourceError(f"{what}: {answer.get('error') or answer}")
        data = answer["data"]
        if data["resultType"] != "vector":
            raise UsageSourceError(f"{what}: the query returns a {data['resultType']}, not an instant vector")
        out = [Breach({k: str(v) for k, v in series["metric"].items() if k != "__name__"},
                      float(series["value"][1])) for series in data["result"]]
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise UsageSourceError(f"{what}: unexpected answer shape ({type(exc).__name__}: {exc})") from None
    return out


class GreptimeQuery:
    """SQL over GreptimeDB's HTTP API (`POST /v1/sql`); every row is one instance: its text columns
    are the labels, its first numeric column (other than the time index) the value."""

    name = "greptimedb"

    def __init__(self, url: str, database: str) -> None:
        self.url = url.rstrip("/")
        self.database = database

    async def breaches(self, http: httpx.AsyncClient, query: str) -> list[Breach]:
        what = f"alert query on greptimedb {self.url} (database {self.database!r})"
        body = await _fetch(http, what, "POST", f"{self.url}/v1/sql", params={"db": self.database},
                            data={"sql": query})
        return await parsed_answer(what, body, parse_greptime_rows)


def parse_greptime_rows(what: str, answer: Any) -> list[Breach]:
    try:
        columns, _, rows = greptime_records(what, answer)
        out = []
        for row in rows:
            labels = {c: v for c, v in zip(columns, row, strict=True) if isinstance(v, str) and c != GREPTIME_TIME}
            numbers = [v for c, v in zip(columns, row, strict=True)
                       if isinstance(v, int | float) and not isinstance(v, bool) and c != GREPTIME_TIME]
            out.append(Breach(labels, float(numbers[0]) if numbers else 1.0))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise UsageSourceError(f"{what}: unexpected answer shape ({type(exc).__name__}: {exc})") from None
    return out


def query_source(settings: Settings) -> QuerySource:
    if settings.alert_metrics_source == "greptimedb":
        return GreptimeQuery(settings.alert_metrics_url,
                             settings.alert_metrics_database or settings.metrics_push_database)
    return PrometheusQuery(settings.alert_metrics_url)


# --- evaluation -----------------------------------------------------------------------------------

@dataclass
class Firing:
    """An instance that fires: its alert's labels and annotations, since when (unix seconds)."""

    labels: dict[str, str]
    annotations: dict[str, str]
    since: float


@dataclass
class RuleState:
    rule: AlertRule
    next_due: float = 0.0
    #: instance -> evaluations in a row it appeared in
    streaks: dict[tuple[tuple[str, str], ...], int] = field(default_factory=dict)
    firing: dict[tuple[tuple[str, str], ...], Firing] = field(default_factory=dict)
    last_evaluation: float = 0.0
    last_error: str = ""


def alert_labels(rule: AlertRule, breach: Breach) -> dict[str, str]:
    labels = {**breach.labels, "alertname": rule.name, "severity": rule.severity}
    if rule.target_instance:
        labels["instance"] = render(rule.target_instance, breach.labels)
    return labels


def alert_annotations(rule: AlertRule, breach: Breach) -> dict[str, str]:
    values = {**breach.labels, "Threshold": _number_text(rule.threshold), "Value": f"{breach.value:g}"}
    annotations = {"summary": render(rule.summary, values), "description": render(rule.description, values),
                   "runbook_url": rule.runbook_url, "value": f"{breach.value:g}"}
    return {k: v for k, v in annotations.items() if v}


class AlertmanagerError(Exception):
    pass


class AlertEvaluator:
    """See the module docstring. `rules()` gives the current dynamic config's alertRules."""

    def __init__(self, settings: Settings, rules: Callable[[], object], source: QuerySource, *,
                 registry: CollectorRegistry, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.rules = rules
        self.source = source
        self.alertmanager = settings.alert_manager_addr.rstrip("/")
        self.clock = clock
        self.states: dict[str, RuleState] = {}
        self.refused: dict[str, str] = {}
        #: resolved alerts Alertmanager has not accepted yet (sent again with the next post)
        self._unsent: list[dict[str, Any]] = []
        self._seen_rules: object = None
        self.evaluations = Counter("tfusion_alert_evaluations", "alertRules evaluations by rule and result "
                                   "(ok, error)", ["rule", "result"], registry=registry)
        self.posts = Counter("tfusion_alertmanager_posts", "alert batches posted to Alertmanager by result "
                             "(ok, error)", ["result"], registry=registry)
        self.firing_gauge = Gauge("tfusion_alert_rules_firing", "instances of an alertRules rule firing now",
                                  ["rule"], registry=registry)

    def sync_rules(self) -> list[dict[str, Any]]:
        """Take the config's rules; the alerts of removed or changed rules, resolved."""
        raw = self.rules()
        if raw == self._seen_rules:
            return []
        self._seen_rules = raw
        rules, self.refused = parse_rules(raw, self.settings)
        for name, why in self.refused.items():
            log.error("alert rule %s refused: %s", name, why)
        wanted = {rule.name: rule for rule in rules}
        resolved: list[dict[str, Any]] = []
        now = self.clock()
        for name, state in list(self.states.items()):
            if wanted.get(name) != state.rule:
                resolved += [self._alert(f, ends=now) for f in state.firing.values()]
                del self.states[name]
                self.firing_gauge.labels(name).set(0)
        for name, rule in wanted.items():
            self.states.setdefault(name, RuleState(rule))
        return resolved

    async def evaluate(self, http: httpx.AsyncClient, state: RuleState) -> list[dict[str, Any]]:
        """Run one rule; the alerts to send (the firing ones, and those resolved now)."""
        rule = state.rule
        now = self.clock()
        state.next_due = now + rule.interval
        state.last_evaluation = now
        try:
            breaches = await self.source.breaches(http, rule.rendered_query(self.source.name))
            if len(breaches) > MAX_INSTANCES:
                raise UsageSourceError(f"the query returned {len(breaches)} instances, more than {MAX_INSTANCES}; "
                                       "it should return only the instances in breach")
        except UsageSourceError as exc:
            state.last_error = str(exc)
            self.evaluations.labels(rule.name, "error").inc()
            log.warning("alert rule %s: %s", rule.name, exc)
            return [self._alert(f, ends=now + self._lifetime(rule)) for f in state.firing.values()]
        state.last_error = ""
        self.evaluations.labels(rule.name, "ok").inc()
        seen = {breach.key: breach for breach in breaches}
        out: list[dict[str, Any]] = []
        for key in list(state.firing):
            if key not in seen:
                out.append(self._alert(state.firing.pop(key), ends=now))
        state.streaks = {key: state.streaks.get(key, 0) + 1 for key in seen}
        for key, breach in seen.items():
            if key not in state.firing and state.streaks[key] >= rule.consecutive:
                state.firing[key] = Firing(alert_labels(rule, breach), {}, now)
            if key in state.firing:
                state.firing[key].annotations = alert_annotations(rule, breach)
                out.append(self._alert(state.firing[key], ends=now + self._lifetime(rule)))
        self.firing_gauge.labels(rule.name).set(len(state.firing))
        return out

    @staticmethod
    def _lifetime(rule: AlertRule) -> float:
        # as Prometheus does: a firing alert not sent again resolves by itself after a few intervals
        return 4 * max(rule.interval, 60.0)

    @staticmethod
    def _alert(firing: Firing, *, ends: float) -> dict[str, Any]:
        return {"labels": firing.labels, "annotations": firing.annotations,
                "startsAt": timestamps.rfc3339(firing.since), "endsAt": timestamps.rfc3339(ends)}

    async def post(self, http: httpx.AsyncClient, alerts: Sequence[dict[str, Any]]) -> None:
        batch = [*self._unsent, *alerts]
        if not batch:
            return
        url = f"{self.alertmanager}/api/v2/alerts"
        try:
            response = await http.post(url, content=orjson.dumps(batch), headers={"Content-Type": "application/json"})
            if response.status_code != 200:
                raise AlertmanagerError(f"{url} answered {response.status_code}: {response.text[:300]}")
        except (httpx.HTTPError, AlertmanagerError) as exc:
            self.posts.labels("error").inc()
            # firing ones are sent again at the next evaluation; resolved ones only if kept
            self._unsent = [a for a in batch if _resolved(a, self.clock())][-MAX_INSTANCES:]
            log.warning("cannot send %d alert(s) to Alertmanager: %s", len(batch), exc)
            return
        self.posts.labels("ok").inc()
        self._unsent = []

    async def run_once(self, http: httpx.AsyncClient) -> float:
        """Evaluate the rules that are due and send their alerts; seconds until the next is due."""
        alerts = self.sync_rules()
        now = self.clock()
        for state in list(self.states.values()):
            if state.next_due <= now:
                alerts += await self.evaluate(http, state)
        await self.post(http, alerts)
        due = [state.next_due for state in self.states.values()]
        return max(0.05, min(min(due, default=now + 1.0) - self.clock(), 1.0))

    async def run(self) -> None:
        """Leader only: evaluate until cancelled (the Manager cancels it when this replica stops leading)."""
        self.states.clear()  # a new term starts afresh: streaks need consecutive evaluations by this leader
        self._seen_rules = None
        async with httpx.AsyncClient(timeout=QUERY_TIMEOUT_S) as http:
            while True:
                await anyio.sleep(await self.run_once(http))


def _resolved(alert: Mapping[str, Any], now: float) -> bool:
    return bool(timestamps.parse_rfc3339(alert["endsAt"]).timestamp() <= now)


# --- GET /api/alerts ------------------------------------------------------------------------------

class FiringAlert(msgspec.Struct, frozen=True):
    labels: Annotated[dict[str, str], msgspec.Meta(description="The alert's labels as sent to Alertmanager")]
    since: Annotated[str, msgspec.Meta(description="When it started firing (RFC 3339)")]


class RuleView(msgspec.Struct, frozen=True):
    name: str
    query: Annotated[str, msgspec.Meta(description="The query as run (templates substituted)")]
    evaluationIntervalSeconds: float
    consecutiveCount: int
    lastEvaluation: Annotated[str, msgspec.Meta(description="RFC 3339; empty before the first")]
    lastError: Annotated[str, msgspec.Meta(description="Why the last evaluation failed; empty when it did not")]
    firing: list[FiringAlert]


class AlertsAnswer(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """`GET /api/alerts`: the dynamic config's alertRules as this replica evaluates them."""

    enabled: Annotated[bool, msgspec.Meta(description="Whether the controller runs with --enable-alert")]
    leader: Annotated[bool, msgspec.Meta(description="Whether this replica leads (only the leader evaluates)")]
    source: Annotated[str, msgspec.Meta(description="--alert-metrics-source (prometheus or greptimedb)")]
    alertmanager: Annotated[str, msgspec.Meta(description="--alert-manager-addr")]
    rules: Annotated[list[RuleView], msgspec.Meta(description="The rules evaluated (on the leader)")]
    refused: Annotated[dict[str, str], msgspec.Meta(description="Rule name -> why it is not evaluated")]


def alerts_answer(runtime: ControllerRuntime, evaluator: AlertEvaluator | None) -> AlertsAnswer:
    settings = runtime.settings
    raw = runtime.dynamic_config.current.get("alertRules")
    _, refused = parse_rules(raw, settings)
    views: list[RuleView] = []
    if evaluator is not None and runtime.is_leader:
        for state in evaluator.states.values():
            rule = state.rule
            views.append(RuleView(
                name=rule.name, query=rule.rendered_query(settings.alert_metrics_source),
                evaluationIntervalSeconds=rule.interval, consecutiveCount=rule.consecutive,
                lastEvaluation=timestamps.rfc3339(state.last_evaluation) if state.last_evaluation else "",
                lastError=state.last_error,
                firing=[FiringAlert(f.labels, timestamps.rfc3339(f.since)) for f in state.firing.values()]))
    return AlertsAnswer(enabled=settings.enable_alert, leader=runtime.is_leader,
                        source=settings.alert_metrics_source, alertmanager=settings.alert_manager_addr,
                        rules=views, refused=refused)


def attach_alerts(runtime: ControllerRuntime, webhook: WebhookService | None) -> AlertEvaluator | None:
    """The facts collector and GET /api/alerts on every replica; the evaluator on the leader with
    --enable-alert."""
    runtime.registry.register(AlertFactsCollector(runtime, lambda: webhook.certs if webhook is not None else None))
    evaluator: AlertEvaluator | None = None
    if runtime.settings.enable_alert:
        evaluator = AlertEvaluator(runtime.settings, lambda: runtime.dynamic_config.current.get("alertRules"),
                                   query_source(runtime.settings), registry=runtime.registry)
        runtime.add_leader_task(evaluator.run)

    @get("/api/alerts", sync_to_thread=False, summary="The dynamic config's alertRules: what fires, what is refused")
    def api_alerts() -> AlertsAnswer:
        return alerts_answer(runtime, evaluator)

    runtime.routes.append(api_alerts)
    return evaluator
