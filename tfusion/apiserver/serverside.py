"""Server-side apply (`PATCH` with `application/apply-patch+yaml`), as kube-apiserver does it.

An applier sends the configuration it wants (a partial object) and a field manager name. The
server merges the configuration into the live object by schema (maps key by key, list-maps item by
item, sets by value, atomic values whole), removes the fields the same manager applied last time
and no longer applies unless another manager owns them, and refuses (409) to change a field
another manager owns to a different value unless the applier forces it, in which case ownership
moves. The applier's entry then owns exactly the fields of its configuration; equal values are
shared. A repeated identical apply changes nothing (the caller sees the same resourceVersion).

Field sets and the walks are in fieldsets.py, the entries in managedfields.py; objects.py calls
`apply` and stores the result through its ordinary update path (admission, defaults, validation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from tfusion.api.merge import clone
from tfusion.api.timestamps import rfc3339
from tfusion.apiserver import managedfields
from tfusion.apiserver.errors import ApiError
from tfusion.apiserver.fieldsets import FieldSet, Path, Shape, compare, fields_of, item_steps, names_item, path_text
from tfusion.apiserver.managedfields import APPLY, UPDATE

__all__ = ["Applied", "apply", "conflict_error", "created", "drop_nulls"]


@dataclass
class Applied:
    """The object after an apply (served form, no managedFields) and its new entries."""

    obj: dict[str, Any]
    entries: list[dict[str, Any]]


def drop_nulls(value: Any) -> Any:
    """A configuration without null map values: an applier's null asks for the field to be unset,
    which leaving it out of the configuration already does for the fields it applied before."""
    if isinstance(value, dict):
        return {k: drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [drop_nulls(v) for v in value]
    return value


def created(config: dict[str, Any], shape: Shape, manager: str, api_version: str,
            subresource: str = "") -> list[dict[str, Any]]:
    """The entries of an object an apply creates: the applier owns its configuration."""
    fields = managedfields.fields_applied(config, shape)
    if not fields:
        return []
    return [managedfields.encode(manager, APPLY, api_version, subresource, rfc3339(), fields)]


def apply(live: dict[str, Any], config: dict[str, Any], shape: Shape, *, manager: str, api_version: str,
          subresource: str = "", force: bool = False) -> Applied:
    """Apply `config` for `manager` to `live` (served form, with its managedFields)."""
    meta = live.get("metadata") or {}
    entries: list[dict[str, Any]] = list(meta.get("managedFields") or [])
    current = {**live, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
    applier = (manager, APPLY, "", subresource)
    mine = next((e for e in entries if managedfields.identity(e) == applier), None)
    others = [e for e in entries if e is not mine]
    last = managedfields.decode(mine) if mine is not None else FieldSet()
    wanted = managedfields.fields_applied(config, shape)
    others_sets = [managedfields.decode(e) for e in others]
    still_owned = FieldSet(wanted.paths.union(*(fields.paths for fields in others_sets)))
    merged = merge(clone(current), config, shape)  # pruning below edits it in place: share nothing with live
    _prune(merged, last.difference(still_owned), still_owned.prefixes())
    comparison = compare(current, merged, shape)
    changed = FieldSet(managedfields.owned_paths(comparison.changed()))
    removed = FieldSet(managedfields.owned_paths(comparison.removed))
    conflicts = [(e, sorted(fields.intersection(changed))) for e, fields in zip(others, others_sets, strict=True)]
    conflicts = [(e, paths) for e, paths in conflicts if paths]
    if conflicts and not force:
        if manager == KUBECTL:
            conflicts = _beyond_last_applied(current, conflicts, shape)
        if conflicts:
            raise conflict_error(conflicts)
    out: list[dict[str, Any]] = []
    for entry, fields in zip(others, others_sets, strict=True):
        kept = fields.difference(changed).difference(removed)
        if kept == fields:
            out.append(entry)
        elif kept:
            out.append({**entry, "fieldsV1": kept.encode()})
    if wanted:
        unchanged = mine is not None and last == wanted and comparison.same
        time = mine.get("time", "") if unchanged and mine is not None else rfc3339()
        out.append(managedfields.encode(manager, APPLY, api_version, subresource, time, wanted))
    return Applied(merged, managedfields.sort(out))


# ---------------------------------------------------------------------------------------------- kubectl's upgrade

#: the manager kubectl's server-side apply uses by default; kube lets it take over what its own
#: client-side apply set (the last-applied annotation), so switching to --server-side does not conflict
KUBECTL = "kubectl"
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def _beyond_last_applied(
    live: dict[str, Any], conflicts: list[tuple[dict[str, Any], list[Path]]], shape: Shape
) -> list[tuple[dict[str, Any], list[Path]]]:
    """The conflicts left once those on fields the last client-side apply set, and nobody changed
    since, are allowed (kube's upgrade path from client-side to server-side apply)."""
    text = ((live.get("metadata") or {}).get("annotations") or {}).get(LAST_APPLIED)
    if not isinstance(text, str) or not text:
        return conflicts
    try:
        last = orjson.loads(text)
    except orjson.JSONDecodeError:
        return conflicts
    if not isinstance(last, dict):
        return conflicts
    changed_since = compare(last, live, shape)
    allowed = fields_of(last, shape) - changed_since.modified
    left = [(entry, [p for p in paths if p not in allowed]) for entry, paths in conflicts]
    return [(entry, paths) for entry, paths in left if paths]


# ---------------------------------------------------------------------------------------------- merge


_ABSENT = object()


def merge(live: Any, config: Any, shape: Shape) -> Any:
    """`config` merged into `live` by schema; returns a new value and leaves both untouched."""
    if isinstance(live, dict) and isinstance(config, dict) and not shape.atomic_map:
        out = dict(live)
        for key, value in config.items():
            sub, _ = shape.child(key)
            out[key] = merge(live[key], value, sub) if key in live else clone(value)
        return out
    if isinstance(live, list) and isinstance(config, list):
        live_steps, config_steps = item_steps(live, shape), item_steps(config, shape)
        if live_steps is None or config_steps is None:
            return clone(config)  # atomic, or items that cannot be told apart: the applier's list wins
        item_shape = shape.elements or Shape()
        wanted = dict(zip(config_steps, config, strict=True))
        result: list[Any] = []
        for step, item in zip(live_steps, live, strict=True):
            applied = wanted.pop(step, _ABSENT)
            if applied is _ABSENT or shape.list_type == "set":
                result.append(item)
            else:
                result.append(merge(item, applied, item_shape))
        result.extend(clone(item) for item in wanted.values())
        return result
    return clone(config)


def _prune(obj: dict[str, Any], doomed: FieldSet, kept: frozenset[Path]) -> None:
    """Remove from `obj` the fields in `doomed` that nobody keeps (no member at or below them)."""
    for path in sorted(doomed, key=len):
        if path in kept:
            continue
        _remove(obj, path)


def _remove(node: Any, path: Path) -> None:
    for depth, step in enumerate(path):
        last = depth == len(path) - 1
        if isinstance(node, dict) and step.startswith("f:"):
            key = step[2:]
            if key not in node:
                return
            if last:
                del node[key]
                return
            node = node[key]
        elif isinstance(node, list) and step[:2] in ("k:", "v:"):
            index = _find(node, step)
            if index is None:
                return
            if last:
                del node[index]
                return
            node = node[index]
        else:
            return


def _find(items: list[Any], step: str) -> int | None:
    return next((i for i, item in enumerate(items) if names_item(item, step)), None)


# ---------------------------------------------------------------------------------------------- conflicts


def _manager_text(entry: dict[str, Any]) -> str:
    text = f'"{entry.get("manager", "")}"'
    if entry.get("subresource"):
        text += f' with subresource "{entry["subresource"]}"'
    if entry.get("operation") == UPDATE:
        text += f" using {entry.get('apiVersion', '')}"
    return text


def conflict_error(conflicts: list[tuple[dict[str, Any], list[Path]]]) -> ApiError:
    """kube's 409 for an apply that would change fields other managers own."""
    causes = [
        {"type": "FieldManagerConflict", "message": f"conflict with {_manager_text(entry)}", "field": path_text(p)}
        for entry, paths in conflicts for p in paths
    ]
    if len(causes) == 1:
        entry, paths = conflicts[0]
        message = f"Apply failed with 1 conflict: conflict with {_manager_text(entry)}: {path_text(paths[0])}"
    else:
        lines: list[str] = []
        for entry, paths in sorted(conflicts, key=lambda c: _manager_text(c[0])):
            lines.append(f"conflicts with {_manager_text(entry)}:")
            lines += [f"- {path_text(p)}" for p in paths]
        message = f"Apply failed with {len(causes)} conflicts: " + "\n".join(lines)
    return ApiError(409, "Conflict", message, details={"causes": causes})
