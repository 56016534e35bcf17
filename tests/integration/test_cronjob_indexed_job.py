"""Indexed Jobs and CronJobs on the embedded API server: the Job and CronJob controllers of
--role=all with the simulated kubelet, in-process with a Manager, over HTTP. The CronJob
controller reads a test clock (`Wall`), moved by hand, so no test waits for real minutes (and a
daylight-saving change is reached by setting the clock to it). Pods of Indexed Jobs are made to
succeed or fail one index at a time through the simulated kubelet's exit annotations."""

from __future__ import annotations

import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import anyio
import pytest

from tests.helpers import eventually
from tests.helpers.clock import Wall
from tests.helpers.kubectl import Kubectl, needs_kubectl
from tests.helpers.one_box import simulated_node
from tfusion.embedded.workloads import WorkloadControllers
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient, KubeError

pytestmark = pytest.mark.anyio
NODE = "n1"
NS = "default"
EXIT = "tfusion.dev/simulate-exit-after"
EXIT_CODE = "tfusion.dev/simulate-exit-code"
INDEX = "batch.kubernetes.io/job-completion-index"
FAILURE_COUNT = "batch.kubernetes.io/job-index-failure-count"
SCHEDULED = "batch.kubernetes.io/cronjob-scheduled-timestamp"


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


# ------------------------------------------------------------------------------ CronJob time zones, deadlines
def next_spring_change(zone: ZoneInfo, after: float) -> datetime:
    """The first local day after `after` whose clocks move forward (its local midnight)."""
    day = datetime.fromtimestamp(after, zone).replace(hour=0, minute=0, second=0, microsecond=0)
    for _ in range(400):
        day = datetime.combine(day.date() + timedelta(days=1), datetime.min.time(), tzinfo=zone)
        tomorrow = datetime.combine(day.date() + timedelta(days=1), datetime.min.time(), tzinfo=zone)
        if (tomorrow.utcoffset() or timedelta()) > (day.utcoffset() or timedelta()):
            return day
    raise AssertionError("no daylight-saving change within a year")


async def set_clock(kube: KubeClient, wall: Wall, name: str, when: float) -> None:
    wall.now = when
    await kube.patch(r.CRONJOBS, name, {"metadata": {"annotations": {"test/tick": str(when)}}}, namespace=NS)


async def scheduled_times(kube: KubeClient, cronjob: str) -> list[str]:
    return sorted(j["metadata"]["annotations"][SCHEDULED] for j in await jobs_of(kube, cronjob))


async def started_as(kube: KubeClient, cronjob: str, wanted: list[str]) -> list[str] | None:
    """The scheduled times of the CronJob's Jobs, once they are exactly `wanted`."""
    found = await scheduled_times(kube, cronjob)
    return found if found == wanted else None


async def test_a_cronjob_runs_at_its_zone_local_hour_across_a_daylight_saving_change(
        cluster: KubeClient, wall: Wall) -> None:
    kube, zone = cluster, ZoneInfo("America/New_York")
    day_before = next_spring_change(zone, time.time()) - timedelta(days=1)
    wall.now = (day_before + timedelta(hours=8)).timestamp()
    created = await kube.create(r.CRONJOBS, cronjob("nine", schedule="0 9 * * *", timeZone="America/New_York"),
                                namespace=NS)
    assert created["spec"]["timeZone"] == "America/New_York"
    expected: list[str] = []
    for day in (day_before, day_before + timedelta(days=1)):
        nine = datetime.combine(day.date(), datetime.min.time().replace(hour=9), tzinfo=zone)
        await set_clock(kube, wall, "nine", (nine + timedelta(minutes=1)).timestamp())
        expected.append(nine.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))

        await eventually(lambda: started_as(kube, "nine", expected), 15, what=f"the Job of {nine.isoformat()}")
    first, second = (datetime.fromisoformat(t) for t in expected)
    assert (first.hour, second.hour) == (14, 13)  # 09:00 EST, then 09:00 EDT
    assert second - first == timedelta(hours=23)


