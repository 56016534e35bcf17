"""Hardware partitions (MIG and the like): which template a partitioned pod gets, and where on the GPU.

Why it exists: a pod asking `isolation: partitioned` does not take an arbitrary share of a GPU; it
takes one slice of a fixed shape (a ProviderConfig `virtualizationTemplate`), and a GPU holds only
as many slices, of only those shapes and at only those positions, as its hardware allows. This
module is that arithmetic, pure and without I/O; the controller feeds it the ProviderConfigs
(`catalog_from_providers`) and the allocator asks it per GPU (`place`, `gpu_reason`).

Rules carried over from the original (reference §3.5):
- templates per GPU model come from ProviderConfig `hardwareMetadata` (`partitionTemplateRefs`) and
  `virtualizationTemplates`; a GPU's model matches a row's `model` or `fullModelName` (ignoring
  case, spacing and a leading vendor word, so "A100-SXM4-80GB" finds "NVIDIA A100-SXM4-80GB");
- a pod's `partition-id` matches a template's id or name ignoring case and the separators `.`,
  `_`, space and `/`, with an optional `mig-` prefix (`mig-1g-10gb` is `1g.10gb`);
- without a `partition-id` the template minimising 0.6·(tT-rT)/max(rT,1) + 0.4·(tV-rV)/max(rV,1)
  among those with tT ≥ rT and tV ≥ rV is taken (tT = computePercent x capacity TFLOPS, tV =
  memoryGigabytes GiB; rT, rV the request);
- a partition uses computePercent x capacity TFLOPS and memoryGigabytes GiB of the GPU;
- MIG vendors (NVIDIA, Example, PPU): at most `maxPartitions` (default 7) partitions, at most
  `maxInstances` of one template, and a slot range: a template may start at a `placementLimit`
  slot and occupies `placementOffset` slots (skipped when either is unset). The original takes the
  first free start; tfusion takes the start that keeps the largest free contiguous run of slots
  (then the lowest), which leaves room for bigger slices later;
- Ascend: isolation groups (`maxIsolationGroups`, default 4): a `shared` template joins a group
  holding only that template while it has fewer than `maxPartitionsPerIsolationGroup` (default 2),
  else the first empty group; an `exclusive` one needs an empty group; `extendedResources` of the
  partitions must fit the model's `totalExtendedResources`;
- other vendors cannot be partitioned.

Speed: the placement fast path (`fits`) builds no reason text and remembers its answer on the GPU
until the GPU's usage changes; `PartitionCatalog.floors` gives the least VRAM and TFLOPS any
partition of a request takes, so placement skips nodes whose free maxima are below it; the
allocator remembers, per node version, the nodes where no GPU can take a request's shape.
Slot occupancy is an integer bit mask.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

from tfusion.allocator import reasons
from tfusion.allocator.units import tflops_str, vram_str

if TYPE_CHECKING:
    from tfusion.allocator.request import AllocRequest
    from tfusion.allocator.state import GpuSlot

GIB = 1 << 30
DEFAULT_MAX_PARTITIONS = 7
DEFAULT_ISOLATION_GROUPS = 4
DEFAULT_PER_GROUP = 2
MIG_VENDORS = frozenset({"nvidia", "example", "ppu"})
GROUP_VENDORS = frozenset({"ascend", "huawei"})
_VENDOR_WORDS = ("nvidia geforce ", "nvidia ", "tesla ", "geforce ", "huawei ", "ascend ")
#: the number-free reasons a partitioned request can get from PartitionTemplateFilter
LABELS = (reasons.PARTITIONED, reasons.NO_TEMPLATES, reasons.UNKNOWN_TEMPLATE, reasons.NO_TEMPLATE_FITS,
          reasons.PARTITIONS_FULL, reasons.TEMPLATE_FULL, reasons.NO_SLOT, reasons.NO_GROUP,
          reasons.PARTITION_SHORT, reasons.NOT_PARTITIONED, reasons.HOLDS_PARTITIONS)
_HUNDREDTH = 100 * 1_000_000 * 10  # micro-percent x milli-TFLOPS in 0.01 TFLOPS
_HALF_HUNDREDTH = _HUNDREDTH // 2
_SEPARATORS = re.compile(r"[._ /]+")
_DASHES = re.compile(r"-+")


@dataclass(frozen=True, slots=True)
class Template:
    """One partition shape: identity, size (milli-percent of compute, bytes) and placement rules."""

    id: str
    name: str
    memory: int
    compute: int  # micro-percent of the GPU's compute (14.2857 % == 14_285_700)
    nvml_profile_id: int | None = None
    max_instances: int = 0
    placement_limit: tuple[int, ...] = ()
    placement_offset: int = 0
    shared_group: bool = False
    max_per_group: int = 0
    extended: tuple[tuple[str, int], ...] = ()

    def tflops_on(self, capacity_milli: int) -> int:
        """milli-TFLOPS this template takes from a GPU of `capacity_milli`: computePercent x capacity,
        rounded half up to 2 decimals of a TFLOPS as the original rounds it."""
        return (self.compute * capacity_milli + _HALF_HUNDREDTH) // _HUNDREDTH * 10

    def label(self) -> str:
        return self.name or self.id


@dataclass(frozen=True, slots=True)
class ModelPartitions:
    """The partition templates of one GPU model and the model's partition limits."""

    model: str
    full_model_name: str
    vendor: str
    templates: tuple[Template, ...]
    max_partitions: int = DEFAULT_MAX_PARTITIONS
    slots: int = 0
    isolation_groups: int = DEFAULT_ISOLATION_GROUPS
    extended_totals: tuple[tuple[str, int], ...] = ()

    def find(self, wanted: str) -> Template | None:
        """The template `wanted` names (id or name, matched as the original matches them)."""
        key = _canonical_of(wanted)
        for template in self.templates:
            if key in (_canonical_of(template.id), _canonical_of(template.name)):
                return template
        return None

    def names(self) -> str:
        return ", ".join(t.label() for t in self.templates) or "none"


