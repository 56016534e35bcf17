"""The pure parts of the AWS and Karpenter providers: credentials from a Secret, EC2 errors and
whether to retry them, volume sizes, image choice, user data, tags, and what an EC2 instance or a
NodeClaim says about its instance."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from typing import Any

import pytest

from tfusion.api import annotations as tfa
from tfusion.api.kinds.common import GroupKindName
from tfusion.api.kinds.provisioning import BlockDeviceMapping, GPUNodeClassSpec, MetadataOptions
from tfusion.controller.provisioning.catalog import ON_DEMAND, SPOT, load
from tfusion.controller.provisioning.providers import aws, karpenter
from tfusion.controller.provisioning.providers.base import LaunchRequest, ProviderError

CATALOG = load()
NODE_CLASS = GroupKindName(group="karpenter.k8s.aws", kind="EC2NodeClass", version="v1", name="gpu")


def request(**changes: Any) -> LaunchRequest:
    base: dict[str, Any] = {"claim": "pool-a-0000abcd", "node_name": "pool-a-0000abcd",
                            "instance_type": CATALOG.types[0], "capacity_type": ON_DEMAND,
                            "labels": {tfa.NODE_PROVISIONER: "pool-a-0000abcd", "zz": "last"}}
    return LaunchRequest(**{**base, **changes})


def test_credentials_from_a_secret_name_the_missing_key() -> None:
    assert aws.credentials_from_secret({"aws_access_key_id": "AKIA", "aws_secret_access_key": b" s3cret\n",
                                        "aws_session_token": "tok"}) == aws.AwsCredentials("AKIA", "s3cret", "tok")
    with pytest.raises(ProviderError, match="key 'aws_secret_access_key' is missing or empty") as missing:
        aws.credentials_from_secret({"aws_access_key_id": "AKIA", "aws_secret_access_key": "\n"})
    assert missing.value.retryable is False
    with pytest.raises(ValueError, match="key 'aws_access_key_id' is missing"):  # a ValueError too
        aws.credentials_from_secret({})
    with pytest.raises(ProviderError, match="key 'aws_access_key_id' is not UTF-8 text"):
        aws.credentials_from_secret({"aws_access_key_id": b"\xff", "aws_secret_access_key": "x"})
    assert "s3cret" not in repr(aws.AwsCredentials("AKIA", "s3cret", "tok")) and "tok" not in repr(
        aws.AwsCredentials("AKIA", "s3cret", "tok"))


@pytest.mark.parametrize(("code", "status", "retryable"), [
    ("RequestLimitExceeded", 503, True), ("InsufficientInstanceCapacity", 500, True),
    ("VcpuLimitExceeded", 400, True), ("SomethingNew", 503, True),
    ("InvalidParameterValue", 400, False), ("UnauthorizedOperation", 403, False), ("AuthFailure", 401, False),
])
def test_ec2_errors_are_retried_when_they_may_pass(code: str, status: int, retryable: bool) -> None:
    error = aws.client_error("launch x", {"Error": {"Code": code, "Message": "why"},
                                          "ResponseMetadata": {"HTTPStatusCode": status}})
    assert (error.code, error.retryable, str(error)) == (code, retryable, f"launch x: EC2 {code}: why")


def test_volume_sizes_round_up_to_whole_gib() -> None:
    assert [aws.volume_gib("f", size) for size in ("200Gi", "100G", "1", "1Ti")] == [200, 94, 1, 1024]
    for bad in ("0", "-5Gi", "lots", ""):
        with pytest.raises(ProviderError, match=f"f: {bad!r} is not allowed; expected a positive quantity"):
            aws.volume_gib("f", bad)


def test_block_devices_and_metadata_options_refuse_what_ec2_cannot_take() -> None:
    with pytest.raises(ProviderError, match=r"c: spec.blockDeviceMappings\[1\].ebs is missing"):
        aws.block_device("c", 1, BlockDeviceMapping(device_name="/dev/xvdb"))
    with pytest.raises(ProviderError, match=r"c: spec.blockDeviceMappings\[0\].deviceName is empty"):
        aws.block_device("c", 0, BlockDeviceMapping())
    with pytest.raises(ProviderError, match="httpPutResponseHopLimit 0 is not allowed; expected 1 to 64"):
        aws.metadata_options("c", MetadataOptions(http_put_response_hop_limit=0))
    assert aws.metadata_options("c", MetadataOptions(http_endpoint=False, http_tokens="optional")) == {
        "HttpEndpoint": "disabled", "HttpProtocolIpv6": "disabled", "HttpPutResponseHopLimit": 1,
        "HttpTokens": "optional"}


def test_the_newest_image_wins() -> None:
    images = [{"ImageId": "ami-1", "CreationDate": "2026-01-02T00:00:00.000Z"},
              {"ImageId": "ami-2", "CreationDate": "2026-03-01T00:00:00.000Z"},
              {"ImageId": "ami-0", "CreationDate": "2025-12-31T23:59:59.000Z"}]
    assert aws.newest_image(images) == "ami-2"
    assert aws.newest_image([]) == ""


def test_user_data_gets_the_labels_and_tfusions_tags_win() -> None:
    rendered = aws.render_user_data("--node-labels={{TFUSION_NODE_LABELS}} --name {{TFUSION_NODE_NAME}} ${X}",
                                    request())
    assert rendered == "--node-labels=tensor-fusion.ai/node-provisioner=pool-a-0000abcd,zz=last " \
                       "--name pool-a-0000abcd ${X}"
    spec = GPUNodeClassSpec(tags={"Name": "mine", tfa.NODE_PROVISIONER: "forged", "team": "ml"})
    tags = aws.instance_tags(request(node_class=spec, tags={"team": "research"}))
    assert tags == {"Name": "pool-a-0000abcd", tfa.NODE_PROVISIONER: "pool-a-0000abcd", "team": "research",
                    tfa.MANAGED_BY: "tensor-fusion"}
    pool_in_tags = request(labels={tfa.NODE_PROVISIONER: "c"}, tags={tfa.MANAGED_BY: "pool-b"})
    assert aws.instance_tags(pool_in_tags)[tfa.MANAGED_BY] == "pool-b"
    assert karpenter.nodeclaim_for(pool_in_tags, NODE_CLASS)["metadata"] == {
        "name": "pool-a-0000abcd", "labels": {tfa.NODE_PROVISIONER: "pool-a-0000abcd", tfa.MANAGED_BY: "pool-b"}}
    assert len(aws.client_token("x" * 253)) <= 64 and aws.client_token("a") != aws.client_token("b")


def test_what_an_ec2_instance_says() -> None:
    launched = datetime(2026, 1, 1, tzinfo=UTC)
    described = {"InstanceId": "i-1", "InstanceType": "g6.xlarge", "State": {"Name": "shutting-down"},
                 "InstanceLifecycle": "spot", "Placement": {"AvailabilityZone": "us-east-1a"},
                 "LaunchTime": launched, "PrivateDnsName": "ip-10-0-0-1.ec2.internal",
                 "Tags": [{"Key": tfa.NODE_PROVISIONER, "Value": "c1"}]}
    instance = aws.ec2_instance(described)
    assert (instance.instance_id, instance.claim, instance.state, instance.capacity_type) == (
        "i-1", "c1", "terminating", SPOT)
    assert (instance.node_name, instance.zone, instance.launched_at) == (
        "ip-10-0-0-1.ec2.internal", "us-east-1a", launched.timestamp())


@pytest.mark.anyio
async def test_without_boto3_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)  # import boto3 now raises ImportError
    provider = aws.AwsProvider(CATALOG, region="us-east-1")
    with pytest.raises(ProviderError, match=r"needs boto3, which is not installed: pip install 'tfusion\[aws\]'") \
            as refused:
        await provider.list_instances()
    assert refused.value.retryable is False


def test_what_a_nodeclaim_says() -> None:
    nodeclaim: dict[str, Any] = {
        "metadata": {"name": "c1", "creationTimestamp": "2026-01-01T00:00:00Z",
                     "labels": {tfa.NODE_PROVISIONER: "c1"}},
        "spec": {"requirements": [
            {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["g6.xlarge"]},
            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]}]},
        "status": {"providerID": "aws:///us-west-2b/i-0abc"}}
    pending = karpenter.nodeclaim_instance(nodeclaim)
    assert (pending.state, pending.instance_type, pending.capacity_type, pending.zone) == (
        "pending", "g6.xlarge", SPOT, "us-west-2b")
    assert pending.launched_at == datetime(2026, 1, 1, tzinfo=UTC).timestamp()
    nodeclaim["status"]["nodeName"] = "ip-1"
    assert karpenter.nodeclaim_instance(nodeclaim).state == "running"
    nodeclaim["metadata"]["deletionTimestamp"] = "2026-01-01T01:00:00Z"
    assert karpenter.nodeclaim_instance(nodeclaim).state == "terminating"
    nodeclaim["status"]["providerID"] = "kind://docker/kind/kind-worker"
    assert karpenter.nodeclaim_instance(nodeclaim).zone == ""