async def test_a_run_missed_by_more_than_the_starting_deadline_is_skipped_with_a_warning(
        cluster: KubeClient, wall: Wall) -> None:
    kube = cluster
    base = (int(time.time()) // 300 + 2) * 300  # a five-minute mark after the CronJob's creation
    wall.now = base - 60
    await kube.create(r.CRONJOBS, cronjob("late", schedule="*/5 * * * *", startingDeadlineSeconds=60), namespace=NS)
    stamp = datetime.fromtimestamp

    def iso(epoch: float) -> str:
        return stamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    await set_clock(kube, wall, "late", base + 30)  # 30 s late: within the deadline

    await eventually(lambda: started_as(kube, "late", [iso(base)]), 15, what="the run within the deadline")
    await set_clock(kube, wall, "late", base + 300 + 120)  # two minutes late: past it

    async def warned() -> dict[str, Any] | None:
        events = (await kube.list(r.EVENTS, namespace=NS)).items
        return next((e for e in events if e.get("reason") == "MissSchedule"
                     and e["involvedObject"]["name"] == "late"), None)

    warning = await eventually(warned, 15, what="the MissSchedule event")
    assert warning["type"] == "Warning"
    assert stamp(base + 300, UTC).strftime("%a, %d %b %Y %H:%M:%S +0000") in warning["message"]
    assert await scheduled_times(kube, "late") == [iso(base)]
    status = (await kube.get(r.CRONJOBS, "late", namespace=NS))["status"]
    assert status["lastScheduleTime"] == iso(base)
    await set_clock(kube, wall, "late", base + 600 + 10)
    await eventually(lambda: started_as(kube, "late", [iso(base), iso(base + 600)]), 15,
                     what="the next run within the deadline")


@pytest.mark.parametrize(("spec", "field", "words"), [
    ({"timeZone": "Mars/Olympus_Mons"}, "spec.timeZone", "unknown time zone Mars/Olympus_Mons"),
    ({"timeZone": ""}, "spec.timeZone", "must be nil or non-empty"),
    ({"timeZone": "Local"}, "spec.timeZone", "explicit time zone"),
    ({"schedule": "CRON_TZ=Europe/Paris 0 6 * * *"}, "spec.schedule", "use timeZone field instead"),
    ({"schedule": "TZ=UTC 0 6 * * *"}, "spec.schedule", "use timeZone field instead"),
])
async def test_a_bad_time_zone_is_refused_naming_field_and_value(kube: KubeClient, spec: dict[str, Any], field: str,
                                                               words: str) -> None:
    with pytest.raises(KubeError) as refused:
        await kube.create(r.CRONJOBS, cronjob("zoned", **spec), namespace=NS)
    assert refused.value.code == 422 and f"{field}: Invalid value" in refused.value.message
    assert words in refused.value.message


@needs_kubectl
async def test_kubectl_shows_a_cronjobs_time_zone(apiserver: Any, kube: KubeClient, tmp_path: Path) -> None:
    await kube.create(r.CRONJOBS, cronjob("berlin", schedule="0 6 * * *", timeZone="Europe/Berlin"), namespace=NS)
    kubectl = Kubectl(apiserver.kubeconfig, tmp_path / "kubectl-cache")
    listed = await anyio.to_thread.run_sync(lambda: kubectl("get", "cj", "berlin").stdout.splitlines())
    assert listed[1].split()[:7] == ["berlin", "0", "6", "*", "*", "*", "Europe/Berlin"]


# ------------------------------------------------------------------------------ Indexed Jobs: retries, success policy
async def exit_pod(kube: KubeClient, name: str, code: int) -> None:
    """Make the simulated kubelet end the pod's containers now with `code`."""
    await kube.patch(r.PODS, name, {"metadata": {"annotations": {EXIT: "10ms", EXIT_CODE: str(code)}}},
                     namespace=NS)


async def pods_by_index(kube: KubeClient, job: str, count: int) -> dict[str, dict[str, Any]]:
    """The running pod of each index, once `count` indexes have one."""
    async def running() -> dict[str, dict[str, Any]] | None:
        pods = [p for p in await job_pods(kube, job) if (p.get("status") or {}).get("phase") == "Running"
                and not p["metadata"].get("deletionTimestamp")]
        found = {p["metadata"]["annotations"][INDEX]: p for p in pods}
        return found if len(found) == count else None

    found: dict[str, dict[str, Any]] = await eventually(running, 15, what=f"{count} running pods of {job}")
    return found


async def finished_job(kube: KubeClient, name: str) -> dict[str, Any]:
    async def done() -> dict[str, Any] | None:
        found = await kube.get(r.JOBS, name, namespace=NS)
        return found if finished(found) else None

    result: dict[str, Any] = await eventually(done, 15, what=f"Job {name} finished")
    return result


async def condition_history(kube: KubeClient, name: str, since: str, seen: list[set[str]]) -> None:
    """Append the set of true conditions of each version of Job `name` after resourceVersion
    `since` to `seen`, until it is Complete or Failed."""
    async with aclosing(kube.watch(r.JOBS, namespace=NS, field_selector=f"metadata.name={name}",
                                   resource_version=since, timeout_seconds=30)) as events:
        async for kind, obj in events:
            if kind == "BOOKMARK":
                continue
            seen.append({c["type"] for c in (obj.get("status") or {}).get("conditions") or []
                         if c["status"] == "True"})
            if seen[-1] & {"Complete", "Failed"}:
                return


def conditions(job: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c.get("reason", "")) for c in job["status"].get("conditions") or []}


