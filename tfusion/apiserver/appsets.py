"""Defaults and validation of apps/v1 DaemonSet and StatefulSet (and the ControllerRevisions they keep).

kube-apiserver keeps these in the apps registry strategies; as for Deployments (apps.py), only the
fields the embedded DaemonSet and StatefulSet controllers act on are defaulted and validated, with
kube's defaults and field paths, so a manifest kube would refuse is refused here naming the same
field. The pod template is defaulted and validated as a pod spec.
"""

from __future__ import annotations

from typing import Any

from tfusion.apiserver import apps, volumeclaims
from tfusion.apiserver.validation import Cause, forbidden, invalid_value, required

DAEMONSETS = "apps/daemonsets"
STATEFULSETS = "apps/statefulsets"
REVISIONS = "apps/controllerrevisions"
SET_KEYS = (DAEMONSETS, STATEFULSETS, REVISIONS)

_UPDATE_TYPES = ("RollingUpdate", "OnDelete")
_POD_MANAGEMENT = ("OrderedReady", "Parallel")
_RETENTION = ("Retain", "Delete")
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
    retention = spec.setdefault("persistentVolumeClaimRetentionPolicy", {})
    if isinstance(retention, dict):
        for key in ("whenDeleted", "whenScaled"):
            retention.setdefault(key, "Retain")
    for template in spec.get("volumeClaimTemplates") or []:
        if isinstance(template, dict) and isinstance(template.get("spec"), dict):
            template["spec"].setdefault("volumeMode", "Filesystem")
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
    if isinstance(rolling, dict):
        causes += _rolling_causes(rolling)
    return causes + apps._immutable(old, obj, "selector")


def _rolling_causes(rolling: dict[str, Any]) -> list[Cause]:
    """Both bounds are counts or percentages up to 100%, and exactly one of them is non-zero."""
    base = "spec.updateStrategy.rollingUpdate"
    causes: list[Cause] = []
    amounts: dict[str, int] = {}
    for key in ("maxUnavailable", "maxSurge"):
        if rolling.get(key) is None:
            amounts[key] = 0
            continue
        found, amount, percent = apps._int_or_percent(f"{base}.{key}", rolling[key])
        causes += found
        if amount is not None and percent and amount > 100:
            causes.append(invalid_value(f"{base}.{key}", rolling[key], "must not be greater than 100%"))
        amounts[key] = amount or 0
    if causes:
        return causes
    if amounts["maxUnavailable"] and amounts["maxSurge"]:
        return [invalid_value(f"{base}.maxSurge", rolling["maxSurge"],
                              "may not be set when maxUnavailable is non-zero")]
    if not amounts["maxUnavailable"] and not amounts["maxSurge"]:
        return [required(f"{base}.maxUnavailable", "cannot be 0 when maxSurge is 0")]
    return []


def _claim_causes(spec: dict[str, Any]) -> list[Cause]:
    """Each volumeClaimTemplate is a named claim; the retention policy says Retain or Delete."""
    causes: list[Cause] = []
    templates = spec.get("volumeClaimTemplates") or []
    for i, template in enumerate(templates if isinstance(templates, list) else []):
        at = f"spec.volumeClaimTemplates[{i}]"
        if not isinstance(template, dict) or not (template.get("metadata") or {}).get("name"):
            causes.append(required(f"{at}.metadata.name"))
            continue
        causes += volumeclaims.claim_spec_causes(template.get("spec") or {}, f"{at}.spec")
    retention = spec.get("persistentVolumeClaimRetentionPolicy") or {}
    for key in ("whenDeleted", "whenScaled"):
        value = retention.get(key) if isinstance(retention, dict) else None
        if value not in _RETENTION:
            causes.append(apps.not_supported(f"spec.persistentVolumeClaimRetentionPolicy.{key}", value,
                                             _RETENTION))
    return causes


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
    causes += _claim_causes(spec)
    if old is not None:
        old_spec = _spec(old) or {}
        if any(old_spec.get(k) != spec.get(k) for k in set(old_spec) | set(spec) if k not in _STS_MUTABLE):
            mutable = ", ".join(f"'{k}'" for k in _STS_MUTABLE)
            causes.append(forbidden("spec", f"updates to statefulset spec for fields other than {mutable} "
                                            "are forbidden"))
    return causes


def validate_revision(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    """A ControllerRevision holds data (any object) and a non-negative revision; its data never changes."""
    causes: list[Cause] = []
    if obj.get("data") is None:
        causes.append(required("data", "data is mandatory"))
    revision = obj.get("revision")
    if not isinstance(revision, int) or isinstance(revision, bool) or revision < 0:
        causes.append(invalid_value("revision", revision, "must be an integer greater than or equal to 0"))
    if old is not None and old.get("data") != obj.get("data"):
        causes.append(invalid_value("data", "", "field is immutable"))
    return causes


def _controller(revision: dict[str, Any]) -> str:
    """`<kind>.<group>/<name>` of the revision's controller, as `kubectl get controllerrevisions` shows it."""
    refs = (revision.get("metadata") or {}).get("ownerReferences") or []
    ref = next((r for r in refs if isinstance(r, dict) and r.get("controller")), None)
    if ref is None:
        return "<none>"
    group = str(ref.get("apiVersion", "")).rpartition("/")[0]
    return f"{str(ref.get('kind', '')).lower()}{'.' + group if group else ''}/{ref.get('name', '')}"


def table_columns(name: Any, age: Any) -> dict[str, list[Any]]:
    """`kubectl get controllerrevisions` columns as kube prints them (tables.py merges them in)."""
    return {REVISIONS: [name, ("Controller", "string", "the revision's controller", _controller),
                        ("Revision", "integer", "revision", lambda o: o.get("revision", 0)), age]}


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
    if storage_key == REVISIONS:
        return validate_revision(obj, old)
    return []
