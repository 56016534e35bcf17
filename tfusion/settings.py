"""Every flag and environment variable tfusion reads, typed, with its default, in one place.

The CLI builds its argument parser from `OPTIONS` and `Settings.load` resolves each option once
(flag, then environment, then default, except where the original lets the environment win).
Nothing else in tfusion reads `os.environ`; roles receive the frozen `Settings`.

Each default is written once, in its Option; the `Settings` fields read it from there. Settings of
the original that tfusion does not implement yet stay declared (so the names and defaults are
documented) but are refused when set: `Settings.load` raises `NotImplementedSettingError`, and the
CLI exits 1 naming the flag or variable, instead of accepting it and doing nothing.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tfusion import __version__
from tfusion.api import annotations as ann
from tfusion.api import durations
from tfusion.api.selectors import parse_label_selector

ROLES = ("apiserver", "controller", "hypervisor")
KUBELET_DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
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


def parse_duration(text: str) -> float:
    """A duration flag, variable or config value: Go units plus days ("12h", "1m30s", "30d") or bare
    seconds ("15"), in seconds. The grammar is `tfusion.api.durations`, shared with annotations."""
    return durations.parse_duration(text, allow_days=True, bare_seconds=True)


def parse_port_range(text: str) -> tuple[int, int]:
    """START-END with 0 < START < END <= 65536 (END is excluded, as in the original)."""
    match = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", text)
    if not match or not (0 < int(match.group(1)) < int(match.group(2)) <= 65536):
        raise ValueError(f"expected a port range START-END with 0 < START < END <= 65536, such as "
                         f"40000-42000, got {text!r}")
    return int(match.group(1)), int(match.group(2))


_DNS_LABEL_RE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_NAME_RE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*")


def parse_dns_label(text: str) -> str:
    """A DNS label (a Service name): lowercase letters, digits and '-', at most 63 characters."""
    if not _DNS_LABEL_RE.fullmatch(text):
        raise ValueError(f"expected a DNS label (lowercase letters, digits, '-'; at most 63), got {text!r}")
    return text


def parse_node_label_selector(text: str) -> str:
    """A Kubernetes label selector (`nvidia.com/gpu.present=true`, `a=b,c in (d,e)`), checked now
    so that a typo stops the start, not every Node's reconcile."""
    parse_label_selector(text)
    return text.strip()


def webhook_client_ca_path(state: str | Path) -> Path:
    """Where the embedded API server writes the CA of its webhook client certificate: beside its
    state file, where a controller in the same process (`--role=all`) reads it to verify its callers."""
    state = Path(state).expanduser()
    return state.parent / (state.name + ".webhook-client-ca.crt")


def parse_host_list(text: str) -> tuple[str, ...]:
    """A comma list of DNS names and IP addresses (certificate subject alternative names)."""
    hosts: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            hosts.append(str(ipaddress.ip_address(part.strip("[]"))))
            continue
        except ValueError:
            pass
        name = part.lower()
        if len(name) > 253 or not _DNS_NAME_RE.fullmatch(name):
            raise ValueError(f"expected DNS names or IP addresses separated by commas; {part!r} is neither")
        hosts.append(name)
    return tuple(dict.fromkeys(hosts))


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
        raise ValueError(f"expected static or dynamic (case-insensitive), got {text!r}")
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


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0 or value == float("inf"):
        raise ValueError(f"expected a positive number, got {text!r}")
    return value


def _existing_file(text: str) -> str:
    """The absolute path of a file that exists (a library handed to processes must be found by them)."""
    path = Path(text).expanduser()
    if not path.is_file():
        raise ValueError(f"no file at {text!r}: expected the path of an existing file (libcuda_limiter.so)")
    return str(path.resolve())


def _port(text: str) -> int:
    """A TCP port, 0 (any free port) to 65535."""
    if not text.strip().isdigit() or not 0 <= int(text) <= 65535:
        raise ValueError(f"expected a port number from 0 to 65535, got {text!r}")
    return int(text)


def parse_metrics_path(text: str) -> str:
    """A metrics file path, or "off" for none; "" keeps the role's default."""
    return text.strip()


def parse_http_url(text: str) -> str:
    """An http:// or https:// URL with a host ("" for none)."""
    from urllib.parse import urlsplit

    stripped = text.strip()
    if not stripped:
        return ""
    parts = urlsplit(stripped)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"expected an http:// or https:// URL such as http://127.0.0.1:4000/v1/influxdb/write, "
                         f"got {text!r}")
    return stripped


#: --autoscaler-usage-source: the hypervisors themselves, or a server that keeps history
AUTOSCALER_USAGE_SOURCES = ("hypervisor", "prometheus", "influxdb", "greptimedb")

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


def _listen_address(text: str) -> str:
    """HOST:PORT or :PORT, kept as written (roles bind it with `parse_listen`)."""
    parse_listen(text)  # raises ValueError naming what is expected
    return text


def _listen_or_off(text: str) -> str:
    """HOST:PORT, :PORT, or "off"."""
    return "off" if text.strip() == "off" else _listen_address(text.strip())


