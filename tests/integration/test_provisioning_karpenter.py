"""The Karpenter provider against the embedded API server serving a karpenter.sh/v1 NodeClaim CRD, with
the test playing Karpenter: a GPUNodeClaim's NodeClaim pins the instance, its Node comes up carrying
the claim's label, and deleting the NodeClaim is how the instance goes. Last, through the controller:
deleting a Karpenter pool's Bound claim deletes its NodeClaim, which Karpenter's finalizer holds until
the node is gone (test_provisioning_flows.py follows the claim up to Bound only)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.apiserver_fixture import ApiServerHandle, apply_crds
from tests.helpers import eventually
from tests.helpers.controller import POOL, controllers, create_gpu, settings_for, start_controller
from tests.helpers.karpenter import FakeKarpenter, nodeclaim_crd
from tfusion.api import annotations as tfa
from tfusion.api.accessors import Body, GpuPool
from tfusion.api.kinds.common import GroupKindName
from tfusion.api.timestamps import rfc3339
from tfusion.controller.provisioning.catalog import ON_DEMAND, SPOT, Catalog, load
from tfusion.controller.provisioning.claims import new_claim
from tfusion.controller.provisioning.providers.base import LaunchRequest, ProviderError
from tfusion.controller.provisioning.providers.karpenter import KarpenterProvider
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient, NotFound
from tfusion.kube.resources import KARPENTER_NODECLAIMS, NODES

pytestmark = pytest.mark.anyio

CATALOG = load()
NODE_CLASS = GroupKindName(group="karpenter.k8s.aws", kind="EC2NodeClass", version="v1", name="gpu")


@pytest.fixture
async def karpenter_crd(apiserver: ApiServerHandle) -> None:
    await apply_crds(apiserver, [nodeclaim_crd()])


def request(claim: str = "pool-a-0123abcd", *, type_name: str = "g6.12xlarge", capacity: str = ON_DEMAND,
            zone: str = "", node_class_name: str = "", labels: dict[str, str] | None = None) -> LaunchRequest:
    instance_type = CATALOG.get(type_name)
    assert instance_type is not None
    return LaunchRequest(claim=claim, node_name=claim, instance_type=instance_type, capacity_type=capacity,
                         zone=zone, node_class_name=node_class_name,
                         labels={tfa.NODE_PROVISIONER: claim, **(labels or {})})


def provider(kube: KubeClient, catalog: Catalog = CATALOG, ref: GroupKindName | None = NODE_CLASS) -> KarpenterProvider:
    return KarpenterProvider(kube, catalog, node_class_ref=ref)


@pytest.mark.usefixtures("karpenter_crd")
async def test_a_claim_becomes_a_nodeclaim_and_its_node_carries_the_claim(kube: KubeClient) -> None:
    karpenter = provider(kube)
    labels = {tfa.MANAGED_BY: "pool-a", f"{tfa.POOL_LABEL_PREFIX}pool-a": "true"}
    launched = await karpenter.create(request(labels=labels))
    assert (launched.instance_id, launched.claim, launched.state) == ("pool-a-0123abcd", "pool-a-0123abcd", "pending")
    assert (launched.instance_type, launched.capacity_type, launched.node_name) == ("g6.12xlarge", ON_DEMAND, "")
    assert launched.launched_at > 0

    nodeclaim = await kube.get(KARPENTER_NODECLAIMS, "pool-a-0123abcd")
    assert nodeclaim["metadata"]["labels"] == {tfa.NODE_PROVISIONER: "pool-a-0123abcd", **labels}
    assert nodeclaim["spec"]["nodeClassRef"] == {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "gpu"}
    assert nodeclaim["spec"]["requirements"] == [
        {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["g6.12xlarge"]},
        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
    ]
    assert nodeclaim["spec"]["resources"] == {"requests": {"nvidia.com/gpu": "4"}}
    assert nodeclaim["spec"]["expireAfter"] == "Never"  # not the CRD's default 720h

    fake = FakeKarpenter(kube, zone="us-east-1c")
    await fake.adopt("pool-a-0123abcd")
    node_name = await fake.launch("pool-a-0123abcd")
    node = await kube.get(NODES, node_name)
    assert node["metadata"]["labels"][tfa.NODE_PROVISIONER] == "pool-a-0123abcd"
    [running] = await karpenter.list_instances()
    assert (running.instance_id, running.node_name, running.state) == ("pool-a-0123abcd", node_name, "running")
    assert (running.zone, running.capacity_type, running.instance_type) == ("us-east-1c", ON_DEMAND, "g6.12xlarge")

    await karpenter.terminate("pool-a-0123abcd")
    [going] = await karpenter.list_instances()
    assert going.state == "terminating"  # Karpenter's finalizer holds it while the node drains
    await fake.finish_termination("pool-a-0123abcd")
    assert await karpenter.list_instances() == []
    assert [n["metadata"]["name"] for n in (await kube.list(NODES)).items] == []
    await karpenter.terminate("pool-a-0123abcd")  # gone already: not an error


@pytest.mark.usefixtures("karpenter_crd")
async def test_spot_in_a_zone_with_the_claims_node_class(kube: KubeClient) -> None:
    karpenter = provider(kube, ref=None)
    launched = await karpenter.create(request("pool-b-00000001", type_name="g6.xlarge", capacity=SPOT,
                                              zone="us-east-1b", node_class_name="gpu-class"))
    assert (launched.capacity_type, launched.zone) == (SPOT, "us-east-1b")
    nodeclaim = await kube.get(KARPENTER_NODECLAIMS, "pool-b-00000001")
    assert nodeclaim["spec"]["nodeClassRef"] == {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass",
                                                 "name": "gpu-class"}
    assert {r["key"]: r["values"] for r in nodeclaim["spec"]["requirements"]} == {
        "node.kubernetes.io/instance-type": ["g6.xlarge"], "karpenter.sh/capacity-type": ["spot"],
        "topology.kubernetes.io/zone": ["us-east-1b"]}
    assert nodeclaim["metadata"]["labels"][tfa.MANAGED_BY] == "tensor-fusion"
    node_name = await FakeKarpenter(kube).launch("pool-b-00000001")
    [running] = await karpenter.list_instances()
    assert (running.node_name, running.zone, running.capacity_type) == (node_name, "us-east-1b", SPOT)


@pytest.mark.usefixtures("karpenter_crd")
async def test_create_is_idempotent_per_claim_and_lists_only_tfusions(kube: KubeClient) -> None:
    karpenter = provider(kube)
    first = await karpenter.create(request())
    again = await karpenter.create(request())
    assert again == first
    foreign: dict[str, Any] = {"metadata": {"name": "someone-elses"}, "spec": {
        "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
        "requirements": [{"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]}]}}
    await kube.create(KARPENTER_NODECLAIMS, foreign)
    assert [i.instance_id for i in await karpenter.list_instances()] == [first.instance_id]
    with pytest.raises(ProviderError, match="someone-elses exists but is not tfusion's") as refused:
        await karpenter.create(request("someone-elses"))
    assert refused.value.retryable is False
    with pytest.raises(ProviderError, match=r"NodeClaim someone-elses has no label .* does not delete it"):
        await karpenter.terminate("someone-elses")
    assert await kube.get(KARPENTER_NODECLAIMS, "someone-elses")


@pytest.mark.usefixtures("karpenter_crd")
async def test_bad_requests_say_which_field(kube: KubeClient) -> None:
    with pytest.raises(ProviderError, match="karpenterNodeClassRef") as no_class:
        await provider(kube, ref=None).create(request())
    assert no_class.value.retryable is False
    with pytest.raises(ProviderError, match=r"capacityType 'Reserved' is not allowed.*OnDemand or Spot") as bad:
        await provider(kube).create(request(capacity="Reserved"))
    assert bad.value.retryable is False
    assert (await kube.list(KARPENTER_NODECLAIMS)).items == []


async def test_without_karpenter_installed_the_error_says_so(kube: KubeClient) -> None:
    karpenter = provider(kube)
    for call in (karpenter.create(request()), karpenter.list_instances(), karpenter.terminate("x")):
        with pytest.raises(ProviderError, match=r"nodeclaims.karpenter.sh is not served.*Karpenter \(v1\) installed"):
            await call


async def test_a_karpenter_pools_claim_through_the_controller(apiserver: ApiServerHandle, kube: KubeClient,
                                                              tmp_path: Path) -> None:
    await apply_crds(apiserver)
    await apply_crds(apiserver, [nodeclaim_crd()])
    ref = {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "version": "v1", "name": "gpu"}
    pool = await kube.create(r.GPUPOOLS, {"metadata": {"name": POOL}, "spec": {"nodeManagerConfig": {
        "provisioningMode": "Karpenter", "nodeProvisioner": {"karpenterNodeClassRef": ref}}}})
    instance_type = CATALOG.get("g6.xlarge")
    assert instance_type is not None
    claim = await kube.create(r.GPUNODECLAIMS, new_claim(GpuPool(pool), instance_type, capacity_type=SPOT, price=0.35))
    name = Body(claim).name
    fake = FakeKarpenter(kube)

    async with controllers() as tg:
        await start_controller(tg, settings_for(apiserver, tmp_path))

        async def creating() -> str:
            status = (await kube.get(r.GPUNODECLAIMS, name)).get("status", {})
            return str(status.get("instanceID", "")) if status.get("phase") == "Creating" else ""

        assert await eventually(lambda: _nodeclaim(kube, name), what="the claim's NodeClaim")
        assert await eventually(creating, what="Creating") == name  # the instance id: the NodeClaim's name
        await fake.adopt(name)
        node = await fake.launch(name)
        gpunode = await eventually(lambda: _get(kube, r.GPUNODES, node), what="the GPUNode of Karpenter's node")
        assert gpunode["metadata"]["labels"][tfa.NODE_PROVISIONER] == name
        await create_gpu(kube, f"{node}-gpu0", node, tflops="121", vram="23034Mi", model="L4")
        await kube.patch(r.GPUS, f"{node}-gpu0", {"metadata": {"annotations": {tfa.LAST_SYNC: rfc3339()}}})
        assert await eventually(lambda: _phase_is(kube, name, "Bound"), what="Bound")

        await kube.delete(r.GPUNODECLAIMS, name)
        assert await eventually(lambda: _absent(kube, r.GPUNODECLAIMS, name), what="the claim gone")
        nodeclaim = await kube.get(KARPENTER_NODECLAIMS, name)
        assert nodeclaim["metadata"].get("deletionTimestamp")  # Karpenter (the test) drains and terminates now
        await fake.finish_termination(name)
        assert await eventually(lambda: _absent(kube, KARPENTER_NODECLAIMS, name), what="the NodeClaim gone")


async def _get(kube: KubeClient, resource: r.ApiResource, name: str) -> dict[str, Any] | None:
    try:
        return await kube.get(resource, name)
    except NotFound:
        return None


async def _absent(kube: KubeClient, resource: r.ApiResource, name: str) -> bool:
    return await _get(kube, resource, name) is None


async def _nodeclaim(kube: KubeClient, name: str) -> dict[str, Any] | None:
    return await _get(kube, KARPENTER_NODECLAIMS, name)


async def _phase_is(kube: KubeClient, name: str, phase: str) -> bool:
    found = await _get(kube, r.GPUNODECLAIMS, name)
    return found is not None and found.get("status", {}).get("phase") == phase
