"""The progressive-migration node check that the built-in scheduler, the extender and
simulate-schedule share, and the sentence a waiting native-GPU pod's message gets when every GPU
node runs TensorFusion workers."""

from __future__ import annotations

from tfusion.api.accessors import Node
from tfusion.controller.scheduling import progressive


def node(gpus: str | None) -> Node:
    allocatable = {"cpu": "8"} if gpus is None else {"cpu": "8", "nvidia.com/gpu": gpus}
    return Node({"metadata": {"name": "n"}, "status": {"allocatable": allocatable}})


def test_a_node_with_workers_is_refused_resolvably_and_an_idle_one_passes() -> None:
    failure = progressive.worker_failure("node-a", {"node-a"})
    assert failure is not None
    assert (failure.message, failure.check, failure.unresolvable) == (
        "node(s) run TensorFusion workers", "ProgressiveMigration", False)
    assert progressive.worker_failure("node-b", {"node-a"}) is None


def test_the_busy_note_needs_every_gpu_node_busy() -> None:
    nodes = {"gpu-1": node("2"), "gpu-2": node("1"), "cpu-only": node(None), "no-free": node("0")}
    resources = ["nvidia.com/gpu"]
    note = progressive.busy_note(nodes, resources, {"gpu-1", "gpu-2"})
    assert note == progressive.every_gpu_node_busy(resources)
    assert note.startswith("Every node with nvidia.com/gpu runs TensorFusion workers")
    assert progressive.busy_note(nodes, resources, {"gpu-1"}) == ""  # gpu-2 is idle
    assert progressive.busy_note({"cpu-only": node(None)}, resources, set()) == ""  # no GPU node at all
