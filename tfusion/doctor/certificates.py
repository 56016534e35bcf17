"""Does a caBundle verify a serving certificate for a host name, as kube-apiserver would check it?

Pure (no network), so the rule is tested on certificates made in the test: the leaf must chain to
a certificate of the bundle (through the intermediates sent with it), be valid now, and name the
host in its subjectAltName (an IP address as an IP entry, a DNS name exactly or by a `*.` label).
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import ipaddress
from collections.abc import Sequence

from cryptography import x509
from cryptography.exceptions import InvalidSignature

#: how long a chain may be before we stop looking (leaf, intermediates, root)
MAX_DEPTH = 4


def load_bundle(ca_bundle: str) -> list[x509.Certificate]:
    """The certificates of a `caBundle` (base64 of PEM); raises ValueError saying what is wrong."""
    try:
        pem = base64.b64decode(ca_bundle, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("caBundle is not base64") from None
    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError:
        raise ValueError("caBundle holds no PEM certificate") from None


def _issued_by(cert: x509.Certificate, issuer: x509.Certificate) -> bool:
    if cert.issuer != issuer.subject:
        return False
    try:
        cert.verify_directly_issued_by(issuer)
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


def _chains_to(leaf: x509.Certificate, intermediates: Sequence[x509.Certificate],
               bundle: Sequence[x509.Certificate]) -> bool:
    cert = leaf
    for _ in range(MAX_DEPTH):
        if any(_issued_by(cert, ca) for ca in bundle):
            return True
        parent = next((i for i in intermediates if i is not cert and _issued_by(cert, i)), None)
        if parent is None:
            return False
        cert = parent
    return False


def _names(leaf: x509.Certificate) -> tuple[list[str], list[ipaddress.IPv4Address | ipaddress.IPv6Address]]:
    try:
        san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return [], []
    return ([name.lower() for name in san.get_values_for_type(x509.DNSName)],
            [ip for ip in san.get_values_for_type(x509.IPAddress)
             if isinstance(ip, ipaddress.IPv4Address | ipaddress.IPv6Address)])


def _names_host(leaf: x509.Certificate, host: str) -> bool:
    dns, ips = _names(leaf)
    try:
        return ipaddress.ip_address(host.strip("[]")) in ips
    except ValueError:
        pass
    host = host.lower().rstrip(".")
    return any(name == host or (name.startswith("*.") and host.partition(".")[2] == name[2:]) for name in dns)


def verify_serving(chain: Sequence[x509.Certificate], bundle: Sequence[x509.Certificate], host: str,
                   now: dt.datetime) -> str:
    """"" when `bundle` verifies `chain` (leaf first) for `host` at `now`, else why not."""
    if not chain:
        return "no certificate was served"
    leaf = chain[0]
    if not _chains_to(leaf, chain[1:], bundle):
        held = "; ".join(ca.subject.rfc4514_string() for ca in bundle) or "nothing"
        return (f"the certificate (issued by {leaf.issuer.rfc4514_string()}) is not signed by any CA of the "
                f"caBundle (which holds {held})")
    if now < leaf.not_valid_before_utc:
        return f"the certificate is not valid before {leaf.not_valid_before_utc:%Y-%m-%dT%H:%M:%SZ}"
    if now > leaf.not_valid_after_utc:
        return f"the certificate expired at {leaf.not_valid_after_utc:%Y-%m-%dT%H:%M:%SZ}"
    if not _names_host(leaf, host):
        dns, ips = _names(leaf)
        return f"the certificate does not name {host} (it names {', '.join([*dns, *map(str, ips)]) or 'nothing'})"
    return ""
