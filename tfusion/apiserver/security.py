"""Transport security of the embedded API server: a self-signed serving certificate, the admin bearer token,
and the kubeconfig that carries both to kubectl and the other roles.

Secrets are kept in the state file, so a restart keeps the same certificate, token and kubeconfig.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import os
import secrets
import socket
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

LOOPBACK = {"127.0.0.1", "::1", "localhost"}


def is_loopback(host: str) -> bool:
    if host in LOOPBACK:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def new_token() -> str:
    return secrets.token_urlsafe(32)


def self_signed(host: str) -> tuple[bytes, bytes]:
    """A certificate (PEM) valid for `host`, loopback and this machine's name, and its key (PEM)."""
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [
        x509.DNSName("localhost"),
        x509.DNSName("kubernetes"),
        x509.DNSName("kubernetes.default.svc"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("::1")),
    ]
    hostname = socket.gethostname()
    if hostname:
        names.append(x509.DNSName(hostname.lower()))
    for candidate in {host, _reachable(host)}:
        try:
            address = ipaddress.ip_address(candidate)
        except ValueError:
            if candidate and candidate != "localhost":
                names.append(x509.DNSName(candidate))
            continue
        if not address.is_unspecified and str(address) not in ("127.0.0.1", "::1"):
            names.append(x509.IPAddress(address))
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tfusion-apiserver")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=3650))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def _reachable(host: str) -> str:
    """The address clients should dial for a listen address (wildcards become loopback)."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "::1"
    return host


def server_url(host: str, port: int, tls: bool) -> str:
    reach = _reachable(host)
    if ":" in reach:
        reach = f"[{reach}]"
    return f"{'https' if tls else 'http'}://{reach}:{port}"


def write_private(path: Path, data: bytes) -> None:
    """`data` at `path`, readable by its owner only, and whole: it is written beside the target and
    renamed over it, so a reader that polls for the file (kubectl, a test, a script waiting for the
    kubeconfig) never finds it empty or half written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # O_CREAT's mode applies only to a new file; a leftover may be wider
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def kubeconfig(url: str, *, token: str | None, ca_pem: bytes | None, namespace: str = "default") -> dict[str, Any]:
    cluster: dict[str, Any] = {"server": url}
    if ca_pem is not None:
        cluster["certificate-authority-data"] = base64.b64encode(ca_pem).decode()
    user: dict[str, Any] = {"token": token} if token else {}
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "preferences": {},
        "clusters": [{"name": "tfusion", "cluster": cluster}],
        "users": [{"name": "tfusion", "user": user}],
        "contexts": [{"name": "tfusion", "context": {"cluster": "tfusion", "user": "tfusion", "namespace": namespace}}],
        "current-context": "tfusion",
    }


def write_kubeconfig(path: Path, config: dict[str, Any]) -> None:
    write_private(path, yaml.safe_dump(config, sort_keys=False).encode())
