"""The Kubernetes resources tfusion reads and writes, named once.

An `ApiResource` (not `Resource`: that is the API's per-GPU amounts) is everything the REST path
needs (group, version, plural, scope) plus the kind, so the client, informers and tests address
kinds by constant rather than by scattered strings.
"""

from __future__ import annotations

from dataclasses import dataclass

TF_GROUP = "tensor-fusion.ai"


@dataclass(frozen=True)
class ApiResource:
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


PODS = ApiResource("", "v1", "pods", "Pod", True)
NODES = ApiResource("", "v1", "nodes", "Node", False)
NAMESPACES = ApiResource("", "v1", "namespaces", "Namespace", False)
EVENTS = ApiResource("", "v1", "events", "Event", True)
CONFIGMAPS = ApiResource("", "v1", "configmaps", "ConfigMap", True)
SECRETS = ApiResource("", "v1", "secrets", "Secret", True)
SERVICES = ApiResource("", "v1", "services", "Service", True)
SERVICEACCOUNTS = ApiResource("", "v1", "serviceaccounts", "ServiceAccount", True)
LEASES = ApiResource("coordination.k8s.io", "v1", "leases", "Lease", True)
TOKENREVIEWS = ApiResource("authentication.k8s.io", "v1", "tokenreviews", "TokenReview", False)
DEPLOYMENTS = ApiResource("apps", "v1", "deployments", "Deployment", True)
REPLICASETS = ApiResource("apps", "v1", "replicasets", "ReplicaSet", True)
STATEFULSETS = ApiResource("apps", "v1", "statefulsets", "StatefulSet", True)
JOBS = ApiResource("batch", "v1", "jobs", "Job", True)
CRONJOBS = ApiResource("batch", "v1", "cronjobs", "CronJob", True)
PODDISRUPTIONBUDGETS = ApiResource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True)
CUSTOMRESOURCEDEFINITIONS = ApiResource("apiextensions.k8s.io", "v1", "customresourcedefinitions",
                                     "CustomResourceDefinition", False)

GPUS = ApiResource(TF_GROUP, "v1", "gpus", "GPU", False)
GPUNODES = ApiResource(TF_GROUP, "v1", "gpunodes", "GPUNode", False)
GPUPOOLS = ApiResource(TF_GROUP, "v1", "gpupools", "GPUPool", False)
TENSORFUSIONCLUSTERS = ApiResource(TF_GROUP, "v1", "tensorfusionclusters", "TensorFusionCluster", False)
GPUNODECLASSES = ApiResource(TF_GROUP, "v1", "gpunodeclasses", "GPUNodeClass", False)
GPUNODECLAIMS = ApiResource(TF_GROUP, "v1", "gpunodeclaims", "GPUNodeClaim", False)
SCHEDULINGCONFIGTEMPLATES = ApiResource(TF_GROUP, "v1", "schedulingconfigtemplates", "SchedulingConfigTemplate",
                                     False)
GPURESOURCEQUOTAS = ApiResource(TF_GROUP, "v1", "gpuresourcequotas", "GPUResourceQuota", True)
PROVIDERCONFIGS = ApiResource(TF_GROUP, "v1", "providerconfigs", "ProviderConfig", False)
TENSORFUSIONWORKLOADS = ApiResource(TF_GROUP, "v1", "tensorfusionworkloads", "TensorFusionWorkload", True)
WORKLOADPROFILES = ApiResource(TF_GROUP, "v1", "workloadprofiles", "WorkloadProfile", True)
TENSORFUSIONCONNECTIONS = ApiResource(TF_GROUP, "v1", "tensorfusionconnections", "TensorFusionConnection", True)

#: the 12 tensor-fusion.ai/v1 kinds
TF_RESOURCES: tuple[ApiResource, ...] = (
    TENSORFUSIONCLUSTERS, GPUPOOLS, GPUNODES, GPUS, GPUNODECLASSES, GPUNODECLAIMS,
    SCHEDULINGCONFIGTEMPLATES, GPURESOURCEQUOTAS, PROVIDERCONFIGS, TENSORFUSIONWORKLOADS,
    WORKLOADPROFILES, TENSORFUSIONCONNECTIONS,
)

#: Karpenter's NodeClaim (karpenter.sh/v1), created by the Karpenter provider. Not in TF_RESOURCES:
#: it is served only where Karpenter is installed, and an informer on an unserved resource never syncs.
KARPENTER_NODECLAIMS = ApiResource("karpenter.sh", "v1", "nodeclaims", "NodeClaim", False)
