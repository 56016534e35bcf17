"""Every API call the controller makes, as the RBAC rule that allows it (see tfusion/kube/rbac_needs.py).

Why: deploy/base/controller/rbac.yaml must grant these and nothing more; tests/unit/test_rbac_needs.py
compares the two and checks that each caller named here really addresses its resource. A new call
adds its line here, then the rule (with a comment naming the caller) to the shipped RBAC.

List and watch come from informers (runtime.informer, controller .for_/.owns/.watches); update is a
PUT (client.replace, and ensure_finalizer adding or removing a finalizer); status writes go to the
status subresource (reconcilers/common.write_status is a merge patch).
"""

from __future__ import annotations

from tfusion.controller.provisioning.cloud import DEFAULT_CREDENTIALS_SECRET
from tfusion.controller.webhook.certs import SECRET_NAME
from tfusion.controller.webhook.registration import CONFIGURATION_NAME, MUTATING_WEBHOOK_CONFIGURATIONS
from tfusion.kube import resources as r
from tfusion.kube.rbac_needs import RbacNeed

CLUSTER = "ClusterRole/tensor-fusion-operator"
#: in the operator namespace only
OWN_NAMESPACE = "Role/tensor-fusion-operator"
#: not bound by the shipped manifests: a namespace whose workloads name an external scaler's API-key
#: Secret binds it there
SCALER_KEYS = "ClusterRole/tensor-fusion-external-scaler-keys"

_C = "tfusion.controller."


def _need(role: str, resource: r.ApiResource, verbs: str, callers: str, why: str, *, subresource: str = "",
          names: tuple[str, ...] = ()) -> RbacNeed:
    """`verbs` and `callers` space-separated; a caller starting with "." is under tfusion.controller."""
    modules = tuple(_C + c[1:] if c.startswith(".") else c for c in callers.split())
    return RbacNeed(role, resource, tuple(verbs.split()), modules, why, subresource, names)


