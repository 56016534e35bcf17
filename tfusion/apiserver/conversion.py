"""Built-in resources served in two shapes from one store: `events.k8s.io/v1` Events.

kube-apiserver keeps one Event store and serves it as `core/v1` (what kubectl and most recorders
use) and as `events.k8s.io/v1` (what newer recorders write). The newer group renames some fields
and marks the fields of the older API deprecated, so a read through either API sees every event,
whichever API created it. Here the stored shape is core/v1; `to_served` renames on the way out and
`to_storage` on the way in. A custom resource's versions differ only in apiVersion (kube's "None"
conversion strategy), which is what both functions do for any resource not named below.

Field selectors are converted the same way (`stored_field_selector`): events.k8s.io/v1 selects on
its own names (`regarding.name`, `reportingController`, ...) and only on the ones kube lets it
(any other is a 400 "field label not supported"), and they are matched against the stored fields
they were renamed from. A core/v1 `source` selects the reporting component, as in kube.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tfusion.api.selectors import FieldSelector
from tfusion.apiserver import errors
from tfusion.apiserver.resources import ResourceInfo
from tfusion.apiserver.store import Store

__all__ = ["EVENTS_V1", "adopt_separate_event_rows", "stored_field_selector", "to_served", "to_storage"]

EVENTS_V1 = "events.k8s.io/v1"
CORE_EVENTS = "/events"
#: where versions before the shared store kept events.k8s.io/v1 events
SEPARATE_EVENTS = "events.k8s.io/events"

#: core/v1 Event field → events.k8s.io/v1 Event field; the fields both share (reason, type, action,
#: related, eventTime, series, reportingInstance) keep their names
_EVENT_RENAMES: tuple[tuple[str, str], ...] = (
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("reportingComponent", "reportingController"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
)


#: the field selector labels events.k8s.io/v1 accepts -> the stored (core/v1) field each reads
_EVENT_FIELD_LABELS = {
    "metadata.name": "metadata.name",
    "metadata.namespace": "metadata.namespace",
    "reason": "reason",
    "type": "type",
    "reportingController": "reportingComponent",
    **{f"regarding.{part}": f"involvedObject.{part}"
       for part in ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")},
}
#: core/v1 Event field selector labels that are not the path of the field they read
_CORE_EVENT_FIELD_PATHS = {"source": "source.component"}


def _renamed(obj: dict[str, Any], renames: tuple[tuple[str, str], ...], api_version: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    names = dict(renames)
    foreign = set(names.values())  # the other shape's names: unknown fields here, dropped as kube does
    for key, value in obj.items():
        if key not in foreign:
            out[names.get(key, key)] = value
    out["apiVersion"] = api_version
    return out


def to_served(info: ResourceInfo, obj: dict[str, Any]) -> dict[str, Any]:
    """The stored object `obj` as `info`'s version serves it (a new dict; `obj` is left alone)."""
    if info.api_version == EVENTS_V1:
        return _renamed(obj, _EVENT_RENAMES, EVENTS_V1)
    served = dict(obj)
    served["apiVersion"] = info.api_version
    return served


def to_storage(info: ResourceInfo, obj: dict[str, Any]) -> dict[str, Any]:
    """An object in `info`'s served shape as it is stored; the identity for a resource stored as served."""
    if info.api_version == EVENTS_V1:
        return _event_to_core(obj)
    return obj


def stored_field_selector(info: ResourceInfo, selector: FieldSelector | None) -> FieldSelector | None:
    """`selector` as written against `info`'s served shape, over the stored fields; an
    events.k8s.io/v1 label kube does not support is refused (400) naming it."""
    if selector is None:
        return None
    if info.api_version == EVENTS_V1:
        unsupported = sorted(selector.paths - set(_EVENT_FIELD_LABELS))
        if unsupported:
            raise errors.bad_request(f"field label not supported: {unsupported[0]} (events.k8s.io/v1 events select "
                                     f"on {', '.join(sorted(_EVENT_FIELD_LABELS))})")
        renames = _EVENT_FIELD_LABELS
    elif info.storage_key == CORE_EVENTS:
        renames = _CORE_EVENT_FIELD_PATHS
    else:
        return selector
    return FieldSelector(tuple(replace(r, path=renames.get(r.path, r.path)) for r in selector.requirements))


def _event_to_core(obj: dict[str, Any]) -> dict[str, Any]:
    return _renamed(obj, tuple((new, old) for old, new in _EVENT_RENAMES), "v1")


def adopt_separate_event_rows(store: Store) -> None:
    """Move the events.k8s.io/v1 events an earlier version stored apart into the core store, so they
    stay readable (and no longer keep a deleted namespace from finishing). Runs at start, before
    anything watches; where the core store holds an event of the same name, that one is kept."""
    for (namespace, name), entry in store.items(SEPARATE_EVENTS):
        store.purge(SEPARATE_EVENTS, (namespace, name))
        if store.get(CORE_EVENTS, namespace, name) is None:
            store.put(CORE_EVENTS, _event_to_core(entry.copy()), None)
