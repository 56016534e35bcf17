"""Mutating admission wiring: feeds writes to the webhooks registered in MutatingWebhookConfiguration objects.

The calling, matching and patching live in admission.py; this module supplies what only the server
knows: the configurations in its store, the namespace's labels, and where a webhook's Service
is (always loopback here: the Service's port maps to 127.0.0.1:<targetPort or port>).
"""

from __future__ import annotations

import uuid
from typing import Any

from tfusion.apiserver import errors
from tfusion.apiserver.objects import NAMESPACES, Engine
from tfusion.apiserver.resources import ResourceInfo

CONFIGURATIONS = "admissionregistration.k8s.io/mutatingwebhookconfigurations"
_SKIPPED = {CONFIGURATIONS, "authentication.k8s.io/tokenreviews"}
ADMIN_USER = {"username": "system:admin", "uid": "", "groups": ["system:masters", "system:authenticated"]}


class Webhooks:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

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
                configurations, attributes, namespace_labels=labels, resolve_service=self.resolve_service
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
