"""The whole claim flow through the controller, on the providers that talk to something outside it:

- AWS: a `Provisioned` pool whose TensorFusionCluster names `computingVendor.type: aws` (region, and
  credentials from a Secret) gets a GPUNodeClaim for its minimum; the claim reconciler launches an
  EC2 instance on moto's server with the GPUNodeClass's parameters and records its ID; deleting the
  pool deletes the claim, whose finalizer terminates the instance.
- Karpenter: a `Karpenter` pool's claim becomes a karpenter.sh/v1 NodeClaim; the test plays
  Karpenter (a Node named by Karpenter with the NodeClaim's labels) and the GPUs' reporter; the
  controller makes the Node's GPUNode from the claim and the claim goes Bound.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.apiserver_fixture import apply_crds
from tests.helpers import eventually
from tests.helpers.controller import controllers, create_gpu, settings_for, start_controller
from tests.helpers.karpenter import FakeKarpenter, nodeclaim_crd
from tests.helpers.moto_server import KEYS, REGION, MotoServer, missing, moto_server
from tfusion.api import annotations as tfa
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient, NotFound

pytestmark = pytest.mark.anyio
OPS = "tf-ops"
DISCOVERY = {"tfusion-test/discovery": "gpu"}


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    if missing():
        pytest.skip(missing())
    with moto_server(tmp_path_factory.mktemp("moto") / "moto.log") as server:
        yield server


def aws_network(moto: MotoServer) -> dict[str, str]:
    moto.reset()
    ec2 = moto.client("ec2")
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.1.0/24", AvailabilityZone="us-east-1a")["Subnet"]["SubnetId"]
    group = ec2.create_security_group(GroupName="gpu", Description="gpu", VpcId=vpc)["GroupId"]
    ec2.create_tags(Resources=[subnet, group], Tags=[{"Key": k, "Value": v} for k, v in DISCOVERY.items()])
    image = ec2.register_image(Name="gpu-node", RootDeviceName="/dev/xvda", Architecture="x86_64")["ImageId"]
    return {"subnet": subnet, "group": group, "image": image}


async def get(kube: KubeClient, resource: r.ApiResource, name: str, namespace: str | None = None) -> Any:
    try:
        return await kube.get(resource, name, namespace=namespace)
    except NotFound:
        return None


async def pool_claims(kube: KubeClient, pool: str) -> list[dict[str, Any]]:
    return (await kube.list(r.GPUNODECLAIMS, label_selector=f"{tfa.MANAGED_BY}={pool}")).items


async def test_a_provisioned_pool_launches_and_terminates_ec2_instances_with_its_class(
        apiserver: Any, kube: KubeClient, tmp_path: Path, moto: MotoServer) -> None:
    await apply_crds(apiserver)
    net = aws_network(moto)
    await kube.create(r.NAMESPACES, {"metadata": {"name": OPS}})
    await kube.create(r.SECRETS, {"metadata": {"name": "cloud-keys", "namespace": OPS}, "data": {
        k: base64.b64encode(v.encode()).decode() for k, v in KEYS.items()}}, namespace=OPS)
    await kube.create(r.TENSORFUSIONCLUSTERS, {"metadata": {"name": "prod"}, "spec": {"computingVendor": {
        "type": "aws", "params": {"defaultRegion": REGION, "extraParams": {"credentialsSecret": "cloud-keys"}}}}})
    await kube.create(r.GPUNODECLASSES, {"metadata": {"name": "gpu"}, "spec": {
        "osImageSelectorTerms": [{"id": net["image"]}], "subnetSelectorTerms": [{"tags": DISCOVERY}],
        "securityGroupSelectorTerms": [{"tags": DISCOVERY}], "tags": {"team": "ml"},
        "blockDeviceMappings": [{"deviceName": "/dev/xvda", "ebs": {"volumeSize": "100Gi", "volumeType": "gp3"}}]}})
    await kube.create(r.GPUPOOLS, {"metadata": {"name": "cloud", "labels": {tfa.CLUSTER: "prod"}}, "spec": {
        "capacityConfig": {"minResources": {"tflops": "100", "vram": "20Gi"}},
        "nodeManagerConfig": {"provisioningMode": "Provisioned", "nodeProvisioner": {"nodeClass": "gpu"}}}})
    ec2 = moto.client("ec2")
    async with controllers() as tg:
        await start_controller(tg, settings_for(apiserver, tmp_path, cloud_endpoint_url=moto.url))

        async def launched() -> dict[str, Any] | None:
            claims = await pool_claims(kube, "cloud")
            ids = [(c.get("status") or {}).get("instanceID") for c in claims]
            return claims[0] if len(claims) == 1 and ids[0] else None

        claim = await eventually(launched, 30, what="the pool's claim with its EC2 instance ID")
        assert claim["spec"]["instanceType"] == "g6.xlarge" and claim["status"]["phase"] == "Creating"
        assert claim["spec"]["region"] == REGION
        described = ec2.describe_instances(InstanceIds=[claim["status"]["instanceID"]])
        instance = described["Reservations"][0]["Instances"][0]
        assert (instance["ImageId"], instance["SubnetId"], instance["InstanceType"]) == \
            (net["image"], net["subnet"], "g6.xlarge")
        assert [g["GroupId"] for g in instance["SecurityGroups"]] == [net["group"]]
        tags = {t["Key"]: t["Value"] for t in instance["Tags"]}
        assert tags["team"] == "ml" and tags[tfa.NODE_PROVISIONER] == claim["metadata"]["name"]
        assert tags[tfa.MANAGED_BY] == "cloud"

        await kube.delete(r.GPUPOOLS, "cloud")

        async def terminated() -> bool:
            state = ec2.describe_instances(InstanceIds=[claim["status"]["instanceID"]])
            return (state["Reservations"][0]["Instances"][0]["State"]["Name"] == "terminated"
                    and not await pool_claims(kube, "cloud") and await get(kube, r.GPUPOOLS, "cloud") is None)

        await eventually(terminated, 30, what="the instance terminated, the claim and the pool gone")


async def test_a_karpenter_pools_claim_is_fulfilled_by_karpenter_and_binds(
        apiserver: Any, kube: KubeClient, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    await apply_crds(apiserver, crds=[nodeclaim_crd()])
    await kube.create(r.GPUPOOLS, {"metadata": {"name": "karp"}, "spec": {
        "capacityConfig": {"minResources": {"tflops": "100", "vram": "20Gi"}},
        "nodeManagerConfig": {"provisioningMode": "Karpenter", "nodeProvisioner": {"karpenterNodeClassRef": {
            "group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "version": "v1", "name": "gpu"}}}}})
    karpenter = FakeKarpenter(kube)
    async with controllers() as tg:
        await start_controller(tg, settings_for(apiserver, tmp_path))

        async def created() -> list[dict[str, Any]] | None:
            claims = await pool_claims(kube, "karp")
            ready = [c for c in claims if (c.get("status") or {}).get("instanceID")]
            return ready or None

        (claim,) = await eventually(created, 30, what="the pool's claim launched as a NodeClaim")
        name = claim["metadata"]["name"]
        assert claim["status"]["instanceID"] == name
        nodeclaim = await kube.get(r.KARPENTER_NODECLAIMS, name)
        assert nodeclaim["spec"]["nodeClassRef"] == {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass",
                                                     "name": "gpu"}
        await karpenter.adopt(name)
        node = await karpenter.launch(name)

        async def gpunode() -> Any:
            return await get(kube, r.GPUNODES, node)

        made = await eventually(gpunode, 20, what="the GPUNode of Karpenter's Node, made from the claim")
        assert made["spec"]["manageMode"] == "Provisioned"
        assert made["metadata"]["labels"][tfa.NODE_PROVISIONER] == name
        assert made["metadata"]["labels"][tfa.MANAGED_BY] == "karp"
        await create_gpu(kube, "karp-gpu-0", node, tflops="121", vram="23034Mi", model="L4_24G")
        await kube.patch(r.GPUS, "karp-gpu-0", {"metadata": {"labels": {tfa.GPU_POOL: "karp"},
                                                              "annotations": {tfa.LAST_SYNC: tfa.now_rfc3339()}}})

        async def bound() -> bool:
            return ((await kube.get(r.GPUNODECLAIMS, name)).get("status") or {}).get("phase") == "Bound"

        await eventually(bound, 30, what="the claim Bound once its node's GPUNode is Running")
        joined = (await kube.get(r.NODES, node))["metadata"]
        assert tfa.ORPHAN not in joined["labels"]
        owners = [(o["kind"], o["name"], o.get("controller")) for o in joined.get("ownerReferences", [])]
        assert ("GPUNodeClaim", name, False) in owners, "the Node goes with its claim"
