"""`tfusion doctor` on an original TensorFusion installation: the table of settings tfusion takes but
treats differently, how each value is judged, and the operator image's release against the one
tfusion implements. Pure: no cluster (tests/integration/test_doctor_cluster.py applies a Deployment).
"""

from __future__ import annotations

import pytest

from tfusion.controller.dynamic_config import DEFAULT_CONFIG
from tfusion.doctor.differences import DIFFERENCES, NOTHING, difference
from tfusion.doctor.findings import exit_code, info, render_text
from tfusion.doctor.original import config_findings, env_findings, flag_findings
from tfusion.doctor.original_version import REFERENCE, image_tag, parse_version, version_finding
from tfusion.settings import OPTIONS

CHECK = "tensorfusion"


def test_every_row_names_a_setting_tfusion_takes() -> None:
    """A row for a setting tfusion refuses or does not know would tell the user two things at once."""
    flags = {opt.flag.removeprefix("-") for opt in OPTIONS if opt.flag and opt.implemented}
    env = {opt.env for opt in OPTIONS if opt.env and opt.implemented}
    config = {*DEFAULT_CONFIG, "autoMigration"}  # the webhook reads autoMigration; absent means off
    for setting, rows in DIFFERENCES.items():
        known = flags if setting.startswith("-") else env if setting.isupper() else config
        assert setting in known, f"{setting}: no setting of tfusion takes it"
        assert rows and all(row.explanation and row.fix and not row.explanation.endswith(".") for row in rows)


@pytest.mark.parametrize(("setting", "value", "severity"), [
    ("ENABLE_WEBHOOKS", "false", None),  # off in both
    ("ENABLE_WEBHOOKS", "true", None),
    ("ENABLE_SCHEDULER", "0", "warning"),  # on in the original, off here
    ("ENABLE_CR_CONTROLLER", "False", "warning"),
    ("ENABLE_WEBHOOKS", "", "warning"),
    ("ENABLE_WEBHOOKS", None, None),  # from a Secret: cannot tell
    ("TF_ISOLATION_MODE_POLICY", "Dynamic", "info"),
    ("TF_ISOLATION_MODE_POLICY", "static", None),
    ("NVIDIA_OPERATOR_PROGRESSIVE_MIGRATION", "true", "info"),
    ("NVIDIA_OPERATOR_PROGRESSIVE_MIGRATION", "false", None),
    ("NVIDIA_OPERATOR_PROGRESSIVE_MIGRATION", "1", "warning"),  # off in the original, on here
    ("DISABLE_CONNECTION_AUTH", "true", None),  # no check in both
    ("DISABLE_CONNECTION_AUTH", "Yes", "warning"),
    ("TF_SCHEDULER_PREEMPT_CLUSTER_WIDE", "false", "warning"),
    ("TF_SCHEDULER_PREEMPT_CLUSTER_WIDE", "true", "info"),
    ("TF_SCHEDULER_PREEMPT_CLUSTER_WIDE", None, "info"),
    ("INITIAL_GPU_NODE_LABEL_SELECTOR", "nvidia.com/gpu.present=true", "info"),
    ("INITIAL_GPU_NODE_LABEL_SELECTOR", "", None),  # the chart's value when none is set
    ("PORT", "8080", "info"),
    ("-dynamic-config", "/etc/tensor-fusion/config.yaml", "info"),
    ("-dynamic-config", None, "info"),
    ("-enable-alert", "true", "warning"),
    ("-enable-alert", "false", None),
    ("-leader-elect", "true", None),  # same in both: no row
    ("metricsFormat", "otel", "warning"),
    ("metricsFormat", "influx", None),
    ("metricsTTL", "30d", "info"),
    ("autoScalingInterval", "500ms", "info"),
    ("autoScalingInterval", "10s", None),
    ("autoMigration", {"enable": True}, "info"),
    ("autoMigration", {"enable": False}, None),
    ("preemptClusterWideFromEnv", False, "warning"),
    ("preemptClusterWideFromEnv", True, None),
    ("maxInFlightNodes", 0, "warning"),
    ("maxInFlightNodes", 15, None),
    ("hypervisorMaxCrashCount", 5, "info"),
    ("noSuchKey", "x", None),
])
def test_a_difference_applies_to_the_values_that_differ(setting: str, value: object, severity: str | None) -> None:
    row = difference(setting, value)
    assert (row.severity if row else None) == severity


