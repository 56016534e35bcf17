"""Hostile and generated input to the controller's HTTP API (issue 23): `POST /api/simulate-schedule`
with Pods of every wrong shape answers 400 naming the field, the value and what is allowed, never a
5xx; a Hypothesis test mutates valid Pods (GPU and native-GPU) at every field the scheduler reads;
schemathesis runs every check against the controller's OpenAPI document.

One stack serves the module: the embedded API server (HTTPS, its own thread) with a GPUPool marked
default, a ProviderConfig that makes `nvidia.com/gpu` a native GPU resource, two Ready nodes (node-b
tainted) with a TensorFusion GPU each, and a worker bound to node-b; then, in a second thread, a
leading controller in progressive-migration mode (no webhook) whose routes the tests call over
loopback HTTP. Both kinds of Pod therefore reach the deep paths: the GPU filters, scoring and
explanations, and the native path's node checks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import httpx
import hypothesis
import pytest
import yaml
from hypothesis import strategies as st

from tests.apiserver_fixture import ApiServerHandle, apply_crds_sync
from tests.helpers import no_error_logged_fixture, wait_until, with_field
from tests.helpers.controller import POOL, create_gpu, create_pool, kube_client, settings_for
from tests.helpers.progressive import NATIVE_GPUS, running_worker
from tests.helpers.refusals import assert_refused
from tests.helpers.scheduler import create_node
from tfusion.api import annotations as tfa
from tfusion.api import podindex
from tfusion.controller.role import ControllerRole, build_runtime, configure, serve_runtime
from tfusion.controller.scheduling.assignments import DEFAULT_SERVICE_ACCOUNT
from tfusion.kube import resources as r
from tfusion.settings import Settings

no_error_logged = no_error_logged_fixture(autouse=False)

SCHEDULER = "tensor-fusion-scheduler"
SIMULATE = "/api/simulate-schedule"
#: a generous bound per request: it detects a hang, it does not measure speed
HANG_S = 10.0
HOOKS = Path(__file__).with_name("schemathesis_contract_hooks.py")


# --- the stack -----------------------------------------------------------------------------------


async def _seed(apiserver: ApiServerHandle, operator_namespace: str) -> str:
    """The objects of the module docstring; returns a token of the controller's own ServiceAccount
    (what the index and host-port routes accept)."""
    async with kube_client(apiserver) as kube:
        await kube.create(r.NAMESPACES, {"metadata": {"name": operator_namespace}})
        await kube.create(r.SERVICEACCOUNTS, {"metadata": {"name": DEFAULT_SERVICE_ACCOUNT}},
                          namespace=operator_namespace)
        await create_pool(kube)
        await kube.patch(r.GPUPOOLS, POOL, {"metadata": {"annotations": {tfa.IS_DEFAULT_POOL: "true"}}})
        await kube.create(r.PROVIDERCONFIGS, {"metadata": {"name": "nvidia"}, "spec": {
            "vendor": "NVIDIA", "images": {"middleware": "mw:1"}, "inUseResourceNames": ["nvidia.com/gpu"]}})
        await create_node(kube, "node-a", allocatable=NATIVE_GPUS)
        await create_node(kube, "node-b", allocatable=NATIVE_GPUS,
                          taints=[{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}])
        await create_gpu(kube, "gpu-a1", "node-a")
        await create_gpu(kube, "gpu-b1", "node-b")
        await kube.create(r.PODS, running_worker("worker-b", "node-b"))
        return await kube.request_token(operator_namespace, DEFAULT_SERVICE_ACCOUNT)


async def _serve(settings: Settings, *, task_status: Any) -> None:
    runtime = await build_runtime(settings)
    configure(runtime)
    async with anyio.create_task_group() as tg:
        served: ControllerRole = await tg.start(serve_runtime, runtime)
        assert served.address is not None
        task_status.started(served.address[1])


def gpu_pod(**notes: str) -> dict[str, Any]:
    """A TensorFusion GPU pod (default pool) that uses every field the scheduler reads."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "probe", "namespace": "default", "uid": "u-1", "labels": {"app": "probe"},
                     "annotations": {tfa.TFLOPS_REQUEST: "10", tfa.VRAM_REQUEST: "4Gi", **notes}},
        "spec": {
            "schedulerName": SCHEDULER, "priority": 0,
            "containers": [{"name": "main", "image": "app", "resources": {
                "requests": {"cpu": "500m", "memory": 1073741824}, "limits": {"cpu": 1, "memory": "1Gi"}}}],
            "initContainers": [{"name": "init", "resources": {"requests": {"cpu": "100m"}}}],
            "overhead": {"cpu": "10m"},
            "nodeSelector": {"kubernetes.io/hostname": "node-a"},
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"},
                            {"operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-a"]}],
                 "matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["node-z"]}]}]}}},
        },
        "status": {"phase": "Pending"},
    }


