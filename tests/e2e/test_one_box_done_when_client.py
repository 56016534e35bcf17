"""Issue 25's "done when", the official-client half: the workload and policy kinds reach the state the
README documents when driven through the official `kubernetes` Python client (AppsV1Api, BatchV1Api,
CoreV1Api, PolicyV1Api), configured from the kubeconfig `tfusion --role=all` writes. A DaemonSet has
a ready pod on the node, a StatefulSet of 3 starts -0, -1, -2 one after another, an Indexed Job of 3
completes index by index, an eviction is refused with 429 by a budget and allowed when the budget
has room. The CronJob's minute cannot be waited for in a test, so it runs on the in-process one-box
(the same controllers and simulated kubelet) with the CronJob controller's clock moved by hand.

One --role=all process serves the module; every check polls with a deadline."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import anyio
import pytest
from kubernetes import client as kube_client
from kubernetes import watch as kube_watch
from kubernetes.client.exceptions import ApiException

from tests.helpers import eventually
from tests.helpers.clock import Wall
from tests.helpers.official_client import official_client
from tests.helpers.one_box import simulated_node
from tests.helpers.role_all import NODE, RoleAll
from tfusion.embedded.workloads import WorkloadControllers
from tfusion.kube.client import KubeClient

T = TypeVar("T")
NS = "default"
EXIT_AFTER = "tfusion.dev/simulate-exit-after"
INDEX = "batch.kubernetes.io/job-completion-index"


@pytest.fixture(scope="module")
def box(role_all_ready: RoleAll) -> RoleAll:
    """The module's one --role=all process (tests/helpers/role_all.py)."""
    return role_all_ready


@pytest.fixture(scope="module")
def api(box: RoleAll) -> Any:
    return official_client(box.kubeconfig)


def template(app: str, annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"labels": {"app": app}, "annotations": annotations or {}},
            "spec": {"containers": [{"name": "main", "image": "busybox", "command": ["sleep", "3600"]}], **spec}}


def conditions(obj: Any) -> dict[str, str]:
    return {c.type: c.status for c in (obj.status and obj.status.conditions) or []}


def running_and_ready(pod: Any) -> bool:
    return bool(pod.status.phase == "Running" and conditions(pod).get("Ready") == "True")


def test_a_daemonset_has_as_many_ready_pods_as_it_wants(box: RoleAll, api: Any) -> None:
    apps: Any = kube_client.AppsV1Api(api)
    core: Any = kube_client.CoreV1Api(api)
    apps.create_namespaced_daemon_set(NS, {
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "agent"},
        "spec": {"selector": {"matchLabels": {"app": "agent"}}, "template": template("agent")}})

    def settled() -> Any:
        status = apps.read_namespaced_daemon_set("agent", NS).status
        ready = status is not None and status.desired_number_scheduled == status.number_ready == 1
        return status if ready else None

    status = box.wait_for("desiredNumberScheduled == numberReady", settled, timeout=30)
    assert status.current_number_scheduled == status.number_available == 1
    [pod] = core.list_namespaced_pod(NS, label_selector="app=agent").items
    assert pod.spec.node_name == NODE and running_and_ready(pod)


def test_a_statefulset_of_3_starts_its_pods_in_order(box: RoleAll, api: Any) -> None:
    apps: Any = kube_client.AppsV1Api(api)
    core: Any = kube_client.CoreV1Api(api)
    since = core.list_namespaced_pod(NS, label_selector="app=web").metadata.resource_version
    apps.create_namespaced_stateful_set(NS, {
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "web"},
        "spec": {"replicas": 3, "serviceName": "web", "selector": {"matchLabels": {"app": "web"}},
                 "template": template("web")}})
    # the watch delivers writes in the order they were committed: when pod -k is added, pod -(k-1)
    # must already have been seen Running and Ready (OrderedReady)
    ready: set[str] = set()
    added: list[str] = []
    watcher: Any = kube_watch.Watch()  # type: ignore[no-untyped-call]
    stream = watcher.stream(core.list_namespaced_pod, NS, label_selector="app=web", resource_version=since,
                            timeout_seconds=30)
    for event in stream:
        pod = event["object"]
        name = pod.metadata.name
        if event["type"] == "ADDED":
            ordinal = int(name.rsplit("-", 1)[1])
            assert ordinal == len(added) and all(f"web-{k}" in ready for k in range(ordinal)), (name, ready)
            added.append(name)
        if running_and_ready(pod):
            ready.add(name)
        if len(ready) == 3:
            break
    assert added == ["web-0", "web-1", "web-2"] and len(ready) == 3, (added, ready)

    pods = {p.metadata.name: p for p in core.list_namespaced_pod(NS, label_selector="app=web").items}
    assert sorted(pods) == ["web-0", "web-1", "web-2"]
    for name, pod in pods.items():
        assert (pod.spec.node_name, pod.spec.hostname, pod.spec.subdomain) == (NODE, name, "web")

    def all_ready() -> Any:
        status = apps.read_namespaced_stateful_set("web", NS).status
        return status if status and status.ready_replicas == 3 else None

    status = box.wait_for("readyReplicas 3", all_ready)
    assert status.replicas == status.current_replicas == status.updated_replicas == 3


