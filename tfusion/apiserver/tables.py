"""Server-side printing (`Accept: application/json;as=Table;v=v1;g=meta.k8s.io`), as `kubectl get` asks for.

Custom resources get Name plus their CRD's additionalPrinterColumns (Name and Age when there are
none); built-in kinds get the columns kubectl users expect. Dates print as ages, like kube-apiserver.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import orjson

from tfusion.api.timestamps import parse_rfc3339
from tfusion.apiserver import appsets, volumeclaims
from tfusion.apiserver.netpolicy import table_columns
from tfusion.apiserver.resources import ResourceInfo

Column = tuple[str, str, str, Callable[[dict[str, Any]], Any]]  # name, type, description, cell getter


def human_age(timestamp: Any) -> str:
    if not isinstance(timestamp, str) or not timestamp:
        return "<unknown>"
    try:
        then = parse_rfc3339(timestamp).timestamp()
    except ValueError:
        return "<invalid>"
    return human_duration(time.time() - then)


def human_duration(elapsed: float) -> str:
    """kube's HumanDuration: "45s", "3m20s", "5h", "12d"."""
    seconds = max(0, int(elapsed))
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s" if seconds % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    days = hours // 24
    if days < 8:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    if days < 730:
        return f"{days}d"
    return f"{days // 365}y"


# .key (dots inside a key escaped as \.), [0], [?(@.a.b=="v")], [*], ['quoted.key']
_STEP = re.compile(
    r"\.((?:[^.\[\\]|\\.)+)|\[(\d+)\]|\[\?\(@\.([\w.-]+)\s*==\s*[\"']([^\"']*)[\"']\)\]|\[\*\]"
    r"|\[[\"']([^\"']+)[\"']\]"
)


def json_path(expression: str) -> Callable[[dict[str, Any]], Any]:
    """The subset of kubectl JSONPath used by printer columns: .a.b, [0], [*], [?(@.type=="Ready")]."""
    text = expression.strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1]
    if not text.startswith((".", "[")):
        text = "." + text
    steps: list[tuple[str, Any]] = []
    pos = 0
    while pos < len(text):
        match = _STEP.match(text, pos)
        if not match:
            return lambda obj: None
        if match.group(1) is not None:
            steps.append(("key", match.group(1).replace("\\.", ".")))
        elif match.group(5) is not None:
            steps.append(("key", match.group(5)))
        elif match.group(2) is not None:
            steps.append(("index", int(match.group(2))))
        elif match.group(3) is not None:
            steps.append(("filter", (match.group(3).split("."), match.group(4))))
        else:
            steps.append(("all", None))
        pos = match.end()

    def get(obj: dict[str, Any]) -> Any:
        values: list[Any] = [obj]
        for kind, arg in steps:
            out: list[Any] = []
            for value in values:
                out.extend(_step(kind, arg, value))
            values = out
        if not values:
            return None
        return values[0]  # like kube-apiserver's table converter: the first match

    return get


def _step(kind: str, arg: Any, value: Any) -> list[Any]:
    if kind == "key":
        return [value[arg]] if isinstance(value, dict) and arg in value else []
    if not isinstance(value, list):
        return []
    if kind == "index":
        return [value[arg]] if -len(value) <= arg < len(value) else []
    if kind == "all":
        return list(value)
    path, wanted = arg
    matched = []
    for item in value:
        current = item
        for part in path:
            current = current.get(part) if isinstance(current, dict) else None
        if current is not None and str(current) == wanted:
            matched.append(item)
    return matched


def _metadata_field(key: str) -> Callable[[dict[str, Any]], Any]:
    return lambda obj: obj.get("metadata", {}).get(key)


NAME: Column = ("Name", "string", "Name must be unique within a namespace.", _metadata_field("name"))
AGE: Column = (
    "Age",
    "date",
    "CreationTimestamp is a timestamp representing the server time when this object was created.",
    _metadata_field("creationTimestamp"),
)


def _pod_ready(pod: dict[str, Any]) -> str:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    total = len((pod.get("spec") or {}).get("containers") or [])
    return f"{sum(1 for s in statuses if s.get('ready'))}/{total}"


def _pod_status(pod: dict[str, Any]) -> str:
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    if meta.get("deletionTimestamp"):
        return "Terminating"
    return str(status.get("reason") or status.get("phase") or "Unknown")


