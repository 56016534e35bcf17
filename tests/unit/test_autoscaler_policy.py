"""spec.autoScalingConfig read into typed policies (tfusion.controller.autoscaler.policy): defaults,
decimal strings and Go durations, the half-life rule, cron rules, the external scaler, and errors
naming field, value and what is allowed."""

from __future__ import annotations

import pytest

from tfusion.allocator.request import Resources
from tfusion.controller.autoscaler.policy import AutoSetPolicy, PolicyError, scaling_policy
from tfusion.controller.webhook.workloads import autoscaling_enabled

GIB = 1 << 30


def auto_set(**fields: object) -> AutoSetPolicy:
    return scaling_policy({"autoSetResources": fields}, namespace="ns").auto_set


def test_the_defaults_are_the_originals() -> None:
    policy = auto_set(enable=True)
    assert (policy.target_compute, policy.lower_compute, policy.upper_compute) == (0.95, 0.5, 0.99)
    assert (policy.target_vram, policy.lower_vram, policy.upper_vram) == (0.98, 0.5, 0.99)
    assert (policy.margin, policy.update_threshold, policy.initial_delay_s) == (0.15, 0.1, 1800.0)
    assert (policy.min_vram_ratio, policy.max_vram_ratio) == (0.2, 5.0)
    assert (policy.min_compute_ratio, policy.max_compute_ratio) == (0.1, 10.0)
    assert (policy.target_resource, policy.interval_s, policy.history_period_s) == ("all", None, 86400.0)
    assert scaling_policy(None, namespace="ns").enabled is False


def test_decimal_strings_and_durations_are_read() -> None:
    policy = auto_set(enable=True, targetResource="vram", targetComputePercentile="0.9", marginFraction=".2",
                      updateThreshold="5e-2", historyDataPeriod="7d", initialDelayPeriod="1h30m", interval="45s",
                      minVRAMResourcesRatio="0.5", maxComputeResourcesRatio="3")
    assert (policy.target_compute, policy.margin, policy.update_threshold) == (0.9, 0.2, 0.05)
    assert (policy.history_period_s, policy.initial_delay_s, policy.interval_s) == (7 * 86400, 5400, 45)
    assert (policy.min_vram_ratio, policy.max_compute_ratio) == (0.5, 3.0)
    assert policy.scales_vram and not policy.scales_compute


def test_the_half_life_is_a_quarter_of_the_history_period() -> None:
    assert auto_set(historyDataPeriod="2h").half_life_s == 1800.0
    assert AutoSetPolicy().half_life_s == 6 * 3600.0


@pytest.mark.parametrize(("fields", "message"), [
    ({"marginFraction": "abc"},
     'autoScalingConfig.autoSetResources.marginFraction: "abc" is not a decimal number (allowed: 0 to 1)'),
    ({"targetVRAMPercentile": "1.5"}, "targetVRAMPercentile: \"1.5\" is out of range (allowed: 0 to 1)"),
    ({"updateThreshold": "inf"}, "updateThreshold: \"inf\" is not a decimal number"),
    ({"minVRAMResourcesRatio": "0"}, "minVRAMResourcesRatio: \"0\" is out of range (allowed: a number > 0)"),
    ({"minComputeResourcesRatio": "4", "maxComputeResourcesRatio": "2"},
     "minComputeResourcesRatio: \"4\" is above maxComputeResourcesRatio (2)"),
    ({"lowerBoundComputePercentile": "0.99", "upperBoundComputePercentile": "0.9"},
     "lowerBoundComputePercentile: \"0.99\" is above upperBoundComputePercentile (0.9)"),
    ({"historyDataPeriod": "2 hours"}, "historyDataPeriod: \"2 hours\" is not a duration"),
    ({"historyDataPeriod": "0s"}, "historyDataPeriod: \"0s\" is out of range"),
    ({"historyDataPeriod": "31d"}, "at most 30d"),
    ({"initialDelayPeriod": "-5m"}, "initialDelayPeriod: \"-5m\" is not a duration"),
    ({"targetResource": "gpu"}, "targetResource: \"gpu\" is not one of the choices (allowed: compute | vram | all)"),
    ({"enable": "yes"}, "enable: \"yes\" is not a boolean"),
])
def test_bad_auto_set_fields_are_named(fields: dict[str, object], message: str) -> None:
    with pytest.raises(PolicyError) as caught:
        auto_set(**fields)
    assert message in str(caught.value)
    assert str(caught.value).startswith("autoScalingConfig.autoSetResources.")


