"""The dynamic config file: defaults, overlay, refusals that name the key, reload on change."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tfusion.controller.dynamic_config import DEFAULT_CONFIG, ConfigError, DynamicConfig, validate


def test_missing_file_means_defaults(tmp_path: Path) -> None:
    config = DynamicConfig(str(tmp_path / "absent.yaml"))
    assert config.reload_if_changed() is False
    assert config.current == DEFAULT_CONFIG and config.error == ""


def test_file_keys_overlay_the_defaults_and_unknown_keys_are_kept() -> None:
    config = validate({"metricsTTL": "7d", "autoMigration": {"enable": True}, "alertRules": [{"name": "x"}]})
    assert config["metricsTTL"] == "7d" and config["metricsFormat"] == "influx"
    assert config["autoMigration"] == {"enable": True}
    assert validate(None) == DEFAULT_CONFIG


@pytest.mark.parametrize(("raw", "message"), [
    ({"metricsFormat": "xml"}, "metricsFormat: 'xml' is not one of influx, json, otel"),
    ({"metricsTTL": "forever"}, "metricsTTL: 'forever' is not a duration"),
    ({"maxInFlightNodes": -1}, "maxInFlightNodes: -1 is not a non-negative integer"),
    ({"hypervisorMaxCrashCount": True}, "hypervisorMaxCrashCount: True"),
    ({"alertRules": [{"query": "select 1"}]}, "alertRules[0]: each rule needs a name"),
    ({"alertRules": {"a": 1}}, "alertRules: must be a list"),
    ({"preemptClusterWideFromEnv": "yes"}, "preemptClusterWideFromEnv: 'yes' is not true or false"),
    (["a"], "must be a mapping"),
])
def test_bad_values_are_refused_with_the_key(raw: object, message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        validate(raw)
    assert message in str(refused.value)


def test_reload_keeps_the_last_good_config_on_a_bad_file(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"maxInFlightNodes": 3}))
    config = DynamicConfig(str(path))
    changes: list[int] = []
    config.on_change(lambda c: changes.append(c["maxInFlightNodes"]))
    assert config.reload_if_changed() is True and config.current["maxInFlightNodes"] == 3
    assert config.reload_if_changed() is False, "unchanged file: nothing to do"
    path.write_text("maxInFlightNodes: [unclosed\n")
    assert config.reload_if_changed() is False
    assert config.current["maxInFlightNodes"] == 3 and "not valid YAML" in config.error
    path.write_text(yaml.safe_dump({"maxInFlightNodes": 4}))
    assert config.reload_if_changed() is True and config.error == ""
    path.unlink()
    assert config.reload_if_changed() is True and config.current == DEFAULT_CONFIG
    assert changes == [3, 4, 15]
