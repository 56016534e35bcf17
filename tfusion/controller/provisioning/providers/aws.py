"""EC2 instances for Provisioned pools, launched from a GPUNodeClass through boto3.

Why it exists: a Provisioned pool on AWS needs tfusion itself to launch and terminate GPU instances,
without Karpenter. Everything the launch needs comes from the GPUNodeClass (image, subnets, security
groups, disks, tags, user data, instance profile, metadata options) and the claim (instance type,
capacity type, zone); the prices come from the catalog, because EC2's API has none.

Every instance carries the tags `tensor-fusion.ai/node-provisioner=<claim>` and
`tensor-fusion.ai/managed-by`, which is how a retried launch finds the instance it already made and
how `list_instances` and `terminate` tell tfusion's instances from the account's others. The Node's
labels reach the kubelet through the class's user data: `{{TFUSION_NODE_LABELS}}` in it becomes
`key=value,...` (for the kubelet's `--node-labels`) and `{{TFUSION_NODE_NAME}}` the node's name.

boto3 is optional (`pip install 'tfusion[aws]'`) and imported on first use. Its calls block, so
each runs in a worker thread, with connect and read timeouts, never on the event loop.
"""

from __future__ import annotations

import functools
import hashlib
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import anyio.to_thread

from tfusion.api import annotations as tfa
from tfusion.api.kinds import provisioning as kinds
from tfusion.api.quantity import Quantity, QuantityError
from tfusion.controller.provisioning.catalog import CAPACITY_TYPES, ON_DEMAND, SPOT, Catalog
from tfusion.controller.provisioning.providers.base import Instance, LaunchRequest, ProviderError, managed_by

INSTALL_HINT = "pip install 'tfusion[aws]'"
#: the keys of a credentials Secret
ACCESS_KEY_ID, SECRET_ACCESS_KEY, SESSION_TOKEN = "aws_access_key_id", "aws_secret_access_key", "aws_session_token"
NODE_LABELS_PLACEHOLDER, NODE_NAME_PLACEHOLDER = "{{TFUSION_NODE_LABELS}}", "{{TFUSION_NODE_NAME}}"
CONNECT_TIMEOUT_S, READ_TIMEOUT_S, ATTEMPTS = 5.0, 30.0, 3
GIB = 1 << 30
#: EC2 states tfusion's instances can be in, and what `Instance.state` calls them. Nothing in tfusion
#: stops an instance, so a stopped one is on its way out.
_STATES = {"pending": "pending", "running": "running", "shutting-down": "terminating",
           "stopping": "terminating", "stopped": "terminating", "terminated": "terminated"}
_LIVE = ["pending", "running", "shutting-down", "stopping", "stopped"]
#: error codes that mean "the same call may work later"; any 5xx is retried too
RETRYABLE_CODES = frozenset({
    "RequestLimitExceeded", "Throttling", "ThrottlingException", "RequestTimeout", "RequestExpired",
    "InternalError", "InternalFailure", "ServiceUnavailable", "Unavailable",
    "InsufficientInstanceCapacity", "InsufficientHostCapacity", "InsufficientCapacity",
    "InsufficientFreeAddressesInSubnet", "InstanceLimitExceeded", "VcpuLimitExceeded",
    "MaxSpotInstanceCountExceeded", "SpotMaxPriceTooLow", "IncorrectState", "DependencyViolation",
})
_IMAGE_OWNERS = {"Private": ["self"], "System": ["amazon"]}


