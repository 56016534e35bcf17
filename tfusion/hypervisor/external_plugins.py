"""GPUs another device plugin holds (`DETECT_IN_USED_GPUS=true`): marked in the GPU's `status.usedBy`.

Why: during a progressive migration from the NVIDIA device plugin a node runs both it and
tfusion. A GPU the kubelet handed to a native pod (`nvidia.com/gpu: 1`) must not also be shared
out by tfusion; the allocator already skips a GPU whose `usedBy` is not `tensor-fusion`, so the
hypervisor only has to say which GPUs are held, and give them back when they are released.

Where the kubelet says what it handed out: its PodResources API (`List`, on
`<kubelet>/pod-resources/kubelet.sock`), the truth when that socket exists, else the device
manager's checkpoint (`<kubelet>/device-plugins/kubelet_internal_checkpoint`). tfusion's own
`tensor-fusion.ai/index*` resources are not another plugin's. Device IDs are compared
lowercased (GPU objects are named after the lowercase UUID) and without a `::N` time-slice
suffix. Which resources belong to which system: `nvidia.com/gpu` and `nvidia.com/mig*` to
`nvidia-device-plugin` (an ID longer than a UUID, as HAMi writes `GPU-<uuid>-N`, is cut to the
UUID and marked `3rd-party-device-plugin`), then every ProviderConfig's
`devicePluginDetection` (its `resourceNamePrefixes` and `usedBySystemName`).

The pass is level-based: every `interval` seconds (30), when the checkpoint changes (looked at every
2 s) and when a GPU of the node appears, each GPU of this node gets the `usedBy` it
should have — the holder's name while held, `tensor-fusion` once a detector's mark is no longer
backed by an allocation. A `usedBy` no detector writes (set by hand, say) is left alone. A source
that cannot be read skips the pass (the marks stay as they are) and says why in the log.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import orjson

from tfusion.api import annotations as keys
from tfusion.api.accessors import Body, Gpu, items, section
from tfusion.hypervisor.deviceplugin.podresources import PodResourcesError, list_assigned_devices
from tfusion.hypervisor.gpu_report import USED_BY_TENSOR_FUSION
from tfusion.kube.client import KubeClient, KubeError, NotFound
from tfusion.kube.informer import Informer
from tfusion.kube.manager import Manager
from tfusion.kube.resources import GPUS, PROVIDERCONFIGS
from tfusion.settings import KUBELET_DEVICE_PLUGIN_DIR

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "kubelet_internal_checkpoint"
NVIDIA_DEVICE_PLUGIN = "nvidia-device-plugin"
THIRD_PARTY_DEVICE_PLUGIN = "3rd-party-device-plugin"
UUID_ID_LENGTH = len("gpu-") + 36  # "gpu-" and a UUID: the longest ID that is one whole GPU
PASS_INTERVAL_S = 30.0
WATCH_S = 2.0  # how often the checkpoint's mtime is looked at between passes (a stat, no read)


class SourceError(Exception):
    """The kubelet's record of allocated devices could not be read; the message says which and why."""


@dataclass(frozen=True)
class Detector:
    """Resources whose names start with one of `prefixes` belong to the system `used_by`."""

    prefixes: tuple[str, ...]
    used_by: str

    def claims(self, resource: str) -> bool:
        return resource.startswith(self.prefixes)


NVIDIA = Detector(("nvidia.com/gpu", "nvidia.com/mig"), NVIDIA_DEVICE_PLUGIN)


def provider_detectors(configs: Iterable[Body]) -> list[Detector]:
    """One detector per ProviderConfig with `spec.devicePluginDetection.resourceNamePrefixes`."""
    found: list[Detector] = []
    for config in sorted(configs, key=lambda c: c.name):
        detection = section(config.spec, "devicePluginDetection")
        prefixes = tuple(p for p in items(detection, "resourceNamePrefixes") if isinstance(p, str) and p)
        if prefixes:
            found.append(Detector(prefixes, str(detection.get("usedBySystemName") or THIRD_PARTY_DEVICE_PLUGIN)))
    return found


def checkpoint_allocations(text: str) -> list[tuple[str, list[str]]]:
    """(resource name, device IDs) per entry of the kubelet device manager's checkpoint JSON; its
    `DeviceIDs` is a map NUMA node -> IDs (kubelet 1.20+) or, in older files, a plain list."""
    try:
        data = orjson.loads(text)
    except ValueError as exc:
        raise SourceError(f"not JSON: {exc}") from None
    entries = section(data, "Data").get("PodDeviceEntries") or []
    if not isinstance(entries, list):
        raise SourceError(f"Data.PodDeviceEntries is a {type(entries).__name__}, not a list")
    found: list[tuple[str, list[str]]] = []
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        ids = entry.get("DeviceIDs") or []
        groups = ids.values() if isinstance(ids, dict) else [ids]
        found.append((str(entry.get("ResourceName") or ""),
                      [str(i) for group in groups if isinstance(group, list) for i in group]))
    return found


def held_gpus(allocations: Iterable[tuple[str, Sequence[str]]], detectors: Sequence[Detector]) -> dict[str, str]:
    """GPU object name -> the system holding it, from the kubelet's allocations."""
    held: dict[str, str] = {}
    for resource, ids in allocations:
        if resource.startswith(keys.INDEX_RESOURCE_PREFIX):  # read now: the domain may have moved
            continue
        detector = next((d for d in detectors if d.claims(resource)), None)
        if detector is None:
            continue
        for raw in ids:
            name, used_by = raw.lower().split("::", 1)[0], detector.used_by
            if detector is NVIDIA and len(name) > UUID_ID_LENGTH:
                name, used_by = name[:UUID_ID_LENGTH], THIRD_PARTY_DEVICE_PLUGIN
            held[name] = used_by
    return held


