"""Karpenter in a test: its NodeClaim CRD (tests/fixtures/karpenter, a minimal one of ours) and a
stand-in that does, step by step when the test says so, what Karpenter does with a NodeClaim:
launch (label it, register its Node with the NodeClaim's labels, fill its status) and terminate
(delete the Node, drop the finalizer)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tfusion.api.accessors import Body, items
from tfusion.kube.client import KubeClient, NotFound
from tfusion.kube.resources import KARPENTER_NODECLAIMS, NODES

CRD_FILE = Path(__file__).resolve().parents[1] / "fixtures" / "karpenter" / "nodeclaims.yaml"
TERMINATION_FINALIZER = "karpenter.sh/termination"


def nodeclaim_crd() -> dict[str, Any]:
    crd: dict[str, Any] = yaml.safe_load(CRD_FILE.read_text())
    return crd


class FakeKarpenter:
    """Karpenter's part, one call per step. Nodes are named ip-10-0-0-<n> like EC2's private DNS names,
    so a test sees that the Node's name is Karpenter's choice, not the claim's."""

    def __init__(self, kube: KubeClient, *, zone: str = "us-east-1a") -> None:
        self.kube = kube
        self.zone = zone
        self.launched = 0

    async def adopt(self, name: str) -> dict[str, Any]:
        """Karpenter's first sight of a NodeClaim: its termination finalizer."""
        return await self.kube.patch(KARPENTER_NODECLAIMS, name, {"metadata": {"finalizers": [TERMINATION_FINALIZER]}})

    async def launch(self, name: str) -> str:
        """Launch the instance: resolved labels on the NodeClaim, a Node with them, status filled."""
        claim = await self.kube.get(KARPENTER_NODECLAIMS, name)
        wanted = {r["key"]: r["values"][0] for r in items(claim, "spec", "requirements") if r["operator"] == "In"}
        zone = wanted.get("topology.kubernetes.io/zone", self.zone)
        resolved = ("node.kubernetes.io/instance-type", "karpenter.sh/capacity-type")
        labels = {**Body(claim).meta.labels, **{key: wanted[key] for key in resolved},
                  "topology.kubernetes.io/zone": zone}
        self.launched += 1
        node = f"ip-10-0-0-{self.launched}.ec2.internal"
        provider_id = f"aws:///{zone}/i-{self.launched:017x}"
        await self.kube.patch(KARPENTER_NODECLAIMS, name, {"metadata": {"labels": labels}})
        await self.kube.create(NODES, {"metadata": {"name": node, "labels": {**labels, "kubernetes.io/hostname": node}},
                                       "spec": {"providerID": provider_id}})
        await self.kube.patch(KARPENTER_NODECLAIMS, name, {"status": {
            "nodeName": node, "providerID": provider_id,
            "conditions": [{"type": "Launched", "status": "True"}, {"type": "Registered", "status": "True"}]}},
            subresource="status")
        return node

    async def finish_termination(self, name: str) -> None:
        """What Karpenter does once a NodeClaim is deleted: the Node goes, then the finalizer."""
        claim = await self.kube.get(KARPENTER_NODECLAIMS, name)
        node = claim.get("status", {}).get("nodeName")
        if node:
            try:
                await self.kube.delete(NODES, node)
            except NotFound:
                pass
        await self.kube.patch(KARPENTER_NODECLAIMS, name, {"metadata": {"finalizers": None}})
