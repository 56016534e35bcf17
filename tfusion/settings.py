"""Every flag and environment variable tfusion reads, typed, with its default, in one place.

The CLI builds its argument parser from `OPTIONS` and `Settings.load` resolves each option once
(flag, then environment, then default, except where the original lets the environment win).
Nothing else in tfusion reads `os.environ`; roles receive the frozen `Settings`.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROLES = ("apiserver", "controller", "hypervisor")
ALL_ROLES = (*ROLES, "all")


class SettingsError(ValueError):
    """A flag or environment variable has a value tfusion cannot use; the message names it."""


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """Go-style durations ("12h", "1m30s", "500ms", bare seconds "15") to seconds."""
    stripped = text.strip()
    if re.fullmatch(r"\d+(?:\.\d+)?", stripped):
        return float(stripped)
    pos, total = 0, 0.0
    for match in _DURATION_PART.finditer(stripped):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        pos = match.end()
    if pos != len(stripped) or not stripped:
        raise ValueError(f"expected a duration such as 30s, 5m or 12h, got {text!r}")
    return total


def parse_port_range(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", text)
    if not match or not (0 < int(match.group(1)) <= int(match.group(2)) <= 65535):
        raise ValueError(f"expected a port range such as 40000-42000, got {text!r}")
    return int(match.group(1)), int(match.group(2))


def parse_listen(text: str) -> tuple[str, int]:
    """`host:port`, `:port` (all interfaces) or `[v6]:port`."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT or :PORT, got {text!r}")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


def parse_isolation_policy(text: str) -> str:
    lowered = text.strip().lower()
    if lowered not in ("static", "dynamic"):
        raise ValueError(f"expected static or dynamic, got {text!r}")
    return lowered