def parse_host(text: str) -> str:
    """An IP address to listen on (IPv6 with or without brackets); "" keeps the role's default."""
    host = text.strip().strip("[]")
    if not host:
        return ""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"expected an IP address such as 0.0.0.0, 127.0.0.1, :: or ::1, got {text!r}") from None
    return host


def is_loopback(host: str) -> bool:
    """Whether `host` (an IP address or "localhost") is reachable only from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def format_listen(host: str, port: int) -> str:
    """HOST:PORT as `parse_listen` reads it back ([v6]:PORT for IPv6)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _listen_or_port(text: str) -> str:
    """HOST:PORT, :PORT, or a bare port (the original's PORT variable) meaning :PORT."""
    address = f":{text}" if text.isdigit() else text
    parse_listen(address)  # raises ValueError naming what is expected
    return address


#: what a refusal says; the rest of the line names the flag or variable
NOT_IMPLEMENTED = "is not implemented yet in this version of tfusion"


class NotImplementedSettingError(SettingsError):
    """A flag or variable is valid but does nothing in this version; the CLI exits 1 (not 2) on it."""


@dataclass(frozen=True)
class Option:
    """One setting: its attribute, flag, environment variable, default, parser and owning role.

    `implemented=False` keeps a setting of the original declared (its name, default and help stay
    documented) while refusing it when a user sets it, so nothing is accepted and silently ignored.
    """

    attr: str
    flag: str | None
    env: str | None
    default: Any
    parse: Callable[[str], Any]
    role: str  # "common" or one of ROLES
    help: str
    env_wins: bool = False  # the original lets the environment override the flag (e.g. HYPERVISOR_PORT)
    is_bool_flag: bool = False
    implemented: bool = True

    @property
    def names(self) -> str:
        """How a user sets it: "--flag", "VARIABLE" or "--flag / VARIABLE"."""
        return " / ".join(name for name in (self.flag, self.env) if name)


def _o(attr: str, flag: str | None, env: str | None, default: Any, parse: Callable[[str], Any], role: str,
       help: str, *, env_wins: bool = False, is_bool_flag: bool = False, implemented: bool = True) -> Option:
    return Option(attr, flag, env, default, parse, role, help, env_wins, is_bool_flag, implemented)


