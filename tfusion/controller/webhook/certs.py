"""The webhook's TLS certificate without cert-manager: a CA and a serving certificate in a Secret.

Why: kube-apiserver calls a webhook only over HTTPS and checks its certificate against the
caBundle of the MutatingWebhookConfiguration. Every replica serves the webhook, so they must share
one certificate: it lives in the Secret `tensor-fusion-webhook-certs` of the operator namespace
(`ca.crt`, `ca.key`, `tls.crt`, `tls.key`). The first replica to find no Secret creates it; the
others read it (a create or update that loses a race re-reads). The serving certificate names the
webhook Service (`<svc>.<ns>.svc`, `<svc>.<ns>.svc.cluster.local`, `<svc>.<ns>`, `<svc>`) and
every `--webhook-host`; it is renewed when a third of its life or 30 days are left, when a name is
missing or when the CA changes, and the CA when a third of its life or a year is left (the old CA
stays in `ca.crt`,
and so in the caBundle, until it expires, so a replica still serving the old certificate is
trusted meanwhile). The TLS context is reloaded in place (`load_cert_chain`), so new connections
get the new certificate without a restart.

With `--webhook-cert-dir` the given `tls.crt`/`tls.key` are served instead (reloaded when they
change) and no Secret is written.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import logging
import os
import ssl
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tfusion.kube import resources as r
from tfusion.kube.client import AlreadyExists, Conflict, KubeClient, NotFound

log = logging.getLogger(__name__)

SECRET_NAME = "tensor-fusion-webhook-certs"
CA_VALIDITY = dt.timedelta(days=3650)
CERT_VALIDITY = dt.timedelta(days=365)
#: renew when less than this share of the validity is left, or less than the time below
RENEW_FRACTION = 1 / 3
CA_RENEW_BEFORE = dt.timedelta(days=365)
CERT_RENEW_BEFORE = dt.timedelta(days=30)
#: how far back notBefore goes, for clocks slightly behind ours
CLOCK_SKEW = dt.timedelta(minutes=5)
CA_CRT, CA_KEY, TLS_CRT, TLS_KEY = "ca.crt", "ca.key", "tls.crt", "tls.key"

Now = Callable[[], dt.datetime]


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def service_names(service: str, namespace: str) -> list[str]:
    return [f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local", f"{service}.{namespace}",
            service]


def split_hosts(hosts: Sequence[str]) -> tuple[list[str], list[str]]:
    """(DNS names, IP addresses) of a list mixing both."""
    names: list[str] = []
    ips: list[str] = []
    for host in hosts:
        try:
            ips.append(str(ipaddress.ip_address(host)))
        except ValueError:
            names.append(host)
    return names, ips


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def issue_ca(*, now: dt.datetime, validity: dt.timedelta = CA_VALIDITY,
             name: str = "tfusion-webhook-ca") -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM) of a new self-signed CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    usage = x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                          data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                          encipher_only=False, decipher_only=False)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - CLOCK_SKEW).not_valid_after(now + validity)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(usage, critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def issue_serving(ca_pem: bytes, ca_key_pem: bytes, dns_names: Sequence[str], ips: Sequence[str], *,
                  now: dt.datetime, validity: dt.timedelta = CERT_VALIDITY) -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM) of a server certificate for these names, signed by the CA."""
    ca = x509.load_pem_x509_certificate(first_certificate(ca_pem))
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the webhook CA key is not an EC key")
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    common_name = (list(dns_names) or list(ips) or ["tfusion-webhook"])[0]
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name[:64])]))
            .issuer_name(ca.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - CLOCK_SKEW).not_valid_after(now + validity)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def first_certificate(pem: bytes) -> bytes:
    end = b"-----END CERTIFICATE-----"
    index = pem.find(end)
    return pem[: index + len(end)] + b"\n" if index >= 0 else pem


def _certificates(pem: bytes) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(pem) if pem.strip() else []


