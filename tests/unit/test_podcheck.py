"""podcheck: the check of the Pod fields the scheduler reads, and the schema the controller documents
for simulate-schedule's body, agree with each other and with kube's quantity grammar; a manifest as
`kubectl get pod -o yaml` prints it passes."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import hypothesis
import jsonschema
from hypothesis import strategies as st

from tfusion.api.quantity import Quantity
from tfusion.controller.scheduling.podcheck import QUANTITY_PATTERN, manifest_schema, pod_problem

SCHEDULER = "tensor-fusion-scheduler"
SCHEMA = manifest_schema(SCHEDULER)
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)

KUBECTL_POD: dict[str, Any] = {
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": "trainer-0", "namespace": "ml", "uid": "0b6f...", "resourceVersion": "812",
                 "creationTimestamp": "2026-01-01T00:00:00Z", "generateName": "trainer-",
                 "labels": {"app": "trainer"}, "annotations": {"tensor-fusion.ai/tflops-request": "20"},
                 "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "t", "uid": "1"}]},
    "spec": {"schedulerName": SCHEDULER, "priority": 0, "priorityClassName": "tensor-fusion-high",
             "restartPolicy": "Always", "dnsPolicy": "ClusterFirst", "enableServiceLinks": True,
             "containers": [{"name": "main", "image": "pytorch", "imagePullPolicy": "IfNotPresent",
                             "env": [{"name": "A", "value": "1"}], "ports": [{"containerPort": 80}],
                             "resources": {"requests": {"cpu": "500m", "memory": 1073741824,
                                                        "ephemeral-storage": "1Gi"},
                                           "limits": {"cpu": 2, "memory": "2Gi", "nvidia.com/gpu": "1"}},
                             "volumeMounts": [{"name": "v", "mountPath": "/v"}]}],
             "volumes": [{"name": "v", "emptyDir": {}}],
             "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                              "tolerationSeconds": 300}],
             "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                 {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}]},
                 "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {}}]},
                 "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": []}},
             "overhead": {"cpu": "250m", "memory": "120Mi"}, "nodeSelector": {"pool": "a"}},
    "status": {"phase": "Pending", "qosClass": "Burstable",
               "conditions": [{"type": "PodScheduled", "status": "False"}]},
}


def test_a_manifest_kubectl_prints_passes_both() -> None:
    assert pod_problem(KUBECTL_POD) == ""
    assert VALIDATOR.is_valid(KUBECTL_POD)


def test_the_schema_is_inlined_and_asks_for_the_tfusion_scheduler() -> None:
    assert "$ref" not in json.dumps(SCHEMA)
    properties: Any = SCHEMA["properties"]  # JSON dug into below
    spec = properties["spec"]
    assert spec["required"] == ["schedulerName"] and spec["properties"]["schedulerName"]["enum"] == [SCHEDULER]
    assert SCHEMA["required"] == ["spec"]


def test_the_message_names_the_field_the_value_and_what_is_allowed() -> None:
    pod = copy.deepcopy(KUBECTL_POD)
    pod["spec"]["containers"][0]["resources"]["limits"]["memory"] = "-2Gi"
    problem = pod_problem(pod)
    assert problem.startswith("spec.containers[0].resources.limits[memory]: '-2Gi' is not allowed; expected "
                              "a non-negative quantity"), problem
    pod = copy.deepcopy(KUBECTL_POD)
    pod["spec"]["tolerations"][0]["effect"] = "Sometimes"
    assert pod_problem(pod) == ("spec.tolerations[0].effect: 'Sometimes' is not allowed; expected one of "
                                "'NoSchedule', 'PreferNoSchedule', 'NoExecute', ''")


quantity_texts = st.from_regex(r"[+-]?[0-9]{0,33}(\.[0-9]{0,33})?([KMGTPE]i?|[numk]|[eE][+-]?[0-9]{1,4})?",
                               fullmatch=True) | st.text(max_size=8)


@hypothesis.settings(max_examples=400, derandomize=True, database=None, deadline=None)
@hypothesis.given(text=quantity_texts)
def test_every_quantity_the_pattern_admits_is_one_kube_reads_and_not_negative(text: str) -> None:
    pod = copy.deepcopy(KUBECTL_POD)
    pod["spec"]["overhead"]["cpu"] = text
    accepted = pod_problem(pod) == ""
    assert accepted == VALIDATOR.is_valid(pod), text  # the document and the check agree
    if accepted:
        assert Quantity.parse(text) >= 0, text
    assert accepted == bool(re.search(QUANTITY_PATTERN, text)), text  # as msgspec and jsonschema match it


#: floats with a fraction only: JSON Schema counts 2.0 as an integer, kube's decoding (and the check)
#: does not, the one place where the two may differ
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: not f.is_integer())
    | st.text(max_size=6) | st.sampled_from(["In", "Exists", "NoSchedule", "1Gi", "-1", "1e3"]),
    lambda children: st.lists(children, max_size=2) | st.dictionaries(st.text(max_size=5), children, max_size=2),
    max_leaves=6)
FIELDS: list[tuple[Any, ...]] = [
    ("metadata",), ("metadata", "name"), ("metadata", "labels"), ("metadata", "annotations", "x"),
    ("spec", "priority"), ("spec", "containers"), ("spec", "containers", 0), ("spec", "containers", 0, "resources"),
    ("spec", "containers", 0, "resources", "limits"), ("spec", "containers", 0, "resources", "limits", "cpu"),
    ("spec", "tolerations", 0), ("spec", "tolerations", 0, "operator"), ("spec", "affinity"),
    ("spec", "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution"),
    ("spec", "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms", 0,
     "matchExpressions", 0, "operator"),
    ("spec", "overhead"), ("spec", "nodeSelector", "pool"), ("status",), ("status", "phase"), ("kind",),
]


@hypothesis.settings(max_examples=400, derandomize=True, database=None, deadline=None)
@hypothesis.given(field=st.sampled_from(FIELDS), value=json_values)
def test_the_check_and_the_document_agree_on_any_value_anywhere(field: tuple[Any, ...], value: Any) -> None:
    pod = copy.deepcopy(KUBECTL_POD)
    target: Any = pod
    for step in field[:-1]:
        target = target[step]
    target[field[-1]] = value
    problem = pod_problem(pod)
    assert (problem == "") == VALIDATOR.is_valid(pod), (field, value, problem)
    if problem:
        assert problem.split(":", 1)[0].startswith(".".join(str(s) for s in field[:1])), problem
