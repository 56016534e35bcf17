"""Only the API server gets the webhook to answer: with `--webhook-client-ca` naming the embedded
API server's webhook client CA, pods created through the API server are mutated as before, while a
caller with no client certificate, or with one from another CA, is refused in the TLS handshake and
writes nothing."""

from __future__ import annotations

import base64
import ssl
import tempfile
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import eventually
from tests.helpers.controller import controllers
from tests.helpers.webhook import (
    BARE,
    kube_with_webhook_objects,  # noqa: F401  (the `kube` fixture of these tests)
    pod,
    serve_webhook,
    webhook_settings,
)
from tfusion.api import annotations as tfa
from tfusion.apiserver.webhooks import issue_client_identity
from tfusion.controller.webhook.server import PATH
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient
from tfusion.settings import webhook_client_ca_path

pytestmark = pytest.mark.anyio


def review(name: str) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": name, "operation": "CREATE", "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": "default", "object": pod(name, BARE)}}


def client_context(ca_bundle: str, identity: tuple[bytes, bytes] | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cadata=base64.b64decode(ca_bundle).decode())
    if identity is not None:
        with tempfile.TemporaryDirectory() as directory:
            cert, key = Path(directory) / "c.crt", Path(directory) / "c.key"
            cert.write_bytes(identity[0])
            key.write_bytes(identity[1])
            context.load_cert_chain(str(cert), str(key))
    return context


async def test_only_the_api_servers_certificate_gets_an_answer(apiserver: Any, kube: KubeClient,
                                                               tmp_path: Path) -> None:
    ca_file = webhook_client_ca_path(apiserver.state)
    assert ca_file.exists(), "the embedded API server writes its webhook client CA beside its state"
    async with controllers() as tg:
        ctl = await serve_webhook(tg, kube, webhook_settings(apiserver, tmp_path, webhook_client_ca=str(ca_file)))
        webhook = ctl.runtime.webhook
        assert webhook is not None and webhook.client_ca == ca_file
        created = await kube.create(r.PODS, pod("through-the-api", BARE), namespace="default")
        assert created["metadata"]["labels"][tfa.COMPONENT] == "worker"  # the API server's call was answered

        _, stranger_cert, stranger_key = issue_client_identity()
        for name, identity in (("no-cert", None), ("other-ca", (stranger_cert, stranger_key))):
            context = client_context(webhook.certs.ca_bundle or "", identity)
            async with httpx.AsyncClient(base_url=f"https://localhost:{webhook.address[1]}", verify=context,
                                         timeout=10) as http:
                with pytest.raises(httpx.TransportError):
                    await http.post(PATH, json=review(name))

        async def names() -> list[str]:
            return [w["metadata"]["name"] for w in await kube.list(r.TENSORFUSIONWORKLOADS, namespace="default")]

        await eventually(names, what="the admitted pod's workload")  # the pod reconciler makes it
        assert await names() == ["through-the-api"]
