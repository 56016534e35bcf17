"""Whether a rendered NetworkPolicy admits a peer pod to a port, read the way the API documents it.

Why: nothing enforces network policies on the embedded API server's simulated node, so the tests
that need to know "can Prometheus reach the controller's metrics port" evaluate the rendered policy
themselves: a peer with only a podSelector is a pod of the policy's own namespace; with only a
namespaceSelector, any pod of the selected namespaces; with both, the selected pods of the selected
namespaces; a rule without `from` admits everyone, without `ports` every port. Named ports are
resolved against the destination pod's container ports. ipBlock peers never match a pod here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tfusion.api.selectors import label_selector_from_dict


@dataclass(frozen=True)
class Peer:
    """A source pod: its namespace's name and labels and its own labels."""

    namespace: str
    pod_labels: Mapping[str, str]
    namespace_labels: Mapping[str, str] = field(default_factory=dict)

    def all_namespace_labels(self) -> dict[str, str]:
        # the API server sets this label on every namespace
        return {**self.namespace_labels, "kubernetes.io/metadata.name": self.namespace}


def _peer_matches(peer_rule: Mapping[str, Any], peer: Peer, policy_namespace: str) -> bool:
    if "ipBlock" in peer_rule:
        return False
    pods = peer_rule.get("podSelector")
    namespaces = peer_rule.get("namespaceSelector")
    if namespaces is None:
        in_namespace = peer.namespace == policy_namespace
    else:
        in_namespace = label_selector_from_dict(namespaces).matches(peer.all_namespace_labels())
    return in_namespace and (pods is None or label_selector_from_dict(pods).matches(peer.pod_labels))


def _port_matches(rule_port: Mapping[str, Any], port: int, port_names: Mapping[str, int]) -> bool:
    if rule_port.get("protocol", "TCP") != "TCP":
        return False
    wanted = rule_port.get("port")
    if wanted is None:
        return True
    number = port_names.get(wanted) if isinstance(wanted, str) else wanted
    end = rule_port.get("endPort", number)
    return number is not None and number <= port <= end


def admits(policy: Mapping[str, Any], peer: Peer, port: int, *, pod_labels: Mapping[str, str],
           port_names: Mapping[str, int] | None = None) -> bool:
    """Whether `policy` lets `peer` reach TCP `port` of a pod labelled `pod_labels` in the policy's
    namespace. A policy that does not select the pod, or has no Ingress type, does not restrict it."""
    spec = policy["spec"]
    namespace = policy["metadata"].get("namespace", "default")
    if not label_selector_from_dict(spec["podSelector"]).matches(pod_labels):
        return True
    if "Ingress" not in spec.get("policyTypes", ["Ingress"]):
        return True
    names = port_names or {}
    for rule in spec.get("ingress") or []:
        ports = rule.get("ports")
        if ports is not None and not any(_port_matches(p, port, names) for p in ports):
            continue
        sources = rule.get("from")
        if sources is None or any(_peer_matches(s, peer, namespace) for s in sources):
            return True
    return False