@dataclass(frozen=True, slots=True)
class Partition:
    """A live partition on one GPU: its template and where it sits (slot range end exclusive)."""

    template_id: str
    slot_start: int | None = None
    slot_end: int | None = None
    group: int | None = None


class Refusal(str):
    """Why a partition cannot be had on a GPU: the text, with `label` its number-free reason
    (reasons.py), which explanations group GPUs by."""

    label: str

    def __new__(cls, label: str, text: str) -> Refusal:
        self = super().__new__(cls, text)
        self.label = label
        return self


REFUSED = Refusal("", "no partition fits")  # the fast path's answer: no reason text built


class PartitionCatalog:
    """Templates per GPU model, looked up by any name the GPU may report for its model."""

    def __init__(self, models: Iterable[ModelPartitions] = ()) -> None:
        self.models: tuple[ModelPartitions, ...] = tuple(models)
        self._floors: dict[tuple[str, int, int, int], tuple[int, int]] = {}
        self._by_name: dict[str, ModelPartitions] = {}
        for entry in self.models:
            for name in (entry.model, entry.full_model_name):
                if name:
                    for key in _model_keys(name):
                        self._by_name.setdefault(key, entry)

    def for_model(self, model: str) -> ModelPartitions | None:
        """The partition templates of GPU model `model`; None when no ProviderConfig lists any."""
        if not model:
            return None
        for key in _model_keys(model):
            found = self._by_name.get(key)
            if found is not None:
                return found
        return None

    def floors(self, req: AllocRequest, min_capacity: int) -> tuple[int, int]:
        """(VRAM bytes, milli-TFLOPS) that any partition `req` can get takes at least, on GPUs of at
        least `min_capacity` milli-TFLOPS: placement skips nodes whose free maxima are below them."""
        key = (req.partition_template, req.vram_request, req.tflops_request, min_capacity)
        found = self._floors.get(key)
        if found is None:
            sizes = []
            for model in self.models:
                if req.partition_template:
                    template = model.find(req.partition_template)
                    sizes.extend([template] if template is not None else [])
                else:
                    sizes.extend(t for t in model.templates if t.memory >= req.vram_request)
            floor_v = min((t.memory for t in sizes), default=0)
            floor_t = min((t.tflops_on(min_capacity) for t in sizes), default=0)
            found = (max(floor_v, req.vram_request), max(floor_t, req.tflops_request))
            if len(self._floors) > 1024:
                self._floors.clear()
            self._floors[key] = found
        return found

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PartitionCatalog) and self.models == other.models

    __hash__ = None  # type: ignore[assignment]


