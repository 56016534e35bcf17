"""Per-kind rules of the built-in and custom kinds: defaults, validation, and what follows a write.

kube-apiserver keeps these in each kind's registry strategy; here they sit in one place so object
semantics (objects.py) stay independent of any particular kind.
"""

from __future__ import annotations

import ipaddress
import uuid
from typing import Any

from tfusion.api.timestamps import rfc3339
from tfusion.apiserver import apps, customresources, errors, netpolicy, rbac, validation
from tfusion.apiserver.resources import Registry, ResourceInfo
from tfusion.apiserver.store import Entry, Store

NAMESPACES = "/namespaces"
PODS = "/pods"
CRDS = "apiextensions.k8s.io/customresourcedefinitions"
PRIORITY_CLASSES = "scheduling.k8s.io/priorityclasses"
MUTATING_WEBHOOKS = "admissionregistration.k8s.io/mutatingwebhookconfigurations"
#: the classes kube-apiserver creates at start-up
SYSTEM_PRIORITY_CLASSES = {"system-node-critical": 2000001000, "system-cluster-critical": 2000000000}


class KindRules:
    def __init__(self, store: Store, registry: Registry) -> None:
        self.store = store
        self.registry = registry

    def defaults(self, info: ResourceInfo, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        key = info.storage_key
        if key == PODS:
            validation.default_pod(obj)
            if old is None:
                self._resolve_priority(obj)
                status = obj.setdefault("status", {})
                status.setdefault("phase", "Pending")
                status["qosClass"] = validation.pod_qos_class(obj)
        elif key == NAMESPACES:
            obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
            if old is None:
                obj["status"] = {"phase": "Active"}
            labels = obj["metadata"].setdefault("labels", {})
            labels["kubernetes.io/metadata.name"] = obj["metadata"]["name"]
        elif key == "/services":
            validation.default_service(obj)
            if old is None:
                self._allocate_cluster_ip(obj)
            else:
                self._keep_cluster_ip(obj, old)
        elif key == "/secrets":
            validation.default_secret(obj)
        elif key == MUTATING_WEBHOOKS:
            validation.default_mutating_webhooks(obj)
        elif key == CRDS:
            customresources.default_crd(obj)
        elif key in apps.WORKLOAD_KEYS:
            apps.defaults(key, obj, old)
        elif key in ("apps/daemonsets", "apps/statefulsets"):
            from tfusion.apiserver import appsets  # DaemonSet and StatefulSet rules
            appsets.defaults(key, obj)
        elif key == "/persistentvolumeclaims":
            from tfusion.apiserver import volumeclaims
            volumeclaims.default_claim(obj, old)
        elif info.is_custom:
            customresources.default_custom(info, obj)

    def _resolve_priority(self, pod: dict[str, Any]) -> None:
        """kube's Priority admission: spec.priority comes from the PriorityClass (or the global default)."""
        spec = pod["spec"]
        wanted = spec.get("priorityClassName")
        if wanted:
            entry = self.store.get(PRIORITY_CLASSES, "", wanted)
            if entry is None:
                raise errors.forbidden(
                    "pods", "", pod["metadata"].get("name", ""), f"no PriorityClass with name {wanted} was found"
                )
            chosen: dict[str, Any] | None = entry.obj
        else:
            chosen = next((e.obj for _, e in self.store.items(PRIORITY_CLASSES) if e.obj.get("globalDefault")), None)
        value = int(chosen.get("value", 0)) if chosen else 0
        if "priority" in spec and spec["priority"] != value:
            raise errors.forbidden(
                "pods",
                "",
                pod["metadata"].get("name", ""),
                f"the integer value of priority ({spec['priority']}) must not be provided in pod spec; priority "
                f"admission controller computed {value} from the given PriorityClass name",
            )
        spec["priority"] = value
        if chosen is not None:
            spec["priorityClassName"] = chosen["metadata"]["name"]
            spec.setdefault("preemptionPolicy", chosen.get("preemptionPolicy", "PreemptLowerPriority"))
        else:
            spec.setdefault("preemptionPolicy", "PreemptLowerPriority")

    def _allocate_cluster_ip(self, svc: dict[str, Any]) -> None:
        """A free address from 10.96.0.0/12 (kube's default service range); "None" stays headless."""
        spec = svc["spec"]
        if spec.get("type") == "ExternalName" or spec.get("clusterIP") == "None":
            return
        if spec.get("clusterIP"):
            spec.setdefault("clusterIPs", [spec["clusterIP"]])
            return
        used = {(e.obj.get("spec") or {}).get("clusterIP") for _, e in self.store.items("/services")}
        base = int(ipaddress.IPv4Address("10.96.0.0"))
        for offset in range(10, 1 << 20):
            candidate = str(ipaddress.IPv4Address(base + offset))
            if candidate not in used:
                spec["clusterIP"], spec["clusterIPs"] = candidate, [candidate]
                spec.setdefault("ipFamilies", ["IPv4"])
                spec.setdefault("ipFamilyPolicy", "SingleStack")
                return

    @staticmethod
    def _keep_cluster_ip(svc: dict[str, Any], old: dict[str, Any]) -> None:
        old_spec, spec = old.get("spec") or {}, svc["spec"]
        for key in ("clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"):
            if key in old_spec and not spec.get(key):
                spec[key] = old_spec[key]

    def validate(self, info: ResourceInfo, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        meta = obj["metadata"]
        causes = validation.validate_metadata(meta)
        if old is None:
            causes += validation.validate_name(info.storage_key, meta["name"])
        key = info.storage_key
        if key == PODS:
            causes += validation.validate_pod(obj)
            if old is not None:
                causes += validation.validate_pod_update(old, obj)
        elif key == CRDS:
            causes += customresources.validate_crd(obj, old, self.registry)
        elif key in apps.WORKLOAD_KEYS:
            causes += apps.validate(key, obj, old)
        elif key in ("apps/daemonsets", "apps/statefulsets", "apps/controllerrevisions"):
            from tfusion.apiserver import appsets  # DaemonSet and StatefulSet rules, their revisions
            causes += appsets.validate(key, obj, old)
        elif key == "/persistentvolumeclaims":
            from tfusion.apiserver import volumeclaims
            causes += volumeclaims.validate_claim(obj, old)
        elif key in rbac.RBAC_KEYS:
            causes += rbac.validate(key, obj, old)
        elif key in netpolicy.POLICY_KEYS:
            causes += netpolicy.validate(key, obj)
        elif key in ("admissionregistration.k8s.io/validatingadmissionpolicies",
                     "admissionregistration.k8s.io/validatingadmissionpolicybindings"):
            from tfusion.apiserver import policies  # it reads NAMESPACES from here

            causes += policies.validate(key, obj)
        elif info.is_custom:
            causes += customresources.validate_custom(info, obj, old)
        if info.group == "events.k8s.io":  # the newer Event API's stricter rules (core/v1 keeps its own)
            from tfusion.apiserver import event_rules

            causes += event_rules.validate(obj, old)
        if causes:
            raise errors.invalid(info.kind, info.group, meta.get("name", ""), causes)

    def after_write(self, info: ResourceInfo, entry: Entry, old: Entry | None) -> None:
        if info.storage_key == CRDS:
            customresources.register(self.registry, entry.obj)
        elif info.storage_key == NAMESPACES and old is None:
            self.default_service_account(entry.obj["metadata"]["name"])

    def default_service_account(self, namespace: str) -> None:
        """What kube-controller-manager does for every namespace: a ServiceAccount named default."""
        if self.store.get("/serviceaccounts", namespace, "default") is None:
            self.store.put(
                "/serviceaccounts",
                {
                    "apiVersion": "v1",
                    "kind": "ServiceAccount",
                    "metadata": {
                        "name": "default",
                        "namespace": namespace,
                        "uid": str(uuid.uuid4()),
                        "creationTimestamp": rfc3339(),
                    },
                },
                None,
            )

    def crd_removed(self, crd: dict[str, Any]) -> None:
        """Deleting a CRD deletes every object of its kind, then stops serving it."""
        spec = crd.get("spec") or {}
        storage_key = f"{spec.get('group', '')}/{(spec.get('names') or {}).get('plural', '')}"
        for _, entry in self.store.items(storage_key):
            self.store.remove(storage_key, entry)
        self.registry.remove_crd(crd["metadata"]["name"])