def native_pod(gpus: str | int = "1") -> dict[str, Any]:
    """A pod asking for nvidia.com/gpu (progressive migration) and no TensorFusion GPU."""
    pod = gpu_pod()
    pod["metadata"]["annotations"] = {}
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = gpus
    return pod


@dataclass
class Controller:
    url: str
    token: str  # of the controller's own ServiceAccount
    apiserver: ApiServerHandle


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    """The controller, once its allocator holds both GPUs and its scheduler knows the native
    resource and the busy node."""
    root = tmp_path_factory.mktemp("fuzz")
    apiserver = ApiServerHandle(root / "state.db", root / "kubeconfig").start()
    try:
        apply_crds_sync(apiserver)
        settings = settings_for(apiserver, root, progressive_migration=True, enable_webhooks=False)
        with anyio.from_thread.start_blocking_portal() as portal:
            token = portal.call(_seed, apiserver, settings.operator_namespace)
            future, port = portal.start_task(_serve, settings)
            base = f"http://127.0.0.1:{port}"
            try:
                wait_until_ready(base)
                yield Controller(base, token, apiserver)
            finally:
                future.cancel()
    finally:
        apiserver.stop()


def wait_until_ready(base: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    last: Any = None
    with httpx.Client(base_url=base, timeout=HANG_S) as http:
        while time.monotonic() < deadline:
            gpu = http.post(SIMULATE, json=gpu_pod())
            native = http.post(SIMULATE, json=native_pod())
            last = (gpu.text[:300], native.text[:300])
            if gpu.status_code == native.status_code == 200 \
                    and gpu.json()["gpuSchedulerState"]["FinalGPUs"] == ["gpu-a1"] \
                    and native.json()["progressiveNodeNames"] == {"count": 1, "nodes": ["node-a"]}:
                return
            time.sleep(0.1)
    pytest.fail(f"the controller did not see the seeded objects: {last}")


@pytest.fixture
def http(stack: Controller) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.url, timeout=HANG_S) as client:
        yield client


# --- the probe's findings, each a regression test -------------------------------------------------

SPEC_PATH = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"


CONTAINER = ("spec", "containers", 0)
TERM = ("spec", "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms", 0)
QUANTITY = "a non-negative quantity"

