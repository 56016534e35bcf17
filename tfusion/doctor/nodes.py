"""The GPU nodes: a hypervisor ready on each, its device plugins registered, its reports fresh.

Why per node: a pool's capacity is the sum of its nodes, and one node whose hypervisor stopped
keeps its GPUs out of scheduling (after the report grace) while pods already there lose their
limiter. The GPU nodes are the GPUNodes (the controller makes one per Node a pool selects). A
hypervisor runs as a pod of the DaemonSet (`tensor-fusion.ai/component=hypervisor`) on each; where
none runs as a pod (`--role=all`, or hypervisors run by hand) its `/readyz` is asked at the Node's
InternalIP and `--hypervisor-port`, as the controller reaches it.
"""

from __future__ import annotations

from collections.abc import Mapping

import anyio
import httpx

from tfusion.api import annotations as tfa
from tfusion.api.accessors import Body, Node, Pod, text
from tfusion.api.timestamps import parse_rfc3339
from tfusion.controller.hypervisors import hypervisor_url, node_address
from tfusion.doctor.context import Context
from tfusion.doctor.findings import Finding, error, ok, warning
from tfusion.kube import resources as r

#: hypervisors asked at once (an unreachable one takes the whole timeout)
PROBES_AT_ONCE = 16
NO_GPUNODE_FIX = ("label the GPU nodes so a GPUPool's node selector picks them (`kubectl get gpupool -o yaml`: "
                  "spec.nodeManagerConfig.nodeSelector); the controller then makes their GPUNodes")


async def _gpunodes(ctx: Context) -> list[Body]:
    return [Body(raw) for raw in await ctx.client.list(r.GPUNODES)]


async def check_hypervisors(ctx: Context) -> list[Finding]:
    gpunodes = await _gpunodes(ctx)
    if not gpunodes:
        return [warning("hypervisors", "no GPUNode: no node is in a GPUPool, so there are no GPUs to share",
                        NO_GPUNODE_FIX)]
    selector = f"{tfa.COMPONENT}={tfa.COMPONENT_HYPERVISOR}"
    pods = [Pod(raw) for raw in await ctx.client.list(r.PODS, label_selector=selector)]
    by_node = {pod.node_name: pod for pod in pods if pod.node_name}
    nodes = {Body(raw).name: Node(raw) for raw in await ctx.client.list(r.NODES)}
    findings: list[Finding | None] = [None] * len(gpunodes)
    limiter = anyio.CapacityLimiter(PROBES_AT_ONCE)

    async def probe(at: int, name: str) -> None:
        async with limiter:
            findings[at] = await _probe(ctx, name, nodes.get(name))

    async with anyio.create_task_group() as tg:
        for at, name in enumerate(g.name for g in gpunodes):
            if name in by_node:
                findings[at] = _pod_finding(by_node[name])
            elif pods:  # hypervisors run as pods, but none on this node
                findings[at] = error("hypervisors", f"no hypervisor pod runs on GPU node {name}",
                                     _daemonset_fix(ctx, name))
            else:  # each may take the whole timeout: asked side by side
                tg.start_soon(probe, at, name)
    bad = [f for f in findings if f is not None and f.severity != "ok"]
    return bad or [ok("hypervisors", f"a hypervisor is ready on each of the {len(gpunodes)} GPU node(s)")]


def _daemonset_fix(ctx: Context, node: str) -> str:
    return (f"check DaemonSet tensor-fusion-hypervisor (`kubectl -n {ctx.namespace} get ds tensor-fusion-hypervisor`): "
            f"its nodeSelector (nvidia.com/gpu.present=true) must match node {node} and its tolerations the node's "
            "taints")


def _pod_finding(pod: Pod) -> Finding:
    ready = pod.condition("Ready")
    if ready is not None and ready.get("status") == "True":
        return ok("hypervisors", f"hypervisor pod {pod.namespace}/{pod.name} is ready on {pod.node_name}")
    waiting = [text(s, "state", "waiting", "reason") for s in pod.container_statuses]
    why = ", ".join(w for w in waiting if w) or (text(ready, "message") if ready else "") or pod.phase or "unknown"
    where = f"{pod.namespace}/{pod.name}"
    return error("hypervisors", f"hypervisor pod {where} on node {pod.node_name} is not ready ({why})",
                 f"`kubectl -n {pod.namespace} describe pod {pod.name}`, `kubectl -n {pod.namespace} logs {pod.name}`")


