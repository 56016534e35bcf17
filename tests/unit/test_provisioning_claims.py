"""The shape of the GPUNodeClaims tfusion makes, their price, the pool's instance-type filter, and
which unschedulable pods the node expander takes (pure parts of provisioning/)."""

from __future__ import annotations

from typing import Any

from tfusion.api import annotations as tfa
from tfusion.api.accessors import Body, GpuPool
from tfusion.controller.provisioning import catalog as cat
from tfusion.controller.provisioning.claims import hourly_price, new_claim, offered
from tfusion.controller.provisioning.expander import short_of_gpu
from tfusion.controller.provisioning.pools import PoolProvisioner
from tfusion.controller.scheduling.explain import Why

CATALOG = cat.load()
A100 = CATALOG.get("a2-ultragpu-1g")
L4 = CATALOG.get("g6.xlarge")


def pool(name: str = "burst", **node_manager: Any) -> GpuPool:
    return GpuPool({"apiVersion": "tensor-fusion.ai/v1", "kind": "GPUPool",
                    "metadata": {"name": name, "uid": "pool-uid"},
                    "spec": {"nodeManagerConfig": {"provisioningMode": "Provisioned", **node_manager}}})


def test_a_claim_names_its_pool_type_price_and_offer() -> None:
    assert A100 is not None
    claim = new_claim(pool(nodeProvisioner={"nodeClass": "gpu-class"}), A100, capacity_type=cat.SPOT, price=2.0,
                      region="us-east-1", zone="us-east-1a", expansion_source="node-7")
    body = Body(claim)
    assert body.name.startswith("burst-") and len(body.name) == len("burst-") + 8
    assert body.meta.labels == {tfa.MANAGED_BY: "burst", f"{tfa.POOL_LABEL_PREFIX}burst": "true",
                                tfa.NODE_CLASS: "gpu-class", tfa.EXPANSION_SOURCE: "node-7"}
    assert body.meta.annotations == {tfa.HOURLY_PRICING: "2"}
    ref = body.meta.controller_ref()
    assert ref is not None and ref["kind"] == "GPUPool" and ref["name"] == "burst"
    assert body.spec == {"tflopsOffered": "312", "vramOffered": "80Gi", "gpuDeviceOffered": 1,
                         "nodeName": body.name, "instanceType": "a2-ultragpu-1g", "capacityType": "Spot",
                         "region": "us-east-1", "zone": "us-east-1a",
                         "nodeClassRef": {"group": "tensor-fusion.ai", "kind": "GPUNodeClass", "version": "v1",
                                          "name": "gpu-class"}}
    assert offered(body) == (312_000, 80 << 30)
    assert hourly_price(body) == 2.0


def test_an_unreadable_price_is_zero() -> None:
    assert hourly_price(Body({"metadata": {"annotations": {tfa.HOURLY_PRICING: "cheap"}}})) == 0.0
    assert hourly_price(Body({})) == 0.0


def test_the_pools_requirements_narrow_the_catalog_and_pick_spot() -> None:
    requirements = [{"key": "node.kubernetes.io/instance-type", "operator": "In",
                     "values": ["g6.xlarge", "p5.48xlarge"]},
                    {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]}]
    types, capacity = PoolProvisioner.offered_types(pool(nodeProvisioner={"gpuRequirements": requirements}),
                                                    list(CATALOG.types))
    assert [t.name for t in types] == ["g6.xlarge", "p5.48xlarge"] and capacity == cat.SPOT
    not_in = [{"key": "node.kubernetes.io/instance-type", "operator": "NotIn", "values": ["g6.xlarge"]}]
    types, capacity = PoolProvisioner.offered_types(pool(nodeProvisioner={"gpuRequirements": not_in}),
                                                    list(CATALOG.types))
    assert "g6.xlarge" not in [t.name for t in types] and capacity == cat.ON_DEMAND


def why(nodes: dict[str, list[str]]) -> Why:
    return Why("default", "p", "uid", "0/2 nodes are available", "Unschedulable", nodes={
        node: {"code": "Unschedulable", "stage": "Filter", "summary": "",
               "reasons": [{"message": "m", "stage": stage, "detail": "d"} for stage in stages]}
        for node, stages in nodes.items()})


def test_the_expander_takes_pods_short_of_gpu_only() -> None:
    assert short_of_gpu(why({"a": ["ResourceFilter"], "b": ["TaintToleration"]}))  # a new node helps on a's terms
    assert not short_of_gpu(why({"a": ["TaintToleration"], "b": ["NodeAffinity"]}))
    assert not short_of_gpu(why({"*": ["QuotaCheck"]}))
    assert short_of_gpu(why({}))  # no node at all
    assert short_of_gpu(why({"a": ["NodeResourcesFit"]}))  # CPU or memory: a new node brings its own
