"""Kubernetes core types that tensor-fusion.ai/v1 objects embed: ObjectMeta, Condition, selectors.

Why it exists: every kind carries metadata and most carry conditions and selectors; modelling them
once (with the same validation rules as the upstream OpenAPI schemas: condition reasons, node
selector operators) keeps the kind modules about TensorFusion only.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec

from tfusion.api.kinds.base import Int32, Model

__all__ = [
    "Condition", "LabelSelector", "LabelSelectorRequirement", "NodeAffinity", "NodeSelector",
    "NodeSelectorRequirement", "NodeSelectorTerm", "ObjectMeta", "OwnerReference", "PreferredSchedulingTerm",
    "SecretReference",
]

_CONDITION_TYPE = msgspec.Meta(
    max_length=316,
    pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$")
_CONDITION_REASON = msgspec.Meta(
    min_length=1, max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
_CONDITION_MESSAGE = msgspec.Meta(max_length=32768)


class OwnerReference(Model):
    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool | None = None
    block_owner_deletion: bool | None = None


class ObjectMeta(Model):
    """The metadata fields tfusion reads and writes; others (managedFields, …) pass through."""

    name: str = ""
    generate_name: str = ""
    namespace: str = ""
    uid: str = ""
    resource_version: str = ""
    generation: int = 0
    creation_timestamp: datetime | None = None
    deletion_timestamp: datetime | None = None
    deletion_grace_period_seconds: int | None = None
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    annotations: dict[str, str] = msgspec.field(default_factory=dict)
    finalizers: list[str] = msgspec.field(default_factory=list)
    owner_references: list[OwnerReference] = msgspec.field(default_factory=list)
    managed_fields: list[dict[str, Any]] = msgspec.field(default_factory=list)


class Condition(Model):
    """metav1.Condition, with the upstream schema's length and pattern rules."""

    type: Annotated[str, _CONDITION_TYPE]
    status: Literal["True", "False", "Unknown"]
    last_transition_time: datetime
    reason: Annotated[str, _CONDITION_REASON]
    message: Annotated[str, _CONDITION_MESSAGE]
    observed_generation: Annotated[int, msgspec.Meta(ge=0, extra={"format": "int64"})] = 0


class LabelSelectorRequirement(Model):
    key: str
    operator: str
    values: list[str] = msgspec.field(default_factory=list)


class LabelSelector(Model):
    match_labels: dict[str, str] = msgspec.field(default_factory=dict)
    match_expressions: list[LabelSelectorRequirement] = msgspec.field(default_factory=list)


class NodeSelectorRequirement(Model):
    key: str
    operator: str
    values: list[str] = msgspec.field(default_factory=list)


class NodeSelectorTerm(Model):
    match_expressions: list[NodeSelectorRequirement] = msgspec.field(default_factory=list)
    match_fields: list[NodeSelectorRequirement] = msgspec.field(default_factory=list)


class NodeSelector(Model):
    node_selector_terms: list[NodeSelectorTerm]


class PreferredSchedulingTerm(Model):
    weight: Int32
    preference: NodeSelectorTerm


class NodeAffinity(Model):
    required_during_scheduling_ignored_during_execution: NodeSelector | None = None
    preferred_during_scheduling_ignored_during_execution: list[PreferredSchedulingTerm] = msgspec.field(
        default_factory=list)


class SecretReference(Model):
    name: str = ""
    namespace: str = ""