def night_rule(**changes: object) -> dict[str, object]:
    rule: dict[str, object] = {"enable": True, "name": "night", "start": "CRON_TZ=Europe/Berlin 0 22 * * *",
                               "end": "0 6 * * *",
                               "desiredResources": {"requests": {"tflops": "1500m", "vram": "2Gi"},
                                                    "limits": {"compute": "50", "vram": "4Gi"}}}
    rule.update(changes)
    return rule


def test_enabled_cron_rules_are_kept_with_their_resources() -> None:
    policy = scaling_policy({"cronScalingRules": [night_rule(), night_rule(enable=False, start="nonsense")]},
                            namespace="ns")
    (rule,) = policy.cron_rules
    assert rule.name == "night" and str(rule.start) == "CRON_TZ=Europe/Berlin 0 22 * * *"
    assert rule.request == Resources(tflops=1500, vram=2 * GIB)
    assert rule.limit == Resources(percent=50_000, vram=4 * GIB)
    assert policy.enabled and not policy.auto_set.enable


def test_a_rule_without_limits_uses_its_requests() -> None:
    body = night_rule(desiredResources={"requests": {"tflops": "10", "vram": "1Gi"}})
    (rule,) = scaling_policy({"cronScalingRules": [body]}, namespace="ns").cron_rules
    assert rule.limit == rule.request


@pytest.mark.parametrize(("rule", "named"), [
    (night_rule(start="0 25 * * *"), "cronScalingRules[0].start: \"0 25 * * *\" is not a schedule (hour"),
    (night_rule(name=""), "cronScalingRules[0].name"),
    (night_rule(desiredResources=None), "cronScalingRules[0].desiredResources: None"),
    (night_rule(desiredResources={"requests": {"tflops": "ten", "vram": "1Gi"}}),
     "desiredResources.requests.tflops: \"ten\" is not a quantity"),
    (night_rule(desiredResources={"requests": {"compute": "150", "vram": "1Gi"}}),
     "desiredResources.requests.compute: \"150\" is out of range (allowed: 0 to 100"),
    (night_rule(desiredResources={"requests": {"tflops": "1", "compute": "5", "vram": "1Gi"}}),
     "is given with tflops"),
    (night_rule(desiredResources={"requests": {"tflops": "-1", "vram": "1Gi"}}), "is negative"),
])
def test_bad_cron_rules_are_named(rule: dict[str, object], named: str) -> None:
    with pytest.raises(PolicyError) as caught:
        scaling_policy({"cronScalingRules": [rule]}, namespace="ns")
    assert named in str(caught.value)


def test_the_external_scaler_secret_defaults_to_the_workload_namespace() -> None:
    policy = scaling_policy({"externalScaler": {"enable": True, "url": "http://scaler:80/recommend",
                                                "apiKeySecretRef": {"name": "key"}, "interval": "1m"}},
                            namespace="team")
    assert policy.external is not None and policy.enabled
    assert (policy.external.secret_name, policy.external.secret_namespace) == ("key", "team")
    assert (policy.external.interval_s, policy.external.initial_delay_s) == (60.0, 0.0)
    with pytest.raises(PolicyError, match=r"externalScaler\.url: \"\" is empty"):
        scaling_policy({"externalScaler": {"enable": True}}, namespace="team")


def test_a_disabled_external_scaler_does_not_enable_autoscaling() -> None:
    policy = scaling_policy({"externalScaler": {"enable": False, "url": "http://x"}}, namespace="ns")
    assert policy.external is not None and not policy.enabled


def test_the_config_must_be_an_object() -> None:
    with pytest.raises(PolicyError, match=r"autoScalingConfig\.cronScalingRules: .* a list of rules"):
        scaling_policy({"cronScalingRules": "0 * * * *"}, namespace="ns")


@pytest.mark.parametrize("config", [
    {}, {"autoSetResources": {"enable": True}}, {"autoSetResources": {"enable": False}},
    {"cronScalingRules": [night_rule()]}, {"cronScalingRules": [night_rule(enable=False)]},
    {"externalScaler": {"enable": True, "url": "http://x"}}, {"externalScaler": {"enable": False}},
    {"autoSetResources": {"enable": False}, "cronScalingRules": [night_rule(enable=False), night_rule()]},
])
def test_enabled_means_what_the_webhook_means(config: dict[str, object]) -> None:
    assert scaling_policy(config, namespace="ns").enabled is autoscaling_enabled(config)
