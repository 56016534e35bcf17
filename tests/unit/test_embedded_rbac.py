"""The RBAC that --role=all applies to the embedded API server is exactly the RBAC deploy/ ships."""

from __future__ import annotations

from pathlib import Path

import yaml

from tfusion.api.accessors import items
from tfusion.embedded.identities import RBAC_FILE, ROLE_ACCOUNTS, shipped_rbac

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "base"


def documents(*paths: Path) -> list[dict[str, object]]:
    return [d for path in paths for d in yaml.safe_load_all(path.read_text()) if d]


def test_the_packaged_copy_is_the_deploy_rbac() -> None:
    shipped = documents(DEPLOY / "controller" / "rbac.yaml", DEPLOY / "hypervisor" / "rbac.yaml")
    assert documents(RBAC_FILE) == shipped, \
        "copy deploy/base/controller/rbac.yaml and deploy/base/hypervisor/rbac.yaml into tfusion/embedded/rbac.yaml"


def test_it_is_placed_in_the_operator_namespace() -> None:
    docs = shipped_rbac("gpu-system")
    accounts = {d.name for d in docs if d.kind == "ServiceAccount"}
    assert accounts == set(ROLE_ACCOUNTS.values())
    for doc in docs:
        namespaced = doc.kind in ("ServiceAccount", "Role", "RoleBinding")
        assert doc.meta.raw.get("namespace") == ("gpu-system" if namespaced else None)
        assert all(s["namespace"] == "gpu-system" for s in items(doc.raw, "subjects"))