@functools.lru_cache(maxsize=4096)
def _canonical_of(text: str) -> str:
    return canonical_template(text)


def canonical_template(text: str) -> str:
    """A template id or name in the form the original compares: lowercase, `.`/`_`/space/`/` as `-`,
    repeated dashes collapsed, ends trimmed, no `mig-` prefix."""
    out = _DASHES.sub("-", _SEPARATORS.sub("-", text.strip().lower())).strip("-")
    return out[4:] if out.startswith("mig-") else out


def _model_keys(name: str) -> tuple[str, ...]:
    lowered = " ".join(name.strip().lower().split())
    for word in _VENDOR_WORDS:
        if lowered.startswith(word):
            return lowered, lowered[len(word):]
    return (lowered,)


# ---------------------------------------------------------------------- reading ProviderConfigs


class PartitionConfigError(ValueError):
    """A ProviderConfig's partition fields cannot be read; the message names the field and value."""


def _percent_micro(raw: object, where: str) -> int:
    try:
        value = Decimal(str(raw))
    except InvalidOperation:
        raise PartitionConfigError(f"{where}.computePercent: {raw!r} is not a decimal percent (0..100)") from None
    if not value.is_finite() or not 0 <= value <= 100:
        raise PartitionConfigError(f"{where}.computePercent: {raw!r} is not a decimal percent (0..100)")
    return int(value * 1_000_000)


def _uint(raw: object, where: str, default: int = 0) -> int:
    if raw is None:
        return default
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        raise PartitionConfigError(f"{where}: {raw!r} is not a non-negative integer")
    return raw


def _template(raw: Mapping[str, Any], where: str) -> Template:
    tid = raw.get("id")
    if not isinstance(tid, str) or not tid:
        raise PartitionConfigError(f"{where}.id: {tid!r} is not a template id (a non-empty string)")
    limit = raw.get("placementLimit") or []
    if not isinstance(limit, list):
        raise PartitionConfigError(f"{where}.placementLimit: {limit!r} is not a list of slots")
    extended = raw.get("extendedResources") or {}
    return Template(
        id=tid, name=str(raw.get("name") or ""),
        memory=_uint(raw.get("memoryGigabytes"), f"{where}.memoryGigabytes") * GIB,
        compute=_percent_micro(raw.get("computePercent", "0"), where),
        nvml_profile_id=raw.get("nvmlProfileId") if isinstance(raw.get("nvmlProfileId"), int) else None,
        max_instances=_uint(raw.get("maxInstances"), f"{where}.maxInstances"),
        placement_limit=tuple(_uint(s, f"{where}.placementLimit") for s in limit),
        placement_offset=_uint(raw.get("placementOffset"), f"{where}.placementOffset"),
        shared_group=raw.get("isolationGroupSharing") == "shared",
        max_per_group=_uint(raw.get("maxPartitionsPerIsolationGroup"), f"{where}.maxPartitionsPerIsolationGroup"),
        extended=tuple(sorted((str(k), _uint(v, f"{where}.extendedResources.{k}")) for k, v in extended.items())),
    )


def models_of_provider(spec: Mapping[str, Any], where: str = "spec") -> list[ModelPartitions]:
    """The partitionable models of one ProviderConfig spec (raises PartitionConfigError)."""
    vendor = str(spec.get("vendor") or "")
    raw_templates = spec.get("virtualizationTemplates") or []
    templates = {}
    for i, raw in enumerate(raw_templates):
        t = _template(raw, f"{where}.virtualizationTemplates[{i}]")
        templates[t.id] = t
    out = []
    for i, row in enumerate(spec.get("hardwareMetadata") or []):
        refs = row.get("partitionTemplateRefs") or []
        if not refs:
            continue
        at = f"{where}.hardwareMetadata[{i}]"
        missing = [ref for ref in refs if ref not in templates]
        if missing:
            raise PartitionConfigError(f"{at}.partitionTemplateRefs: {missing} name no virtualizationTemplate "
                                       f"(known: {sorted(templates)})")
        chosen = tuple(templates[ref] for ref in refs)
        slots = _uint(row.get("maxPlacementSlots"), f"{at}.maxPlacementSlots")
        if not slots:
            slots = max((s + t.placement_offset for t in chosen for s in t.placement_limit), default=0)
        out.append(ModelPartitions(
            model=str(row.get("model") or ""), full_model_name=str(row.get("fullModelName") or ""),
            vendor=vendor, templates=chosen,
            max_partitions=_uint(row.get("maxPartitions"), f"{at}.maxPartitions") or DEFAULT_MAX_PARTITIONS,
            slots=slots,
            isolation_groups=_uint(row.get("maxIsolationGroups"), f"{at}.maxIsolationGroups")
            or DEFAULT_ISOLATION_GROUPS,
            extended_totals=tuple(sorted((str(k), _uint(v, f"{at}.totalExtendedResources.{k}"))
                                         for k, v in (row.get("totalExtendedResources") or {}).items())),
        ))
    return out


