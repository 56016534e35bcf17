"""Every TensorFusion label, annotation, finalizer and resource name, and parsers for their values.

Why it exists: pods, nodes, pools and GPUs talk to the controller, scheduler and hypervisor through
`tensor-fusion.ai/...` keys. Spelling them once here, and parsing their values once here, keeps the
roles in agreement and gives users one clear error for a bad value (which key, what value, what is
allowed), e.g. ``annotation tensor-fusion.ai/gpu-count: "200" is not allowed; expected an integer
from 1 to 128``.

The domain: like the original, ``<TENSOR_FUSION_CUSTOM_DOMAIN_PREFIX>.<TENSOR_FUSION_CUSTOM_DOMAIN_SUFFIX>``
(default ``tensor-fusion.ai``). The CLI calls `set_domain` once at start-up, which rewrites every
key constant of this module. Therefore **always read keys as module attributes**::

    from tfusion.api import annotations as ann
    pod_annotations[ann.GPU_IDS]                  # right: follows set_domain
    from tfusion.api.annotations import GPU_IDS   # wrong: frozen at import time

Import it under another name (``as ann``): in a module with ``from __future__ import annotations``
the bare name ``annotations`` is taken, and mypy rejects the second import.

Keys marked "label" are labels; the others are annotations unless their comment says otherwise.
Upstream abbreviates the domain as ``tf/`` in its docs; here every key is spelled out in full.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Collection, Iterable, Mapping
from datetime import datetime
from typing import Final, TypeVar

import orjson

from tfusion.api import durations, timestamps
from tfusion.api.quantity import Quantity, QuantityError

T = TypeVar("T")

DEFAULT_DOMAIN_PREFIX: Final = "tensor-fusion"
DEFAULT_DOMAIN_SUFFIX: Final = "ai"
#: the current domain; rewritten by set_domain, like every key below
DOMAIN = "tensor-fusion.ai"

# --- pod inputs read by the webhook (reference §2.1) -------------------------------------------------
ENABLED = "tensor-fusion.ai/enabled"  # label: "true" = TF pod; "false" = never auto-migrate
WORKLOAD_PROFILE = "tensor-fusion.ai/workload-profile"  # WorkloadProfile name in the pod's namespace
GPU_POOL = "tensor-fusion.ai/gpupool"  # annotation on pods; label on workloads, GPUs, pods
IS_LOCAL_GPU = "tensor-fusion.ai/is-local-gpu"
SIDECAR_WORKER = "tensor-fusion.ai/sidecar-worker"
ISOLATION = "tensor-fusion.ai/isolation"
PARTITION_ID = "tensor-fusion.ai/partition-id"
WORKER_POD_TEMPLATE = "tensor-fusion.ai/worker-pod-template"
TFLOPS_REQUEST = "tensor-fusion.ai/tflops-request"
TFLOPS_LIMIT = "tensor-fusion.ai/tflops-limit"
VRAM_REQUEST = "tensor-fusion.ai/vram-request"
VRAM_LIMIT = "tensor-fusion.ai/vram-limit"
COMPUTE_PERCENT_REQUEST = "tensor-fusion.ai/compute-percent-request"
COMPUTE_PERCENT_LIMIT = "tensor-fusion.ai/compute-percent-limit"
GPU_COUNT = "tensor-fusion.ai/gpu-count"
GPU_INDICES = "tensor-fusion.ai/gpu-indices"
GPU_MODEL = "tensor-fusion.ai/gpu-model"
VENDOR = "tensor-fusion.ai/vendor"
QOS = "tensor-fusion.ai/qos"
INJECT_CONTAINER = "tensor-fusion.ai/inject-container"
DEDICATED_GPU = "tensor-fusion.ai/dedicated-gpu"
AUTOSCALE = "tensor-fusion.ai/autoscale"
AUTOSCALE_TARGET = "tensor-fusion.ai/autoscale-target"
#: tfusion's own: the autoscaler's usage histograms of a workload (JSON), so a new leader goes on from them
AUTOSCALER_CHECKPOINT = "tensor-fusion.ai/autoscaler-checkpoint"
ENABLED_REPLICAS = "tensor-fusion.ai/enabled-replicas"
GANG_ENABLED = "tensor-fusion.ai/gang-enabled"
GANG_MIN_MEMBERS = "tensor-fusion.ai/gang-min-members"
GANG_TIMEOUT = "tensor-fusion.ai/gang-timeout"
DISABLE_FEATURES = "tensor-fusion.ai/disable-features"  # annotation on pods, label on workloads
HOST_PORT = "tensor-fusion.ai/host-port"  # label: "auto" = allocate a cluster-level host port
PORT_NAME = "tensor-fusion.ai/port-name"  # label: the container port that gets the host port
EVICTION_PROTECTION = "tensor-fusion.ai/eviction-protection"  # duration
REQUIRE_GPU_TOPOLOGY = "tensor-fusion.ai/require-gpu-topology"
GPU_TOPOLOGY_MAX_TIER = "tensor-fusion.ai/gpu-topology-max-tier"
GPU_TOPOLOGY_SOURCE = "tensor-fusion.ai/gpu-topology-source"

# --- written by the webhook (reference §2.3) ---------------------------------------------------------
WORKLOAD_MODE = "tensor-fusion.ai/workload-mode"  # on TensorFusionWorkload: dynamic|fixed
CONTAINER_GPU_COUNT = "tensor-fusion.ai/container-gpu-count"  # JSON {container: count}
PENDING_OWNED_WORKLOAD = "tensor-fusion.ai/pending-owned-workload"
#: tfusion's own, on a bare local-GPU pod: the labels, annotations and spec (JSON) of the workload
#: the pod reconciler creates for it, owned by the pod (reconcilers/pod.py)
PENDING_OWNED_WORKLOAD_SPEC = "tensor-fusion.ai/pending-owned-workload-spec"
GANG_DESIRED_MEMBERS = "tensor-fusion.ai/gang-desired-members"
GANG_REQUIRED_MEMBERS = "tensor-fusion.ai/gang-required-members"
GANG_GROUP_KEY = "tensor-fusion.ai/gang-group-key"  # "<namespace>/<workload>"
WORKLOAD = "tensor-fusion.ai/workload"  # label on local-mode pods and connections
SELECTED_WORKLOAD = "tensor-fusion.ai/selected-workload"  # remote mode
INDEX = "tensor-fusion.ai/index"  # pod index 1..128 (device-plugin handshake)
POD_TEMPLATE_HASH = "tensor-fusion.ai/pod-template-hash"  # label
COMPONENT = "tensor-fusion.ai/component"  # label: worker|client|hypervisor|...
EMBEDDED_WORKER = "tensor-fusion.ai/embedded-worker"
USED_BY = "tensor-fusion.ai/used-by"  # taint key on GPU nodes; value USED_BY_TENSOR_FUSION
PORT_NUMBER = "tensor-fusion.ai/port-number"
TF_COUNTER_PREFIX = "tensor-fusion.ai/tf-counter-"  # + pod template hash, on the pod's owner (grey release)
POD_COUNTER_KEY = "tensor-fusion.ai/pod-counter-key"

# --- written later by the scheduler and controllers (reference §2.4) -----------------------------------
GPU_IDS = "tensor-fusion.ai/gpu-ids"  # comma list of GPU CR names: the scheduler/hypervisor contract
EFFECTIVE_HARD_SM_PERCENT = "tensor-fusion.ai/effective-hard-sm-percent"
CONTAINER_GPUS = "tensor-fusion.ai/container-gpus"  # JSON {container: [gpu ids]}
DEDICATED_WORKER = "tensor-fusion.ai/dedicated-worker"
DEFRAG_EVICTED = "tensor-fusion.ai/defrag-evicted"
FINALIZER = "tensor-fusion.ai/finalizer"  # finalizer (not an annotation)
PARTITION_UUIDS = "tensor-fusion.ai/partition-uuids"  # CRI container annotation "part:parent,..."

# --- pools, nodes, GPUs, claims, provider configs (reference §1, hypervisor §4) ------------------------
MANAGED_BY = "tensor-fusion.ai/managed-by"  # label: owning cluster / pool / GPUNode
CLUSTER = "tensor-fusion.ai/cluster"  # label on GPUNodeClaims
POOL_LABEL_PREFIX = "tensor-fusion.ai/pool-"  # label "<prefix><pool>=true" on GPUNodes and claims
NODE_PROVISIONER = "tensor-fusion.ai/node-provisioner"  # label: the GPUNodeClaim
NODE_CLASS = "tensor-fusion.ai/node-class"  # label on GPUNodeClaims
HARDWARE_VENDOR = "tensor-fusion.ai/hardware-vendor"  # label on GPUNodes and Nodes
NODE_SELECTOR_HASH = "tensor-fusion.ai/node-selector-hash"  # label on Nodes
ORPHAN = "tensor-fusion.ai/orphan"  # label on Nodes without a claim
SHOULD_DELETE = "tensor-fusion.ai/should-delete"  # label on Nodes chosen by compaction
DO_NOT_DISRUPT = "tensor-fusion.ai/do-not-disrupt"
EXPANSION_SOURCE = "tensor-fusion.ai/expansion-source"  # label
LAST_SYNC = "tensor-fusion.ai/last-sync"  # RFC 3339
GPU_MISSING_SINCE = "tensor-fusion.ai/gpu-missing-since"  # RFC 3339, on GPUs whose device vanished
VIRTUALIZATION_CAPABILITIES = "tensor-fusion.ai/virtualization-capabilities"  # JSON, on GPUs
IS_DEFAULT_POOL = "tensor-fusion.ai/is-default-pool"  # "true"|"false", on GPUPools
MANUAL_COMPACTION = "tensor-fusion.ai/manual-compaction"  # RFC 3339, on GPUPools
PROVIDER_CONFIG_REVISIONS = "tensor-fusion.ai/provider-config-revisions"  # JSON vendor -> hash, on GPUPools
PROVIDER_CONFIG_HASH = "tensor-fusion.ai/provider-config-hash"
HYPERVISOR_UPDATE_IN_PROGRESS = "tensor-fusion.ai/hypervisor-update-in-progress"
WORKER_UPDATE_IN_PROGRESS = "tensor-fusion.ai/worker-update-in-progress"
CLIENT_UPDATE_IN_PROGRESS = "tensor-fusion.ai/client-update-in-progress"
HYPERVISOR_BATCH_UPDATE_LAST_TIME = "tensor-fusion.ai/hypervisor-batch-update-last-time"
WORKER_BATCH_UPDATE_LAST_TIME = "tensor-fusion.ai/worker-batch-update-last-time"
CLIENT_BATCH_UPDATE_LAST_TIME = "tensor-fusion.ai/client-batch-update-last-time"
HOURLY_PRICING = "tensor-fusion.ai/hourly-pricing"  # on GPUNodeClaims
WORKER_NAME = "tensor-fusion.ai/worker-name"  # label on TensorFusionConnections
# node requirement keys of GPUPool nodeProvisioner (besides the well-known Kubernetes ones)
GPU_VENDOR_REQUIREMENT = "tensor-fusion.ai/gpu-vendor"
GPU_INSTANCE_FAMILY = "tensor-fusion.ai/gpu-instance-family"
GPU_INSTANCE_SIZE = "tensor-fusion.ai/gpu-instance-size"

# --- extended resources of the hypervisor's device plugins (hypervisor §9) -----------------------------
INDEX_RESOURCE_PREFIX = "tensor-fusion.ai/index_"  # + one hex digit 0..f

# --- names outside the domain --------------------------------------------------------------------------
SCHEDULER_NAME: Final = "tensor-fusion-scheduler"
PRIORITY_CLASS_PREFIX: Final = "tensor-fusion-"  # tensor-fusion-high, tensor-fusion-critical
HOSTNAME_LABEL: Final = "kubernetes.io/hostname"
NVIDIA_GPU_PRESENT_LABEL: Final = "nvidia.com/gpu.present"
#: pod annotations the simulated kubelet of --role=all reads (ours; no real kubelet does): after the
#: duration its containers exit with the code (default 0), then the restartPolicy decides
SIMULATE_EXIT_AFTER: Final = "tfusion.dev/simulate-exit-after"
SIMULATE_EXIT_CODE: Final = "tfusion.dev/simulate-exit-code"

# --- values --------------------------------------------------------------------------------------------
COMPONENT_WORKER: Final = "worker"
COMPONENT_CLIENT: Final = "client"
COMPONENT_HYPERVISOR: Final = "hypervisor"
WORKLOAD_MODE_DYNAMIC: Final = "dynamic"
WORKLOAD_MODE_FIXED: Final = "fixed"
USED_BY_TENSOR_FUSION: Final = "tensor-fusion"  # value of the USED_BY taint
HOST_PORT_AUTO: Final = "auto"
QOS_LEVELS: Final = ("low", "medium", "high", "critical")
#: isolation modes (the `isolation` annotation, GPUPool defaults, GPU status, the hypervisor's workers);
#: the Literal `tfusion.api.kinds.common.IsolationMode` spells the same four for the CRD schemas
ISOLATION_SHARED: Final = "shared"
ISOLATION_SOFT: Final = "soft"
ISOLATION_HARD: Final = "hard"
ISOLATION_PARTITIONED: Final = "partitioned"
ISOLATION_MODES: Final = (ISOLATION_SHARED, ISOLATION_SOFT, ISOLATION_HARD, ISOLATION_PARTITIONED)
#: gpu-topology-source (and GPUNetworkTopologyAware topologySource): where a GPU pair's tier comes from
TOPOLOGY_SOURCES: Final = ("auto", "numa", "vendor")
#: tiers of a GPU pair: 0 NVLink, 1 PCIe switch / same NUMA node, 2 across NUMA nodes, 3 unknown
TOPOLOGY_TIER_MAX: Final = 3
DEFAULT_ISOLATION: Final = ISOLATION_SOFT
AUTOSCALE_TARGETS: Final = ("compute", "vram", "all")
WORKLOAD_MODES: Final = (WORKLOAD_MODE_DYNAMIC, WORKLOAD_MODE_FIXED)
DISABLE_FEATURE_NAMES: Final = ("gpu-opt", "mem-manager", "gpu-limiter", "start-worker")

#: Pod phases after which a pod holds no GPU and will not run again (kube's PodSucceeded, PodFailed)
POD_SUCCEEDED: Final = "Succeeded"
POD_FAILED: Final = "Failed"
FINISHED_POD_PHASES: Final = frozenset({POD_SUCCEEDED, POD_FAILED})

GPU_COUNT_MIN: Final = 1
GPU_COUNT_MAX: Final = 128
#: the device-plugin handshake: 16 resources index_0..index_f, each requested 1..8 times
INDEX_RESOURCES: Final = 16
INDEX_SLOTS_PER_RESOURCE: Final = 8
POD_INDEX_MAX: Final = INDEX_RESOURCES * INDEX_SLOTS_PER_RESOURCE  # 128
#: dummy devices each index plugin offers: 1 + 2 + ... + 8, so every count of one resource can be held at once
INDEX_DEVICES_PER_RESOURCE: Final = INDEX_SLOTS_PER_RESOURCE * (INDEX_SLOTS_PER_RESOURCE + 1) // 2  # 36

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN_RE: Final = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*", re.ASCII)


def _domain_keys() -> dict[str, str]:
    """Name -> value of every module constant that lives in the current domain."""
    prefix = DOMAIN + "/"
    return {name: value for name, value in globals().items()
            if name.isupper() and isinstance(value, str) and value.startswith(prefix)}


def set_domain(prefix: str, suffix: str) -> None:
    """Move every key to ``<prefix>.<suffix>/...`` (the CLI calls this once at start-up).

    Raises ValueError when the domain is not a DNS subdomain (what Kubernetes requires of the
    prefix of a label or annotation key).
    """
    global DOMAIN
    domain = f"{prefix}.{suffix}"
    too_long = len(domain) > 253 or any(len(label) > 63 for label in domain.split("."))
    if too_long or not _DNS_SUBDOMAIN_RE.fullmatch(domain):
        raise ValueError(
            f"TENSOR_FUSION_CUSTOM_DOMAIN_PREFIX/_SUFFIX give the domain {domain!r}, which is not a DNS "
            "subdomain; expected lowercase letters, digits, '-' and '.', e.g. 'tensor-fusion' and 'ai'")
    old_prefix = DOMAIN + "/"
    module = globals()
    for name, value in _domain_keys().items():
        module[name] = domain + "/" + value[len(old_prefix):]
    DOMAIN = domain


def all_keys() -> dict[str, str]:
    """Every key constant in the current domain, by constant name (for docs and tests)."""
    return _domain_keys()


# --- key helpers ---------------------------------------------------------------------------------------


def pool_label(pool: str) -> str:
    """The ``<domain>/pool-<pool>`` label a GPUNode of that pool carries (value "true")."""
    return POOL_LABEL_PREFIX + pool


def tf_counter_key(pod_template_hash: str) -> str:
    """The grey-release counter annotation on a pod's owner."""
    return TF_COUNTER_PREFIX + pod_template_hash