class CredentialsError(ProviderError, ValueError):
    """A credentials Secret that cannot be used; the message names the key. Never retried as it is."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)


@dataclass(frozen=True)
class AwsCredentials:
    access_key_id: str
    secret_access_key: str = field(repr=False)
    session_token: str = field(default="", repr=False)


def credentials_from_secret(data: Mapping[str, bytes | str]) -> AwsCredentials:
    """Credentials from a Secret's values (already base64-decoded: bytes, or str as in stringData).
    Surrounding whitespace is dropped: a key saved from a file usually ends in a newline."""
    def value(key: str) -> str:
        raw = data.get(key, b"")
        try:
            return (raw.decode() if isinstance(raw, bytes) else raw).strip()
        except UnicodeDecodeError:
            raise CredentialsError(f"AWS credentials Secret: key {key!r} is not UTF-8 text") from None

    for key in (ACCESS_KEY_ID, SECRET_ACCESS_KEY):
        if not value(key):
            raise CredentialsError(f"AWS credentials Secret: key {key!r} is missing or empty; expected "
                                   f"{ACCESS_KEY_ID}, {SECRET_ACCESS_KEY} and optionally {SESSION_TOKEN}")
    return AwsCredentials(value(ACCESS_KEY_ID), value(SECRET_ACCESS_KEY), value(SESSION_TOKEN))


class AwsProvider:
    """`CloudProvider` over EC2 in one region. Without `credentials`, boto3's own chain applies
    (environment, IRSA web identity, instance profile); `endpoint_url` points it elsewhere (moto)."""

    name = "aws"

    def __init__(self, catalog: Catalog, *, region: str, endpoint_url: str = "",
                 credentials: AwsCredentials | None = None) -> None:
        self._catalog = catalog
        self.region = region
        self.endpoint_url = endpoint_url
        self._credentials = credentials
        self._client: Any = None
        self._lock = threading.Lock()

    def catalog(self) -> Catalog:
        return self._catalog

    async def create(self, request: LaunchRequest) -> Instance:
        if request.region and self.region and request.region != self.region:
            raise ProviderError(f"GPUNodeClaim {request.claim}: region {request.region!r} is not this provider's "
                                f"region {self.region!r}", retryable=False)
        if request.capacity_type not in CAPACITY_TYPES:
            raise ProviderError(f"GPUNodeClaim {request.claim}: capacityType {request.capacity_type!r} is not "
                                f"allowed; expected {' or '.join(CAPACITY_TYPES)}", retryable=False)
        found = await self._instances(f"find the instance of {request.claim}", [
            _tag_filter(tfa.NODE_PROVISIONER, request.claim),
            {"Name": "instance-state-name", "Values": ["pending", "running"]}])
        if found:
            return found[0]
        params = await self._launch_parameters(request)
        reply = await self._ec2("run_instances", f"launch {request.instance_type.name} for {request.claim}", **params)
        launched = ec2_instance(reply["Instances"][0])
        if launched.state in ("terminating", "terminated"):
            # EC2 may answer a reused client token with the instance it launched for it before, even a gone one
            raise ProviderError(f"launch for {request.claim}: EC2 returned instance {launched.instance_id}, "
                                f"{launched.state}, launched earlier for a claim of the same name; give the "
                                "claim a new name", retryable=False)
        return launched

    async def terminate(self, instance_id: str) -> None:
        try:
            described = await self._ec2("describe_instances", f"terminate {instance_id}", InstanceIds=[instance_id])
        except Ec2Error as exc:
            if exc.code == "InvalidInstanceID.NotFound":
                return
            raise
        for reservation in described.get("Reservations", []):
            for found in reservation.get("Instances", []):
                if found["State"]["Name"] == "terminated":
                    return
                if tfa.NODE_PROVISIONER not in _tags(found):
                    raise ProviderError(f"instance {instance_id} has no tag {tfa.NODE_PROVISIONER}: tfusion did "
                                        "not launch it and does not terminate it", retryable=False)
        await self._ec2("terminate_instances", f"terminate {instance_id}", InstanceIds=[instance_id])

    async def list_instances(self) -> list[Instance]:
        return await self._instances("list instances", [{"Name": "tag-key", "Values": [tfa.NODE_PROVISIONER]},
                                                        {"Name": "instance-state-name", "Values": _LIVE}])

    # --- launch parameters -------------------------------------------------------------------

    async def _launch_parameters(self, request: LaunchRequest) -> dict[str, Any]:
        spec = request.node_class or kinds.GPUNodeClassSpec()
        where = f"GPUNodeClass {request.node_class_name or '(none)'}"
        params: dict[str, Any] = {
            "InstanceType": request.instance_type.name, "MinCount": 1, "MaxCount": 1,
            "ClientToken": client_token(request.claim),
            "TagSpecifications": [{"ResourceType": kind, "Tags": [{"Key": k, "Value": v} for k, v in
                                                                 sorted(instance_tags(request).items())]}
                                  for kind in ("instance", "volume")],
        }
        if spec.launch_template is not None:
            params["LaunchTemplate"] = await self._launch_template(spec.launch_template, where)
        image = await self._image(spec, where)
        if image:
            params["ImageId"] = image
        elif "LaunchTemplate" not in params:
            raise ProviderError(f"{where}: spec.osImageSelectorTerms is empty and there is no launchTemplate; "
                                "one of them must name the image to boot", retryable=False)
        subnet = await self._subnet(spec.subnet_selector_terms, request, where)
        if subnet:
            params["SubnetId"] = subnet["SubnetId"]
        elif request.zone:
            params["Placement"] = {"AvailabilityZone": request.zone}
        groups = await self._security_groups(spec.security_group_selector_terms, subnet.get("VpcId", ""), where)
        if groups:
            params["SecurityGroupIds"] = groups
        if spec.block_device_mappings:
            params["BlockDeviceMappings"] = [block_device(where, i, mapping)
                                             for i, mapping in enumerate(spec.block_device_mappings)]
        if spec.user_data:
            params["UserData"] = render_user_data(spec.user_data, request)  # boto3 base64-encodes it
        if spec.instance_profile:
            key = "Arn" if spec.instance_profile.startswith("arn:") else "Name"
            params["IamInstanceProfile"] = {key: spec.instance_profile}
        if spec.metadata_options is not None:
            params["MetadataOptions"] = metadata_options(where, spec.metadata_options)
        if request.capacity_type == SPOT:
            params["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": {
                "SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}}
        return params

    async def _launch_template(self, template: kinds.LaunchTemplate, where: str) -> dict[str, str]:
        if template.id:
            return {"LaunchTemplateId": template.id, "Version": "$Default"}
        if template.name:
            return {"LaunchTemplateName": template.name, "Version": "$Default"}
        if not template.tags:
            raise ProviderError(f"{where}: spec.launchTemplate names no id, name or tags", retryable=False)
        reply = await self._ec2("describe_launch_templates", f"{where}: spec.launchTemplate.tags",
                                Filters=_tag_filters(template.tags))
        found = sorted(t["LaunchTemplateId"] for t in reply.get("LaunchTemplates", []))
        if not found:
            raise ProviderError(f"{where}: spec.launchTemplate.tags {template.tags} match no launch template",
                                retryable=False)
        return {"LaunchTemplateId": found[0], "Version": "$Default"}

    async def _image(self, spec: kinds.GPUNodeClassSpec, where: str) -> str:
        """The first term that matches any image decides; among its images the newest wins."""
        for i, term in enumerate(spec.os_image_selector_terms):
            field_name = f"{where}: spec.osImageSelectorTerms[{i}]"
            query: dict[str, Any] = {}
            if term.id:
                query["ImageIds"] = [term.id]
            elif spec.os_image_type in _IMAGE_OWNERS:
                query["Owners"] = _IMAGE_OWNERS[spec.os_image_type]
            filters = _term_filters(term, field_name, name_filter="name")
            if spec.os_image_type == "Public" and not term.id:
                filters.append({"Name": "is-public", "Values": ["true"]})
            if filters:
                query["Filters"] = filters
            reply = await self._ec2("describe_images", field_name, **query)
            image = newest_image(reply.get("Images", []))
            if image:
                return image
        if spec.os_image_selector_terms:
            raise ProviderError(f"{where}: no image matches spec.osImageSelectorTerms "
                                f"(osImageType {spec.os_image_type})", retryable=False)
        return ""

    async def _subnet(self, terms: Sequence[kinds.SelectorTerm], request: LaunchRequest, where: str) -> dict[str, Any]:
        """Among the subnets the terms select, those in the claim's zone (else in a zone the instance
        type is sold in), the one with the most free addresses."""
        if not terms:
            return {}
        subnets: dict[str, dict[str, Any]] = {}
        for i, term in enumerate(terms):
            field_name = f"{where}: spec.subnetSelectorTerms[{i}]"
            query: dict[str, Any] = {"Filters": _term_filters(term, field_name, name_filter="tag:Name")}
            if term.id:
                query["SubnetIds"] = [term.id]
            reply = await self._ec2("describe_subnets", field_name, **query)
            subnets.update((s["SubnetId"], s) for s in reply.get("Subnets", []))
        zones = [request.zone] if request.zone else list(request.instance_type.zones)
        fitting = [s for s in subnets.values() if not zones or s.get("AvailabilityZone") in zones]
        if not fitting:
            found = sorted({str(s.get("AvailabilityZone")) for s in subnets.values()})
            raise ProviderError(f"{where}: spec.subnetSelectorTerms select no subnet in zone {' or '.join(zones)} "
                                f"(they select {len(subnets)} subnets, in {', '.join(found) or 'no zone'})",
                                retryable=False)
        return max(fitting, key=lambda s: (int(s.get("AvailableIpAddressCount", 0)), s["SubnetId"]))

    async def _security_groups(self, terms: Sequence[kinds.SelectorTerm], vpc: str, where: str) -> list[str]:
        groups: set[str] = set()
        for i, term in enumerate(terms):
            field_name = f"{where}: spec.securityGroupSelectorTerms[{i}]"
            query: dict[str, Any] = {}
            if term.id:
                query["GroupIds"] = [term.id]
            filters = _term_filters(term, field_name, name_filter="group-name")
            if vpc and not term.id:
                filters.append({"Name": "vpc-id", "Values": [vpc]})
            if filters:
                query["Filters"] = filters
            reply = await self._ec2("describe_security_groups", field_name, **query)
            matched = [g["GroupId"] for g in reply.get("SecurityGroups", [])]
            if not matched:
                raise ProviderError(f"{field_name} matches no security group" + (f" in {vpc}" if vpc else ""),
                                    retryable=False)
            groups.update(matched)
        return sorted(groups)

    # --- EC2 calls ---------------------------------------------------------------------------

    async def _instances(self, what: str, filters: list[dict[str, Any]]) -> list[Instance]:
        found: list[Instance] = []
        params: dict[str, Any] = {"Filters": filters}
        while True:
            page = await self._ec2("describe_instances", what, **params)
            found.extend(ec2_instance(i) for r in page.get("Reservations", []) for i in r.get("Instances", []))
            if not page.get("NextToken"):
                return sorted(found, key=lambda i: (i.launched_at, i.instance_id))
            params["NextToken"] = page["NextToken"]

    async def _ec2(self, operation: str, what: str, **params: Any) -> dict[str, Any]:
        """One EC2 call in a worker thread; its failure as a ProviderError that says `what` failed."""
        call = functools.partial(self._call, operation, what, params)
        reply: dict[str, Any] = await anyio.to_thread.run_sync(call)
        return reply

    def _call(self, operation: str, what: str, params: dict[str, Any]) -> dict[str, Any]:
        client = self._ec2_client()
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            reply: dict[str, Any] = getattr(client, operation)(**params)
        except ClientError as exc:
            raise client_error(what, exc.response) from None
        except BotoCoreError as exc:
            raise _transport_error(what, exc) from None
        return reply

    def _ec2_client(self) -> Any:
        with self._lock:  # boto3 sessions are not thread-safe; the client they make is
            if self._client is None:
                self._client = _make_client(self.region, self.endpoint_url, self._credentials)
            return self._client


def _make_client(region: str, endpoint_url: str, credentials: AwsCredentials | None) -> Any:
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise ProviderError(f"the AWS provider needs boto3, which is not installed: {INSTALL_HINT}",
                            retryable=False) from None
    keys = {} if credentials is None else {
        "aws_access_key_id": credentials.access_key_id, "aws_secret_access_key": credentials.secret_access_key,
        "aws_session_token": credentials.session_token or None}
    session = boto3.session.Session(region_name=region or None, **keys)
    config = Config(connect_timeout=CONNECT_TIMEOUT_S, read_timeout=READ_TIMEOUT_S, user_agent_extra="tfusion",
                    retries={"max_attempts": ATTEMPTS, "mode": "standard"})
    try:
        return session.client("ec2", endpoint_url=endpoint_url or None, config=config)
    except Exception as exc:  # botocore's NoRegionError and bad endpoint URLs
        raise ProviderError(f"cannot make an EC2 client (region {region!r}, endpoint {endpoint_url!r}): {exc}",
                            retryable=False) from None


# --- pure parts --------------------------------------------------------------------------------


class Ec2Error(ProviderError):
    """A ProviderError from an EC2 error response; `code` is EC2's error code."""

    def __init__(self, message: str, *, code: str, retryable: bool) -> None:
        super().__init__(message, retryable=retryable)
        self.code = code


