"""What every reconciler of this package shares: conditions that keep their transition time, status
writes that happen only when something changed, owner references, and quantity sums (objects are
read through the typed views of tfusion/api/accessors.py).

Why one module: each reconciler writes a status subresource that its own write brings back as an
update event; writing only the fields that differ (conditions compared without their timestamps)
is what keeps that loop from spinning, and it must be done the same way everywhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TypedDict

from tfusion.allocator.units import tflops_str, vram_str
from tfusion.api import annotations as tfa
from tfusion.api.accessors import Body
from tfusion.api.jsontypes import JsonMapping, JsonObject, JsonValue, json_object
from tfusion.api.quantity import Quantity, QuantityError
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient, NotFound

FINALIZER = tfa.FINALIZER
RUNNING, PENDING, UPDATING, DESTROYING, UNKNOWN, FAILED = (
    "Running", "Pending", "Updating", "Destroying", "Unknown", "Failed")


class ConditionState(TypedDict):
    """What a condition says, before it is stamped with its transition time."""
    type: str
    status: str
    reason: str
    message: str


class Condition(ConditionState):
    """A metav1.Condition as these reconcilers write it."""
    lastTransitionTime: str
    observedGeneration: int


def controlled_by(obj: Body, owner_uid: str) -> bool:
    """Whether the object's controlling owner is the object with UID `owner_uid`."""
    return any(ref.get("controller") and ref.get("uid") == owner_uid for ref in obj.meta.owner_references)


def controller_name(obj: Body, kind: str) -> str:
    """The name of the object's controlling owner of `kind`, "" when there is none."""
    for ref in obj.meta.owner_references:
        if ref.get("controller") and ref.get("kind") == kind:
            return str(ref.get("name") or "")
    return ""


# --- conditions -----------------------------------------------------------------------------------

def condition(old_conditions: Iterable[JsonMapping] | None, type_: str, status: bool | str, reason: str,
              message: str, *, generation: int = 0, now: str | None = None) -> Condition:
    """A metav1.Condition whose lastTransitionTime is kept while its status does not change (`now`,
    default the clock, when it does)."""
    value = status if isinstance(status, str) else ("True" if status else "False")
    old = next((c for c in old_conditions or [] if c.get("type") == type_), None)
    since = old.get("lastTransitionTime") if old and old.get("status") == value else None
    return {"type": type_, "status": value, "reason": reason, "message": message,
            "lastTransitionTime": since if isinstance(since, str) and since else now or tfa.now_rfc3339(),
            "observedGeneration": generation}


def merge_conditions(old: Iterable[JsonMapping] | None, new: Iterable[Condition]) -> list[JsonValue]:
    """`new` replaces the conditions of the same type; other writers' conditions stay (a JSON list, as
    a status field holds it)."""
    fresh = [json_object(c) for c in new]
    types = {c["type"] for c in fresh}
    return [*(json_object(c) for c in old or [] if c.get("type") not in types), *fresh]


def _comparable(value: object) -> object:
    if isinstance(value, list) and all(isinstance(c, Mapping) and "lastTransitionTime" in c for c in value):
        return [{k: v for k, v in c.items() if k != "lastTransitionTime"} for c in value]
    return value


def changed_fields(current: JsonMapping, wanted: JsonObject) -> JsonObject:
    """The fields of `wanted` that `current` does not already say (conditions without timestamps)."""
    return {k: v for k, v in wanted.items() if _comparable(current.get(k)) != _comparable(v)}


async def write_status(client: KubeClient, resource: r.ApiResource, obj: Body,
                       wanted: JsonObject) -> bool:
    """Merge-patch the status fields that differ from the cached object; True when it wrote.
    A merge patch replaces lists whole, so conditions are written merged (`merge_conditions`); the
    keys a map field (allocatedPods) no longer has are written as null, so that they go."""
    current = obj.status
    changes = changed_fields(current, wanted)
    if not changes:
        return False
    for key, value in changes.items():
        before = current.get(key)
        if isinstance(value, dict) and isinstance(before, Mapping):  # a merge patch keeps keys it does not name
            changes[key] = {**dict.fromkeys(before), **value}
    try:
        await client.patch(resource, obj.name, {"status": changes}, namespace=obj.namespace or None,
                           subresource="status")
    except NotFound:
        return False
    return True


# --- quantities -----------------------------------------------------------------------------------

def milli_tflops(value: object) -> int:
    """A TFLOPS quantity in milli-TFLOPS; 0 for a missing or unreadable one."""
    if not isinstance(value, (str, int, float)) or value == "":
        return 0
    try:
        return Quantity.parse(value).milli_value()
    except (QuantityError, ValueError, TypeError):
        return 0


def byte_count(value: object) -> int:
    """A byte quantity as an integer; 0 for a missing or unreadable one."""
    if not isinstance(value, (str, int, float)) or value == "":
        return 0
    try:
        return Quantity.parse(value).value()
    except (QuantityError, ValueError, TypeError):
        return 0


TFLOPS_FIELDS = ("totalTFlops", "availableTFlops", "virtualTFlops", "virtualAvailableTFlops")
VRAM_FIELDS = ("totalVRAM", "availableVRAM", "virtualVRAM", "virtualAvailableVRAM")


def sum_capacity(statuses: Iterable[JsonMapping]) -> dict[str, str]:
    """The capacity fields of many GPUNode or GPUPool statuses, added up and printed canonically."""
    totals = dict.fromkeys((*TFLOPS_FIELDS, *VRAM_FIELDS), 0)
    for status in statuses:
        for key in TFLOPS_FIELDS:
            totals[key] += milli_tflops(status.get(key))
        for key in VRAM_FIELDS:
            totals[key] += byte_count(status.get(key))
    return {key: tflops_str(value) if key in TFLOPS_FIELDS else vram_str(value) for key, value in totals.items()}
