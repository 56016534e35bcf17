"""Pure parts of tfusion/embedded: device plans, pod statuses, settings."""

from __future__ import annotations

import pytest

from tfusion.api.accessors import Pod, section
from tfusion.api.jsontypes import JsonObject
from tfusion.embedded.devices import DevicePlanError, plan_devices
from tfusion.embedded.kubelet import running_status, terminated_status
from tfusion.settings import DEFAULT_SIM_DEVICES, Settings, SettingsError, parse_sim_devices_fallback


def test_pod_statuses() -> None:
    pod: JsonObject = {
        "metadata": {"uid": "u1", "name": "p"},
        "spec": {"containers": [{"name": "a", "image": "img"}, {"name": "b", "image": "img"}]},
        "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]}}
    running = Pod({**pod, "status": running_status(Pod(pod))})
    assert running.phase == "Running" and [c["name"] for c in running.container_statuses] == ["a", "b"]
    assert {c["type"] for c in running.conditions} >= {"PodScheduled", "Ready", "Initialized"}
    assert "initContainerStatuses" not in running.status
    stopped = Pod({**pod, "status": terminated_status(running)})
    assert stopped.phase == "Succeeded" and stopped.status["startTime"] == running.status["startTime"]
    assert all(section(c, "state", "terminated").get("exitCode") == 0 for c in stopped.container_statuses)
    assert {c["type"]: c["status"] for c in stopped.conditions}["Ready"] == "False"


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
