"""Indexed Jobs (and, later, CronJobs) on the embedded API server: the Job controller of --role=all
with the simulated kubelet, in-process with a Manager, over HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from tests.helpers import eventually
from tfusion.embedded.devices import DevicePlan
from tfusion.embedded.kubelet import SimulatedKubelet
from tfusion.embedded.workloads import WorkloadControllers
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient, KubeError
from tfusion.kube.manager import Manager
from tfusion.settings import Settings

pytestmark = pytest.mark.anyio
NODE = "n1"
NS = "default"
EXIT = "tfusion.dev/simulate-exit-after"
INDEX = "batch.kubernetes.io/job-completion-index"


@pytest.fixture
async def cluster(kube: KubeClient) -> AsyncIterator[KubeClient]:
    """A Manager running the workload controllers and a simulated kubelet for node n1."""
    settings = Settings.load({}, env={}, roles=("all",)).replace(node_name=NODE, leader_elect=False)
    manager = Manager(settings, kube)
    kubelet = SimulatedKubelet(manager, NODE, DevicePlan("auto", (), "none", "no GPUs in this test"))
    WorkloadControllers(manager)
    async with anyio.create_task_group() as tg:
        await tg.start(kubelet.run)
        await tg.start(manager.run)
        yield kube
        tg.cancel_scope.cancel()


def indexed_job(name: str, exit_after: str | None = None, **spec: Any) -> dict[str, Any]:
    annotations = {EXIT: exit_after} if exit_after else {}
    template = {"metadata": {"annotations": annotations},
                "spec": {"nodeName": NODE, "restartPolicy": "Never",
                         "containers": [{"name": "main", "image": "busybox",
                                         "env": [{"name": "KEEP", "value": "1"}]}]}}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"completionMode": "Indexed", "template": template, **spec}}


async def job_pods(kube: KubeClient, name: str) -> list[dict[str, Any]]:
    return (await kube.list(r.PODS, namespace=NS, label_selector=f"job-name={name}")).items


async def test_an_indexed_job_runs_one_pod_per_index_and_reports_completed_indexes(cluster: KubeClient) -> None:
    kube = cluster
    await kube.create(r.JOBS, indexed_job("ranks", "300ms", completions=3, parallelism=3), namespace=NS)

    async def complete() -> dict[str, Any] | None:
        found = await kube.get(r.JOBS, "ranks", namespace=NS)
        conditions = {c["type"]: c["status"] for c in (found.get("status") or {}).get("conditions") or []}
        return found if conditions.get("Complete") == "True" else None

    done = await eventually(complete, 15, what="Indexed Job Complete")
    assert done["status"]["completedIndexes"] == "0-2" and done["status"]["succeeded"] == 3
    pods = await job_pods(kube, "ranks")
    by_index = {p["metadata"]["annotations"][INDEX]: p for p in pods}
    assert sorted(by_index) == ["0", "1", "2"] and len(pods) == 3
    for index, pod in by_index.items():
        assert pod["metadata"]["labels"][INDEX] == index
        assert pod["metadata"]["name"].startswith(f"ranks-{index}-")
        assert pod["spec"]["hostname"] == f"ranks-{index}"
        env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
        assert env == {"KEEP": "1", "JOB_COMPLETION_INDEX": index}


async def test_an_indexed_job_runs_no_more_pods_than_parallelism(cluster: KubeClient) -> None:
    kube = cluster
    await kube.create(r.JOBS, indexed_job("slots", completions=4, parallelism=2), namespace=NS)

    async def two_active() -> dict[str, Any] | None:
        found = await kube.get(r.JOBS, "slots", namespace=NS)
        return found if (found.get("status") or {}).get("active") == 2 else None

    await eventually(two_active, 15, what="two active pods")
    pods = await job_pods(kube, "slots")
    assert sorted(p["metadata"]["annotations"][INDEX] for p in pods) == ["0", "1"]


async def test_an_indexed_job_without_completions_is_refused(cluster: KubeClient) -> None:
    with pytest.raises(KubeError) as refused:
        await cluster.create(r.JOBS, indexed_job("open", parallelism=2), namespace=NS)
    assert refused.value.code == 422 and "spec.completions" in refused.value.message
