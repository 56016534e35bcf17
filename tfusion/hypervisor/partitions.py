"""Partitioned workers' hardware partitions: made when the kubelet allocates the pod's device, removed
when the pod goes.

Why here and not in the scheduler: the controller only decides (it writes the template and the slot
range into the GPU's `status.allocatedPartitions[<pod UID>]` and the pod's `partition-id`); the
partition itself can only be created on the node, by the driver. So the device plugin's `Allocate`
for a pod annotated `isolation: partitioned` asks `Partitioner.ensure`, which, per GPU of the pod's
`gpu-ids`:

- resolves `partition-id` to a profile as the original does (reference §3.5): against the
  ProviderConfigs' `virtualizationTemplates`, restricted to the GPU model's `partitionTemplateRefs`,
  by id or name, case-insensitive and in canonical form with an optional `mig-` prefix; a match
  gives the template's `name` (e.g. `1g.10gb`) and `nvmlProfileId`; no match passes the ID through;
- creates the partition at the slot the allocator chose (`allocatedSlotStart`), or where the driver
  places it when the status gives none;
- is idempotent: a pod that already has its partitions gets the same ones; after a hypervisor
  restart, a partition already at the pod's slot is taken over instead of made twice.

A failure rolls back what this call created and comes back as a message, so `Allocate` refuses the
container with the reason (never a hypervisor crash). `gone(uid)` (the pod was deleted, left the
node or finished) queues the removal, which `run` carries out. A pod already running when the
hypervisor starts never reaches `Allocate` again, so `adopt(worker)` (queued the same way) records the
partition found at its slot as its own, which is what lets its removal happen later (the original's
RecoverPartitionedWorker).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import suppress
from typing import Any

import anyio

from tfusion.api.accessors import section
from tfusion.hypervisor.devices.backend import DeviceBackend, DeviceBackendError
from tfusion.hypervisor.devices.model import DeviceInfo
from tfusion.hypervisor.devices.partitions import MIG_SLOTS, Partition, PartitionError, PartitionProfile, canonical
from tfusion.hypervisor.devices.registry import DeviceRegistry
from tfusion.hypervisor.workers.model import WorkerInfo

log = logging.getLogger(__name__)

#: (pod UID, GPU UUID) -> the start slot the allocator recorded for the pod on that GPU, None when none
SlotLookup = Callable[[str, str], Awaitable[int | None]]
#: the ProviderConfig specs to resolve templates from (each `{hardwareMetadata, virtualizationTemplates}`)
TemplateSource = Callable[[], Awaitable[Sequence[Mapping[str, Any]]]]


async def no_slot(pod_uid: str, gpu_uuid: str) -> int | None:
    return None


async def no_templates() -> Sequence[Mapping[str, Any]]:
    return ()


def _same_model(row: Mapping[str, Any], model: str) -> bool:
    """The original's model match (§3.3): `model` or `fullModelName`, case-insensitive, against the
    device's model with or without its vendor prefix."""
    names = {model.lower(), model.lower().removeprefix("nvidia ").strip()}
    return any(str(row.get(key, "")).lower() in names for key in ("model", "fullModelName"))


def _template_matches(template: Mapping[str, Any], wanted: str) -> bool:
    for key in ("id", "name"):
        value = str(template.get(key, ""))
        if value and (value.lower() == wanted.lower() or canonical(value) == canonical(wanted)):
            return True
    return False


def resolve_profile(partition_id: str, model: str, configs: Iterable[Mapping[str, Any]]) -> PartitionProfile:
    """The profile a pod's `partition-id` names on a GPU of `model` (see the module docstring)."""
    for spec in configs:
        templates = [t for t in spec.get("virtualizationTemplates") or () if isinstance(t, Mapping)]
        rows = [r for r in spec.get("hardwareMetadata") or () if isinstance(r, Mapping) and _same_model(r, model)]
        refs = {str(ref) for row in rows for ref in row.get("partitionTemplateRefs") or ()}
        for template in templates:
            if refs and str(template.get("id", "")) not in refs:
                continue
            if _template_matches(template, partition_id):
                profile_id = template.get("nvmlProfileId")
                return PartitionProfile(name=str(template.get("name") or template.get("id")),
                                        nvml_profile_id=int(profile_id) if isinstance(profile_id, int) else None)
    if partition_id.isdigit():
        return PartitionProfile(name=partition_id, nvml_profile_id=int(partition_id))
    return PartitionProfile(name=partition_id)


def slot_from_gpu(gpu: Mapping[str, Any], pod_uid: str) -> int | None:
    """`status.allocatedPartitions[<pod UID>].allocatedSlotStart` of a GPU object."""
    entry = section(section(gpu, "status"), "allocatedPartitions").get(pod_uid)
    start = entry.get("allocatedSlotStart") if isinstance(entry, Mapping) else None
    return start if isinstance(start, int) and not isinstance(start, bool) else None