OPTIONS: tuple[Option, ...] = (
    # --- common -----------------------------------------------------------------------------------
    _o("kube", "--kube", None, "", str, "common",
       "API server to use: a kubeconfig path, 'in-cluster', or 'embedded' "
       "(default: embedded for --role=all, else $KUBECONFIG, else in-cluster)"),
    _o("kubeconfig_env", None, "KUBECONFIG", "", str, "common", "kubeconfig used when --kube is not given"),
    _o("kube_api_qps", "--kube-api-qps", None, 1000.0, _positive_float, "common",
       "requests a second this process's Kubernetes client may send (client-side limit)"),
    _o("kube_api_burst", "--kube-api-burst", None, 2000, _positive_int, "common",
       "requests the client may send at once above --kube-api-qps"),
    _o("log_level", "--log-level", "TF_LOG_LEVEL", "info", _choice("trace", "debug", "info", "warn", "error"),
       "common", "log verbosity"),
    _o("event_loop", "--event-loop", "TF_EVENT_LOOP", "auto", _choice("auto", "uvloop", "asyncio"), "common",
       "the event loop the roles run on: uvloop (libuv's: less CPU per request, a longer tail on CPU-heavy "
       "requests), asyncio (Python's), or auto: uvloop for a process that runs only the embedded API server, "
       "asyncio otherwise"),
    _o("node_name", "--node-name", "GPU_NODE_NAME", "", str, "common",
       "this node's name (GPU node / simulated kubelet); default: the host name"),
    _o("pod_name", None, "POD_NAME", "", str, "common", "pod name (downward API), used in identities"),
    _o("pod_namespace", None, "POD_NAMESPACE", "", str, "common",
       "pod namespace (downward API); kr8s reports 'default' in-cluster, so this wins"),
    _o("domain_prefix", None, "TENSOR_FUSION_CUSTOM_DOMAIN_PREFIX", "tensor-fusion", str, "common",
       "first part of the label/annotation domain"),
    _o("domain_suffix", None, "TENSOR_FUSION_CUSTOM_DOMAIN_SUFFIX", "ai", str, "common",
       "last part of the label/annotation domain"),
    _o("testing", None, "GO_TESTING", False, parse_bool, "common", "test timings (short requeues)",
       implemented=False),
    _o("metrics_interval", "--metrics-interval", None, 60.0, parse_duration, "common",
       "how often the controller's leader records its tables and the hypervisor its usage"),
    _o("metrics_push_url", "--metrics-push-url", "TF_METRICS_PUSH_URL", "", parse_http_url, "common",
       "also push metrics (line protocol) to this write endpoint: GreptimeDB's "
       "http://HOST:4000/v1/influxdb/write or an InfluxDB 1.x http://HOST:8086/write; unset: no push"),
    _o("metrics_push_database", "--metrics-push-database", None, "public", str, "common",
       "database the pushed points go to (the db= or bucket= parameter)"),
    _o("metrics_push_user", "--metrics-push-user", None, "", str, "common",
       "user for HTTP basic auth on the push endpoint (the password comes from --metrics-push-password-file)"),
    _o("metrics_push_password_file", "--metrics-push-password-file", None, "", str, "common",
       "file holding the push endpoint's password"),
    _o("metrics_push_buffer", "--metrics-push-buffer", None, 100000, _positive_int, "common",
       "lines kept while the database is slow or away; beyond that the oldest are dropped "
       "(tfusion_metrics_dropped_total)"),
    # --- apiserver --------------------------------------------------------------------------------
    _o("apiserver_listen", "--apiserver-listen", None, "127.0.0.1:6443", str, "apiserver",
       "embedded API server address; HTTPS and a bearer token (in the kubeconfig) on every address"),
    _o("state", "--state", None, ".tfusion/state.db", str, "apiserver", "SQLite file holding every object"),
    _o("kubeconfig_out", "--kubeconfig-out", None, ".tfusion/kubeconfig", str, "apiserver",
       "where to write a kubeconfig for kubectl and the other roles"),
    _o("console_listen", "--console-listen", None, "127.0.0.1:8090", _listen_or_off, "apiserver",
       "with --role=all, the web console's address (tfusion console, read-only, as the kubeconfig's admin); "
       "off: no console"),
    _o("embedded_identities", "--embedded-identities", None, "service-accounts",
       _choice("service-accounts", "admin"), "apiserver",
       "with the embedded API server (--role=all): 'service-accounts' runs the controller and the hypervisor "
       "with tokens of their own ServiceAccounts, bound by the RBAC that deploy/ ships (applied at start); "
       "'admin' gives them the admin token"),
    _o("watch_history", "--watch-history", None, 10000, _positive_int, "apiserver",
       "watch events kept for resume, and at most 128 MiB of them; older resourceVersions get "
       "410 Expired"),
    # --- controller -------------------------------------------------------------------------------
    _o("controller_listen", "--controller-listen", "PORT", ":8080",
       _listen_or_port, "controller",
       "controller HTTP API, /healthz, /readyz and /metrics; without a host (:PORT) all interfaces, "
       "but loopback with --role=all"),
    _o("health_probe_listen", "--health-probe-bind-address", None, ":8081", _listen_address, "controller",
       "liveness and readiness probes (/healthz, /readyz) on their own port, as the original's chart probes; "
       "without a host (:PORT) all interfaces, but loopback with --role=all"),
    _o("webhook_listen", "--webhook-listen", None, ":9443", _listen_address, "controller",
       "TLS pod admission webhook (POST /mutate-v1-pod); without a host (:PORT) all interfaces, but loopback "
       "with --role=all"),
    _o("webhook_cert_dir", "--webhook-cert-dir", None, "", str, "controller",
       "directory with tls.crt and tls.key for the webhook (e.g. from cert-manager; re-read when they "
       "change, checked every 10 minutes); unset: the controller keeps its own CA and certificate in a Secret "
       "and the caBundle current"),
    _o("webhook_client_ca", "--webhook-client-ca", None, "", str, "controller",
       "PEM file of the CA(s) whose client certificates may call the webhook (the API server's, named by its "
       "AdmissionConfiguration); a caller without one is refused in the TLS handshake. Unset: required with the "
       "embedded API server (its own webhook client CA), not asked for otherwise; none: never asked for"),
    _o("webhook_hosts", "--webhook-host", None, (), parse_host_list, "controller",
       "extra DNS names or IP addresses for the webhook certificate, comma-separated (the Service's "
       "<svc>.<ns>.svc names are always in it)"),
    _o("webhook_service", "--webhook-service", None, "tensor-fusion-webhook", parse_dns_label, "controller",
       "name of the webhook's Service in --operator-namespace (the MutatingWebhookConfiguration points at it)"),
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
    _o("scheduler_config", "--scheduler-config", None, "", str, "controller",
       "KubeSchedulerConfiguration whose GPUResourcesFit args (maxWorkerPerNode, vramWeight, tflopsWeight) the "
       "scheduler uses; unset: /etc/tensor-fusion/scheduler-config.yaml when it exists"),
    _o("metrics_path", "--metrics-path", None, "", parse_metrics_path, "controller",
       "metrics file the leader appends its tables to (rotated at 100 MB, 10 kept; format: the dynamic "
       "config's metricsFormat); off: no file; unset: <directory of --state>/metrics/controller.log with "
       "--role=all, else /logs/metrics.log (the original's)"),
    _o("host_port_range", "--host-port-range", None, (40000, 42000), parse_port_range, "controller",
       "node-level host port range START-END (END excluded), per node, for workers the controller creates"),
    _o("cluster_host_port_range", "--cluster-host-port-range", None, (42000, 62000), parse_port_range,
       "controller", "cluster-level host port range START-END (END excluded) for pods labelled "
       "tensor-fusion.ai/host-port=auto"),
    _o("isolation_mode_policy", "--isolation-mode-policy", "TF_ISOLATION_MODE_POLICY", "static",
       parse_isolation_policy, "controller",
       "isolation-mode policy, case-insensitive: static (a GPU's mode is the one its hypervisor reports) or "
       "dynamic (the first pod on a GPU sets its mode until the GPU is empty; the hypervisor of --role=all "
       "follows it)"),
    _o("enable_webhooks", None, "ENABLE_WEBHOOKS", True, parse_bool, "controller",
       "serve and register the pod webhook (false: neither)"),
    _o("enable_scheduler", None, "ENABLE_SCHEDULER", True, parse_bool, "controller",
       "run GPU scheduling (false: no scheduler and no extender routes)"),
    _o("scheduler", "--scheduler", None, "builtin", _choice("builtin", "extender"), "controller",
       "who binds GPU pods: builtin (the leader's own scheduler) or extender (a kube-scheduler profile "
       "calls /scheduler/filter, /prioritize and /bind)"),
    _o("preempt_cluster_wide", None, "TF_SCHEDULER_PREEMPT_CLUSTER_WIDE", True, parse_bool,
       "controller", "preemption (the built-in scheduler's, and the extender's preempt verb) may take lower-priority "
       "GPU pods of every namespace (false: only of the preempting pod's own namespace)"),
    _o("schedule_default_pods", None, None, False, parse_bool, "controller",
       "the built-in scheduler also places pods that name default-scheduler (or no scheduler), by the node "
       "checks alone, without GPUs; no flag or variable: only the embedded API server's wiring (--role=all, "
       "--kube=embedded) turns it on, since on a real cluster kube-scheduler owns those pods"),
    _o("enable_cr_controller", None, "ENABLE_CR_CONTROLLER", True, parse_bool, "controller",
       "run the reconcilers and the drift audit (false: none of them; the allocator, its status write-back and "
       "orphan sweep, the webhook and the scheduler still run)"),
    _o("limiter_image", "--limiter-image", "TF_LIMITER_IMAGE", f"tfusion:{__version__}", str, "controller",
       "image the webhook's init container copies tfusion's soft limiter from (the tfusion image; a "
       "ProviderConfig's spec.images.middleware wins)"),
    _o("progressive_migration", None, "NVIDIA_OPERATOR_PROGRESSIVE_MIGRATION", False, parse_bool, "controller",
       "native-GPU pods that auto-migration does not take go to tensor-fusion-scheduler, which keeps them "
       "on nodes without TensorFusion workers; nodes with workers get a PreferNoSchedule taint"),
    _o("initial_gpu_node_label_selector", None, "INITIAL_GPU_NODE_LABEL_SELECTOR", "", parse_node_label_selector,
       "controller", "label selector a Node must match to get a GPUNode, whatever the pools select (the "
       "original's chart sets nvidia.com/gpu.present=true); unset: every Node a pool selects"),
    _o("max_workers_per_node", "--max-workers-per-node", None, None, _positive_int, "controller",
       "GPU workers one node may hold; unset: the scheduler config's maxWorkerPerNode, else 256"),
    _o("sync_interval", "--sync-interval", None, 10.0, parse_duration, "controller",
       "how often allocator state is written to GPU and quota status"),
    _o("gpu_node_report_grace", "--gpu-node-report-grace", None, 300.0, parse_duration, "controller",
       "a GPUNode whose hypervisor has not reported (GPU last-sync) for this long becomes Unknown"),
    _o("drift_check_interval", "--drift-check-interval", None, 60.0, parse_duration, "controller",
       "how often the leader audits the ledger against GPU status, pods and hypervisors"),
    _o("connection_wait", "--connection-wait", None, 300.0, parse_duration, "controller",
       "how long GET /api/connection waits for a remote vGPU connection's worker to run before 504"),
    _o("disable_connection_auth", None, "DISABLE_CONNECTION_AUTH", False, parse_bool, "controller",
       "answer GET /api/connection without checking the caller's ServiceAccount token (unsafe: any pod "
       "can then read any connection's worker address)"),
    _o("autoscaler_usage_source", "--autoscaler-usage-source", "TF_AUTOSCALER_USAGE_SOURCE", "hypervisor",
       _choice(*AUTOSCALER_USAGE_SOURCES), "controller",
       "where the autoscaler reads workers' GPU usage: hypervisor (each node's hypervisor, no database), "
       "prometheus, influxdb (1.x) or greptimedb (history from --autoscaler-usage-url)"),
    _o("autoscaler_usage_url", "--autoscaler-usage-url", None, "", parse_http_url, "controller",
       "base URL of the prometheus, influxdb or greptimedb usage source (required for those)"),
    _o("autoscaler_usage_database", "--autoscaler-usage-database", None, "", str, "controller",
       "database of the influxdb or greptimedb usage source (default: --metrics-push-database)"),
    _o("enable_alert", "--enable-alert", None, False, parse_bool, "controller",
       "evaluate the dynamic config's alertRules on the leader against --alert-metrics-url and send the "
       "firing and resolved alerts to --alert-manager-addr", is_bool_flag=True),
    _o("alert_manager_addr", "--alert-manager-addr", None,
       "http://alert-manager.tensor-fusion-sys.svc.cluster.local:9093", parse_http_url, "controller",
       "base URL of the Alertmanager the alertRules' alerts are posted to (its v2 API)"),
    _o("alert_metrics_source", "--alert-metrics-source", None, "prometheus", _choice("prometheus", "greptimedb"),
       "controller", "what the alertRules' queries are: PromQL for prometheus (any server with the Prometheus "
       "query API), SQL for greptimedb (the original's rules)"),
    _o("alert_metrics_url", "--alert-metrics-url", None, "", parse_http_url, "controller",
       "base URL of the server the alertRules' queries run on (required with --enable-alert)"),
    _o("alert_metrics_database", "--alert-metrics-database", None, "", str, "controller",
       "GreptimeDB database of the alertRules' SQL (default: --metrics-push-database)"),
    _o("enable_auto_expander", "--enable-auto-expander", None, False, parse_bool, "controller",
       "the node expander: GPUNodeClaims for TensorFusion pods that fit on no node for lack of GPU "
       "(leader only; GET /api/node-scaler)", is_bool_flag=True),
    _o("provisioning_catalog", "--provisioning-catalog", "TF_PROVISIONING_CATALOG", "", _existing_file, "controller",
       "YAML file of the instance types providers may launch, with GPUs and prices per hour "
       "(default: the catalog shipped in tfusion/controller/provisioning/catalog.yaml)"),
    _o("simulated_boot_delay", "--simulated-boot-delay", None, 5.0, parse_duration, "controller",
       "the simulated provider: time from launching an instance to its Node joining"),
    _o("cloud_endpoint_url", "--cloud-endpoint-url", "TF_CLOUD_ENDPOINT_URL", "", parse_http_url, "controller",
       "the aws provider: EC2 endpoint to call instead of the region's (a private endpoint, or moto's server)"),
    _o("compaction_min_node_age", "--compaction-min-node-age", None, 300.0, parse_duration, "controller",
       "compaction removes an empty node only once it is this old"),
    # --- hypervisor -------------------------------------------------------------------------------
    _o("hypervisor_port", "--port", "HYPERVISOR_PORT", 8001, _port, "hypervisor",
       "hypervisor HTTP API port (HYPERVISOR_PORT wins over the flag)", env_wins=True),
    _o("hypervisor_host", "--host", "HYPERVISOR_HOST", "", parse_host, "hypervisor",
       "IP address the hypervisor HTTP API listens on; unset: all interfaces (the DaemonSet on the host "
       "network), but 127.0.0.1 with --role=all or --backend=local"),
    _o("api_token_file", "--api-token-file", None, "", str, "hypervisor",
       "--backend=local: file holding a bearer token that creating and deleting workers then need; "
       "required when --host is not a loopback address"),
    _o("devices", "--devices", None, "auto", str, "hypervisor",
       "device backend: auto (NVML when a driver answers, else none), nvml, or sim:2xA100-SXM4-80GB,..."),
    _o("vendor", "--vendor", "TF_HARDWARE_VENDOR", "NVIDIA", str, "hypervisor",
       "accelerator vendor (TF_HARDWARE_VENDOR wins over the flag)", env_wins=True),
    _o("backend", "--backend", None, "kubernetes", _choice("kubernetes", "local"), "hypervisor",
       "kubernetes (report GPU objects, track worker pods) or local (no Kubernetes)"),
    _o("isolation_mode", "--isolation-mode", None, ann.DEFAULT_ISOLATION, _choice(*ann.ISOLATION_MODES),
       "hypervisor", "isolation mode stamped on devices"),
    _o("isolation_policy", "--isolation-policy", None, "static", parse_isolation_policy, "hypervisor",
       "static or dynamic"),
    _o("discovery_interval", "--discovery-interval", None, 12 * 3600.0, parse_duration, "hypervisor",
       "periodic device rediscovery"),
    _o("metrics_output_path", "--metrics-output-path", None, "", parse_metrics_path, "hypervisor",
       "metrics file of tf_gpu_usage and tf_worker_usage (rotated at 100 MB, 10 kept); off: no file; unset: "
       "<directory of --state>/metrics/hypervisor.log with --role=all, else metrics.log (the original's)"),
    _o("state_dir", "--state-dir", "TENSOR_FUSION_STATE_DIR", "~/.tfusion/hypervisor", str, "hypervisor",
       "local backend: where devices and workers persist"),
    _o("pool_name", None, "TENSOR_FUSION_POOL_NAME", "unknown", str, "hypervisor", "pool tag on metrics"),
    _o("hardware_metadata", None, "TF_PROVIDER_HARDWARE_METADATA", "", str, "hypervisor",
       "JSON list of {model, fullModelName, fp16TFlops} overriding the gpu-info table"),
    _o("scheduling_config", None, "TF_HYPERVISOR_SCHEDULING_CONFIG", "", str, "hypervisor",
       "JSON hypervisor scheduling config (rate-limit parameters, auto-freeze)"),
    _o("metrics_format", None, "TF_HYPERVISOR_METRICS_FORMAT", "influx", _choice("influx", "json", "otel"),
       "hypervisor", "metrics file format: influx (line protocol), json (one object a line) or otel (one "
       "OTLP/JSON request a batch)"),
    _o("metrics_extra_labels", None, "TF_HYPERVISOR_METRICS_EXTRA_LABELS", "", str, "hypervisor",
       "JSON map pod annotation key -> extra metrics tag"),
    _o("detect_in_used_gpus", None, "DETECT_IN_USED_GPUS", False, parse_bool, "hypervisor",
       "mark this node's GPUs that another device plugin holds (the kubelet's PodResources API or its "
       "device-plugin checkpoint) as used by it, so tfusion does not share them out (Kubernetes backend)"),
    _o("sim_devices_fallback", "--sim-devices-fallback", None, "auto", parse_sim_devices_fallback, "hypervisor",
       f"simulated devices used when --devices=auto finds no NVIDIA driver: auto ({DEFAULT_SIM_DEVICES} "
       "with --role=all, none otherwise), off, or sim:SPEC"),
    _o("simulate_kubelet", "--simulate-kubelet", None, False, parse_bool, "hypervisor",
       "run a simulated kubelet for --node-name: register the Node, keep its Lease, run the pods bound to it "
       "(always on with --role=all)", is_bool_flag=True),
    _o("shm_root", "--shm-root", None, "", str, "hypervisor",
       "directory of the soft limiter's shared-memory files (<root>/<namespace>/<pod>/shm); unset: "
       "/run/tensor-fusion/shm, but <state dir>/shm with --role=all and --backend=local"),
    _o("limiter_library", "--limiter-library", "TF_LIMITER_LIBRARY", "", _existing_file, "hypervisor",
       "libcuda_limiter.so preloaded into local soft workers' processes (--backend=local: LD_PRELOAD, ahead of "
       "any LD_PRELOAD the worker's env names); unset: none"),
    _o("device_plugin_dir", "--device-plugin-dir", None, "auto", str, "hypervisor",
       "the kubelet's device-plugin directory (kubelet.sock) for the 16 tensor-fusion.ai/index_<k> plugins: "
       "auto (/var/lib/kubelet/device-plugins when it exists, with --backend=kubernetes and no simulated "
       "kubelet), off, or a path"),
)

