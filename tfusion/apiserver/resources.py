"""What the embedded API server serves: one `ResourceInfo` per group/version/resource.

Built-in kinds are listed here; custom resources are added (and removed) at run time from
CustomResourceDefinition objects. Discovery, OpenAPI, routing, tables and validation all read the
same `Registry`, so a kind is either fully served or not at all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


@dataclass
class ResourceInfo:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    singular: str = ""
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()  # "status", "scale", "binding", "eviction", "token"
    verbs: tuple[str, ...] = ALL_VERBS
    #: metadata.generation counts spec changes (everything but metadata and status); kube-apiserver 1.32
    #: does this for CRDs, custom resources, Deployments, ReplicaSets and Jobs among the kinds served here
    tracks_generation: bool = False
    schema: dict[str, Any] | None = None  # openAPIV3Schema of a custom resource
    #: the resourceVersion of the CRD write that set `schema`, when the CRD serves this version alone:
    #: a stored object of a later resourceVersion was validated against this very schema
    schema_since: int | None = None
    printer_columns: list[dict[str, Any]] = field(default_factory=list)
    crd_name: str = ""  # set for custom resources
    storage_version: str = ""
    preserve_unknown: bool = False
    #: the storage key of another resource whose store this one serves in its own shape
    #: (events.k8s.io/v1 events are the core events; conversion.py converts)
    shares_storage: str = ""

    def __post_init__(self) -> None:
        if not self.singular:
            self.singular = self.kind.lower()
        if not self.storage_version:
            self.storage_version = self.version

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def storage_key(self) -> str:
        """Objects of every served version of a resource share one store."""
        return self.shares_storage or f"{self.group}/{self.plural}"

    @property
    def status_split(self) -> bool:
        return "status" in self.subresources

    @property
    def is_custom(self) -> bool:
        return bool(self.crd_name)

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"


def _core(plural: str, kind: str, namespaced: bool, **kw: Any) -> ResourceInfo:
    return ResourceInfo("", "v1", plural, kind, namespaced, **kw)


CREATE_ONLY = ("create",)

BUILTINS: tuple[ResourceInfo, ...] = (
    _core(
        "namespaces",
        "Namespace",
        False,
        short_names=("ns",),
        subresources=("status",),
        verbs=("create", "delete", "get", "list", "patch", "update", "watch"),  # no deletecollection, as in kube
    ),
    _core("nodes", "Node", False, short_names=("no",), subresources=("status",)),
    _core(
        "pods", "Pod", True, short_names=("po",), categories=("all",), subresources=("status", "binding", "eviction")
    ),
    _core("services", "Service", True, short_names=("svc",), categories=("all",), subresources=("status",)),
    _core("configmaps", "ConfigMap", True, short_names=("cm",)),
    _core("secrets", "Secret", True),
    _core("events", "Event", True, short_names=("ev",)),
    _core("serviceaccounts", "ServiceAccount", True, short_names=("sa",), subresources=("token",)),
    ResourceInfo("events.k8s.io", "v1", "events", "Event", True, short_names=("ev",), shares_storage="/events"),
    ResourceInfo("coordination.k8s.io", "v1", "leases", "Lease", True),
    ResourceInfo("authentication.k8s.io", "v1", "tokenreviews", "TokenReview", False, verbs=CREATE_ONLY),
    ResourceInfo(
        "admissionregistration.k8s.io",
        "v1",
        "mutatingwebhookconfigurations",
        "MutatingWebhookConfiguration",
        False,
    ),
    # enforced on writes by policies.py
    ResourceInfo("admissionregistration.k8s.io", "v1", "validatingadmissionpolicies", "ValidatingAdmissionPolicy",
                 False, subresources=("status",), tracks_generation=True),
    ResourceInfo("admissionregistration.k8s.io", "v1", "validatingadmissionpolicybindings",
                 "ValidatingAdmissionPolicyBinding", False, tracks_generation=True),
    ResourceInfo(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        False,
        short_names=("crd", "crds"),
        subresources=("status",),
        tracks_generation=True,
    ),
    ResourceInfo("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", False, short_names=("pc",)),
    # the workload kinds (apps.py); kube-apiserver keeps metadata.generation for them too
    ResourceInfo("apps", "v1", "deployments", "Deployment", True, short_names=("deploy",), categories=("all",),
                 subresources=("status", "scale"), tracks_generation=True),
    ResourceInfo("apps", "v1", "replicasets", "ReplicaSet", True, short_names=("rs",), categories=("all",),
                 subresources=("status", "scale"), tracks_generation=True),
    ResourceInfo("batch", "v1", "jobs", "Job", True, categories=("all",), subresources=("status",),
                 tracks_generation=True),
    ResourceInfo("apps", "v1", "daemonsets", "DaemonSet", True, short_names=("ds",), categories=("all",),
                 subresources=("status",), tracks_generation=True),
    ResourceInfo("apps", "v1", "statefulsets", "StatefulSet", True, short_names=("sts",), categories=("all",),
                 subresources=("status", "scale"), tracks_generation=True),
    ResourceInfo("batch", "v1", "cronjobs", "CronJob", True, short_names=("cj",), categories=("all",),
                 subresources=("status",), tracks_generation=True),
    # the template history of DaemonSets and StatefulSets (workloads/revisions.py; rollout history/undo)
    ResourceInfo("apps", "v1", "controllerrevisions", "ControllerRevision", True),
    # claims a StatefulSet's volumeClaimTemplates make; bound at once on the simulated node (volumeclaims.py)
    _core("persistentvolumeclaims", "PersistentVolumeClaim", True, short_names=("pvc",), subresources=("status",)),
    # the policy and network kinds (netpolicy.py); pods/eviction honours the budgets
    ResourceInfo("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", True, short_names=("netpol",),
                 tracks_generation=True),
    ResourceInfo("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True, short_names=("pdb",),
                 subresources=("status",), tracks_generation=True),
    _core("endpoints", "Endpoints", True, short_names=("ep",)),
    ResourceInfo("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice", True),
    # RBAC (rbac.py) and the reviews that ask it (reviews.py)
    ResourceInfo("rbac.authorization.k8s.io", "v1", "roles", "Role", True),
    ResourceInfo("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True),
    ResourceInfo("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False),
    ResourceInfo("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False),
    ResourceInfo("authorization.k8s.io", "v1", "selfsubjectaccessreviews", "SelfSubjectAccessReview", False,
                 verbs=CREATE_ONLY),
    ResourceInfo("authorization.k8s.io", "v1", "selfsubjectrulesreviews", "SelfSubjectRulesReview", False,
                 verbs=CREATE_ONLY),
    ResourceInfo("authorization.k8s.io", "v1", "subjectaccessreviews", "SubjectAccessReview", False,
                 verbs=CREATE_ONLY),
    ResourceInfo("authorization.k8s.io", "v1", "localsubjectaccessreviews", "LocalSubjectAccessReview", True,
                 verbs=CREATE_ONLY),
    ResourceInfo("authentication.k8s.io", "v1", "selfsubjectreviews", "SelfSubjectReview", False,
                 verbs=CREATE_ONLY),
)

#: kinds that kube-apiserver never persists (request/response only)
VIRTUAL = {"authentication.k8s.io/tokenreviews", "authentication.k8s.io/selfsubjectreviews",
           "authorization.k8s.io/selfsubjectaccessreviews", "authorization.k8s.io/selfsubjectrulesreviews",
           "authorization.k8s.io/subjectaccessreviews", "authorization.k8s.io/localsubjectaccessreviews"}


class Registry:
    """Served resources, indexed by (group, version, plural); custom ones change at run time."""

    def __init__(self) -> None:
        self._by_gvr: dict[tuple[str, str, str], ResourceInfo] = {}
        self.generation = 0  # bumps whenever the served set changes (discovery caches key on it)
        #: storage keys of the cluster-scoped resources (the store asks on every write: a set, not a scan)
        self._cluster_scoped: set[str] = set()
        for info in BUILTINS:
            self.add(info)

    def add(self, info: ResourceInfo) -> None:
        self._by_gvr[(info.group, info.version, info.plural)] = info
        self.generation += 1
        self._rescope()

    def remove_crd(self, crd_name: str) -> None:
        for key in [k for k, v in self._by_gvr.items() if v.crd_name == crd_name]:
            del self._by_gvr[key]
        self.generation += 1
        self._rescope()

    def _rescope(self) -> None:
        self._cluster_scoped = {i.storage_key for i in self._by_gvr.values() if not i.namespaced}

    def cluster_scoped(self, storage_key: str) -> bool:
        """Whether the objects stored under `storage_key` have no namespace."""
        return storage_key in self._cluster_scoped

    def get(self, group: str, version: str, plural: str) -> ResourceInfo | None:
        return self._by_gvr.get((group, version, plural))

    def all(self) -> list[ResourceInfo]:
        return list(self._by_gvr.values())

    def by_storage_key(self, storage_key: str) -> list[ResourceInfo]:
        return [i for i in self._by_gvr.values() if i.storage_key == storage_key]

    def storage_info(self, storage_key: str) -> ResourceInfo | None:
        infos = self.by_storage_key(storage_key)
        for info in infos:
            if info.version == info.storage_version and not info.shares_storage:
                return info
        return infos[0] if infos else None

    def groups(self) -> dict[str, list[str]]:
        """group → served versions, preferred (storage) version first."""
        out: dict[str, list[str]] = {}
        for info in self._by_gvr.values():
            if not info.group:
                continue
            versions = out.setdefault(info.group, [])
            if info.version not in versions:
                if info.version == info.storage_version:
                    versions.insert(0, info.version)
                else:
                    versions.append(info.version)
        return out

    def in_group_version(self, group: str, version: str) -> list[ResourceInfo]:
        return [i for i in self._by_gvr.values() if i.group == group and i.version == version]

