"""Prometheus scrapes tfusion under the shipped NetworkPolicy, checked on rendered manifests: an
overlay of a user's own (the builtin-scheduler overlay plus the prometheus-operator component, and
its own patch naming where its Prometheus runs) renders a ServiceMonitor whose Service leads to the
controller pods' metrics port, a PodMonitor on the hypervisors' port, and a NetworkPolicy that lets
exactly that Prometheus reach the metrics port (and not a look-alike pod in another namespace)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.deploy import Doc, by_key, render_own
from tests.helpers.kubectl import needs_kubectl
from tests.helpers.netpol import Peer, admits
from tfusion.api.selectors import label_selector_from_dict

pytestmark = needs_kubectl

PROMETHEUS_POD = {"app.kubernetes.io/name": "prometheus", "prometheus": "main"}
#: the user's overlay: its Prometheus runs in "observability", its pods labelled prometheus=main
OWN_PEER_PATCH = """\
- op: replace
  path: /spec/ingress/3/from
  value:
    - namespaceSelector:
        matchLabels:
          kubernetes.io/metadata.name: observability
      podSelector:
        matchLabels:
          prometheus: main
"""


def render_own_overlay(root: Path, *, own_patch: bool) -> dict[tuple[str, str], Doc]:
    patches = ({"target": {"kind": "NetworkPolicy", "name": "tensor-fusion-controller"}, "patch": OWN_PEER_PATCH},)
    return render_own(root, overlay="builtin-scheduler", components=("prometheus-operator",),
                      patches=patches if own_patch else ())


@pytest.fixture(scope="module")
def own(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Doc]:
    return render_own_overlay(tmp_path_factory.mktemp("overlay") / "mine", own_patch=True)


def _pod_template(docs: dict[tuple[str, str], Doc], kind: str, name: str) -> tuple[dict[str, str], dict[str, int]]:
    template = docs[(kind, name)]["spec"]["template"]
    ports = {p["name"]: p["containerPort"] for c in template["spec"]["containers"] for p in c.get("ports", [])}
    return template["metadata"]["labels"], ports


def test_the_service_monitor_leads_to_the_controllers_metrics_port(own: dict[tuple[str, str], Doc]) -> None:
    (monitor,) = [d for (kind, _), d in own.items() if kind == "ServiceMonitor"]
    selector = label_selector_from_dict(monitor["spec"]["selector"])
    services = [d for (kind, _), d in own.items() if kind == "Service" and selector.matches(d["metadata"]["labels"])]
    assert [s["metadata"]["name"] for s in services] == ["tensor-fusion-controller"], "not the webhook's Service"
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    (port,) = [p for p in services[0]["spec"]["ports"] if p["name"] == endpoint["port"]]
    labels, container_ports = _pod_template(own, "Deployment", "tensor-fusion-controller")
    assert label_selector_from_dict({"matchLabels": services[0]["spec"]["selector"]}).matches(labels)
    assert port["targetPort"] == container_ports["http"] == 8080
    # the rules name the job; the ServiceMonitor takes it from this label of the Service
    assert services[0]["metadata"]["labels"][monitor["spec"]["jobLabel"]] == "tensor-fusion-controller"


def test_the_pod_monitor_scrapes_every_hypervisor(own: dict[tuple[str, str], Doc]) -> None:
    monitor = own[("PodMonitor", "tensor-fusion-hypervisor")]
    labels, ports = _pod_template(own, "DaemonSet", "tensor-fusion-hypervisor")
    assert label_selector_from_dict(monitor["spec"]["selector"]).matches(labels)
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] in ports and endpoint["path"] == "/metrics"
    assert {"targetLabel": "job", "replacement": "tensor-fusion-hypervisor", "action": "replace"} in \
        endpoint["relabelings"]


def test_only_the_overlays_prometheus_reaches_the_metrics_port(own: dict[tuple[str, str], Doc]) -> None:
    policy = own[("NetworkPolicy", "tensor-fusion-controller")]
    labels, ports = _pod_template(own, "Deployment", "tensor-fusion-controller")
    assert label_selector_from_dict(policy["spec"]["podSelector"]).matches(labels), "the policy guards the pods"

    def reaches(peer: Peer, port: int = 8080) -> bool:
        return admits(policy, peer, port, pod_labels=labels, port_names=ports)

    assert reaches(Peer("observability", PROMETHEUS_POD))
    assert not reaches(Peer("observability", PROMETHEUS_POD), port=9443)
    assert not reaches(Peer("observability", {"app": "grafana"}))
    assert not reaches(Peer("default", PROMETHEUS_POD)), "a look-alike pod in another namespace"
    # the component's default peer is gone: the overlay set its own
    assert not reaches(Peer("monitoring", {"app.kubernetes.io/name": "prometheus"}))
    # and the API's usual callers still reach it
    assert reaches(Peer("ml", {"tensor-fusion.ai/component": "worker"}))


def test_the_shipped_default_admits_the_prometheus_operators_pods(tmp_path: Path) -> None:
    for docs in (by_key("builtin-scheduler"), render_own_overlay(tmp_path / "plain", own_patch=False)):
        policy = docs[("NetworkPolicy", "tensor-fusion-controller")]
        labels, ports = _pod_template(docs, "Deployment", "tensor-fusion-controller")
        prometheus = Peer("monitoring", {"app.kubernetes.io/name": "prometheus", "prometheus": "k8s"})
        assert admits(policy, prometheus, 8080, pod_labels=labels, port_names=ports)
        assert not admits(policy, Peer("monitoring", {"app.kubernetes.io/name": "grafana"}), 8080,
                          pod_labels=labels, port_names=ports)
