"""pods/log, pods/exec, pods/attach and pods/portforward: answered with a Status, never streamed.

In kube-apiserver these four subresources are proxies to the kubelet of the pod's node. The node
`tfusion --role=all` simulates runs no containers, so there is nothing to proxy to: every such
request gets a 400 BadRequest Status that says so and names the pod and container (kubectl prints
it as "Error from server (BadRequest): ..."), after the same checks kube makes first — the pod must
exist (404 NotFound otherwise) and a named container must be one of the pod's.

kubectl opens exec, attach and port-forward as a WebSocket (falling back to SPDY, a POST with an
Upgrade header, which is answered as plain HTTP). A WebSocket request is refused before its
handshake with the same Status as an HTTP answer (the ASGI `websocket.http.response` extension), so
the client reads the reason, falls back, and gets it again over plain HTTP; the server never leaves
a handshake half done.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from tfusion.api.accessors import Pod
from tfusion.apiserver import errors
from tfusion.apiserver.asgi import Receive, Scope, Send
from tfusion.apiserver.errors import ApiError
from tfusion.apiserver.objects import Engine

#: the pod subresources a kubelet serves; the value is what the refusal says could not be done
SUBRESOURCES = {
    "log": "has no logs",
    "exec": "cannot run a command",
    "attach": "cannot be attached to",
    "portforward": "cannot forward ports",
}
_METHODS = {"log": ("GET",), "exec": ("GET", "POST"), "attach": ("GET", "POST"), "portforward": ("GET", "POST")}
_DEFAULT_CONTAINER = "kubectl.kubernetes.io/default-container"
_WHY = "tfusion's embedded API server has no kubelet to ask, and the node it simulates runs no containers"


def match(group: str, version: str, rest: list[str]) -> tuple[str, str, str] | None:
    """(namespace, pod, subresource) when the path after /api/v1 names one of these subresources."""
    if group or version != "v1" or len(rest) != 5:
        return None
    if rest[0] != "namespaces" or rest[2] != "pods" or rest[4] not in SUBRESOURCES:
        return None
    return rest[1], rest[3], rest[4]


def refusal(engine: Engine, method: str, where: tuple[str, str, str], params: dict[str, str]) -> ApiError:
    """The Status this request gets: 405 for a method the subresource lacks, 404 for a missing pod,
    400 for a container the pod does not have, else 400 saying no container runs."""
    namespace, name, subresource = where
    if method not in _METHODS[subresource]:
        return errors.method_not_allowed(method)
    info = engine.registry.get("", "v1", "pods")
    assert info is not None  # pods are always served
    try:
        pod = Pod(engine.get(info, namespace, name).obj)
    except ApiError as exc:
        return exc
    what = SUBRESOURCES[subresource]
    if subresource == "portforward":
        return errors.bad_request(f'pod "{name}" {what}: {_WHY}')
    container = params.get("container", "") or _default_container(pod)
    names = [c.get("name") for c in (*pod.init_containers, *pod.containers)]
    if container not in names:
        return errors.bad_request(f'pod "{name}" has no container named "{container}"')
    return errors.bad_request(f'container "{container}" in pod "{name}" {what}: {_WHY}')


def _default_container(pod: Pod) -> str:
    chosen = pod.meta.annotation(_DEFAULT_CONTAINER)
    if chosen:
        return chosen
    first = next(iter(pod.containers), None)
    name = first.get("name") if first is not None else None
    return name if isinstance(name, str) else ""


HttpApp = Callable[[Scope, Receive, Send], Awaitable[None]]


async def websocket(http: HttpApp, scope: Scope, receive: Receive, send: Send) -> None:
    """Serve a WebSocket request as the HTTP GET it upgrades: `http` answers it (authentication,
    RBAC and routing as for any request) and that answer goes back as the handshake's refusal."""
    await receive()  # websocket.connect
    http_scope = {**scope, "type": "http", "method": "GET", "http_version": "1.1"}
    parts = [p for p in str(scope.get("path", "")).split("/") if p]
    if "websocket.http.response" not in scope.get("extensions", {}) or (
        parts[:2] != ["api", "v1"] or match("", "v1", parts[2:]) is None
    ):
        # nothing else is served over a WebSocket, and without the extension there is no way to
        # refuse with a body: close before the handshake (the client sees 403)
        await send({"type": "websocket.close", "code": 1008, "reason": "not served"})
        return

    async def no_body() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def as_refusal(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            await send({"type": "websocket.http.response.start", "status": message["status"],
                        "headers": message.get("headers", [])})
        elif message["type"] == "http.response.body":
            await send({"type": "websocket.http.response.body", "body": message.get("body", b""),
                        "more_body": message.get("more_body", False)})

    await http(http_scope, no_body, as_refusal)
