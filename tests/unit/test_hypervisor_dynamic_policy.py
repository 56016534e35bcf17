"""The hypervisor's Allocate check under the dynamic isolation policy (workers/dynamic_policy.py):
partitioned refused, shared needs a free device, other modes must match the device's workers."""

from __future__ import annotations

from tfusion.api import annotations as keys
from tfusion.hypervisor.workers.dynamic_policy import checker, refusal
from tfusion.hypervisor.workers.model import WorkerAllocation, WorkerInfo


def w(name: str, mode: str, *devices: str) -> WorkerInfo:
    return WorkerInfo(uid=f"uid-{name}", namespace="ns", name=name, allocated_devices=devices, isolation=mode)


def test_partitioned_and_unknown_modes_are_refused() -> None:
    assert refusal(w("p", keys.ISOLATION_PARTITIONED, "gpu-0"), []) == \
        "worker ns/p: partitioned isolation is not allowed under the dynamic isolation policy"
    assert "isolation mode 'odd' is not allowed" in (refusal(w("o", "odd", "gpu-0"), []) or "")


def test_same_mode_on_a_device_is_admitted_and_another_refused() -> None:
    running = [w("a", keys.ISOLATION_SOFT, "GPU-0"), w("b", keys.ISOLATION_HARD, "gpu-1")]
    assert refusal(w("c", keys.ISOLATION_SOFT, "gpu-0"), running) is None
    assert refusal(w("d", keys.ISOLATION_HARD, "gpu-0"), running) == (
        "worker ns/d: device gpu-0 runs soft isolation (ns/a) under the dynamic isolation policy; the pod asks hard")


def test_shared_needs_the_device_free_of_others_but_not_of_itself() -> None:
    me = w("s", keys.ISOLATION_SHARED, "gpu-0")
    assert refusal(me, [me]) is None
    assert refusal(me, [me, w("x", keys.ISOLATION_SHARED, "gpu-0")]) == \
        "worker ns/s: shared isolation needs device gpu-0 free, but ns/x holds it"
    assert refusal(me, [w("y", keys.ISOLATION_SOFT, "gpu-1")]) is None


def test_the_checker_reads_the_current_allocations() -> None:
    current: list[WorkerAllocation] = [WorkerAllocation(worker=w("a", keys.ISOLATION_SOFT, "gpu-0"), devices=(),
                                                        envs={}, device_specs=())]
    check = checker(lambda: current)
    assert check(w("b", keys.ISOLATION_HARD, "gpu-0")) is not None
    current.clear()
    assert check(w("b", keys.ISOLATION_HARD, "gpu-0")) is None