#: (path, value, fragments the error must contain: the field, the value, what is allowed)
BAD_FIELDS: dict[str, tuple[tuple[Any, ...], Any, tuple[str, ...]]] = {
    "containers a quantity (the probe's AttributeError)": (
        ("spec", "containers"), "1.5Gi", ("spec.containers:", "'1.5Gi'", "expected a list")),
    "a container a string": (CONTAINER, "x", ("spec.containers[0]:", "'x'", "expected an object")),
    "a container null": (CONTAINER, None, ("spec.containers[0]:", "null", "expected an object")),
    "resources a string": ((*CONTAINER, "resources"), "lots", ("spec.containers[0].resources:", "'lots'")),
    "requests a list": ((*CONTAINER, "resources", "requests"), [1], ("spec.containers[0].resources.requests:",
                                                                     "[1]", "expected an object")),
    "cpu 1e999999": ((*CONTAINER, "resources", "requests", "cpu"), "1e999999",
                     ("spec.containers[0].resources.requests[cpu]:", "'1e999999'", QUANTITY)),
    "cpu negative": ((*CONTAINER, "resources", "requests", "cpu"), "-2", ("requests[cpu]:", "'-2'", QUANTITY)),
    "memory a negative number": ((*CONTAINER, "resources", "limits", "memory"), -1,
                                 ("limits[memory]:", "-1", QUANTITY)),
    "memory a boolean": ((*CONTAINER, "resources", "limits", "memory"), True, ("limits[memory]:", "True", QUANTITY)),
    "memory an object": ((*CONTAINER, "resources", "limits", "memory"), {"a": 1}, ("limits[memory]:", QUANTITY)),
    "memory 40 digits": ((*CONTAINER, "resources", "limits", "memory"), "9" * 40, ("limits[memory]:", QUANTITY)),
    "init containers a string": (("spec", "initContainers"), "x", ("spec.initContainers:", "expected a list")),
    "overhead a string": (("spec", "overhead"), "10m", ("spec.overhead:", "'10m'", "expected an object")),
    "overhead negative": (("spec", "overhead", "cpu"), "-10m", ("spec.overhead[cpu]:", "'-10m'", QUANTITY)),
    "tolerations an object": (("spec", "tolerations"), {"key": "a"}, ("spec.tolerations:", "expected a list")),
    "a toleration's key a number": (("spec", "tolerations", 0, "key"), 7, ("spec.tolerations[0].key:", "7",
                                                                             "a string")),
    "a toleration's operator": (("spec", "tolerations", 0, "operator"), "Like",
                                ("spec.tolerations[0].operator:", "'Like'", "'Equal', 'Exists'")),
    "a toleration's effect": (("spec", "tolerations", 1, "effect"), "NoWay",
                              ("spec.tolerations[1].effect:", "'NoWay'", "'NoSchedule'")),
    "nodeSelector a list": (("spec", "nodeSelector"), ["a"], ("spec.nodeSelector:", "expected an object")),
    "nodeSelector value a number": (("spec", "nodeSelector", "zone"), 3, ("spec.nodeSelector[zone]:", "3",
                                                                           "a string")),
    "affinity a string": (("spec", "affinity"), "near", ("spec.affinity:", "'near'", "expected an object")),
    "nodeAffinity a number": (("spec", "affinity", "nodeAffinity"), 3, ("spec.affinity.nodeAffinity:", "3")),
    "terms a string": (TERM[:-1], "x", (f"{SPEC_PATH}:", "'x'", "expected a list")),
    "a term null": (TERM, None, (f"{SPEC_PATH}[0]:", "null", "expected an object")),
    "matchExpressions items strings": ((*TERM, "matchExpressions"), ["x"],
                                       (f"{SPEC_PATH}[0].matchExpressions[0]:", "'x'")),
    "a requirement's values a string": ((*TERM, "matchExpressions", 0, "values"), "node-a",
                                        (f"{SPEC_PATH}[0].matchExpressions[0].values:", "'node-a'", "a list")),
    "a requirement's operator": ((*TERM, "matchFields", 0, "operator"), "Near",
                                 (f"{SPEC_PATH}[0].matchFields[0].operator:", "'Near'", "'In', 'NotIn'")),
    "priority beyond int32": (("spec", "priority"), 2**40, ("spec.priority:", str(2**40), "integer")),
    "priority a string": (("spec", "priority"), "high", ("spec.priority:", "'high'", "an integer")),
    "schedulerName a number": (("spec", "schedulerName"), 5, ("spec.schedulerName:", "5", "a string")),
    "metadata a list": (("metadata",), [], ("metadata:", "[]", "expected an object")),
    "namespace a list (the probe's unhashable list)": (("metadata", "namespace"), ["a"],
                                                       ("metadata.namespace:", "['a']", "a string")),
    "name a number": (("metadata", "name"), 5, ("metadata.name:", "5", "a string")),
    "uid an object": (("metadata", "uid"), {}, ("metadata.uid:", "{}", "a string")),
    "an annotation a number": (("metadata", "annotations", tfa.TFLOPS_REQUEST), 10,
                               (f"metadata.annotations[{tfa.TFLOPS_REQUEST}]:", "10", "a string")),
    "an annotation null": (("metadata", "annotations", tfa.VRAM_REQUEST), None,
                           (f"metadata.annotations[{tfa.VRAM_REQUEST}]:", "null", "a string")),
    "a label a boolean": (("metadata", "labels", "app"), False, ("metadata.labels[app]:", "False", "a string")),
    "status a string": (("status",), "Running", ("status:", "'Running'", "expected an object")),
    "kind Deployment": (("kind",), "Deployment", ("kind:", "'Deployment'", "kind: Pod")),
    "TFLOPS beyond 64 bits": (("metadata", "annotations", tfa.TFLOPS_REQUEST), "1e16",
                              (tfa.TFLOPS_REQUEST, '"1e16"', "at most 9223372036854775807 milli-TFLOPS")),
    "VRAM 1e999999": (("metadata", "annotations", tfa.VRAM_REQUEST), "1e999999", (tfa.VRAM_REQUEST, '"1e999999"')),
    "VRAM negative": (("metadata", "annotations", tfa.VRAM_REQUEST), "-4Gi", (tfa.VRAM_REQUEST, '"-4Gi"',
                                                                                "negative")),
    "gpu-count beyond 64 bits": (("metadata", "annotations", tfa.GPU_COUNT), "9" * 30,
                                 (tfa.GPU_COUNT, "9" * 30, "1 to 128")),
}