def client_error(what: str, response: Mapping[str, Any]) -> Ec2Error:
    error = response.get("Error") or {}
    code = str(error.get("Code") or "")
    status = int((response.get("ResponseMetadata") or {}).get("HTTPStatusCode") or 0)
    retryable = code in RETRYABLE_CODES or status >= 500
    return Ec2Error(f"{what}: EC2 {code or status}: {error.get('Message') or 'no message'}",
                    code=code, retryable=retryable)


def _transport_error(what: str, exc: Exception) -> ProviderError:
    kind = type(exc).__name__
    settled = kind in ("NoCredentialsError", "PartialCredentialsError", "NoRegionError", "ParamValidationError")
    return ProviderError(f"{what}: {exc}", retryable=not settled)


def client_token(claim: str) -> str:
    """EC2's idempotency token for a claim's launch (at most 64 characters, so a digest of the name)."""
    return "tfusion-" + hashlib.sha256(claim.encode()).hexdigest()[:48]


def instance_tags(request: LaunchRequest) -> dict[str, str]:
    """The class's tags, then the request's, then tfusion's own, which nothing may override."""
    spec = request.node_class or kinds.GPUNodeClassSpec()
    return {**spec.tags, **request.tags, tfa.MANAGED_BY: managed_by(request), tfa.NODE_PROVISIONER: request.claim,
            "Name": request.node_name}