def priority_class_name(qos: str) -> str:
    """The PriorityClass for a QoS level (the chart ships tensor-fusion-{critical,high,medium})."""
    return PRIORITY_CLASS_PREFIX + parse_qos(qos)


# --- errors --------------------------------------------------------------------------------------------


class AnnotationError(ValueError):
    """A label or annotation value is not allowed; names the key, quotes the value, says what is."""

    def __init__(self, key: str, value: str, allowed: str, *, kind: str = "annotation",
                 detail: str = "") -> None:
        self.key = key
        self.value = value
        self.allowed = allowed
        self.kind = kind
        self.detail = detail
        reason = f" ({detail})" if detail else ""
        super().__init__(f"{kind} {key}: {orjson.dumps(value).decode()} is not allowed{reason}; expected {allowed}")


# --- value parsers -------------------------------------------------------------------------------------

_GO_TRUE = ("1", "t", "T", "true", "TRUE", "True")
_GO_FALSE = ("0", "f", "F", "false", "FALSE", "False")


def parse_bool(value: str, *, key: str, kind: str = "annotation") -> bool:
    """Go's strconv.ParseBool spellings: true/false, True/False, TRUE/FALSE, t/f, 1/0.

    The original compares many of these annotations with "true" literally, so it reads "True" as
    false; here every spelling Go accepts counts, and anything else is an error instead of false.
    """
    text = value.strip()
    if text in _GO_TRUE:
        return True
    if text in _GO_FALSE:
        return False
    raise AnnotationError(key, value, '"true" or "false"', kind=kind)


