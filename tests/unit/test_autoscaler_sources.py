"""The usage sources' queries and answer parsing without a server: the GreptimeDB source (no
GreptimeDB server is installable here, so its request and a recorded answer shape are checked),
quoting of identifiers and values, the Prometheus step and range, the choice of source, and the
settings that pick one. The sources against real servers: tests/integration/test_autoscaler_sources.py.
"""

from __future__ import annotations

import threading
from typing import Any

import anyio
import orjson
import pytest

from tfusion.controller.autoscaler.sources import (
    MAX_POINTS,
    MAX_ROWS,
    THREAD_PARSE_BYTES,
    GreptimeUsage,
    HypervisorUsage,
    InfluxUsage,
    PrometheusUsage,
    UsageSample,
    UsageSourceError,
    greptime_query,
    influx_ident,
    influx_query,
    influx_string,
    parse_greptime,
    parse_influx,
    parse_prometheus_matrix,
    parsed_answer,
    prometheus_query,
    prometheus_range,
    prometheus_step,
    promql_string,
    sql_ident,
    sql_string,
    usage_source,
)
from tfusion.settings import Settings, SettingsError

#: the shape GreptimeDB's `POST /v1/sql` answers a SELECT with (its HTTP API documentation)
GREPTIME_ANSWER: dict[str, Any] = {
    "output": [{"records": {
        "schema": {"column_schemas": [
            {"name": "greptime_timestamp", "data_type": "TimestampMillisecond"},
            {"name": "namespace", "data_type": "String"}, {"name": "workload", "data_type": "String"},
            {"name": "pod_name", "data_type": "String"}, {"name": "uuid", "data_type": "String"},
            {"name": "compute_tflops", "data_type": "Float64"}, {"name": "memory_bytes", "data_type": "Int64"}]},
        "rows": [[1764660000123, "team-a", "a-job", "a-0", "gpu-1", 10.5, 2147483648],
                 [1764660001123, "team-a", "a-job", "a-0", "gpu-1", None, 1],
                 [1764660002123, "team-a", "unknown", "bare", "gpu-1", 1.0, 1]],
        "total_rows": 3}}],
    "execution_time_ms": 4}


def test_greptime_request_is_a_form_post_of_quoted_sql() -> None:
    source = GreptimeUsage("http://db.example:4000/", "metrics")
    assert (source.name, source.keeps_history) == ("greptimedb", True)
    url, params, form = source.request(1764660000.0005, 1764660060.25)
    assert (url, params) == ("http://db.example:4000/v1/sql", {"db": "metrics"})
    assert form == {"sql": (
        'SELECT "greptime_timestamp", "namespace", "workload", "pod_name", "uuid", "compute_tflops", '
        '"memory_bytes" FROM "tf_worker_usage" WHERE "greptime_timestamp" > to_timestamp_millis(1764660000000) '
        'AND "greptime_timestamp" <= to_timestamp_millis(1764660060250) AND "workload" NOT IN (\'\', \'unknown\') '
        f'ORDER BY "greptime_timestamp" LIMIT {MAX_ROWS + 1}')}
    assert greptime_query(0, 1) == form["sql"].replace("1764660000000", "0").replace("1764660060250", "1000")


def test_greptime_answer_becomes_samples_skipping_empty_fields_and_no_workload() -> None:
    assert parse_greptime("g", GREPTIME_ANSWER) == [UsageSample(
        at=1764660000.123, namespace="team-a", workload="a-job", worker="a-0", tflops_milli=10500.0,
        vram_bytes=2147483648.0, gpu="gpu-1")]


@pytest.mark.parametrize(("data_type", "value", "at"), [
    ("TimestampNanosecond", 1764660000123000000, 1764660000.123), ("TimestampSecond", 1764660000, 1764660000.0),
    ("TimestampMillisecond", "2025-12-02T07:20:00.123", 1764660000.123),
    ("TimestampMillisecond", "2025-12-02T07:20:00.123Z", 1764660000.123)])
