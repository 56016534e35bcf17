"""A worker holding a hardware partition in the controller's tables, in-process against the embedded
API server: `tf_worker_resources` and `tf_gpu_allocation` carry its template and slots (read from the
pod's partition-id annotation and the GPU's status.allocatedPartitions, written here by hand as the
partition code writes them), its raw_cost is the original's rule on the slice (no over-request
terms), and a plain worker's rows keep the original's fields only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.apiserver_fixture import apply_crds
from tests.helpers import Clock, eventually
from tests.helpers.controller import controllers, kube_client, settings_for, start_controller, worker
from tests.integration.test_metrics_controller import _async, _cluster, _rows
from tfusion.api import annotations as tfa
from tfusion.controller.metrics import ControllerRecorder
from tfusion.kube import resources as r

pytestmark = pytest.mark.anyio

GIB = 1024 ** 3
#: medium QoS of test_metrics_controller's pool: 0.0001/s per TFLOPS, 0.0002/s per GiB; the slice
#: (10 TFLOPS, 4 GiB) is request and limit, so the over-request terms vanish
SLICE_RATE = 10 * 0.0001 + 4 * 0.0002


async def test_partition_rows_and_cost(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    settings = settings_for(apiserver, tmp_path, metrics_interval=3600.0, metrics_path="off")
    wall = Clock()
    async with kube_client(apiserver) as kube:
        await _cluster(kube)
        sliced = worker("sliced", "node-a", ["gpu-a1"], tflops="10", vram="4Gi")
        sliced["metadata"]["annotations"].update({tfa.ISOLATION: tfa.ISOLATION_PARTITIONED,
                                                  tfa.PARTITION_ID: "1g.10gb", tfa.TFLOPS_LIMIT: "20"})
        created = await kube.create(r.PODS, sliced, namespace="default")
        uid = created["metadata"]["uid"]
        await kube.patch(r.GPUS, "gpu-a1", {"status": {"allocatedPartitions": {uid: {
            "templateId": "1g.10gb", "podUid": uid, "podName": "sliced", "namespace": "default",
            "allocatedAt": "2025-01-31T12:00:00Z", "allocatedSlotStart": 6, "allocatedSlotEnd": 7}}}},
            subresource="status")
        plain = await kube.create(r.PODS, worker("plain", "node-a", ["gpu-a2"], tflops="10", vram="4Gi"),
                                  namespace="default")
        async with controllers() as tg:
            ctl = await start_controller(tg, settings)
            recorder = ctl.runtime.metrics
            assert isinstance(recorder, ControllerRecorder)
            recorder.wall = wall
            await eventually(lambda: _async(uid in recorder.ledger and plain["metadata"]["uid"] in recorder.ledger),
                             what="the recorder tracking both workers")
            wall.now = 1060.0
            points = await recorder.record_once()

            rows = {p.tags["worker"]: p for p in _rows(points, "tf_worker_resources")}
            assert rows["sliced"].fields["partition_template"] == "1g.10gb"
            assert rows["sliced"].fields["partition_slice"] == "6-7"
            assert rows["sliced"].fields["tflops_limit"] == 10.0
            assert rows["sliced"].fields["raw_cost"] == pytest.approx(SLICE_RATE * 60)
            assert set(rows["plain"].fields) == {"gpu_count", "tflops_limit", "tflops_request", "raw_cost",
                                                 "vram_bytes_limit", "vram_bytes_request", "ready"}
            allocations = {p.tags["pod"]: p for p in _rows(points, "tf_gpu_allocation")}
            assert allocations["sliced"].fields == {"gpu_count": 1, "partition_template": "1g.10gb",
                                                    "partition_slice": "6-7"}
            assert allocations["plain"].fields == {"gpu_count": 1}