def parse_int(value: str, *, key: str, minimum: int | None = None, maximum: int | None = None,
              kind: str = "annotation") -> int:
    """A base-10 integer, optionally within [minimum, maximum]."""
    allowed = _int_range_text(minimum, maximum)
    text = value.strip()
    if not re.fullmatch(r"[+-]?[0-9]+", text, re.ASCII):
        raise AnnotationError(key, value, allowed, kind=kind)
    number = int(text)
    if (minimum is not None and number < minimum) or (maximum is not None and number > maximum):
        raise AnnotationError(key, value, allowed, kind=kind)
    return number


def _int_range_text(minimum: int | None, maximum: int | None) -> str:
    if minimum is not None and maximum is not None:
        return f"an integer from {minimum} to {maximum}"
    if minimum is not None:
        return f"an integer of at least {minimum}"
    if maximum is not None:
        return f"an integer of at most {maximum}"
    return "an integer"


def format_bool(value: bool) -> str:
    """A boolean annotation or label value as the original writes it: "true" or "false"."""
    return "true" if value else "false"


def parse_choice(value: str, choices: Collection[str], *, key: str, kind: str = "annotation") -> str:
    text = value.strip()
    if text not in choices:
        raise AnnotationError(key, value, "one of " + "|".join(choices), kind=kind)
    return text


