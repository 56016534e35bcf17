"""Remote vGPU mode in the pod webhook: the pod runs on any node and reaches a GPU worker elsewhere.

Why a module of its own: a remote client pod is analysed like a local one (the same profile, pool,
amounts and QoS rules, tfusion/controller/defaults.py, and container rules in mutate.py), but what it
becomes differs: it is not scheduled by tfusion and holds no GPU itself; the GPU request goes to its
TensorFusionWorkload, whose worker pods the controller creates, and the pod gets the client library
and the address to ask for its worker.
mutate.py calls `remote_plan` once it knows the pod is remote (`tensor-fusion.ai/is-local-gpu:
"false"`, the WorkloadProfile's `isLocalGPU: false`, or the pool's `defaultUsingLocalGPU: false`);
render.py calls `wire_client` instead of the local scheduler, index and limiter wiring.

What a client pod gets (reference §2.3): labels `component=client`, the pool and the client template
hash (no `workload` label: it is not one of the workload's workers); annotation
`selected-workload=<workload>` and `is-local-gpu: "false"`; the pool's `patchToPod` and
`patchToContainer`; the `inject-lib` init container copying the client library into the `tf-libs`
volume, preloaded in each injected container; and the connection's environment:
`TENSOR_FUSION_CONNECTION_NAME` (`<pod>-tf-vgpu-<id10>`), `TENSOR_FUSION_CONNECTION_NAMESPACE` and
`TENSOR_FUSION_OPERATOR_GET_CONNECTION_URL` (`<operator endpoint>/api/connection?name=…&namespace=…`,
the endpoint being the pool's `componentConfig.client.operatorEndpoint`, else the controller's
Service, or loopback with --role=all).
The Pod reconciler creates the TensorFusionConnection of that name. A `worker-pod-template`
annotation (YAML or JSON PodTemplateSpec) becomes the workload's `spec.workerPodTemplate`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlencode

from tfusion.api import annotations as tfa
from tfusion.api.accessors import Body, Pod, Workload, items, section, text
from tfusion.api.documents import DocumentError, load_json_or_yaml
from tfusion.api.jsontypes import JsonObject, json_object
from tfusion.api.merge import PatchError, strategic_merge_patch
from tfusion.controller.webhook.build import child
from tfusion.controller.webhook.mutate import (
    LIBS_DIR,
    LIBS_VOLUME,
    NVIDIA_SMI,
    Denial,
    Plan,
)
from tfusion.controller.webhook.render import (
    EnvVar,
    VolumeMount,
    add_init_container,
    add_mounts,
    add_volumes,
    containers,
    inject_lib_container,
    set_env,
)
from tfusion.controller.webhook.workloads import short_id
from tfusion.settings import format_listen, parse_listen

if TYPE_CHECKING:
    from tfusion.settings import Settings

CONNECTION_NAME_ENV = "TENSOR_FUSION_CONNECTION_NAME"
CONNECTION_NAMESPACE_ENV = "TENSOR_FUSION_CONNECTION_NAMESPACE"
CONNECTION_URL_ENV = "TENSOR_FUSION_OPERATOR_GET_CONNECTION_URL"
CONNECTION_INFIX = "tf-vgpu-"
CONNECTION_ID_LENGTH = 10
#: the Service in front of the controller's HTTP API (deploy/base/controller/services.yaml)
CONTROLLER_SERVICE = "tensor-fusion-controller"
#: the most a worker-pod-template annotation may hold (an annotation set is at most 256 KiB anyway)
MAX_TEMPLATE_BYTES = 256 * 1024


@dataclass(frozen=True)
class RemoteClient:
    """What `wire_client` writes into a remote client pod, decided by `remote_plan`."""

    connection_name: str
    namespace: str
    #: where the client asks for its worker's address (the operator endpoint with the query)
    connection_url: str
    client_image: str


def operator_endpoint(settings: Settings) -> str:
    """The default base URL of the controller's HTTP API for client pods: loopback with
    --role=all (the API server and the pods are on this machine), else the controller's Service."""
    host, port = parse_listen(settings.resolved_controller_listen)
    if "all" in settings.roles:
        return "http://" + format_listen("127.0.0.1" if host in ("0.0.0.0", "::") else host, port)
    return f"http://{CONTROLLER_SERVICE}.{settings.operator_namespace}.svc:{port}"


def connection_name(pod: Pod) -> str:
    """`<pod>-tf-vgpu-<id10>`, or `<generateName>tf-vgpu-<id10>` for a pod named by the server."""
    if pod.name:
        prefix = f"{pod.name}-"
    else:
        generated = text(pod.meta.raw, "generateName") or "pod-"
        prefix = generated if generated.endswith("-") else generated + "-"
    return f"{prefix}{CONNECTION_INFIX}{short_id(CONNECTION_ID_LENGTH)}"


