"""The shipped RBAC grants exactly what the code declares it calls, and each declared caller addresses
its resource.

A rule the code needs but the RBAC lacks fails here and, at run time, as a 403 in every --role=all
test (tests/helpers/role_all.py asserts no denials); a rule no declared call uses fails here, naming it.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tfusion.api.accessors import Body, items
from tfusion.controller import rbac_needs as controller_needs
from tfusion.embedded.identities import shipped_rbac
from tfusion.hypervisor import rbac_needs as hypervisor_needs
from tfusion.kube import resources
from tfusion.kube.rbac_needs import Permission, RbacNeed, permissions

NEEDS = controller_needs.NEEDS + hypervisor_needs.NEEDS
DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "base"


def granted(roles: list[Body]) -> set[Permission]:
    found: set[Permission] = set()
    for role in roles:
        for rule in items(role.raw, "rules"):
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        for name in rule.get("resourceNames") or [""]:
                            found.add((f"{role.kind}/{role.name}", group, resource, verb, name))
    return found


def shipped_roles() -> list[Body]:
    return [d for d in shipped_rbac("tensor-fusion-sys") if d.kind in ("ClusterRole", "Role")]


def describe(permission: Permission) -> str:
    role, group, resource, verb, name = permission
    return f"{role}: {verb} {group or 'core'} {resource}{f' named {name}' if name else ''}"


def test_the_shipped_rules_are_what_the_code_declares() -> None:
    shipped, declared = granted(shipped_roles()), permissions(NEEDS)
    unused = sorted(describe(p) for p in shipped - declared)
    missing = sorted(describe(p) for p in declared - shipped)
    assert not unused, "granted, but no line of NEEDS (controller/rbac_needs.py, hypervisor/rbac_needs.py) " \
                       "says which code calls it; remove the rule or declare the call:\n" + "\n".join(unused)
    assert not missing, "declared in NEEDS but not granted by deploy/base/*/rbac.yaml (copy to " \
                        "tfusion/embedded/rbac.yaml):\n" + "\n".join(missing)


def test_the_comparison_sees_an_extra_and_a_missing_rule() -> None:
    daemonsets = {"apiGroups": ["apps"], "resources": ["daemonsets"], "verbs": ["patch"]}
    roles = [Body({**r.raw, "rules": [*items(r.raw, "rules"), daemonsets]})
             if (r.kind, r.name) == ("ClusterRole", "tensor-fusion-operator") else r for r in shipped_roles()]
    extra = granted(roles) - permissions(NEEDS)
    assert extra == {("ClusterRole/tensor-fusion-operator", "apps", "daemonsets", "patch", "")}
    trimmed = [n for n in NEEDS if n.resource is not resources.KARPENTER_NODECLAIMS]
    assert {p[2] for p in permissions(NEEDS) - permissions(trimmed)} == {"nodeclaims"}


def referenced_resources(module_name: str) -> Iterator[resources.ApiResource]:
    """The ApiResources the module's code names (a constant of its own, or of tfusion.kube.resources)."""
    module = importlib.import_module(module_name)
    tree = ast.parse(inspect.getsource(module))
    for node in ast.walk(tree):
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
        for scope in (vars(module), vars(resources)):
            value = scope.get(name) if name else None
            if isinstance(value, resources.ApiResource):
                yield value


@pytest.mark.parametrize("need", NEEDS, ids=lambda n: f"{n.role.split('/')[1]}:{n.plural}:{'-'.join(n.verbs)}")
def test_each_declared_caller_addresses_its_resource(need: RbacNeed) -> None:
    strangers = [c for c in need.callers if need.resource not in set(referenced_resources(c))]
    assert not strangers, f"{need.plural}: {', '.join(strangers)} never name {need.resource.name}: " \
                          "name the module that makes the call"


def test_a_caller_that_does_not_address_the_resource_is_found() -> None:
    assert resources.PODS in set(referenced_resources("tfusion.controller.reconcilers.pod"))
    assert resources.KARPENTER_NODECLAIMS not in set(referenced_resources("tfusion.controller.reconcilers.pod"))


@pytest.mark.parametrize("path", [DEPLOY / "controller" / "rbac.yaml", DEPLOY / "hypervisor" / "rbac.yaml",
                                  DEPLOY.parent / "overlays" / "kube-scheduler" / "scheduler" / "rbac.yaml"],
                         ids=lambda p: p.parent.name)
def test_every_rule_says_which_code_needs_it(path: Path) -> None:
    lines = path.read_text(encoding="utf-8").splitlines()
    bare = [n + 1 for n, line in enumerate(lines)
            if re.match(r"\s*- apiGroups:", line) and not lines[n - 1].lstrip().startswith("#")]
    assert not bare, f"{path.name}: rules without a comment naming their caller at lines {bare}"


def test_doctor_names_the_code_a_refused_permission_breaks() -> None:
    from tfusion.doctor.rbac import rbac_findings, shipped_needs

    needs = shipped_needs("tf-ns")
    binding = [n for n in needs if n.resource == "pods/binding"]
    assert [n.account for n in binding] == ["tensor-fusion-operator"]
    [finding] = rbac_findings("tf-ns", needs, binding)
    assert finding.message == ("ServiceAccount tf-ns/tensor-fusion-operator may not: create pods/binding "
                               "(ClusterRole tensor-fusion-operator, for controller.scheduling.binder: "
                               "the built-in scheduler binds a pod)")
    assert all(", for " in n.source for n in needs), "every shipped permission is declared by some code"