def parse_gpu_count(value: str, *, key: str | None = None) -> int:
    """``gpu-count``: GPUs per pod, 1..128."""
    return parse_int(value, key=key or GPU_COUNT, minimum=GPU_COUNT_MIN, maximum=GPU_COUNT_MAX)


def format_gpu_count(n: int) -> str:
    """The ``gpu-count`` value (`parse_gpu_count` reads it back)."""
    return _format_int(n, key=GPU_COUNT, minimum=GPU_COUNT_MIN, maximum=GPU_COUNT_MAX)


def parse_pod_index(value: str, *, key: str | None = None) -> int:
    """``index``: the pod index of the device-plugin handshake, 1..128."""
    return parse_int(value, key=key or INDEX, minimum=1, maximum=POD_INDEX_MAX)


def _format_int(n: int, *, key: str, minimum: int, maximum: int) -> str:
    """An integer annotation value as its parser reads it back; a value out of range is a bug."""
    if isinstance(n, bool) or not minimum <= n <= maximum:
        raise ValueError(f"{key}: {n!r} is out of range; expected an integer from {minimum} to {maximum}")
    return str(n)


def format_pod_index(n: int) -> str:
    """The ``index`` value (`parse_pod_index` reads it back)."""
    return _format_int(n, key=INDEX, minimum=1, maximum=POD_INDEX_MAX)


