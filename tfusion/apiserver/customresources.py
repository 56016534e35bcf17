"""CustomResourceDefinitions: checking them, serving their kinds, and holding custom objects to their schema.

Storing a CRD registers one `ResourceInfo` per served version at once (kube-apiserver establishes a
CRD within a second; we do it in the same write), with its status conditions Established and
NamesAccepted. Custom objects are pruned, defaulted and validated against the version's
openAPIV3Schema through tfusion.api.schema, so what kube-apiserver rejects is rejected here too.
"""

from __future__ import annotations

from typing import Any

from tfusion.apiserver.resources import Registry, ResourceInfo
from tfusion.apiserver.validation import Cause, invalid_value, required


def default_crd(crd: dict[str, Any]) -> None:
    spec = crd.setdefault("spec", {})
    if not isinstance(spec, dict):
        return
    names = spec.get("names")
    if isinstance(names, dict) and isinstance(names.get("kind"), str):
        names.setdefault("singular", names["kind"].lower())
        names.setdefault("listKind", names["kind"] + "List")
    spec.setdefault("conversion", {"strategy": "None"})
    for version in _list(spec.get("versions")):
        if isinstance(version, dict):
            version.setdefault("served", True)
            version.setdefault("storage", False)
    crd["status"] = _status(crd)


def _status(crd: dict[str, Any]) -> dict[str, Any]:
    from tfusion.api.timestamps import rfc3339

    spec = crd.get("spec") or {}
    storage = [v["name"] for v in _list(spec.get("versions"))
               if isinstance(v, dict) and v.get("storage") and isinstance(v.get("name"), str)]
    raw_status = crd.get("status")
    old_status: dict[str, Any] = raw_status if isinstance(raw_status, dict) else {}
    stored = [v for v in _list(old_status.get("storedVersions")) if isinstance(v, str)]
    for name in storage:
        if name not in stored:
            stored.append(name)
    stamp = rfc3339()
    old_conditions = {c.get("type"): c for c in _list(old_status.get("conditions")) if isinstance(c, dict)}

    def condition(kind: str, reason: str, message: str) -> dict[str, Any]:
        previous = old_conditions.get(kind)
        when = previous["lastTransitionTime"] if previous and previous.get("status") == "True" else stamp
        return {"type": kind, "status": "True", "lastTransitionTime": when, "reason": reason, "message": message}

    return {
        "conditions": [
            condition("NamesAccepted", "NoConflicts", "no conflicts found"),
            condition("Established", "InitialNamesAccepted", "the initial names have been accepted"),
        ],
        "acceptedNames": dict(names) if isinstance(names := spec.get("names"), dict) else {},
        "storedVersions": stored,
    }


def validate_crd(crd: dict[str, Any], old: dict[str, Any] | None, registry: Registry) -> list[Cause]:
    spec = crd.get("spec")
    if not isinstance(spec, dict):
        return [required("spec")]
    causes: list[Cause] = []
    group = spec.get("group")
    if not group or not isinstance(group, str):
        causes.append(required("spec.group"))
    elif "." not in group:
        causes.append(invalid_value("spec.group", group, "should be a domain with at least one dot"))
    names = spec.get("names")
    if not isinstance(names, dict):
        return [*causes, required("spec.names")]
    for key in ("plural", "kind"):
        if not isinstance(names.get(key), str) or not names.get(key):
            causes.append(required(f"spec.names.{key}"))
    for key in ("singular", "listKind"):
        if names.get(key) is not None and not isinstance(names[key], str):
            causes.append(invalid_value(f"spec.names.{key}", names[key], "must be a string"))
    for key in ("shortNames", "categories"):
        listed = names.get(key)
        if listed is not None and (not isinstance(listed, list) or not all(isinstance(x, str) for x in listed)):
            causes.append(invalid_value(f"spec.names.{key}", listed, "must be a list of strings"))
    plural = names.get("plural")
    if isinstance(plural, str) and plural and plural != plural.lower():
        causes.append(invalid_value("spec.names.plural", plural, "must be lowercase"))
    if group and plural and crd["metadata"].get("name") != f"{plural}.{group}":
        causes.append(
            invalid_value("metadata.name", crd["metadata"].get("name"), 'must be spec.names.plural+"."+spec.group')
        )
    if spec.get("scope") not in ("Namespaced", "Cluster"):
        causes.append(
            (
                "spec.scope",
                "FieldValueNotSupported",
                f'Unsupported value: "{spec.get("scope")}": supported values: "Cluster", "Namespaced"',
            )
        )
    versions = spec.get("versions")
    if not isinstance(versions, list) or not versions:
        causes.append(required("spec.versions", "must have exactly one version marked as storage version"))
        return causes
    storage = [v for v in versions if isinstance(v, dict) and v.get("storage")]
    if len(storage) != 1:
        causes.append(
            invalid_value(
                "spec.versions",
                f"{len(storage)} storage versions",
                "must have exactly one version marked as storage version",
            )
        )
    for i, version in enumerate(versions):
        if not isinstance(version, dict) or not version.get("name"):
            causes.append(required(f"spec.versions[{i}].name"))
            continue
        if not isinstance(version["name"], str):
            causes.append(invalid_value(f"spec.versions[{i}].name", version["name"], "must be a string"))
        schema_holder = version.get("schema")
        schema = schema_holder.get("openAPIV3Schema") if isinstance(schema_holder, dict) else None
        if not isinstance(schema, dict):
            causes.append(required(f"spec.versions[{i}].schema.openAPIV3Schema", "schemas are required"))
    from tfusion.apiserver import crd_rules

    causes += crd_rules.crd_rule_causes(crd)
    if old is not None:
        old_spec = old.get("spec") or {}
        if old_spec.get("group") != group:
            causes.append(invalid_value("spec.group", group, "field is immutable"))
        if (old_spec.get("names") or {}).get("plural") != plural:
            causes.append(invalid_value("spec.names.plural", plural, "field is immutable"))
        if old_spec.get("scope") != spec.get("scope"):
            causes.append(invalid_value("spec.scope", spec.get("scope"), "field is immutable"))
    elif group and plural:
        existing = [i for i in registry.all() if i.group == group and i.plural == plural]
        if existing and not existing[0].is_custom:
            causes.append(invalid_value("spec.group", group, "a built-in resource already serves this name"))
    return causes


