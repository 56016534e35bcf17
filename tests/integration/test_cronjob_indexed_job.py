"""Indexed Jobs and CronJobs on the embedded API server: the Job and CronJob controllers of
--role=all with the simulated kubelet, in-process with a Manager, over HTTP. The CronJob
controller reads a test clock (`Wall`), moved by hand, so no test waits for real minutes."""

from __future__ import annotations

import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.helpers import eventually
from tests.helpers.one_box import simulated_node
from tests.integration.test_kubectl import KUBECTL, Kubectl
from tfusion.embedded.workloads import WorkloadControllers
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient, KubeError

pytestmark = pytest.mark.anyio
needs_kubectl = pytest.mark.skipif(not Path(KUBECTL).exists(), reason="kubectl is not installed")
NODE = "n1"
NS = "default"
EXIT = "tfusion.dev/simulate-exit-after"
INDEX = "batch.kubernetes.io/job-completion-index"


class Wall:
    """Epoch seconds that move only when a test says so."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def wall() -> Wall:
    return Wall()


@pytest.fixture
async def cluster(kube: KubeClient, wall: Wall) -> AsyncIterator[KubeClient]:
    """A Manager running the workload controllers and a simulated kubelet for node n1."""
    async with simulated_node(kube, NODE, lambda manager: WorkloadControllers(manager, wall=wall)) as client:
        yield client


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


def cronjob(name: str, exit_after: str | None = None, schedule: str = "*/5 * * * *", **spec: Any) -> dict[str, Any]:
    annotations = {EXIT: exit_after} if exit_after else {}
    pod = {"metadata": {"annotations": annotations},
           "spec": {"nodeName": NODE, "restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox"}]}}
    return {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": name},
            "spec": {"schedule": schedule, "jobTemplate": {"spec": {"template": pod}}, **spec}}


async def tick(kube: KubeClient, wall: Wall, name: str, minutes: int = 5) -> None:
    """Move the test clock on and touch the CronJob, so its controller looks at it now."""
    wall.now += minutes * 60
    await kube.patch(r.CRONJOBS, name, {"metadata": {"annotations": {"test/tick": str(wall.now)}}}, namespace=NS)


async def jobs_of(kube: KubeClient, cronjob: str) -> list[dict[str, Any]]:
    jobs = (await kube.list(r.JOBS, namespace=NS)).items
    return [j for j in jobs if any(o["name"] == cronjob for o in j["metadata"].get("ownerReferences") or [])
            and not j["metadata"].get("deletionTimestamp")]


def finished(job: dict[str, Any]) -> bool:
    return any(c["type"] in ("Complete", "Failed") and c["status"] == "True"
               for c in (job.get("status") or {}).get("conditions") or [])


async def test_a_cronjob_is_defaulted_and_creates_its_job_when_the_clock_reaches_the_schedule(
        cluster: KubeClient, wall: Wall) -> None:
    kube = cluster
    created = await kube.create(r.CRONJOBS, cronjob("tick", "100ms"), namespace=NS)
    spec = created["spec"]
    assert (spec["concurrencyPolicy"], spec["suspend"]) == ("Allow", False)
    assert (spec["successfulJobsHistoryLimit"], spec["failedJobsHistoryLimit"]) == (3, 1)
    await anyio.sleep(0)
    assert await jobs_of(kube, "tick") == []
    await tick(kube, wall, "tick")

    async def one_done() -> list[dict[str, Any]] | None:
        jobs = await jobs_of(kube, "tick")
        return jobs if len(jobs) == 1 and finished(jobs[0]) else None

    [job] = await eventually(one_done, 15, what="the CronJob's Job completes")
    minutes = int(job["metadata"]["name"].rsplit("-", 1)[1])
    assert job["metadata"]["ownerReferences"][0]["kind"] == "CronJob"
    assert wall.now - 300 < minutes * 60 <= wall.now

    async def recorded() -> dict[str, Any] | None:
        status = (await kube.get(r.CRONJOBS, "tick", namespace=NS)).get("status") or {}
        return status if status.get("lastSuccessfulTime") and not status.get("active") else None

    status = await eventually(recorded, 15, what="lastSuccessfulTime")
    assert status["lastScheduleTime"] == job["metadata"]["annotations"][
        "batch.kubernetes.io/cronjob-scheduled-timestamp"]


async def test_forbid_skips_a_run_while_a_job_is_active(cluster: KubeClient, wall: Wall) -> None:
    kube = cluster
    await kube.create(r.CRONJOBS, cronjob("busy", concurrencyPolicy="Forbid"), namespace=NS)
    await tick(kube, wall, "busy")

    async def one_active() -> dict[str, Any] | None:
        status = (await kube.get(r.CRONJOBS, "busy", namespace=NS)).get("status") or {}
        return status if len(status.get("active") or []) == 1 else None

    first = await eventually(one_active, 15, what="the first Job active")
    await tick(kube, wall, "busy")

    async def skipped() -> bool:
        events = (await kube.list(r.EVENTS, namespace=NS)).items
        return any(e.get("reason") == "JobAlreadyActive" and e["involvedObject"]["name"] == "busy" for e in events)

    await eventually(skipped, 15, what="the JobAlreadyActive event")
    assert [j["metadata"]["name"] for j in await jobs_of(kube, "busy")] == [first["active"][0]["name"]]
    status = (await kube.get(r.CRONJOBS, "busy", namespace=NS))["status"]
    assert status["lastScheduleTime"] == first["lastScheduleTime"], (status, first)


async def test_finished_jobs_beyond_the_history_limits_are_deleted(cluster: KubeClient, wall: Wall) -> None:
    kube = cluster
    await kube.create(r.CRONJOBS, cronjob("hist", "100ms", successfulJobsHistoryLimit=1), namespace=NS)
    names: list[str] = []
    for _ in range(3):
        await tick(kube, wall, "hist")

        async def newest_done() -> str | None:
            done = [j["metadata"]["name"] for j in await jobs_of(kube, "hist") if finished(j)]
            fresh = [n for n in done if n not in names]
            return fresh[0] if fresh else None

        names.append(await eventually(newest_done, 15, what="the next Job completes"))

    async def pruned() -> list[str] | None:
        left = [j["metadata"]["name"] for j in await jobs_of(kube, "hist")]
        return left if left == names[-1:] else None

    assert await eventually(pruned, 15, what="history pruned to one Job") == names[-1:]


@pytest.mark.parametrize("schedule", ["61 * * * *", "* * *", "*/0 * * * *", "@often", "5-2 * * * *", "x * * * *"])
async def test_a_bad_schedule_is_refused_naming_spec_schedule(kube: KubeClient, schedule: str) -> None:
    with pytest.raises(KubeError) as refused:
        await kube.create(r.CRONJOBS, cronjob("bad", schedule=schedule), namespace=NS)
    assert refused.value.code == 422 and "spec.schedule" in refused.value.message


@pytest.mark.parametrize("schedule", ["@hourly", "0 9 * * mon-fri", "*/15 1-3,22 1,15 jan-jun/2 *"])
async def test_good_schedules_are_accepted(kube: KubeClient, schedule: str) -> None:
    await kube.create(r.CRONJOBS, cronjob("good", schedule=schedule), namespace=NS)
    await kube.delete(r.CRONJOBS, "good", namespace=NS)


async def test_a_bad_concurrency_policy_is_refused(kube: KubeClient) -> None:
    with pytest.raises(KubeError) as refused:
        await kube.create(r.CRONJOBS, cronjob("bad", concurrencyPolicy="Sometimes"), namespace=NS)
    assert refused.value.code == 422 and "spec.concurrencyPolicy" in refused.value.message


@needs_kubectl
async def test_kubectl_creates_and_lists_cronjobs(apiserver: Any, tmp_path: Path) -> None:
    kubectl = Kubectl(apiserver.kubeconfig, tmp_path / "kubectl-cache")

    async def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return await anyio.to_thread.run_sync(lambda: kubectl(*args, check=check))

    await run("create", "cronjob", "nightly", "--image=busybox", "--schedule=0 3 * * *")
    listed = (await run("get", "cj")).stdout.splitlines()
    assert listed[0].split()[:5] == ["NAME", "SCHEDULE", "TIMEZONE", "SUSPEND", "ACTIVE"]
    assert listed[1].split()[:9] == ["nightly", "0", "3", "*", "*", "*", "<none>", "False", "0"]
    refused = await run("create", "cronjob", "never", "--image=busybox", "--schedule=0 25 * * *", check=False)
    assert refused.returncode != 0 and "spec.schedule" in refused.stderr