def parse_gpu_indices(value: str, *, key: str | None = None) -> tuple[int, ...]:
    """``gpu-indices``: a comma list of distinct GPU indices, e.g. "0,1,3"."""
    key = key or GPU_INDICES
    allowed = 'a comma list of distinct non-negative GPU indices such as "0,1,3"'
    indices: list[int] = []
    for part in value.split(","):
        text = part.strip()
        if not text.isascii() or not text.isdigit():
            raise AnnotationError(key, value, allowed, detail=f"{text!r} is not an index")
        if int(text) in indices:
            raise AnnotationError(key, value, allowed, detail=f"index {int(text)} appears twice")
        if int(text) > 2**31 - 1:
            raise AnnotationError(key, value, allowed, detail=f"index {text} is too large")
        indices.append(int(text))
    return tuple(indices)


def parse_qos(value: str, *, key: str | None = None) -> str:
    """``qos``: low|medium|high|critical."""
    return parse_choice(value, QOS_LEVELS, key=key or QOS)


def parse_isolation(value: str, *, key: str | None = None) -> str:
    """``isolation``: shared|soft|hard|partitioned."""
    return parse_choice(value, ISOLATION_MODES, key=key or ISOLATION)


def parse_topology_max_tier(value: str, *, key: str | None = None) -> int:
    """``gpu-topology-max-tier``: the worst tier a pod's GPU set may have, 0..3."""
    return parse_int(value, key=key or GPU_TOPOLOGY_MAX_TIER, minimum=0, maximum=TOPOLOGY_TIER_MAX)


