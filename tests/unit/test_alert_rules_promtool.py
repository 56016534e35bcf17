"""The shipped alert rules: `promtool check rules` accepts them, `promtool test rules` passes their
unit tests (deploy/alerts/tfusion.rules.test.yaml: each alert fires on the series that should fire
it and not on the others), the PrometheusRule of the prometheus-operator overlay carries the same
groups, and every tfusion metric a rule names is one tfusion exports."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ALERTS = REPO / "deploy" / "alerts"
RULES = ALERTS / "tfusion.rules.yaml"
PROMETHEUS_RULE = REPO / "deploy" / "overlays" / "prometheus-operator" / "prometheusrule.yaml"
PROMTOOL = shutil.which("promtool")

needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed (Debian package prometheus); .ci/run installs it")


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60, cwd=ALERTS)


@needs_promtool
def test_promtool_checks_and_tests_the_rules() -> None:
    checked = promtool("check", "rules", RULES.name)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = promtool("test", "rules", "tfusion.rules.test.yaml")
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_every_alert_has_a_unit_test_and_the_fields_alertmanager_routes_on() -> None:
    rules = [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]
    tests = yaml.safe_load((ALERTS / "tfusion.rules.test.yaml").read_text())["tests"]
    firing = {case["alertname"] for test in tests for case in test["alert_rule_test"] if case["exp_alerts"]}
    assert {rule["alert"] for rule in rules} == firing
    for rule in rules:
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), rule["alert"]
        assert {"summary", "description"} <= set(rule["annotations"]), rule["alert"]


def test_the_prometheus_rule_carries_the_same_groups() -> None:
    shipped = yaml.safe_load(PROMETHEUS_RULE.read_text())
    assert shipped["kind"] == "PrometheusRule"
    assert shipped["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"], \
        "stale: run python tools/gen_prometheusrule.py"


def test_the_rules_name_only_metrics_tfusion_exports() -> None:
    source = "\n".join(path.read_text() for path in (REPO / "tfusion").rglob("*.py"))
    named = set(re.findall(r"\btfusion_[a-z0-9_]+", RULES.read_text()))
    assert named
    for metric in sorted(named):
        family = metric.removesuffix("_total")  # prometheus_client adds it to a Counter's name
        assert f'"{family}"' in source, f"{metric}: no family of that name in tfusion/"
