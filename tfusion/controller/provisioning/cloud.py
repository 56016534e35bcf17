"""Which provider launches a pool's nodes, built once per configuration and shared by the claim
reconciler, pool provisioning and the expander.

- `provisioningMode: Karpenter`: Karpenter NodeClaims against the pool's `karpenterNodeClassRef`.
- `provisioningMode: Provisioned`: the owning TensorFusionCluster's `spec.computingVendor.type`:
  `aws` (EC2), `mock` (simulated); none named means simulated on one machine (`--role=all`) and is an
  error elsewhere, where nothing would boot the simulated instances.
- AWS credentials: a Secret in the operator namespace named by the vendor's
  `params.extraParams.credentialsSecret`, else the files `params.accessKeyPath` /
  `params.secretKeyPath`, else boto3's usual chain (environment, profile, instance role).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from tfusion.api import annotations as tfa
from tfusion.api.accessors import Body, GpuPool, section, text
from tfusion.controller.provisioning import catalog as cat
from tfusion.controller.provisioning.providers.base import CloudProvider
from tfusion.kube import resources as r
from tfusion.kube.client import KubeError, NotFound

if TYPE_CHECKING:
    from tfusion.controller.runtime import ControllerRuntime

PROVISIONED, KARPENTER, AUTO_SELECT = "Provisioned", "Karpenter", "AutoSelect"
SIMULATED_VENDORS = ("mock", "")
#: the Secret the shipped RBAC lets the controller read in its namespace
DEFAULT_CREDENTIALS_SECRET = "tensor-fusion-cloud-credentials"


class ProviderUnavailable(Exception):
    """The pool's provider cannot be used; the message says what to set."""