@pytest.mark.parametrize("case", BAD_FIELDS, ids=list(BAD_FIELDS))
@pytest.mark.usefixtures("no_error_logged")
def test_a_bad_field_is_a_400_naming_it(http: httpx.Client, case: str) -> None:
    path, value, fragments = BAD_FIELDS[case]
    for base in (gpu_pod(), native_pod()):  # a GPU annotation makes the native pod a GPU pod
        assert_refused(http.post(SIMULATE, content=json.dumps(with_field(base, path, value))), 400, *fragments)


@pytest.mark.parametrize("body", [
    b'{"spec": {"schedulerName": "tensor-fusion-scheduler", "priority": 1e999999}}',
    b'{"spec": {"schedulerName": "tensor-fusion-scheduler", "priority": 99999999999999999999999}}',
    b"spec:\n  schedulerName: tensor-fusion-scheduler\n  overhead:\n    cpu: 1e999999\n",
    b"spec:\n  schedulerName: tensor-fusion-scheduler\n  nodeSelector:\n    1: 2\n",
], ids=["JSON float overflow", "JSON integer beyond 64 bits", "YAML float overflow", "YAML integer key and value"])
@pytest.mark.usefixtures("no_error_logged")
def test_numbers_no_reader_can_hold_are_refused(http: httpx.Client, body: bytes) -> None:
    answer = http.post(SIMULATE, content=body)
    assert answer.status_code == 400, answer.text
    assert isinstance(answer.json()["error"], str)


@pytest.mark.usefixtures("no_error_logged")
def test_a_foreign_scheduler_is_refused_with_400(http: httpx.Client) -> None:
    """The original answers 500 here; a caller's mistake gets a 4xx naming the field, the value and
    the one accepted name."""
    for name, shown in (("default-scheduler", "'default-scheduler'"), ("", "''"), (None, "null")):
        answer = http.post(SIMULATE, json=with_field(gpu_pod(), ("spec", "schedulerName"), name))
        assert_refused(answer, 400, f"spec.schedulerName: {shown} is not allowed", "'tensor-fusion-scheduler'")
        assert answer.json()["field"] == "spec.schedulerName", answer.text


