"""Defaults and validation of the workload kinds: apps/v1 Deployment and ReplicaSet, batch/v1 Job.

kube-apiserver keeps these in the apps and batch registry strategies. Only the fields tfusion's
workload controllers (tfusion/embedded/workloads/) act on are defaulted and validated, with
kube's defaults and kube's field paths in the 422 causes, so `kubectl apply` of a manifest that
kube would refuse is refused here with the same field named. The pod template is defaulted and
validated as a pod spec (the pod rules live in validation.py).
"""

from __future__ import annotations

import re
from typing import Any

from tfusion.api.selectors import SelectorError, label_selector_from_dict
from tfusion.apiserver import batch_rules, validation
from tfusion.apiserver.validation import Cause, forbidden, invalid_value, required

DEPLOYMENTS = "apps/deployments"
REPLICASETS = "apps/replicasets"
JOBS = "batch/jobs"
CRONJOBS = "batch/cronjobs"
WORKLOAD_KEYS = (DEPLOYMENTS, REPLICASETS, JOBS, CRONJOBS)

#: labels kube-apiserver puts on a Job's pod template (both spellings, as kube 1.27+ does)
JOB_CONTROLLER_UID = "batch.kubernetes.io/controller-uid"
JOB_NAME = "batch.kubernetes.io/job-name"
LEGACY_JOB_CONTROLLER_UID = "controller-uid"
LEGACY_JOB_NAME = "job-name"

_PERCENT = re.compile(r"[0-9]+%")
_PERCENT_MSG = (
    "a valid percent string must be a numeric string followed by an ending '%' (e.g. '1%',  or '93%', "
    "regex used for validation is '[0-9]+%')"
)
_SUPPORTED_STRATEGIES = ("Recreate", "RollingUpdate")
_JOB_RESTART_POLICIES = ("OnFailure", "Never")
_CONCURRENCY_POLICIES = ("Allow", "Forbid", "Replace")


def not_supported(field: str, value: Any, allowed: tuple[str, ...]) -> Cause:
    shown = f'"{value}"' if isinstance(value, str) else str(value)
    supported = ", ".join(f'"{a}"' for a in allowed)
    return field, "FieldValueNotSupported", f"Unsupported value: {shown}: supported values: {supported}"


# ------------------------------------------------------------------------------------ defaults
def _template_spec(obj: dict[str, Any]) -> dict[str, Any] | None:
    spec = obj.get("spec")
    template = spec.get("template") if isinstance(spec, dict) else None
    if not isinstance(template, dict):
        return None
    template.setdefault("metadata", {})
    template_spec = template.setdefault("spec", {})
    return template_spec if isinstance(template_spec, dict) else None


def default_template(obj: dict[str, Any]) -> None:
    """The pod template gets the pod-spec defaults (not the pod-only ones: service account, links)."""
    template_spec = _template_spec(obj)
    if template_spec is not None:
        validation.default_pod_spec(template_spec)


def default_deployment(obj: dict[str, Any]) -> None:
    spec = obj.setdefault("spec", {})
    if not isinstance(spec, dict):
        return
    spec.setdefault("replicas", 1)
    strategy = spec.setdefault("strategy", {})
    if isinstance(strategy, dict):
        strategy.setdefault("type", "RollingUpdate")
        if strategy["type"] == "RollingUpdate":
            rolling = strategy.setdefault("rollingUpdate", {})
            if isinstance(rolling, dict):
                rolling.setdefault("maxUnavailable", "25%")
                rolling.setdefault("maxSurge", "25%")
    spec.setdefault("revisionHistoryLimit", 10)
    spec.setdefault("progressDeadlineSeconds", 600)
    default_template(obj)


def default_replicaset(obj: dict[str, Any]) -> None:
    spec = obj.setdefault("spec", {})
    if isinstance(spec, dict):
        spec.setdefault("replicas", 1)
    default_template(obj)


