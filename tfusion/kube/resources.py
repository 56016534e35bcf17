"""The Kubernetes resources tfusion reads and writes, named once.

A `Resource` is everything the REST path needs (group, version, plural, scope) plus the kind, so
the client, informers and tests address kinds by constant rather than by scattered strings.
"""

from __future__ import annotations

from dataclasses import dataclass

TF_GROUP = "tensor-fusion.ai"


@dataclass(frozen=True)
class Resource:
    """One REST resource: `group` is "" for the core API."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        """The apiVersion field of its objects ("v1" or "group/version")."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def name(self) -> str:
        """kubectl-style name: "pods", "gpus.tensor-fusion.ai"."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def __str__(self) -> str:
        return self.name


PODS = Resource("", "v1", "pods", "Pod", True)
NODES = Resource("", "v1", "nodes", "Node", False)
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", False)
EVENTS = Resource("", "v1", "events", "Event", True)
CONFIGMAPS = Resource("", "v1", "configmaps", "ConfigMap", True)
SECRETS = Resource("", "v1", "secrets", "Secret", True)
SERVICES = Resource("", "v1", "services", "Service", True)
SERVICEACCOUNTS = Resource("", "v1", "serviceaccounts", "ServiceAccount", True)
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease", True)
TOKENREVIEWS = Resource("authentication.k8s.io", "v1", "tokenreviews", "TokenReview", False)
DEPLOYMENTS = Resource("apps", "v1", "deployments", "Deployment", True)
REPLICASETS = Resource("apps", "v1", "replicasets", "ReplicaSet", True)
JOBS = Resource("batch", "v1", "jobs", "Job", True)
CUSTOMRESOURCEDEFINITIONS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions",
                                     "CustomResourceDefinition", False)

GPUS = Resource(TF_GROUP, "v1", "gpus", "GPU", False)
GPUNODES = Resource(TF_GROUP, "v1", "gpunodes", "GPUNode", False)
GPUPOOLS = Resource(TF_GROUP, "v1", "gpupools", "GPUPool", False)
TENSORFUSIONCLUSTERS = Resource(TF_GROUP, "v1", "tensorfusionclusters", "TensorFusionCluster", False)
GPUNODECLASSES = Resource(TF_GROUP, "v1", "gpunodeclasses", "GPUNodeClass", False)
GPUNODECLAIMS = Resource(TF_GROUP, "v1", "gpunodeclaims", "GPUNodeClaim", False)
SCHEDULINGCONFIGTEMPLATES = Resource(TF_GROUP, "v1", "schedulingconfigtemplates", "SchedulingConfigTemplate",
                                     False)
GPURESOURCEQUOTAS = Resource(TF_GROUP, "v1", "gpuresourcequotas", "GPUResourceQuota", True)
PROVIDERCONFIGS = Resource(TF_GROUP, "v1", "providerconfigs", "ProviderConfig", False)
TENSORFUSIONWORKLOADS = Resource(TF_GROUP, "v1", "tensorfusionworkloads", "TensorFusionWorkload", True)
WORKLOADPROFILES = Resource(TF_GROUP, "v1", "workloadprofiles", "WorkloadProfile", True)
TENSORFUSIONCONNECTIONS = Resource(TF_GROUP, "v1", "tensorfusionconnections", "TensorFusionConnection", True)

#: the 12 tensor-fusion.ai/v1 kinds
TF_RESOURCES: tuple[Resource, ...] = (
    TENSORFUSIONCLUSTERS, GPUPOOLS, GPUNODES, GPUS, GPUNODECLASSES, GPUNODECLAIMS,
    SCHEDULINGCONFIGTEMPLATES, GPURESOURCEQUOTAS, PROVIDERCONFIGS, TENSORFUSIONWORKLOADS,
    WORKLOADPROFILES, TENSORFUSIONCONNECTIONS,
)
