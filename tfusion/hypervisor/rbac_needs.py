"""Every API call the hypervisor makes, as the RBAC rule that allows it (see tfusion/kube/rbac_needs.py).

Why: deploy/base/hypervisor/rbac.yaml must grant these and nothing more; tests/unit/test_rbac_needs.py
compares the two. RBAC cannot say "this node's GPUs only": the shipped ValidatingAdmissionPolicy
(deploy/base/hypervisor/admissionpolicy.yaml) narrows the GPU and GPUNode writes to the hypervisor's node.
"""

from __future__ import annotations

from tfusion.kube import resources as r
from tfusion.kube.rbac_needs import RbacNeed

CLUSTER = "ClusterRole/tensor-fusion-hypervisor"

_H = "tfusion.hypervisor."


def _need(resource: r.ApiResource, verbs: str, callers: str, why: str, *, subresource: str = "") -> RbacNeed:
    """`verbs` and `callers` space-separated; a caller starting with "." is under tfusion.hypervisor."""
    modules = tuple(_H + c[1:] if c.startswith(".") else c for c in callers.split())
    return RbacNeed(CLUSTER, resource, tuple(verbs.split()), modules, why, subresource)


NEEDS: tuple[RbacNeed, ...] = (
    _need(r.GPUS, "get list watch create patch delete", ".gpu_report .external_plugins .workers.kubernetes",
          "a GPU object per device found on the node, removed when the device goes; other plugins' use"),
    _need(r.GPUS, "patch", ".gpu_report .external_plugins", "a GPU's capacity, health and usage",
          subresource="status"),
    _need(r.GPUNODES, "get list watch", ".gpu_report .limiter.config", "its node's GPUNode (owner of its GPUs)"),
    _need(r.GPUNODES, "patch", ".gpu_report", "its node's GPU totals", subresource="status"),
    _need(r.GPUPOOLS, "get", ".limiter.config", "the pool its node is in, for its SchedulingConfigTemplate"),
    _need(r.SCHEDULINGCONFIGTEMPLATES, "get", ".limiter.config", "rate-limit parameters"),
    _need(r.PROVIDERCONFIGS, "list watch", ".external_plugins .workers.kubernetes",
          "which resources other device plugins hold (DETECT_IN_USED_GPUS); worker images"),
    _need(r.PODS, "list watch", ".workers.kubernetes", "the worker pods bound to its node"),
    _need(r.EVENTS, "create patch", "tfusion.kube.events", "Events (a repeat patches its count)"),
    _need(r.TOKENREVIEWS, "create", "tfusion.kube.client", "pods calling its token routes present their token"),
)
