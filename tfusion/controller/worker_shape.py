"""The TensorFusion worker container as the original's worker image expects it, for both places it runs.

Why a module of its own: the remote vGPU worker pod (reconcilers/workers.py) and the local sidecar
worker (webhook/render.py) run the same worker binary, which finds its hypervisor, its shared memory
and its limits through the same names. The original gives both one container shape; so do we, from
one function, so the two cannot drift apart:

- name `tensorfusion-worker`; the worker image;
- env `HYPERVISOR_IP` (the node's address, `status.hostIP`), `HYPERVISOR_PORT` (the pool's
  hypervisor port, else 8001), `POD_NAME`, `POD_NAMESPACE` (downward API), `CONTAINER_NAME`,
  `TF_ENABLE_LOG=1`; `DISABLE_GPU_LIMITER=true` when the workload disables `gpu-limiter`;
- soft isolation: `LD_PRELOAD` of the limiter the worker image ships (NVIDIA and vendors the
  original treats alike), unless `gpu-limiter` is disabled;
- hard isolation: `TF_CUDA_SM_PERCENT_LIMIT` when the limit is a compute percent (a TFLOPS limit
  only becomes a percent on the GPU the scheduler picks, so the hypervisor's device plugin sets it at
  Allocate), `TF_GPU_MEMORY_LIMIT` and its legacy twin `TF_CUDA_MEMORY_LIMIT` in MiB (0: no VRAM limit);
- every mode but shared: the `/run/tensor-fusion/shm` mount of the `tf-data` host volume at the
  pod's own `shm/<namespace>/<pod>` directory (HostToContainer), the `tf-data` volume itself from
  `data_volume()`;
- port 8000 `remote-vgpu`; command `./tensor-fusion-worker -p 8000`, or the shared-memory transport
  for a sidecar, or `sleep infinity` when the workload disables `start-worker`;
- requests of 50m CPU and 128Mi memory when nothing else asks for any (no limits: a worker may
  burst to what the node has).

A soft-isolated remote worker also gets `soft_limiter_parts`: an `init-soft-limiter` init container
copying tfusion's limiter (or the ProviderConfig's middleware image's, limiter_source.py) into the
`soft-limiter` volume, mounted over the worker image's own limiter (and, from a middleware image,
over `nvidia-smi`), with `TF_ISOLATION_MODE=soft` and `TF_SHM_PATH`.

`INIT_RESOURCES` is what the original gives its short init containers (`inject-lib`,
`init-soft-limiter`): requests equal to limits, so a namespace whose ResourceQuota or LimitRange
demands limits still admits the pod.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tfusion.api import annotations as tfa
from tfusion.api.jsontypes import JsonObject, JsonValue
from tfusion.api.quantity import Quantity
from tfusion.controller.limiter_source import LimiterSource

WORKER_CONTAINER = "tensorfusion-worker"
WORKER_PORT = 8000
WORKER_PORT_NAME = "remote-vgpu"
WORKER_BINARY = "./tensor-fusion-worker"
#: what a worker asks for when neither the pool's nor the workload's template says
WORKER_DEFAULT_REQUESTS = {"cpu": "50m", "memory": "128Mi"}
#: the init containers' requests and limits (equal: a limits-demanding quota admits them)
INIT_RESOURCES = {"cpu": "20m", "memory": "256Mi"}
#: where the worker image keeps its soft limiter, preloaded under soft isolation
WORKER_LIMITER = "/home/app/libcuda_limiter.so"
#: vendors whose worker preloads that limiter (the original's; an unnamed vendor is NVIDIA's)
CUDA_LIMITER_VENDORS = frozenset({"", "nvidia"})
#: seconds a worker pod has to stop (the original's worker grace period)
WORKER_GRACE_SECONDS = 5
DATA_VOLUME = "tf-data"
DATA_HOST_PATH = "/run/tensor-fusion"
SHM_MOUNT = "/run/tensor-fusion/shm"
SHM_SUBPATH_EXPR = "shm/$(POD_NAMESPACE)/$(POD_NAME)"
#: the sidecar's shared-memory transport with the app: segment name and size in MiB
TRANSPORT_SEGMENT = "tf_shm"
TRANSPORT_SEGMENT_MIB = 1024
TRANSPORT_DIR = "/dev/shm"
MIB = 1024 * 1024
SOFT_LIMITER_INIT = "init-soft-limiter"
WORKER_SOFT_LIMITER_VOLUME = "soft-limiter"
WORKER_SOFT_LIMITER_DIR = "/soft-limiter"
SHM_FILE = f"{SHM_MOUNT}/shm"
NVIDIA_SMI = "/usr/local/bin/nvidia-smi"


@dataclass(frozen=True)
class WorkerShape:
    """What decides a worker container: the workload's isolation, vendor, limits and switches."""

    image: str
    isolation: str
    vendor: str
    hypervisor_port: int
    disabled_features: tuple[str, ...] = ()
    #: the per-GPU compute-percent limit (None: none, or the limit is in TFLOPS)
    compute_limit: Quantity | None = None
    vram_limit: Quantity | None = None


def init_resources() -> JsonObject:
    """A fresh copy of the init containers' resources (each pod gets its own dicts)."""
    return {"requests": dict(INIT_RESOURCES), "limits": dict(INIT_RESOURCES)}


def data_volume() -> JsonObject:
    """The node's `/run/tensor-fusion` (shared memory with the hypervisor), made when missing."""
    return {"name": DATA_VOLUME, "hostPath": {"path": DATA_HOST_PATH, "type": "DirectoryOrCreate"}}


