"""Decoding of Kubernetes protobuf request bodies (`application/vnd.kubernetes.protobuf`) for a few core kinds.

kubectl 1.32 sends protobuf, not JSON, from its typed clients: `kubectl create namespace`,
`create configmap`, `create secret`, `create serviceaccount`, `create token`, `create deployment`
and `create job` (for the last two, the pod template fields a manifest commonly sets). The body is a
`runtime.Unknown` envelope (magic `k8s\\0`, TypeMeta, the object's own protobuf). The field numbers
below are those of the upstream generated.proto files for these kinds; anything else is refused
with 415 so the client knows to send JSON. Responses are always JSON, which every client accepts.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from tfusion.api.timestamps import rfc3339

MAGIC = b"k8s\x00"

Field = tuple[str, str, Any]  # (json name, kind, nested schema for messages)
Schema = dict[int, Field]


class ProtobufError(ValueError):
    """The body is not a protobuf-encoded object this server can read."""


class UnsupportedKind(ProtobufError):
    """Well-formed, but of a kind this server only reads as JSON."""


_TYPE_META: Schema = {1: ("apiVersion", "string", None), 2: ("kind", "string", None)}
_UNKNOWN: Schema = {
    1: ("typeMeta", "message", _TYPE_META),
    2: ("raw", "bytes", None),
    3: ("contentEncoding", "string", None),
    4: ("contentType", "string", None),
}
_OWNER_REFERENCE: Schema = {
    1: ("kind", "string", None),
    3: ("name", "string", None),
    4: ("uid", "string", None),
    5: ("apiVersion", "string", None),
    6: ("controller", "bool", None),
    7: ("blockOwnerDeletion", "bool", None),
}
_OBJECT_META: Schema = {
    1: ("name", "string", None),
    2: ("generateName", "string", None),
    3: ("namespace", "string", None),
    5: ("uid", "string", None),
    6: ("resourceVersion", "string", None),
    7: ("generation", "int", None),
    8: ("creationTimestamp", "time", None),
    9: ("deletionTimestamp", "time", None),
    10: ("deletionGracePeriodSeconds", "int", None),
    11: ("labels", "map_string", None),
    12: ("annotations", "map_string", None),
    13: ("ownerReferences", "repeated_message", _OWNER_REFERENCE),
    14: ("finalizers", "repeated_string", None),
}
_OBJECT_REFERENCE: Schema = {
    1: ("kind", "string", None),
    2: ("namespace", "string", None),
    3: ("name", "string", None),
    4: ("uid", "string", None),
    5: ("apiVersion", "string", None),
    6: ("resourceVersion", "string", None),
    7: ("fieldPath", "string", None),
}
_LOCAL_REFERENCE: Schema = {1: ("name", "string", None)}
_BOUND_REFERENCE: Schema = {
    1: ("kind", "string", None),
    2: ("apiVersion", "string", None),
    3: ("name", "string", None),
    4: ("uid", "string", None),
}
_PRECONDITIONS: Schema = {1: ("uid", "string", None), 2: ("resourceVersion", "string", None)}
_DELETE_OPTIONS: Schema = {
    1: ("gracePeriodSeconds", "int", None),
    2: ("preconditions", "message", _PRECONDITIONS),
    3: ("orphanDependents", "bool", None),
    4: ("propagationPolicy", "string", None),
    5: ("dryRun", "repeated_string", None),
}

# --- the workload kinds, as `kubectl create deployment` / `kubectl create job` send them: the pod
# template fields of k8s.io/api core/v1 generated.proto that a manifest commonly sets (others dropped)
_LABEL_SELECTOR: Schema = {
    1: ("matchLabels", "map_string", None),
    2: ("matchExpressions", "repeated_message", {
        1: ("key", "string", None), 2: ("operator", "string", None), 3: ("values", "repeated_string", None)}),
}
_CONTAINER: Schema = {
    1: ("name", "string", None),
    2: ("image", "string", None),
    3: ("command", "repeated_string", None),
    4: ("args", "repeated_string", None),
    5: ("workingDir", "string", None),
    6: ("ports", "repeated_message", {
        1: ("name", "string", None), 2: ("hostPort", "int_omitempty", None), 3: ("containerPort", "int", None),
        4: ("protocol", "string", None), 5: ("hostIP", "string", None)}),
    7: ("env", "repeated_message", {1: ("name", "string", None), 2: ("value", "string", None)}),
    8: ("resources", "message", {1: ("limits", "map_quantity", None), 2: ("requests", "map_quantity", None)}),
    13: ("terminationMessagePath", "string", None),
    14: ("imagePullPolicy", "string", None),
    20: ("terminationMessagePolicy", "string", None),
}
_POD_SPEC: Schema = {
    2: ("containers", "repeated_message", _CONTAINER),
    3: ("restartPolicy", "string", None),
    4: ("terminationGracePeriodSeconds", "int", None),
    5: ("activeDeadlineSeconds", "int", None),
    6: ("dnsPolicy", "string", None),
    7: ("nodeSelector", "map_string", None),
    8: ("serviceAccountName", "string", None),
    10: ("nodeName", "string", None),
    19: ("schedulerName", "string", None),
    20: ("initContainers", "repeated_message", _CONTAINER),
    24: ("priorityClassName", "string", None),
}
_POD_TEMPLATE: Schema = {1: ("metadata", "message", _OBJECT_META), 2: ("spec", "message", _POD_SPEC)}

_POLICY_RULE: Schema = {
    1: ("verbs", "repeated_string", None),
    2: ("apiGroups", "repeated_string", None),
    3: ("resources", "repeated_string", None),
    4: ("resourceNames", "repeated_string", None),
    5: ("nonResourceURLs", "repeated_string", None),
}
_BINDING: Schema = {
    1: ("metadata", "message", _OBJECT_META),
    2: ("subjects", "repeated_message", {1: ("kind", "string", None), 2: ("apiGroup", "string", None),
                                         3: ("name", "string", None), 4: ("namespace", "string", None)}),
    3: ("roleRef", "message", {1: ("apiGroup", "string", None), 2: ("kind", "string", None),
                               3: ("name", "string", None)}),
}
_RESOURCE_ATTRIBUTES: Schema = {
    1: ("namespace", "string", None),
    2: ("verb", "string", None),
    3: ("group", "string", None),
    4: ("version", "string", None),
    5: ("resource", "string", None),
    6: ("subresource", "string", None),
    7: ("name", "string", None),
}
_NON_RESOURCE_ATTRIBUTES: Schema = {1: ("path", "string", None), 2: ("verb", "string", None)}
_SUBJECT_ACCESS_REVIEW: Schema = {
    1: ("metadata", "message", _OBJECT_META),
    2: ("spec", "message", {1: ("resourceAttributes", "message", _RESOURCE_ATTRIBUTES),
                            2: ("nonResourceAttributes", "message", _NON_RESOURCE_ATTRIBUTES),
                            3: ("user", "string", None), 4: ("groups", "repeated_string", None),
                            6: ("uid", "string", None)}),
}

_JOB_SPEC: Schema = {
    1: ("parallelism", "int", None),
    2: ("completions", "int", None),
    3: ("activeDeadlineSeconds", "int", None),
    4: ("selector", "message", _LABEL_SELECTOR),
    5: ("manualSelector", "bool", None),
    6: ("template", "message", _POD_TEMPLATE),
    7: ("backoffLimit", "int", None),
    8: ("ttlSecondsAfterFinished", "int", None),
    9: ("completionMode", "string", None),
    10: ("suspend", "bool", None),
}

KINDS: dict[tuple[str, str], Schema] = {
    ("apps/v1", "Deployment"): {
        1: ("metadata", "message", _OBJECT_META),
        2: ("spec", "message", {
            1: ("replicas", "int", None),
            2: ("selector", "message", _LABEL_SELECTOR),
            3: ("template", "message", _POD_TEMPLATE),
            4: ("strategy", "message", {
                1: ("type", "string", None),
                2: ("rollingUpdate", "message", {1: ("maxUnavailable", "int_or_string", None),
                                                 2: ("maxSurge", "int_or_string", None)}),
            }),
            6: ("revisionHistoryLimit", "int", None),
            9: ("progressDeadlineSeconds", "int", None),
        }),
    },
    ("batch/v1", "Job"): {1: ("metadata", "message", _OBJECT_META), 2: ("spec", "message", _JOB_SPEC)},
    ("batch/v1", "CronJob"): {  # `kubectl create cronjob`
        1: ("metadata", "message", _OBJECT_META),
        2: ("spec", "message", {
            1: ("schedule", "string", None),
            2: ("startingDeadlineSeconds", "int", None),
            3: ("concurrencyPolicy", "string", None),
            4: ("suspend", "bool", None),
            5: ("jobTemplate", "message", {1: ("metadata", "message", _OBJECT_META),
                                           2: ("spec", "message", _JOB_SPEC)}),
            6: ("successfulJobsHistoryLimit", "int", None),
            7: ("failedJobsHistoryLimit", "int", None),
            8: ("timeZone", "string", None),
        }),
    },
    ("policy/v1", "PodDisruptionBudget"): {  # `kubectl create pdb`
        1: ("metadata", "message", _OBJECT_META),
        2: ("spec", "message", {
            1: ("minAvailable", "int_or_string", None),
            2: ("selector", "message", _LABEL_SELECTOR),
            3: ("maxUnavailable", "int_or_string", None),
            4: ("unhealthyPodEvictionPolicy", "string", None),
        }),
    },
    ("v1", "Namespace"): {
        1: ("metadata", "message", _OBJECT_META),
        2: ("spec", "message", {1: ("finalizers", "repeated_string", None)}),
        3: ("status", "message", {1: ("phase", "string", None)}),
    },
    ("v1", "ConfigMap"): {
        1: ("metadata", "message", _OBJECT_META),
        2: ("data", "map_string", None),
        3: ("binaryData", "map_bytes", None),
        4: ("immutable", "bool", None),
    },
    ("v1", "Secret"): {
        1: ("metadata", "message", _OBJECT_META),
        2: ("data", "map_bytes", None),
        3: ("type", "string", None),
        4: ("stringData", "map_string", None),
        5: ("immutable", "bool", None),
    },
    ("v1", "ServiceAccount"): {
        1: ("metadata", "message", _OBJECT_META),
        2: ("secrets", "repeated_message", _OBJECT_REFERENCE),
        3: ("imagePullSecrets", "repeated_message", _LOCAL_REFERENCE),
        4: ("automountServiceAccountToken", "bool", None),
    },
    ("authentication.k8s.io/v1", "TokenRequest"): {
        1: ("metadata", "message", _OBJECT_META),
        2: (
            "spec",
            "message",
            {
                1: ("audiences", "repeated_string", None),
                3: ("boundObjectRef", "message", _BOUND_REFERENCE),
                4: ("expirationSeconds", "int", None),
            },
        ),
    },
    ("policy/v1", "Eviction"): {
        1: ("metadata", "message", _OBJECT_META),
        2: ("deleteOptions", "message", _DELETE_OPTIONS),
    },
    ("v1", "DeleteOptions"): _DELETE_OPTIONS,
    ("meta.k8s.io/v1", "DeleteOptions"): _DELETE_OPTIONS,
    # `kubectl create role|clusterrole|rolebinding|clusterrolebinding`, `auth can-i`, `auth whoami`
    ("rbac.authorization.k8s.io/v1", "Role"): {1: ("metadata", "message", _OBJECT_META),
                                               2: ("rules", "repeated_message", _POLICY_RULE)},
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): {
        1: ("metadata", "message", _OBJECT_META),
        2: ("rules", "repeated_message", _POLICY_RULE),
        3: ("aggregationRule", "message", {1: ("clusterRoleSelectors", "repeated_message", _LABEL_SELECTOR)}),
    },
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): _BINDING,
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): _BINDING,
    ("authorization.k8s.io/v1", "SelfSubjectAccessReview"): {
        1: ("metadata", "message", _OBJECT_META),
        2: ("spec", "message", {1: ("resourceAttributes", "message", _RESOURCE_ATTRIBUTES),
                                2: ("nonResourceAttributes", "message", _NON_RESOURCE_ATTRIBUTES)}),
    },
    ("authorization.k8s.io/v1", "SubjectAccessReview"): _SUBJECT_ACCESS_REVIEW,
    ("authorization.k8s.io/v1", "LocalSubjectAccessReview"): _SUBJECT_ACCESS_REVIEW,
    ("authorization.k8s.io/v1", "SelfSubjectRulesReview"): {
        1: ("metadata", "message", _OBJECT_META),
        2: ("spec", "message", {1: ("namespace", "string", None)}),
    },
    ("authentication.k8s.io/v1", "SelfSubjectReview"): {1: ("metadata", "message", _OBJECT_META)},
}


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ProtobufError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ProtobufError("varint too long")


def _fields(data: bytes) -> Iterator[tuple[int, int, Any]]:
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        value: Any
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 2:
            length, pos = _varint(data, pos)
            if pos + length > len(data):
                raise ProtobufError("truncated field")
            value, pos = data[pos : pos + length], pos + length
        elif wire == 1:
            value, pos = data[pos : pos + 8], pos + 8
        elif wire == 5:
            value, pos = data[pos : pos + 4], pos + 4
        else:
            raise ProtobufError(f"unsupported wire type {wire}")
        yield number, wire, value


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _map_entry(data: bytes, binary: bool) -> tuple[str, Any]:
    key, value = "", b""
    for number, _, raw in _fields(data):
        if number == 1:
            key = raw.decode()
        elif number == 2:
            value = raw
    if binary:
        import base64

        return key, base64.b64encode(value).decode()
    return key, value.decode()


def _time(data: bytes) -> str | None:
    seconds = 0
    for number, _, raw in _fields(data):
        if number == 1:
            seconds = _signed(raw)
    if seconds == 0:
        return None
    return rfc3339(seconds)


def decode_message(schema: Schema, data: bytes) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for number, _, raw in _fields(data):
        spec = schema.get(number)
        if spec is None:
            continue  # unknown fields are dropped, as kube-apiserver's decoder does
        name, kind, sub = spec
        if kind == "string":
            if raw:  # Go writes empty strings that its JSON form omits
                out[name] = raw.decode()
        elif kind == "bytes":
            out[name] = raw
        elif kind == "int":
            if raw or name != "generation":
                out[name] = _signed(raw)
        elif kind == "int_omitempty":  # a Go int32 that is not a pointer: 0 is written, JSON omits it
            if raw:
                out[name] = _signed(raw)
        elif kind == "bool":
            out[name] = bool(raw)
        elif kind == "message":
            out[name] = decode_message(sub, raw)
        elif kind == "time":
            stamp = _time(raw)
            if stamp is not None:
                out[name] = stamp
        elif kind in ("map_string", "map_bytes"):
            key, value = _map_entry(raw, kind == "map_bytes")
            out.setdefault(name, {})[key] = value
        elif kind == "map_quantity":  # map<string, resource.Quantity>; a Quantity is its string, field 1
            key, value = _map_entry(raw, True)
            import base64

            quantity = decode_message({1: ("string", "string", None)}, base64.b64decode(value))
            out.setdefault(name, {})[key] = quantity.get("string", "0")
        elif kind == "int_or_string":  # intstr.IntOrString: type 0 = intVal (2), type 1 = strVal (3)
            parsed = decode_message({1: ("type", "int", None), 2: ("intVal", "int", None),
                                     3: ("strVal", "string", None)}, raw)
            out[name] = parsed.get("strVal", "") if parsed.get("type") == 1 else parsed.get("intVal", 0)
        elif kind == "repeated_string":
            out.setdefault(name, []).append(raw.decode())
        elif kind == "repeated_message":
            out.setdefault(name, []).append(decode_message(sub, raw))
    return out


def decode(body: bytes) -> dict[str, Any]:
    """A protobuf request body as the JSON object it stands for."""
    if not body.startswith(MAGIC):
        raise ProtobufError("missing the k8s protobuf envelope")
    try:
        envelope = decode_message(_UNKNOWN, body[len(MAGIC) :])
        type_meta = envelope.get("typeMeta") or {}
        api_version, kind = type_meta.get("apiVersion", ""), type_meta.get("kind", "")
        schema = KINDS.get((api_version, kind))
        if schema is None:
            supported = ", ".join(sorted({k for _, k in KINDS}))
            raise UnsupportedKind(
                f"protobuf bodies are only read for {supported}; send {kind or 'this kind'} as application/json"
            )
        obj = decode_message(schema, envelope.get("raw", b""))
    except (UnicodeDecodeError, IndexError, AttributeError, TypeError) as exc:
        raise ProtobufError(f"malformed protobuf body: {exc}") from None
    return {"apiVersion": api_version, "kind": kind, **obj}
