"""`tfusion why [-n NAMESPACE] POD`: why a pod is not scheduled, and what would make it fit;
`tfusion why [-n NAMESPACE] workload/NAME`: what the autoscaler recommends for a workload, and why.

Why a command: the answer is in two places — the pod's `PodScheduled` condition (in the API
server, kube's one-line message) and the leader's explanation (per-node reasons with numbers and
suggestions, `GET /api/why` on the controller). This reads both and prints them in plain words,
or as JSON with `-o json` (`{pod, condition, explanation, controllerError}`, `explanation` being
the controller's answer with its `suggestions`).

`--kube` is as for the roles (a kubeconfig path, `in-cluster`, or `embedded` for the kubeconfig
`--role=all` writes, `.tfusion/kubeconfig`; default `$KUBECONFIG`, else in-cluster);
`--controller URL` (default: found as the console finds it, tfusion/console/locate.py: the
`api-url` the leader writes to its leader-info ConfigMap in `--operator-namespace`, else a
port-forward to the leader's pod). Exit codes: 0 shown, 1 the pod does not exist or the API server
cannot be used (one line), 2 bad arguments. When the controller cannot be found or reached the
condition alone is shown, with a line saying what was tried and what to do.

For `workload/NAME` (also `tensorfusionworkload/NAME`, `tfw/NAME`) it shows the leader's
`GET /api/recommendation` answer: the usage samples, the percentiles and estimates, the rule in force,
the last decision and each worker's last resize (`-o json`: the answer as it is); exit 1 when the
controller cannot say.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeAlias

import anyio
import httpx
import orjson

from tfusion.api import annotations as tfa
from tfusion.api.accessors import Body, Pod, items, section
from tfusion.api.jsontypes import JsonMapping, JsonObject
from tfusion.console.explain import node_reasons, suggestion_text
from tfusion.console.target import OneLineParser, kube_target

PROG = "tfusion why"


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog=PROG, description="Say why a pod is not scheduled and what would make it fit, or "
                                                     "what the autoscaler recommends for a workload.")
    parser.add_argument("pod", metavar="POD", help="the pod's name, or workload/NAME for a workload's "
                                                   "autoscaling recommendation")
    parser.add_argument("-n", "--namespace", default="default", help="the pod's namespace (default: default)")
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text",
                        help="text (default) or json (the structured form, with suggestions)")
    parser.add_argument("--kube", default="", help="API server: a kubeconfig path, 'in-cluster' or 'embedded' "
                                                   "(default: $KUBECONFIG, else in-cluster)")
    parser.add_argument("--controller", default="",
                        help="the controller's HTTP API URL (default: the api-url in the leader-info ConfigMap, "
                             "else a port-forward to the leader's pod)")
    parser.add_argument("--operator-namespace", default="",
                        help="where the controller's leader-info ConfigMap is (default: $OPERATOR_NAMESPACE, "
                             "else tensor-fusion-sys)")
    return parser


WORKLOAD_PREFIXES = ("workload/", "workloads/", "tensorfusionworkload/", "tensorfusionworkloads/", "tfw/")


def operator_namespace(given: str) -> str:
    from tfusion.settings import Settings

    return given or Settings.load({}, roles=("controller",)).operator_namespace


async def _read_pod(kube: str, namespace: str, name: str) -> Pod | None:
    from tfusion.kube import resources as r
    from tfusion.kube.client import KubeClient, NotFound

    client = await KubeClient.connect(kube_target(kube), namespace=namespace)
    try:
        return Pod(await client.get(r.PODS, name, namespace=namespace))
    except NotFound:
        return None
    finally:
        await client.close()


async def _node_origin(kube: str, node_name: str) -> str:
    """A sentence on where a provisioned node came from ("" for other nodes, or when unreadable)."""
    from tfusion.kube import resources as r
    from tfusion.kube.client import KubeClient, KubeError

    client = await KubeClient.connect(kube_target(kube))
    try:
        node = Body(await client.get(r.NODES, node_name))
        claim_name = node.meta.label(tfa.NODE_PROVISIONER)
        if not claim_name:
            return ""
        claim = Body(await client.get(r.GPUNODECLAIMS, claim_name))
    except KubeError:
        return ""
    finally:
        await client.close()
    return origin_text(claim)


def origin_text(claim: Body) -> str:
    source = claim.meta.label(tfa.EXPANSION_SOURCE)
    made_by = ("the node expander made it for pods that fit nowhere ("
               + ("a type chosen from the catalog" if source == "catalog" else f"the type of node {source}") + ")"
               if source else "its pool's provisioning made it to reach minResources/warmResources")
    price = claim.meta.annotation(tfa.HOURLY_PRICING)
    return (f"The node was provisioned for GPUPool {claim.meta.label(tfa.MANAGED_BY) or '?'} by GPUNodeClaim "
            f"{claim.name} ({claim.spec.get('instanceType') or '?'}{f', ${price}/h' if price else ''}): {made_by}.")


#: the controller's JSON answer, or None and why not
Answer: TypeAlias = "tuple[JsonObject | None, str]"


async def _with_controller(args: argparse.Namespace, ask: Callable[[str], Awaitable[Answer]]) -> Answer:
    """`ask(url)` with the controller's URL: --controller, else the one locate_controller finds
    (a port-forward stays open while `ask` runs)."""
    from tfusion.console.locate import ControllerNotFound, locate_controller
    from tfusion.kube.client import KubeClient, KubeError

    if args.controller:
        return await ask(args.controller)
    try:
        client = await KubeClient.connect(kube_target(args.kube))
    except (KubeError, ValueError) as exc:
        return None, f"cannot look for the controller: {exc}"
    try:
        async with locate_controller(client, namespace=operator_namespace(args.operator_namespace)) as found:
            return await ask(found.url)
    except ControllerNotFound as exc:
        return None, str(exc)
    finally:
        await client.close()


async def _ask_controller(url: str, namespace: str, name: str, route: str = "/api/why") -> Answer:
    try:
        async with httpx.AsyncClient(base_url=url, timeout=10.0) as http:
            response = await http.get(route, params={"namespace": namespace, "name": name})
    except httpx.HTTPError as exc:
        return None, f"the controller at {url} did not answer ({type(exc).__name__}: {exc})"
    try:
        body = response.json()
    except ValueError:
        return None, f"the controller at {url} answered {response.status_code} with non-JSON"
    if not isinstance(body, dict):
        return None, f"the controller at {url} answered {response.status_code} with JSON that is no object"
    if response.status_code != 200:
        return None, f"the controller at {url} answered {response.status_code}: {body.get('error', body)}"
    return body, ""


def render_text(pod: Pod, explanation: JsonMapping | None, controller_error: str, origin: str = "") -> str:
    ref = f"{pod.namespace}/{pod.name}"
    phase = pod.phase or "Pending"
    evicted = pod.meta.annotation(tfa.DEFRAG_EVICTED)
    defrag = f" Defrag evicted it at {evicted} to empty its node for compaction." if evicted else ""
    if pod.node_name:
        gpus = pod.meta.annotation(tfa.GPU_IDS)
        where = f" with GPU(s) {gpus}" if gpus else ""
        return f"Pod {ref} is scheduled on node {pod.node_name}{where} (phase {phase}).{defrag}" + \
            (f"\n{origin}" if origin else "")
    scheduler = pod.scheduler_name or "default-scheduler"
    lines = [f"Pod {ref} is {phase} and not scheduled (scheduler {scheduler})."]
    condition = pod.condition("PodScheduled")
    answer = section(explanation)  # the controller's /api/why body ({} without one)
    message = answer.get("message") or (condition.get("message") if condition is not None else "") or ""
    lines.append(f"Why: {message}" if message else "Why: no scheduler has reported on it yet.")
    for node, status in sorted(section(answer, "nodes").items()):
        lines.append(f"  {'(every node)' if node == '*' else node}: {node_reasons(status)}")
    suggestions = items(answer, "suggestions")
    if suggestions:
        lines.append("What would make it fit:")
        lines.extend(f"  - {suggestion_text(suggestion)}" for suggestion in suggestions)
    elif explanation is not None and message:
        lines.append("What would make it fit: nothing found that fits now (more GPUs, or fewer pods).")
    if controller_error:
        lines.append(f"({controller_error}; shown: the pod's condition only)")
    return "\n".join(lines)


def render_recommendation(answer: JsonMapping) -> str:
    ref = f"{answer.get('namespace')}/{answer.get('name')}"
    if not answer.get("enabled"):
        error = answer.get("error")
        return f"Workload {ref} has no autoscaling enabled" + (f" ({error})." if error else ".")
    lines = [f"Workload {ref}: autoscaling on, usage from {answer.get('source')}, "
             f"{answer.get('samples', 0)} sample(s) since {answer.get('firstSample') or '-'}."]
    policy = section(answer, "policy")
    for name, label in (("observed", "Observed usage per GPU"), ("estimate", "Estimates (margin added)")):
        view = section(answer, name)
        if view:
            t, v = section(view, "tflops"), section(view, "vram")
            lines.append(f"{label}: TFLOPS target {t.get('target')} (p{_pct(policy.get('target_compute'))}), "
                         f"bounds {t.get('lower')}..{t.get('upper')}; VRAM target {v.get('target')} "
                         f"(p{_pct(policy.get('target_vram'))}), bounds {v.get('lower')}..{v.get('upper')}")
    decision = section(answer, "decision")
    if answer.get("rule"):
        lines.append(f"In force: {answer.get('rule')}")
    if decision:
        lines.append(f"Last decision ({decision.get('at')}): {decision.get('reason')}: {decision.get('message')}")
        lines.append(f"Recommendation: {_share(section(decision, 'share'))}")
    lines.append(f"Original request: {_share(section(answer, 'original'))}")
    for pod, outcome in sorted(section(answer, "workers").items()):
        lines.append(f"  worker {pod}: {outcome}")
    if answer.get("error"):
        lines.append(f"Error: {answer.get('error')}")
    return "\n".join(lines)


def _pct(value: object) -> str:
    return f"{float(value) * 100:g}" if isinstance(value, (int, float)) else "?"


def _share(share: JsonMapping) -> str:
    parts = [f"{side} " + ", ".join(f"{k}={v}" for k, v in section(share, side).items())
             for side in ("requests", "limits") if section(share, side)]
    return "; ".join(parts) or "-"


async def _why_workload(args: argparse.Namespace, name: str) -> int:
    answer, error = await _with_controller(
        args, lambda url: _ask_controller(url, args.namespace, name, "/api/recommendation"))
    if answer is None:
        print(f"{PROG}: workload {args.namespace}/{name}: {error}", file=sys.stderr)
        return 1
    if args.output == "json":
        print(orjson.dumps(answer, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode())
    else:
        print(render_recommendation(answer))
    return 0


async def _why(args: argparse.Namespace) -> int:
    from tfusion.kube.client import KubeError

    lowered = args.pod.lower()
    prefix = next((p for p in WORKLOAD_PREFIXES if lowered.startswith(p)), None)
    if prefix is not None:
        return await _why_workload(args, args.pod[len(prefix):])

    try:
        pod = await _read_pod(args.kube, args.namespace, args.pod)
    except (KubeError, ValueError) as exc:
        print(f"{PROG}: cannot read pod {args.namespace}/{args.pod}: {exc}", file=sys.stderr)
        return 1
    if pod is None:
        print(f"{PROG}: pod {args.namespace}/{args.pod} not found", file=sys.stderr)
        return 1
    explanation: dict[str, Any] | None = None
    controller_error = ""
    if not pod.node_name:
        explanation, controller_error = await _with_controller(
            args, lambda url: _ask_controller(url, args.namespace, args.pod))
    if args.output == "json":
        body = {"pod": {"namespace": pod.namespace, "name": pod.name, "uid": pod.uid,
                        "phase": pod.status.get("phase"), "nodeName": pod.node_name,
                        "gpuIds": pod.meta.annotation(tfa.GPU_IDS) or ""},
                "condition": pod.condition("PodScheduled"), "explanation": explanation,
                "controllerError": controller_error or None}
        print(orjson.dumps(body, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode())
    else:
        origin = await _node_origin(args.kube, pod.node_name) if pod.node_name else ""
        print(render_text(pod, explanation, controller_error, origin))
    return 0


def why_command(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    return anyio.run(_why, args)