def needs_data_volume(isolation: str) -> bool:
    """A shared (whole-GPU) worker has no limiter state to share with the hypervisor."""
    return isolation != tfa.ISOLATION_SHARED


def field_env(name: str, path: str) -> JsonObject:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def hard_limit_env(compute_limit: Quantity | None, vram_limit: Quantity | None) -> list[JsonObject]:
    """The hard limiter's env (see the module docstring); the same for a sidecar and a remote worker."""
    env: list[JsonObject] = []
    if compute_limit:
        env.append({"name": "TF_CUDA_SM_PERCENT_LIMIT", "value": str(compute_limit)})
    memory = str(vram_limit.value() // MIB if vram_limit else 0)
    env += [{"name": "TF_GPU_MEMORY_LIMIT", "value": memory}, {"name": "TF_CUDA_MEMORY_LIMIT", "value": memory}]
    return env


def _env(shape: WorkerShape) -> list[JsonValue]:
    env: list[JsonValue] = [
        field_env("HYPERVISOR_IP", "status.hostIP"),
        {"name": "HYPERVISOR_PORT", "value": str(shape.hypervisor_port)},
        field_env("POD_NAME", "metadata.name"),
        {"name": "CONTAINER_NAME", "value": WORKER_CONTAINER},
        {"name": "TF_ENABLE_LOG", "value": "1"},
        field_env("POD_NAMESPACE", "metadata.namespace")]
    limiter_off = "gpu-limiter" in shape.disabled_features
    if shape.isolation == tfa.ISOLATION_SOFT and shape.vendor.lower() in CUDA_LIMITER_VENDORS and not limiter_off:
        env.append({"name": "LD_PRELOAD", "value": WORKER_LIMITER})
    if limiter_off:
        env.append({"name": "DISABLE_GPU_LIMITER", "value": "true"})
    if shape.isolation == tfa.ISOLATION_HARD:
        env += hard_limit_env(shape.compute_limit, shape.vram_limit)
    return env


def _command(shape: WorkerShape, shared_memory: bool) -> list[JsonValue]:
    if "start-worker" in shape.disabled_features:
        return ["sleep", "infinity"]
    if shared_memory:
        segment = f"{TRANSPORT_DIR}/{TRANSPORT_SEGMENT}"
        return ["/bin/bash", "-c", f"touch {segment} && chmod 666 {segment} && exec {WORKER_BINARY} "
                                   f"-n shmem -m {TRANSPORT_SEGMENT} -M {TRANSPORT_SEGMENT_MIB}"]
    return [WORKER_BINARY, "-p", str(WORKER_PORT)]


def worker_container(shape: WorkerShape, *, shared_memory: bool = False,
                     extra_mounts: Sequence[JsonObject] = ()) -> JsonObject:
    """The worker container (see the module docstring); `shared_memory`: a sidecar talking to its
    app through /dev/shm rather than a remote worker listening on its port."""
    mounts: list[JsonValue] = [dict(m) for m in extra_mounts]
    if needs_data_volume(shape.isolation):
        mounts.append({"name": DATA_VOLUME, "mountPath": SHM_MOUNT, "subPathExpr": SHM_SUBPATH_EXPR,
                       "mountPropagation": "HostToContainer"})
    container: JsonObject = {
        "name": WORKER_CONTAINER, "image": shape.image, "command": _command(shape, shared_memory),
        "env": _env(shape),
        "ports": [{"name": WORKER_PORT_NAME, "containerPort": WORKER_PORT, "protocol": "TCP"}],
        "resources": {"requests": dict(WORKER_DEFAULT_REQUESTS)}}
    if mounts:
        container["volumeMounts"] = mounts
    return container


@dataclass(frozen=True)
class SoftLimiterParts:
    """What a soft-isolated worker pod adds for the middleware image's limiter."""

    init: JsonObject
    volume: JsonObject
    mounts: list[JsonObject]
    env: list[JsonObject]


def soft_limiter_parts(source: LimiterSource, library: str) -> SoftLimiterParts:
    """The limiter `library` copied from `source` (tfusion's image, or a middleware image's /build)
    over the worker's own."""
    init: JsonObject = {"name": SOFT_LIMITER_INIT, "image": source.image,
                        # a vendor image's copy is tolerant: without the files the worker's own limiter is used
                        "command": source.copy_command(WORKER_SOFT_LIMITER_DIR),
                        "volumeMounts": [{"name": WORKER_SOFT_LIMITER_VOLUME, "mountPath": WORKER_SOFT_LIMITER_DIR}],
                        "resources": init_resources()}
    mounts: list[JsonObject] = [
        {"name": WORKER_SOFT_LIMITER_VOLUME, "mountPath": WORKER_LIMITER, "subPath": library, "readOnly": True}]
    if source.ships_nvidia_smi:
        mounts.append({"name": WORKER_SOFT_LIMITER_VOLUME, "mountPath": NVIDIA_SMI, "subPath": "nvidia-smi",
                       "readOnly": True})
    env: list[JsonObject] = [{"name": "TF_ISOLATION_MODE", "value": tfa.ISOLATION_SOFT},
                             {"name": "TF_SHM_PATH", "value": SHM_FILE}]
    return SoftLimiterParts(init=init, volume={"name": WORKER_SOFT_LIMITER_VOLUME, "emptyDir": {}}, mounts=mounts,
                            env=env)
