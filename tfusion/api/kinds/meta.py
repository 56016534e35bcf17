"""Kubernetes core types that tensor-fusion.ai/v1 objects embed: ObjectMeta, Condition, selectors.

Why it exists: every kind carries metadata and most carry conditions and selectors; modelling them
once (with the same validation rules as the upstream OpenAPI schemas: condition reasons, node
selector operators) keeps the kind modules about TensorFusion only.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal

import msgspec

from tfusion.api.kinds.base import ATOMIC_LIST, ATOMIC_MAP, Int32, Model

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
    """Kind of condition in CamelCase (for example Ready); unique among the object's conditions."""
    status: Literal["True", "False", "Unknown"]
    """Whether the condition holds: True, False or Unknown."""
    last_transition_time: datetime
    """When status last changed (RFC 3339 time), set by the controller that owns the condition."""
    reason: Annotated[str, _CONDITION_REASON]
    """Machine-readable CamelCase cause of the last transition."""
    message: Annotated[str, _CONDITION_MESSAGE]
    """Human-readable details of the last transition; may be empty."""
    observed_generation: Annotated[int, msgspec.Meta(ge=0, extra={"format": "int64"})] = 0
    """The metadata.generation this condition was computed from; older means stale."""


class LabelSelectorRequirement(Model):
    key: str
    """Label key the requirement tests."""
    operator: str
    """How the key is tested: In, NotIn, Exists or DoesNotExist."""
    values: Annotated[list[str], ATOMIC_LIST] = msgspec.field(default_factory=list)
    """Values for In/NotIn; must be empty for Exists/DoesNotExist."""


class LabelSelector(Model):
    """metav1.LabelSelector; replaced as a whole on merge, as in Kubernetes."""

    SCHEMA_EXTRA: ClassVar[dict[str, Any]] = ATOMIC_MAP

    match_labels: dict[str, str] = msgspec.field(default_factory=dict)
    """Labels that must all be present with exactly these values (ANDed with matchExpressions)."""
    match_expressions: Annotated[list[LabelSelectorRequirement], ATOMIC_LIST] = msgspec.field(default_factory=list)
    """Label requirements that must all hold."""


class NodeSelectorRequirement(Model):
    key: str
    """Node label (or field, in matchFields) the requirement tests."""
    operator: str
    """How the key is tested: In, NotIn, Exists, DoesNotExist, Gt or Lt."""
    values: Annotated[list[str], ATOMIC_LIST] = msgspec.field(default_factory=list)
    """Values for In/NotIn (several), Gt/Lt (one integer); empty for Exists/DoesNotExist."""


class NodeSelectorTerm(Model):
    SCHEMA_EXTRA: ClassVar[dict[str, Any]] = ATOMIC_MAP

    match_expressions: Annotated[list[NodeSelectorRequirement], ATOMIC_LIST] = msgspec.field(default_factory=list)
    """Requirements on node labels; all must hold."""
    match_fields: Annotated[list[NodeSelectorRequirement], ATOMIC_LIST] = msgspec.field(default_factory=list)
    """Requirements on node fields (such as metadata.name); all must hold."""


class NodeSelector(Model):
    SCHEMA_EXTRA: ClassVar[dict[str, Any]] = ATOMIC_MAP

    node_selector_terms: Annotated[list[NodeSelectorTerm], ATOMIC_LIST]
    """Alternatives: a node matches when ANY of these terms matches."""


class PreferredSchedulingTerm(Model):
    weight: Int32
    """How much a matching node is preferred, 1 to 100."""
    preference: NodeSelectorTerm
    """The node requirements that earn the weight."""


class NodeAffinity(Model):
    required_during_scheduling_ignored_during_execution: NodeSelector | None = None
    """Nodes the workers must land on; not re-checked after placement."""
    preferred_during_scheduling_ignored_during_execution: Annotated[
        list[PreferredSchedulingTerm], ATOMIC_LIST] = msgspec.field(default_factory=list)
    """Weighted node preferences; the scheduler favours nodes with the highest total weight."""


class SecretReference(Model):
    SCHEMA_EXTRA: ClassVar[dict[str, Any]] = ATOMIC_MAP

    name: str = ""
    """Name of the Secret."""
    namespace: str = ""
    """Namespace of the Secret; defaults to the referring object's namespace."""
