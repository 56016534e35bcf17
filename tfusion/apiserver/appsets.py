"""Defaults and validation of apps/v1 DaemonSet and StatefulSet.

kube-apiserver keeps these in the apps registry strategies; as for Deployments (apps.py), only the
fields the embedded DaemonSet and StatefulSet controllers act on are defaulted and validated, with
kube's defaults and field paths, so a manifest kube would refuse is refused here naming the same
field. The pod template is defaulted and validated as a pod spec.
"""

from __future__ import annotations

from typing import Any

from tfusion.apiserver import apps
from tfusion.apiserver.validation import Cause, forbidden, required

DAEMONSETS = "apps/daemonsets"
STATEFULSETS = "apps/statefulsets"
SET_KEYS = (DAEMONSETS, STATEFULSETS)

_UPDATE_TYPES = ("RollingUpdate", "OnDelete")
_POD_MANAGEMENT = ("OrderedReady", "Parallel")
#: the StatefulSet spec fields an update may change (kube refuses changes to the others)
_STS_MUTABLE = ("replicas", "ordinals", "template", "updateStrategy", "persistentVolumeClaimRetentionPolicy",
                "minReadySeconds")


def _spec(obj: dict[str, Any]) -> dict[str, Any] | None:
    spec = obj.get("spec")
    return spec if isinstance(spec, dict) else None


def _default_update_strategy(spec: dict[str, Any], **rolling_defaults: int) -> None:
    """`updateStrategy` defaults to RollingUpdate, whose `rollingUpdate` block gets the kind's defaults."""
    strategy = spec.setdefault("updateStrategy", {})
    if not isinstance(strategy, dict):
        return
    strategy.setdefault("type", "RollingUpdate")
    rolling = strategy.setdefault("rollingUpdate", {}) if strategy["type"] == "RollingUpdate" else None
    if isinstance(rolling, dict):
        for key, value in rolling_defaults.items():
            rolling.setdefault(key, value)


def default_daemonset(obj: dict[str, Any]) -> None:
    spec = _spec(obj)
    if spec is None:
        return
    _default_update_strategy(spec, maxUnavailable=1, maxSurge=0)
    spec.setdefault("revisionHistoryLimit", 10)
    apps.default_template(obj)


def default_statefulset(obj: dict[str, Any]) -> None:
    spec = _spec(obj)
    if spec is None:
        return
    spec.setdefault("replicas", 1)
    spec.setdefault("podManagementPolicy", "OrderedReady")
    _default_update_strategy(spec, partition=0)
    spec.setdefault("revisionHistoryLimit", 10)
    spec.setdefault("persistentVolumeClaimRetentionPolicy", {"whenDeleted": "Retain", "whenScaled": "Retain"})
    apps.default_template(obj)


def _strategy_causes(spec: dict[str, Any]) -> list[Cause]:
    strategy = spec.get("updateStrategy") or {}
    kind = strategy.get("type") if isinstance(strategy, dict) else None
    if kind not in _UPDATE_TYPES:
        return [apps.not_supported("spec.updateStrategy.type", kind, _UPDATE_TYPES)]
    rolling = strategy.get("rollingUpdate")
    if kind == "OnDelete" and rolling is not None:
        return [forbidden("spec.updateStrategy.rollingUpdate",
                          "may not be specified when strategy `type` is 'OnDelete'")]
    return []


def validate_daemonset(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    spec = _spec(obj)
    if spec is None:
        return [required("spec")]
    causes = apps._selector_and_template(spec, "daemonset") + apps._template_causes(spec, ("Always",))
    causes += _strategy_causes(spec) + apps._non_negative(spec, "minReadySeconds")
    rolling = (spec.get("updateStrategy") or {}).get("rollingUpdate")
    if isinstance(rolling, dict) and "maxUnavailable" in rolling:
        causes += apps._int_or_percent("spec.updateStrategy.rollingUpdate.maxUnavailable",
                                       rolling["maxUnavailable"])[0]
    return causes + apps._immutable(old, obj, "selector")


def validate_statefulset(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    spec = _spec(obj)
    if spec is None:
        return [required("spec")]
    causes = apps._non_negative(spec, "replicas") + apps._selector_and_template(spec, "statefulset")
    causes += apps._template_causes(spec, ("Always",)) + _strategy_causes(spec)
    causes += apps._non_negative(spec, "minReadySeconds")
    policy = spec.get("podManagementPolicy")
    if policy not in _POD_MANAGEMENT:
        causes.append(apps.not_supported("spec.podManagementPolicy", policy, _POD_MANAGEMENT))
    if old is not None:
        old_spec = _spec(old) or {}
        if any(old_spec.get(k) != spec.get(k) for k in set(old_spec) | set(spec) if k not in _STS_MUTABLE):
            mutable = ", ".join(f"'{k}'" for k in _STS_MUTABLE)
            causes.append(forbidden("spec", f"updates to statefulset spec for fields other than {mutable} "
                                            "are forbidden"))
    return causes


def defaults(storage_key: str, obj: dict[str, Any]) -> None:
    if storage_key == DAEMONSETS:
        default_daemonset(obj)
    elif storage_key == STATEFULSETS:
        default_statefulset(obj)


def validate(storage_key: str, obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    if storage_key == DAEMONSETS:
        return validate_daemonset(obj, old)
    if storage_key == STATEFULSETS:
        return validate_statefulset(obj, old)
    return []