class Partitioner:
    """The node's partitions per pod (see the module docstring)."""

    def __init__(self, backend: DeviceBackend, registry: DeviceRegistry, *, slot_of: SlotLookup = no_slot,
                 templates: TemplateSource = no_templates) -> None:
        self.backend = backend
        self.registry = registry
        self.slot_of = slot_of
        self.templates = templates
        self._owned: dict[str, tuple[Partition, ...]] = {}  # pod UID -> its partitions
        self._lock = anyio.Lock()
        self._gone: set[str] = set()
        self._adopt: dict[str, WorkerInfo] = {}
        self._looked: set[str] = set()  # pods adopt() already looked for (pod events repeat)
        self._wake = anyio.Event()

    # --- reads -------------------------------------------------------------------------------------

    def partitions(self) -> list[Partition]:
        return [p for parts in self._owned.values() for p in parts]

    def device(self, part: Partition) -> DeviceInfo:
        parent = self.registry.get(part.parent_uuid)
        if parent is None:  # the GPU vanished from discovery; keep what the partition itself says
            parent = DeviceInfo(native_uuid=part.parent_uuid, vendor="NVIDIA", model="", index=-1)
        return part.device(parent, min(1.0, (part.slot_end - part.slot_start) / MIG_SLOTS))

    def devices(self) -> list[DeviceInfo]:
        """Every partition device in use, for `/api/v1/devices` (with `ParentUUID`)."""
        return [self.device(p) for p in sorted(self.partitions(), key=lambda p: (p.parent_uuid, p.slot_start))]

    # --- create ------------------------------------------------------------------------------------

    async def ensure(self, worker: WorkerInfo) -> tuple[DeviceInfo, ...] | str:
        """The worker's partition devices, created when it has none yet; a message when that fails."""
        async with self._lock:
            if worker.uid not in self._owned:
                try:
                    self._owned[worker.uid] = await self._create(worker)
                except DeviceBackendError as exc:
                    return f"pod {worker.namespace}/{worker.name}: {exc}"
            self._gone.discard(worker.uid)
            return tuple(self.device(p) for p in self._owned[worker.uid])

    async def _create(self, worker: WorkerInfo) -> tuple[Partition, ...]:
        if not worker.partition_template_id:
            raise PartitionError("isolation is partitioned but the pod has no tensor-fusion.ai/partition-id "
                                 "annotation naming its template")
        configs = await self.templates()
        made: list[Partition] = []
        created: list[Partition] = []
        try:
            for gpu in dict.fromkeys(u.lower() for u in worker.allocated_devices):
                parent = self.registry.get(gpu)
                if parent is None:
                    raise PartitionError(f"GPU {gpu} is not on this node")
                profile = resolve_profile(worker.partition_template_id, parent.model, configs)
                slot = await self.slot_of(worker.uid, gpu)
                existing = await self._taken_over(gpu, slot)
                if existing is None:
                    existing = await self.backend.create_partition(gpu, profile, slot)
                    created.append(existing)
                    log.info("pod %s/%s: created %s partition %s on GPU %s at slots %d-%d", worker.namespace,
                             worker.name, existing.profile_name, existing.uuid, gpu, existing.slot_start,
                             existing.slot_end)
                made.append(existing)
        except DeviceBackendError:
            for part in created:
                with suppress(DeviceBackendError):
                    await self.backend.remove_partition(part.parent_uuid, part.uuid)
            raise
        return tuple(made)

    async def _taken_over(self, gpu: str, slot: int | None) -> Partition | None:
        """A partition already at `slot` that no pod here holds: made for this pod before a restart."""
        if slot is None:
            return None
        held = {p.uuid for p in self.partitions()}
        return next((p for p in await self.backend.list_partitions(gpu)
                     if p.slot_start == slot and p.uuid not in held), None)

    # --- remove ------------------------------------------------------------------------------------

    def gone(self, pod_uid: str) -> None:
        """The pod is deleted, off this node or finished: its partitions are removed by `run`."""
        self._looked.discard(pod_uid)
        if self._adopt.pop(pod_uid, None) is not None or pod_uid in self._owned:
            self._gone.add(pod_uid)
            self._wake.set()

    def adopt(self, worker: WorkerInfo) -> None:
        """A running partitioned pod this hypervisor has not allocated: `run` takes over its partitions."""
        if worker.uid not in self._owned and worker.uid not in self._adopt and worker.uid not in self._looked:
            self._looked.add(worker.uid)
            self._adopt[worker.uid] = worker
            self._wake.set()

    async def _take_over(self, worker: WorkerInfo) -> None:
        async with self._lock:
            if worker.uid in self._owned:
                return
            found: list[Partition] = []
            for gpu in dict.fromkeys(u.lower() for u in worker.allocated_devices):
                try:
                    part = await self._taken_over(gpu, await self.slot_of(worker.uid, gpu))
                except DeviceBackendError as exc:
                    log.warning("pod %s/%s: cannot look for its partition on GPU %s: %s", worker.namespace,
                                worker.name, gpu, exc)
                    continue
                if part is not None:
                    found.append(part)
            if found:
                self._owned[worker.uid] = tuple(found)
                log.info("pod %s/%s: took over partition(s) %s", worker.namespace, worker.name,
                         ", ".join(p.uuid for p in found))

    async def release(self, pod_uid: str) -> None:
        async with self._lock:
            self._gone.discard(pod_uid)
            for part in self._owned.pop(pod_uid, ()):
                try:
                    await self.backend.remove_partition(part.parent_uuid, part.uuid)
                    log.info("pod %s gone: removed partition %s from GPU %s", pod_uid, part.uuid, part.parent_uuid)
                except DeviceBackendError as exc:
                    log.error("pod %s gone: removing partition %s from GPU %s failed: %s", pod_uid, part.uuid,
                              part.parent_uuid, exc)

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            adopt, self._adopt = self._adopt, {}
            for worker in adopt.values():
                await self._take_over(worker)
            for uid in sorted(self._gone):
                await self.release(uid)