def _choice(*allowed: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in allowed:
            raise ValueError(f"expected one of {', '.join(allowed)}, got {text!r}")
        return text

    return parse


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError(f"expected a positive integer, got {text!r}")
    return value


def _port(text: str) -> int:
    """A TCP port, 0 (any free port) to 65535."""
    if not text.strip().isdigit() or not 0 <= int(text) <= 65535:
        raise ValueError(f"expected a port number from 0 to 65535, got {text!r}")
    return int(text)


#: the simulated devices --role=all falls back to when --devices=auto finds no NVIDIA driver
DEFAULT_SIM_DEVICES = "sim:2xA100-SXM4-80GB,1xH100-SXM5-80GB"


def parse_sim_devices_fallback(text: str) -> str:
    """auto, off, or a sim:SPEC (the models are checked when the devices are opened)."""
    stripped = text.strip()
    if stripped in ("auto", "off"):
        return stripped
    if stripped.startswith("sim:") and stripped[4:].strip(" ,"):
        return stripped
    raise ValueError(f"expected auto, off or sim:<count>x<model>[,...], got {text!r}")


def _listen_or_port(text: str) -> str:
    """HOST:PORT, :PORT, or a bare port (the original's PORT variable) meaning :PORT."""
    address = f":{text}" if text.isdigit() else text
    parse_listen(address)  # raises ValueError naming what is expected
    return address


@dataclass(frozen=True)
class Option:
    """One setting: its attribute, flag, environment variable, default, parser and owning role."""

    attr: str
    flag: str | None
    env: str | None
    default: Any
    parse: Callable[[str], Any]
    role: str  # "common" or one of ROLES
    help: str
    env_wins: bool = False  # the original lets the environment override the flag (e.g. HYPERVISOR_PORT)
    is_bool_flag: bool = False


def _o(attr: str, flag: str | None, env: str | None, default: Any, parse: Callable[[str], Any], role: str,
       help: str, *, env_wins: bool = False, is_bool_flag: bool = False) -> Option:
    return Option(attr, flag, env, default, parse, role, help, env_wins, is_bool_flag)


OPTIONS: tuple[Option, ...] = (
    # --- common -----------------------------------------------------------------------------------
    _o("kube", "--kube", None, "", str, "common",
       "API server to use: a kubeconfig path, 'in-cluster', or 'embedded' "
       "(default: embedded for --role=all, else $KUBECONFIG, else in-cluster)"),
    _o("kubeconfig_env", None, "KUBECONFIG", "", str, "common", "kubeconfig used when --kube is not given"),
    _o("log_level", "--log-level", "TF_LOG_LEVEL", "info", _choice("trace", "debug", "info", "warn", "error"),
       "common", "log verbosity"),
    _o("node_name", "--node-name", "GPU_NODE_NAME", "", str, "common",
       "this node's name (GPU node / simulated kubelet); default: the host name"),
    _o("pod_name", None, "POD_NAME", "", str, "common", "pod name (downward API), used in identities"),
    _o("pod_namespace", None, "POD_NAMESPACE", "", str, "common",
       "pod namespace (downward API); kr8s reports 'default' in-cluster, so this wins"),
    _o("domain_prefix", None, "TENSOR_FUSION_CUSTOM_DOMAIN_PREFIX", "tensor-fusion", str, "common",
       "first part of the label/annotation domain"),
    _o("domain_suffix", None, "TENSOR_FUSION_CUSTOM_DOMAIN_SUFFIX", "ai", str, "common",
       "last part of the label/annotation domain"),
    _o("testing", None, "GO_TESTING", False, parse_bool, "common", "test timings (short requeues)"),
    # --- apiserver --------------------------------------------------------------------------------
    _o("apiserver_listen", "--apiserver-listen", None, "127.0.0.1:6443", str, "apiserver",
       "embedded API server address; plain HTTP on loopback, HTTPS with a bearer token elsewhere"),
    _o("state", "--state", None, ".tfusion/state.db", str, "apiserver", "SQLite file holding every object"),
    _o("kubeconfig_out", "--kubeconfig-out", None, ".tfusion/kubeconfig", str, "apiserver",
       "where to write a kubeconfig for kubectl and the other roles"),
    _o("watch_history", "--watch-history", None, 10000, _positive_int, "apiserver",
       "watch events kept for resume; older resourceVersions get 410 Expired"),
    # --- controller -------------------------------------------------------------------------------
    _o("controller_listen", "--controller-listen", "PORT", ":8080",
       _listen_or_port, "controller",
       "controller HTTP API, /healthz, /readyz and /metrics"),
    _o("webhook_listen", "--webhook-listen", None, ":9443", str, "controller", "TLS pod admission webhook"),
    _o("leader_elect", "--leader-elect", None, True, parse_bool, "controller",
       "elect one active controller through a Lease", is_bool_flag=True),
    _o("operator_namespace", "--operator-namespace", "OPERATOR_NAMESPACE", "tensor-fusion-sys", str, "controller",
       "namespace of the leader Lease and operator objects"),
    _o("leader_lease_duration", "--leader-elect-lease-duration", None, 15.0, parse_duration, "controller",
       "how long a leader Lease is honoured after its last renewal"),
    _o("leader_renew_deadline", "--leader-elect-renew-deadline", None, 10.0, parse_duration, "controller",
       "a leader that has not renewed for this long stops leading"),
    _o("leader_retry_period", "--leader-elect-retry-period", None, 2.0, parse_duration, "controller",
       "how often candidates and the leader try the Lease"),
    _o("dynamic_config", "--dynamic-config", None, "/etc/tensor-fusion/config.yaml", str, "controller",
       "dynamic config file, hot-reloaded when it changes"),
    _o("dynamic_config_interval", "--dynamic-config-interval", None, 5.0, parse_duration, "controller",
       "how often the dynamic config file's modification time is checked"),
    _o("scheduler_config", "--scheduler-config", None, "/etc/tensor-fusion/scheduler-config.yaml", str,
       "controller", "KubeSchedulerConfiguration with GPUResourcesFit args"),
    _o("metrics_path", "--metrics-path", None, "/logs/metrics.log", str, "controller",
       "influx line-protocol metrics file written by the leader"),
    _o("host_port_range", "--host-port-range", None, (40000, 42000), parse_port_range, "controller",
       "node-level host port range"),
    _o("cluster_host_port_range", "--cluster-host-port-range", None, (42000, 62000), parse_port_range,
       "controller", "cluster-level host port range"),
    _o("isolation_mode_policy", None, "TF_ISOLATION_MODE_POLICY", "static", parse_isolation_policy, "controller",
       "static or dynamic isolation-mode policy"),
    _o("enable_webhooks", None, "ENABLE_WEBHOOKS", True, parse_bool, "controller", "serve the pod webhook"),
    _o("enable_scheduler", None, "ENABLE_SCHEDULER", True, parse_bool, "controller", "run GPU scheduling"),
    _o("enable_cr_controller", None, "ENABLE_CR_CONTROLLER", True, parse_bool, "controller", "run reconcilers"),
    _o("progressive_migration", None, "NVIDIA_OPERATOR_PROGRESSIVE_MIGRATION", False, parse_bool, "controller",
       "send native-GPU pods to nodes without tfusion workers"),
    _o("initial_gpu_node_label_selector", None, "INITIAL_GPU_NODE_LABEL_SELECTOR", "", str, "controller",
       "k=v selector for GPU nodes before any pool selects them"),
    _o("max_workers_per_node", "--max-workers-per-node", None, 256, _positive_int, "controller",
       "GPU workers one node may hold"),
    _o("sync_interval", "--sync-interval", None, 10.0, parse_duration, "controller",
       "how often allocator state is written to GPU and quota status"),
    # --- hypervisor -------------------------------------------------------------------------------
    _o("hypervisor_port", "--port", "HYPERVISOR_PORT", 8001, _port, "hypervisor",
       "hypervisor HTTP API port (HYPERVISOR_PORT wins over the flag)", env_wins=True),
    _o("devices", "--devices", None, "auto", str, "hypervisor",
       "device backend: auto (NVML when a driver answers, else none), nvml, or sim:2xA100-SXM4-80GB,..."),
    _o("vendor", "--vendor", "TF_HARDWARE_VENDOR", "NVIDIA", str, "hypervisor",
       "accelerator vendor (TF_HARDWARE_VENDOR wins over the flag)", env_wins=True),
    _o("backend", "--backend", None, "kubernetes", _choice("kubernetes", "local"), "hypervisor",
       "kubernetes (report GPU objects, track worker pods) or local (no Kubernetes)"),
    _o("isolation_mode", "--isolation-mode", None, "soft", _choice("shared", "soft", "hard", "partitioned"),
       "hypervisor", "isolation mode stamped on devices"),
    _o("isolation_policy", "--isolation-policy", None, "static", parse_isolation_policy, "hypervisor",
       "static or dynamic"),
    _o("discovery_interval", "--discovery-interval", None, 12 * 3600.0, parse_duration, "hypervisor",
       "periodic device rediscovery"),
    _o("metrics_output_path", "--metrics-output-path", None, "metrics.log", str, "hypervisor",
       "influx line-protocol file of tf_gpu_usage and tf_worker_usage"),
    _o("metrics_interval", "--metrics-interval", None, 60.0, parse_duration, "hypervisor",
       "how often usage lines are written"),
    _o("state_dir", "--state-dir", "TENSOR_FUSION_STATE_DIR", "~/.tfusion/hypervisor", str, "hypervisor",
       "local backend: where devices and workers persist"),
    _o("pool_name", None, "TENSOR_FUSION_POOL_NAME", "unknown", str, "hypervisor", "pool tag on metrics"),
    _o("hardware_metadata", None, "TF_PROVIDER_HARDWARE_METADATA", "", str, "hypervisor",
       "JSON list of {model, fullModelName, fp16TFlops} overriding the gpu-info table"),
    _o("scheduling_config", None, "TF_HYPERVISOR_SCHEDULING_CONFIG", "", str, "hypervisor",
       "JSON hypervisor scheduling config (rate-limit parameters, auto-freeze)"),
    _o("metrics_format", None, "TF_HYPERVISOR_METRICS_FORMAT", "influx", _choice("influx", "json", "otel"),
       "hypervisor", "metrics file format"),
    _o("metrics_extra_labels", None, "TF_HYPERVISOR_METRICS_EXTRA_LABELS", "", str, "hypervisor",
       "JSON map pod annotation key -> extra metrics tag"),
    _o("detect_in_used_gpus", None, "DETECT_IN_USED_GPUS", False, parse_bool, "hypervisor",
       "mark GPUs held by another device plugin"),
    _o("sim_devices_fallback", "--sim-devices-fallback", None, "auto", parse_sim_devices_fallback, "hypervisor",
       f"simulated devices used when --devices=auto finds no NVIDIA driver: auto ({DEFAULT_SIM_DEVICES} "
       "with --role=all, none otherwise), off, or sim:SPEC"),
    _o("simulate_kubelet", "--simulate-kubelet", None, False, parse_bool, "hypervisor",
       "run a simulated kubelet for --node-name: register the Node, keep its Lease, run the pods bound to it "
       "(always on with --role=all)", is_bool_flag=True),
)

_BY_ATTR = {opt.attr: opt for opt in OPTIONS}


@dataclass(frozen=True)
class Settings:
    """The resolved configuration of one tfusion process. Build it with `Settings.load`."""

    roles: tuple[str, ...] = ("all",)
    kube: str = ""
    kubeconfig_env: str = ""
    log_level: str = "info"
    node_name: str = ""
    pod_name: str = ""
    pod_namespace: str = ""
    domain_prefix: str = "tensor-fusion"
    domain_suffix: str = "ai"
    testing: bool = False
    apiserver_listen: str = "127.0.0.1:6443"
    state: str = ".tfusion/state.db"
    kubeconfig_out: str = ".tfusion/kubeconfig"
    watch_history: int = 10000
    controller_listen: str = ":8080"
    webhook_listen: str = ":9443"
    leader_elect: bool = True
    operator_namespace: str = "tensor-fusion-sys"
    leader_lease_duration: float = 15.0
    leader_renew_deadline: float = 10.0
    leader_retry_period: float = 2.0
    dynamic_config: str = "/etc/tensor-fusion/config.yaml"
    dynamic_config_interval: float = 5.0
    scheduler_config: str = "/etc/tensor-fusion/scheduler-config.yaml"
    metrics_path: str = "/logs/metrics.log"
    host_port_range: tuple[int, int] = (40000, 42000)
    cluster_host_port_range: tuple[int, int] = (42000, 62000)
    isolation_mode_policy: str = "static"
    enable_webhooks: bool = True
    enable_scheduler: bool = True
    enable_cr_controller: bool = True
    progressive_migration: bool = False
    initial_gpu_node_label_selector: str = ""
    max_workers_per_node: int = 256
    sync_interval: float = 10.0
    hypervisor_port: int = 8001
    devices: str = "auto"
    vendor: str = "NVIDIA"
    backend: str = "kubernetes"
    isolation_mode: str = "soft"
    isolation_policy: str = "static"
    discovery_interval: float = 12 * 3600.0
    metrics_output_path: str = "metrics.log"
    metrics_interval: float = 60.0
    state_dir: str = "~/.tfusion/hypervisor"
    pool_name: str = "unknown"
    hardware_metadata: str = ""
    scheduling_config: str = ""
    metrics_format: str = "influx"
    metrics_extra_labels: str = ""
    detect_in_used_gpus: bool = False
    sim_devices_fallback: str = "auto"
    simulate_kubelet: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, flags: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None,
             roles: Sequence[str] = ("all",)) -> Settings:
        """Resolve every option. `flags` maps attribute names to values given on the command line
        (already parsed; absent or None means "not given"); `env` defaults to os.environ."""
        flags = flags or {}
        env = os.environ if env is None else env
        values: dict[str, Any] = {"roles": tuple(roles)}
        for opt in OPTIONS:
            values[opt.attr] = _resolve(opt, flags.get(opt.attr), env)
        unknown = set(flags) - set(_BY_ATTR)
        if unknown:
            raise SettingsError(f"unknown setting(s): {', '.join(sorted(unknown))}")
        return cls(**values)

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)

    def has_role(self, role: str) -> bool:
        return role in self.roles or "all" in self.roles

    @property
    def domain(self) -> str:
        return f"{self.domain_prefix}.{self.domain_suffix}"

    @property
    def resolved_node_name(self) -> str:
        import socket

        return self.node_name or socket.gethostname().lower()

    @property
    def resolved_state_dir(self) -> Path:
        return Path(self.state_dir).expanduser()

    @property
    def runs_simulated_kubelet(self) -> bool:
        return self.simulate_kubelet or "all" in self.roles

    @property
    def resolved_sim_devices_fallback(self) -> str:
        """The sim:SPEC to use when --devices=auto finds no driver; "" means none."""
        if self.sim_devices_fallback == "auto":
            return DEFAULT_SIM_DEVICES if "all" in self.roles else ""
        return "" if self.sim_devices_fallback == "off" else self.sim_devices_fallback

    @property
    def kube_mode(self) -> str:
        """'embedded', 'in-cluster' or a kubeconfig path."""
        if self.kube:
            return self.kube
        if "all" in self.roles:
            return "embedded"
        if self.kubeconfig_env:
            return str(Path(self.kubeconfig_env).expanduser())
        return "in-cluster"


def _resolve(opt: Option, flag_value: Any, env: Mapping[str, str]) -> Any:
    env_text = env.get(opt.env) if opt.env else None
    if env_text == "":
        env_text = None
    if env_text is not None and (flag_value is None or opt.env_wins):
        try:
            return opt.parse(env_text)
        except ValueError as exc:
            raise SettingsError(f"environment variable {opt.env}={env_text!r}: {exc}") from None
    if flag_value is not None:
        return flag_value
    return opt.default


def option(attr: str) -> Option:
    return _BY_ATTR[attr]


def process_environment() -> dict[str, str]:
    """A copy of this process's environment, for child processes that must inherit it (the
    hypervisor's local workers); kept here so that nothing else reads os.environ."""
    return dict(os.environ)
