"""In `--role=all`, the controller and the hypervisor run as their own ServiceAccounts.

The embedded API server enforces RBAC (tfusion/apiserver/rbac.py). At bootstrap `apply_rbac` writes
the ServiceAccounts, ClusterRoles, Roles and bindings that deploy/ ships (rbac.yaml here is a copy
a test keeps identical); `role_managers` then mints a token for each role's ServiceAccount and
gives the role a Manager of its own that uses it, exactly as the two would run in a cluster. Every
`--role=all` run, the end-to-end suite included, therefore proves the shipped permissions: a
missing rule is a 403 that the API server logs as an error. `--embedded-identities=admin` keeps
the old behaviour (one Manager, the admin token) as an opt-out.

RBAC cannot say "only this node's GPUs"; the ValidatingAdmissionPolicy deploy/ ships for that
(admissionpolicy.yaml here, another identical copy) is applied with the RBAC, and the hypervisor's
token is bound to its Node, so that it names the node as a pod's token does in a cluster: the
embedded API server then holds the hypervisor to its own node's GPUs and GPUNode as a cluster would.
"""

from __future__ import annotations

import base64
import logging
import threading
from collections.abc import Collection, Iterator
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

from tfusion.api.accessors import Body, items, section, text
from tfusion.api.jsontypes import JsonMapping, JsonObject
from tfusion.apiserver import security
from tfusion.errors import RoleError
from tfusion.kube.client import AlreadyExists, KubeClient, KubeError, NotFound
from tfusion.kube.manager import Manager
from tfusion.kube.resources import NODES, SERVICEACCOUNTS, ApiResource
from tfusion.settings import Settings

log = logging.getLogger(__name__)

RBAC_FILE = Path(__file__).with_name("rbac.yaml")
#: the ValidatingAdmissionPolicy and its binding (deploy/base/hypervisor/admissionpolicy.yaml)
POLICY_FILE = Path(__file__).with_name("admissionpolicy.yaml")
#: the ServiceAccount each role runs as (deploy/base/*/rbac.yaml)
ROLE_ACCOUNTS = {"controller": "tensor-fusion-operator", "hypervisor": "tensor-fusion-hypervisor-sa"}
#: a year: the token lives in this process and in a 0600 kubeconfig beside the state; it is minted
#: again at every start and stops working when its ServiceAccount is deleted
TOKEN_SECONDS = 365 * 24 * 3600
SERVICE_ACCOUNTS = "service-accounts"

_RBAC = "rbac.authorization.k8s.io"
_ADMISSION = "admissionregistration.k8s.io"
_KINDS: dict[str, ApiResource] = {
    "ServiceAccount": SERVICEACCOUNTS,
    "Role": ApiResource(_RBAC, "v1", "roles", "Role", True),
    "RoleBinding": ApiResource(_RBAC, "v1", "rolebindings", "RoleBinding", True),
    "ClusterRole": ApiResource(_RBAC, "v1", "clusterroles", "ClusterRole", False),
    "ClusterRoleBinding": ApiResource(_RBAC, "v1", "clusterrolebindings", "ClusterRoleBinding", False),
    "ValidatingAdmissionPolicy": ApiResource(_ADMISSION, "v1", "validatingadmissionpolicies",
                                          "ValidatingAdmissionPolicy", False),
    "ValidatingAdmissionPolicyBinding": ApiResource(_ADMISSION, "v1", "validatingadmissionpolicybindings",
                                                 "ValidatingAdmissionPolicyBinding", False),
}


def shipped_rbac(namespace: str) -> list[Body]:
    """The shipped RBAC objects, placed in `namespace` (as kustomize's namespace setting does)."""
    docs = [d for d in yaml.safe_load_all(RBAC_FILE.read_text(encoding="utf-8")) if d]
    for doc in docs:  # our own file, placed before anything reads it: its shape is known
        if _KINDS[doc["kind"]].namespaced:
            doc["metadata"]["namespace"] = namespace
        for subject in doc.get("subjects") or []:
            if subject.get("kind") == "ServiceAccount":
                subject["namespace"] = namespace
    return [Body(doc) for doc in docs]


def shipped_policies() -> list[Body]:
    """The shipped admission policy and its binding (cluster-scoped: no namespace to place)."""
    return [Body(d) for d in yaml.safe_load_all(POLICY_FILE.read_text(encoding="utf-8")) if d]


async def apply_rbac(client: KubeClient, namespace: str) -> int:
    """Create or update every shipped RBAC object, and the admission policy that narrows what the
    hypervisor's RBAC allows; returns how many were written."""
    written = 0
    for doc in shipped_rbac(namespace) + shipped_policies():
        resource = _KINDS[doc.kind]
        ns = namespace if resource.namespaced else None
        try:
            await client.create(resource, doc.raw, namespace=ns)
            written += 1
            continue
        except AlreadyExists:
            pass
        current = await client.get(resource, doc.name, namespace=ns)
        wanted = {k: v for k, v in doc.raw.items() if k != "metadata"}
        if doc.kind == "ServiceAccount" or all(current.get(k) == v for k, v in wanted.items()):
            continue  # a ServiceAccount keeps its uid (its tokens stay valid); equal RBAC needs no write
        updated = {**current, **wanted}
        await client.replace(resource, updated, namespace=ns)
        written += 1
    return written


