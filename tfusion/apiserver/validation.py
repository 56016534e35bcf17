"""Checks and defaults kube-apiserver applies to built-in kinds (names, pods, namespaces, ...).

Only what clients of tfusion can observe is implemented: object names, the fields a pod must have,
its resource quantities (the schedulers and quotas parse them), which pod fields may change after
creation, and the defaults kube-apiserver fills in.
"""

from __future__ import annotations

import base64
from typing import Any

from tfusion.api.names import (
    DNS1123_LABEL,
    LABEL_MSG,
    Cause,
    forbidden,
    invalid_value,
    required,
    validate_name,
)
from tfusion.api.quantity import ALLOWED, QuantityError, parse_quantity
from tfusion.apiserver import metadata_keys

__all__ = [
    # the name rules and cause builders live in api/names.py; the handlers name them as validation.*
    "Cause",
    "default_mutating_webhooks",
    "default_pod",
    "default_pod_spec",
    "default_secret",
    "default_service",
    "forbidden",
    "invalid_value",
    "pod_qos_class",
    "required",
    "validate_metadata",
    "validate_name",
    "validate_pod",
    "validate_pod_update",
]


def validate_metadata(meta: dict[str, Any]) -> list[Cause]:
    causes: list[Cause] = []
    for field in ("labels", "annotations"):
        value = meta.get(field)
        if value is None:
            continue
        if not isinstance(value, dict):
            causes.append(invalid_value(f"metadata.{field}", value, "must be a map of string to string"))
            continue
        for key, val in value.items():
            if not isinstance(val, str):
                causes.append(invalid_value(f"metadata.{field}", val, f"value of {key!r} must be a string"))
        causes += metadata_keys.check_map(field, value)
    finalizers = meta.get("finalizers")
    if finalizers is not None and (not isinstance(finalizers, list) or not all(isinstance(f, str) for f in finalizers)):
        causes.append(invalid_value("metadata.finalizers", finalizers, "must be a list of strings"))
    return causes


# ------------------------------------------------------------------------------------ pods
def default_pod(pod: dict[str, Any]) -> None:
    spec = pod.setdefault("spec", {})
    spec.setdefault("serviceAccountName", spec.get("serviceAccount") or "default")
    spec.setdefault("enableServiceLinks", True)
    default_pod_spec(spec, requests_from_limits=True)


def default_pod_spec(spec: dict[str, Any], *, requests_from_limits: bool = False) -> None:
    """The defaults of a pod spec, also a workload's pod template (kube's SetDefaults_PodSpec);
    the service account, service links and requests-from-limits are defaults of pods only."""
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("securityContext", {})
    for kind in ("containers", "initContainers"):
        for container in spec.get(kind) or []:
            if isinstance(container, dict):
                container.setdefault("terminationMessagePath", "/dev/termination-log")
                container.setdefault("terminationMessagePolicy", "File")
                image = container.get("image", "")
                tag_latest = isinstance(image, str) and (":" not in image.rsplit("/", 1)[-1]) and "@" not in image
                container.setdefault("imagePullPolicy", "Always" if tag_latest else "IfNotPresent")
                resources = container.setdefault("resources", {})
                limits = resources.get("limits")
                if requests_from_limits and isinstance(limits, dict) and limits:
                    # kube-apiserver defaults each missing request to its limit
                    requests = resources.setdefault("requests", {})
                    if isinstance(requests, dict):
                        for name, quantity in limits.items():
                            requests.setdefault(name, quantity)


def validate_pod(pod: dict[str, Any]) -> list[Cause]:
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return [required("spec")]
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        return [required("spec.containers")]
    causes: list[Cause] = []
    seen: set[str] = set()
    for kind in ("initContainers", "containers"):
        for i, container in enumerate(spec.get(kind) or []):
            path = f"spec.{kind}[{i}]"
            if not isinstance(container, dict):
                causes.append(invalid_value(path, container, "must be an object"))
                continue
            name = container.get("name")
            if not name:
                causes.append(required(f"{path}.name"))
            elif not isinstance(name, str) or not DNS1123_LABEL.fullmatch(name):
                causes.append(invalid_value(f"{path}.name", name, LABEL_MSG))
            elif name in seen:
                causes.append((f"{path}.name", "FieldValueDuplicate", f'Duplicate value: "{name}"'))
            else:
                seen.add(name)
            if not container.get("image"):
                causes.append(required(f"{path}.image"))
            resources = container.get("resources")
            if isinstance(resources, dict):
                for which in ("requests", "limits"):
                    causes += _quantity_causes(f"{path}.resources.{which}", resources.get(which))
    return causes + _quantity_causes("spec.overhead", spec.get("overhead"))