def default_job(obj: dict[str, Any], *, creating: bool) -> None:
    spec = obj.setdefault("spec", {})
    if not isinstance(spec, dict):
        return
    if spec.get("completions") is None and spec.get("parallelism") is None:
        spec["completions"] = 1
    spec.setdefault("parallelism", 1)
    # with per-index retries the Job-wide limit steps aside (kube defaults it to the int32 maximum)
    spec.setdefault("backoffLimit", 2147483647 if spec.get("backoffLimitPerIndex") is not None else 6)
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)
    spec.setdefault("podReplacementPolicy", "TerminatingOrFailed")
    default_template(obj)
    meta = obj["metadata"]
    uid = meta.get("uid")
    if creating and uid and spec.get("manualSelector") is not True:
        _generate_job_selector(obj, str(uid))
    template = spec.get("template")
    labels = (template.get("metadata") or {}).get("labels") if isinstance(template, dict) else None
    if creating and not meta.get("labels") and isinstance(labels, dict) and labels:
        meta["labels"] = dict(labels)  # kube: a Job without labels takes its pod template's


def _generate_job_selector(job: dict[str, Any], uid: str) -> None:
    """kube's generated selector: the pods carry the Job's uid, and the selector asks for it."""
    spec = job["spec"]
    template = spec.get("template")
    if not isinstance(template, dict) or not isinstance(template.get("metadata"), dict):
        return
    labels = template["metadata"].setdefault("labels", {})
    if not isinstance(labels, dict):
        return
    name = job["metadata"].get("name", "")
    for key, value in ((LEGACY_JOB_CONTROLLER_UID, uid), (JOB_CONTROLLER_UID, uid),
                       (LEGACY_JOB_NAME, name), (JOB_NAME, name)):
        labels.setdefault(key, value)  # a label the user set is kept: validation reports a mismatch
    selector = spec.get("selector")
    if not isinstance(selector, dict):
        selector = spec["selector"] = {}
    match = selector.setdefault("matchLabels", {})
    if isinstance(match, dict):
        match.setdefault(JOB_CONTROLLER_UID, uid)


# ------------------------------------------------------------------------------------ validation
def _non_negative(spec: dict[str, Any], key: str) -> list[Cause]:
    value = spec.get(key)
    if isinstance(value, int) and value < 0:
        return [invalid_value(f"spec.{key}", value, "must be greater than or equal to 0")]
    return []


def _selector_and_template(spec: dict[str, Any], what: str) -> list[Cause]:
    """A selector is required, must not be empty, and must select the template's labels."""
    selector = spec.get("selector")
    if selector is None:
        return [required("spec.selector")]
    try:
        compiled = label_selector_from_dict(selector, field="spec.selector")
    except SelectorError as exc:
        return [invalid_value("spec.selector", selector, str(exc))]
    if compiled.empty:
        return [invalid_value("spec.selector", _selector_text(selector), f"empty selector is invalid for {what}")]
    template = spec.get("template")
    if not isinstance(template, dict):
        return [required("spec.template")]
    labels = (template.get("metadata") or {}).get("labels") or {}
    if not compiled.matches(labels):
        return [invalid_value("spec.template.metadata.labels", _labels_text(labels),
                              "`selector` does not match template `labels`")]
    return []


def _selector_text(selector: Any) -> str:
    return str(selector)


def _labels_text(labels: dict[str, Any]) -> str:
    inner = ", ".join(f'"{k}":"{v}"' for k, v in sorted(labels.items()))
    return f"map[string]string{{{inner}}}"


def _template_causes(spec: dict[str, Any], restart_policies: tuple[str, ...]) -> list[Cause]:
    template = spec.get("template")
    if not isinstance(template, dict):
        return []
    causes = [(f"spec.template.{field}", reason, message)
              for field, reason, message in validation.validate_metadata(template.get("metadata") or {})]
    pod_causes = validation.validate_pod({"spec": template.get("spec")})
    causes += [(f"spec.template.{field}", reason, message) for field, reason, message in pod_causes]
    policy = (template.get("spec") or {}).get("restartPolicy") if isinstance(template.get("spec"), dict) else None
    if policy not in restart_policies:
        causes.append(not_supported("spec.template.spec.restartPolicy", policy, restart_policies))
    return causes