def test_greptime_time_units(data_type: str, value: Any, at: float) -> None:
    answer = {"output": [{"records": {**GREPTIME_ANSWER["output"][0]["records"], "rows": [
        [value, "n", "w", "p", "g", 1.0, 2]]}}]}
    answer["output"][0]["records"]["schema"] = {"column_schemas": [
        {**c, "data_type": data_type} if c["name"] == "greptime_timestamp" else c
        for c in GREPTIME_ANSWER["output"][0]["records"]["schema"]["column_schemas"]]}
    (sample,) = parse_greptime("g", answer)
    assert sample.at == pytest.approx(at)


@pytest.mark.parametrize(("answer", "message"), [
    ({"code": 4001, "error": "Table not found: tf_worker_usage", "execution_time_ms": 1}, "Table not found"),
    ({"output": []}, "unexpected answer shape"),
    ({"output": [{"affectedrows": 0}]}, "unexpected answer shape"),
    ({"output": [{"records": {"schema": {"column_schemas": [{"name": "x", "data_type": "Int64"}]}, "rows": []}}]},
     "unexpected answer shape"),
    ([], "unexpected answer shape")])
def test_greptime_errors_and_other_shapes(answer: Any, message: str) -> None:
    with pytest.raises(UsageSourceError, match=f"^g: .*{message}"):
        parse_greptime("g", answer)


def test_identifiers_and_values_are_quoted_per_language() -> None:
    assert sql_ident('a"b') == '"a""b"' and sql_string("it's") == "'it''s'"
    assert influx_ident('a"b\\') == '"a\\"b\\\\"' and influx_string("it's") == "'it\\'s'"
    assert promql_string('a"b\\c\n') == '"a\\"b\\\\c\\n"'


def test_influx_query_covers_since_exclusive_until_inclusive_in_ms() -> None:
    assert influx_query(10.0019, 20.5) == (
        'SELECT "compute_tflops", "memory_bytes" FROM "tf_worker_usage" WHERE time > 10001ms AND time <= 20500ms '
        'AND "workload" != \'\' AND "workload" != \'unknown\' GROUP BY "namespace", "workload", "pod_name", "uuid"')


@pytest.mark.parametrize(("answer", "message"), [
    ({"error": "error parsing query"}, "error parsing query"),
    ({"results": [{"statement_id": 0, "error": "database not found: x"}]}, "database not found"),
    ({"results": [{"statement_id": 0, "partial": True, "series": []}]}, "partial result"),
    ({"results": [{"series": [{"columns": ["time"], "values": []}]}]}, "unexpected answer shape"),
    ({"results": []}, "unexpected answer shape")])
def test_influx_errors_and_other_shapes(answer: Any, message: str) -> None:
    with pytest.raises(UsageSourceError, match=message):
        parse_influx("i", answer)


def test_prometheus_step_bounds_the_points_and_the_range_ends_at_until() -> None:
    assert prometheus_step(0, 30) == 1.0
    assert prometheus_step(0, 7 * 86400) == 605.0
    for since, until in ((100.0, 130.5), (0.0, 7 * 86400 + 0.3), (5.5, 6.0)):
        step = prometheus_step(since, until)
        start, end = (float(x) for x in prometheus_range(since, until, step))
        assert since < start <= end <= until and end > until - 0.001
        assert (end - start) / step + 1 <= MAX_POINTS + 1
    assert prometheus_query("m") == 'max by (namespace, workload, pod, gpu) (m{workload!="",workload!="unknown"})'


