"""The Pod fields the scheduler reads, as one typed model: the check of a Pod before the scheduler
reads it, and the OpenAPI description of simulate-schedule's body.

Why: `POST /api/simulate-schedule` takes a Pod manifest straight from the caller, and the readers
(`nodes.pod_demand`, `request_from_pod`, `controller/defaults.resolve`, `scheduler.decide`) trust
the shape a Pod has once kube-apiserver has decoded and validated it. Unchecked, a body like
`"containers": "1.5Gi"` or `"affinity": {"nodeAffinity": 3}` crashed them (500 with a traceback),
and `"cpu": "-2"` or an unreadable quantity counted silently as nothing. `pod_problem` converts the
Pod into `PodManifest` and, for the first field that does not fit, names its path, the value and
what is allowed; "" when the readers can take the Pod. The built-in scheduler makes the same check
on each pending Pod (`Scheduler.decide`): the embedded API server checks the JSON types
but not every value (a toleration operator of Sometimes is stored), and such a Pod is reported
unschedulable with the message.

Because the same Structs are the route's documented body, the document and the check cannot
disagree: a generated body that fits the schema is accepted, one that does not is refused. Every
field may be null (Go's decoding leaves it unset); fields the scheduler does not read are not
described and not checked, so any manifest `kubectl get pod -o yaml` prints fits. The values
interpreted on top of the JSON types:
- `resources.requests`/`limits` of each container and init container, and `spec.overhead`: a
  non-negative quantity, as a number or as a string of `QUANTITY_PATTERN` (kube's grammar without
  the sign, at most 30 digits either side of the point and a 2-digit exponent, so that every value
  is one `tfusion.api.quantity` reads);
- toleration `operator` and `effect`, and node selector requirement `operator`: kube's values;
- `spec.priority` within int32, as kube stores it.
`spec.schedulerName` is any string here: one other than tensor-fusion-scheduler is refused by the
route with its own 400 (`simulate.foreign_scheduler`), not as a malformed Pod.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal, get_args

import msgspec

from tfusion.api.jsontypes import JsonMapping, JsonObject

#: kube's quantity grammar, unsigned, with bounded digits (see the module docstring)
QUANTITY_PATTERN = (r"^\+?(?:[0-9]{1,30}(?:\.[0-9]{0,30})?|\.[0-9]{1,30})"
                    r"(?:Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]{1,2})?$")
QUANTITY_ALLOWED = ("a non-negative quantity: a number, or a string such as 500m, 2, 1.5Gi or 1e3 "
                    "(at most 30 digits either side of the point, a suffix Ki..Ei, n..E, or an exponent "
                    "of at most 2 digits)")
INT32 = msgspec.Meta(ge=-(2**31), le=2**31 - 1)

QuantityValue = Annotated[str, msgspec.Meta(pattern=QUANTITY_PATTERN)] | Annotated[float, msgspec.Meta(ge=0)]
QuantityMap = dict[str, QuantityValue]
TolerationOperator = Literal["Equal", "Exists", ""]
TaintEffect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute", ""]
SelectorOperator = Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]


def _described(text: str) -> msgspec.Meta:
    return msgspec.Meta(description=text)


class ResourceRequirements(msgspec.Struct):
    requests: QuantityMap | None = None
    limits: QuantityMap | None = None


class Container(msgspec.Struct):
    name: str | None = None
    resources: ResourceRequirements | None = None


class Toleration(msgspec.Struct):
    key: str | None = None
    operator: TolerationOperator | None = None
    value: str | None = None
    effect: TaintEffect | None = None
    tolerationSeconds: int | None = None


class SelectorRequirement(msgspec.Struct):
    key: str | None = None
    operator: SelectorOperator | None = None
    values: list[str] | None = None


class NodeSelectorTerm(msgspec.Struct):
    matchExpressions: list[SelectorRequirement] | None = None
    matchFields: list[SelectorRequirement] | None = None


class NodeSelector(msgspec.Struct):
    nodeSelectorTerms: list[NodeSelectorTerm] | None = None


class NodeAffinity(msgspec.Struct):
    requiredDuringSchedulingIgnoredDuringExecution: NodeSelector | None = None


class Affinity(msgspec.Struct):
    nodeAffinity: NodeAffinity | None = None


class PodSpec(msgspec.Struct):
    schedulerName: str | None = None
    nodeName: str | None = None
    priority: Annotated[int, INT32] | None = None
    containers: list[Container] | None = None
    initContainers: list[Container] | None = None
    overhead: QuantityMap | None = None
    nodeSelector: dict[str, str] | None = None
    tolerations: list[Toleration] | None = None
    affinity: Affinity | None = None


class ObjectMeta(msgspec.Struct):
    name: str | None = None
    generateName: str | None = None
    namespace: str | None = None
    uid: str | None = None
    labels: dict[str, str] | None = None
    annotations: Annotated[dict[str, str] | None, _described(
        "the tensor-fusion.ai annotations that ask for GPUs (tflops-request, vram-request, gpupool, ...)")] = None


class PodStatus(msgspec.Struct):
    phase: str | None = None


class PodManifest(msgspec.Struct):
    """A Pod as `kubectl get pod NAME -o yaml` (or `-o json`) prints it; only `spec` is required,
    and only the fields the scheduler reads are described (others are accepted and ignored)."""

    spec: PodSpec
    apiVersion: str | None = None
    kind: Literal["Pod"] | None = None
    metadata: ObjectMeta | None = None
    status: PodStatus | None = None


def manifest_schema(scheduler_name: str) -> JsonObject:
    """`PodManifest`'s JSON schema, inlined (no `$ref`), for the route's OpenAPI document: msgspec's
    own, because Litestar's generator drops the constraints of a union's members (the quantity
    pattern). `spec.schedulerName` is required there and must be `scheduler_name`: the only Pods
    the route judges (the check above leaves it to the route, which refuses others with 400)."""
    schema = msgspec.json.schema(PodManifest)
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str):
                return inline({**defs[ref.rsplit("/", 1)[1]], **{k: v for k, v in node.items() if k != "$ref"}})
            return {k: inline(v) for k, v in node.items()}
        return [inline(v) for v in node] if isinstance(node, list) else node

    document: dict[str, Any] = inline(schema)  # msgspec's schema (JSON, typed Any), edited below
    spec = document["properties"]["spec"]
    spec["properties"]["schedulerName"] = {"enum": [scheduler_name], "description": (
        f"must be {scheduler_name}; another is refused with 400 (the original answers 500 "
        "`scheduler framework not found`)")}
    spec["required"] = ["schedulerName"]
    return document


_CHOICES = {"operator": SelectorOperator, "effect": TaintEffect}
_AT = re.compile(r"(?P<what>.*) - at `\$(?P<path>[^`]*)`$", re.DOTALL)
_SEGMENT = re.compile(r"\.(?P<name>[A-Za-z0-9_]+)|\[(?P<index>[0-9]+)\]|\[\.\.\.\]")
_QUANTITY_MAPS = ("requests", "limits", "overhead")


def pod_problem(pod: JsonMapping) -> str:
    """What is wrong with the first field of `pod` that the scheduler cannot read ("" when none)."""
    try:
        msgspec.convert(pod, PodManifest, strict=True)
    except msgspec.ValidationError as exc:
        return _message(pod, str(exc))
    return ""


def _message(pod: JsonMapping, text: str) -> str:
    """msgspec's "Expected X - at `$.a.b[0][...]`" as "a.b[0][key]: <value> is not allowed; expected X"."""
    found = _AT.match(text)
    if found is None:
        return text[:1].lower() + text[1:]
    what, raw_path = found["what"], found["path"]
    value: object = pod
    path, parent, entry = "", "", False
    for match in _SEGMENT.finditer(raw_path):
        entry = False
        if match["name"] is not None:
            parent = match["name"]
            path += f".{parent}"
            value = value.get(parent) if isinstance(value, Mapping) else None
        elif match["index"] is not None:
            path += f"[{match['index']}]"
            value = value[int(match["index"])] if isinstance(value, list) else None
        else:
            key, value = _bad_entry(value, parent)
            path += f"[{key}]"
            entry = True
    path = path.removeprefix(".") or "the body"
    if what.startswith("Object missing required field"):
        return f"{path}: {what[:1].lower()}{what[1:]}"
    return f"{path}: {shown(value)} is not allowed; expected {_allowed(parent, path, what, entry=entry)}"