_BY_ATTR = {opt.attr: opt for opt in OPTIONS}


def _default(attr: str) -> Any:
    """The default of a `Settings` field, read from its Option: each default is written once, there."""
    return _BY_ATTR[attr].default


@dataclass(frozen=True)
class Settings:
    """The resolved configuration of one tfusion process. Build it with `Settings.load`.

    Not every field is set by a user: `schedule_default_pods` is False from `load` and set True by
    roles.py when this process runs the embedded API server (no kube-scheduler is there to place
    default-scheduler pods)."""

    roles: tuple[str, ...] = ("all",)
    kube: str = _default("kube")
    kubeconfig_env: str = _default("kubeconfig_env")
    kube_api_qps: float = _default("kube_api_qps")
    kube_api_burst: int = _default("kube_api_burst")
    log_level: str = _default("log_level")
    event_loop: str = _default("event_loop")
    node_name: str = _default("node_name")
    pod_name: str = _default("pod_name")
    pod_namespace: str = _default("pod_namespace")
    domain_prefix: str = _default("domain_prefix")
    domain_suffix: str = _default("domain_suffix")
    testing: bool = _default("testing")
    apiserver_listen: str = _default("apiserver_listen")
    state: str = _default("state")
    kubeconfig_out: str = _default("kubeconfig_out")
    console_listen: str = _default("console_listen")
    embedded_identities: str = _default("embedded_identities")
    watch_history: int = _default("watch_history")
    controller_listen: str = _default("controller_listen")
    health_probe_listen: str = _default("health_probe_listen")
    webhook_listen: str = _default("webhook_listen")
    webhook_cert_dir: str = _default("webhook_cert_dir")
    webhook_client_ca: str = _default("webhook_client_ca")
    webhook_hosts: tuple[str, ...] = _default("webhook_hosts")
    webhook_service: str = _default("webhook_service")
    leader_elect: bool = _default("leader_elect")
    operator_namespace: str = _default("operator_namespace")
    leader_lease_duration: float = _default("leader_lease_duration")
    leader_renew_deadline: float = _default("leader_renew_deadline")
    leader_retry_period: float = _default("leader_retry_period")
    dynamic_config: str = _default("dynamic_config")
    dynamic_config_interval: float = _default("dynamic_config_interval")
    scheduler_config: str = _default("scheduler_config")
    metrics_path: str = _default("metrics_path")
    host_port_range: tuple[int, int] = _default("host_port_range")
    cluster_host_port_range: tuple[int, int] = _default("cluster_host_port_range")
    isolation_mode_policy: str = _default("isolation_mode_policy")
    enable_webhooks: bool = _default("enable_webhooks")
    enable_scheduler: bool = _default("enable_scheduler")
    scheduler: str = _default("scheduler")
    preempt_cluster_wide: bool = _default("preempt_cluster_wide")
    schedule_default_pods: bool = _default("schedule_default_pods")
    enable_cr_controller: bool = _default("enable_cr_controller")
    progressive_migration: bool = _default("progressive_migration")
    limiter_image: str = _default("limiter_image")
    initial_gpu_node_label_selector: str = _default("initial_gpu_node_label_selector")
    max_workers_per_node: int | None = _default("max_workers_per_node")
    sync_interval: float = _default("sync_interval")
    gpu_node_report_grace: float = _default("gpu_node_report_grace")
    drift_check_interval: float = _default("drift_check_interval")
    connection_wait: float = _default("connection_wait")
    disable_connection_auth: bool = _default("disable_connection_auth")
    autoscaler_usage_source: str = _default("autoscaler_usage_source")
    autoscaler_usage_url: str = _default("autoscaler_usage_url")
    autoscaler_usage_database: str = _default("autoscaler_usage_database")
    enable_alert: bool = _default("enable_alert")
    alert_manager_addr: str = _default("alert_manager_addr")
    alert_metrics_source: str = _default("alert_metrics_source")
    alert_metrics_url: str = _default("alert_metrics_url")
    alert_metrics_database: str = _default("alert_metrics_database")
    enable_auto_expander: bool = _default("enable_auto_expander")
    provisioning_catalog: str = _default("provisioning_catalog")
    simulated_boot_delay: float = _default("simulated_boot_delay")
    cloud_endpoint_url: str = _default("cloud_endpoint_url")
    compaction_min_node_age: float = _default("compaction_min_node_age")
    hypervisor_port: int = _default("hypervisor_port")
    hypervisor_host: str = _default("hypervisor_host")
    api_token_file: str = _default("api_token_file")
    devices: str = _default("devices")
    vendor: str = _default("vendor")
    backend: str = _default("backend")
    isolation_mode: str = _default("isolation_mode")
    isolation_policy: str = _default("isolation_policy")
    discovery_interval: float = _default("discovery_interval")
    metrics_output_path: str = _default("metrics_output_path")
    metrics_interval: float = _default("metrics_interval")
    metrics_push_url: str = _default("metrics_push_url")
    metrics_push_database: str = _default("metrics_push_database")
    metrics_push_user: str = _default("metrics_push_user")
    metrics_push_password_file: str = _default("metrics_push_password_file")
    metrics_push_buffer: int = _default("metrics_push_buffer")
    state_dir: str = _default("state_dir")
    pool_name: str = _default("pool_name")
    hardware_metadata: str = _default("hardware_metadata")
    scheduling_config: str = _default("scheduling_config")
    metrics_format: str = _default("metrics_format")
    metrics_extra_labels: str = _default("metrics_extra_labels")
    detect_in_used_gpus: bool = _default("detect_in_used_gpus")
    sim_devices_fallback: str = _default("sim_devices_fallback")
    simulate_kubelet: bool = _default("simulate_kubelet")
    shm_root: str = _default("shm_root")
    limiter_library: str = _default("limiter_library")
    device_plugin_dir: str = _default("device_plugin_dir")
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, flags: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None,
             roles: Sequence[str] = ("all",)) -> Settings:
        """Resolve every option. `flags` maps attribute names to values given on the command line
        (already parsed; absent or None means "not given"); `env` defaults to os.environ."""
        flags = flags or {}
        env = os.environ if env is None else env
        unknown = set(flags) - set(_BY_ATTR)
        if unknown:
            raise SettingsError(f"unknown setting(s): {', '.join(sorted(unknown))}")
        values: dict[str, Any] = {"roles": tuple(roles)}
        for opt in OPTIONS:
            values[opt.attr] = _resolve(opt, flags.get(opt.attr), env)
        _check_autoscaler_usage(values)
        _check_alerts(values)
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

    def _metrics_file(self, given: str, role_file: str, original: str) -> Path | None:
        if given == "off":
            return None
        if given:
            return Path(given).expanduser()
        if "all" in self.roles:
            return Path(self.state).expanduser().parent / "metrics" / role_file
        return Path(original)

    @property
    def resolved_metrics_path(self) -> Path | None:
        """The controller's metrics file (None: --metrics-path=off)."""
        return self._metrics_file(self.metrics_path, "controller.log", "/logs/metrics.log")

    @property
    def resolved_metrics_output_path(self) -> Path | None:
        """The hypervisor's metrics file (None: --metrics-output-path=off)."""
        return self._metrics_file(self.metrics_output_path, "hypervisor.log", "metrics.log")

    @property
    def resolved_shm_root(self) -> Path:
        """--shm-root, else beside the state on a single machine, else the hypervisor pod's tmpfs."""
        if self.shm_root:
            return Path(self.shm_root).expanduser()
        if "all" in self.roles:
            return Path(self.state).expanduser().parent / "shm"
        if self.backend == "local":
            return self.resolved_state_dir / "shm"
        return Path("/run/tensor-fusion/shm")

    @property
    def resolved_device_plugin_dir(self) -> Path | None:
        """Where the device plugins register (None: no device plugins; see --device-plugin-dir)."""
        value = self.device_plugin_dir.strip()
        if value == "off":
            return None
        if value != "auto":
            return Path(value).expanduser()
        default = KUBELET_DEVICE_PLUGIN_DIR
        if self.backend != "kubernetes" or self.runs_simulated_kubelet or not default.is_dir():
            return None
        return default

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
    def resolved_controller_listen(self) -> str:
        """--controller-listen as bound: an address without a host means loopback with --role=all."""
        return self._role_listen(self.controller_listen, "all" in self.roles)

    @property
    def resolved_webhook_listen(self) -> str:
        """--webhook-listen as bound: without a host, loopback with --role=all."""
        return self._role_listen(self.webhook_listen, "all" in self.roles)

    @property
    def resolved_health_probe_listen(self) -> str:
        """--health-probe-bind-address as bound: without a host, loopback with --role=all."""
        return self._role_listen(self.health_probe_listen, "all" in self.roles)

    @property
    def resolved_hypervisor_isolation_policy(self) -> str:
        """The hypervisor's --isolation-policy; with --role=all the controller's TF_ISOLATION_MODE_POLICY,
        as the original's operator passes its policy to the hypervisors it runs."""
        return self.isolation_mode_policy if "all" in self.roles else self.isolation_policy

    @property
    def resolved_hypervisor_host(self) -> str:
        """--host, else 127.0.0.1 on a single machine (--role=all, --backend=local), else all interfaces."""
        if self.hypervisor_host:
            return self.hypervisor_host
        return "127.0.0.1" if "all" in self.roles or self.backend == "local" else "0.0.0.0"

    @property
    def resolved_hypervisor_listen(self) -> str:
        return format_listen(self.resolved_hypervisor_host, self.hypervisor_port)

    @staticmethod
    def _role_listen(listen: str, loopback: bool) -> str:
        host, port = parse_listen(listen)
        if loopback and not listen.rpartition(":")[0].strip("[]"):
            return format_listen("127.0.0.1", port)
        return format_listen(host, port)

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
    env_text = (env.get(opt.env) or None) if opt.env else None  # an empty variable counts as unset
    _refuse_if_not_implemented(opt, flag_value, env_text)
    if env_text is not None and (flag_value is None or opt.env_wins):
        try:
            value = opt.parse(env_text)
        except ValueError as exc:
            raise SettingsError(f"environment variable {opt.env}={env_text!r}: {exc}") from None
        return value
    if flag_value is not None:
        return flag_value
    return opt.default