def catalog_from_providers(specs: Iterable[tuple[str, Mapping[str, Any]]]) -> tuple[PartitionCatalog, list[str]]:
    """The catalog of every (ProviderConfig name, spec) given, and one problem line per config that
    could not be read (that config is left out)."""
    models: list[ModelPartitions] = []
    problems: list[str] = []
    for name, spec in sorted(specs, key=lambda pair: pair[0]):
        try:
            models.extend(models_of_provider(spec, f"ProviderConfig {name}: spec"))
        except (PartitionConfigError, AttributeError, TypeError) as exc:
            problems.append(str(exc))
    return PartitionCatalog(models), problems


# ---------------------------------------------------------------------- placing on one GPU


def score(template: Template, capacity_milli: int, want_t: int, want_v: int) -> float:
    """The original's template score for a request (lower is better)."""
    t_t = template.tflops_on(capacity_milli) / 1000
    r_t = want_t / 1000
    t_v, r_v = template.memory / GIB, want_v / GIB
    return 0.6 * (t_t - r_t) / max(r_t, 1) + 0.4 * (t_v - r_v) / max(r_v, 1)


def free_runs(used: int, total: int) -> list[tuple[int, int]]:
    """(start, end exclusive) of each run of free slots; `used` has bit i set when slot i is taken."""
    runs, start = [], None
    for i in range(total):
        taken = used >> i & 1
        if not taken and start is None:
            start = i
        elif taken and start is not None:
            runs.append((start, i))
            start = None
    if start is not None:
        runs.append((start, total))
    return runs


@functools.lru_cache(maxsize=65536)
def _largest_run(used: int, total: int) -> int:
    return max((b - a for a, b in free_runs(used, total)), default=0)


def slots_text(used: int, total: int) -> str:
    """Free slots as "0-1, 6" (inclusive ranges); "none" when all are taken."""
    parts = [f"{a}" if b - a == 1 else f"{a}-{b - 1}" for a, b in free_runs(used, total)]
    return ", ".join(parts) or "none"


def occupied(model: ModelPartitions, parts: Iterable[Partition]) -> int:
    """The slots the partitions take, as a bit mask (bit i = slot i)."""
    used = 0
    for part in parts:
        if part.slot_start is not None and part.slot_end is not None:
            end = min(part.slot_end, model.slots)
            if end > part.slot_start:
                used |= ((1 << (end - part.slot_start)) - 1) << part.slot_start
    return used


def best_start(template: Template, used: int, total: int) -> int | None:
    """The start that keeps the largest free contiguous run (then the lowest start); None if none is free."""
    width = template.placement_offset
    block = (1 << width) - 1
    best: tuple[int, int] | None = None
    for start in template.placement_limit:
        if start + width > total or used & (block << start):
            continue
        largest = _largest_run(used | (block << start), total)
        if best is None or largest > best[0]:
            best = (largest, start)
    return None if best is None else best[1]


def _group_for(model: ModelPartitions, template: Template, parts: Mapping[str, Partition]) -> int | str:
    members: dict[int, list[str]] = {}
    for part in parts.values():
        if part.group is not None:
            members.setdefault(part.group, []).append(part.template_id)
    if template.shared_group:
        cap = template.max_per_group or DEFAULT_PER_GROUP
        for group in sorted(members):
            held = members[group]
            if all(t == template.id for t in held) and len(held) < cap:
                return group
    for group in range(model.isolation_groups):
        if group not in members:
            return group
    return f"no free isolation group for {template.label()} (all {model.isolation_groups} in use)"


