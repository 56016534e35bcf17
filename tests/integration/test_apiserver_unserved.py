"""What the embedded API server does not serve, answered as kube-apiserver would answer it.

pods/log, exec, attach and portforward get a 400 Status saying the simulated node runs no
containers (404 for a missing pod, 403 without RBAC for the subresource), over plain HTTP and as
the refusal of a WebSocket handshake, with nothing logged by uvicorn. A kind that is not served
gets kubectl's "no matches for kind" (its /openapi/v2 download is answered in protobuf), while
`kubectl explain` keeps working.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import httpx
import orjson
import pytest

from tests.apiserver_fixture import ApiServerHandle, apply_crds_sync
from tests.helpers.kubectl import Kubectl, needs_kubectl

PODS = "/api/v1/namespaces/default/pods"
NO_CONTAINERS = "runs no containers"
UNSERVED = """apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: agent}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: agent}
  maxReplicas: 3
"""


@pytest.fixture
def uvicorn_records(caplog: pytest.LogCaptureFixture) -> Iterator[list[logging.LogRecord]]:
    """What uvicorn logs at WARNING or above while the test runs (its loggers do not propagate)."""
    loggers = [logging.getLogger(name) for name in ("uvicorn", "uvicorn.error")]
    for logger in loggers:
        logger.addHandler(caplog.handler)
    try:
        yield caplog.records
    finally:
        for logger in loggers:
            logger.removeHandler(caplog.handler)


def _warnings(records: list[logging.LogRecord]) -> list[str]:
    return [r.getMessage() for r in records if r.levelno >= logging.WARNING and r.name.startswith("uvicorn")]


def _pod(admin: httpx.Client, name: str, containers: tuple[str, ...] = ("app",)) -> None:
    body = {"metadata": {"name": name}, "spec": {"containers": [{"name": c, "image": "busybox"} for c in containers]}}
    created = admin.post(PODS, json=body)
    assert created.status_code == 201, created.text


def _status(response: httpx.Response, code: int, reason: str) -> str:
    """Assert a kube Status of this code and reason; its message."""
    assert response.status_code == code, response.text
    body = response.json()
    assert (body["kind"], body["code"], body["reason"]) == ("Status", code, reason), body
    return str(body["message"])


def test_log_exec_attach_and_portforward_answer_a_status_naming_pod_and_container(
        apiserver: ApiServerHandle, uvicorn_records: list[logging.LogRecord]) -> None:
    with apiserver.sync_http() as admin:
        _pod(admin, "web", ("app", "sidecar"))
        log = _status(admin.get(f"{PODS}/web/log"), 400, "BadRequest")
        assert '"app"' in log and '"web"' in log and NO_CONTAINERS in log
        chosen = _status(admin.get(f"{PODS}/web/log", params={"container": "sidecar"}), 400, "BadRequest")
        assert '"sidecar"' in chosen
        for sub in ("exec", "attach"):
            for method in ("GET", "POST"):
                answer = _status(admin.request(method, f"{PODS}/web/{sub}", params={"container": "app"}),
                                 400, "BadRequest")
                assert '"app"' in answer and NO_CONTAINERS in answer
        forward = _status(admin.post(f"{PODS}/web/portforward", params={"ports": "80"}), 400, "BadRequest")
        assert '"web"' in forward and NO_CONTAINERS in forward
        wrong = _status(admin.get(f"{PODS}/web/log", params={"container": "db"}), 400, "BadRequest")
        assert '"db"' in wrong and NO_CONTAINERS not in wrong
        _status(admin.post(f"{PODS}/web/log"), 405, "MethodNotAllowed")
        missing = admin.get(f"{PODS}/gone/log")
        assert 'pods "gone" not found' in _status(missing, 404, "NotFound")
        assert missing.json()["details"] == {"name": "gone", "kind": "pods"}
        _status(admin.post(f"{PODS}/gone/exec"), 404, "NotFound")
    assert _warnings(uvicorn_records) == []


def _handshake(apiserver: ApiServerHandle, path: str, token: str, upgrade: str = "websocket") -> tuple[int, bytes]:
    """A raw upgrade request (WebSocket, or SPDY as kubectl's fallback sends it): (status, body)."""
    url = urlparse(apiserver.url)
    host, port = url.hostname or "127.0.0.1", url.port or 443
    method = "GET" if upgrade == "websocket" else "POST"
    head = [f"{method} {path} HTTP/1.1", f"host: {host}:{port}", "connection: Upgrade", f"upgrade: {upgrade}",
            f"authorization: Bearer {token}", "content-length: 0"]
    if upgrade == "websocket":
        head += ["sec-websocket-version: 13", "sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==",
                 "sec-websocket-protocol: v5.channel.k8s.io"]
    with socket.create_connection((host, port), timeout=10) as raw, \
            apiserver.ssl_context.wrap_socket(raw, server_hostname=host) as conn:
        conn.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            assert chunk, f"connection closed before a response head: {data!r}"
            data += chunk
        response_head, _, body = data.partition(b"\r\n\r\n")
        lines = response_head.decode("latin-1").split("\r\n")
        headers = dict(line.lower().split(": ", 1) for line in lines[1:])
        while len(body) < int(headers.get("content-length", "0")):
            chunk = conn.recv(65536)
            assert chunk, "connection closed mid-body"
            body += chunk
    return int(lines[0].split()[1]), body


def test_websocket_and_spdy_upgrades_are_refused_with_the_status_and_nothing_logged(
        apiserver: ApiServerHandle, uvicorn_records: list[logging.LogRecord]) -> None:
    with apiserver.sync_http() as admin:
        _pod(admin, "web")
    for path, code in ((f"{PODS}/web/exec?command=true&container=app&stdout=1", 400),
                       (f"{PODS}/web/attach?container=app", 400),
                       (f"{PODS}/web/portforward?ports=80", 400),
                       (f"{PODS}/gone/exec?command=true", 404)):
        for upgrade in ("websocket", "SPDY/3.1"):
            status, body = _handshake(apiserver, path, apiserver.token, upgrade)
            assert status == code, (path, upgrade, body)
            answer = orjson.loads(body)
            assert answer["kind"] == "Status" and answer["code"] == code, answer
    status, _ = _handshake(apiserver, f"{PODS}?watch=1", apiserver.token)
    assert status == 403  # nothing else is served over a WebSocket
    assert _warnings(uvicorn_records) == []


def test_pods_log_and_exec_go_through_rbac_like_any_subresource(apiserver: ApiServerHandle) -> None:
    with apiserver.sync_http() as admin:
        _pod(admin, "web")
        assert admin.post("/api/v1/namespaces/default/serviceaccounts",
                          json={"metadata": {"name": "viewer"}}).status_code == 201
        issued = admin.post("/api/v1/namespaces/default/serviceaccounts/viewer/token", json={"spec": {}})
        token = str(issued.json()["status"]["token"])
        rbac = "/apis/rbac.authorization.k8s.io/v1/namespaces/default"
        rules = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]
        assert admin.post(f"{rbac}/roles", json={"metadata": {"name": "viewer"}, "rules": rules}).status_code == 201
        bound = admin.post(f"{rbac}/rolebindings", json={
            "metadata": {"name": "viewer"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "viewer"},
            "subjects": [{"kind": "ServiceAccount", "name": "viewer", "namespace": "default"}]})
        assert bound.status_code == 201, bound.text
        with httpx.Client(base_url=apiserver.url, verify=apiserver.ssl_context, timeout=10,
                          headers={"authorization": f"Bearer {token}"}) as viewer:
            assert viewer.get(f"{PODS}/web").status_code == 200
            denied = _status(viewer.get(f"{PODS}/web/log"), 403, "Forbidden")
            assert "pods/log" in denied
            status, body = _handshake(apiserver, f"{PODS}/web/exec?command=true", token)
            assert status == 403 and b"pods/exec" in body
            rules.append({"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]})
            granted = admin.put(f"{rbac}/roles/viewer", json={"metadata": {"name": "viewer"}, "rules": rules})
            assert granted.status_code == 200, granted.text
            assert NO_CONTAINERS in _status(viewer.get(f"{PODS}/web/log"), 400, "BadRequest")


def test_openapi_v2_is_protobuf_only_when_asked_for(apiserver: ApiServerHandle) -> None:
    with apiserver.sync_http() as admin:
        plain = admin.get("/openapi/v2")
        assert plain.headers["content-type"] == "application/json" and plain.json()["swagger"] == "2.0"
        proto = admin.get("/openapi/v2", headers={
            "accept": "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"})
        assert proto.status_code == 200 and proto.headers["content-type"].endswith("+protobuf")
        assert proto.content.startswith(b"\n\x032.0")  # field 1 (swagger), "2.0"
        assert b"x-kubernetes-group-version-kind" in proto.content
        v3 = admin.get("/openapi/v3", headers={"accept": "application/com.github.proto-openapi.spec.v3@v1.0+protobuf"})
        assert v3.headers["content-type"] == "application/json"


@needs_kubectl
def test_kubectl_logs_exec_and_port_forward_print_why(
        apiserver: ApiServerHandle, tmp_path: Path, uvicorn_records: list[logging.LogRecord]) -> None:
    kubectl = Kubectl(apiserver.kubeconfig, tmp_path / "cache")
    assert kubectl("run", "plain", "--image=busybox", "--", "sleep", "3600", check=False).returncode == 0
    for args in (("logs", "plain"), ("exec", "plain", "--", "true")):
        result = kubectl(*args, check=False)
        assert result.returncode != 0
        assert "Error from server (BadRequest)" in result.stderr and NO_CONTAINERS in result.stderr, result.stderr
        assert '"plain"' in result.stderr
    running = kubectl("patch", "pod", "plain", "--subresource=status", "--type=merge",
                      "-p", '{"status":{"phase":"Running"}}', check=False)
    assert running.returncode == 0, running.stderr
    forward = kubectl("port-forward", "pod/plain", ":80", check=False)
    assert forward.returncode != 0 and NO_CONTAINERS in forward.stderr, forward.stderr
    missing = kubectl("logs", "nobody", check=False)
    assert missing.returncode != 0 and 'pods "nobody" not found' in missing.stderr
    assert _warnings(uvicorn_records) == []


@needs_kubectl
def test_kubectl_meets_an_unserved_kind_as_kube_would_and_still_explains(
        apiserver: ApiServerHandle, tmp_path: Path) -> None:
    kubectl = Kubectl(apiserver.kubeconfig, tmp_path / "cache")
    listed = kubectl("get", "horizontalpodautoscalers", check=False)
    assert listed.returncode != 0
    assert 'the server doesn\'t have a resource type "horizontalpodautoscalers"' in listed.stderr, listed.stderr
    applied = kubectl("apply", "-f", "-", input=UNSERVED, check=False)
    assert applied.returncode != 0
    assert 'no matches for kind "HorizontalPodAutoscaler" in version "autoscaling/v2"' in applied.stderr, \
        applied.stderr
    assert "openapi" not in applied.stderr
    v2 = kubectl("explain", "pods", "--output=plaintext-openapiv2", check=False)  # parses the protobuf document
    assert v2.returncode == 0 and "Pod" in v2.stdout, v2.stderr
    apply_crds_sync(apiserver)
    explained = kubectl("explain", "gpupool.spec", check=False)
    assert explained.returncode == 0 and "GPUPool" in explained.stdout, explained.stderr
