"""The startup summary `tfusion --role=all` prints once everything serves: where each role listens,
the kubeconfig, the GPUs, and what to try next. Written for someone on their first run."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import yaml

from tfusion.embedded.devices import DevicePlan
from tfusion.embedded.stage import StageInfo
from tfusion.settings import Settings


def _display_host(host: str) -> str:
    if host in ("0.0.0.0", "::", ""):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def _server_url(kubeconfig: Path) -> str:
    try:
        config = yaml.safe_load(kubeconfig.read_text())
        return str(config["clusters"][0]["cluster"]["server"])
    except (OSError, KeyError, IndexError, TypeError, yaml.YAMLError):
        return "(unknown)"


def startup_summary(settings: Settings, started: dict[str, Any], plan: DevicePlan | None,
                    stage: StageInfo | None) -> str:
    """`started` maps each role to what its runner passed to `task_status.started`."""
    lines = ["", "tfusion is running (Ctrl-C or SIGTERM stops it)."]
    kubeconfig: Path | None = None
    if "apiserver" in started:
        kubeconfig = Path(str(started["apiserver"])).expanduser()
        lines.append(f"  API server   {_server_url(kubeconfig)}  (state {Path(settings.state).expanduser()})")
        lines.append(f"  kubeconfig   {kubeconfig}")
    controller_url = hypervisor_url = None
    runtime = started.get("controller")
    if runtime is not None and getattr(runtime, "address", None):
        host, port = runtime.address
        controller_url = f"http://{_display_host(host)}:{port}"
        lines.append(f"  controller   {controller_url}  (/api/allocation, /readyz, /metrics)")
    if "hypervisor" in started:
        hypervisor_url = f"http://127.0.0.1:{started['hypervisor']}"
        lines.append(f"  hypervisor   {hypervisor_url}  (/api/v1/devices, /api/v1/workers, /readyz)")
    if stage is not None and stage.node is not None:
        pool = f", GPUNode in pool {stage.pool}" if stage.pool else ", no GPUPool selects it"
        lines.append(f"  node         {stage.node['metadata']['name']} (simulated kubelet{pool})")
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