def _extended_problem(model: ModelPartitions, template: Template, parts: Mapping[str, Partition]) -> str:
    if not template.extended:
        return ""
    by_id = {t.id: t for t in model.templates}
    totals = dict(model.extended_totals)
    used: dict[str, int] = {}
    for part in parts.values():
        for name, amount in by_id[part.template_id].extended if part.template_id in by_id else ():
            used[name] = used.get(name, 0) + amount
    for name, amount in template.extended:
        if name in totals and used.get(name, 0) + amount > totals[name]:
            return f"{name} {used.get(name, 0)} + {amount} > {totals[name]}"
    return ""


def place(model: ModelPartitions, template: Template, parts: Mapping[str, Partition],
          gpu: str = "GPU", *, explain: bool = True) -> Partition | Refusal:
    """Where a new partition of `template` goes on a GPU holding `parts`, or why it cannot (without
    `explain`, the bare `REFUSED`: the fast path builds no text)."""
    vendor = model.vendor.lower()
    if vendor not in MIG_VENDORS and vendor not in GROUP_VENDORS:
        return Refusal(reasons.PARTITIONED, f"{gpu}: vendor {model.vendor or 'unknown'} has no partition "
                       "strategy (MIG vendors: NVIDIA, Example, PPU; isolation groups: Ascend)")
    if len(parts) >= model.max_partitions:
        if not explain:
            return REFUSED
        return Refusal(reasons.PARTITIONS_FULL,
                       f"{gpu}: {len(parts)} partition(s), maxPartitions {model.max_partitions} reached")
    if template.max_instances and sum(p.template_id == template.id for p in parts.values()) >= template.max_instances:
        return Refusal(reasons.TEMPLATE_FULL,
                       f"{gpu}: {template.label()} already has its maxInstances {template.max_instances} partitions")
    if vendor in GROUP_VENDORS:
        problem = _extended_problem(model, template, parts)
        if problem:
            return Refusal(reasons.NO_GROUP, f"{gpu}: extended resources for {template.label()} exhausted ({problem})")
        group = _group_for(model, template, parts)
        return Refusal(reasons.NO_GROUP, f"{gpu}: {group}") if isinstance(group, str) \
            else Partition(template.id, group=group)
    if not template.placement_limit or not template.placement_offset or not model.slots:
        return Partition(template.id)
    used = occupied(model, parts.values())
    start = best_start(template, used, model.slots)
    if start is None:
        if not explain:
            return REFUSED
        return Refusal(reasons.NO_SLOT, f"{gpu}: no free slot for {template.label()}; free slots "
                                        f"{slots_text(used, model.slots)}")
    return Partition(template.id, start, start + template.placement_offset)


def candidates(model: ModelPartitions, req: AllocRequest, capacity_milli: int) -> list[Template] | Refusal:
    """The templates `req` may get on a GPU of this model, best first, or why none (unknown id)."""
    if req.partition_template:
        found = model.find(req.partition_template)
        if found is None:
            return Refusal(reasons.UNKNOWN_TEMPLATE, f"unknown partition-id {req.partition_template!r}; "
                           f"model {model.model} has {model.names()}")
        return [found]
    want_t, want_v = req.tflops_need(capacity_milli), req.vram_request
    fitting = [t for t in model.templates if t.tflops_on(capacity_milli) >= want_t and t.memory >= want_v]
    if not fitting:
        return Refusal(reasons.NO_TEMPLATE_FITS, f"no template of model {model.model} has enough compute "
                       f"and memory (templates: {model.names()})")
    return sorted(fitting, key=lambda t: (score(t, capacity_milli, want_t, want_v), t.id))


