"""The external scaler client (tfusion/controller/autoscaler/external.py) against a real HTTP server
started by the test and a Secret in the embedded API server: what it POSTs and with which key, an
answer, "no change", and every failure (timeout, HTTP 500, bad JSON, an answer too large or with a
bad quantity, a missing Secret, a Secret without a usable key) as an ExternalScalerError."""

from __future__ import annotations

import base64
import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.apiserver_fixture import ApiServerHandle
from tests.helpers.controller import kube_client
from tfusion.allocator.request import Resources
from tfusion.api.accessors import Workload
from tfusion.controller.autoscaler.external import MAX_ANSWER_BYTES, ExternalScaler, ExternalScalerError
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient

pytestmark = pytest.mark.anyio

GI = 1 << 30
WORKLOAD = Workload({"metadata": {"name": "llm", "namespace": "default"}})
REQUEST = Resources(tflops=40_000, vram=8 * GI)
LIMIT = Resources(percent=50_000, vram=16 * GI)
SCALE_DOWN = {"needScaleDown": True, "reason": "quiet hours", "recommendedResources": {
    "requests": {"tflops": "10", "vram": "2Gi"}, "limits": {"tflops": "20", "vram": "4Gi"}}}


class Scaler:
    """A scaler on 127.0.0.1: each path answers one way; every request is recorded."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, str], Any]] = []
        self.release = threading.Event()
        scaler = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                scaler.seen.append((self.path, dict(self.headers), body))
                status, answer = scaler.answer(self.path)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def answer(self, path: str) -> tuple[int, bytes]:
        if path == "/slow":
            self.release.wait(10)
        answers: dict[str, tuple[int, bytes]] = {
            "/down": (200, json.dumps(SCALE_DOWN).encode()),
            "/slow": (200, json.dumps(SCALE_DOWN).encode()),
            "/same": (200, json.dumps({"needScaleUp": False, "needScaleDown": False, "reason": "fine"}).encode()),
            "/zero": (200, json.dumps({"needScaleUp": True, "recommendedResources": {
                "requests": {"tflops": "0", "vram": "0"}, "limits": {"tflops": "0", "vram": "0"}}}).encode()),
            "/requests-only": (200, json.dumps({"needScaleUp": True, "recommendedResources": {
                "requests": {"compute": "30", "vram": "12Gi"}}}).encode()),
            "/fail": (500, b"scaler broke"),
            "/garbage": (200, b"{not json"),
            "/huge": (200, b"[" + b"0," * MAX_ANSWER_BYTES + b"0]"),
            "/bad-quantity": (200, json.dumps({"needScaleUp": True, "recommendedResources": {
                "requests": {"tflops": "lots", "vram": "2Gi"}}}).encode()),
        }
        return answers.get(path, (404, b"no such path"))

    @property
    def last(self) -> tuple[str, dict[str, str], Any]:
        return self.seen[-1]


@pytest.fixture(name="scaler")
def scaler_server() -> Iterator[Scaler]:
    scaler = Scaler()
    thread = threading.Thread(target=scaler.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield scaler
    finally:
        scaler.release.set()
        scaler.server.shutdown()
        scaler.server.server_close()


async def create_secret(kube: KubeClient, name: str, data: dict[str, str]) -> None:
    await kube.create(r.SECRETS, {"metadata": {"name": name, "namespace": "default"},
                                  "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}})


async def ask(client: ExternalScaler, url: str, secret: str = "scaler-key") -> tuple[Resources, Resources] | None:
    return await client.recommend(WORKLOAD, url=url, secret_namespace="default", secret_name=secret,
                                  request=REQUEST, limit=LIMIT)


async def test_answers_are_read_and_the_request_is_the_originals(apiserver: ApiServerHandle, scaler: Scaler) -> None:
    async with kube_client(apiserver) as kube:
        await create_secret(kube, "scaler-key", {"apiKey": "s3cret", "other": "x"})
        await create_secret(kube, "only-key", {"password": "p4ss"})
        client = ExternalScaler(kube, timeout_s=5.0)

        assert await ask(client, f"{scaler.url}/down") == (Resources(tflops=10_000, vram=2 * GI),
                                                           Resources(tflops=20_000, vram=4 * GI))
        _, headers, body = scaler.last
        assert headers["Authorization"] == "Bearer s3cret"
        assert headers["Content-Type"] == "application/json"
        assert body == {"workloadName": "llm", "namespace": "default", "currentResources": {
            "requests": {"tflops": "40", "vram": "8Gi"}, "limits": {"tflops": "0", "compute": "50", "vram": "16Gi"}}}

        assert await ask(client, f"{scaler.url}/same") is None
        assert await ask(client, f"{scaler.url}/zero") is None
        only = Resources(percent=30_000, vram=12 * GI)
        assert await ask(client, f"{scaler.url}/requests-only", "only-key") == (only, only)
        assert scaler.last[1]["Authorization"] == "Bearer p4ss"  # the Secret's only key

        await client.recommend(WORKLOAD, url=f"{scaler.url}/same", secret_namespace="", secret_name="",
                               request=REQUEST, limit=LIMIT)
        assert "Authorization" not in scaler.last[1]


@pytest.mark.parametrize(("path", "timeout_s", "message"), [
    ("/slow", 0.5, "no answer within 0.5 s"),
    ("/fail", 5.0, "answered HTTP 500: scaler broke"),
    ("/garbage", 5.0, "the answer is not JSON"),
    ("/huge", 5.0, f"the answer is over {MAX_ANSWER_BYTES} bytes"),
    ("/bad-quantity", 5.0, 'recommendedResources.requests.tflops: "lots" is not a quantity'),
])
async def test_a_failing_scaler_is_an_error(apiserver: ApiServerHandle, scaler: Scaler, path: str,
                                            timeout_s: float, message: str) -> None:
    async with kube_client(apiserver) as kube:
        await create_secret(kube, "scaler-key", {"token": "t0ken"})
        client = ExternalScaler(kube, timeout_s=timeout_s)
        with pytest.raises(ExternalScalerError, match=re.escape("external scaler http://127.0.0.1")) as caught:
            await ask(client, f"{scaler.url}{path}")
        assert message in str(caught.value)
        assert scaler.last[1]["Authorization"] == "Bearer t0ken"


async def test_secret_and_url_problems_are_errors(apiserver: ApiServerHandle, scaler: Scaler) -> None:
    async with kube_client(apiserver) as kube:
        await create_secret(kube, "two-keys", {"user": "a", "password": "b"})
        client = ExternalScaler(kube)
        with pytest.raises(ExternalScalerError, match="Secret default/nope not found"):
            await ask(client, f"{scaler.url}/down", "nope")
        with pytest.raises(ExternalScalerError, match="has keys password, user and none of apiKey, token, key"):
            await ask(client, f"{scaler.url}/down", "two-keys")
        with pytest.raises(ExternalScalerError, match=re.escape("externalScaler.url: 'ftp://x' is not an http")):
            await ask(client, "ftp://x")
        assert scaler.seen == []  # nothing was sent without a key