def render_user_data(user_data: str, request: LaunchRequest) -> str:
    labels = {**request.labels, tfa.NODE_PROVISIONER: request.claim}
    rendered = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
    return user_data.replace(NODE_LABELS_PLACEHOLDER, rendered).replace(NODE_NAME_PLACEHOLDER, request.node_name)


def block_device(where: str, index: int, mapping: kinds.BlockDeviceMapping) -> dict[str, Any]:
    field_name = f"{where}: spec.blockDeviceMappings[{index}]"
    if not mapping.device_name:
        raise ProviderError(f"{field_name}.deviceName is empty; expected a device such as /dev/xvda",
                            retryable=False)
    if mapping.ebs is None:
        raise ProviderError(f"{field_name}.ebs is missing; only EBS volumes can be attached", retryable=False)
    ebs: dict[str, Any] = {"DeleteOnTermination": mapping.ebs.delete_on_termination,
                           "Encrypted": mapping.ebs.encrypted}
    if mapping.ebs.volume_size:
        ebs["VolumeSize"] = volume_gib(f"{field_name}.ebs.volumeSize", mapping.ebs.volume_size)
    if mapping.ebs.volume_type:
        ebs["VolumeType"] = mapping.ebs.volume_type
    return {"DeviceName": mapping.device_name, "Ebs": ebs}


