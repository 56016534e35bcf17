"""The simulated provider's instance records read back (and refused, naming the field), the Node labels
the node farm derives from them, and the kubelet's status for a simulated instance's machine."""

from __future__ import annotations

from typing import Any

import pytest

from tfusion.api import annotations as tfa
from tfusion.controller.provisioning.providers.simulated import (
    SIMULATED_INSTANCE,
    SimulatedInstanceError,
    instance_id_for,
    simulated_instance,
)
from tfusion.embedded.kubelet import node_status
from tfusion.embedded.node_farm import node_labels


def record(**data: str) -> dict[str, Any]:
    return {"metadata": {"name": "sim-0123456789", "namespace": "ops",
                         "labels": {SIMULATED_INSTANCE: "true", tfa.NODE_PROVISIONER: "pool-a-0123abcd"}},
            "data": {"instanceType": "g6.xlarge", "nodeName": "pool-a-0123abcd", "gpuModel": "L4-24GB",
                     "gpuCount": "1", "cpu": "4", "memory": "16Gi", "capacityType": "Spot", "zone": "z-1",
                     "launchedAt": "1000.5", "bootAt": "1005.5", "nodeLabels": '{"team":"ml"}', **data}}


def test_a_record_reads_back_with_its_state_by_the_wall_clock() -> None:
    found = simulated_instance(record())
    assert (found.instance_id, found.claim, found.gpu_count, found.launched_at, found.boot_at) == (
        "sim-0123456789", "pool-a-0123abcd", 1, 1000.5, 1005.5)
    assert found.device_spec == "sim:1xL4-24GB" and found.node_labels == {"team": "ml"}
    assert found.state(1005.4) == "pending" and found.state(1005.5) == "running"
    assert found.instance(1006).state == "running" and found.instance(1006).capacity_type == "Spot"


@pytest.mark.parametrize(("field", "value", "message"), [
    ("gpuCount", "0", "data.gpuCount is '0'; expected a positive integer"),
    ("gpuCount", "", "data.gpuCount is ''; expected a non-empty string"),
    ("bootAt", "soon", "data.bootAt is 'soon'; expected epoch seconds"),
    ("memory", "lots", "data.memory is 'lots'; expected a quantity"),
    ("nodeLabels", "[1]", "data.nodeLabels is '[1]'; expected a JSON object of strings"),
    ("nodeLabels", '{"a": 1}', "data.nodeLabels is '{\"a\": 1}'; expected a JSON object of strings"),
])
def test_an_unreadable_record_is_refused_naming_the_field(field: str, value: str, message: str) -> None:
    with pytest.raises(SimulatedInstanceError) as refused:
        simulated_instance(record(**{field: value}))
    assert str(refused.value) == f"simulated instance ops/sim-0123456789: {message}"


def test_instance_ids_are_stable_per_claim() -> None:
    assert instance_id_for("pool-a-0123abcd") == instance_id_for("pool-a-0123abcd")
    assert instance_id_for("pool-a-0123abcd") != instance_id_for("pool-a-0123abce")
    assert instance_id_for("c").startswith("sim-") and len(instance_id_for("c")) == 14


def test_the_node_gets_the_claims_labels_and_the_clouds_well_known_ones() -> None:
    labels = node_labels(simulated_instance(record()))
    assert labels == {"team": "ml", SIMULATED_INSTANCE: "true", tfa.NODE_PROVISIONER: "pool-a-0123abcd",
                      "node.kubernetes.io/instance-type": "g6.xlarge", "topology.kubernetes.io/zone": "z-1",
                      "karpenter.sh/capacity-type": "spot"}
    on_demand = node_labels(simulated_instance(record(capacityType="OnDemand")))
    assert on_demand["karpenter.sh/capacity-type"] == "on-demand"


def test_a_simulated_machine_replaces_the_hosts_cpu_and_memory() -> None:
    status = node_status("n1", machine={"cpu": "48", "memory": "192Gi"}, index_devices=36)
    for kind in ("capacity", "allocatable"):
        assert status[kind]["cpu"] == "48" and status[kind]["memory"] == "192Gi"
        assert status[kind]["pods"] == "110"
        assert status[kind]["tensor-fusion.ai/index_f"] == "36"
