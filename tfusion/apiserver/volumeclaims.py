"""Defaults and validation of core/v1 PersistentVolumeClaims.

Why it exists: a StatefulSet with `volumeClaimTemplates` gets one claim per pod, and charts apply
claims of their own; refusing the kind would refuse those manifests. Claims are stored and checked
as kube-apiserver checks them in the parts a client sees (access modes, the storage request, the
volume mode, a spec that only grows its request after creation). No PersistentVolumes or
StorageClasses are served: on the simulated node a claim is Bound at once with the capacity it asks
for (tfusion/embedded/volumes.py), and nothing is mounted because no container runs.
"""

from __future__ import annotations

from typing import Any

from tfusion.api.quantity import ALLOWED, QuantityError, parse_quantity
from tfusion.apiserver.apps import not_supported
from tfusion.apiserver.validation import Cause, forbidden, invalid_value, required

PVCS = "/persistentvolumeclaims"
ACCESS_MODES = ("ReadOnlyMany", "ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod")
VOLUME_MODES = ("Block", "Filesystem")
#: what an update may change in a claim's spec (kube also allows volumeAttributesClassName)
_MUTABLE = ("resources", "volumeAttributesClassName")


def default_claim(obj: dict[str, Any], old: dict[str, Any] | None) -> None:
    spec = obj.get("spec")
    if isinstance(spec, dict):
        spec.setdefault("volumeMode", "Filesystem")
    if old is None:
        obj["status"] = {"phase": "Pending"}


def validate_claim(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [required("spec")]
    causes = claim_spec_causes(spec, "spec")
    if old is not None:
        causes += _update_causes(old.get("spec") or {}, spec)
    return causes


def claim_spec_causes(spec: dict[str, Any], at: str) -> list[Cause]:
    """The checks of a claim's spec, at `at` (a claim's `spec`, or a StatefulSet's claim template)."""
    causes: list[Cause] = []
    modes = spec.get("accessModes")
    if not isinstance(modes, list) or not modes:
        causes.append(required(f"{at}.accessModes", "at least 1 access mode is required"))
    else:
        causes += [not_supported(f"{at}.accessModes", mode, ACCESS_MODES) for mode in modes
                   if mode not in ACCESS_MODES]
        if "ReadWriteOncePod" in modes and len(modes) > 1:
            causes.append(forbidden(f"{at}.accessModes", "may not use ReadWriteOncePod with other access modes"))
    if spec.get("volumeMode") is not None and spec["volumeMode"] not in VOLUME_MODES:
        causes.append(not_supported(f"{at}.volumeMode", spec["volumeMode"], VOLUME_MODES))
    return causes + _storage_causes((spec.get("resources") or {}).get("requests"), at)


def _storage_causes(requests: Any, at: str) -> list[Cause]:
    field = f"{at}.resources[storage]"
    if not isinstance(requests, dict) or requests.get("storage") is None:
        return [required(field)]
    try:
        amount = parse_quantity(requests["storage"])
    except QuantityError as exc:
        return [invalid_value(field, requests["storage"], f"must be a quantity ({exc.reason}): {ALLOWED}")]
    if amount.sign() <= 0:
        return [invalid_value(field, requests["storage"], "must be greater than zero")]
    return []


def _update_causes(old: dict[str, Any], new: dict[str, Any]) -> list[Cause]:
    if any(old.get(k) != new.get(k) for k in set(old) | set(new) if k not in _MUTABLE):
        return [forbidden("spec", "spec is immutable after creation except resources.requests and "
                                  "volumeAttributesClassName for bound claims")]
    before, after = ((s.get("resources") or {}).get("requests") or {} for s in (old, new))
    try:
        shrunk = parse_quantity(after["storage"]) < parse_quantity(before["storage"])
    except (KeyError, QuantityError, TypeError):
        return []  # a missing or bad request is reported by the spec checks
    if shrunk:
        return [forbidden("spec.resources.requests.storage", "field can not be less than previous value")]
    return []





_MODE_ABBREVIATIONS = {"ReadWriteOnce": "RWO", "ReadOnlyMany": "ROX", "ReadWriteMany": "RWX",
                       "ReadWriteOncePod": "RWOP"}


def _access_modes(claim: dict[str, Any]) -> str:
    modes = (claim.get("status") or {}).get("accessModes") or []
    return ",".join(_MODE_ABBREVIATIONS.get(str(m), str(m)) for m in modes)


def _capacity(claim: dict[str, Any]) -> str:
    return str(((claim.get("status") or {}).get("capacity") or {}).get("storage", ""))


def table_columns(name: Any, age: Any) -> dict[str, list[Any]]:
    """`kubectl get pvc` columns as kube prints them (tables.py merges them in)."""
    def spec(key: str, default: str) -> Any:
        return lambda o: str((o.get("spec") or {}).get(key) or default)

    return {PVCS: [name, ("Status", "string", "status.phase", lambda o: (o.get("status") or {}).get("phase", "")),
                   ("Volume", "string", "spec.volumeName", spec("volumeName", "")),
                   ("Capacity", "string", "status.capacity.storage", _capacity),
                   ("Access Modes", "string", "status.accessModes", _access_modes),
                   ("StorageClass", "string", "spec.storageClassName", spec("storageClassName", "")),
                   ("VolumeAttributesClass", "string", "spec.volumeAttributesClassName",
                    spec("volumeAttributesClassName", "<unset>")), age,
                   ("VolumeMode", "string", "spec.volumeMode", spec("volumeMode", ""))]}


__all__ = ["ACCESS_MODES", "PVCS", "VOLUME_MODES", "claim_spec_causes", "default_claim", "table_columns",
           "validate_claim"]