async def test_an_index_out_of_retries_fails_and_the_job_fails_with_failed_indexes(cluster: KubeClient) -> None:
    kube = cluster
    created = await kube.create(r.JOBS, indexed_job("retry", completions=3, parallelism=3, backoffLimitPerIndex=1),
                                namespace=NS)
    assert created["spec"]["backoffLimit"] == 2147483647
    first = await pods_by_index(kube, "retry", 3)
    assert {p["metadata"]["annotations"][FAILURE_COUNT] for p in first.values()} == {"0"}
    for index, code in (("0", 0), ("1", 1), ("2", 0)):
        await exit_pod(kube, first[index]["metadata"]["name"], code)

    async def replaced() -> dict[str, Any] | None:
        again = [p for p in await job_pods(kube, "retry") if p["metadata"]["annotations"][INDEX] == "1"
                 and p["metadata"]["name"] != first["1"]["metadata"]["name"]
                 and (p.get("status") or {}).get("phase") == "Running"]
        return again[0] if again else None

    second = await eventually(replaced, 15, what="index 1 started again")
    assert second["metadata"]["annotations"][FAILURE_COUNT] == "1"
    assert second["metadata"]["name"].startswith("retry-1-")
    await exit_pod(kube, second["metadata"]["name"], 1)
    job = await finished_job(kube, "retry")
    assert conditions(job)["Failed"] == ("True", "FailedIndexes")
    assert conditions(job)["FailureTarget"] == ("True", "FailedIndexes")
    status = job["status"]
    assert (status["failedIndexes"], status["completedIndexes"], status["failed"], status["succeeded"]) == (
        "1", "0,2", 2, 2)
    assert len([p for p in await job_pods(kube, "retry") if p["metadata"]["annotations"][INDEX] == "1"]) == 2


