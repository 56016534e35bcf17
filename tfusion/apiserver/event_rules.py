"""What kube-apiserver demands of an Event written through `events.k8s.io/v1`.

Why it exists: the newer Event API is strict where core/v1 is lenient. A new event must say when
it happened (eventTime), who reported it (reportingController, reportingInstance), what was done
(action) and why (reason), with type Normal or Warning, and must leave the deprecated* fields of
the older API unset; after creation only its series (and metadata) may change. A recorder that
writes an incomplete event here would be refused by a real cluster, so it is refused here too,
with a 422 naming the field. Writes through core/v1 keep core's lenient rules.

The objects checked are in the stored (core/v1) shape, as conversion.py gives them; the causes
name the events.k8s.io/v1 fields the writer used.
"""

from __future__ import annotations

from typing import Any

from tfusion.apiserver.metadata_keys import key_problems
from tfusion.apiserver.validation import Cause, invalid_value, required, validate_name

#: kube's length limits of the newer API's short fields and of the note
MAX_SHORT = 128
MAX_NOTE = 1024
EVENT_TYPES = ("Normal", "Warning")
#: namespaces an event about a cluster-scoped object may live in
CLUSTER_EVENT_NAMESPACES = ("default", "kube-system")
#: stored (core/v1) field -> its events.k8s.io/v1 name, for the fields that may not change
_IMMUTABLE = (("involvedObject", "regarding"), ("reason", "reason"), ("message", "note"),
              ("source", "deprecatedSource"), ("firstTimestamp", "deprecatedFirstTimestamp"),
              ("lastTimestamp", "deprecatedLastTimestamp"), ("count", "deprecatedCount"), ("type", "type"),
              ("eventTime", "eventTime"), ("action", "action"), ("related", "related"),
              ("reportingComponent", "reportingController"), ("reportingInstance", "reportingInstance"))
#: stored (core/v1) field -> its events.k8s.io/v1 name, for the deprecated fields a new event leaves unset
_DEPRECATED = (("firstTimestamp", "deprecatedFirstTimestamp"), ("lastTimestamp", "deprecatedLastTimestamp"),
               ("count", "deprecatedCount"), ("source", "deprecatedSource"))


def validate(event: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    """The causes to refuse an events.k8s.io/v1 create (`old` None) or update of `event`."""
    causes = _namespace_causes(event) + _series_causes(event)
    if event.get("eventTime"):  # an event from before eventTime existed keeps the older rules
        causes += _reporting_causes(event)
    if old is None:
        return causes + _create_causes(event)
    return causes + [invalid_value(served, _shown(event.get(stored)), "field is immutable")
                     for stored, served in _IMMUTABLE if event.get(stored) != old.get(stored)]


def _text(event: dict[str, Any], field: str) -> str:
    value = event.get(field)
    return value if isinstance(value, str) else ""


def _shown(value: Any) -> Any:
    return value if isinstance(value, str | int) and not isinstance(value, bool) else ""


def _namespace_causes(event: dict[str, Any]) -> list[Cause]:
    """An event lives in the namespace of the object it is about; one about a cluster-scoped object
    in default (or kube-system, for an event with an eventTime)."""
    regarding = event.get("involvedObject")
    about = str(regarding.get("namespace") or "") if isinstance(regarding, dict) else ""
    namespace = event["metadata"].get("namespace", "")
    if event.get("eventTime"):
        wrong = not about and namespace not in CLUSTER_EVENT_NAMESPACES
    else:
        wrong = namespace != about if about else namespace not in ("", "default")
    if wrong:
        return [invalid_value("regarding.namespace", about, f"does not match event.namespace ({namespace!r})")]
    return []


def _reporting_causes(event: dict[str, Any]) -> list[Cause]:
    """Who reported what, and why, within kube's lengths."""
    causes: list[Cause] = []
    controller = _text(event, "reportingComponent")
    if not controller:
        causes.append(required("reportingController"))
    else:
        causes += [invalid_value("reportingController", controller, problem) for problem in key_problems(controller)]
    for stored, served, limit in (("reportingInstance", "reportingInstance", MAX_SHORT),
                                  ("action", "action", MAX_SHORT), ("reason", "reason", MAX_SHORT)):
        if not _text(event, stored):
            causes.append(required(served))
        elif len(_text(event, stored)) > limit:
            causes.append(invalid_value(served, "", f"can have at most {limit} characters"))
    if len(_text(event, "message")) > MAX_NOTE:
        causes.append(invalid_value("note", "", f"can have at most {MAX_NOTE} characters"))
    return causes


def _series_causes(event: dict[str, Any]) -> list[Cause]:
    series = event.get("series")
    if not isinstance(series, dict):
        return []
    causes: list[Cause] = []
    count = series.get("count")
    if not isinstance(count, int) or count < 2:
        causes.append(invalid_value("series.count", _shown(count), "should be at least 2"))
    if not series.get("lastObservedTime"):
        causes.append(required("series.lastObservedTime"))
    return causes


def _create_causes(event: dict[str, Any]) -> list[Cause]:
    causes = validate_name("", event["metadata"].get("name", ""))  # a DNS subdomain, unlike a core event's
    if not event.get("eventTime"):
        causes.append(required("eventTime"))
    kind = event.get("type")
    if kind not in EVENT_TYPES:
        causes.append(invalid_value("type", _shown(kind), 'must be "Normal" or "Warning"'))
    for stored, served in _DEPRECATED:
        if event.get(stored) not in (None, 0, {}, ""):
            causes.append(invalid_value(served, "", "needs to be unset"))
    return causes