def test_an_indexed_job_of_3_completes_every_index(box: RoleAll, api: Any) -> None:
    batch: Any = kube_client.BatchV1Api(api)
    core: Any = kube_client.CoreV1Api(api)
    batch.create_namespaced_job(NS, {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "ranks"},
        "spec": {"completionMode": "Indexed", "completions": 3, "parallelism": 3,
                 "template": template("ranks", {EXIT_AFTER: "300ms"}, restartPolicy="Never")}})

    def complete() -> Any:
        job = batch.read_namespaced_job("ranks", NS)
        return job if conditions(job).get("Complete") == "True" else None

    job = box.wait_for("the Indexed Job Complete", complete, timeout=30)
    assert (job.status.completed_indexes, job.status.succeeded, job.status.failed) == ("0-2", 3, 0)
    pods = core.list_namespaced_pod(NS, label_selector="job-name=ranks").items
    by_index = {p.metadata.annotations[INDEX]: p for p in pods}
    assert sorted(by_index) == ["0", "1", "2"] and len(pods) == 3
    for index, pod in by_index.items():
        env = {e.name: e.value for e in pod.spec.containers[0].env}
        assert (pod.metadata.labels[INDEX], env["JOB_COMPLETION_INDEX"]) == (index, index)
        assert (pod.spec.hostname, pod.status.phase, pod.spec.node_name) == (f"ranks-{index}", "Succeeded", NODE)


def evict(core: Any, name: str) -> Any:
    body = kube_client.V1Eviction(metadata=kube_client.V1ObjectMeta(name=name, namespace=NS))
    return core.create_namespaced_pod_eviction(name, NS, body)


def gone(core: Any, name: str) -> bool:
    try:
        core.read_namespaced_pod(name, NS)
    except ApiException as exc:
        return bool(exc.status == 404)
    return False


def test_an_eviction_is_refused_with_429_while_a_budget_forbids_it(box: RoleAll, api: Any) -> None:
    core: Any = kube_client.CoreV1Api(api)
    policy: Any = kube_client.PolicyV1Api(api)
    policy.create_namespaced_pod_disruption_budget(NS, {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "guard"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}})
    for name in ("guarded-a", "guarded-b"):
        pod = template("guarded")
        core.create_namespaced_pod(NS, {"apiVersion": "v1", "kind": "Pod", **pod,
                                        "metadata": {**pod["metadata"], "name": name}})
    box.wait_for("both guarded pods Running and Ready", lambda: all(
        running_and_ready(core.read_namespaced_pod(n, NS)) for n in ("guarded-a", "guarded-b")))

    evict(core, "guarded-a")  # two healthy, one needed: allowed
    box.wait_for("guarded-a evicted", lambda: gone(core, "guarded-a"))
    with pytest.raises(ApiException) as refused:
        evict(core, "guarded-b")
    assert refused.value.status == 429, refused.value.body
    status = json.loads(str(refused.value.body))
    assert (status["reason"], status["message"]) == (
        "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget.")
    assert status["details"]["causes"][0]["message"].startswith("The disruption budget guard needs 1 healthy")
    assert running_and_ready(core.read_namespaced_pod("guarded-b", NS))

    def counted() -> Any:
        status = policy.read_namespaced_pod_disruption_budget("guard", NS).status
        return status if status and (status.current_healthy, status.expected_pods) == (1, 1) else None

    counts = box.wait_for("the budget counted again", counted)
    assert (counts.desired_healthy, counts.disruptions_allowed) == (1, 0)


# --- the CronJob, on a clock the test moves ----------------------------------------------------------


async def in_thread(call: Callable[[], T]) -> T:
    """The official client blocks: its calls run in a thread so the controllers' loop keeps going."""
    return await anyio.to_thread.run_sync(call)


@pytest.fixture
async def clocked(kube: KubeClient) -> AsyncIterator[Wall]:
    """The CronJob controller and a simulated kubelet on the test's API server, on a clock moved by hand."""
    wall = Wall()
    async with simulated_node(kube, NODE, lambda manager: WorkloadControllers(manager, wall=wall)):
        yield wall


@pytest.mark.anyio
async def test_a_cronjob_fires_on_the_test_clock_and_its_job_completes(apiserver: Any, clocked: Wall) -> None:
    api = official_client(apiserver.kubeconfig)
    batch: Any = kube_client.BatchV1Api(api)
    pod = template("nightly", {EXIT_AFTER: "100ms"}, restartPolicy="Never", nodeName=NODE)
    await in_thread(lambda: batch.create_namespaced_cron_job(NS, {
        "apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "nightly"},
        "spec": {"schedule": "*/5 * * * *", "jobTemplate": {"spec": {"template": pod}}}}))
    assert (await in_thread(lambda: batch.list_namespaced_job(NS))).items == []

    # five minutes on: exactly one scheduled slot lies between the CronJob's creation and now
    clocked.now = time.time() + 300
    slot = int(clocked.now // 300 * 300)
    await in_thread(lambda: batch.patch_namespaced_cron_job(
        "nightly", NS, {"metadata": {"annotations": {"test/tick": str(clocked.now)}}}))

    async def recorded() -> Any:
        cronjob = await in_thread(lambda: batch.read_namespaced_cron_job("nightly", NS))
        status = cronjob.status
        return cronjob if status and status.last_successful_time and not status.active else None

    cronjob = await eventually(recorded, 20, what="the CronJob's Job completed and recorded")
    assert int(cronjob.status.last_schedule_time.timestamp()) == slot
    [job] = (await in_thread(lambda: batch.list_namespaced_job(NS))).items
    assert job.metadata.name == f"nightly-{slot // 60}"
    assert (job.metadata.owner_references[0].kind, job.metadata.owner_references[0].name) == ("CronJob", "nightly")
    assert conditions(job).get("Complete") == "True" and job.status.succeeded == 1
