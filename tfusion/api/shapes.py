"""JSON types of the fields of built-in kinds that the server reads: the part of Go's typed decoding
that kube-apiserver gets for free.

kube-apiserver decodes a Pod into a Go struct, so `"spec": "x"` or `"containers": 5` is a 400
before any handler runs. We keep objects as plain JSON, so without this check such a body reached
the defaulting and validation code and crashed it (500). `check` walks only the fields listed
here — the ones our code reads or kube clients rely on — and reports the first mismatch with its
field path; fields not listed are left to the kind's own validation.

It sits in `api/` because two readers check the same shapes: the embedded API server on every
write (`apiserver/shapes.py` turns a mismatch into kube's 400) and the controller's admission
webhook, which reads pods that any caller may send.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class Obj:
    """A JSON object with (some) known fields."""

    def __init__(self, **fields: Shape) -> None:
        self.fields = fields
        #: the scalar fields as tuples of types, checked in place rather than by a recursive call
        self.scalars = {name: _types(sub) for name, sub in fields.items() if _is_scalar(sub)}


class ListOf:
    def __init__(self, item: Shape) -> None:
        self.item = item
        self.scalar = _types(item) if _is_scalar(item) else None


class MapOf:
    def __init__(self, value: Shape) -> None:
        self.value = value
        self.scalar = _types(value) if _is_scalar(value) else None


class Either:
    """One of several shapes (JSON schema's `items`: a schema or a list of them); the first one's
    mismatch is reported when none fits."""

    def __init__(self, *options: Shape) -> None:
        self.options = options


def _is_scalar(shape: Shape) -> bool:
    return isinstance(shape, type | tuple)


def _types(shape: Shape) -> tuple[type, ...]:
    return shape if isinstance(shape, tuple) else (shape,)  # type: ignore[return-value]


def _scalar_mismatch(types: tuple[type, ...], value: Any) -> _Problem | None:
    if not isinstance(value, types) or (value.__class__ is bool and bool not in types):
        return [], " or ".join(_NAMES[t] for t in types), value
    return None


Shape = Obj | ListOf | MapOf | Either | type | tuple[type, ...]

STR, INT, BOOL = str, int, bool
SCALAR = (str, int, float)
ANY_OBJ = Obj()

_META = Obj(
    name=STR,
    generateName=STR,
    namespace=STR,
    uid=STR,
    resourceVersion=STR,
    labels=MapOf(STR),
    annotations=MapOf(STR),
    finalizers=ListOf(STR),
    ownerReferences=ListOf(Obj(apiVersion=STR, kind=STR, name=STR, uid=STR, controller=BOOL,
                               blockOwnerDeletion=BOOL)),
    deletionGracePeriodSeconds=INT,
)
#: a quantity is a JSON string or number (kube's Quantity decodes either); its value is validated
#: by `validation.validate_pod` (422), as kube-apiserver's validation does after decoding
QUANTITIES = MapOf(SCALAR)
_RESOURCES = Obj(limits=QUANTITIES, requests=QUANTITIES)
_REQUIREMENT = Obj(key=STR, operator=STR, values=ListOf(STR))
_SELECTOR = Obj(matchLabels=MapOf(STR), matchExpressions=ListOf(_REQUIREMENT))
_NODE_SELECTOR_TERM = Obj(matchExpressions=ListOf(_REQUIREMENT), matchFields=ListOf(_REQUIREMENT))
_POD_AFFINITY_TERM = Obj(labelSelector=_SELECTOR, namespaceSelector=_SELECTOR, namespaces=ListOf(STR),
                         topologyKey=STR, matchLabelKeys=ListOf(STR), mismatchLabelKeys=ListOf(STR))
_POD_AFFINITY = Obj(
    requiredDuringSchedulingIgnoredDuringExecution=ListOf(_POD_AFFINITY_TERM),
    preferredDuringSchedulingIgnoredDuringExecution=ListOf(Obj(weight=INT, podAffinityTerm=_POD_AFFINITY_TERM)),
)
#: the scheduler (ours and the built-in one) reads these: a wrong type here once crashed it
_AFFINITY = Obj(
    nodeAffinity=Obj(
        requiredDuringSchedulingIgnoredDuringExecution=Obj(nodeSelectorTerms=ListOf(_NODE_SELECTOR_TERM)),
        preferredDuringSchedulingIgnoredDuringExecution=ListOf(Obj(weight=INT, preference=_NODE_SELECTOR_TERM)),
    ),
    podAffinity=_POD_AFFINITY,
    podAntiAffinity=_POD_AFFINITY,
)
_TOLERATION = Obj(key=STR, operator=STR, value=STR, effect=STR, tolerationSeconds=INT)
_CONTAINER = Obj(
    name=STR,
    image=STR,
    imagePullPolicy=STR,
    command=ListOf(STR),
    args=ListOf(STR),
    resources=_RESOURCES,
    ports=ListOf(Obj(containerPort=INT, name=STR, protocol=STR)),
    env=ListOf(Obj(name=STR, value=STR, valueFrom=ANY_OBJ)),
    envFrom=ListOf(ANY_OBJ),
    volumeMounts=ListOf(Obj(name=STR, mountPath=STR)),
    volumeDevices=ListOf(ANY_OBJ),
    securityContext=ANY_OBJ,
)
_POD_SPEC = Obj(
    containers=ListOf(_CONTAINER),
    initContainers=ListOf(_CONTAINER),
    ephemeralContainers=ListOf(_CONTAINER),
    volumes=ListOf(Obj(name=STR)),
    nodeName=STR,
    nodeSelector=MapOf(STR),
    serviceAccountName=STR,
    serviceAccount=STR,
    schedulerName=STR,
    priorityClassName=STR,
    priority=INT,
    restartPolicy=STR,
    terminationGracePeriodSeconds=INT,
    activeDeadlineSeconds=INT,
    tolerations=ListOf(_TOLERATION),
    schedulingGates=ListOf(Obj(name=STR)),
    imagePullSecrets=ListOf(Obj(name=STR)),
    hostAliases=ListOf(Obj(ip=STR)),
    topologySpreadConstraints=ListOf(Obj(topologyKey=STR)),
    resourceClaims=ListOf(Obj(name=STR)),
    affinity=_AFFINITY,
    overhead=QUANTITIES,
    securityContext=ANY_OBJ,
    hostNetwork=BOOL,
    enableServiceLinks=BOOL,
)
_CONDITIONS = ListOf(Obj(type=STR, status=STR, reason=STR, message=STR))
_POD_STATUS = Obj(
    phase=STR,
    conditions=_CONDITIONS,
    podIP=STR,
    podIPs=ListOf(Obj(ip=STR)),
    hostIP=STR,
    hostIPs=ListOf(Obj(ip=STR)),
    containerStatuses=ListOf(ANY_OBJ),
    initContainerStatuses=ListOf(ANY_OBJ),
    resourceClaimStatuses=ListOf(Obj(name=STR)),
)
_WEBHOOK = Obj(
    name=STR,
    clientConfig=Obj(url=STR, caBundle=STR, service=Obj(namespace=STR, name=STR, path=STR, port=INT)),
    rules=ListOf(Obj(operations=ListOf(STR), apiGroups=ListOf(STR), apiVersions=ListOf(STR),
                     resources=ListOf(STR), scope=STR)),
    failurePolicy=STR,
    matchPolicy=STR,
    sideEffects=STR,
    timeoutSeconds=INT,
    admissionReviewVersions=ListOf(STR),
    namespaceSelector=ANY_OBJ,
    objectSelector=ANY_OBJ,
    reinvocationPolicy=STR,
)

_TEMPLATE = Obj(metadata=_META, spec=_POD_SPEC)
INT_OR_STRING = (int, str)
_WORKLOAD_CONDITIONS = ListOf(Obj(type=STR, status=STR, reason=STR, message=STR, lastUpdateTime=STR,
                                  lastTransitionTime=STR, lastProbeTime=STR))
_REPLICA_STATUS: dict[str, Shape] = dict(replicas=INT, readyReplicas=INT, availableReplicas=INT, observedGeneration=INT,
                       conditions=_WORKLOAD_CONDITIONS)
_DEPLOYMENT = Obj(
    metadata=_META,
    spec=Obj(replicas=INT, selector=_SELECTOR, template=_TEMPLATE, minReadySeconds=INT, revisionHistoryLimit=INT,
             paused=BOOL, progressDeadlineSeconds=INT,
             strategy=Obj(type=STR, rollingUpdate=Obj(maxSurge=INT_OR_STRING, maxUnavailable=INT_OR_STRING))),
    status=Obj(updatedReplicas=INT, unavailableReplicas=INT, collisionCount=INT, **_REPLICA_STATUS),
)
_REPLICASET = Obj(
    metadata=_META,
    spec=Obj(replicas=INT, selector=_SELECTOR, template=_TEMPLATE, minReadySeconds=INT),
    status=Obj(fullyLabeledReplicas=INT, **_REPLICA_STATUS),
)
_JOB = Obj(
    metadata=_META,
    spec=Obj(parallelism=INT, completions=INT, backoffLimit=INT, activeDeadlineSeconds=INT,
             ttlSecondsAfterFinished=INT, manualSelector=BOOL, suspend=BOOL, completionMode=STR,
             podReplacementPolicy=STR, selector=_SELECTOR, template=_TEMPLATE),
    status=Obj(active=INT, succeeded=INT, failed=INT, ready=INT, terminating=INT, startTime=STR,
               completionTime=STR, conditions=_WORKLOAD_CONDITIONS),
)

NUMBER = (int, float)
#: a CRD's openAPIV3Schema (JSONSchemaProps), recursive: filled in below, once it can name itself
_SCHEMA = Obj()
_SCHEMA.fields = dict(
    type=STR, format=STR, title=STR, description=STR, pattern=STR, required=ListOf(STR),
    maximum=NUMBER, minimum=NUMBER, exclusiveMaximum=BOOL, exclusiveMinimum=BOOL, multipleOf=NUMBER,
    maxLength=INT, minLength=INT, maxItems=INT, minItems=INT, maxProperties=INT, minProperties=INT,
    uniqueItems=BOOL, nullable=BOOL,
    properties=MapOf(_SCHEMA), patternProperties=MapOf(_SCHEMA), definitions=MapOf(_SCHEMA),
    items=Either(_SCHEMA, ListOf(_SCHEMA)), additionalProperties=Either(BOOL, _SCHEMA),
    additionalItems=Either(BOOL, _SCHEMA), allOf=ListOf(_SCHEMA), oneOf=ListOf(_SCHEMA), anyOf=ListOf(_SCHEMA),
    **{"not": _SCHEMA, "x-kubernetes-preserve-unknown-fields": BOOL, "x-kubernetes-embedded-resource": BOOL,
       "x-kubernetes-int-or-string": BOOL, "x-kubernetes-list-map-keys": ListOf(STR),
       "x-kubernetes-list-type": STR, "x-kubernetes-map-type": STR,
       "x-kubernetes-validations": ListOf(Obj(rule=STR, message=STR, messageExpression=STR, reason=STR,
                                              fieldPath=STR, optionalOldSelf=BOOL))},
)
_SCHEMA.scalars = {name: _types(sub) for name, sub in _SCHEMA.fields.items() if _is_scalar(sub)}
_CRD_NAMES = Obj(plural=STR, singular=STR, kind=STR, listKind=STR, shortNames=ListOf(STR), categories=ListOf(STR))
_CRD_VERSION = Obj(
    name=STR, served=BOOL, storage=BOOL, deprecated=BOOL, deprecationWarning=STR,
    schema=Obj(openAPIV3Schema=_SCHEMA),
    subresources=Obj(status=ANY_OBJ, scale=Obj(specReplicasPath=STR, statusReplicasPath=STR,
                                               labelSelectorPath=STR)),
    additionalPrinterColumns=ListOf(Obj(name=STR, type=STR, format=STR, description=STR, priority=INT,
                                        jsonPath=STR)),
    selectableFields=ListOf(Obj(jsonPath=STR)),
)
_CRD = Obj(
    metadata=_META,
    spec=Obj(group=STR, scope=STR, names=_CRD_NAMES, versions=ListOf(_CRD_VERSION), preserveUnknownFields=BOOL,
             conversion=Obj(strategy=STR, webhook=ANY_OBJ)),
    status=Obj(conditions=_CONDITIONS, acceptedNames=_CRD_NAMES, storedVersions=ListOf(STR)),
)
_RBAC_RULES = ListOf(Obj(apiGroups=ListOf(STR), resources=ListOf(STR), verbs=ListOf(STR),
                         resourceNames=ListOf(STR), nonResourceURLs=ListOf(STR)))
_ROLE_REF = Obj(apiGroup=STR, kind=STR, name=STR)
_SUBJECTS = ListOf(Obj(kind=STR, apiGroup=STR, name=STR, namespace=STR))
_ROLE = Obj(metadata=_META, rules=_RBAC_RULES)
_BINDING = Obj(metadata=_META, roleRef=_ROLE_REF, subjects=_SUBJECTS)

#: storage key -> shape of the whole object (custom resources are checked by their CRD schema)
KIND_SHAPES: dict[str, Obj] = {
    "apps/deployments": _DEPLOYMENT,
    "apps/replicasets": _REPLICASET,
    "batch/jobs": _JOB,
    "/pods": Obj(metadata=_META, spec=_POD_SPEC, status=_POD_STATUS),
    "/services": Obj(metadata=_META, spec=Obj(ports=ListOf(Obj(port=INT, name=STR, protocol=STR)),
                                                selector=MapOf(STR), type=STR, clusterIP=STR)),
    "/secrets": Obj(metadata=_META, data=MapOf(STR), stringData=MapOf(STR), type=STR),
    "/configmaps": Obj(metadata=_META, data=MapOf(STR), binaryData=MapOf(STR)),
    "/namespaces": Obj(metadata=_META, spec=Obj(finalizers=ListOf(STR)), status=Obj(phase=STR)),
    "/nodes": Obj(metadata=_META, spec=Obj(taints=ListOf(ANY_OBJ), unschedulable=BOOL, podCIDRs=ListOf(STR)),
                  status=Obj(conditions=_CONDITIONS, addresses=ListOf(Obj(type=STR, address=STR)),
                             capacity=MapOf(SCALAR), allocatable=MapOf(SCALAR))),
    "/serviceaccounts": Obj(metadata=_META, secrets=ListOf(Obj(name=STR))),
    "coordination.k8s.io/leases": Obj(metadata=_META, spec=Obj(holderIdentity=STR, leaseDurationSeconds=INT,
                                                               leaseTransitions=INT)),
    "scheduling.k8s.io/priorityclasses": Obj(metadata=_META, value=INT, globalDefault=BOOL, description=STR),
    "admissionregistration.k8s.io/mutatingwebhookconfigurations": Obj(metadata=_META, webhooks=ListOf(_WEBHOOK)),
    "apiextensions.k8s.io/customresourcedefinitions": _CRD,
    "rbac.authorization.k8s.io/roles": _ROLE,
    "rbac.authorization.k8s.io/clusterroles": Obj(metadata=_META, rules=_RBAC_RULES,
                                                  aggregationRule=Obj(clusterRoleSelectors=ListOf(ANY_OBJ))),
    "rbac.authorization.k8s.io/rolebindings": _BINDING,
    "rbac.authorization.k8s.io/clusterrolebindings": _BINDING,
}
DEFAULT_SHAPE = Obj(metadata=_META)

#: request bodies of the POST-only subresources (services.py)
BINDING = Obj(metadata=_META, target=Obj(kind=STR, apiVersion=STR, name=STR, namespace=STR))
EVICTION = Obj(
    metadata=_META,
    deleteOptions=Obj(preconditions=Obj(uid=STR, resourceVersion=STR), propagationPolicy=STR,
                      gracePeriodSeconds=INT, orphanDependents=BOOL, dryRun=ListOf(STR)),
)
TOKEN_REQUEST = Obj(
    metadata=_META,
    spec=Obj(audiences=ListOf(STR), expirationSeconds=INT,
             boundObjectRef=Obj(kind=STR, apiVersion=STR, name=STR, uid=STR)),
)
TOKEN_REVIEW = Obj(metadata=_META, spec=Obj(token=STR, audiences=ListOf(STR)))
#: the body of a /scale subresource write (autoscaling/v1 Scale)
SCALE = Obj(metadata=_META, spec=Obj(replicas=INT), status=Obj(replicas=INT, selector=STR))

_NAMES = {str: "a string", int: "an integer", bool: "a boolean", float: "a number"}


def mismatch(shape: Shape, value: Any, path: str = "") -> str:
    """The first field where `value` does not have `shape` ("" when it fits). null fits everything,
    and a known field that is null is dropped, as Go's decoding into a struct leaves it unset."""
    problem = _mismatch(shape, value)
    if problem is None:
        return ""
    parts, expected, found = problem
    return _wrong([path, *parts] if path else parts, expected, found)


def not_an_object(value: Any) -> str:
    """The message for a body that is not a JSON object at all."""
    return _wrong([], "an object", value)


#: (path segments, innermost first as they are collected; what was expected; the value found)
_Problem = tuple[list[str], str, Any]


def _first_mismatch(entries: Iterable[tuple[object, Any]], scalar: tuple[type, ...] | None,
                    item_shape: Shape) -> _Problem | None:
    """The first entry of a list or map (by index or key) that does not fit, its path ending `[key]`."""
    for key, item in entries:
        if scalar is not None and item is not None:
            problem = _scalar_mismatch(scalar, item)
        else:
            problem = _mismatch(item_shape, item)
        if problem is not None:
            problem[0].append(f"[{key}]")
            return problem
    return None


def _mismatch(shape: Shape, value: Any) -> _Problem | None:
    # Hot on every write: it walks only the keys the value has, and builds a path only on failure.
    if value is None:
        return None
    if isinstance(shape, Obj):
        if not isinstance(value, dict):
            return [], "an object", value
        fields, scalars = shape.fields, shape.scalars
        nulls = []
        for name, item in value.items():
            sub = fields.get(name)
            if sub is None:
                continue
            if item is None:
                nulls.append(name)
                continue
            types = scalars.get(name)
            problem = _scalar_mismatch(types, item) if types is not None else _mismatch(sub, item)
            if problem is not None:
                problem[0].append(f".{name}")
                return problem
        for name in nulls:
            del value[name]
        return None
    if isinstance(shape, ListOf):
        if not isinstance(value, list):
            return [], "a list", value
        return _first_mismatch(enumerate(value), shape.scalar, shape.item)
    if isinstance(shape, MapOf):
        if not isinstance(value, dict):
            return [], "an object", value
        return _first_mismatch(value.items(), shape.scalar, shape.value)
    if isinstance(shape, Either):
        problems = [_mismatch(option, value) for option in shape.options]
        return None if any(p is None for p in problems) else problems[0]
    return _scalar_mismatch(_types(shape), value)


def _wrong(parts: list[str], expected: str, value: Any) -> str:
    """The message for a mismatch; `parts` are path segments, innermost first (".spec", "[0]")."""
    path = "".join(reversed(parts)).removeprefix(".")
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return f"{path or 'the body'}: expected {expected}, got {type(value).__name__} {shown}"