def uses_service_accounts(settings: Settings, embedded: bool) -> bool:
    return embedded and settings.embedded_identities == SERVICE_ACCOUNTS


async def role_managers(settings: Settings, roles: Collection[str], admin: Manager, *,
                        embedded: bool) -> dict[str, Manager]:
    """A Manager per role that runs as its own ServiceAccount (none when the admin token is used)."""
    if not uses_service_accounts(settings, embedded):
        return {}
    managers: dict[str, Manager] = {}
    base = Path(settings.kube).expanduser()  # the admin kubeconfig the embedded API server wrote
    admin_config = yaml.safe_load(base.read_text(encoding="utf-8"))
    for role in (r for r in roles if r in ROLE_ACCOUNTS):
        account = ROLE_ACCOUNTS[role]
        try:
            token = await _role_token(admin.client, settings, role, account)
            path = base.with_name(f"{base.name}.{role}")
            security.write_kubeconfig(path, _with_token(admin_config, token, settings.operator_namespace))
            managers[role] = await Manager.connect(settings.replace(kube=str(path)))
        except (KubeError, ValueError) as exc:
            raise RoleError(f"{role}: cannot run as ServiceAccount {settings.operator_namespace}/{account}: {exc} "
                            "(--embedded-identities=admin runs it with the admin token)") from None
        log.info("%s talks to the embedded API server as system:serviceaccount:%s:%s", role,
                 settings.operator_namespace, account)
    # the admin Manager keeps only the embedded stage (the simulated kubelet and the stand-ins for
    # kube-controller-manager): it needs no Lease, which is the controller's alone now
    admin.settings = admin.settings.replace(leader_elect=False)
    registries = [admin.registry, *(m.registry for m in managers.values())]
    for manager in managers.values():
        manager.registry.register(_Mirror(manager.registry, [r for r in registries if r is not manager.registry]))
    return managers


async def _role_token(client: KubeClient, settings: Settings, role: str, account: str) -> str:
    """A token for the role's ServiceAccount; the hypervisor's is bound to its Node, so that it names
    the node (the shipped admission policy refuses a hypervisor token that names none)."""
    if role != "hypervisor":
        return await client.request_token(settings.operator_namespace, account, expiration_seconds=TOKEN_SECONDS)
    node_name = settings.resolved_node_name
    try:
        node = await client.get(NODES, node_name)
    except NotFound:
        log.warning("no Node %s to bind the hypervisor's token to (the simulated kubelet registers it): the "
                    "hypervisor's token names no node, and the admission policy refuses its GPU writes",
                    node_name)
        return await client.request_token(settings.operator_namespace, account, expiration_seconds=TOKEN_SECONDS)
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {
        "expirationSeconds": TOKEN_SECONDS,
        "boundObjectRef": {"kind": "Node", "apiVersion": "v1", "name": node_name, "uid": Body(node).uid}}}
    result = await client.request("POST", None, path=f"serviceaccounts/{account}/token",
                                  namespace=settings.operator_namespace, body=body)
    return text(result, "status", "token")


_MIRRORING = threading.local()


class _Mirror:
    """Adds to a role's registry the families only the process's other registries have, so that in
    --role=all every role's /metrics still shows every family of the process (as one Manager's one
    registry did); a family both have is the role's own. Mirrors of mirrors collect nothing."""

    def __init__(self, own: CollectorRegistry, others: list[CollectorRegistry]) -> None:
        self.own, self.others = own, others

    def collect(self) -> Iterator[Metric]:
        if getattr(_MIRRORING, "active", False):
            return
        _MIRRORING.active = True
        try:
            seen = {family.name for family in self.own.collect()}
            for registry in self.others:
                for family in registry.collect():
                    if family.name not in seen:
                        seen.add(family.name)
                        yield family
        finally:
            _MIRRORING.active = False


def _with_token(admin_config: JsonMapping, token: str, namespace: str) -> JsonObject:
    """The admin kubeconfig's first cluster (server and CA) with `token` as the user."""
    clusters = items(admin_config, "clusters")
    cluster = section(clusters[0] if clusters else None, "cluster")
    server, ca = text(cluster, "server"), text(cluster, "certificate-authority-data")
    if not server:
        raise ValueError("the admin kubeconfig names no cluster server")
    return security.kubeconfig(server, token=token, ca_pem=base64.b64decode(ca) if ca else None, namespace=namespace)