def _int_or_percent(field: str, value: Any) -> tuple[list[Cause], int | None, bool]:
    """(causes, the number, whether it is a percentage)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            return [invalid_value(field, value, "must be greater than or equal to 0")], None, False
        return [], value, False
    if isinstance(value, str) and _PERCENT.fullmatch(value):
        return [], int(value[:-1]), True
    return [invalid_value(field, value, _PERCENT_MSG)], None, False


def _strategy_causes(spec: dict[str, Any]) -> list[Cause]:
    strategy = spec.get("strategy") or {}
    kind = strategy.get("type")
    if kind not in _SUPPORTED_STRATEGIES:
        return [not_supported("spec.strategy.type", kind, _SUPPORTED_STRATEGIES)]
    rolling = strategy.get("rollingUpdate")
    if kind == "Recreate":
        if rolling is not None:
            return [forbidden("spec.strategy.rollingUpdate",
                              "may not be specified when strategy `type` is 'Recreate'")]
        return []
    if not isinstance(rolling, dict):
        return []
    base = "spec.strategy.rollingUpdate"
    surge_causes, surge, _ = _int_or_percent(f"{base}.maxSurge", rolling.get("maxSurge", "25%"))
    unavailable_causes, unavailable, percent = _int_or_percent(
        f"{base}.maxUnavailable", rolling.get("maxUnavailable", "25%"))
    causes = surge_causes + unavailable_causes
    if causes:
        return causes
    if percent and unavailable is not None and unavailable > 100:
        causes.append(invalid_value(f"{base}.maxUnavailable", rolling["maxUnavailable"],
                                    "must not be greater than 100%"))
    if surge == 0 and unavailable == 0:
        causes.append(invalid_value(f"{base}.maxUnavailable", rolling["maxUnavailable"],
                                    "may not be 0 when `maxSurge` is 0"))
    return causes


def _immutable(old: dict[str, Any] | None, new: dict[str, Any], *keys: str) -> list[Cause]:
    if old is None:
        return []
    old_spec, new_spec = old.get("spec") or {}, new.get("spec") or {}
    return [invalid_value(f"spec.{key}", _selector_text(new_spec.get(key)) if key == "selector" else "",
                          "field is immutable")
            for key in keys if old_spec.get(key) != new_spec.get(key)]


def _spec(obj: dict[str, Any]) -> dict[str, Any] | None:
    spec = obj.get("spec")
    return spec if isinstance(spec, dict) else None


def validate_deployment(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    spec = _spec(obj)
    if spec is None:
        return [required("spec")]
    causes = _non_negative(spec, "replicas") + _selector_and_template(spec, "deployment")
    causes += _template_causes(spec, ("Always",)) + _strategy_causes(spec)
    causes += _non_negative(spec, "minReadySeconds") + _non_negative(spec, "revisionHistoryLimit")
    deadline, min_ready = spec.get("progressDeadlineSeconds"), spec.get("minReadySeconds") or 0
    if isinstance(deadline, int) and isinstance(min_ready, int) and deadline <= min_ready:
        causes.append(invalid_value("spec.progressDeadlineSeconds", deadline,
                                    "must be greater than minReadySeconds"))
    return causes + _immutable(old, obj, "selector")


def validate_replicaset(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    spec = _spec(obj)
    if spec is None:
        return [required("spec")]
    causes = _non_negative(spec, "replicas") + _selector_and_template(spec, "replicaset")
    causes += _template_causes(spec, ("Always",)) + _non_negative(spec, "minReadySeconds")
    return causes + _immutable(old, obj, "selector")


def validate_job(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    spec = _spec(obj)
    if spec is None:
        return [required("spec")]
    causes: list[Cause] = []
    for key in ("parallelism", "completions", "backoffLimit"):
        causes += _non_negative(spec, key)
    deadline = spec.get("activeDeadlineSeconds")
    if isinstance(deadline, int) and deadline <= 0:
        causes.append(invalid_value("spec.activeDeadlineSeconds", deadline, "must be greater than 0"))
    mode = spec.get("completionMode")
    if mode not in ("NonIndexed", "Indexed", None):
        causes.append(not_supported("spec.completionMode", mode, ("NonIndexed", "Indexed")))
    if mode == "Indexed" and spec.get("completions") is None:
        causes.append(required("spec.completions", "when completionMode is Indexed"))
    causes += _selector_and_template(spec, "job") + _template_causes(spec, _JOB_RESTART_POLICIES)
    if spec.get("manualSelector") is not True and not causes:
        causes += _generated_selector_causes(obj)
    causes += batch_rules.job_causes(spec, _spec(old) if old is not None else None)
    return causes + _immutable(old, obj, "selector", "template", "manualSelector")


def _generated_selector_causes(job: dict[str, Any]) -> list[Cause]:
    """Without manualSelector the pods must carry this Job's uid (another Job's pods must not match)."""
    uid = job["metadata"].get("uid", "")
    labels = ((job["spec"].get("template") or {}).get("metadata") or {}).get("labels") or {}
    if uid and labels.get(JOB_CONTROLLER_UID) != uid:
        return [invalid_value(f"spec.template.metadata.labels[{JOB_CONTROLLER_UID}]",
                              labels.get(JOB_CONTROLLER_UID, ""),
                              f"must be '{uid}'")]
    selector = job["spec"].get("selector") or {}
    if uid and (selector.get("matchLabels") or {}).get(JOB_CONTROLLER_UID) != uid:
        return [invalid_value("spec.selector", _selector_text(selector),
                              "`selector` not auto-generated (set manualSelector: true to choose your own)")]
    return []


def default_cronjob(obj: dict[str, Any]) -> None:
    spec = obj.setdefault("spec", {})
    if isinstance(spec, dict):
        for key, value in (("concurrencyPolicy", "Allow"), ("suspend", False), ("successfulJobsHistoryLimit", 3),
                           ("failedJobsHistoryLimit", 1)):
            spec.setdefault(key, value)


def validate_cronjob(obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[Cause]:
    spec = _spec(obj)
    if spec is None:
        return [required("spec")]
    causes = batch_rules.schedule_causes(spec, _spec(old) if old is not None else None)
    if spec.get("concurrencyPolicy") not in _CONCURRENCY_POLICIES:
        causes.append(not_supported("spec.concurrencyPolicy", spec.get("concurrencyPolicy"), _CONCURRENCY_POLICIES))
    for key in ("startingDeadlineSeconds", "successfulJobsHistoryLimit", "failedJobsHistoryLimit"):
        causes += _non_negative(spec, key)
    template = spec.get("jobTemplate")
    job_spec = template.get("spec") if isinstance(template, dict) else None
    if not isinstance(job_spec, dict) or not isinstance(job_spec.get("template"), dict):
        causes.append(required("spec.jobTemplate.spec.template"))
    return causes


def defaults(storage_key: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
    if storage_key == DEPLOYMENTS:
        default_deployment(obj)
    elif storage_key == REPLICASETS:
        default_replicaset(obj)
    elif storage_key == JOBS:
        default_job(obj, creating=old is None)
    elif storage_key == CRONJOBS:
        default_cronjob(obj)


def validate(storage_key: str, obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    if storage_key == DEPLOYMENTS:
        return validate_deployment(obj, old)
    if storage_key == REPLICASETS:
        return validate_replicaset(obj, old)
    if storage_key == JOBS:
        return validate_job(obj, old)
    if storage_key == CRONJOBS:
        return validate_cronjob(obj, old)
    return []


def format_selector(selector: Any) -> str:
    """kube's FormatLabelSelector: "app=web,tier in (a,b)", requirements sorted by key; "<none>" for none."""
    if not isinstance(selector, dict):
        return "<none>"
    parts: list[tuple[str, str]] = [(str(k), f"{k}={v}") for k, v in (selector.get("matchLabels") or {}).items()]
    for expression in selector.get("matchExpressions") or []:
        if not isinstance(expression, dict):
            continue
        key, operator = str(expression.get("key", "")), expression.get("operator")
        values = ",".join(sorted(str(v) for v in expression.get("values") or []))
        text = {"In": f"{key} in ({values})", "NotIn": f"{key} notin ({values})", "Exists": key,
                "DoesNotExist": f"!{key}"}.get(str(operator), key)
        parts.append((key, text))
    return ",".join(text for _, text in sorted(parts)) or "<none>"
