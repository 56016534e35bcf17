"""Indexed Jobs (`completionMode: Indexed`): each pod gets one completion index, 0..completions-1.

Why it exists: distributed training launchers hand each worker its rank through the Job's
completion index. A pod of an Indexed Job carries the index as the
`batch.kubernetes.io/job-completion-index` annotation and label, its hostname is `<job>-<index>`
and its containers see it as JOB_COMPLETION_INDEX. The Job is done when every index has had a
pod succeed; the succeeded indexes are kept in status.completedIndexes as kube writes them, an
interval list such as "0-2,5".

With spec.backoffLimitPerIndex each index has its own failure budget: a failed pod is replaced
(the new pod's `batch.kubernetes.io/job-index-failure-count` says how often its index failed)
until its index failed more often than the limit; then the index is in status.failedIndexes and
gets no more pods. The Job fails once more indexes failed than spec.maxFailedIndexes allows
(MaxFailedIndexesExceeded), or when every index has finished and some failed (FailedIndexes).
spec.successPolicy ends the Job early, as a success, once one of its rules holds (reason
SuccessPolicy): a rule names indexes that must all have succeeded (succeededIndexes), a number
of indexes that must have succeeded (succeededCount), or both (that many among those indexes).
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
FAILURE_COUNT = "batch.kubernetes.io/job-index-failure-count"


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


def index_failures(pods: list[Pod]) -> dict[int, int]:
    """How often each index failed: a pod carries its index's earlier failures, plus its own (the
    failed pods still there are counted too, for pods made without the annotation)."""
    carried: dict[int, int] = {}
    failed_pods: dict[int, int] = {}
    for pod in pods:
        index = pod_index(pod)
        if index is None:
            continue
        earlier = pod.meta.annotations.get(FAILURE_COUNT) or "0"
        failed = pod.phase == "Failed"
        carried[index] = max(carried.get(index, 0), (int(earlier) if earlier.isdigit() else 0) + failed)
        failed_pods[index] = failed_pods.get(index, 0) + failed
    return {index: max(count, failed_pods[index]) for index, count in carried.items()}


def failed_indexes(job: Body, pods: list[Pod], completed: set[int]) -> set[int]:
    """Indexes out of retries under backoffLimitPerIndex (none without it), those recorded included."""
    limit = job.spec.get("backoffLimitPerIndex")
    if limit is None:
        return set()
    completions = int(job.spec.get("completions") or 0)
    failed = parse_indexes(job.status.get("failedIndexes"))
    failed.update(i for i, count in index_failures(pods).items() if count > int(limit))
    return {i for i in failed if i < completions and i not in completed}


def missing_indexes(job: Body, completed: set[int], active: list[Pod], failed: set[int] | None = None) -> list[int]:
    """Indexes with neither a success, a running pod nor retries used up, lowest first."""
    running = {pod_index(p) for p in active}
    return [i for i in range(int(job.spec.get("completions") or 0))
            if i not in completed and i not in running and i not in (failed or set())]


def matched_success_rule(job: Body, completed: set[int]) -> int | None:
    """The position of the first successPolicy rule the succeeded indexes satisfy, None if none."""
    rules = sequence_of_maps(section(job.spec, "successPolicy").get("rules"))
    for position, rule in enumerate(rules):
        named, count = rule.get("succeededIndexes"), rule.get("succeededCount")
        among = completed if named is None else completed & parse_indexes(named)
        if named is not None and count is None and among != parse_indexes(named):
            continue
        if isinstance(count, int) and len(among) < count:
            continue
        if named is not None or count is not None:
            return position
    return None


def indexed_verdict(job: Body, completed: set[int], failed: set[int]) -> tuple[str, str, str] | None:
    """(Complete or Failed, reason, message) once the indexes decide the Job's end, else None."""
    completions = int(job.spec.get("completions") or 0)
    most = job.spec.get("maxFailedIndexes")
    if most is not None and len(failed) > int(most):
        return "Failed", "MaxFailedIndexesExceeded", "Job has exceeded the specified maximal number of failed indexes"
    rule = matched_success_rule(job, completed)
    if rule is not None:
        return "Complete", "SuccessPolicy", f"Matched rules at index {rule}"
    if failed and len(completed | failed) >= completions:
        return "Failed", "FailedIndexes", "Job has failed indexes"
    return None


def indexed_pod(job: Body, index: int, failures: int = 0) -> JsonObject:
    """The pod of `index`, from the Job's template (`failures`: how often the index failed so far)."""
    pod = pod_from_template(job, r.JOBS)
    meta = json_object(section(pod, "metadata"))
    meta["generateName"] = f"{job.name}-{index}-"
    meta["labels"] = {**json_object(section(meta, "labels")), COMPLETION_INDEX: str(index)}
    meta["annotations"] = {**json_object(section(meta, "annotations")), COMPLETION_INDEX: str(index)}
    if job.spec.get("backoffLimitPerIndex") is not None:
        meta["annotations"] = {**json_object(section(meta, "annotations")), FAILURE_COUNT: str(failures)}
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


async def create_indexed_pods(bench: Workbench, job: Body, indexes: list[int],
                              failures: dict[int, int] | None = None) -> str | None:
    """Create one pod per index; the error of the first failed create (then it stops)."""
    created: list[str] = []
    failure = None
    for index in indexes:
        body = indexed_pod(job, index, (failures or {}).get(index, 0))
        try:
            pod = Body(await bench.client.create(r.PODS, body, namespace=job.namespace or None))
        except KubeError as exc:
            failure = f"Error creating: {exc}"
            bench.event(job, "FailedCreate", failure, warning=True)
            break
        created.append(pod.name)
        bench.event(job, "SuccessfulCreate", f"Created pod: {pod.name}")
    bench.expectations.expect(expectation_key(r.JOBS, job), created=created)
    return failure