def choose(slot: GpuSlot, req: AllocRequest, *, explain: bool = True) -> tuple[Template, Partition] | Refusal:
    """The template and position `req` gets on `slot` now, or why it cannot have one there (without
    `explain`, the bare `REFUSED`)."""
    model = slot.templates
    info = slot.info
    label = f"{slot.name} ({info.model or 'unknown model'})" if explain else ""
    if model is None:
        return Refusal(reasons.NO_TEMPLATES, f"{label}: no partition templates for this model in any ProviderConfig")
    if len(slot.parts) != len(slot.allocs):
        return Refusal(reasons.NOT_PARTITIONED,
                       f"{label}: holds {len(slot.allocs) - len(slot.parts)} non-partitioned allocation(s)")
    options = candidates(model, req, info.capacity_tflops)
    if isinstance(options, Refusal):
        return Refusal(options.label, f"{label}: {options}")
    why: Refusal | None = None
    for template in options:
        spot = place(model, template, slot.parts, label, explain=explain)
        if isinstance(spot, Refusal):
            why = why or spot
            continue
        need_t, need_v = template.tflops_on(info.capacity_tflops), template.memory
        if slot.avail_t >= need_t and slot.avail_v >= need_v:
            return template, spot
        if not explain:
            continue
        why = why or Refusal(reasons.PARTITION_SHORT, f"{label}: {template.label()} needs "
                             f"{tflops_str(need_t)} TFLOPS and {vram_str(need_v)}; available "
                             f"{tflops_str(slot.avail_t)} TFLOPS, {vram_str(slot.avail_v)}")
    return why or REFUSED


def fits(slot: GpuSlot, req: AllocRequest) -> bool:
    """Whether `req` can get a partition on `slot` now (the fast path: no text built), remembered
    on the slot until its usage changes (GpuSlot.refresh forgets it)."""
    memo = slot.part_memo
    if memo is None:
        memo = slot.part_memo = {}
    key = (req.partition_template, req.vram_request, req.tflops_request, req.percent_request)
    found = memo.get(key)
    if found is None:
        found = memo[key] = not isinstance(choose(slot, req, explain=False), Refusal)
    return found


def gpu_reason(slot: GpuSlot, req: AllocRequest) -> str | None:
    """PartitionTemplateFilter: None when `req` can get a partition on `slot`, else why not."""
    found = choose(slot, req)
    return str(found) if isinstance(found, Refusal) else None


def gpu_label(slot: GpuSlot, req: AllocRequest) -> str | None:
    """`gpu_reason`'s number-free label (reasons.py), None when a partition fits."""
    found = choose(slot, req)
    return found.label if isinstance(found, Refusal) else None


def template_by_id(model: ModelPartitions | None, template_id: str) -> Template | None:
    if model is None:
        return None
    return next((t for t in model.templates if t.id == template_id), None) or model.find(template_id)


# ---------------------------------------------------------------------- what an allocation takes


def usage(template: Template, capacity_milli: int) -> tuple[int, int]:
    """(milli-TFLOPS, bytes) a partition of `template` takes from a GPU of `capacity_milli`."""
    return template.tflops_on(capacity_milli), template.memory


Charge = tuple[int, int]  # (milli-TFLOPS, bytes)


def plan(slots: Sequence[GpuSlot], req: AllocRequest) -> tuple[tuple[Partition, ...], tuple[Charge, ...]] | Refusal:
    """The partition `req` gets on each of `slots` and what each takes, or the first refusal."""
    parts, charges = [], []
    for slot in slots:
        found = choose(slot, req)
        if isinstance(found, Refusal):
            return found
        template, part = found
        parts.append(part)
        charges.append(usage(template, slot.info.capacity_tflops))
    return tuple(parts), tuple(charges)


def recovered(slot: GpuSlot | None, req: AllocRequest, reported: Partition | None) -> tuple[Partition, Charge] | None:
    """A running partitioned pod's partition on `slot` and its charge, rebuilt at leader start: the
    GPU status's record when it names a template of the model (its slot is where the partition is),
    else the pod's partition-id placed anew; None when the template is unknown (the pod is charged
    its request)."""
    if slot is None or slot.templates is None:
        return None
    model = slot.templates
    wanted = reported.template_id if reported is not None else req.partition_template
    template = template_by_id(model, wanted) if wanted else None
    if template is None and req.partition_template:
        template = model.find(req.partition_template)
    if template is None:
        return None
    if reported is not None and reported.template_id == template.id:
        part = reported
    else:
        spot = place(model, template, slot.parts, slot.name)
        part = spot if isinstance(spot, Partition) else Partition(template.id)
    return part, usage(template, slot.info.capacity_tflops)
