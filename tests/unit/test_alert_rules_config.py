"""alertRules as tfusion reads them: what each metrics source evaluates (PromQL on prometheus, the
original's SQL on greptimedb, with {{.Threshold}}, {{.Interval}} and {{.Conditions}} substituted),
the refusals (naming the rule, the field and what is allowed), and the answers of both sources read
into instances."""

from __future__ import annotations

from typing import Any

import pytest

from tfusion.controller.alerts import Breach, parse_greptime_rows, parse_prometheus_vector, parse_rule, parse_rules
from tfusion.controller.autoscaler.sources import UsageSourceError
from tfusion.settings import Settings

SQL = {"name": "GPUTempHigh", "query": "SELECT uuid, max(temperature) AS t FROM tf_gpu_usage WHERE {{.Conditions}} "
       "GROUP BY uuid HAVING max(temperature) > {{.Threshold}}", "threshold": 90, "evaluationInterval": "30s",
       "consecutiveCount": 3}
PROMQL = {"name": "Hot", "query": "max by (gpu) (max_over_time(tfusion_gpu_temperature_celsius[{{.Interval}}])) "
          "> {{.Threshold}}", "threshold": "90.5", "evaluationInterval": "1m"}


def test_each_source_renders_its_own_language() -> None:
    sql = parse_rule(0, SQL, "greptimedb")
    assert sql.consecutive == 3 and sql.interval == 30.0 and sql.severity == "warning"
    assert sql.rendered_query("greptimedb") == (
        "SELECT uuid, max(temperature) AS t FROM tf_gpu_usage WHERE greptime_timestamp >= now() - '30s'::INTERVAL "
        "GROUP BY uuid HAVING max(temperature) > 90")
    promql = parse_rule(0, PROMQL, "prometheus")
    assert promql.rendered_query("prometheus") == \
        "max by (gpu) (max_over_time(tfusion_gpu_temperature_celsius[60s])) > 90.5"


@pytest.mark.parametrize(("rule", "source", "message"), [
    (SQL, "prometheus", "alertRules[0] (GPUTempHigh): query: looks like SQL (GreptimeDB), but "
                        "--alert-metrics-source=prometheus evaluates PromQL"),
    (PROMQL, "greptimedb", "alertRules[0] (Hot): query: --alert-metrics-source=greptimedb evaluates SQL"),
    ({**PROMQL, "query": "up{job='x'} < {{.Conditions}}"}, "prometheus",
     "alertRules[0] (Hot): query: unknown template value(s) Conditions; allowed: Interval, Threshold"),
    ({**PROMQL, "evaluationInterval": "0.5s"}, "prometheus",
     "alertRules[0] (Hot): evaluationInterval: '0.5s' is not a duration of at least 1s"),
    ({**PROMQL, "consecutiveCount": 0}, "prometheus",
     "alertRules[0] (Hot): consecutiveCount: 0 is not an integer of at least 1"),
    ({**PROMQL, "threshold": "high"}, "prometheus", "alertRules[0] (Hot): threshold: 'high' is not a number"),
    ({**PROMQL, "for": "5m"}, "prometheus", "alertRules[0] (Hot): unknown key(s) for; allowed: name, query"),
])
def test_a_rule_tfusion_cannot_evaluate_is_refused(rule: dict[str, Any], source: str, message: str) -> None:
    settings = Settings(enable_alert=True, alert_metrics_source=source, alert_metrics_url="http://127.0.0.1:1")
    rules, refused = parse_rules([rule], settings)
    assert rules == [] and list(refused) == [rule["name"]]
    assert message in refused[rule["name"]]


def test_a_second_rule_of_the_same_name_is_refused() -> None:
    settings = Settings(enable_alert=True, alert_metrics_url="http://127.0.0.1:1")
    rules, refused = parse_rules([PROMQL, {**PROMQL, "threshold": 1}], settings)
    assert [r.threshold for r in rules] == [90.5]
    assert refused == {"alertRules[1]": "alertRules[1] (Hot): name: another rule has this name"}


def test_without_enable_alert_every_rule_says_it_is_not_evaluated() -> None:
    rules, refused = parse_rules([PROMQL], Settings())
    assert rules == [] and refused == {"Hot": "not evaluated: the controller runs without --enable-alert"}


def test_the_answers_become_instances() -> None:
    vector = {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"__name__": "x", "gpu": "g1"}, "value": [1.0, "93"]}]}}
    assert parse_prometheus_vector("q", vector) == [Breach({"gpu": "g1"}, 93.0)]
    with pytest.raises(UsageSourceError, match="returns a scalar, not an instant vector"):
        parse_prometheus_vector("q", {"status": "success", "data": {"resultType": "scalar", "result": [1, "1"]}})
    rows = {"code": 0, "output": [{"records": {
        "schema": {"column_schemas": [{"name": "uuid", "data_type": "String"}, {"name": "t", "data_type": "Float64"},
                                      {"name": "greptime_timestamp", "data_type": "TimestampMillisecond"}]},
        "rows": [["GPU-1", 95.5, 1700000000000]]}}]}
    assert parse_greptime_rows("q", rows) == [Breach({"uuid": "GPU-1"}, 95.5)]