def _list(value: Any) -> list[Any]:
    """`value` if it is a list, else empty: defaulting runs before validation reports the wrong type."""
    return value if isinstance(value, list) else []


def register(registry: Registry, crd: dict[str, Any]) -> None:
    """Serve every served version of `crd` (replacing what was served for it before)."""
    name = crd["metadata"]["name"]
    registry.remove_crd(name)
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    storage = next((v["name"] for v in spec.get("versions") or [] if v.get("storage")), "")
    served = [version for version in spec.get("versions") or [] if version.get("served", True)]
    # with two served versions a stored object may have been validated against the other's schema
    since = _resource_version(crd) if len(served) == 1 else None
    for version in served:
        schema = (version.get("schema") or {}).get("openAPIV3Schema")
        subresources = version.get("subresources") or {}
        registry.add(
            ResourceInfo(
                group=spec["group"],
                version=version["name"],
                plural=names["plural"],
                kind=names["kind"],
                namespaced=spec.get("scope") == "Namespaced",
                singular=names.get("singular", ""),
                short_names=tuple(names.get("shortNames") or ()),
                categories=tuple(names.get("categories") or ()),
                subresources=("status",) if "status" in subresources else (),
                tracks_generation=True,
                schema=schema,
                schema_since=since,
                printer_columns=list(version.get("additionalPrinterColumns") or []),
                crd_name=name,
                storage_version=storage,
                preserve_unknown=bool((schema or {}).get("x-kubernetes-preserve-unknown-fields")),
            )
        )


def default_custom(info: ResourceInfo, obj: dict[str, Any]) -> None:
    """Prune unknown fields and fill defaults from the schema, in place (kube-apiserver's order)."""
    if info.schema is None:
        return
    from tfusion.api import schema as schemas

    schemas.prune(info.schema, obj)
    schemas.apply_defaults(info.schema, obj)


def unknown_fields(info: ResourceInfo, obj: dict[str, Any]) -> list[str]:
    if info.schema is None:
        return []
    from tfusion.api import schema as schemas

    return schemas.unknown_fields(info.schema, obj)


def validate_custom(info: ResourceInfo, obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[Cause]:
    if info.schema is None:
        return []
    from tfusion.api import schema as schemas
    from tfusion.apiserver import crd_rules

    valid_old = old if old is not None and _validated_against(info, old) else None
    causes: list[Cause] = [(e.field, e.reason, e.message) for e in schemas.validate(info.schema, obj, valid_old)]
    # CEL rules assume the schema's types hold, so (like kube on type errors) they run on schema-valid objects
    return causes or crd_rules.validate(info.schema, obj, old)


def _validated_against(info: ResourceInfo, stored: dict[str, Any]) -> bool:
    """Whether `stored` (an object as the store holds it) was written after its CRD last changed, so
    it passed validation against `info.schema` itself: every write of a custom object is validated."""
    written = _resource_version(stored)
    return info.schema_since is not None and written is not None and written > info.schema_since


def _resource_version(obj: dict[str, Any]) -> int | None:
    try:
        return int(obj["metadata"]["resourceVersion"])
    except (KeyError, TypeError, ValueError):
        return None