class ExternalPluginDetector:
    """See the module docstring. `kubelet_dir` is the kubelet's root (/var/lib/kubelet)."""

    def __init__(self, client: KubeClient, gpus: Informer, providers: Informer, *, node: str, kubelet_dir: Path,
                 interval: float = PASS_INTERVAL_S) -> None:
        self.client, self.gpus, self.providers, self.node = client, gpus, providers, node
        self._gpus_by_node = gpus.add_label_index(keys.MANAGED_BY)  # the shared cache may hold other nodes'
        self.pod_resources_socket = kubelet_dir / "pod-resources" / "kubelet.sock"
        self.checkpoint = kubelet_dir / "device-plugins" / CHECKPOINT_FILE
        self.interval = interval
        self._last_problem = ""
        self._wake = anyio.Event()

    async def run(self) -> None:
        await self.gpus.wait_synced()
        await self.providers.wait_synced()
        self.gpus.add_handler(on_add=self._wake_up)  # a GPU just reported is marked at once
        while True:
            await self.sync_once()
            await self._next_change()

    def _wake_up(self, *_: Any) -> None:
        self._wake.set()

    async def _next_change(self) -> None:
        """Until a new GPU, a rewritten checkpoint (checked every WATCH_S) or `interval` has passed."""
        seen = self._checkpoint_stamp()
        with anyio.move_on_after(self.interval):
            while not self._wake.is_set() and self._checkpoint_stamp() == seen:
                with anyio.move_on_after(WATCH_S):
                    await self._wake.wait()
        self._wake = anyio.Event()

    def _checkpoint_stamp(self) -> tuple[int, int] | None:
        try:
            stat = self.checkpoint.stat()
        except OSError:
            return None
        return stat.st_mtime_ns, stat.st_size

    async def sync_once(self) -> None:
        try:
            allocations = await self._allocations()
        except SourceError as exc:
            self._problem(f"GPUs held by other device plugins: not checked this time: {exc}")
            return
        self._problem("")
        detectors = [NVIDIA, *provider_detectors(map(Body, self.providers.list()))]
        held = held_gpus(allocations, detectors)
        ours = {THIRD_PARTY_DEVICE_PLUGIN, *(d.used_by for d in detectors)}
        for gpu in map(Gpu, self.gpus.by_index(self._gpus_by_node, self.node)):
            await self._mark(gpu, held, ours)

    async def _allocations(self) -> list[tuple[str, list[str]]]:
        if self.pod_resources_socket.exists():
            try:
                assigned = await list_assigned_devices(self.pod_resources_socket)
            except PodResourcesError as exc:
                raise SourceError(str(exc)) from None
            return [(a.resource, list(a.device_ids)) for a in assigned]
        try:
            text = await anyio.Path(self.checkpoint).read_text(encoding="utf-8")
        except FileNotFoundError:
            return []  # no kubelet allocation recorded yet (or no kubelet): nothing is held
        except OSError as exc:
            raise SourceError(f"{self.checkpoint}: {exc.strerror or exc}") from None
        try:
            return checkpoint_allocations(text)
        except SourceError as exc:
            raise SourceError(f"{self.checkpoint}: {exc}") from None

    async def _mark(self, gpu: Gpu, held: Mapping[str, str], detector_names: set[str]) -> None:
        name = gpu.name
        current = gpu.used_by
        wanted = held.get(name) or (USED_BY_TENSOR_FUSION if current in detector_names else current)
        if wanted == current:
            return
        try:
            await self.client.patch(GPUS, name, {"status": {"usedBy": wanted}}, subresource="status")
        except NotFound:
            return
        except KubeError as exc:
            log.warning("GPU %s: could not set usedBy %s (next pass retries): %s", name, wanted, exc)
            return
        log.info("GPU %s: usedBy %s -> %s (%s)", name, current or "(none)", wanted,
                 "held by another device plugin" if name in held else "released by the other device plugin")

    def _problem(self, message: str) -> None:
        if message and message != self._last_problem:
            log.warning("%s", message)
        self._last_problem = message


def attach_detector(manager: Manager, *, node: str, device_plugin_dir: Path | None) -> ExternalPluginDetector:
    """Register the detector on the hypervisor's Manager; the kubelet's root is the parent of its
    device-plugin directory (/var/lib/kubelet unless --device-plugin-dir says otherwise)."""
    kubelet_dir = (device_plugin_dir or KUBELET_DEVICE_PLUGIN_DIR).parent
    gpus = manager.cache.informer(GPUS, label_selector=f"{keys.MANAGED_BY}={node}")  # the reporter's
    detector = ExternalPluginDetector(manager.client, gpus, manager.cache.informer(PROVIDERCONFIGS), node=node,
                                      kubelet_dir=kubelet_dir)
    manager.add(detector.run, leader_only=False, name="hypervisor external device-plugin detector")
    log.info("marking GPUs of node %s that other device plugins hold (from %s, else %s)", node,
             detector.pod_resources_socket, detector.checkpoint)
    return detector