@pytest.mark.usefixtures("no_error_logged")
def test_every_field_the_scheduler_reads_still_works(http: httpx.Client) -> None:
    """The check refuses nothing kube accepts: numbers and strings as quantities, tolerations,
    affinity, init containers, overhead, nulls (left unset), in JSON and YAML."""
    for body in (json.dumps(gpu_pod()), yaml.safe_dump(gpu_pod())):
        answer = http.post(SIMULATE, content=body)
        assert answer.status_code == 200, answer.text
        assert answer.json()["scheduleResult"]["SuggestedHost"] == "node-a"
    nulls = gpu_pod()
    for field in ("initContainers", "overhead", "nodeSelector", "tolerations", "affinity", "priority"):
        nulls["spec"][field] = None
    nulls["metadata"]["labels"] = None
    assert http.post(SIMULATE, json=nulls).json()["gpuSchedulerState"]["FinalGPUs"] == ["gpu-a1"]
    # the native path runs the node checks: a selector no node matches
    elsewhere = with_field(native_pod(), ("spec", "nodeSelector", "kubernetes.io/hostname"), "node-z")
    error = http.post(SIMULATE, json=elsewhere).json()["error"]
    assert "node(s) didn't match Pod's node affinity/selector" in error["message"], error
    native = http.post(SIMULATE, json=native_pod(3)).json()  # more than node-a's 2
    assert "Insufficient nvidia.com/gpu" in native["error"]["message"], native["error"]


# --- a Pod the API server stores but the scheduler cannot read ----------------------------------