def worker_pod_template(notes: Mapping[str, str], profile: Workload) -> JsonObject | None:
    """The workload's workerPodTemplate: the annotation's (YAML or JSON), else the profile's."""
    raw = notes.get(tfa.WORKER_POD_TEMPLATE)
    if not raw:
        template = profile.spec.get("workerPodTemplate")
        return json_object(template) if isinstance(template, Mapping) else None
    try:
        parsed = load_json_or_yaml(raw.encode(), max_bytes=MAX_TEMPLATE_BYTES)
    except DocumentError as exc:
        raise Denial(f"annotation {tfa.WORKER_POD_TEMPLATE}: not YAML or JSON ({exc}); expected a "
                     f"PodTemplateSpec (metadata and spec)") from None
    if not isinstance(parsed, dict) or not set(parsed) <= {"metadata", "spec"}:
        found = sorted(parsed) if isinstance(parsed, dict) else type(parsed).__name__
        raise Denial(f"annotation {tfa.WORKER_POD_TEMPLATE}: {found} is not allowed; expected a PodTemplateSpec, "
                     f"an object with only metadata and spec")
    for key in ("metadata", "spec"):
        if key in parsed and not isinstance(parsed[key], dict):
            raise Denial(f"annotation {tfa.WORKER_POD_TEMPLATE}: {key} must be an object")
    return json_object(parsed)


def _client_image(plan: Plan) -> str:
    """The remote client image: the pool's remoteModeImage wins over the image both modes use."""
    return text(plan.pool.component_config, "client", "remoteModeImage") or plan.client_image


def remote_plan(plan: Plan, pod: Pod, notes: Mapping[str, str], profile: Workload, endpoint: str) -> Plan:
    """Turn the local plan `analyse` made into a remote client's (see the module docstring)."""
    if plan.sidecar:
        raise Denial(f'{tfa.SIDECAR_WORKER}: "true" needs local GPU mode; remove it or set '
                     f'{tfa.IS_LOCAL_GPU}: "true"')
    namespace = pod.namespace or "default"
    workload_name = Body(plan.workload).name
    name = connection_name(pod)
    query = urlencode({"name": name, "namespace": namespace})
    endpoint = text(plan.pool.component_config, "client", "operatorEndpoint") or endpoint
    plan.remote = RemoteClient(connection_name=name, namespace=namespace,
                               connection_url=f"{endpoint.rstrip('/')}/api/connection?{query}",
                               client_image=_client_image(plan))
    plan.annotations[tfa.IS_LOCAL_GPU] = "false"
    plan.annotations[tfa.SELECTED_WORKLOAD] = workload_name
    plan.annotations.pop(tfa.EMBEDDED_WORKER, None)
    plan.remove_annotations.append(tfa.EMBEDDED_WORKER)
    plan.labels[tfa.COMPONENT] = tfa.COMPONENT_CLIENT
    plan.labels.pop(tfa.WORKLOAD, None)
    spec = child(plan.workload, "spec")
    spec["isLocalGPU"] = False
    spec["sidecarWorker"] = False
    template = worker_pod_template(notes, profile)
    if template is not None:
        spec["workerPodTemplate"] = template
    return plan


# --- rendering --------------------------------------------------------------------------------------


def _patch_pod(pod: JsonObject, plan: Plan) -> None:
    """The pool's componentConfig.client.patchToPod, strategic-merged into the pod."""
    patch = section(plan.pool.component_config, "client", "patchToPod")
    if not patch:
        return
    try:
        merged = strategic_merge_patch(pod, json_object(patch), "Pod")
    except PatchError as exc:
        raise Denial(f"GPUPool {plan.pool_name}: spec.componentConfig.client.patchToPod cannot be applied: "
                     f"{exc}", code=500) from None
    # in place: render() goes on writing into the pod's own annotations dict
    meta = child(pod, "metadata")
    for key, value in section(merged, "metadata").items():
        kept = meta.get(key)
        if isinstance(value, dict) and isinstance(kept, dict):
            kept.clear()
            kept.update(value)
        else:
            meta[key] = value
    for key, value in merged.items():
        if key != "metadata":
            pod[key] = value


def wire_client(pod: JsonObject, plan: Plan) -> None:
    """The client library and the connection's environment (render.py calls it for remote plans)."""
    remote = plan.remote
    assert remote is not None
    _patch_pod(pod, plan)
    disable: list[EnvVar] = [{"name": "DISABLE_GPU_LIMITER", "value": "true"}] \
        if "gpu-limiter" in plan.disabled_features else []
    init = inject_lib_container(remote.client_image, disable)
    add_volumes(pod, [{"name": LIBS_VOLUME, "emptyDir": {}}])
    add_init_container(pod, init)
    env: list[EnvVar] = [
           {"name": "TF_PREPEND_PATH", "value": LIBS_DIR}, {"name": "TF_LD_LIBRARY_PATH", "value": LIBS_DIR},
           {"name": CONNECTION_NAME_ENV, "value": remote.connection_name},
           {"name": CONNECTION_NAMESPACE_ENV, "value": remote.namespace},
           {"name": CONNECTION_URL_ENV, "value": remote.connection_url}]
    mounts: list[VolumeMount] = [{"name": LIBS_VOLUME, "mountPath": "/etc/ld.so.preload", "subPath": "ld.so.preload",
                          "readOnly": True}, {"name": LIBS_VOLUME, "mountPath": LIBS_DIR}]
    if plan.vendor.lower() == "nvidia":
        mounts.append({"name": LIBS_VOLUME, "mountPath": NVIDIA_SMI, "subPath": "nvidia-smi"})
    for container in containers(pod):
        if container.get("name") in plan.inject:
            set_env(container, env)
            add_mounts(container, mounts)


def connection_of(pod: Pod) -> str:
    """The TensorFusionConnection name the webhook gave a client pod ("" for another pod)."""
    for container in pod.containers:
        for entry in items(container, "env"):
            if isinstance(entry, Mapping) and entry.get("name") == CONNECTION_NAME_ENV and entry.get("value"):
                return str(entry["value"])
    return ""