@dataclass(frozen=True)
class CertBundle:
    """The PEM files of the Secret. `ca_pem` may hold the previous CA after the first."""

    ca_pem: bytes
    ca_key_pem: bytes
    cert_pem: bytes
    key_pem: bytes

    @property
    def ca_bundle(self) -> str:
        """The MutatingWebhookConfiguration's caBundle: base64 of every CA in `ca.crt`."""
        return base64.b64encode(self.ca_pem).decode()

    def certificate(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)

    def ca(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(first_certificate(self.ca_pem))


def _due(cert: x509.Certificate, now: dt.datetime, before: dt.timedelta) -> bool:
    """Whether less than a third of its life, or less than `before`, is left."""
    total = (cert.not_valid_after_utc - cert.not_valid_before_utc).total_seconds()
    left = cert.not_valid_after_utc - now
    return total <= 0 or left < before or left.total_seconds() / total < RENEW_FRACTION


def _names_of(cert: x509.Certificate) -> tuple[set[str], set[str]]:
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set(), set()
    return (set(sans.get_values_for_type(x509.DNSName)),
            {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)})


def renewal_reason(bundle: CertBundle, dns_names: Sequence[str], ips: Sequence[str], now: dt.datetime) -> str:
    """Why the bundle must be renewed ("" when it need not be)."""
    try:
        ca, cert = bundle.ca(), bundle.certificate()
        serialization.load_pem_private_key(bundle.key_pem, password=None)
    except ValueError as exc:
        return f"unreadable ({exc})"
    if _due(ca, now, CA_RENEW_BEFORE):
        return f"the CA expires at {ca.not_valid_after_utc.isoformat()}"
    if cert.issuer != ca.subject or _issuer_key_id(cert) != _key_id(ca):
        return "the certificate was not issued by the current CA"
    if _due(cert, now, CERT_RENEW_BEFORE):
        return f"the certificate expires at {cert.not_valid_after_utc.isoformat()}"
    have_names, have_ips = _names_of(cert)
    missing = (set(dns_names) - have_names) | (set(ips) - have_ips)
    if missing:
        return "the certificate does not name " + ", ".join(sorted(missing))
    return ""


def _key_id(ca: x509.Certificate) -> bytes:
    return x509.SubjectKeyIdentifier.from_public_key(ca.public_key()).digest


def _issuer_key_id(cert: x509.Certificate) -> bytes | None:
    try:
        return cert.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value.key_identifier
    except x509.ExtensionNotFound:
        return None


def renew(old: CertBundle | None, dns_names: Sequence[str], ips: Sequence[str], now: dt.datetime) -> CertBundle:
    """A bundle with a fresh serving certificate; a fresh CA too when the old one is near its end
    (the old CA then stays in ca.crt until it expires)."""
    keep_ca = old is not None and _ca_usable(old, now)
    if old is not None and keep_ca:
        ca_pem, ca_key_pem = old.ca_pem, old.ca_key_pem
    else:
        ca_pem, ca_key_pem = issue_ca(now=now)
        if old is not None:
            ca_pem += b"".join(c.public_bytes(serialization.Encoding.PEM) for c in _still_valid(old.ca_pem, now))
    cert_pem, key_pem = issue_serving(ca_pem, ca_key_pem, dns_names, ips, now=now)
    return CertBundle(ca_pem, ca_key_pem, cert_pem, key_pem)


def _ca_usable(bundle: CertBundle, now: dt.datetime) -> bool:
    try:
        serialization.load_pem_private_key(bundle.ca_key_pem, password=None)
        return not _due(bundle.ca(), now, CA_RENEW_BEFORE)
    except ValueError:
        return False


def _still_valid(pem: bytes, now: dt.datetime) -> list[x509.Certificate]:
    try:
        return [c for c in _certificates(pem) if c.not_valid_after_utc > now][:2]
    except ValueError:
        return []


def tls_context() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def load_into(context: ssl.SSLContext, cert_pem: bytes, key_pem: bytes) -> None:
    """`load_cert_chain` reads files only: write both to a private temporary directory, load, delete."""
    with tempfile.TemporaryDirectory(prefix="tfusion-webhook-") as directory:
        cert_file, key_file = Path(directory) / TLS_CRT, Path(directory) / TLS_KEY
        cert_file.write_bytes(cert_pem)
        key_file.touch(mode=0o600)
        key_file.write_bytes(key_pem)
        context.load_cert_chain(str(cert_file), str(key_file))


def _decode(secret: dict[str, object]) -> CertBundle | None:
    data = secret.get("data")
    if not isinstance(data, dict):
        return None
    try:
        values = [base64.b64decode(str(data.get(k) or "")) for k in (CA_CRT, CA_KEY, TLS_CRT, TLS_KEY)]
    except ValueError:
        return None
    return CertBundle(*values) if all(values) else None


