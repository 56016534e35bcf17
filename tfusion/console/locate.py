"""Finding the leading controller's HTTP API from wherever the user runs `tfusion why` or the console.

Why: what only the leader knows (explanations, current usage) is on its HTTP API, and users should
not have to look up a pod IP or set up a port-forward by hand. The order:

1. a URL the user gave (`--controller`), used as is;
2. `api-url` in the leader-info ConfigMap the leader keeps (kube/leader.py), when its `/healthz`
   answers within the timeout (from inside the cluster, or in `--role=all` on the same host);
3. a port-forward to the leader's pod (`pod`, `pod-namespace` there) through the API server's
   pods/portforward, kept open while the context is; the user's own credentials decide whether
   that is allowed.

When none works, `ControllerNotFound` says what was tried and what to do. tfusion's embedded API
server answers pods/portforward with a 400 Status (it has no kubelet), which ends up there too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx
import httpx_ws  # kr8s's WebSocket client (its pinned version brings it): the upgrade's refusal
from kr8s.asyncio.objects import Pod

from tfusion.api.accessors import section
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient, KubeError, NotFound
from tfusion.kube.leader import API_URL_KEY, LEADER_INFO_CONFIGMAP, POD_KEY, POD_NAMESPACE_KEY

ADVICE = ("pass --controller URL (for example after `kubectl port-forward -n {namespace} pod/{pod} 8080:{port}`, "
          "--controller http://127.0.0.1:8080)")


@dataclass(frozen=True)
class ControllerAddress:
    """Where this process reaches the controller's HTTP API."""

    url: str  # base URL, no trailing slash
    how: str  # "given" | "leader-info" | "port-forward"


class ControllerNotFound(Exception):
    """The controller could not be found; the message says what was tried and what to do."""


@asynccontextmanager
async def locate_controller(client: KubeClient, given: str = "", *, namespace: str = "tensor-fusion-sys",
                            timeout_s: float = 2.0) -> AsyncIterator[ControllerAddress]:
    """The controller's address, valid while the context is open (a port-forward closes with it);
    raises ControllerNotFound. `namespace` is the operator namespace (where the leader-info
    ConfigMap is)."""
    if given:
        if urlsplit(given).scheme not in ("http", "https") or not urlsplit(given).netloc:
            raise ControllerNotFound(f"--controller {given!r}: expected the controller's base URL, "
                                     "http://HOST:PORT or https://HOST:PORT")
        yield ControllerAddress(given.rstrip("/"), "given")
        return
    info = await _leader_info(client, namespace)
    url = info.get(API_URL_KEY, "").rstrip("/")
    if url:
        problem = await _health_problem(url, timeout_s)
        if problem is None:
            yield ControllerAddress(url, "leader-info")
            return
        tried = f"the leader's api-url {url} {problem}"
    else:
        tried = (f"ConfigMap {namespace}/{LEADER_INFO_CONFIGMAP} has no {API_URL_KEY} "
                 "(a controller older than this client, or one that has not served yet)")
    pod, pod_namespace = info.get(POD_KEY, ""), info.get(POD_NAMESPACE_KEY, "") or namespace
    if not pod:
        raise ControllerNotFound(f"cannot reach the controller: {tried}; and the leader runs in no pod "
                                 f"to port-forward to; {_advice(namespace, 'POD', _port(url))}")
    async with _port_forward(client, pod_namespace, pod, _port(url), timeout_s, tried) as local:
        yield ControllerAddress(local, "port-forward")


async def _leader_info(client: KubeClient, namespace: str) -> dict[str, str]:
    try:
        config_map = await client.get(r.CONFIGMAPS, LEADER_INFO_CONFIGMAP, namespace=namespace)
    except NotFound:
        raise ControllerNotFound(f"no leading controller found: ConfigMap {namespace}/{LEADER_INFO_CONFIGMAP}, which "
                                 "the leader writes, does not exist (is the controller running with leader "
                                 "election, in this operator namespace?); pass --controller URL") from None
    except KubeError as exc:
        raise ControllerNotFound(f"cannot read ConfigMap {namespace}/{LEADER_INFO_CONFIGMAP} to find the controller "
                                 f"({exc}); pass --controller URL") from None
    return {str(k): str(v) for k, v in section(config_map, "data").items()}


async def _health_problem(url: str, timeout_s: float) -> str | None:
    """None when `url`/healthz answers 200 within the timeout, else what happened."""
    try:
        async with httpx.AsyncClient(timeout=timeout_s) as http:
            response = await http.get(f"{url}/healthz")
    except httpx.TimeoutException:
        return f"did not answer within {timeout_s:g} s"
    except httpx.HTTPError as exc:
        return f"cannot be reached ({type(exc).__name__}: {exc})"
    if response.status_code != 200:
        return f"answered /healthz with {response.status_code}"
    return None


def _port(url: str) -> int:
    try:
        port = urlsplit(url).port
    except ValueError:
        port = None
    return port or 8080  # the controller's default --controller-listen


def _advice(namespace: str, pod: str, port: int) -> str:
    return ADVICE.format(namespace=namespace, pod=pod, port=port)


@asynccontextmanager
async def _port_forward(client: KubeClient, namespace: str, pod: str, port: int, timeout_s: float,
                        tried: str) -> AsyncIterator[str]:
    """A local URL forwarded to `port` of the pod while open, checked with /healthz."""
    where = f"pod {namespace}/{pod}"

    def not_found(reason: str) -> ControllerNotFound:
        return ControllerNotFound(f"cannot reach the controller: {tried}; and a port-forward to {where} "
                                  f"port {port} failed: {reason}; {_advice(namespace, pod, port)}")

    try:
        target = Pod(await client.get(r.PODS, pod, namespace=namespace), api=client.api)
    except NotFound:
        raise not_found("the pod does not exist (the leader info is stale)") from None
    except KubeError as exc:
        raise not_found(f"cannot read the pod ({exc})") from None
    # kr8s's forward opens the stream per local connection and drops the API server's refusal;
    # one stream opened first says whether the API server forwards at all, and why not
    try:
        async with client.api.open_websocket(version="v1", namespace=namespace, url=f"pods/{pod}/portforward",
                                             params={"ports": str(port)}):
            pass
    except httpx_ws.WebSocketUpgradeError as exc:
        raise not_found(await _refusal(client, namespace, pod, port, exc.response.status_code)) from None
    except (httpx_ws.HTTPXWSException, httpx.HTTPError, OSError) as exc:
        raise not_found(f"the API server's pods/portforward failed ({type(exc).__name__}: {exc})") from None
    async with target.portforward(port, local_port="auto") as local_port:
        local = f"http://127.0.0.1:{local_port}"
        problem = await _health_problem(local, timeout_s)
        if problem is not None:
            raise not_found(f"the forwarded port {problem}")
        yield local


async def _refusal(client: KubeClient, namespace: str, pod: str, port: int, status: int) -> str:
    """What the API server said when it refused the WebSocket upgrade: the same request without
    the upgrade (kubectl's fallback) returns its Status, whose message names the reason."""
    try:
        await client.request("POST", path=f"namespaces/{namespace}/pods/{pod}/portforward",
                             params={"ports": str(port)})
    except KubeError as exc:
        return f"the API server refused it ({exc})"
    return f"the API server refused the WebSocket upgrade with {status}"

