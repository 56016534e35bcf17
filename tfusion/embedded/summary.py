"""The startup summary `tfusion --role=all` prints once everything serves: where each role listens,
the kubeconfig, the GPUs, and what to try next. Written for someone on their first run.

Each listener line gives a URL to try and the address the socket is really bound to, so that a
listener open beyond loopback is visible at a glance ("all interfaces")."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol, runtime_checkable

import yaml

from tfusion.embedded.devices import DevicePlan
from tfusion.embedded.stage import StageInfo
from tfusion.settings import Settings, format_listen, is_loopback

_WILDCARDS = ("0.0.0.0", "::", "")


def _display_host(host: str) -> str:
    """A host to put in a URL to try: loopback for a wildcard bind."""
    if host in _WILDCARDS:
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def _bound(host: str, port: int) -> str:
    """What the socket is bound to, in words."""
    where = format_listen(host or "0.0.0.0", port)
    if host in _WILDCARDS:
        return f"bound to {where}, all interfaces"
    return f"bound to {where}, loopback only" if is_loopback(host) else f"bound to {where}"


def _server_url(kubeconfig: Path) -> str:
    try:
        config = yaml.safe_load(kubeconfig.read_text())
        return str(config["clusters"][0]["cluster"]["server"])
    except (OSError, KeyError, IndexError, TypeError, yaml.YAMLError):
        return "(unknown)"


@runtime_checkable
class Serving(Protocol):
    """What the API server role hands `task_status.started`, as far as the summary reads it."""

    kubeconfig: str


@runtime_checkable
class Listening(Protocol):
    """What the controller role hands `task_status.started`, as far as the summary reads it."""

    address: tuple[str, int] | None
    probe_address: tuple[str, int] | None


def startup_summary(settings: Settings, started: Mapping[str, object], plan: DevicePlan | None,
                    stage: StageInfo | None) -> str:
    """`started` maps each role to what its runner passed to `task_status.started`: the API server's
    kubeconfig path (`Serving`), the controller's runtime (`Listening`), the hypervisor's port."""
    lines = ["", "tfusion is running (Ctrl-C or SIGTERM stops it)."]
    kubeconfig: Path | None = None
    api = started.get("apiserver")
    if isinstance(api, Serving):
        kubeconfig = Path(api.kubeconfig).expanduser()
        lines.append(f"  API server   {_server_url(kubeconfig)}  (state {Path(settings.state).expanduser()})")
        lines.append(f"  kubeconfig   {kubeconfig}")
    controller_url = hypervisor_url = None
    runtime = started.get("controller")
    if isinstance(runtime, Listening) and runtime.address:
        host, port = runtime.address
        controller_url = f"http://{_display_host(host)}:{port}"
        lines.append(f"  controller   {controller_url}  (/api/allocation, /readyz, /metrics; {_bound(host, port)})")
        probe = runtime.probe_address
        if probe:
            lines.append(f"  probes       http://{_display_host(probe[0])}:{probe[1]}/readyz  ({_bound(*probe)})")
    hypervisor_port = started.get("hypervisor")
    if isinstance(hypervisor_port, int):
        # the hypervisor reports its port; its host is the one it binds (Settings.resolved_hypervisor_host)
        host, port = settings.resolved_hypervisor_host, hypervisor_port
        hypervisor_url = f"http://{_display_host(host)}:{port}"
        lines.append(f"  hypervisor   {hypervisor_url}  (/api/v1/devices, /api/v1/workers, /readyz; "
                     f"{_bound(host, port)})")
    console = started.get("console")
    if isinstance(console, str):
        lines.append(f"  console      {console}  (open it in a browser: GPUs, workloads, pending pods, cost)")
    if stage is not None and stage.node is not None:
        pool = f", GPUNode in pool {stage.pool}" if stage.pool else ", no GPUPool selects it"
        lines.append(f"  node         {stage.node.name} (simulated kubelet{pool})")
    if plan is not None:
        lines.append(f"  GPUs         {plan.describe()}")
    lines.append("Try:")
    if kubeconfig is not None:
        config = shlex.quote(str(kubeconfig))
        lines.append(f"  kubectl --kubeconfig {config} get nodes,gpunodes,gpus,gpupools")
    if hypervisor_url:
        lines.append(f"  curl {hypervisor_url}/api/v1/devices")
    if controller_url:
        lines.append(f"  curl {controller_url}/api/allocation")
    return "\n".join(lines) + "\n"
