"""The controller's dynamic config file (`--dynamic-config`, YAML), hot-reloaded.

Operators change metrics retention, alert rules, the auto-scaling interval and a few limits
without restarting the controller (reference upstream-controller.md §9). The file is polled by
modification time; a missing file means the defaults; a file that does not parse or has a bad
value is refused with a message naming the key, and the last good config stays in force. Keys
keep the camelCase spelling of the file, and keys we do not know are kept as they are.
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import anyio
import yaml
from anyio.abc import TaskStatus

from tfusion.metrics.points import FORMATS as METRICS_FORMATS
from tfusion.settings import parse_duration

log = logging.getLogger(__name__)


DEFAULT_CONFIG: dict[str, Any] = {
    "metricsTTL": "30d",
    "metricsFormat": "influx",
    "metricsExtraPodLabels": {},
    "alertRules": [],
    "autoScalingInterval": "30s",
    "gpuOperatorNamespace": "gpu-operator",
    "preemptClusterWideFromEnv": True,
    "hypervisorMaxCrashCount": 5,
    "maxInFlightNodes": 15,
}


class ConfigError(ValueError):
    """The file is not a usable config; the message names the key, the value and what is allowed."""


def _check_duration(key: str, value: object) -> None:
    try:
        parse_duration(str(value))
    except ValueError:
        raise ConfigError(f"{key}: {value!r} is not a duration (expected e.g. 30s, 5m, 30d)") from None


def _check_non_negative_int(key: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{key}: {value!r} is not a non-negative integer")


def validate(raw: object) -> dict[str, Any]:
    """Defaults overlaid with the file's keys, after checking the keys we know."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"the config must be a mapping of keys to values, got {type(raw).__name__}")
    config = copy.deepcopy(DEFAULT_CONFIG)
    config.update(raw)
    if config["metricsFormat"] not in METRICS_FORMATS:
        allowed = ", ".join(METRICS_FORMATS)
        raise ConfigError(f"metricsFormat: {config['metricsFormat']!r} is not one of {allowed}")
    _check_duration("metricsTTL", config["metricsTTL"])
    _check_duration("autoScalingInterval", config["autoScalingInterval"])
    _check_non_negative_int("hypervisorMaxCrashCount", config["hypervisorMaxCrashCount"])
    _check_non_negative_int("maxInFlightNodes", config["maxInFlightNodes"])
    if not isinstance(config["metricsExtraPodLabels"] or {}, Mapping):
        raise ConfigError("metricsExtraPodLabels: must map a pod label to a metrics tag")
    if not isinstance(config["alertRules"] or [], list):
        raise ConfigError("alertRules: must be a list of rules")
    for i, rule in enumerate(config["alertRules"] or []):
        if not isinstance(rule, Mapping) or not rule.get("name"):
            raise ConfigError(f"alertRules[{i}]: each rule needs a name")
    if not isinstance(config["preemptClusterWideFromEnv"], bool):
        value = config["preemptClusterWideFromEnv"]
        raise ConfigError(f"preemptClusterWideFromEnv: {value!r} is not true or false")
    return config


class DynamicConfig:
    """The current config (`current`), reloaded by `run()` whenever the file's mtime changes."""

    def __init__(self, path: str, *, interval: float = 5.0) -> None:
        self.path = Path(path).expanduser()
        self.interval = interval
        self.current: dict[str, Any] = copy.deepcopy(DEFAULT_CONFIG)
        self.error: str = ""
        self.loads = 0
        self._stamp: tuple[float, int, int] | None = None
        self._listeners: list[Callable[[dict[str, Any]], None]] = []

    def on_change(self, listener: Callable[[dict[str, Any]], None]) -> None:
        self._listeners.append(listener)

    def _file_stamp(self) -> tuple[float, int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_mtime, st.st_size, st.st_ino)

    def reload_if_changed(self) -> bool:
        """Re-read the file if it changed since the last look; True when the config changed."""
        stamp = self._file_stamp()
        if stamp == self._stamp and self.loads:
            return False
        self._stamp = stamp
        self.loads += 1
        try:
            if stamp is None:
                config = copy.deepcopy(DEFAULT_CONFIG)
            else:
                try:
                    raw = yaml.safe_load(self.path.read_text())
                except yaml.YAMLError as exc:
                    raise ConfigError(f"not valid YAML: {exc}") from None
                config = validate(raw)
        except (ConfigError, OSError) as exc:
            self.error = f"{self.path}: {exc}"
            log.error("dynamic config %s refused, keeping the previous one: %s", self.path, exc)
            return False
        self.error = ""
        if config == self.current:
            return False
        self.current = config
        log.info("dynamic config loaded from %s", self.path if stamp else "defaults (no file)")
        for listener in self._listeners:
            try:
                listener(config)
            except Exception:
                log.exception("dynamic config listener failed")
        return True

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        self.reload_if_changed()
        task_status.started()
        while True:
            await anyio.sleep(self.interval)
            self.reload_if_changed()