@pytest.mark.parametrize(("answer", "message"), [
    ({"status": "error", "errorType": "bad_data", "error": "parse error"}, "parse error"),
    ({"status": "success", "data": {"resultType": "vector", "result": []}}, "vector"),
    ({"status": "success", "data": {"resultType": "matrix", "result": [{"values": []}]}}, "unexpected answer shape"),
    ({"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {}, "values": [[1, "x"]]}]}},
     "unexpected answer shape")])
def test_prometheus_errors_and_other_shapes(answer: Any, message: str) -> None:
    with pytest.raises(UsageSourceError, match=message):
        parse_prometheus_matrix("p", answer)


def _settings(**flags: Any) -> Settings:
    return Settings.load(flags, env={}, roles=("controller",))


def test_usage_source_follows_the_settings() -> None:
    runtime: Any = object()  # only the hypervisor source reads it, and only when asked for samples
    assert isinstance(usage_source(_settings(), runtime), HypervisorUsage)
    prom = usage_source(_settings(autoscaler_usage_source="prometheus", autoscaler_usage_url="http://p:9090/"),
                        runtime)
    assert isinstance(prom, PrometheusUsage) and prom.url == "http://p:9090"
    influx = usage_source(_settings(autoscaler_usage_source="influxdb", autoscaler_usage_url="http://i:8086"), runtime)
    assert isinstance(influx, InfluxUsage) and influx.database == "public", "--metrics-push-database by default"
    greptime = usage_source(_settings(autoscaler_usage_source="greptimedb", autoscaler_usage_url="http://g:4000",
                                      autoscaler_usage_database="tf"), runtime)
    assert isinstance(greptime, GreptimeUsage) and greptime.database == "tf"


@pytest.mark.parametrize(("flags", "message"), [
    ({"autoscaler_usage_source": "prometheus"}, "--autoscaler-usage-source=prometheus needs --autoscaler-usage-url"),
    ({"autoscaler_usage_source": "greptimedb"}, "greptimedb needs --autoscaler-usage-url"),
    ({"autoscaler_usage_url": "http://p:9090"}, "--autoscaler-usage-source is hypervisor"),
    ({"autoscaler_usage_database": "db"}, "--autoscaler-usage-source is hypervisor"),
    ({"autoscaler_usage_source": "prometheus", "autoscaler_usage_url": "http://p:9090",
      "autoscaler_usage_database": "db"}, "prometheus has no database")])
def test_a_usage_setting_that_would_do_nothing_is_refused(flags: dict[str, Any], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        _settings(**flags)


def test_usage_source_environment_variable() -> None:
    # a history source needs a URL, which has no variable: the flag gives it
    with pytest.raises(SettingsError, match="needs --autoscaler-usage-url"):
        Settings.load({}, env={"TF_AUTOSCALER_USAGE_SOURCE": "influxdb"}, roles=("controller",))
    with pytest.raises(SettingsError, match=r"TF_AUTOSCALER_USAGE_SOURCE='mysql'.*expected one of hypervisor"):
        Settings.load({}, env={"TF_AUTOSCALER_USAGE_SOURCE": "mysql"}, roles=("controller",))
    both = Settings.load({"autoscaler_usage_url": "http://i:8086"}, env={"TF_AUTOSCALER_USAGE_SOURCE": "influxdb"},
                         roles=("controller",))
    assert both.autoscaler_usage_source == "influxdb"


def test_a_large_answer_is_parsed_off_the_event_loop_and_a_small_one_on_it() -> None:
    """History answers of megabytes must not hold the event loop (Lease renewals share it)."""
    seen: list[str] = []

    def parse(what: str, answer: Any) -> int:
        seen.append(threading.current_thread().name)
        return len(answer)

    loop_thread = threading.current_thread().name
    small = orjson.dumps(list(range(10)))
    large = orjson.dumps(list(range(THREAD_PARSE_BYTES)))
    assert len(large) >= THREAD_PARSE_BYTES
    assert anyio.run(parsed_answer, "t", small, parse) == 10
    assert anyio.run(parsed_answer, "t", large, parse) == THREAD_PARSE_BYTES
    assert seen[0] == loop_thread and seen[1] != loop_thread
    with pytest.raises(UsageSourceError, match="not JSON"):
        anyio.run(parsed_answer, "t", b"{" * THREAD_PARSE_BYTES, parse)