async def _probe(ctx: Context, name: str, node: Node | None) -> Finding:
    address = node_address(node)
    if address is None:
        return warning("hypervisors", f"GPU node {name} has no Node with an InternalIP: its hypervisor cannot be asked",
                       f"`kubectl get node {name} -o wide`")
    url = hypervisor_url(address, ctx.hypervisor_port)
    try:
        async with httpx.AsyncClient(timeout=ctx.timeout_s) as http:
            response = await http.get(f"{url}/readyz")
    except httpx.ConnectError as exc:
        return error("hypervisors", f"no hypervisor answers on GPU node {name} at {url} ({exc}), and none runs "
                                    "as a pod",
                     f"start the hypervisor on {name} (`tfusion --role=hypervisor`, or the tensor-fusion-hypervisor "
                     "DaemonSet; --role=all: restart it); if it serves on another port, pass --hypervisor-port")
    except httpx.HTTPError as exc:
        return warning("hypervisors", f"cannot reach the hypervisor of {name} at {url} from here "
                                      f"({type(exc).__name__}); its heartbeat below says whether it reports")
    if response.status_code != 200:
        return error("hypervisors", f"the hypervisor of {name} at {url} is not ready: {response.text[:300]}",
                     f"read the hypervisor's log on {name}: /readyz names the condition that is false")
    return ok("hypervisors", f"the hypervisor of {name} is ready at {url}")


def _index_resources(node: Node) -> int:
    return sum(1 for key, value in node.allocatable.items()
               if key.startswith(tfa.INDEX_RESOURCE_PREFIX) and str(value) not in ("", "0"))


async def check_device_plugins(ctx: Context) -> list[Finding]:
    names = [g.name for g in await _gpunodes(ctx)]
    nodes = {Body(raw).name: Node(raw) for raw in await ctx.client.list(r.NODES)}
    findings = []
    for name in names:
        node = nodes.get(name)
        count = _index_resources(node) if node is not None else 0
        if count < tfa.INDEX_RESOURCES:
            findings.append(error(
                "device-plugins", f"node {name} advertises {count} of the {tfa.INDEX_RESOURCES} "
                                  f"{tfa.INDEX_RESOURCE_PREFIX}* resources: its hypervisor's device plugins are not "
                                  "registered with the kubelet, so GPU pods cannot start there",
                f"check the hypervisor on {name} (its log says why registration failed); its DaemonSet must mount "
                "the kubelet's /var/lib/kubelet/device-plugins"))
    if not names:
        return []
    return findings or [ok("device-plugins", f"device plugins are registered on each of the {len(names)} GPU node(s)")]


def _heartbeat_age(gpunode: Body, now: float) -> float | None:
    stamp = text(gpunode.status, "hypervisorStatus", "lastHeartbeatTime")
    try:
        return max(0.0, now - parse_rfc3339(stamp).timestamp()) if stamp else None
    except ValueError:
        return None


def _reporting_message(gpunode: Body) -> str:
    found: Mapping[str, object] | None = gpunode.condition("HypervisorReporting")
    return text(found, "message") if found else ""


async def check_heartbeats(ctx: Context) -> list[Finding]:
    gpunodes = await _gpunodes(ctx)
    findings = []
    for gpunode in gpunodes:
        age = _heartbeat_age(gpunode, ctx.server_now())
        phase = gpunode.phase
        if phase == "Running":
            continue
        said = _reporting_message(gpunode) or f"phase {phase or 'not set'}"
        if phase == "Unknown":
            findings.append(error("heartbeats", f"GPUNode {gpunode.name}: {said}"
                                                + (f" (last report {age:.0f} s ago)" if age is not None else ""),
                                  f"the hypervisor of {gpunode.name} stopped reporting: see the hypervisors check"))
        else:
            findings.append(warning("heartbeats", f"GPUNode {gpunode.name} is {phase or 'without a phase'}: {said}",
                                    f"wait for the hypervisor of {gpunode.name} to report, or see the hypervisors "
                                    "check"))
    if not gpunodes:
        return []
    return findings or [ok("heartbeats", f"every GPUNode's hypervisor reports ({len(gpunodes)} Running)")]