def _encode(bundle: CertBundle) -> dict[str, str]:
    pairs = {CA_CRT: bundle.ca_pem, CA_KEY: bundle.ca_key_pem, TLS_CRT: bundle.cert_pem, TLS_KEY: bundle.key_pem}
    return {k: base64.b64encode(v).decode() for k, v in pairs.items()}


class SecretCertificates:
    """Keeps the Secret's bundle valid and the TLS context serving it (see the module docstring)."""

    managed_ca = True

    def __init__(self, client: KubeClient, namespace: str, hosts: Sequence[str], *,
                 context: ssl.SSLContext | None = None, secret_name: str = SECRET_NAME, now: Now = _utcnow) -> None:
        self.client = client
        self.namespace = namespace
        self.secret_name = secret_name
        self.dns_names, self.ips = split_hosts(hosts)
        self.context = context or tls_context()
        self.now = now
        self.bundle: CertBundle | None = None
        self.renewals = 0

    @property
    def ca_bundle(self) -> str | None:
        return self.bundle.ca_bundle if self.bundle is not None else None

    async def refresh(self) -> bool:
        """Read the Secret, renew what is due, serve the result; True when the certificate changed."""
        for _ in range(5):
            try:
                bundle = await self._current_or_renewed()
            except Conflict:
                continue  # another replica wrote first: read what it wrote
            return self._serve(bundle)
        raise Conflict({"message": f"Secret {self.namespace}/{self.secret_name} kept changing"}, 409)

    async def _current_or_renewed(self) -> CertBundle:
        try:
            secret = await self.client.get(r.SECRETS, self.secret_name, namespace=self.namespace)
        except NotFound:
            bundle = renew(None, self.dns_names, self.ips, self.now())
            await self._create(bundle)
            log.info("webhook certificate created in Secret %s/%s", self.namespace, self.secret_name)
            return bundle
        current = _decode(secret)
        reason = renewal_reason(current, self.dns_names, self.ips, self.now()) if current else "it is incomplete"
        if not reason and current is not None:
            return current
        bundle = renew(current, self.dns_names, self.ips, self.now())
        await self.client.replace(r.SECRETS, {**secret, "type": secret.get("type") or "Opaque",
                                              "data": _encode(bundle)}, namespace=self.namespace)
        self.renewals += 1
        log.info("webhook certificate in Secret %s/%s renewed: %s", self.namespace, self.secret_name, reason)
        return bundle

    async def _create(self, bundle: CertBundle) -> None:
        body = {"metadata": {"name": self.secret_name, "namespace": self.namespace,
                             "labels": {"app.kubernetes.io/managed-by": "tfusion"}},
                "type": "Opaque", "data": _encode(bundle)}
        try:
            await self.client.create(r.SECRETS, body, namespace=self.namespace)
        except AlreadyExists:
            raise Conflict({"message": "created meanwhile"}, 409) from None

    def _serve(self, bundle: CertBundle) -> bool:
        if self.bundle is not None and self.bundle.cert_pem == bundle.cert_pem:
            self.bundle = bundle
            return False
        load_into(self.context, bundle.cert_pem, bundle.key_pem)
        self.bundle = bundle
        return True


class DirectoryCertificates:
    """`--webhook-cert-dir`: serve tls.crt/tls.key from a directory, reloading them when they change;
    the caBundle is someone else's (cert-manager's CA injector)."""

    managed_ca = False
    ca_bundle: str | None = None

    def __init__(self, directory: str, *, context: ssl.SSLContext | None = None) -> None:
        self.directory = Path(directory).expanduser()
        self.context = context or tls_context()
        self._stamp: tuple[float, float] | None = None

    def _files(self) -> tuple[Path, Path]:
        return self.directory / TLS_CRT, self.directory / TLS_KEY

    async def refresh(self) -> bool:
        cert_file, key_file = self._files()
        try:
            stamp = (os.stat(cert_file).st_mtime, os.stat(key_file).st_mtime)
        except OSError as exc:
            raise FileNotFoundError(f"--webhook-cert-dir {self.directory}: {exc.strerror}: "
                                    f"{exc.filename}; expected {TLS_CRT} and {TLS_KEY} there") from None
        if stamp == self._stamp:
            return False
        self.context.load_cert_chain(str(cert_file), str(key_file))
        self._stamp = stamp
        log.info("webhook certificate loaded from %s", self.directory)
        return True