NEEDS: tuple[RbacNeed, ...] = (
    # --- tensor-fusion.ai kinds ---
    _need(CLUSTER, r.GPUS, "get list watch", ".reconcilers.gpu_status .allocation .scheduling.scheduler",
          "the allocator's and scheduler's GPU cache; gpu_status re-reads a GPU after a conflicting status write"),
    _need(CLUSTER, r.GPUS, "patch", ".reconcilers.gpu_status .reconcilers.gpunode",
          "allocations written into GPU status (merge patch); the GPUNode reconciler sets a GPU's phase",
          subresource="status"),
    _need(CLUSTER, r.GPUNODES, "list watch create update patch delete",
          ".reconcilers.node .reconcilers.gpunode .reconcilers.pool .reconcilers.gpu_status",
          "a GPUNode per labelled Node (created, relabelled, deleted with its Node or pool), its finalizer"),
    _need(CLUSTER, r.GPUNODES, "patch", ".reconcilers.gpunode .reconcilers.node", "GPUNode capacity and phase",
          subresource="status"),
    _need(CLUSTER, r.GPUPOOLS, "list watch create update delete", ".reconcilers.cluster .reconcilers.pool",
          "a TensorFusionCluster's pools are created, replaced and deleted from its spec; the pool finalizer"),
    _need(CLUSTER, r.GPUPOOLS, "patch", ".reconcilers.pool .provisioning.compaction", "pool capacity, phase, "
          "compaction state", subresource="status"),
    _need(CLUSTER, r.GPUPOOLS, "update", ".provisioning.claims .reconcilers.node",
          "GPUNodeClaims and GPUNodes name their pool as a blocking owner (OwnerReferencesPermissionEnforcement)",
          subresource="finalizers"),
    _need(CLUSTER, r.GPUNODECLAIMS, "list watch create update delete",
          ".provisioning.pools .provisioning.expander .provisioning.compaction .provisioning.claims",
          "nodes on demand: claims created for missing capacity, deleted when compacted; their finalizer"),
    _need(CLUSTER, r.GPUNODECLAIMS, "patch", ".provisioning.claims", "a claim's phase and instance",
          subresource="status"),
    _need(CLUSTER, r.GPUNODECLASSES, "list watch", ".provisioning.claims",
          "the instance template a claim launches from"),
    _need(CLUSTER, r.GPURESOURCEQUOTAS, "list watch", ".reconcilers.quota_status .allocation",
          "quotas the allocator enforces"),
    _need(CLUSTER, r.GPURESOURCEQUOTAS, "patch", ".reconcilers.quota_status", "a quota's usage",
          subresource="status"),
    _need(CLUSTER, r.PROVIDERCONFIGS, "list watch", ".allocation .scheduling.scheduler .webhook.service",
          "per-vendor resource names, images and isolation"),
    _need(CLUSTER, r.SCHEDULINGCONFIGTEMPLATES, "list watch", ".allocation .webhook.service",
          "a pool's placement and rate-limit settings"),
    _need(CLUSTER, r.WORKLOADPROFILES, "list watch", ".webhook.service .scheduling.simulate",
          "profiles a pod's annotations name"),
    _need(CLUSTER, r.TENSORFUSIONCLUSTERS, "list watch update", ".reconcilers.cluster .provisioning.cloud",
          "the cluster reconciler (and its finalizer); the cloud provider's settings"),
    _need(CLUSTER, r.TENSORFUSIONCLUSTERS, "patch", ".reconcilers.cluster", "a cluster's phase and pools",
          subresource="status"),
    _need(CLUSTER, r.TENSORFUSIONCLUSTERS, "update", ".reconcilers.cluster",
          "its pools name it as a blocking owner", subresource="finalizers"),
    _need(CLUSTER, r.TENSORFUSIONCONNECTIONS, "list watch create patch",
          ".reconcilers.pod .reconcilers.connection .connection_http",
          "remote vGPU: a connection per client pod, its worker recorded on it"),
    _need(CLUSTER, r.TENSORFUSIONCONNECTIONS, "patch", ".reconcilers.connection", "a connection's phase and URL",
          subresource="status"),
    _need(CLUSTER, r.TENSORFUSIONCONNECTIONS, "update", ".reconcilers.connection",
          "its worker pod names it as a blocking owner", subresource="finalizers"),
    _need(CLUSTER, r.TENSORFUSIONWORKLOADS, "get list watch create update patch delete",
          ".webhook.workloads .reconcilers.workload .reconcilers.pod .autoscaler.service",
          "the webhook creates or patches a pod's workload, the workload reconciler deletes one no pod "
          "came for, the pod reconciler takes one over, the autoscaler patches its spec; finalizer"),
    _need(CLUSTER, r.TENSORFUSIONWORKLOADS, "patch", ".reconcilers.workload .autoscaler.service "
          ".scheduling.gang_runtime", "replicas, recommendation, gang state", subresource="status"),
    _need(CLUSTER, r.TENSORFUSIONWORKLOADS, "update", ".reconcilers.workload",
          "its worker pods name it as a blocking owner", subresource="finalizers"),
    # --- pods ---
    # create and delete cannot be narrowed by RBAC to tfusion's own pods: vGPU workers are created in the
    # workload's namespace, and the autoscaler restarts a client pod to resize it
    _need(CLUSTER, r.PODS, "get list watch create update patch delete",
          ".reconcilers.workload .reconcilers.connection .reconcilers.pod .autoscaler.resize "
          ".provisioning.compaction .scheduling.binder",
          "workers created and deleted per workload or connection; the pod finalizer (PUT) and "
          "annotations (patch); the autoscaler deletes a pod to resize it; the scheduler's cache"),
    _need(CLUSTER, r.PODS, "create", ".scheduling.binder", "the built-in scheduler binds a pod",
          subresource="binding"),
    _need(CLUSTER, r.PODS, "create", ".eviction", "preemption and compaction evict through the Eviction API",
          subresource="eviction"),
    _need(CLUSTER, r.PODS, "patch", ".scheduling.unschedulable .scheduling.preemption",
          "the PodScheduled condition and nominatedNodeName", subresource="status"),
    _need(CLUSTER, r.PODDISRUPTIONBUDGETS, "list watch", ".scheduling.preemption .provisioning.compaction",
          "victims and drained nodes honour their budgets"),
    # --- apps and batch: only the pod's own controller, never watched ---
    _need(CLUSTER, r.REPLICASETS, "get patch", ".webhook.workloads",
          "a ReplicaSet names its Deployment (the workload); the grey-release counter annotation"),
    _need(CLUSTER, r.STATEFULSETS, "get patch", ".webhook.workloads", "replicas; the grey-release counter"),
    _need(CLUSTER, r.JOBS, "get patch", ".webhook.workloads",
          "a Job names its CronJob (the workload); the grey-release counter"),
    # --- the rest of the cluster ---
    _need(CLUSTER, r.NODES, "list watch patch", ".reconcilers.node .reconcilers.pool .provisioning.compaction",
          "pool labels, the progressive-migration taint, the compaction mark"),
    _need(CLUSTER, r.NAMESPACES, "get list watch", ".webhook.service tfusion.kube.manager",
          "namespace selectors of the webhook; the Lease's namespace is looked for at start"),
    _need(CLUSTER, r.EVENTS, "create patch", "tfusion.kube.events", "Events (a repeat patches its count)"),
    _need(CLUSTER, MUTATING_WEBHOOK_CONFIGURATIONS, "get update", ".webhook.registration",
          "the pod webhook keeps its configuration's caBundle current", names=(CONFIGURATION_NAME,)),
    _need(CLUSTER, MUTATING_WEBHOOK_CONFIGURATIONS, "create", ".webhook.registration",
          "first start: create cannot be limited to a name"),
    _need(CLUSTER, r.TOKENREVIEWS, "create", "tfusion.kube.client",
          "callers of /api/assign-index, /api/assign-host-port and /api/connection present a token"),
    _need(CLUSTER, r.KARPENTER_NODECLAIMS, "get list create delete", ".provisioning.providers.karpenter",
          "Karpenter mode: one karpenter.sh NodeClaim per GPUNodeClaim"),
    # --- the operator namespace ---
    _need(OWN_NAMESPACE, r.LEASES, "get create update", "tfusion.kube.leader",
          "leader election (and its release on shutdown)"),
    _need(OWN_NAMESPACE, r.CONFIGMAPS, "get list create patch delete",
          "tfusion.kube.leader .scheduling.assignments .provisioning.providers.simulated",
          "the leader-info ConfigMap; the simulated provider's instances are ConfigMaps"),
    _need(OWN_NAMESPACE, r.SECRETS, "get update", ".webhook.certs", "the webhook's CA and serving certificate",
          names=(SECRET_NAME,)),
    _need(OWN_NAMESPACE, r.SECRETS, "create", ".webhook.certs", "first start: create cannot be limited to a name"),
    _need(OWN_NAMESPACE, r.SECRETS, "get", ".provisioning.cloud", "the aws provider's credentials",
          names=(DEFAULT_CREDENTIALS_SECRET,)),
    _need(SCALER_KEYS, r.SECRETS, "get", ".autoscaler.external", "an external scaler's API key (apiKeySecretRef)"),
)