def _restarts(pod: dict[str, Any]) -> int:
    return sum(int(s.get("restartCount") or 0) for s in (pod.get("status") or {}).get("containerStatuses") or [])


def _node_status(node: dict[str, Any]) -> str:
    ready = next((c for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), None)
    text = "Ready" if ready and ready.get("status") == "True" else "NotReady" if ready else "Unknown"
    if (node.get("spec") or {}).get("unschedulable"):
        text += ",SchedulingDisabled"
    return text


def _node_roles(node: dict[str, Any]) -> str:
    prefix = "node-role.kubernetes.io/"
    roles = [k[len(prefix) :] for k in (node.get("metadata") or {}).get("labels") or {} if k.startswith(prefix)]
    return ",".join(sorted(roles)) or "<none>"


def _ports(svc: dict[str, Any]) -> str:
    ports = (svc.get("spec") or {}).get("ports") or []
    return ",".join(f"{p.get('port')}/{p.get('protocol', 'TCP')}" for p in ports) or "<none>"


def _event_last_seen(event: dict[str, Any]) -> str:
    series = event.get("series") or {}
    stamp = (
        series.get("lastObservedTime")
        or event.get("lastTimestamp")
        or event.get("deprecatedLastTimestamp")  # the events.k8s.io/v1 shape
        or event.get("eventTime")
        or (event.get("metadata") or {}).get("creationTimestamp")
    )
    return human_age(stamp)


def _count(key: str) -> Callable[[dict[str, Any]], int]:
    return lambda obj: len(obj.get(key) or {}) + (len(obj.get("binaryData") or {}) if key == "data" else 0)


def _path(expr: str) -> Callable[[dict[str, Any]], Any]:
    return json_path(expr)


def _containers(obj: dict[str, Any]) -> str:
    spec = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
    return ",".join(str(c.get("name", "")) for c in spec.get("containers") or [])


def _images(obj: dict[str, Any]) -> str:
    spec = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
    return ",".join(str(c.get("image", "")) for c in spec.get("containers") or [])


def _selector(obj: dict[str, Any]) -> str:
    from tfusion.apiserver.apps import format_selector

    return format_selector((obj.get("spec") or {}).get("selector"))


def _status_int(key: str) -> Callable[[dict[str, Any]], int]:
    return lambda obj: int((obj.get("status") or {}).get(key) or 0)


def _deployment_ready(obj: dict[str, Any]) -> str:
    return f"{(obj.get('status') or {}).get('readyReplicas') or 0}/{(obj.get('spec') or {}).get('replicas', 0)}"


def _node_selector(obj: dict[str, Any]) -> str:
    selector = (((obj.get("spec") or {}).get("template") or {}).get("spec") or {}).get("nodeSelector") or {}
    return ",".join(f"{k}={v}" for k, v in sorted(selector.items())) or "<none>"


def _job_condition(job: dict[str, Any], kind: str) -> bool:
    return any(c.get("type") == kind and c.get("status") == "True"
               for c in (job.get("status") or {}).get("conditions") or [])


def _job_status(job: dict[str, Any]) -> str:
    for kind in ("Complete", "Failed"):
        if _job_condition(job, kind):
            return kind
    if (job.get("metadata") or {}).get("deletionTimestamp"):
        return "Terminating"
    for kind in ("Suspended", "FailureTarget", "SuccessCriteriaMet"):
        if _job_condition(job, kind):
            return kind
    return "Running"


def _job_completions(job: dict[str, Any]) -> str:
    spec, succeeded = job.get("spec") or {}, (job.get("status") or {}).get("succeeded") or 0
    if spec.get("completions") is not None:
        return f"{succeeded}/{spec['completions']}"
    parallelism = spec.get("parallelism") or 0
    return f"{succeeded}/1 of {parallelism}" if parallelism > 1 else f"{succeeded}/1"


def _last_schedule(cronjob: dict[str, Any]) -> str:
    stamp = (cronjob.get("status") or {}).get("lastScheduleTime")
    return human_age(stamp) if stamp else "<none>"


