"""A real HTTPS admission-webhook server for tests: its own CA, a server certificate for
loopback and a service DNS name, and a scriptable handler that records every AdmissionReview."""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import functools
import ipaddress
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tfusion.web import bind_socket, serve

#: a webhook rule for pod creates and updates
POD_RULE = {
    "operations": ["CREATE", "UPDATE"],
    "apiGroups": [""],
    "apiVersions": ["v1"],
    "resources": ["pods"],
    "scope": "Namespaced",
}

Handler = Callable[[str, dict[str, Any]], Awaitable[tuple[int, bytes]]]


class CertificateAuthority:
    """A throwaway CA that signs server certificates."""

    def __init__(self, name: str = "tfusion-test-ca") -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = dt.datetime.now(dt.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False)
            .sign(self.key, hashes.SHA256())
        )

    @property
    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def bundle(self) -> str:
        """The CA as a webhook clientConfig.caBundle (base64 of PEM)."""
        return base64.b64encode(self.pem).decode()

    def issue(self, dns_names: list[str], ips: list[str]) -> tuple[bytes, bytes]:
        """(certificate PEM, private key PEM) for a server with these names."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        names: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
        names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns_names[0])]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        key_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        return cert.public_bytes(serialization.Encoding.PEM), key_pem


def review_response(
    review: dict[str, Any],
    *,
    allowed: bool = True,
    patch: list[Any] | None = None,
    status: dict[str, Any] | None = None,
    warnings: list[str] | None = None,
) -> bytes:
    """An AdmissionReview answer to `review`, in the version it was asked in."""
    response: dict[str, Any] = {"uid": review["request"]["uid"], "allowed": allowed}
    if patch is not None:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    if status is not None:
        response["status"] = status
    if warnings:
        response["warnings"] = warnings
    return json.dumps({"apiVersion": review["apiVersion"], "kind": "AdmissionReview", "response": response}).encode()


async def allow_all(path: str, review: dict[str, Any]) -> tuple[int, bytes]:
    return 200, review_response(review)


class WebhookServer:
    """An HTTPS server on 127.0.0.1; set `.handler` to script its answers."""

    def __init__(self, ca: CertificateAuthority, port: int) -> None:
        self.ca = ca
        self.port = port
        self.handler: Handler = allow_all
        self.requests: list[tuple[str, str, dict[str, Any]]] = []  # (path, query, review)

    def url(self, path: str = "/mutate") -> str:
        return f"https://127.0.0.1:{self.port}{path}"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return  # lifespan: uvicorn takes a plain return as "nothing to start or stop"
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        review = json.loads(body)
        self.requests.append((scope["path"], scope["query_string"].decode(), review))
        status, payload = await self.handler(scope["path"], review)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": payload})


@contextlib.asynccontextmanager
async def webhook_server(
    tmp_path: Path, ca: CertificateAuthority, dns_names: list[str] | None = None
) -> AsyncIterator[WebhookServer]:
    """Serve a WebhookServer over HTTPS with a certificate from `ca` until the block ends."""
    names = dns_names or ["localhost", "webhook.tf-test.svc"]
    cert_pem, key_pem = ca.issue(names, ["127.0.0.1"])
    cert_file, key_file = tmp_path / "webhook.crt", tmp_path / "webhook.key"
    cert_file.write_bytes(cert_pem)
    key_file.write_bytes(key_pem)
    sock = bind_socket("127.0.0.1:0")
    server = WebhookServer(ca, sock.getsockname()[1])

    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        # a plain coroutine function: uvicorn takes a bound method for an ASGI2 app
        await server.app(scope, receive, send)

    async with anyio.create_task_group() as tg:
        await tg.start(functools.partial(serve, asgi, sock, ssl_certfile=str(cert_file), ssl_keyfile=str(key_file)))
        try:
            yield server
        finally:
            tg.cancel_scope.cancel()