def scheduled_condition(apiserver: ApiServerHandle, name: str) -> dict[str, Any] | None:
    with apiserver.sync_http() as api:
        pod = api.get(f"/api/v1/namespaces/default/pods/{name}").json()
    if (pod.get("spec") or {}).get("nodeName"):
        return {"bound": pod["spec"]["nodeName"]}
    found = [c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") == "PodScheduled"]
    return found[0] if found else None


def test_a_stored_pod_the_scheduler_cannot_read_is_unschedulable(stack: Controller) -> None:
    """The embedded API server checks the JSON types kube's decoding would, not every value (a
    toleration operator of Sometimes passes it); the built-in scheduler reads such a Pod through the same check as
    simulate-schedule and marks it unschedulable with the field, instead of failing its loop:
    the next Pod is still bound."""
    spec = {"schedulerName": SCHEDULER, "containers": [{"name": "c", "image": "app"}]}
    with stack.apiserver.sync_http() as api:
        unreadable = {**spec, "tolerations": [{"key": "k", "operator": "Sometimes"}]}
        created = api.post("/api/v1/namespaces/default/pods",
                           json={"metadata": {"name": "unreadable"}, "spec": unreadable})
        assert created.status_code == 201, created.text
        condition = wait_until(lambda: scheduled_condition(stack.apiserver, "unreadable"), 30,
                               what="a PodScheduled condition on the unreadable pod")
        assert condition.get("reason") == "Unschedulable", condition
        assert "spec.tolerations[0].operator: 'Sometimes' is not allowed" in condition["message"], condition
        created = api.post("/api/v1/namespaces/default/pods", json={"metadata": {"name": "plain"}, "spec": spec})
        assert created.status_code == 201, created.text
        bound = wait_until(lambda: scheduled_condition(stack.apiserver, "plain"), 30, what="the plain pod bound")
        assert bound == {"bound": "node-a"}, bound  # node-b's taint is not tolerated


@pytest.mark.usefixtures("no_error_logged")
def test_a_bound_pod_with_an_unreadable_overhead_counts_as_nothing_more(stack: Controller) -> None:
    """A bound pod with `spec.overhead: "x"`: the API server refuses that now (400), so it is
    written straight into its store, as one stored before that check was; the scheduler's per-node
    totals skip what they cannot read instead of failing on it (that failure, at the start of a
    leadership term, stopped the built-in scheduler)."""
    spec = {"schedulerName": SCHEDULER, "containers": [{"name": "c", "image": "app"}]}
    with stack.apiserver.sync_http() as api:
        created = api.post("/api/v1/namespaces/default/pods", json={"metadata": {"name": "odd-overhead"}, "spec": {
            **spec, "nodeName": "node-a", "initContainers": [{"name": "i", "image": "app",
                                                              "resources": {"requests": None}}]}})
        assert created.status_code == 201, created.text

        def unreadable_overhead() -> None:
            store = stack.apiserver.server.store
            assert store is not None
            entry = store.get("/pods", "default", "odd-overhead")
            assert entry is not None
            pod = entry.copy()
            pod["spec"]["overhead"] = "x"
            store.put("/pods", pod, entry)

        stack.apiserver.call(unreadable_overhead)
        stored = api.get("/api/v1/namespaces/default/pods/odd-overhead").json()
        assert stored["spec"]["overhead"] == "x", stored
        created = api.post("/api/v1/namespaces/default/pods", json={"metadata": {"name": "after-odd"}, "spec": spec})
        assert created.status_code == 201, created.text
    bound = wait_until(lambda: scheduled_condition(stack.apiserver, "after-odd"), 30, what="the next pod bound")
    assert bound == {"bound": "node-a"}, bound


# --- generated Pods --------------------------------------------------------------------------------

#: every field the scheduler reads, as a path into gpu_pod() / native_pod()
FIELDS: list[tuple[Any, ...]] = [
    ("kind",), ("apiVersion",), ("metadata",), ("metadata", "name"), ("metadata", "namespace"),
    ("metadata", "uid"), ("metadata", "labels"), ("metadata", "labels", "app"),
    ("metadata", "labels", tfa.WORKLOAD), ("metadata", "labels", tfa.COMPONENT), ("metadata", "annotations"),
    *(("metadata", "annotations", key) for key in (
        tfa.TFLOPS_REQUEST, tfa.TFLOPS_LIMIT, tfa.VRAM_REQUEST, tfa.VRAM_LIMIT, tfa.COMPUTE_PERCENT_REQUEST,
        tfa.COMPUTE_PERCENT_LIMIT, tfa.GPU_COUNT, tfa.GPU_INDICES, tfa.GPU_POOL, tfa.GPU_MODEL, tfa.QOS,
        tfa.ISOLATION, tfa.GPU_IDS, tfa.VENDOR)),
    ("spec",), ("spec", "priority"), ("spec", "nodeName"), ("spec", "containers"), CONTAINER,
    (*CONTAINER, "resources"), (*CONTAINER, "resources", "requests"), (*CONTAINER, "resources", "requests", "cpu"),
    (*CONTAINER, "resources", "limits", "memory"), (*CONTAINER, "resources", "limits", "nvidia.com/gpu"),
    (*CONTAINER, "resources", "limits", podindex.index_resource(1)), ("spec", "initContainers"),
    ("spec", "initContainers", 0, "resources", "requests", "cpu"), ("spec", "overhead"), ("spec", "overhead", "cpu"),
    ("spec", "nodeSelector"), ("spec", "nodeSelector", "kubernetes.io/hostname"), ("spec", "tolerations"),
    ("spec", "tolerations", 0), ("spec", "tolerations", 0, "operator"), ("spec", "tolerations", 1, "key"),
    ("spec", "affinity"), ("spec", "affinity", "nodeAffinity"), TERM[:-1], TERM, (*TERM, "matchExpressions"),
    (*TERM, "matchExpressions", 0), (*TERM, "matchExpressions", 0, "operator"),
    (*TERM, "matchExpressions", 0, "values"),
    (*TERM, "matchFields", 0, "key"), ("status",), ("status", "phase"),
]
TRICKY = ["1.5Gi", "1e999999", "-1", "-0", "0", "1e18", "9" * 30, "99999999999999999999Ei", "+.5", "1e-99",
          "0.000000001m", "NaN", "", " ", "In", "Exists", "NoSchedule", "worker", "1,2,3", "gpu-a1", "128", "129",
          "high", "soft", "hard", "default-pool", "pool-a", 2**63, -(2**63), 1e308, -1.5, 0.5]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12) | st.sampled_from(TRICKY),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=12)
pods = st.tuples(st.sampled_from(["gpu", "native"]), st.lists(st.tuples(st.sampled_from(FIELDS), json_values),
                                                             min_size=1, max_size=4))


