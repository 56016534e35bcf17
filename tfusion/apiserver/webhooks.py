"""Mutating admission wiring: feeds writes to the webhooks registered in MutatingWebhookConfiguration objects.

The calling, matching and patching live in admission.py; this module supplies what only the server
knows: the configurations in its store, the namespace's labels, and where a webhook's Service
is (always loopback here: the Service's port maps to 127.0.0.1:<targetPort or port>), and the
client certificate it presents to webhooks.

The client certificate is what lets a webhook refuse everyone but its API server: kube-apiserver
presents one when its AdmissionConfiguration names a kubeconfig with a client certificate for the
webhook; this server always presents its own. A CA of its own signs it; both live in the state's
meta table (made once, kept across restarts), and the CA certificate is written beside the state
file (`settings.webhook_client_ca_path`), where a controller in the same process (`--role=all`) reads it to verify
its callers.

`PodCreateHold` keeps pod creates out until a controller in the same process has registered its
webhook (`--role=all`; roles.py releases it).
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tfusion.apiserver import errors, security
from tfusion.apiserver.admission import ClientCertificate
from tfusion.apiserver.objects import NAMESPACES, PODS, Engine
from tfusion.apiserver.resources import ResourceInfo
from tfusion.settings import webhook_client_ca_path

CONFIGURATIONS = "admissionregistration.k8s.io/mutatingwebhookconfigurations"
_SKIPPED = {CONFIGURATIONS, "authentication.k8s.io/tokenreviews"}
ADMIN_USER = {"username": "system:admin", "uid": "", "groups": ["system:masters", "system:authenticated"]}
#: the client certificate's subject (what a webhook sees as its caller)
CLIENT_NAME = "tfusion-apiserver"
CLIENT_VALIDITY = dt.timedelta(days=3650)
_META_KEYS = ("webhook-client-ca.crt", "webhook-client.crt", "webhook-client.key")


def issue_client_identity(now: dt.datetime | None = None) -> tuple[bytes, bytes, bytes]:
    """(CA certificate, client certificate, client key), PEM: a fresh CA and a client-auth
    certificate it signed."""
    now = now or dt.datetime.now(dt.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{CLIENT_NAME}-webhook-client-ca")])
    start, end = now - dt.timedelta(minutes=5), now + CLIENT_VALIDITY
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                       crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CLIENT_NAME)]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return ca.public_bytes(serialization.Encoding.PEM), cert.public_bytes(serialization.Encoding.PEM), key_pem


class PodCreateHold:
    """Pod creates answered 503 with `Retry-After: 1` until `release()`.

    Why: in `--role=all` the API server serves a few seconds before the controller in the same
    process has registered its pod webhook. A pod created in that window would be stored as sent,
    never mutated, and stay Pending for good; held, kubectl and client-go retry it by themselves
    (they retry a 503 that carries Retry-After) and it is admitted once the webhook is in place."""

    def __init__(self, reason: str) -> None:
        self.reason: str | None = reason

    def release(self) -> None:
        self.reason = None

    def check(self, operation: str, info: ResourceInfo) -> None:
        if self.reason is not None and operation == "CREATE" and info.storage_key == PODS:
            raise errors.ApiError(503, "ServiceUnavailable", self.reason, headers={"Retry-After": "1"})


class Webhooks:
    def __init__(self, engine: Engine, hold: PodCreateHold | None = None) -> None:
        self.engine = engine
        self.hold = hold
        store = engine.store
        stored = [store.get_meta(key) for key in _META_KEYS]
        found = [value for value in stored if value is not None]
        if len(found) != len(_META_KEYS):
            found = list(issue_client_identity())
            for key, value in zip(_META_KEYS, found, strict=True):
                store.set_meta(key, value)
        ca_pem, cert_pem, key_pem = found
        self.client_ca_pem = ca_pem
        self.client = ClientCertificate(cert_pem, key_pem)
        if store.path != ":memory:":
            security.write_private(webhook_client_ca_path(store.path), ca_pem)

    def resolve_service(self, namespace: str, name: str, port: int) -> str:
        entry = self.engine.store.get("/services", namespace, name)
        if entry is None:
            raise LookupError(f'service "{name}" not found')
        for spec_port in (entry.obj.get("spec") or {}).get("ports") or []:
            if spec_port.get("port") == port:
                target = spec_port.get("targetPort", port)
                if not isinstance(target, int):
                    raise LookupError(f"named targetPort {target!r} cannot be resolved without endpoints")
                return f"127.0.0.1:{target}"
        raise LookupError(f"service {namespace}/{name} has no port {port}")

    async def admit(
        self, operation: str, info: ResourceInfo, obj: dict[str, Any], old: dict[str, Any] | None, dry_run: bool
    ) -> dict[str, Any]:
        if self.hold is not None:
            self.hold.check(operation, info)
        store = self.engine.store
        if info.storage_key in _SKIPPED or store.count(CONFIGURATIONS) == 0:
            return obj
        from tfusion.apiserver.admission import AdmissionAttributes, AdmissionError, run_mutating_webhooks

        configurations = [entry.obj for _, entry in store.items(CONFIGURATIONS)]
        meta = obj.get("metadata") or {}
        namespace = meta.get("namespace", "") if info.namespaced else ""
        labels: dict[str, str] = {}
        if namespace:
            ns_entry = store.get(NAMESPACES, "", namespace)
            labels = dict((ns_entry.obj["metadata"].get("labels") or {}) if ns_entry else {})
        elif info.storage_key == NAMESPACES:
            labels = dict(meta.get("labels") or {})
        attributes = AdmissionAttributes(
            operation=operation,
            group=info.group,
            version=info.version,
            resource=info.plural,
            subresource="",
            kind={"group": info.group, "version": info.version, "kind": info.kind},
            namespace=namespace,
            name=meta.get("name", ""),
            obj=obj,
            old_obj=old,
            user_info=_user_info(),
            dry_run=dry_run,
            options={"kind": f"{operation.title()}Options", "apiVersion": "meta.k8s.io/v1"},
        )
        try:
            return await run_mutating_webhooks(
                configurations, attributes, namespace_labels=labels, resolve_service=self.resolve_service,
                client=self.client,
            )
        except AdmissionError as exc:
            raise errors.ApiError(exc.code, exc.reason, exc.message) from None


def _user_info() -> dict[str, Any]:
    """The requester, as AdmissionReview.request.userInfo names it (the admin has a fresh uid per request)."""
    from tfusion.apiserver.rbac import ADMIN, CURRENT_USER

    user = CURRENT_USER.get()
    if user is ADMIN:
        return dict(ADMIN_USER, uid=str(uuid.uuid4()))
    return user.as_dict()
