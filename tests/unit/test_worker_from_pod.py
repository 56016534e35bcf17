"""The hypervisor's view of a worker pod: annotations read with the shared parsers, bad ones logged.

A running pod with a malformed annotation must not stop the hypervisor: the value is read as absent
and a warning names the pod and the annotation.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tfusion.api import annotations as keys
from tfusion.api.accessors import Pod
from tfusion.hypervisor.workers.kubernetes import worker_from_pod, worker_status
from tfusion.hypervisor.workers.model import STATUS_PENDING, STATUS_RUNNING, STATUS_TERMINATED


def pod(notes: dict[str, str], phase: str = "Running") -> Pod:
    return Pod({"metadata": {"name": "w-1", "namespace": "team", "uid": "uid-1", "annotations": notes},
                "status": {"phase": phase}})


def test_good_annotations_are_parsed() -> None:
    worker = worker_from_pod(pod({
        keys.GPU_IDS: "GPU-AAA, gpu-bbb",
        keys.CONTAINER_GPUS: '{"main": ["GPU-AAA"], "side": ["gpu-bbb"]}',
        keys.EFFECTIVE_HARD_SM_PERCENT: "40",
        keys.ISOLATION: keys.ISOLATION_PARTITIONED, keys.PARTITION_ID: "1g.10gb",
        keys.TFLOPS_REQUEST: "10", keys.VRAM_REQUEST: "1Gi",
    }))
    assert worker.allocated_devices == ("gpu-aaa", "gpu-bbb")
    assert worker.container_gpus == {"main": ["gpu-aaa"], "side": ["gpu-bbb"]}
    assert worker.effective_hard_sm_percent == 40
    assert worker.isolation == "partitioned" and worker.partition_template_id == "1g.10gb"


def test_absent_annotations_are_empty_without_warnings(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        worker = worker_from_pod(pod({keys.TFLOPS_REQUEST: "10", keys.VRAM_REQUEST: "1Gi"}))
    assert worker.allocated_devices == () and worker.container_gpus == {}
    assert worker.effective_hard_sm_percent is None
    assert worker.isolation == keys.DEFAULT_ISOLATION
    assert caplog.records == []


@pytest.mark.parametrize(("key", "value", "field", "empty"), [
    (keys.GPU_IDS, "gpu a,gpu-b", "allocated_devices", ()),
    (keys.GPU_IDS, "gpu-a,GPU-A", "allocated_devices", ()),
    (keys.CONTAINER_GPUS, "not json", "container_gpus", {}),
    (keys.CONTAINER_GPUS, '{"main": "gpu-a"}', "container_gpus", {}),
    (keys.EFFECTIVE_HARD_SM_PERCENT, "lots", "effective_hard_sm_percent", None),
    (keys.EFFECTIVE_HARD_SM_PERCENT, "150", "effective_hard_sm_percent", None),
])
def test_a_malformed_annotation_is_logged_and_read_as_absent(key: str, value: str, field: str, empty: Any,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        worker = worker_from_pod(pod({key: value, keys.TFLOPS_REQUEST: "10", keys.VRAM_REQUEST: "1Gi"}))
    assert getattr(worker, field) == empty
    # gpu-ids is also read by the request parser, which reports it too: every warning names pod and key
    messages = [r.getMessage() for r in caplog.records]
    assert messages and all("team/w-1" in m and key in m for m in messages), messages


@pytest.mark.parametrize(("phase", "status"), [("Running", STATUS_RUNNING), ("Succeeded", STATUS_TERMINATED),
                                               ("Failed", STATUS_TERMINATED), ("Pending", STATUS_PENDING)])
def test_worker_status_follows_the_phase(phase: str, status: str) -> None:
    assert worker_status(pod({}, phase)) == status
