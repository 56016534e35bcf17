"""The AWS provider against moto's EC2 server (a real HTTP server started by the test): a launch takes
every parameter from the GPUNodeClass and the claim, as describe_instances shows; a retry finds the
instance it made; Spot, zones and subnets; termination; errors that name the field; credentials from
a Secret's values. (The claim flow through the controller on moto is in test_provisioning_flows.py.)"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import msgspec
import pytest

from tests.helpers import closed_port
from tests.helpers.moto_server import KEYS, REGION, MotoServer, missing, moto_server
from tfusion.api import annotations as tfa
from tfusion.api.kinds.provisioning import (
    BlockDeviceMapping,
    EBSVolume,
    GPUNodeClassSpec,
    LaunchTemplate,
    MetadataOptions,
    SelectorTerm,
)
from tfusion.controller.provisioning.catalog import ON_DEMAND, SPOT, InstanceType, load
from tfusion.controller.provisioning.providers.aws import AwsCredentials, AwsProvider, credentials_from_secret
from tfusion.controller.provisioning.providers.base import LaunchRequest, ProviderError

pytestmark = [pytest.mark.anyio, pytest.mark.skipif(bool(missing()), reason=missing() or "-")]

CATALOG = load()
DISCOVERY = {"tfusion-test/discovery": "gpu"}


@dataclass(frozen=True)
class Network:
    ec2: Any
    vpc: str
    subnets: dict[str, str]  # zone -> id, the tagged ones
    wide_subnet: str  # us-east-1a, tagged, more free addresses than the other one there
    security_group: str
    image: str


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    with moto_server(tmp_path_factory.mktemp("moto") / "moto.log") as server:
        yield server


@pytest.fixture
def network(moto: MotoServer) -> Network:
    moto.reset()
    ec2 = moto.client("ec2")
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]

    def subnet(cidr: str, zone: str, tags: dict[str, str]) -> str:
        made: str = ec2.create_subnet(VpcId=vpc, CidrBlock=cidr, AvailabilityZone=zone)["Subnet"]["SubnetId"]
        if tags:
            ec2.create_tags(Resources=[made], Tags=[{"Key": k, "Value": v} for k, v in tags.items()])
        return made

    subnets = {"us-east-1a": subnet("10.0.1.0/24", "us-east-1a", DISCOVERY),
               "us-east-1b": subnet("10.0.2.0/24", "us-east-1b", DISCOVERY)}
    wide = subnet("10.0.16.0/20", "us-east-1a", DISCOVERY)
    subnet("10.0.3.0/24", "us-east-1c", {})  # not selected by the class
    group = ec2.create_security_group(GroupName="gpu-nodes", Description="gpu", VpcId=vpc)["GroupId"]
    ec2.create_tags(Resources=[group], Tags=[{"Key": k, "Value": v} for k, v in DISCOVERY.items()])
    ec2.create_security_group(GroupName="others", Description="not selected", VpcId=vpc)
    image = ec2.register_image(Name="gpu-node-2026", RootDeviceName="/dev/xvda", Architecture="x86_64")["ImageId"]
    ec2.create_tags(Resources=[image], Tags=[{"Key": "role", "Value": "gpu-node"}])
    ec2.register_image(Name="cpu-node-2026", RootDeviceName="/dev/xvda", Architecture="x86_64")
    moto.client("iam").create_instance_profile(InstanceProfileName="gpu-node")
    return Network(ec2, vpc, subnets, wide, group, image)


def node_class(**changes: Any) -> GPUNodeClassSpec:
    spec = GPUNodeClassSpec(
        os_image_selector_terms=[SelectorTerm(name="no-such-image"), SelectorTerm(tags={"role": "gpu-node"})],
        subnet_selector_terms=[SelectorTerm(tags=DISCOVERY)],
        security_group_selector_terms=[SelectorTerm(tags=DISCOVERY)],
        block_device_mappings=[BlockDeviceMapping(device_name="/dev/xvda",
                                                  ebs=EBSVolume(volume_size="200Gi", volume_type="gp3"))],
        tags={"team": "ml", "Name": "overridden"},
        user_data="#!/bin/bash\n/etc/eks/bootstrap.sh gpu --kubelet-extra-args "
                  "'--node-labels={{TFUSION_NODE_LABELS}} --hostname-override={{TFUSION_NODE_NAME}}'\n",
        instance_profile="gpu-node",
        metadata_options=MetadataOptions(http_put_response_hop_limit=2),
    )
    return msgspec.structs.replace(spec, **changes)


def launch(claim: str = "pool-a-0123abcd", *, spec: GPUNodeClassSpec | None = None, zone: str = "",
           capacity: str = ON_DEMAND, instance_type: InstanceType | None = None) -> LaunchRequest:
    return LaunchRequest(
        claim=claim, node_name=claim, instance_type=instance_type or CATALOG.get("g6.12xlarge") or CATALOG.types[0],
        capacity_type=capacity, region=REGION, zone=zone, node_class=spec or node_class(), node_class_name="gpu",
        labels={tfa.NODE_PROVISIONER: claim, tfa.MANAGED_BY: "pool-a"}, tags={"cost-center": "42"})


def provider(moto: MotoServer, credentials: AwsCredentials | None = None) -> AwsProvider:
    return AwsProvider(CATALOG, region=REGION, endpoint_url=moto.url,
                       credentials=credentials or AwsCredentials(KEYS["aws_access_key_id"],
                                                                 KEYS["aws_secret_access_key"]))


def described(network: Network, instance_id: str) -> dict[str, Any]:
    found: dict[str, Any] = network.ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]
    return found


async def test_a_launch_takes_every_parameter_from_the_class_and_the_claim(moto: MotoServer, network: Network) -> None:
    aws = provider(moto)
    launched = await aws.create(launch(zone="us-east-1b"))
    assert (launched.claim, launched.instance_type, launched.zone) == ("pool-a-0123abcd", "g6.12xlarge", "us-east-1b")
    assert (launched.node_name, launched.capacity_type, launched.state) == ("pool-a-0123abcd", ON_DEMAND, "pending")

    ec2 = described(network, launched.instance_id)
    assert ec2["ImageId"] == network.image  # the second term matched; the first matched nothing
    assert ec2["InstanceType"] == "g6.12xlarge" and "InstanceLifecycle" not in ec2
    assert ec2["SubnetId"] == network.subnets["us-east-1b"]
    assert [g["GroupId"] for g in ec2["SecurityGroups"]] == [network.security_group]
    assert {t["Key"]: t["Value"] for t in ec2["Tags"]} == {
        "team": "ml", "cost-center": "42", "Name": "pool-a-0123abcd",
        tfa.NODE_PROVISIONER: "pool-a-0123abcd", tfa.MANAGED_BY: "pool-a"}
    assert ec2["IamInstanceProfile"]["Arn"].endswith("/gpu-node")
    options = ec2["MetadataOptions"]
    assert (options["HttpTokens"], options["HttpPutResponseHopLimit"], options["HttpEndpoint"]) == ("required", 2,
                                                                                                     "enabled")
    [disk] = ec2["BlockDeviceMappings"]
    assert disk["DeviceName"] == "/dev/xvda" and disk["Ebs"]["DeleteOnTermination"] is True
    volume = network.ec2.describe_volumes(VolumeIds=[disk["Ebs"]["VolumeId"]])["Volumes"][0]
    assert (volume["Size"], volume["VolumeType"], volume["Encrypted"]) == (200, "gp3", True)
    assert {t["Key"]: t["Value"] for t in volume["Tags"]}[tfa.NODE_PROVISIONER] == "pool-a-0123abcd"
    user_data = network.ec2.describe_instance_attribute(InstanceId=launched.instance_id, Attribute="userData")
    script = base64.b64decode(user_data["UserData"]["Value"]).decode()
    assert ("--node-labels=tensor-fusion.ai/managed-by=pool-a,tensor-fusion.ai/node-provisioner=pool-a-0123abcd "
            "--hostname-override=pool-a-0123abcd'") in script

    again = await aws.create(launch(zone="us-east-1b"))  # a retry after a crash: the same instance
    assert again.instance_id == launched.instance_id
    assert [i.instance_id for i in await aws.list_instances()] == [launched.instance_id]

    await aws.terminate(launched.instance_id)
    assert described(network, launched.instance_id)["State"]["Name"] == "terminated"
    assert await aws.list_instances() == []
    await aws.terminate(launched.instance_id)  # terminated already: not an error
    await aws.terminate("i-0123456789abcdef0")  # never existed: not an error


async def test_spot_and_the_subnet_with_the_most_free_addresses(moto: MotoServer, network: Network) -> None:
    aws = provider(moto)
    only_1a = replace(CATALOG.get("g6.xlarge") or CATALOG.types[0], zones=("us-east-1a",))
    spot = await aws.create(launch("pool-a-00000002", capacity=SPOT, instance_type=only_1a))
    ec2 = described(network, spot.instance_id)
    assert ec2["InstanceLifecycle"] == "spot" and spot.capacity_type == SPOT
    assert ec2["SubnetId"] == network.wide_subnet  # the type's zone; of its two subnets the /20
    anywhere = await aws.create(launch("pool-a-00000003", spec=node_class(subnet_selector_terms=[],
                                                                          security_group_selector_terms=[]),
                                       zone="us-east-1c"))
    assert described(network, anywhere.instance_id)["Placement"]["AvailabilityZone"] == "us-east-1c"
    assert {i.claim for i in await aws.list_instances()} == {"pool-a-00000002", "pool-a-00000003"}


async def test_a_launch_template_chosen_by_tags_may_name_the_image(moto: MotoServer, network: Network) -> None:
    template = network.ec2.create_launch_template(
        LaunchTemplateName="gpu-nodes", LaunchTemplateData={"ImageId": network.image},
        TagSpecifications=[{"ResourceType": "launch-template", "Tags": [{"Key": "role", "Value": "gpu-node"}]}],
    )["LaunchTemplate"]["LaunchTemplateId"]
    spec = node_class(os_image_selector_terms=[], launch_template=LaunchTemplate(tags={"role": "gpu-node"}))
    launched = await provider(moto).create(launch(spec=spec, zone="us-east-1a"))
    tags = {t["Key"]: t["Value"] for t in described(network, launched.instance_id)["Tags"]}
    assert tags["aws:ec2launchtemplate:id"] == template  # EC2 marks what it launched from
    assert described(network, launched.instance_id)["ImageId"] == network.image
    with pytest.raises(ProviderError, match=r"spec.launchTemplate.tags \{'role': 'none'\} match no launch template"):
        await provider(moto).create(launch("pool-a-00000009", spec=msgspec.structs.replace(
            spec, launch_template=LaunchTemplate(tags={"role": "none"}))))


async def test_errors_name_the_field_and_say_whether_to_retry(moto: MotoServer, network: Network) -> None:
    aws = provider(moto)
    cases = [
        (node_class(os_image_selector_terms=[SelectorTerm(id="ami-12345678")]),
         r"GPUNodeClass gpu: spec.osImageSelectorTerms\[0\]: EC2 InvalidAMIID.NotFound"),
        (node_class(os_image_selector_terms=[SelectorTerm(tags={"role": "none"})]),
         "no image matches spec.osImageSelectorTerms"),
        (node_class(os_image_selector_terms=[]), "spec.osImageSelectorTerms is empty and there is no launchTemplate"),
        (node_class(security_group_selector_terms=[SelectorTerm(name="nope")]),
         r"spec.securityGroupSelectorTerms\[0\] matches no security group in vpc-"),
        (node_class(subnet_selector_terms=[SelectorTerm()]),
         r"spec.subnetSelectorTerms\[0\] names no id, name or tags"),
        (node_class(block_device_mappings=[BlockDeviceMapping(device_name="/dev/xvda",
                                                              ebs=EBSVolume(volume_size="x"))]),
         r"spec.blockDeviceMappings\[0\].ebs.volumeSize: 'x' is not allowed; expected a positive quantity"),
        (node_class(metadata_options=MetadataOptions(http_tokens="maybe")),
         "spec.metadataOptions.httpTokens 'maybe' is not allowed; expected required or optional"),
    ]
    for spec, message in cases:
        with pytest.raises(ProviderError, match=message) as refused:
            await aws.create(launch(spec=spec))
        assert refused.value.retryable is False, message
    with pytest.raises(ProviderError, match=r"select no subnet in zone us-east-1c \(they select 3 subnets, in "
                                            r"us-east-1a, us-east-1b\)"):
        await aws.create(launch(zone="us-east-1c"))
    with pytest.raises(ProviderError, match="capacityType 'Reserved' is not allowed; expected OnDemand or Spot"):
        await aws.create(launch(capacity="Reserved"))
    with pytest.raises(ProviderError, match="region 'eu-west-1' is not this provider's region 'us-east-1'"):
        await aws.create(replace(launch(), region="eu-west-1"))
    assert await aws.list_instances() == []

    foreign = network.ec2.run_instances(ImageId=network.image, InstanceType="m5.large", MinCount=1,
                                        MaxCount=1)["Instances"][0]["InstanceId"]
    with pytest.raises(ProviderError, match=f"instance {foreign} has no tag {tfa.NODE_PROVISIONER}"):
        await aws.terminate(foreign)
    assert described(network, foreign)["State"]["Name"] != "terminated"


async def test_credentials_from_a_secrets_values(moto: MotoServer, network: Network) -> None:
    iam = moto.client("iam")
    iam.create_user(UserName="tfusion")
    key = iam.create_access_key(UserName="tfusion")["AccessKey"]
    policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "ec2:*", "Resource": "*"}]}
    iam.put_user_policy(UserName="tfusion", PolicyName="ec2", PolicyDocument=json.dumps(policy))
    # as a Secret's data decodes: bytes, a newline from the file the key was saved in, an empty token
    credentials = credentials_from_secret({"aws_access_key_id": key["AccessKeyId"].encode() + b"\n",
                                           "aws_secret_access_key": key["SecretAccessKey"], "aws_session_token": b""})
    assert credentials == AwsCredentials(key["AccessKeyId"], key["SecretAccessKey"], "")
    assert key["SecretAccessKey"] not in repr(credentials)
    with moto.auth_enforced():
        launched = await provider(moto, credentials).create(launch())
        wrong = replace(credentials, secret_access_key="not-the-secret")
        with pytest.raises(ProviderError, match="list instances: EC2 AuthFailure") as refused:
            await provider(moto, wrong).list_instances()
        assert refused.value.retryable is False
    assert described(network, launched.instance_id)["Tags"]


async def test_an_unreachable_endpoint_is_worth_retrying() -> None:
    aws = AwsProvider(CATALOG, region=REGION, endpoint_url=f"http://127.0.0.1:{closed_port()}",
                      credentials=AwsCredentials("testing", "testing"))
    with pytest.raises(ProviderError, match="list instances: Could not connect") as refused:
        await aws.list_instances()
    assert refused.value.retryable is True