def parse_topology_source(value: str, *, key: str | None = None) -> str:
    """``gpu-topology-source``: auto|numa|vendor."""
    return parse_choice(value, TOPOLOGY_SOURCES, key=key or GPU_TOPOLOGY_SOURCE)


def parse_topology_overrides(notes: Mapping[str, str]) -> tuple[bool | None, int | None, str]:
    """A pod's topology overrides: (require-gpu-topology, gpu-topology-max-tier, gpu-topology-source),
    None / "" where the pod does not say. The one reading both the webhook and the allocator use."""
    raw = notes.get(REQUIRE_GPU_TOPOLOGY)
    required = parse_bool(raw, key=REQUIRE_GPU_TOPOLOGY) if raw else None
    raw = notes.get(GPU_TOPOLOGY_MAX_TIER)
    tier = parse_topology_max_tier(raw) if raw else None
    raw = notes.get(GPU_TOPOLOGY_SOURCE)
    return required, tier, parse_topology_source(raw) if raw else ""


def parse_workload_mode(value: str, *, key: str | None = None) -> str:
    return parse_choice(value, WORKLOAD_MODES, key=key or WORKLOAD_MODE)


def parse_autoscale_target(value: str, *, key: str | None = None) -> str:
    return parse_choice(value, AUTOSCALE_TARGETS, key=key or AUTOSCALE_TARGET)


_QUANTITY_ALLOWED = 'a non-negative Kubernetes quantity such as "10", "500m", "16Gi" or "1.5"'


def parse_quantity_annotation(value: str, *, key: str) -> Quantity:
    """A non-negative quantity (``tflops-request``, ``vram-limit``, ...)."""
    try:
        quantity = Quantity.parse(value)
    except QuantityError as exc:
        raise AnnotationError(key, value, _QUANTITY_ALLOWED, detail=exc.reason) from None
    if quantity < 0:
        raise AnnotationError(key, value, _QUANTITY_ALLOWED, detail="it is negative")
    return quantity


def format_quantity(quantity: Quantity) -> str:
    """A quantity annotation value (``tflops-request``, ``vram-limit``, ...) in canonical form ("5k", "80Gi")."""
    return str(quantity)


def parse_compute_percent(value: str, *, key: str | None = None) -> Quantity:
    """``compute-percent-request``/``-limit``: a percentage of one GPU's compute, 0 to 100."""
    key = key or COMPUTE_PERCENT_REQUEST
    allowed = 'a percentage from 0 to 100 such as "50" or "12.5"'
    try:
        quantity = Quantity.parse(value)
    except QuantityError as exc:
        raise AnnotationError(key, value, allowed, detail=exc.reason) from None
    if not 0 <= quantity <= 100:
        raise AnnotationError(key, value, allowed)
    return quantity


