"""The shipped NetworkPolicy keeps the webhook port for the API server: no pod or namespace peer
may reach :9443, only address blocks (the control plane's), none of them the whole internet."""

from __future__ import annotations

import ipaddress

from tests.helpers.deploy import by_key
from tests.helpers.kubectl import needs_kubectl

pytestmark = needs_kubectl


def test_only_address_blocks_reach_the_webhook_port() -> None:
    policy = by_key("builtin-scheduler")[("NetworkPolicy", "tensor-fusion-controller")]["spec"]
    rules = [r for r in policy["ingress"] if any(p.get("port") == 9443 for p in r.get("ports") or [])]
    assert len(rules) == 1 and [p["port"] for p in rules[0]["ports"]] == [9443]
    peers = rules[0]["from"]
    assert peers and all(set(peer) == {"ipBlock"} for peer in peers), peers
    for peer in peers:
        network = ipaddress.IPv4Network(peer["ipBlock"]["cidr"])
        assert network.is_private or network.subnet_of(ipaddress.IPv4Network("100.64.0.0/10")), network
    probes = [r for r in policy["ingress"] if any(p.get("port") == 8081 for p in r.get("ports") or [])]
    assert len(probes) == 1 and "from" not in probes[0]  # the kubelet's address is not known: open