def _job_duration(job: dict[str, Any]) -> str:
    status = job.get("status") or {}
    try:
        started = parse_rfc3339(status["startTime"]).timestamp()
        ended = parse_rfc3339(status["completionTime"]).timestamp() if status.get("completionTime") else time.time()
    except (KeyError, TypeError, ValueError):
        return ""
    return human_duration(ended - started)


_WORKLOAD_WIDE: list[Column] = [
    ("Containers", "string", "containers of the pod template", _containers),
    ("Images", "string", "images of the pod template", _images),
    ("Selector", "string", "label selector of the pods", _selector),
]

_BUILTIN_COLUMNS: dict[str, list[Column]] = {
    "apps/deployments": [
        NAME,
        ("Ready", "string", "ready pods of the desired", _deployment_ready),
        ("Up-to-date", "integer", "pods of the current template", _status_int("updatedReplicas")),
        ("Available", "integer", "available pods", _status_int("availableReplicas")),
        AGE,
        *_WORKLOAD_WIDE,
    ],
    "apps/replicasets": [
        NAME,
        ("Desired", "integer", "desired pods", _path(".spec.replicas")),
        ("Current", "integer", "pods that exist", _status_int("replicas")),
        ("Ready", "integer", "ready pods", _status_int("readyReplicas")),
        AGE,
        *_WORKLOAD_WIDE,
    ],
    "apps/daemonsets": [
        NAME,
        ("Desired", "integer", "nodes that should run the pod", _status_int("desiredNumberScheduled")),
        ("Current", "integer", "nodes that run the pod", _status_int("currentNumberScheduled")),
        ("Ready", "integer", "nodes whose pod is ready", _status_int("numberReady")),
        ("Up-to-date", "integer", "nodes running the current template", _status_int("updatedNumberScheduled")),
        ("Available", "integer", "nodes whose pod is available", _status_int("numberAvailable")),
        ("Node Selector", "string", "the template's node selector", _node_selector),
        AGE,
        *_WORKLOAD_WIDE,
    ],
    "apps/statefulsets": [NAME, ("Ready", "string", "ready pods of the desired", _deployment_ready), AGE,
                          *_WORKLOAD_WIDE[:2]],
    "batch/jobs": [
        NAME,
        ("Status", "string", "the job's state", _job_status),
        ("Completions", "string", "succeeded of the wanted completions", _job_completions),
        ("Duration", "string", "time the job ran", _job_duration),
        AGE,
        *_WORKLOAD_WIDE,
    ],
    "batch/cronjobs": [
        NAME,
        ("Schedule", "string", "the cron schedule", lambda o: (o.get("spec") or {}).get("schedule", "")),
        ("Timezone", "string", "the schedule's time zone", lambda o: (o.get("spec") or {}).get("timeZone") or "<none>"),
        ("Suspend", "boolean", "whether new runs are held", lambda o: str(bool((o.get("spec") or {}).get("suspend")))),
        ("Active", "integer", "Jobs still running", lambda o: len((o.get("status") or {}).get("active") or [])),
        ("Last Schedule", "string", "since the last scheduled run", _last_schedule),
        AGE,
    ],
    "/pods": [
        NAME,
        ("Ready", "string", "containers ready", _pod_ready),
        ("Status", "string", "pod status", _pod_status),
        ("Restarts", "integer", "container restarts", _restarts),
        AGE,
        ("IP", "string", "pod IP", _path(".status.podIP")),
        ("Node", "string", "node name", _path(".spec.nodeName")),
    ],
    "/nodes": [
        NAME,
        ("Status", "string", "node status", _node_status),
        ("Roles", "string", "node roles", _node_roles),
        AGE,
        ("Version", "string", "kubelet version", _path(".status.nodeInfo.kubeletVersion")),
    ],
    "/namespaces": [NAME, ("Status", "string", "namespace phase", _path(".status.phase")), AGE],
    "/services": [
        NAME,
        ("Type", "string", "service type", _path(".spec.type")),
        ("Cluster-IP", "string", "cluster IP", _path(".spec.clusterIP")),
        ("Port(s)", "string", "ports", _ports),
        AGE,
    ],
    "/configmaps": [NAME, ("Data", "integer", "entries", _count("data")), AGE],
    "/secrets": [
        NAME,
        ("Type", "string", "secret type", _path(".type")),
        ("Data", "integer", "entries", _count("data")),
        AGE,
    ],
    "/events": [
        ("Last Seen", "string", "last seen", _event_last_seen),
        ("Type", "string", "event type", _path(".type")),
        ("Reason", "string", "reason", _path(".reason")),
        (
            "Object",
            "string",
            "involved object",
            lambda e: (
                f"{(e.get('involvedObject') or e.get('regarding') or {}).get('kind', '').lower()}/"
                f"{(e.get('involvedObject') or e.get('regarding') or {}).get('name', '')}"
            ),
        ),
        ("Message", "string", "message", lambda e: e.get("message", e.get("note"))),
    ],
    "coordination.k8s.io/leases": [NAME, ("Holder", "string", "holder", _path(".spec.holderIdentity")), AGE],
    "apiextensions.k8s.io/customresourcedefinitions": [
        NAME,
        ("Created At", "string", "creation time", _metadata_field("creationTimestamp")),
    ],
    "scheduling.k8s.io/priorityclasses": [
        NAME,
        ("Value", "integer", "priority", _path(".value")),
        ("Global-Default", "boolean", "global default", lambda o: bool(o.get("globalDefault"))),
        AGE,
    ],
}

