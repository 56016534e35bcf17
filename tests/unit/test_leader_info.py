"""What the leader writes to its leader-info ConfigMap (tfusion/kube/leader.py): `api-url` is the
bound address, or this host's IP for a wildcard bind (IPv6 in brackets); `pod` and `pod-namespace`
only when the leader runs in a pod; `leader-ip` always."""

from __future__ import annotations

from typing import Any

import pytest

from tfusion.kube.leader import LeaderElector, api_url


@pytest.mark.parametrize(("host", "expected"), [
    ("127.0.0.1", "http://127.0.0.1:8080"),
    ("10.1.2.3", "http://10.1.2.3:8080"),
    ("0.0.0.0", "http://192.168.7.9:8080"),
    ("", "http://192.168.7.9:8080"),
    ("::", "http://192.168.7.9:8080"),
    ("::1", "http://[::1]:8080"),
])
def test_api_url_names_an_address_a_client_can_use(host: str, expected: str) -> None:
    assert api_url(host, 8080, "192.168.7.9") == expected


def elector(**kwargs: Any) -> LeaderElector:
    return LeaderElector(client=None, namespace="tf-ops", identity="me", **kwargs)  # type: ignore[arg-type]


def test_leader_info_has_the_keys_this_leader_knows() -> None:
    assert elector().leader_info_data("10.0.0.5") == {"leader-ip": "10.0.0.5"}
    in_pod = elector(pod_name="op-0", pod_namespace="tf-system", api_address=("0.0.0.0", 8080))
    assert in_pod.leader_info_data("10.0.0.5") == {"leader-ip": "10.0.0.5", "api-url": "http://10.0.0.5:8080",
                                                   "pod": "op-0", "pod-namespace": "tf-system"}
    no_namespace = elector(pod_name="op-0")
    no_namespace.advertise("127.0.0.1", 9000)
    assert no_namespace.leader_info_data("10.0.0.5") == {"leader-ip": "10.0.0.5", "api-url": "http://127.0.0.1:9000",
                                                         "pod": "op-0", "pod-namespace": "tf-ops"}
