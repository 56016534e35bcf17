"""Settings of the original TensorFusion operator that tfusion takes but treats differently.

Why: refusals stop tfusion from starting, so a user finds them at once; a setting taken with another
meaning is found only in production. Every such setting an operator can put in the original's
controller Deployment (flags, environment) or its dynamic config (`config.yaml`) is one row of
`DIFFERENCES`, keyed by the name the original's installation uses: a flag with its single dash
(`-enable-alert`), an environment variable (`TF_ISOLATION_MODE_POLICY`) or a dynamic-config key
(`metricsFormat`). The three spellings cannot collide. A difference that shows only for some values
carries a predicate (`applies`), and a setting may have several (the first that applies is
reported); the severity is `warning` when the switch changes what the cluster does or needs a
change of the user's, `info` when knowing is enough. The words are ours and
follow docs/differences.md, which says the same at length.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from tfusion.doctor.findings import Finding, info, warning
from tfusion.settings import parse_bool, parse_duration

NOTHING = "nothing to do; this is only so you know"
MIN_AUTOSCALING_INTERVAL_S = 1.0  # the autoscaler's shortest tick (controller/autoscaler/service.py)


def _always(value: object) -> bool:
    return True


def _off_here_only(value: object) -> bool:
    """The original turns an ENABLE_* feature off for exactly "false"; tfusion for any false spelling."""
    if not isinstance(value, str) or value == "false":
        return False
    try:
        return not parse_bool(value)
    except ValueError:
        return False


def _on_here_only(value: object) -> bool:
    """The original turns a switch on for exactly "true"; tfusion for any true spelling."""
    if not isinstance(value, str) or value == "true":
        return False
    try:
        return parse_bool(value)
    except ValueError:
        return False


def _true(value: object) -> bool:
    if isinstance(value, bool):
        return value
    try:
        return parse_bool(str(value))
    except ValueError:
        return False


def _below_min_interval(value: object) -> bool:
    try:
        return parse_duration(str(value)) < MIN_AUTOSCALING_INTERVAL_S
    except ValueError:
        return False


@dataclass(frozen=True)
class Difference:
    explanation: str
    fix: str = NOTHING
    severity: Literal["info", "warning"] = "info"
    applies: Callable[[object], bool] = _always


_ENABLE_OFF = Difference(
    "the original turns the feature off only for the exact value \"false\"; tfusion also for 0, no, off, "
    "an empty value or another capitalisation, so this value, on in the original, turns it off in tfusion",
    "set it to true, or remove it, if the feature should stay on", "warning", _off_here_only)

_PREEMPT_ENV = ("the original overwrites this variable at start with the dynamic config's preemptClusterWideFromEnv "
                "(true when absent), so there it has no effect; in tfusion it alone decides whether preemption "
                "crosses namespaces")

_ON_HERE_ONLY = Difference(
    "the original turns it on only for the exact value \"true\"; tfusion also for 1, yes, on or another "
    "capitalisation, so this value, off in the original, turns it on in tfusion",
    "set it to false, or remove it, if it should stay off", "warning", _on_here_only)

DIFFERENCES: Mapping[str, tuple[Difference, ...]] = {
    # --- flags of the original's manager ---------------------------------------------------------
    "-dynamic-config": (Difference(
        "tfusion looks for changes to the file every 5 s (--dynamic-config-interval), the original every 15 s; "
        "a file tfusion cannot take leaves the previous config in force and is logged naming the key"),),
    "-scheduler-config": (Difference(
        "tfusion reads only the GPUResourcesFit arguments (maxWorkerPerNode, vramWeight, tflopsWeight) of this "
        "KubeSchedulerConfiguration; its scheduler is its own, not kube-scheduler, so the file's other plugins "
        "and profiles do nothing",
        "nothing, unless you tuned other plugins there: with --scheduler=extender put them in the profile of "
        "your own kube-scheduler"),),
    "-metrics-path": (Difference(
        "rotated files expire after the dynamic config's metricsTTL (the original keeps them 14 days), and "
        "tfusion can write the lines to the database itself instead of leaving that to a Vector sidecar",
        "nothing; to do without the Vector sidecar, give tfusion --metrics-push-url"),),
    "-enable-alert": (Difference(
        "tfusion evaluates the alertRules too, but needs --alert-metrics-url (it refuses to start without it) and "
        "reads the queries as PromQL unless --alert-metrics-source=greptimedb; the original's rules are SQL run "
        "on GreptimeDB",
        "add --alert-metrics-source=greptimedb and --alert-metrics-url=http://<GreptimeDB host>:4000 (the host "
        "the original reaches as TSDB_MYSQL_HOST) when switching", "warning", _true),),
    "-enable-auto-expander": (Difference(
        "nodes being made are counted from the GPUNodeClaims in the cluster rather than from the leader's memory "
        "(a new leader neither forgets nor counts one twice), and Karpenter NodeClaims tfusion makes never "
        "expire by themselves (only maxResources and compaction remove them)", applies=_true),),
    # --- environment of the original's manager ---------------------------------------------------
    "TF_ISOLATION_MODE_POLICY": (Difference(
        "with the dynamic policy, a GPU whose pods disagree on the isolation mode is flagged "
        "(dynamicIsolationConflict and an event) and takes no new pod until they agree",
        applies=lambda value: str(value).strip().lower() == "dynamic"),),
    "NVIDIA_OPERATOR_PROGRESSIVE_MIGRATION": (_ON_HERE_ONLY, Difference(
        "a pod naming a scheduler other than default-scheduler keeps it (the original overwrites it), and a pod "
        "labelled enabled: \"false\" is never changed", applies=lambda value: value == "true")),
    "DISABLE_CONNECTION_AUTH": (Difference(
        _ON_HERE_ONLY.explanation, "remove it, or set it to false, to keep checking the callers of "
        "/api/connection", "warning", _on_here_only),),
    "INITIAL_GPU_NODE_LABEL_SELECTOR": (Difference(
        "any label selector is taken (the original reads a single key=value), and it is checked at every pass: "
        "a Node that loses the label loses its GPUNode, which the original never notices",
        "nothing, as long as the GPU nodes in use keep the label", applies=lambda value: bool(str(value).strip())),),
    "PORT": (Difference(
        "tfusion serves /metrics, /healthz and /readyz on this port beside the HTTP API; it has no separate "
        "metrics port (-metrics-bind-address)", "point Prometheus at this port when switching"),),
    "ENABLE_WEBHOOKS": (_ENABLE_OFF,),
    "ENABLE_SCHEDULER": (_ENABLE_OFF,),
    "ENABLE_CR_CONTROLLER": (_ENABLE_OFF,),
    "TF_SCHEDULER_PREEMPT_CLUSTER_WIDE": (Difference(
        f"{_PREEMPT_ENV}, so this false keeps preemption inside the preempting pod's namespace",
        "remove it, unless the dynamic config's preemptClusterWideFromEnv is false too", "warning",
        lambda value: not _true(value)), Difference(_PREEMPT_ENV)),
    # --- the dynamic config (config.yaml of the mounted ConfigMap) -------------------------------
    "metricsFormat": (Difference(
        "tfusion's OpenTelemetry output names each gauge <table>_<field> (the original names a point's first "
        "field after its table alone), escapes tag values as JSON, writes booleans as 0/1 and leaves string "
        "fields out",
        "change the dashboards and queries that read this output to the <table>_<field> names", "warning",
        lambda value: value == "otel"),),
    "metricsTTL": (Difference(
        "tfusion passes it to GreptimeDB as a hint on the lines it pushes (--metrics-push-url) rather than "
        "altering the tables, and also expires the rotated metrics files by it",
        "nothing when tfusion pushes; if a Vector sidecar keeps shipping the file, set the tables' TTL in "
        "GreptimeDB yourself"),),
    "alertRules": (Difference(
        "the rules run only with --enable-alert and --alert-metrics-url, as the original's SQL only with "
        "--alert-metrics-source=greptimedb (else as PromQL); a rule tfusion cannot evaluate is refused by name "
        "(GET /api/alerts lists it) while the others run",
        "run tfusion with --enable-alert --alert-metrics-source=greptimedb --alert-metrics-url=<GreptimeDB "
        "HTTP address> to keep these rules"),),
    "autoMigration": (Difference(
        "the webhook's objectSelector leaves out pods labelled tensor-fusion.ai/enabled: \"false\" instead of "
        "receiving every pod",
        applies=lambda value: isinstance(value, Mapping) and _true(value.get("enable", False))),),
    "autoScalingInterval": (Difference(
        f"the autoscaler ticks at least {MIN_AUTOSCALING_INTERVAL_S:g} s apart, so a shorter interval is raised "
        "to that", applies=_below_min_interval),),
    "gpuOperatorNamespace": (Difference(
        "it has no effect in tfusion: the original looks there for a node's NVIDIA device-plugin "
        "pod before starting its hypervisor, tfusion's hypervisor DaemonSet does not wait for it"),),
    "hypervisorMaxCrashCount": (Difference(
        "it has no effect in tfusion: the original recreates a hypervisor pod after this many "
        "restarts, tfusion's hypervisors are a DaemonSet that the kubelet restarts like any pod",
        "nothing; the hypervisors check of tfusion doctor names a crash-looping hypervisor"),),
    "preemptClusterWideFromEnv": (Difference(
        "it has no effect in tfusion: whether preemption crosses namespaces is "
        "TF_SCHEDULER_PREEMPT_CLUSTER_WIDE alone (default true), so this false would not apply",
        "set TF_SCHEDULER_PREEMPT_CLUSTER_WIDE=false on tfusion's controller", "warning",
        lambda value: value is False),),
    "maxInFlightNodes": (Difference(
        "0 stops tfusion's node expander from making any node, where the original reads 0 as its default of 15",
        "remove the key, or set how many nodes may be made at once", "warning",
        lambda value: value == 0),),
}


def difference(setting: str, value: object) -> Difference | None:
    """The first difference of a setting that applies to `value`; `value` None (not readable, e.g. an
    environment variable from a Secret) matches only those that apply whatever the value."""
    for row in DIFFERENCES.get(setting, ()):
        if row.applies is _always or (value is not None and row.applies(value)):
            return row
    return None


def difference_finding(check: str, said: str, setting: str, value: object) -> Finding | None:
    """The finding for one setting as the original's installation sets it; `said` names it for the user."""
    row = difference(setting, value)
    if row is None:
        return None
    make = warning if row.severity == "warning" else info
    return make(check, f"{said}: tfusion takes it, differently: {row.explanation}", row.fix)