def _bad_entry(mapping: object, parent: str) -> tuple[str, object]:
    """The first entry of a map that its value type refuses (msgspec names the map, not the key)."""
    value_type: Any = QuantityValue if parent in _QUANTITY_MAPS else str
    for key, value in (mapping.items() if isinstance(mapping, Mapping) else ()):
        try:
            msgspec.convert(value, value_type, strict=True)
        except msgspec.ValidationError:
            return str(key), value
    return "...", None


_TYPE_NAMES = {"array": "a list", "object": "an object", "str": "a string", "int": "an integer",
               "float": "a number", "null": "null", "bool": "a boolean"}


def _allowed(parent: str, path: str, what: str, *, entry: bool) -> str:
    if entry and parent in _QUANTITY_MAPS:
        return QUANTITY_ALLOWED
    if parent in _CHOICES and what.startswith("Invalid enum value"):
        toleration = ".tolerations[" in path and parent == "operator"
        return "one of " + ", ".join(repr(c) for c in get_args(TolerationOperator if toleration else _CHOICES[parent]))
    typed = re.match(r"Expected `(?P<types>[^`]*)`(?P<rest>[^,]*)", what)
    if typed is None:
        return what[:1].lower() + what[1:]
    names = [_TYPE_NAMES.get(t.strip(), t.strip()) for t in typed["types"].split("|")]
    return " or ".join(names) + typed["rest"]


def shown(value: object) -> str:
    text = "null" if value is None else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