def _quantity_causes(path: str, quantities: Any) -> list[Cause]:
    """Each value of a resource map that is not a non-negative quantity (the JSON types are
    shapes.py's): the scheduler and the quota code parse these, and kube refuses them too."""
    causes: list[Cause] = []
    for name, value in (quantities.items() if isinstance(quantities, dict) else ()):
        shown = value if not isinstance(value, str) or len(value) <= 60 else value[:57] + "..."
        try:
            negative = parse_quantity(value).sign() < 0
        except QuantityError as exc:
            why = f"must be a quantity ({exc.reason}): {ALLOWED}"
            causes.append(invalid_value(f"{path}[{name}]", shown, why))
            continue
        if negative:
            causes.append(invalid_value(f"{path}[{name}]", shown, "must be greater than or equal to 0"))
    return causes


_MUTABLE_POD_SPEC = {"activeDeadlineSeconds", "tolerations", "schedulingGates"}


def validate_pod_update(old: dict[str, Any], new: dict[str, Any]) -> list[Cause]:
    """kube-apiserver lets a pod's spec change only in container images and a few other fields."""
    old_spec, new_spec = dict(old.get("spec") or {}), dict(new.get("spec") or {})
    for kind in ("containers", "initContainers"):
        olds, news = old_spec.get(kind) or [], new_spec.get(kind) or []
        if len(olds) == len(news):
            old_spec[kind] = [{**o, "image": None} for o in olds]
            new_spec[kind] = [{**n, "image": None} for n in news]
    for key in _MUTABLE_POD_SPEC:
        old_spec.pop(key, None)
        new_spec.pop(key, None)
    if old_spec != new_spec:
        return [
            forbidden(
                "spec",
                "pod updates may not change fields other than `spec.containers[*].image`, "
                "`spec.initContainers[*].image`, `spec.activeDeadlineSeconds`, "
                "`spec.tolerations` (only additions to existing tolerations) or "
                "`spec.schedulingGates`",
            )
        ]
    return []


def default_service(svc: dict[str, Any]) -> None:
    spec = svc.setdefault("spec", {})
    spec.setdefault("type", "ClusterIP")
    spec.setdefault("sessionAffinity", "None")
    for port in spec.get("ports") or []:
        if isinstance(port, dict):
            port.setdefault("protocol", "TCP")
            if "port" in port:
                port.setdefault("targetPort", port["port"])


def default_secret(secret: dict[str, Any]) -> None:
    """Type Opaque by default; stringData is write-only and folds into data (base64), as in kube."""
    secret.setdefault("type", "Opaque")
    string_data = secret.pop("stringData", None)
    if isinstance(string_data, dict):
        data = secret.setdefault("data", {})
        for key, value in string_data.items():
            data[key] = base64.b64encode(str(value).encode()).decode()


def default_mutating_webhooks(config: dict[str, Any]) -> None:
    """admissionregistration.k8s.io/v1 defaults, as kube-apiserver stores them."""
    for webhook in config.get("webhooks") or []:
        if not isinstance(webhook, dict):
            continue
        webhook.setdefault("failurePolicy", "Fail")
        webhook.setdefault("matchPolicy", "Equivalent")
        webhook.setdefault("namespaceSelector", {})
        webhook.setdefault("objectSelector", {})
        webhook.setdefault("timeoutSeconds", 10)
        webhook.setdefault("reinvocationPolicy", "Never")
        for rule in webhook.get("rules") or []:
            if isinstance(rule, dict):
                rule.setdefault("scope", "*")
        service = (webhook.get("clientConfig") or {}).get("service")
        if isinstance(service, dict):
            service.setdefault("port", 443)


def pod_qos_class(pod: dict[str, Any]) -> str:
    """BestEffort, Burstable or Guaranteed, by kube's rules over cpu and memory of every container."""
    spec = pod.get("spec") or {}
    containers = [c for kind in ("initContainers", "containers") for c in spec.get(kind) or [] if isinstance(c, dict)]
    any_set, guaranteed = False, True
    for container in containers:
        resources = container.get("resources") or {}
        requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
        for name in ("cpu", "memory"):
            if name in requests or name in limits:
                any_set = True
            if name not in limits or str(requests.get(name, limits[name])) != str(limits[name]):
                guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"
