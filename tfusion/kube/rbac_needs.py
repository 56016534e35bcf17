"""What a role's code asks of the API server, declared next to that code, so that its RBAC can be
checked against it.

Why: a ClusterRole written by hand drifts both ways, a rule too few is a 403 deep inside a reconcile
and a rule too many is a permission nobody audits. Each role declares its needs in one table
(tfusion/controller/rbac_needs.py, tfusion/hypervisor/rbac_needs.py) naming the module that makes the
call; tests/unit/test_rbac_needs.py checks that the shipped roles grant exactly those needs and that
each named module really addresses the resource.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tfusion.kube.resources import ApiResource

#: the verbs a rule may grant (no wildcards, and no deletecollection: tfusion deletes one at a time)
VERBS = ("get", "list", "watch", "create", "update", "patch", "delete")


@dataclass(frozen=True)
class RbacNeed:
    """`verbs` on `resource` (its `subresource` when set, only the objects `names` when set), granted
    by the role `role` ("ClusterRole/name" or "Role/name"), because `callers` (dotted module names)
    make those calls for the reason `why`."""

    role: str
    resource: ApiResource
    verbs: tuple[str, ...]
    callers: tuple[str, ...]
    why: str
    subresource: str = ""
    names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        unknown = [v for v in self.verbs if v not in VERBS]
        if unknown or not self.verbs:
            raise ValueError(f"RbacNeed {self.plural}: verbs {list(self.verbs)}: expected some of {', '.join(VERBS)}")
        if not self.callers:
            raise ValueError(f"RbacNeed {self.plural}: callers is empty: name the module that makes the call")

    @property
    def plural(self) -> str:
        """The resource as an RBAC rule names it: "pods", "pods/status"."""
        return f"{self.resource.plural}/{self.subresource}" if self.subresource else self.resource.plural


#: one permission: (role, apiGroup, resource[/subresource], verb, resourceName or "")
Permission = tuple[str, str, str, str, str]


def permissions(needs: Iterable[RbacNeed]) -> set[Permission]:
    """Every single permission the needs add up to."""
    return {(n.role, n.resource.group, n.plural, verb, name)
            for n in needs for verb in n.verbs for name in (n.names or ("",))}
