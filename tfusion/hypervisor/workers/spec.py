"""The body of `POST /api/v1/workers` (local backend), checked field by field.

A worker spec is turned into the same pod annotations the webhook writes, and those go through the
allocator's one request parser (`request_from_pod`), so a local worker means exactly what a pod
with those annotations means.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tfusion.api import annotations as keys
from tfusion.api.jsontypes import JsonMapping
from tfusion.api.quantity import Quantity, QuantityError
from tfusion.hypervisor.devices.model import DeviceInfo
from tfusion.hypervisor.workers.model import ISOLATION_MODES, QOS_LEVELS

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_FIELDS = {"name", "namespace", "requests", "limits", "gpuCount", "gpuIds", "isolation", "qos", "command",
           "env", "workingDir", "labels", "annotations"}
_RESOURCE_FIELDS = {"tflops", "vram", "computePercent"}

def annotation_field(annotation: str) -> str:
    """The body field an annotation came from, to name fields in the allocator's errors."""
    return {
        keys.TFLOPS_REQUEST: "requests.tflops", keys.TFLOPS_LIMIT: "limits.tflops",
        keys.VRAM_REQUEST: "requests.vram", keys.VRAM_LIMIT: "limits.vram",
        keys.COMPUTE_PERCENT_REQUEST: "requests.computePercent",
        keys.COMPUTE_PERCENT_LIMIT: "limits.computePercent",
        keys.GPU_COUNT: "gpuCount", keys.GPU_INDICES: "gpuIds", keys.ISOLATION: "isolation",
        keys.QOS: "qos",
    }.get(annotation, annotation)


class SpecError(ValueError):
    """A field of the worker spec is wrong: `field`, the value, and what is allowed."""

    def __init__(self, field_name: str, value: Any, allowed: str) -> None:
        super().__init__(f"{field_name}: {value!r} is invalid; allowed: {allowed}")
        self.field = field_name
        self.value = value
        self.allowed = allowed


@dataclass(frozen=True)
class WorkerSpec:
    name: str
    namespace: str
    annotations: dict[str, str]
    labels: dict[str, str]
    command: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    working_dir: str = ""


def _string_map(key: str, raw: object) -> dict[str, str]:
    """The body's field `key` (value `raw`) as a map of strings; absent reads as empty."""
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items()):
        raise SpecError(key, raw, "an object of string keys and string values")
    return dict(raw)


def _resource_notes(key: str, raw: object) -> dict[str, str]:
    """The body's `requests` or `limits` (value `raw`) as the pod annotations that carry them."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise SpecError(key, raw, "an object with tflops, vram and/or computePercent")
    unknown = set(raw) - _RESOURCE_FIELDS
    if unknown:
        raise SpecError(f"{key}.{sorted(unknown)[0]}", raw[sorted(unknown)[0]],
                        "only tflops, vram and computePercent")
    request = key == "requests"
    notes = {}
    for name, annotation in (
            ("tflops", keys.TFLOPS_REQUEST if request else keys.TFLOPS_LIMIT),
            ("vram", keys.VRAM_REQUEST if request else keys.VRAM_LIMIT),
            ("computePercent", keys.COMPUTE_PERCENT_REQUEST if request else keys.COMPUTE_PERCENT_LIMIT)):
        if name not in raw:
            continue
        value = raw[name]
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise SpecError(f"{key}.{name}", value, "a quantity such as \"10\", \"8Gi\" or 50")
        try:
            quantity = Quantity.parse(str(value))
        except QuantityError as exc:
            raise SpecError(f"{key}.{name}", value, f"a Kubernetes quantity ({exc})") from None
        if quantity.sign() < 0:
            raise SpecError(f"{key}.{name}", value, "a non-negative quantity")
        notes[annotation] = str(value)
    return notes


def _command(raw: Any) -> tuple[str, ...]:
    if raw is None:
        return ()
    if isinstance(raw, str):
        parts = shlex.split(raw)
    elif isinstance(raw, list) and all(isinstance(p, str) for p in raw):
        parts = list(raw)
    else:
        raise SpecError("command", raw, "a list of strings (argv) or a command line string")
    if not parts or not parts[0]:
        raise SpecError("command", raw, "a non-empty command")
    return tuple(parts)


def parse_worker_spec(body: JsonMapping, devices: Sequence[DeviceInfo]) -> WorkerSpec:
    """Check the body and translate it into worker annotations; raises SpecError naming the field."""
    unknown = set(body) - _FIELDS
    if unknown:
        first = sorted(unknown)[0]
        raise SpecError(first, body[first], f"known fields are {', '.join(sorted(_FIELDS))}")
    name = body.get("name")
    if not isinstance(name, str) or not _NAME.match(name) or len(name) > 63:
        raise SpecError("name", name, "a DNS label: lowercase letters, digits and '-', at most 63 characters")
    namespace = body.get("namespace", "default")
    if not isinstance(namespace, str) or not _NAME.match(namespace) or len(namespace) > 63:
        raise SpecError("namespace", namespace, "a DNS label: lowercase letters, digits and '-', at most 63 characters")
    notes = {**_string_map("annotations", body.get("annotations")),
             **_resource_notes("requests", body.get("requests")), **_resource_notes("limits", body.get("limits"))}
    if "gpuCount" in body and "gpuIds" in body:
        raise SpecError("gpuIds", body["gpuIds"], "either gpuCount or gpuIds, not both")
    if "gpuCount" in body:
        count = body["gpuCount"]
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= max(1, len(devices)):
            raise SpecError("gpuCount", count, f"an integer from 1 to {max(1, len(devices))} "
                                               f"(this node has {len(devices)} device(s))")
        notes[keys.GPU_COUNT] = str(count)
    if "gpuIds" in body:
        notes[keys.GPU_INDICES] = _gpu_indices(body["gpuIds"], devices)
        notes[keys.GPU_COUNT] = str(len(notes[keys.GPU_INDICES].split(",")))
    isolation = body.get("isolation", keys.DEFAULT_ISOLATION)
    if isolation not in ISOLATION_MODES:
        raise SpecError("isolation", isolation, ", ".join(ISOLATION_MODES))
    if isolation == keys.ISOLATION_PARTITIONED:
        raise SpecError("isolation", isolation, "shared, soft or hard (partitions need a vendor library)")
    notes[keys.ISOLATION] = isolation
    qos = body.get("qos", "medium")
    if qos not in QOS_LEVELS:
        raise SpecError("qos", qos, ", ".join(QOS_LEVELS))
    notes[keys.QOS] = qos
    working_dir = body.get("workingDir", "")
    if not isinstance(working_dir, str):
        raise SpecError("workingDir", working_dir, "a directory path")
    return WorkerSpec(name=name, namespace=namespace, annotations=notes,
                      labels=_string_map("labels", body.get("labels")), command=_command(body.get("command")),
                      env=_string_map("env", body.get("env")), working_dir=working_dir)


def _gpu_indices(raw: Any, devices: Sequence[DeviceInfo]) -> str:
    if not isinstance(raw, list) or not raw or not all(isinstance(u, str) for u in raw):
        raise SpecError("gpuIds", raw, "a non-empty list of device UUIDs")
    by_uuid = {d.uuid: d for d in devices}
    indices = []
    for uuid in raw:
        device = by_uuid.get(uuid.lower())
        if device is None:
            raise SpecError("gpuIds", uuid, "UUIDs of this node's devices: " + ", ".join(sorted(by_uuid)))
        indices.append(device.index)
    if len(set(indices)) != len(indices):
        raise SpecError("gpuIds", raw, "distinct device UUIDs")
    return ",".join(str(i) for i in indices)