def _check_autoscaler_usage(values: Mapping[str, Any]) -> None:
    """A usage source that keeps history needs its server's URL; the hypervisor source takes none."""
    source, url = values["autoscaler_usage_source"], values["autoscaler_usage_url"]
    if source != "hypervisor" and not url:
        raise SettingsError(f"--autoscaler-usage-source={source} needs --autoscaler-usage-url (the {source} "
                            "server's base URL, such as http://127.0.0.1:9090)")
    if source == "hypervisor" and (url or values["autoscaler_usage_database"]):
        raise SettingsError("--autoscaler-usage-url and --autoscaler-usage-database are for the prometheus, "
                            "influxdb and greptimedb usage sources; --autoscaler-usage-source is hypervisor")
    if source == "prometheus" and values["autoscaler_usage_database"]:
        raise SettingsError("--autoscaler-usage-database is for the influxdb and greptimedb usage sources; "
                            "prometheus has no database")


def _check_alerts(values: Mapping[str, Any]) -> None:
    """--enable-alert needs a server to run the rules' queries on."""
    if values["enable_alert"] and not values["alert_metrics_url"]:
        raise SettingsError("--enable-alert needs --alert-metrics-url (the base URL of the "
                            f"{values['alert_metrics_source']} server the alertRules' queries run on)")
    if values["alert_metrics_database"] and values["alert_metrics_source"] != "greptimedb":
        raise SettingsError("--alert-metrics-database is for --alert-metrics-source=greptimedb")


def _refuse_if_not_implemented(opt: Option, flag_value: Any, env_text: str | None) -> None:
    """Setting an option that does nothing is an error, whatever its value (even one that would not parse)."""
    if opt.implemented:
        return
    if flag_value is not None:
        raise NotImplementedSettingError(f"{opt.flag} {NOT_IMPLEMENTED}; leave it out")
    if env_text is not None:
        raise NotImplementedSettingError(f"environment variable {opt.env} {NOT_IMPLEMENTED}; unset it")


def not_implemented_options() -> tuple[Option, ...]:
    """Options that are declared but refused when set."""
    return tuple(opt for opt in OPTIONS if not opt.implemented)


def option(attr: str) -> Option:
    return _BY_ATTR[attr]


def process_environment() -> dict[str, str]:
    """A copy of this process's environment, for child processes that must inherit it (the
    hypervisor's local workers); kept here so that nothing else reads os.environ."""
    return dict(os.environ)