class Providers:
    """Providers by configuration: one instance per distinct setting, so caches and clients are reused."""

    def __init__(self, runtime: ControllerRuntime) -> None:
        self.runtime = runtime
        settings = runtime.settings
        self.catalog = cat.load(Path(settings.provisioning_catalog) if settings.provisioning_catalog
                                else cat.DEFAULT_CATALOG)
        self.clusters = runtime.informer(r.TENSORFUSIONCLUSTERS)
        self._built: dict[tuple[str, ...], CloudProvider] = {}

    def cluster_of(self, pool: GpuPool) -> Body | None:
        name = pool.meta.label(tfa.CLUSTER) or next(
            (str(ref.get("name")) for ref in pool.meta.owner_references if ref.get("kind") == "TensorFusionCluster"),
            "")
        found = self.clusters.get(name) if name else None
        return Body(found) if found is not None else None

    async def for_pool(self, pool: GpuPool) -> CloudProvider:
        mode = pool.provisioning_mode
        if mode == KARPENTER:
            return self._karpenter(pool)
        if mode != PROVISIONED:
            raise ProviderUnavailable(f"GPUPool {pool.name} has provisioningMode {mode}: its nodes are not provisioned")
        cluster = self.cluster_of(pool)
        vendor = section(cluster.raw if cluster else None, "spec", "computingVendor")
        kind = text(vendor, "type")
        if vendor and vendor.get("enable") is False:
            raise ProviderUnavailable(f"the computingVendor of TensorFusionCluster {cluster.name if cluster else ''} "
                                      "is disabled (enable: false)")
        if kind in SIMULATED_VENDORS:
            if not kind and "all" not in self.runtime.settings.roles:
                raise ProviderUnavailable(
                    f"GPUPool {pool.name} is Provisioned but its TensorFusionCluster names no computingVendor.type; "
                    "set aws, karpenter (provisioningMode: Karpenter) or mock (simulated nodes, --role=all only)")
            return self._simulated()
        if kind == "aws":
            return await self._aws(section(vendor, "params"))
        raise ProviderUnavailable(f"computingVendor.type {kind!r} has no provider in tfusion; supported: aws, mock "
                                  "(simulated), and provisioningMode: Karpenter")

    def _cached(self, key: tuple[str, ...], build: Any) -> CloudProvider:
        if key not in self._built:
            self._built[key] = build()
        return self._built[key]

    def _simulated(self) -> CloudProvider:
        from tfusion.controller.provisioning.providers.simulated import SimulatedProvider

        settings = self.runtime.settings
        return self._cached(("simulated",), lambda: SimulatedProvider(
            self.runtime.client, settings.operator_namespace, self.catalog,
            boot_delay_s=settings.simulated_boot_delay))

    def _karpenter(self, pool: GpuPool) -> CloudProvider:
        from tfusion.api.kinds.common import GroupKindName
        from tfusion.controller.provisioning.providers.karpenter import KarpenterProvider

        ref = section(pool.node_manager_config, "nodeProvisioner", "karpenterNodeClassRef")
        node_class = GroupKindName(group=text(ref, "group"), kind=text(ref, "kind"), version=text(ref, "version"),
                                   name=text(ref, "name")) if ref else None
        key = ("karpenter", *(text(ref, k) for k in ("group", "kind", "version", "name")))
        return self._cached(key, lambda: KarpenterProvider(self.runtime.client, self.catalog,
                                                           node_class_ref=node_class))

    async def _aws(self, params: Mapping[str, Any]) -> CloudProvider:
        from tfusion.controller.provisioning.providers.aws import AwsProvider

        region = text(params, "defaultRegion")
        if not region:
            raise ProviderUnavailable("computingVendor.params.defaultRegion is required for the aws provider")
        credentials = await self._aws_credentials(params)
        # a rotated Secret or key file builds a new client; the same credentials reuse the old one
        key = ("aws", region, *((credentials.access_key_id, credentials.secret_access_key) if credentials else ()))
        return self._cached(key, lambda: AwsProvider(self.catalog, region=region, credentials=credentials,
                                                     endpoint_url=self.runtime.settings.cloud_endpoint_url))

    async def _aws_credentials(self, params: Mapping[str, Any]) -> Any:
        from tfusion.controller.provisioning.providers.aws import AwsCredentials, credentials_from_secret

        secret_name = text(params, "extraParams", "credentialsSecret")
        if secret_name:
            namespace = self.runtime.settings.operator_namespace
            try:
                secret = await self.runtime.client.get(r.SECRETS, secret_name, namespace=namespace)
            except NotFound:
                raise ProviderUnavailable(f"computingVendor.params.extraParams.credentialsSecret: Secret "
                                          f"{namespace}/{secret_name} does not exist") from None
            except KubeError as exc:  # Forbidden, mostly: the shipped Role grants one name
                raise ProviderUnavailable(f"computingVendor.params.extraParams.credentialsSecret: cannot read "
                                          f"Secret {namespace}/{secret_name}: {exc} (the shipped RBAC lets the "
                                          f"controller read {DEFAULT_CREDENTIALS_SECRET} only)") from None
            data = {k: base64.b64decode(v).decode() for k, v in section(secret, "data").items() if isinstance(v, str)}
            try:
                return credentials_from_secret(data)
            except ValueError as exc:
                raise ProviderUnavailable(f"Secret {namespace}/{secret_name}: {exc}") from None
        key_path, secret_path = text(params, "accessKeyPath"), text(params, "secretKeyPath")
        if key_path or secret_path:
            if not (key_path and secret_path):
                raise ProviderUnavailable("computingVendor.params: accessKeyPath and secretKeyPath go together")
            try:
                key_id = (await anyio.Path(key_path).read_text()).strip()
                secret_key = (await anyio.Path(secret_path).read_text()).strip()
            except OSError as exc:
                raise ProviderUnavailable(f"computingVendor.params: cannot read the access key files: {exc}") from None
            return AwsCredentials(access_key_id=key_id, secret_access_key=secret_key)
        return None  # boto3's own chain