async def test_more_failed_indexes_than_allowed_fail_the_job_at_once(cluster: KubeClient) -> None:
    kube = cluster
    await kube.create(r.JOBS, indexed_job("strict", completions=3, parallelism=3, backoffLimitPerIndex=0,
                                          maxFailedIndexes=0), namespace=NS)
    pods = await pods_by_index(kube, "strict", 3)
    seen: list[set[str]] = []
    async with anyio.create_task_group() as tg:
        since = (await kube.get(r.JOBS, "strict", namespace=NS))["metadata"]["resourceVersion"]
        tg.start_soon(condition_history, kube, "strict", since, seen)
        await exit_pod(kube, pods["2"]["metadata"]["name"], 1)
        job = await finished_job(kube, "strict")
    assert {"FailureTarget"} in seen, seen  # announced while the other indexes were still running
    assert conditions(job)["Failed"] == ("True", "MaxFailedIndexesExceeded")
    assert job["status"]["failedIndexes"] == "2"

    async def others_stopped() -> bool:
        left = [p for p in await job_pods(kube, "strict") if (p.get("status") or {}).get("phase") == "Running"
                and not p["metadata"].get("deletionTimestamp")]
        return not left

    await eventually(others_stopped, 15, what="the other indexes' pods stopped")


@pytest.mark.parametrize(("rule", "succeed", "recorded"), [
    ({"succeededIndexes": "0,2"}, ["0", "2"], "0,2"),
    ({"succeededCount": 2}, ["1", "2"], "1-2"),
    ({"succeededIndexes": "1-3", "succeededCount": 1}, ["3"], "3"),
])
async def test_a_success_policy_completes_the_job_early(cluster: KubeClient, rule: dict[str, Any],
                                                        succeed: list[str], recorded: str) -> None:
    kube = cluster
    await kube.create(r.JOBS, indexed_job("early", completions=4, parallelism=4,
                                          successPolicy={"rules": [{"succeededCount": 4}, rule]}), namespace=NS)
    pods = await pods_by_index(kube, "early", 4)
    seen: list[set[str]] = []
    async with anyio.create_task_group() as tg:
        since = (await kube.get(r.JOBS, "early", namespace=NS))["metadata"]["resourceVersion"]
        tg.start_soon(condition_history, kube, "early", since, seen)
        for index in succeed:
            await exit_pod(kube, pods[index]["metadata"]["name"], 0)
        job = await finished_job(kube, "early")
    # the criteria are met while other indexes still run; Complete follows once they are stopped
    assert {"SuccessCriteriaMet"} in seen and seen[-1] == {"SuccessCriteriaMet", "Complete"}, seen
    met = next(c for c in job["status"]["conditions"] if c["type"] == "SuccessCriteriaMet")
    assert (met["status"], met["reason"], met["message"]) == ("True", "SuccessPolicy", "Matched rules at index 1")
    assert conditions(job)["Complete"] == ("True", "SuccessPolicy")
    assert [c["type"] for c in job["status"]["conditions"]][:2] == ["SuccessCriteriaMet", "Complete"]
    assert job["status"]["completedIndexes"] == recorded and job["status"].get("completionTime")


async def test_a_success_policy_does_not_end_the_job_before_its_rule_holds(cluster: KubeClient) -> None:
    kube = cluster
    await kube.create(r.JOBS, indexed_job("wait", completions=3, parallelism=3,
                                          successPolicy={"rules": [{"succeededIndexes": "0-1"}]}), namespace=NS)
    pods = await pods_by_index(kube, "wait", 3)
    await exit_pod(kube, pods["0"]["metadata"]["name"], 0)

    async def recorded() -> dict[str, Any] | None:
        found = await kube.get(r.JOBS, "wait", namespace=NS)
        return found if (found.get("status") or {}).get("completedIndexes") == "0" else None

    job = await eventually(recorded, 15, what="index 0 recorded")
    assert not finished(job)
    await exit_pod(kube, pods["1"]["metadata"]["name"], 0)
    assert conditions(await finished_job(kube, "wait"))["Complete"] == ("True", "SuccessPolicy")