def parse_csv(value: str, *, key: str, allowed: Collection[str] | None = None,
              kind: str = "annotation") -> tuple[str, ...]:
    """A comma list: items stripped, empty items dropped, duplicates dropped (order kept).

    With `allowed`, every item must be one of them.
    """
    items = tuple(dict.fromkeys(part.strip() for part in value.split(",") if part.strip()))
    if allowed is not None:
        for item in items:
            if item not in allowed:
                raise AnnotationError(key, value, "a comma list of " + ", ".join(allowed), kind=kind,
                                      detail=f"{item!r} is unknown")
    return items


def parse_disable_features(value: str, *, key: str | None = None,
                           kind: str = "annotation") -> tuple[str, ...]:
    """``disable-features``: a comma list of gpu-opt, mem-manager, gpu-limiter, start-worker."""
    return parse_csv(value, key=key or DISABLE_FEATURES, allowed=DISABLE_FEATURE_NAMES, kind=kind)


def parse_gpu_ids(value: str, *, key: str | None = None) -> tuple[str, ...]:
    """``gpu-ids``: a comma list of GPU object names (lowercased device UUIDs), in order."""
    key = key or GPU_IDS
    allowed = 'a comma list of GPU names such as "gpu-1a2b,gpu-3c4d"'
    names: list[str] = []
    for part in value.split(","):
        name = part.strip().lower()
        if not name or len(name) > 253 or not _DNS_SUBDOMAIN_RE.fullmatch(name):
            raise AnnotationError(key, value, allowed, detail=f"{part.strip()!r} is not a GPU name")
        if name in names:
            raise AnnotationError(key, value, allowed, detail=f"{name!r} appears twice")
        names.append(name)
    return tuple(names)


def format_gpu_ids(names: Iterable[str]) -> str:
    """The ``gpu-ids`` value: the names in order, comma-separated (`parse_gpu_ids` reads it back)."""
    return ",".join(names)


