"""--role=all's embedded bootstrap applies the hypervisor's admission policy with the RBAC, and the
hypervisor's token is bound to its Node: it names the node, so the policy lets it write that node's
GPUNode and refuses another's, as a hypervisor pod's token does in a cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.apiserver_fixture import ApiServerHandle, apply_crds
from tfusion.apiserver import security
from tfusion.embedded.identities import ROLE_ACCOUNTS, _role_token, _with_token, apply_rbac, shipped_policies
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient, KubeError
from tfusion.settings import Settings

pytestmark = pytest.mark.anyio
NAMESPACE = "tensor-fusion-sys"
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
STATUS = {"status": {"phase": "Running", "totalGPUs": 0, "managedGPUs": 0, "totalTFlops": "0", "totalVRAM": "0"}}


def settings(node: str) -> Settings:
    return Settings.load({}, env={}, roles=("all",)).replace(node_name=node, operator_namespace=NAMESPACE)


TOKENREVIEWS = r.ApiResource("authentication.k8s.io", "v1", "tokenreviews", "TokenReview", False)


async def review(kube: KubeClient, token: str) -> dict[str, Any]:
    return dict((await kube.create(TOKENREVIEWS, {"spec": {"token": token}}))["status"])


async def test_the_policy_is_applied_once_and_the_hypervisor_token_names_its_node(
        apiserver: ApiServerHandle, kube: KubeClient, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    written = await apply_rbac(kube, NAMESPACE)
    assert await apply_rbac(kube, NAMESPACE) == 0, "a second start rewrites nothing"
    assert written >= len(shipped_policies())
    for doc in shipped_policies():
        plural = "validatingadmissionpolicies" if doc.kind == "ValidatingAdmissionPolicy" else \
            "validatingadmissionpolicybindings"
        stored = await kube.get(r.ApiResource("admissionregistration.k8s.io", "v1", plural, doc.kind, False),
                                doc.name)
        assert stored["spec"] == doc.spec
    node = await kube.create(r.NODES, {"metadata": {"name": "node-a"}})
    for name in ("node-a", "node-b"):
        await kube.create(r.GPUNODES, {"metadata": {"name": name}, "spec": {}})
    token = await _role_token(kube, settings("node-a"), "hypervisor", ROLE_ACCOUNTS["hypervisor"])
    user = (await review(kube, token))["user"]
    assert user["username"] == f"system:serviceaccount:{NAMESPACE}:{ROLE_ACCOUNTS['hypervisor']}"
    assert user["extra"][NODE_NAME_EXTRA] == ["node-a"]
    assert user["extra"]["authentication.kubernetes.io/node-uid"] == [node["metadata"]["uid"]]
    admin_config = yaml.safe_load(Path(apiserver.kubeconfig).read_text())
    security.write_kubeconfig(tmp_path / "hypervisor", _with_token(admin_config, token, NAMESPACE))
    hypervisor = await KubeClient.connect(str(tmp_path / "hypervisor"), qps=0)
    try:
        await hypervisor.patch(r.GPUNODES, "node-a", STATUS, patch_type="merge", subresource="status")
        with pytest.raises(KubeError) as refused:
            await hypervisor.patch(r.GPUNODES, "node-b", STATUS, patch_type="merge", subresource="status")
        assert refused.value.code == 403
        assert "may not write GPUNode node-b" in str(refused.value)
    finally:
        await hypervisor.close()
    # the controller's token is not bound to anything
    controller = await _role_token(kube, settings("node-a"), "controller", ROLE_ACCOUNTS["controller"])
    assert NODE_NAME_EXTRA not in ((await review(kube, controller))["user"].get("extra") or {})


async def test_without_its_node_the_hypervisor_token_names_none(kube: KubeClient) -> None:
    await apply_rbac(kube, NAMESPACE)
    token = await _role_token(kube, settings("nowhere"), "hypervisor", ROLE_ACCOUNTS["hypervisor"])
    assert NODE_NAME_EXTRA not in ((await review(kube, token))["user"].get("extra") or {})
