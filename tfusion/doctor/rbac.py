"""RBAC: may the shipped ServiceAccounts do what tfusion's roles need?

Why: a binding that points at the wrong namespace, a ClusterRole an overlay trimmed or an older
release's rules make the controller or the hypervisor fail on one call deep inside a reconcile.
What each needs is the RBAC deploy/ ships (tfusion/embedded/rbac.yaml, kept identical to
deploy/base/*/rbac.yaml by a test); every verb of every rule is asked of the API server as a
SubjectAccessReview for the ServiceAccount the shipped bindings name, in tfusion's namespace. A
refusal names the code that needs the permission (the roles' rbac_needs tables, which a test keeps
equal to the shipped rules).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import anyio

from tfusion.api.accessors import Body, items, section, sequence_of_maps, text
from tfusion.doctor.context import Context
from tfusion.doctor.findings import Finding, error, ok, warning
from tfusion.embedded.identities import shipped_rbac
from tfusion.kube import resources as r
from tfusion.kube.client import KubeError, NotFound
from tfusion.kube.rbac_needs import Permission, RbacNeed, permissions

SUBJECT_ACCESS_REVIEWS = r.ApiResource("authorization.k8s.io", "v1", "subjectaccessreviews", "SubjectAccessReview",
                                       False)
#: reviews in flight at once
CONCURRENCY = 16


@dataclass(frozen=True)
class Need:
    account: str  # ServiceAccount name, in tfusion's namespace
    namespace: str  # "" cluster-wide
    group: str
    resource: str  # may carry a subresource: "pods/status"
    verb: str
    name: str = ""
    source: str = ""  # the role granting it, for the message

    def describe(self) -> str:
        group = f"{self.group}/" if self.group else ""
        where = f" in {self.namespace}" if self.namespace else ""
        return f"{self.verb} {group}{self.resource}{f'/{self.name}' if self.name else ''}{where}"


def declared_needs() -> dict[Permission, RbacNeed]:
    """Each permission the roles' code declares it needs (controller/rbac_needs.py,
    hypervisor/rbac_needs.py), with the declaration: a denied one then names the code it breaks."""
    from tfusion.controller.rbac_needs import NEEDS as CONTROLLER_NEEDS
    from tfusion.hypervisor.rbac_needs import NEEDS as HYPERVISOR_NEEDS

    return {p: need for need in CONTROLLER_NEEDS + HYPERVISOR_NEEDS for p in permissions([need])}


def shipped_needs(namespace: str) -> list[Need]:
    """What each shipped ServiceAccount must be allowed: every verb of the roles its bindings grant."""
    objects = shipped_rbac(namespace)
    roles = {(o.kind, o.name): o for o in objects if o.kind in ("ClusterRole", "Role")}
    declared = declared_needs()
    needs: list[Need] = []
    for binding in (o for o in objects if o.kind in ("ClusterRoleBinding", "RoleBinding")):
        ref = section(binding.raw, "roleRef")
        role = roles.get((text(ref, "kind"), text(ref, "name")))
        if role is None:
            continue
        scope = binding.namespace if binding.kind == "RoleBinding" else ""
        for subject in sequence_of_maps(binding.raw.get("subjects")):
            if subject.get("kind") == "ServiceAccount":
                needs.extend(_rule_needs(text(subject, "name"), scope, role, declared))
    return needs


def _rule_needs(account: str, namespace: str, role: Body, declared: Mapping[Permission, RbacNeed]) -> Iterator[Need]:
    for rule in items(role.raw, "rules"):
        names = _strings(rule, "resourceNames") or [""]
        for group in _strings(rule, "apiGroups"):
            for resource in _strings(rule, "resources"):
                for verb in _strings(rule, "verbs"):
                    need = declared.get((f"{role.kind}/{role.name}", group, resource, verb, names[0]))
                    source = f"{role.kind} {role.name}"
                    if need is not None:
                        source += f", for {', '.join(c.removeprefix('tfusion.') for c in need.callers)}: {need.why}"
                    yield Need(account, namespace, group, resource, verb, names[0], source)


def _strings(rule: object, key: str) -> list[str]:
    return [v for v in items(rule, key) if isinstance(v, str)] if isinstance(rule, Mapping) else []


def review(need: Need, namespace: str) -> dict[str, object]:
    resource, _, subresource = need.resource.partition("/")
    attributes: dict[str, str] = {"verb": need.verb, "group": need.group, "resource": resource}
    attributes.update({k: v for k, v in (("subresource", subresource), ("namespace", need.namespace),
                                         ("name", need.name)) if v})
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": f"system:serviceaccount:{namespace}:{need.account}",
                     "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}",
                                "system:authenticated"],
                     "resourceAttributes": attributes}}


async def check(ctx: Context) -> list[Finding]:
    needs = shipped_needs(ctx.namespace)
    denied: list[Need] = []
    failures: list[KubeError] = []
    limiter = anyio.CapacityLimiter(CONCURRENCY)

    async def ask(need: Need) -> None:
        async with limiter:
            try:
                answer = await ctx.client.create(SUBJECT_ACCESS_REVIEWS, review(need, ctx.namespace))
            except KubeError as exc:  # raised once, below: not one per review inside an exception group
                failures.append(exc)
                return
        if section(answer, "status").get("allowed") is not True:
            denied.append(need)

    async with anyio.create_task_group() as tg:
        for need in needs:
            tg.start_soon(ask, need)
    if any(isinstance(exc, NotFound) for exc in failures):
        return [warning("rbac", "the API server does not serve SubjectAccessReview: the ServiceAccounts' "
                                "permissions cannot be checked")]
    if failures:
        raise failures[0]
    return rbac_findings(ctx.namespace, needs, denied)


def rbac_findings(namespace: str, needs: list[Need], denied: list[Need]) -> list[Finding]:
    findings = []
    for account in sorted({n.account for n in denied}):
        granted = [n for n in needs if n.account == account]
        missing = [n for n in granted if n in denied]
        if len(missing) == len(granted):
            said = f"may do none of the {len(granted)} things its roles grant (is the shipped RBAC applied here?)"
        else:
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            said = "may not: " + "; ".join(f"{n.describe()} ({n.source})" for n in missing[:5]) + more
        findings.append(error("rbac", f"ServiceAccount {namespace}/{account} {said}",
                              "apply the RBAC tfusion ships (deploy/base/controller/rbac.yaml and "
                              "deploy/base/hypervisor/rbac.yaml, through your overlay with its namespace)"))
    accounts = sorted({n.account for n in needs})
    return findings or [ok("rbac", f"{', '.join(accounts)} may do all {len(needs)} things tfusion's roles need")]