def volume_gib(field_name: str, size: str) -> int:
    """EC2 sizes volumes in whole GiB: a quantity rounded up ("100G" is 94 GiB)."""
    try:
        amount = Quantity.parse(size)
    except QuantityError:
        amount = Quantity(0)
    if amount.sign() <= 0:
        raise ProviderError(f"{field_name}: {size!r} is not allowed; expected a positive quantity such as 200Gi",
                            retryable=False)
    return -(-amount.value() // GIB)


def metadata_options(where: str, options: kinds.MetadataOptions) -> dict[str, Any]:
    if options.http_tokens not in ("required", "optional"):
        raise ProviderError(f"{where}: spec.metadataOptions.httpTokens {options.http_tokens!r} is not allowed; "
                            "expected required or optional", retryable=False)
    if not 1 <= options.http_put_response_hop_limit <= 64:
        raise ProviderError(f"{where}: spec.metadataOptions.httpPutResponseHopLimit "
                            f"{options.http_put_response_hop_limit} is not allowed; expected 1 to 64", retryable=False)

    def enabled(flag: bool) -> str:
        return "enabled" if flag else "disabled"

    return {"HttpEndpoint": enabled(options.http_endpoint), "HttpProtocolIpv6": enabled(options.http_protocol_ipv6),
            "HttpPutResponseHopLimit": options.http_put_response_hop_limit, "HttpTokens": options.http_tokens}


def newest_image(images: Sequence[Mapping[str, Any]]) -> str:
    """The image created last (ties: the larger id); "" for none. CreationDate is ISO 8601 in UTC, so
    the strings sort in time order."""
    if not images:
        return ""
    return str(max(images, key=lambda i: (str(i.get("CreationDate") or ""), str(i["ImageId"])))["ImageId"])


def ec2_instance(described: Mapping[str, Any]) -> Instance:
    tags = _tags(described)
    launched: object = described.get("LaunchTime")
    return Instance(
        instance_id=str(described["InstanceId"]), claim=tags.get(tfa.NODE_PROVISIONER, ""),
        instance_type=str(described.get("InstanceType", "")),
        node_name=tags.get("Name") or str(described.get("PrivateDnsName") or ""),
        state=_STATES.get(str((described.get("State") or {}).get("Name")), "pending"),
        capacity_type=SPOT if described.get("InstanceLifecycle") == "spot" else ON_DEMAND,
        zone=str((described.get("Placement") or {}).get("AvailabilityZone") or ""),
        launched_at=launched.timestamp() if isinstance(launched, datetime) else 0.0,
    )


def _tags(described: Mapping[str, Any]) -> dict[str, str]:
    return {str(t["Key"]): str(t["Value"]) for t in described.get("Tags") or []}


def _tag_filter(key: str, value: str) -> dict[str, Any]:
    return {"Name": f"tag:{key}", "Values": [value]}


def _tag_filters(tags: Mapping[str, str]) -> list[dict[str, Any]]:
    return [_tag_filter(k, v) for k, v in sorted(tags.items())]


def _term_filters(term: kinds.SelectorTerm, field_name: str, *, name_filter: str) -> list[dict[str, Any]]:
    if not (term.id or term.name or term.tags):
        raise ProviderError(f"{field_name} names no id, name or tags", retryable=False)
    filters = _tag_filters(term.tags)
    if term.name:
        filters.append({"Name": name_filter, "Values": [term.name]})
    return filters

