"""Pure parts of tfusion/embedded: node selectors, pool choice, device plans, pod statuses, settings."""

from __future__ import annotations

from typing import Any

import pytest

from tfusion.embedded.devices import DevicePlanError, plan_devices
from tfusion.embedded.gpunode import select_pool
from tfusion.embedded.kubelet import running_status, terminated_status
from tfusion.embedded.nodeselector import node_selector_matches
from tfusion.settings import DEFAULT_SIM_DEVICES, Settings, SettingsError, parse_sim_devices_fallback


def node(name: str = "n1", **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}}


def term(*expressions: dict[str, Any], fields: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"matchExpressions": list(expressions)}
    if fields:
        out["matchFields"] = fields
    return out


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, "values": list(values)}


@pytest.mark.parametrize(("requirement", "labels", "expected"), [
    (expr("gpu", "In", "true"), {"gpu": "true"}, True),
    (expr("gpu", "In", "true"), {"gpu": "false"}, False),
    (expr("gpu", "In", "true"), {}, False),
    (expr("gpu", "NotIn", "false"), {}, True),
    (expr("gpu", "NotIn", "false"), {"gpu": "false"}, False),
    (expr("gpu", "Exists"), {"gpu": ""}, True),
    (expr("gpu", "DoesNotExist"), {"gpu": ""}, False),
    (expr("count", "Gt", "2"), {"count": "3"}, True),
    (expr("count", "Gt", "2"), {"count": "2"}, False),
    (expr("count", "Lt", "2"), {"count": "x"}, False),
    (expr("count", "Between", "2"), {"count": "2"}, False),
])
def test_one_requirement(requirement: dict[str, Any], labels: dict[str, str], expected: bool) -> None:
    selector = {"nodeSelectorTerms": [term(requirement)]}
    assert node_selector_matches(selector, node(**labels)) is expected


def test_terms_are_ored_and_requirements_anded() -> None:
    both = term(expr("a", "In", "1"), expr("b", "In", "1"))
    selector = {"nodeSelectorTerms": [both, term(expr("c", "Exists"))]}
    assert node_selector_matches(selector, node(a="1", b="1"))
    assert not node_selector_matches(selector, node(a="1"))
    assert node_selector_matches(selector, node(c="x"))
    assert node_selector_matches(None, node())  # no selector: every node
    assert not node_selector_matches({"nodeSelectorTerms": [{}]}, node())  # an empty term: none
    by_name = {"nodeSelectorTerms": [term(fields=[expr("metadata.name", "In", "n1")])]}
    assert node_selector_matches(by_name, node("n1")) and not node_selector_matches(by_name, node("n2"))


def pool(name: str, selector: dict[str, Any] | None, **extra: Any) -> dict[str, Any]:
    config: dict[str, Any] = {"nodeSelector": selector} if selector else {}
    config.update(extra)
    return {"metadata": {"name": name}, "spec": {"nodeManagerConfig": config}}


def test_first_pool_by_name_and_vendor_selector_wins() -> None:
    gpu = {"nodeSelectorTerms": [term(expr("nvidia.com/gpu.present", "In", "true"))]}
    amd = {"nodeSelectorTerms": [term(expr("amd", "Exists"))]}
    pools = [pool("b-pool", gpu), pool("a-pool", gpu), pool("c-pool", None)]
    assert select_pool(pools, node(**{"nvidia.com/gpu.present": "true"}), "NVIDIA") == "a-pool"
    assert select_pool(pools[:2], node(), "NVIDIA") is None
    vendor_pool = pool("0-pool", gpu, multiVendorNodeSelector={"AMD": amd})
    assert select_pool([vendor_pool], node(amd="1"), "AMD") == "0-pool"
    assert select_pool([vendor_pool], node(amd="1"), "NVIDIA") is None
    deleting = pool("a-pool", gpu)
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert select_pool([deleting], node(**{"nvidia.com/gpu.present": "true"}), "NVIDIA") is None


def test_pod_statuses() -> None:
    pod = {"metadata": {"uid": "u1", "name": "p"},
           "spec": {"containers": [{"name": "a", "image": "img"}, {"name": "b", "image": "img"}]},
           "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]}}
    running = running_status(pod)
    assert running["phase"] == "Running" and [c["name"] for c in running["containerStatuses"]] == ["a", "b"]
    assert {c["type"] for c in running["conditions"]} >= {"PodScheduled", "Ready", "Initialized"}
    assert "initContainerStatuses" not in running
    stopped = terminated_status({**pod, "status": running})
    assert stopped["phase"] == "Succeeded" and stopped["startTime"] == running["startTime"]
    assert all(c["state"]["terminated"]["exitCode"] == 0 for c in stopped["containerStatuses"])
    assert {c["type"]: c["status"] for c in stopped["conditions"]}["Ready"] == "False"


def test_sim_devices_fallback_setting() -> None:
    assert parse_sim_devices_fallback("sim:1xA100-SXM4-80GB") == "sim:1xA100-SXM4-80GB"
    for bad in ("on", "sim:", "nvml"):
        with pytest.raises(ValueError, match="expected auto, off or sim:"):
            parse_sim_devices_fallback(bad)
    everything = Settings.load({}, env={}, roles=("all",))
    assert everything.resolved_sim_devices_fallback == DEFAULT_SIM_DEVICES
    assert everything.runs_simulated_kubelet
    hypervisor = Settings.load({}, env={}, roles=("hypervisor",))
    assert hypervisor.resolved_sim_devices_fallback == "" and not hypervisor.runs_simulated_kubelet
    assert Settings.load({"sim_devices_fallback": "off"}, env={}).resolved_sim_devices_fallback == ""
    with pytest.raises(SettingsError):
        Settings.load({"no_such": 1}, env={})


@pytest.mark.anyio
async def test_device_plans() -> None:
    base = Settings.load({}, env={}, roles=("all",)).replace(node_name="n1")
    explicit = await plan_devices(base.replace(devices="sim:1xH100-SXM5-80GB"))
    assert explicit.spec == "sim:1xH100-SXM5-80GB" and explicit.count == 1 and explicit.simulated
    assert explicit.describe() == "1 GPU(s), simulated: 1x NVIDIA H100 80GB HBM3"
    with pytest.raises(DevicePlanError, match="unknown GPU model"):
        await plan_devices(base.replace(devices="sim:1xNoSuchGPU"))
    without = await plan_devices(base.replace(sim_devices_fallback="off"))
    if without.backend != "none":
        pytest.skip("this machine has an NVIDIA driver: the fallback does not apply")
    assert without.count == 0 and without.describe().startswith("no GPUs (")
    fallback = await plan_devices(base)
    assert fallback.spec == DEFAULT_SIM_DEVICES and fallback.count == 3 and "no NVIDIA driver" in fallback.note