def mutated(kind: str, changes: list[tuple[tuple[Any, ...], Any]]) -> dict[str, Any]:
    """The base pod with each change applied where its path still leads (an earlier change may have
    replaced a parent with a scalar)."""
    pod = gpu_pod() if kind == "gpu" else native_pod()
    for path, value in changes:
        target: Any = pod
        for depth, step in enumerate(path, start=1):
            last = depth == len(path)
            if not _holds(target, step, new_key=last):
                break
            if last:
                target[step] = value
            else:
                target = target[step]
    return pod


def _holds(container: Any, step: Any, *, new_key: bool) -> bool:
    if isinstance(container, dict):
        return new_key or step in container
    return isinstance(container, list) and isinstance(step, int) and step < len(container)


def assert_no_server_error(answer: httpx.Response, what: str) -> None:
    assert answer.status_code in (200, 400), (what, answer.status_code, answer.text[:500])
    if answer.status_code == 400:
        assert isinstance(answer.json().get("error"), str), answer.text


@pytest.mark.usefixtures("no_error_logged")
def test_generated_pods_never_get_a_5xx(http: httpx.Client) -> None:
    answers: dict[int, int] = {}

    @hypothesis.settings(max_examples=300, derandomize=True, deadline=None, database=None,
                         suppress_health_check=list(hypothesis.HealthCheck))
    @hypothesis.given(pod=pods, as_yaml=st.booleans())
    def simulate(pod: tuple[str, list[tuple[tuple[Any, ...], Any]]], as_yaml: bool) -> None:
        manifest = mutated(*pod)
        body = yaml.safe_dump(manifest) if as_yaml else json.dumps(manifest)
        answer = http.post(SIMULATE, content=body)
        answers[answer.status_code] = answers.get(answer.status_code, 0) + 1
        assert_no_server_error(answer, body[:300])

    simulate()
    # the generation reached both sides: Pods the scheduler judged and Pods it refused
    assert answers.get(200, 0) >= 10 and answers.get(400, 0) >= 50, answers


# --- schemathesis against the controller's OpenAPI document ---------------------------------------


@pytest.mark.timeout(300)  # a schemathesis process with three phases; its own bound is 300 s too
def test_schemathesis_runs_every_check_clean(stack: Controller, tmp_path: Path) -> None:
    """`schemathesis run --checks all` (examples, coverage and fuzzing phases, positive and negative
    data), with `not_a_server_error` replaced by the stricter hook of schemathesis_contract_hooks.py
    that fails on every 5xx and says which operation answered it. Deterministic (a fixed
    seed) and bounded (--max-examples). Every request carries the controller's ServiceAccount
    token, so the index and host-port routes answer past their token check; /api/connection,
    which wants a token bound to a client pod, answers 401."""
    config = tmp_path / "schemathesis.toml"
    # a schema-valid Pod the pod webhook would refuse (it asks for no GPU resources, names a pool or
    # WorkloadProfile that does not exist) is a documented 400: the webhook's rule wins, and it reads
    # cluster objects no schema can describe
    config.write_text(f"hooks = {json.dumps(str(HOOKS))}\n"
                      '[[operations]]\ninclude-path = "/api/simulate-schedule"\n'
                      '[operations.checks.positive_data_acceptance]\n'
                      'expected-statuses = ["2xx", "3xx", "400", "401", "403", "404", "409", "429", "5xx"]\n')
    command = [
        str(Path(sys.executable).with_name("schemathesis")), "--config-file", str(config), "--no-color", "run",
        f"{stack.url}/schema/openapi.json", "-H", f"Authorization: Bearer {stack.token}",
        "--checks", "all", "--exclude-checks", "not_a_server_error",
        "--max-examples", "40", "--seed", "23", "--workers", "1", "--continue-on-failure",
        "--generation-database", "none", "--request-timeout", str(HANG_S), "--max-response-time", str(HANG_S),
    ]
    run = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "NO_COLOR": "1"})
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-12000:]
    assert "no_server_error" in output or " passed" in output, output[-3000:]
