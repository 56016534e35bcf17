"""The GPU plugins' arguments from a KubeSchedulerConfiguration file (`--scheduler-config`).

Why: the original schedules with kube-scheduler and its own plugins, whose arguments sit in the
profile's `pluginConfig`; installations carry that file (/etc/tensor-fusion/scheduler-config.yaml),
so tfusion reads the same arguments from it rather than asking for them again:

- `GPUResourcesFit`: `maxWorkerPerNode` (pods with GPUs one node may hold; `--max-workers-per-node`
  wins when given), `vramWeight` and `tflopsWeight` (how a GPU's free or used share is scored);
- `GPUNetworkTopologyAware`: `mode` soft|hard (default soft), `topologySource` auto|numa|vendor
  (default auto), `maxAllowedTier` 0..3 (default 1), `unknownTopologyPolicy` treat-as-worst|reject
  (default treat-as-worst), `preferLeastDamage` (default true): how multi-GPU pods get their GPUs
  (tfusion/allocator/topology.py). A wrong value stops the start with the field, the value and
  what is allowed.

The profile read is the one whose `schedulerName` is tensor-fusion-scheduler, else the only one
with GPU plugin arguments. The rest of the file (kube-scheduler's own plugins, extenders, client
settings) belongs to kube-scheduler and is not read. Unset, the flag means the original's path
when that file exists, else the defaults; a file named on purpose must exist.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tfusion.allocator.scoring import Weights
from tfusion.allocator.topology import MODES, UNKNOWN_POLICIES, TopologyArgs
from tfusion.api import annotations as tfa
from tfusion.api.accessors import items
from tfusion.api.annotations import SCHEDULER_NAME

log = logging.getLogger(__name__)

DEFAULT_PATH = Path("/etc/tensor-fusion/scheduler-config.yaml")
RESOURCES_FIT = "GPUResourcesFit"
TOPOLOGY_AWARE = "GPUNetworkTopologyAware"
RESOURCES_FIT_ARGS = ("maxWorkerPerNode", "vramWeight", "tflopsWeight")
TOPOLOGY_ARGS = ("mode", "topologySource", "maxAllowedTier", "unknownTopologyPolicy", "preferLeastDamage")
MAX_BYTES = 1 << 20


class SchedulerConfigError(ValueError):
    """The file cannot be used; the message names the file, the field, its value and what is allowed."""


@dataclass(frozen=True)
class SchedulerArgs:
    """What the built-in scheduler and the allocator take from the file (defaults without one)."""

    max_workers_per_node: int | None = None
    weights: Weights = field(default_factory=Weights)
    source: str = ""  # the file read, "" for none
    topology: TopologyArgs = field(default_factory=TopologyArgs)


def load_scheduler_args(setting: str) -> SchedulerArgs:
    """The arguments for `--scheduler-config` as given ("" = unset: the default path if it exists)."""
    path = Path(setting).expanduser() if setting else DEFAULT_PATH
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_BYTES + 1)
    except FileNotFoundError:
        if setting:
            raise SchedulerConfigError(f"--scheduler-config {path}: no such file") from None
        return SchedulerArgs()
    except OSError as exc:
        raise SchedulerConfigError(f"--scheduler-config {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_BYTES:
        raise SchedulerConfigError(f"--scheduler-config {path}: larger than {MAX_BYTES} bytes")
    return parse_scheduler_args(raw.decode("utf-8", errors="replace"), source=str(path))


def parse_scheduler_args(text: str, *, source: str) -> SchedulerArgs:
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SchedulerConfigError(f"{source}: not YAML: {exc}") from None
    if not isinstance(document, Mapping) or document.get("kind") != "KubeSchedulerConfiguration":
        kind = document.get("kind") if isinstance(document, Mapping) else type(document).__name__
        raise SchedulerConfigError(f"{source}: kind {kind!r}; expected a KubeSchedulerConfiguration")
    profile = _profile(document.get("profiles"), source)
    plugins = _plugin_args(profile, source)
    topology = _topology(plugins.get(TOPOLOGY_AWARE) or {}, source)
    fit = plugins.get(RESOURCES_FIT) or {}
    unknown = sorted(set(fit) - set(RESOURCES_FIT_ARGS))
    if unknown:
        raise SchedulerConfigError(f"{source}: {RESOURCES_FIT} args {', '.join(unknown)}: unknown; allowed: "
                                   f"{', '.join(RESOURCES_FIT_ARGS)}")
    defaults = Weights()
    weights = Weights(vram=_weight(fit, "vramWeight", defaults.vram, source),
                      tflops=_weight(fit, "tflopsWeight", defaults.tflops, source))
    return SchedulerArgs(max_workers_per_node=_max_workers(fit, source), weights=weights, source=source,
                         topology=topology)


def _profile(profiles: object, source: str) -> Mapping[str, object]:
    if profiles is None:
        return {}
    if not isinstance(profiles, list) or not all(isinstance(p, Mapping) for p in profiles):
        raise SchedulerConfigError(f"{source}: profiles must be a list of profiles")
    listed: list[Mapping[str, object]] = profiles
    named = [p for p in listed if p.get("schedulerName") == SCHEDULER_NAME]
    if named:
        return named[0]
    with_args = [p for p in listed if any(isinstance(c, Mapping) and c.get("name") in (RESOURCES_FIT, TOPOLOGY_AWARE)
                                          for c in items(p, "pluginConfig"))]
    if len(with_args) > 1:
        raise SchedulerConfigError(f"{source}: {len(with_args)} profiles configure GPU plugins and none is named "
                                   f"{SCHEDULER_NAME}; name the one tfusion reads")
    return with_args[0] if with_args else {}


def _plugin_args(profile: Mapping[str, object], source: str) -> dict[str, Mapping[str, object]]:
    found: dict[str, Mapping[str, object]] = {}
    entries = profile.get("pluginConfig") or []
    if not isinstance(entries, list):
        raise SchedulerConfigError(f"{source}: pluginConfig must be a list of {{name, args}}")
    for n, entry in enumerate(entries):
        name = entry.get("name") if isinstance(entry, Mapping) else None
        if name not in (RESOURCES_FIT, TOPOLOGY_AWARE):
            continue
        args = entry.get("args") or {}
        if not isinstance(args, Mapping):
            raise SchedulerConfigError(f"{source}: pluginConfig[{n}] ({name}) args must be a mapping")
        found[str(name)] = args
    return found


def _topology(args: Mapping[str, object], source: str) -> TopologyArgs:
    unknown = sorted(str(k) for k in set(args) - set(TOPOLOGY_ARGS))
    if unknown:
        raise SchedulerConfigError(f"{source}: {TOPOLOGY_AWARE} args {', '.join(unknown)}: unknown; allowed: "
                                   f"{', '.join(TOPOLOGY_ARGS)}")
    defaults = TopologyArgs()
    tier = args.get("maxAllowedTier", defaults.max_tier)
    if isinstance(tier, bool) or not isinstance(tier, int) or not 0 <= tier <= tfa.TOPOLOGY_TIER_MAX:
        raise SchedulerConfigError(f"{source}: {TOPOLOGY_AWARE} maxAllowedTier {tier!r}; allowed: an integer "
                                   f"from 0 to {tfa.TOPOLOGY_TIER_MAX}")
    least = args.get("preferLeastDamage", defaults.prefer_least_damage)
    if not isinstance(least, bool):
        raise SchedulerConfigError(f"{source}: {TOPOLOGY_AWARE} preferLeastDamage {least!r}; allowed: true, false")
    return TopologyArgs(mode=_choice(args, "mode", defaults.mode, MODES, source),
                        source=_choice(args, "topologySource", defaults.source, tfa.TOPOLOGY_SOURCES, source),
                        max_tier=tier,
                        unknown_policy=_choice(args, "unknownTopologyPolicy", defaults.unknown_policy,
                                               UNKNOWN_POLICIES, source),
                        prefer_least_damage=least)


def _choice(args: Mapping[str, object], key: str, default: str, allowed: tuple[str, ...], source: str) -> str:
    value = args.get(key, default)
    if value not in allowed:
        raise SchedulerConfigError(f"{source}: {TOPOLOGY_AWARE} {key} {value!r}; allowed: {', '.join(allowed)}")
    return str(value)


def _weight(args: Mapping[str, object], key: str, default: float, source: str) -> float:
    value = args.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise SchedulerConfigError(f"{source}: {RESOURCES_FIT} {key} {value!r}; expected a number of 0 or more")
    return float(value)


def _max_workers(args: Mapping[str, object], source: str) -> int | None:
    value = args.get("maxWorkerPerNode")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SchedulerConfigError(f"{source}: {RESOURCES_FIT} maxWorkerPerNode {value!r}; expected an integer of "
                                   f"1 or more")
    return value