def test_flags_env_and_config_report_the_differences_of_what_tfusion_takes() -> None:
    alert, unknown = flag_findings(["-leader-elect", "-enable-alert", "-metrics-bind-address", ":9000"])
    assert "-metrics-bind-address=:9000: tfusion has no such flag" in unknown.message
    assert alert.severity == "warning"
    assert alert.message.startswith("flag -enable-alert: tfusion takes it, differently: tfusion evaluates the "
                                    "alertRules too, but needs --alert-metrics-url")
    assert "--alert-metrics-source=greptimedb" in alert.fix

    refused, policy, off = env_findings([{"name": "INITIAL_GPU_NODE_LABEL_SELECTOR", "value": "a in (b"},
                                         {"name": "TF_ISOLATION_MODE_POLICY", "value": "dynamic"},
                                         {"name": "ENABLE_SCHEDULER", "value": "no"}])
    assert refused.severity == "warning" and "tfusion refuses" in refused.message  # refused: no difference too
    assert policy.severity == "info" and policy.fix == NOTHING
    assert policy.message.startswith("environment variable TF_ISOLATION_MODE_POLICY='dynamic': tfusion takes it, "
                                     "differently: with the dynamic policy")
    assert off.severity == "warning" and off.message.startswith("environment variable ENABLE_SCHEDULER='no'")

    otel, preempt = config_findings("ConfigMap tf/c config.yaml", "metricsFormat: otel\nmaxInFlightNodes: 3\n"
                                                                  "preemptClusterWideFromEnv: false\n")
    assert otel.message.startswith("dynamic config ConfigMap tf/c config.yaml, metricsFormat: tfusion takes it, "
                                   "differently: tfusion's OpenTelemetry output names each gauge <table>_<field>")
    assert preempt.severity == "warning" and preempt.fix == "set TF_SCHEDULER_PREEMPT_CLUSTER_WIDE=false on " \
                                                            "tfusion's controller"
    [whole] = config_findings("cm", "metricsFormat: otel\nmaxInFlightNodes: -1\n")  # refused as a whole
    assert "tfusion refuses it (maxInFlightNodes: -1" in whole.message


def test_info_alone_exits_0_and_is_counted() -> None:
    findings = [info(CHECK, "known", "nothing")]
    assert exit_code(findings) == 0
    text = render_text(findings)
    assert text.startswith("info     tensorfusion  known\n")
    assert text.endswith("0 error(s), 0 warning(s), 1 info, 0 ok\n")


@pytest.mark.parametrize(("image", "tag", "version"), [
    ("tensorfusion/tensor-fusion-operator:1.43.2", "1.43.2", (1, 43, 2)),
    ("docker.io/tensorfusion/tensor-fusion-operator:v2.17.1", "v2.17.1", (2, 17, 1)),
    ("registry:5000/tensorfusion/tensor-fusion-operator:2.18-amd64", "2.18-amd64", (2, 18, 0)),
    ("registry:5000/tensorfusion/tensor-fusion-operator", "", None),
    ("tensorfusion/tensor-fusion-operator:2.17.1@sha256:0123", "2.17.1", (2, 17, 1)),
    ("tensorfusion/tensor-fusion-operator@sha256:0123", "", None),
    ("tensorfusion/tensor-fusion-operator:latest", "latest", None),
])
def test_the_release_is_read_from_the_image_tag(image: str, tag: str, version: tuple[int, int, int] | None) -> None:
    assert image_tag(image) == tag
    assert parse_version(tag) == version


def test_the_release_is_judged_against_the_one_tfusion_implements() -> None:
    newer = version_finding(CHECK, "tensorfusion/tensor-fusion-operator:2.18.0")
    assert newer.severity == "warning"
    assert f"fields added after {REFERENCE} are not known to tfusion" in newer.message
    assert "tensor-fusion.ai/v1" in newer.message
    older = version_finding(CHECK, "tensorfusion/tensor-fusion-operator:1.43.2")
    assert older.severity == "info" and f"release 1.43.2 is older than {REFERENCE}" in older.message
    assert version_finding(CHECK, f"tensorfusion/tensor-fusion-operator:v{REFERENCE}").severity == "ok"
    unknown = version_finding(CHECK, "tensorfusion/tensor-fusion-operator:latest")
    assert unknown.severity == "info" and "tag 'latest', so its release is unknown" in unknown.message
