"""`metadata.managedFields`: who set which fields of an object, kept on every write.

kube-apiserver keeps, per object, one entry per field manager, operation (Apply or Update), API
version (Update only) and subresource, each with the set of fields that manager owns (FieldsV1,
see fieldsets.py) and the time it last changed something. Server-side apply (serverside.py) decides
conflicts from these entries; every other write (create, update, patch) records an Update entry for
its manager and takes the fields it changed away from every other manager.

This module holds the entries: reading them from an object (lazily: the writes our controllers make
many times a second touch a few status fields, and most entries can be checked for those paths
without being decoded), checking entries a client sends (a malformed one is a 422), naming the
manager of a request as kube does, and recording an Update.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from tfusion.api.timestamps import rfc3339
from tfusion.apiserver import errors, validation
from tfusion.apiserver.fieldsets import (
    Comparison,
    FieldsError,
    FieldSet,
    Path,
    Shape,
    compare,
    encoded_has,
    encoded_with,
    encoded_without,
    fields_of,
    fields_v1_of,
)

__all__ = [
    "APPLY",
    "UPDATE",
    "Tracking",
    "check_manager",
    "check_sent",
    "encode",
    "for_request",
    "identity",
    "manager_from_user_agent",
    "owned_paths",
    "record",
]

APPLY, UPDATE = "Apply", "Update"
MAX_MANAGER_LENGTH = 128
#: metadata the server keeps for itself: no manager owns it (nor `.metadata`, `.apiVersion`, `.kind`)
_SERVER_METADATA = frozenset(
    "f:" + name
    for name in ("name", "namespace", "creationTimestamp", "selfLink", "uid", "generation", "managedFields",
                 "resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds")
)
_SERVER_TOP = frozenset({"f:apiVersion", "f:kind"})
_Cause = tuple[str, str, str]


@dataclass
class Tracking:
    """What a write tells the ownership bookkeeping: who writes, in which version and subresource.

    `sent` is the managedFields the client put in its object (None: it sent none, keep the stored
    ones); `applied` is the entry list an apply has already decided (then nothing is recorded).
    """

    manager: str
    api_version: str
    subresource: str = ""
    sent: list[dict[str, Any]] | None = None
    applied: list[dict[str, Any]] | None = None


def for_request(params: dict[str, str], user_agent: str, api_version: str, subresource: str, options_kind: str,
                *, apply: bool = False) -> Tracking:
    """Who a write is recorded for: `fieldManager`, else kube's name from the User-Agent. An apply
    must name its manager, and only an apply may `force` (kube's 422s)."""
    manager = params.get("fieldManager")
    causes: list[_Cause] = []
    if apply and not manager:
        causes.append(validation.required("fieldManager", "is required for apply patch"))
    if "force" in params and not apply:
        causes.append(validation.forbidden("force", "may not be specified for non-apply patch"))
    if manager:
        causes += check_manager(manager, "fieldManager")
    if causes:
        raise errors.invalid(options_kind, "meta.k8s.io", "", causes)
    return Tracking(manager if manager is not None else manager_from_user_agent(user_agent), api_version, subresource)


def manager_from_user_agent(user_agent: str) -> str:
    """kube's default manager name: the User-Agent up to its first '/', at most 128 characters."""
    return user_agent.split("/", 1)[0][:MAX_MANAGER_LENGTH]


def check_manager(name: str, where: str) -> list[_Cause]:
    if len(name) > MAX_MANAGER_LENGTH:
        return [validation.invalid_value(where, name, f"must be at most {MAX_MANAGER_LENGTH} characters")]
    if not name.isprintable():
        return [validation.invalid_value(where, name, "must only contain printable characters")]
    return []


def identity(entry: dict[str, Any]) -> tuple[str, str, str, str]:
    """What makes two entries the same manager: an applier keeps its entry across API versions."""
    operation = entry.get("operation", "")
    version = "" if operation == APPLY else entry.get("apiVersion", "")
    return entry.get("manager", ""), operation, version, entry.get("subresource", "")


def owned(path: Path) -> bool:
    """False for the paths the server owns (identity, versioning, the entries themselves)."""
    head = path[0]
    if head in _SERVER_TOP:
        return False
    if head == "f:metadata":
        return len(path) > 1 and path[1] not in _SERVER_METADATA
    return True


def owned_paths(paths: set[Path]) -> set[Path]:
    return {p for p in paths if owned(p)}


def encode(manager: str, operation: str, api_version: str, subresource: str, time: str,
           fields: FieldSet) -> dict[str, Any]:
    entry: dict[str, Any] = {"manager": manager, "operation": operation, "apiVersion": api_version,
                             "time": time, "fieldsType": "FieldsV1", "fieldsV1": fields.encode()}
    if subresource:
        entry["subresource"] = subresource
    return entry


def decode(entry: dict[str, Any]) -> FieldSet:
    """The fields of a stored entry (stored entries were checked when they were written)."""
    try:
        return FieldSet.decode(entry.get("fieldsV1") or {})
    except FieldsError:
        return FieldSet()


def sort(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """kube's order: appliers first, then by time, manager, version and subresource."""
    return sorted(entries, key=lambda e: (e.get("operation", ""), e.get("time", ""), e.get("manager", ""),
                                          e.get("apiVersion", ""), e.get("subresource", "")))


# ---------------------------------------------------------------------------------------------- sent by a client


def is_reset(sent: Any) -> bool:
    """`managedFields: [{}]` is kube's way to clear the entries (an empty list leaves them alone)."""
    return isinstance(sent, list) and len(sent) == 1 and sent[0] == {}


def take_sent(kind: str, group: str, meta: dict[str, Any], tracking: Tracking | None, previous: Any) -> None:
    """Hand the managedFields a client sent (popped from `meta`) to `tracking`, checked (a malformed
    list is a 422); the same entries as `previous` (a patch that left them alone) count as none sent."""
    sent = meta.pop("managedFields", None)
    if tracking is None or sent is None or sent == [] or sent == previous:
        return
    causes = check_sent(sent)
    if causes:
        raise errors.invalid(kind, group, meta.get("name") or "", causes)
    tracking.sent = sent


def check_sent(sent: Any) -> list[_Cause]:
    """The problems of a managedFields list a client sent, as 422 causes (none: it can be stored)."""
    where = "metadata.managedFields"
    if not isinstance(sent, list):
        return [validation.invalid_value(where, sent, "must be a list of ManagedFieldsEntry")]
    if is_reset(sent):
        return []
    causes: list[_Cause] = []
    for i, entry in enumerate(sent):
        at = f"{where}[{i}]"
        if not isinstance(entry, dict):
            causes.append(validation.invalid_value(at, entry, "must be an object"))
            continue
        for key in ("manager", "apiVersion", "time", "subresource", "fieldsType"):
            if key in entry and not isinstance(entry[key], str):
                causes.append(validation.invalid_value(f"{at}.{key}", entry[key], "must be a string"))
        if entry.get("operation") not in (APPLY, UPDATE):
            causes.append(validation.invalid_value(f"{at}.operation", entry.get("operation"),
                                                   "must be `Apply` or `Update`"))
        if entry.get("fieldsType", "FieldsV1") != "FieldsV1":
            causes.append(validation.invalid_value(f"{at}.fieldsType", entry.get("fieldsType"),
                                                   "must be `FieldsV1`"))
        if isinstance(entry.get("manager"), str):
            causes += check_manager(entry["manager"], f"{at}.manager")
        if "fieldsV1" in entry:
            try:
                FieldSet.decode(entry["fieldsV1"])
            except FieldsError as exc:
                causes.append(validation.invalid_value(f"{at}.fieldsV1", "...", str(exc)))
    return causes


def _normalized(sent: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Entries a client sent, in the stored form (the fields re-encoded, empty entries dropped)."""
    out: list[dict[str, Any]] = []
    for entry in sent:
        fields = decode(entry)
        if fields:
            out.append(encode(entry.get("manager", ""), entry["operation"], entry.get("apiVersion", ""),
                              entry.get("subresource", ""), entry.get("time") or rfc3339(), fields))
    return out


# ---------------------------------------------------------------------------------------------- recording


def _owns_any(entry: dict[str, Any], paths: set[Path]) -> bool:
    fields_v1 = entry.get("fieldsV1") or {}
    return any(encoded_has(fields_v1, p) for p in paths)


def record(old: dict[str, Any] | None, new: dict[str, Any], shape: Shape, tracking: Tracking) -> None:
    """Set `new`'s managedFields after a create or update by `tracking.manager` from `old`."""
    meta = new["metadata"]
    if tracking.applied is not None:
        _store(meta, tracking.applied)
        return
    stored: list[dict[str, Any]] = (old or {}).get("metadata", {}).get("managedFields") or []
    # a read-modify-write sends back the entries it read: the same as keeping the stored ones
    if tracking.sent is not None and not tracking.subresource and tracking.sent != stored:
        base = [] if is_reset(tracking.sent) else _normalized(tracking.sent)
    else:
        base = list(stored)
    if old is None and not base:  # a plain create: the writer owns everything the object sets
        _store(meta, _created(new, shape, tracking))
        return
    if old is None:
        comparison = Comparison(added=fields_of(_without_entries(new), shape))
    else:
        comparison = compare(_without_entries(old), _without_entries(new), shape)
    _store(meta, update_entries(base, comparison, tracking))


def _created(new: dict[str, Any], shape: Shape, tracking: Tracking) -> list[dict[str, Any]]:
    fields_v1 = fields_v1_of(_without_entries(new), shape)
    fields_v1.pop("f:apiVersion", None)
    fields_v1.pop("f:kind", None)
    meta = fields_v1.pop("f:metadata", None)
    if meta is not None:
        meta = {k: v for k, v in meta.items() if k not in _SERVER_METADATA and k != "."}
        if meta:
            fields_v1["f:metadata"] = meta
    if not fields_v1:
        return []
    return [{"manager": tracking.manager, "operation": UPDATE, "apiVersion": tracking.api_version, "time": _now(),
             "fieldsType": "FieldsV1", "fieldsV1": fields_v1, **({"subresource": tracking.subresource}
                                                                   if tracking.subresource else {})}]


_clock: list[Any] = [0, ""]


def _now() -> str:
    """rfc3339() of now, formatted once a second: every tracked write stamps its entry."""
    second = int(time.time())
    if _clock[0] != second:
        _clock[0], _clock[1] = second, rfc3339(second)
    return str(_clock[1])


def _without_entries(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        return {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
    return obj


def _store(meta: dict[str, Any], entries: list[dict[str, Any]]) -> None:
    if entries:
        meta["managedFields"] = entries
    else:
        meta.pop("managedFields", None)


def update_entries(entries: list[dict[str, Any]], comparison: Comparison, tracking: Tracking) -> list[dict[str, Any]]:
    """kube's Update: the writer owns what it added or changed, nobody keeps what was removed, and
    every other manager loses what the writer changed (an Update never conflicts)."""
    changed = owned_paths(comparison.added | comparison.modified)
    removed = owned_paths(comparison.removed)
    touched = changed | removed
    if not touched:
        return entries
    me = (tracking.manager, UPDATE, tracking.api_version, tracking.subresource)
    out: list[dict[str, Any]] = []
    mine: dict[str, Any] | None = None
    for entry in entries:
        if identity(entry) == me:
            mine = entry
        elif _owns_any(entry, touched):
            kept = encoded_without(entry.get("fieldsV1") or {}, touched)
            if kept:
                out.append({**entry, "fieldsV1": kept})
        else:
            out.append(entry)
    now = _now()
    if mine is not None:
        fields_v1 = encoded_with(encoded_without(mine.get("fieldsV1") or {}, removed), changed)
        if fields_v1:
            out.append({**mine, "time": now, "fieldsV1": fields_v1})
    elif changed:
        out.append(encode(tracking.manager, UPDATE, tracking.api_version, tracking.subresource, now,
                          FieldSet(changed)))
    return sort(out)


def fields_applied(config: dict[str, Any], shape: Shape) -> FieldSet:
    """The fields an applied configuration sets, less those the server owns."""
    return FieldSet(owned_paths(fields_of(config, shape)))