@pytest.mark.parametrize(("spec", "field", "words"), [
    ({"completions": 3, "parallelism": 100_001}, "spec.parallelism", "less than or equal to 100000"),
    ({"completions": 3, "backoffLimitPerIndex": 1, "maxFailedIndexes": 4}, "spec.maxFailedIndexes",
     "less than or equal to completions"),
    ({"completions": 3, "maxFailedIndexes": 1}, "spec.backoffLimitPerIndex", "when maxFailedIndexes is specified"),
    ({"completions": 3, "backoffLimitPerIndex": -1}, "spec.backoffLimitPerIndex", "greater than or equal to 0"),
    ({"completions": 200_000, "parallelism": 1, "backoffLimitPerIndex": 1}, "spec.maxFailedIndexes",
     "must be specified when completions is above 100000"),
    ({"completions": 3, "successPolicy": {"rules": []}}, "spec.successPolicy.rules", "at least one rules"),
    ({"completions": 3, "successPolicy": {"rules": [{}]}}, "spec.successPolicy.rules[0]",
     "at least one of succeededCount or succeededIndexes"),
    ({"completions": 3, "successPolicy": {"rules": [{"succeededIndexes": "0-5"}]}},
     "spec.successPolicy.rules[0].succeededIndexes", "too large index: 5"),
    ({"completions": 3, "successPolicy": {"rules": [{"succeededIndexes": "2,1"}]}},
     "spec.successPolicy.rules[0].succeededIndexes", "non-increasing order"),
    ({"completions": 3, "successPolicy": {"rules": [{"succeededIndexes": "a"}]}},
     "spec.successPolicy.rules[0].succeededIndexes", "error parsing succeededIndexes"),
    ({"completions": 3, "successPolicy": {"rules": [{"succeededCount": 4}]}},
     "spec.successPolicy.rules[0].succeededCount", "less than or equal to 3 (the number of specified completions)"),
    ({"completions": 3, "successPolicy": {"rules": [{"succeededIndexes": "0", "succeededCount": 2}]}},
     "spec.successPolicy.rules[0].succeededCount", "less than or equal to 1 (the number of indexes"),
])
async def test_bad_indexed_job_fields_are_refused_naming_the_field(kube: KubeClient, spec: dict[str, Any],
                                                                   field: str, words: str) -> None:
    with pytest.raises(KubeError) as refused:
        await kube.create(r.JOBS, indexed_job("bad", **spec), namespace=NS)
    assert refused.value.code == 422 and f"{field}: " in refused.value.message, refused.value.message
    assert words in refused.value.message


@pytest.mark.parametrize(("spec", "field"), [
    ({"completions": 3, "backoffLimitPerIndex": 1}, "spec.backoffLimitPerIndex"),
    ({"completions": 3, "successPolicy": {"rules": [{"succeededCount": 1}]}}, "spec.successPolicy"),
])
async def test_per_index_fields_need_an_indexed_job(kube: KubeClient, spec: dict[str, Any], field: str) -> None:
    body = indexed_job("plain", **spec)
    body["spec"]["completionMode"] = "NonIndexed"
    with pytest.raises(KubeError) as refused:
        await kube.create(r.JOBS, body, namespace=NS)
    assert refused.value.code == 422 and f"{field}: Invalid value" in refused.value.message
    assert "requires indexed completion mode" in refused.value.message


async def test_an_indexed_job_scales_completions_only_together_with_parallelism(kube: KubeClient) -> None:
    await kube.create(r.JOBS, indexed_job("elastic", completions=2, parallelism=2, suspend=True), namespace=NS)
    scaled = await kube.patch(r.JOBS, "elastic", {"spec": {"completions": 4, "parallelism": 4}}, namespace=NS)
    assert (scaled["spec"]["completions"], scaled["spec"]["parallelism"]) == (4, 4)
    for change, field in (({"completions": 5}, "spec.completions"), ({"completionMode": "NonIndexed"},
                                                                      "spec.completionMode")):
        with pytest.raises(KubeError) as refused:
            await kube.patch(r.JOBS, "elastic", {"spec": change}, namespace=NS)
        assert refused.value.code == 422 and f"{field}: Invalid value" in refused.value.message
        assert "field is immutable" in refused.value.message