def _load_json_object(value: str, key: str, allowed: str) -> dict[str, object]:
    try:
        data = orjson.loads(value)
    except ValueError as exc:
        raise AnnotationError(key, value, allowed, detail=f"invalid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise AnnotationError(key, value, allowed, detail="not a JSON object")
    return data


def parse_container_gpus(value: str, *, key: str | None = None) -> dict[str, tuple[str, ...]]:
    """``container-gpus``: JSON ``{"<container>": ["<gpu name>", ...]}``."""
    key = key or CONTAINER_GPUS
    allowed = 'a JSON object of container name to a list of GPU names, e.g. {"main": ["gpu-1"]}'
    result: dict[str, tuple[str, ...]] = {}
    for container, gpus in _load_json_object(value, key, allowed).items():
        if not isinstance(gpus, list) or not all(isinstance(g, str) and g for g in gpus):
            raise AnnotationError(key, value, allowed, detail=f"container {container!r}: not a list of names")
        result[container] = tuple(g.lower() for g in gpus)
    return result


def format_container_gpus(mapping: Mapping[str, Iterable[str]]) -> str:
    """The ``container-gpus`` value: compact JSON, containers sorted by name."""
    return orjson.dumps({c: list(mapping[c]) for c in sorted(mapping)}).decode()


def parse_container_gpu_count(value: str, *, key: str | None = None) -> dict[str, int]:
    """``container-gpu-count``: JSON ``{"<container>": <GPUs>}``, each 1..128."""
    key = key or CONTAINER_GPU_COUNT
    allowed = (f'a JSON object of container name to a GPU count from {GPU_COUNT_MIN} to {GPU_COUNT_MAX}, '
               'e.g. {"main": 2}')
    result: dict[str, int] = {}
    for container, count in _load_json_object(value, key, allowed).items():
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= GPU_COUNT_MAX:
            raise AnnotationError(key, value, allowed, detail=f"container {container!r}: {count!r}")
        result[container] = count
    return result


def format_container_gpu_count(counts: Mapping[str, int]) -> str:
    """The ``container-gpu-count`` value: compact JSON, containers sorted by name (`parse_container_gpu_count`
    reads back counts of 1..128)."""
    return orjson.dumps({c: counts[c] for c in sorted(counts)}).decode()


def parse_duration(value: str, *, key: str) -> float:
    """A Go duration ("30s", "1h30m", "1.5h", "500ms"; bare "0") as seconds, not negative."""
    try:
        return durations.parse_duration(value)
    except durations.DurationError:
        raise AnnotationError(key, value, 'a duration such as "30s", "5m", "1h30m" or "0"') from None


def protection_end(notes: Mapping[str, str], created: str) -> float | None:
    """When a pod's ``eviction-protection`` ends, in wall seconds: its creation time plus the
    duration; None when it has none; infinity when the duration or the creation time is unreadable
    (evicting is not undone, so such a pod is protected for good). Preemption (which never picks a
    protected victim) and billing (which charges the protected price until then) read this one rule."""
    raw = notes.get(EVICTION_PROTECTION)
    if not raw:
        return None
    try:
        return timestamps.parse_rfc3339(created).timestamp() + parse_duration(raw, key=EVICTION_PROTECTION)
    except (AnnotationError, ValueError):
        return math.inf


def parse_gang_timeout(value: str, *, key: str | None = None) -> float | None:
    """``gang-timeout``: seconds to wait for the whole gang; "0" or "0s" means wait forever (None)."""
    seconds = parse_duration(value, key=key or GANG_TIMEOUT)
    return None if seconds == 0 else seconds


def parse_gang_min_members(value: str, *, key: str | None = None) -> int:
    """``gang-min-members``: 0 (= the replica count) or at least 2."""
    key = key or GANG_MIN_MEMBERS
    number = parse_int(value, key=key, minimum=0)
    if number == 1:
        raise AnnotationError(key, value, "0 (all replicas) or an integer of at least 2",
                              detail="a gang of one is not a gang")
    return number


def parse_effective_hard_sm_percent(value: str, *, key: str | None = None) -> int:
    return parse_int(value, key=key or EFFECTIVE_HARD_SM_PERCENT, minimum=1, maximum=100)


def format_effective_hard_sm_percent(percent: int) -> str:
    """The ``effective-hard-sm-percent`` value (`parse_effective_hard_sm_percent` reads it back)."""
    return _format_int(percent, key=EFFECTIVE_HARD_SM_PERCENT, minimum=1, maximum=100)


def parse_port_number(value: str, *, key: str | None = None) -> int:
    return parse_int(value, key=key or PORT_NUMBER, minimum=1, maximum=65535)


def format_port_number(port: int) -> str:
    """The ``port-number`` value (`parse_port_number` reads it back)."""
    return _format_int(port, key=PORT_NUMBER, minimum=1, maximum=65535)


def parse_timestamp(value: str, *, key: str) -> datetime:
    """An RFC 3339 time with a zone (``last-sync``, ``gpu-missing-since``, ``manual-compaction``)."""
    allowed = 'an RFC 3339 time such as "2025-01-31T12:00:00Z"'
    try:
        return timestamps.parse_rfc3339(value)
    except ValueError:
        detail = "no time zone" if _has_no_zone(value) else ""
        raise AnnotationError(key, value, allowed, detail=detail) from None


def _has_no_zone(value: str) -> bool:
    try:
        return datetime.fromisoformat(value.strip()).tzinfo is None
    except ValueError:
        return False


#: RFC 3339 in UTC with a Z, seconds precision, as Go's time.RFC3339 writes it
format_timestamp = timestamps.rfc3339


def now_rfc3339() -> str:
    """The current time as `timestamps.rfc3339` writes it; kept for callers not yet moved to it."""
    return timestamps.rfc3339()


def parse_present(value: str | None, parse: Callable[[str], T], default: T, *,
                  on_error: Callable[[AnnotationError], object]) -> T:
    """`parse(value)`; `default` when the value is absent or empty, or when it is malformed (then
    `on_error` gets the error, e.g. to log it). For objects that already exist, such as a running
    pod, where a bad annotation must not stop the reader."""
    if not value:
        return default
    try:
        return parse(value)
    except AnnotationError as exc:
        on_error(exc)
        return default


def parse_json_object(value: str, *, key: str) -> dict[str, object]:
    """Any JSON object (``virtualization-capabilities``, ``provider-config-revisions``)."""
    return _load_json_object(value, key, "a JSON object")
