"""Indexed Jobs (`completionMode: Indexed`): each pod gets one completion index, 0..completions-1.

Why it exists: distributed training launchers hand each worker its rank through the Job's
completion index. A pod of an Indexed Job carries the index as the
`batch.kubernetes.io/job-completion-index` annotation and label, its hostname is `<job>-<index>`
and its containers see it as JOB_COMPLETION_INDEX. The Job is done when every index has had a
pod succeed; the succeeded indexes are kept in status.completedIndexes as kube writes them, an
interval list such as "0-2,5".
"""

from __future__ import annotations

from collections.abc import Iterable

from tfusion.api.accessors import Body, Pod, section, sequence_of_maps
from tfusion.api.jsontypes import JsonMapping, JsonObject, json_object
from tfusion.embedded.workloads.common import Workbench, expectation_key, pod_from_template
from tfusion.kube import resources as r
from tfusion.kube.client import KubeError

COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
INDEX_ENV = "JOB_COMPLETION_INDEX"


def is_indexed(job: Body) -> bool:
    return job.spec.get("completionMode") == "Indexed"


def parse_indexes(value: object) -> set[int]:
    """The indexes an interval list names ("0-2,5" -> {0, 1, 2, 5}); malformed parts are skipped."""
    found: set[int] = set()
    for part in str(value or "").split(","):
        low, _, high = part.strip().partition("-")
        if low.isdigit() and (not high or high.isdigit()):
            found.update(range(int(low), int(high or low) + 1))
    return found


def format_indexes(indexes: Iterable[int]) -> str:
    """The interval list of a set of indexes ({0, 1, 2, 5} -> "0-2,5")."""
    runs: list[list[int]] = []
    for index in sorted(set(indexes)):
        if runs and runs[-1][1] == index - 1:
            runs[-1][1] = index
        else:
            runs.append([index, index])
    return ",".join(str(low) if low == high else f"{low}-{high}" for low, high in runs)


def pod_index(pod: Pod) -> int | None:
    value = pod.meta.annotations.get(COMPLETION_INDEX) or pod.meta.labels.get(COMPLETION_INDEX)
    return int(value) if value is not None and value.isdigit() else None


def completed_indexes(job: Body, pods: list[Pod]) -> set[int]:
    """Indexes done so far: those recorded in the status and those of succeeded pods (within range)."""
    completions = int(job.spec.get("completions") or 0)
    done = parse_indexes(job.status.get("completedIndexes"))
    done.update(i for i in map(pod_index, (p for p in pods if p.phase == "Succeeded")) if i is not None)
    return {i for i in done if i < completions}


def missing_indexes(job: Body, completed: set[int], active: list[Pod]) -> list[int]:
    """Indexes with neither a success nor a running pod, lowest first."""
    running = {pod_index(p) for p in active}
    return [i for i in range(int(job.spec.get("completions") or 0)) if i not in completed and i not in running]


def indexed_pod(job: Body, index: int) -> JsonObject:
    """The pod of `index`, from the Job's template."""
    pod = pod_from_template(job, r.JOBS)
    meta = json_object(section(pod, "metadata"))
    meta["generateName"] = f"{job.name}-{index}-"
    meta["labels"] = {**json_object(section(meta, "labels")), COMPLETION_INDEX: str(index)}
    meta["annotations"] = {**json_object(section(meta, "annotations")), COMPLETION_INDEX: str(index)}
    spec = json_object(section(pod, "spec"))
    spec.setdefault("hostname", f"{job.name}-{index}")
    spec["containers"] = [_with_index(container, index) for container in sequence_of_maps(spec.get("containers"))]
    pod.update(metadata=meta, spec=spec)
    return pod


def _with_index(container: JsonMapping, index: int) -> JsonObject:
    body = json_object(container)
    env = [json_object(e) for e in sequence_of_maps(body.get("env")) if e.get("name") != INDEX_ENV]
    body["env"] = [*env, {"name": INDEX_ENV, "value": str(index)}]
    return body


async def create_indexed_pods(bench: Workbench, job: Body, indexes: list[int]) -> str | None:
    """Create one pod per index; the error of the first failed create (then it stops)."""
    created: list[str] = []
    failure = None
    for index in indexes:
        try:
            pod = Body(await bench.client.create(r.PODS, indexed_pod(job, index), namespace=job.namespace or None))
        except KubeError as exc:
            failure = f"Error creating: {exc}"
            bench.event(job, "FailedCreate", failure, warning=True)
            break
        created.append(pod.name)
        bench.event(job, "SuccessfulCreate", f"Created pod: {pod.name}")
    bench.expectations.expect(expectation_key(r.JOBS, job), created=created)
    return failure