_BUILTIN_COLUMNS.update(table_columns(NAME, AGE))  # NetworkPolicy, PDB, Endpoints, EndpointSlice
_BUILTIN_COLUMNS.update(volumeclaims.table_columns(NAME, AGE))  # PersistentVolumeClaim
_BUILTIN_COLUMNS.update(appsets.table_columns(NAME, AGE))  # ControllerRevision


def columns_for(info: ResourceInfo) -> list[Column]:
    if info.is_custom:
        if not info.printer_columns:
            return [NAME, ("Age", "date", AGE[2], AGE[3])]
        columns: list[Column] = [NAME]
        for spec in info.printer_columns:
            columns.append(
                (
                    str(spec.get("name", "")),
                    str(spec.get("type", "string")),
                    str(spec.get("description", "")),
                    json_path(str(spec.get("jsonPath", ""))),
                )
            )
        return columns
    return _BUILTIN_COLUMNS.get(info.storage_key, [NAME, AGE])


def _cell(kind: str, value: Any) -> Any:
    if value is None:
        return None
    if kind == "date":
        return human_age(value)
    if isinstance(value, list | dict):
        return orjson.dumps(value).decode()  # JSONPath prints structured values as JSON
    return value


def _priority(name: str, info: ResourceInfo) -> int:
    if info.is_custom:  # a CRD column with priority > 0 shows only with -o wide
        declared = next((c for c in info.printer_columns if c.get("name") == name), None)
        return int(declared.get("priority", 0)) if declared else 0
    wide = {"/pods": ("IP", "Node"), "/nodes": ("Version",),
            "/persistentvolumeclaims": ("VolumeMode",)}.get(info.storage_key, ())
    if info.storage_key in ("apps/deployments", "apps/replicasets", "batch/jobs", "apps/daemonsets",
                            "apps/statefulsets"):
        wide = ("Containers", "Images", "Selector")
    return 1 if name in wide else 0


def table(
    info: ResourceInfo,
    objects: list[dict[str, Any]],
    *,
    include_object: str = "Metadata",
    list_meta: dict[str, Any] | None = None,
    with_columns: bool = True,
) -> dict[str, Any]:
    columns = columns_for(info)
    rows = []
    for obj in objects:
        row: dict[str, Any] = {"cells": [_cell(kind, get(obj)) for _, kind, _, get in columns]}
        if include_object == "Object":
            row["object"] = obj
        elif include_object != "None":
            row["object"] = {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj.get("metadata", {}),
            }
        rows.append(row)
    body: dict[str, Any] = {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": list_meta or {}, "rows": rows}
    if with_columns:
        body["columnDefinitions"] = [
            {
                "name": name,
                "type": "string" if kind == "date" else kind,
                # kubectl finds the name column by its format (to print kind/name for several kinds)
                "format": "date" if kind == "date" else "name" if (name, description) == (NAME[0], NAME[2]) else "",
                "description": description,
                "priority": _priority(name, info),
            }
            for name, kind, description, _ in columns
        ]
    else:
        body["columnDefinitions"] = None
    return body
