"""Pods whose scheduling fields have the wrong shape are refused by the embedded API server, as
kube-apiserver refuses them (issue 23), instead of being stored for the schedulers to trip on.

A wrong JSON type in tolerations, affinity, overhead or a resource map is a 400 BadRequest naming
the field and the value (kube's typed decoding fails there); a resource value of the right type
that is not a non-negative quantity is a 422 Invalid whose cause names the field (kube's
validation). Each refused write leaves nothing stored; the same fields written well are accepted
as they are, numbers as quantities included, by create and by patch.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.apiserver_fixture import ApiServerHandle
from tests.helpers import no_error_logged_fixture, with_field

no_error_logged = no_error_logged_fixture(autouse=True)

PODS = "/api/v1/namespaces/default/pods"
DEPLOYMENTS = "/apis/apps/v1/namespaces/default/deployments"
NODE_TERMS = ("affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms")
ANTI_TERMS = ("affinity", "podAntiAffinity", "requiredDuringSchedulingIgnoredDuringExecution")


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    root: Path = tmp_path_factory.mktemp("pod-shapes")
    apiserver = ApiServerHandle(root / "state.db", root / "kubeconfig").start()
    try:
        with apiserver.sync_http(timeout=60) as http:
            yield http
    finally:
        apiserver.stop()


def good_spec() -> dict[str, Any]:
    """Every field the table checks, well formed (numbers as quantities included); no part is shared,
    so a case changes one field only."""
    requirement = {"key": "zone", "operator": "In", "values": ["a", "b"]}
    term = {"labelSelector": {"matchLabels": {"app": "x"}, "matchExpressions": [requirement]},
            "namespaceSelector": {}, "namespaces": ["default"], "topologyKey": "kubernetes.io/hostname"}
    spec = {
        "containers": [{"name": "c", "image": "busybox:1",
                        "resources": {"requests": {"cpu": "500m", "memory": 1048576},
                                      "limits": {"cpu": 1.5, "memory": "1Gi"}}}],
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoExecute",
                         "tolerationSeconds": 60}, {"operator": "Exists"}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [requirement],
                     "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]},
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 10, "preference": {"matchExpressions": [requirement]}}]},
            "podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 5, "podAffinityTerm": term}]},
            "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]},
        },
        "overhead": {"cpu": "250m", "memory": 120},
    }
    return orjson.loads(orjson.dumps(spec))  # type: ignore[no-any-return]


def pod(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def changed(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    """good_spec() with the field at `path` (keys and list indexes under spec) set to `value`."""
    return with_field(good_spec(), path, value)


def status(response: httpx.Response, code: int, *words: str) -> dict[str, Any]:
    assert response.status_code == code, f"{response.status_code}: {response.text[:600]}"
    body: dict[str, Any] = response.json()
    assert body["kind"] == "Status" and body["code"] == code, body
    for word in words:
        assert word in body["message"], (word, body["message"])
    return body


# (case id, path under spec, value, words the 400 message must hold: the field path and the value)
WRONG_TYPES: list[tuple[str, tuple[Any, ...], Any, tuple[str, ...]]] = [
    ("nodeAffinity is a number", ("affinity", "nodeAffinity"), 3, ("spec.affinity.nodeAffinity", "an object", "3")),
    ("affinity is a list", ("affinity",), ["x"], ("spec.affinity", "an object", "['x']")),
    ("podAffinity is a string", ("affinity", "podAffinity"), "x", ("spec.affinity.podAffinity", "'x'")),
    ("toleration key is a number", ("tolerations", 0, "key"), 5, ("spec.tolerations[0].key", "a string", "5")),
    ("toleration operator is a list", ("tolerations", 1, "operator"), ["Exists"],
     ("spec.tolerations[1].operator", "a string")),
    ("toleration effect is a boolean", ("tolerations", 0, "effect"), True, ("spec.tolerations[0].effect", "True")),
    ("tolerationSeconds is a string", ("tolerations", 0, "tolerationSeconds"), "60",
     ("spec.tolerations[0].tolerationSeconds", "an integer", "'60'")),
    ("tolerationSeconds is a fraction", ("tolerations", 0, "tolerationSeconds"), 1.5,
     ("spec.tolerations[0].tolerationSeconds", "an integer", "1.5")),
    ("a toleration is a string", ("tolerations", 0), "x", ("spec.tolerations[0]", "an object", "'x'")),
    ("nodeSelectorTerms is an object", NODE_TERMS, {"a": 1}, ("nodeSelectorTerms", "a list")),
    ("matchExpressions holds a string", (*NODE_TERMS, 0, "matchExpressions"), ["x"],
     ("spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
      ".matchExpressions[0]", "an object", "'x'")),
    ("matchExpressions key is a number", (*NODE_TERMS, 0, "matchExpressions", 0, "key"), 7,
     ("nodeSelectorTerms[0].matchExpressions[0].key", "a string", "7")),
    ("matchFields values is a string", (*NODE_TERMS, 0, "matchFields", 0, "values"), "n1",
     ("nodeSelectorTerms[0].matchFields[0].values", "a list", "'n1'")),
    ("matchFields value is a number", (*NODE_TERMS, 0, "matchFields", 0, "values"), [1],
     ("nodeSelectorTerms[0].matchFields[0].values[0]", "a string", "1")),
    ("preference weight is a string",
     ("affinity", "nodeAffinity", "preferredDuringSchedulingIgnoredDuringExecution", 0, "weight"), "10",
     ("preferredDuringSchedulingIgnoredDuringExecution[0].weight", "an integer")),
    ("anti-affinity selector operator is a number",
     (*ANTI_TERMS, 0, "labelSelector", "matchExpressions", 0, "operator"), 1,
     ("spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].labelSelector"
      ".matchExpressions[0].operator", "a string")),
    ("anti-affinity topologyKey is a list", (*ANTI_TERMS, 0, "topologyKey"), ["x"], ("[0].topologyKey", "a string")),
    ("overhead is a string", ("overhead",), "x", ("spec.overhead", "an object", "'x'")),
    ("overhead value is a boolean", ("overhead", "cpu"), True, ("spec.overhead[cpu]", "True")),
    ("overhead value is an object", ("overhead", "memory"), {"v": 1}, ("spec.overhead[memory]", "a string")),
    ("request is a list", ("containers", 0, "resources", "requests", "cpu"), [1],
     ("spec.containers[0].resources.requests[cpu]", "[1]")),
]


@pytest.mark.parametrize(("path", "value", "words"), [c[1:] for c in WRONG_TYPES], ids=[c[0] for c in WRONG_TYPES])
def test_a_wrong_type_is_refused_naming_the_field(client: httpx.Client, path: tuple[Any, ...], value: Any,
                                                  words: tuple[str, ...]) -> None:
    body = status(client.post(PODS, content=orjson.dumps(pod("typed", changed(path, value)))), 400,
                  'Pod in version "v1" cannot be handled as a Pod', *words)
    assert body["reason"] == "BadRequest", body
    assert client.get(f"{PODS}/typed").status_code == 404


# (case id, path under spec, value, the cause's field, words of its message)
BAD_QUANTITIES: list[tuple[str, tuple[Any, ...], Any, str, tuple[str, ...]]] = [
    ("negative overhead string", ("overhead", "cpu"), "-1", "spec.overhead[cpu]",
     ('"-1"', "greater than or equal to 0")),
    ("negative overhead number", ("overhead", "memory"), -120, "spec.overhead[memory]", ("-120", "greater than")),
    ("negative request", ("containers", 0, "resources", "requests", "cpu"), "-500m",
     "spec.containers[0].resources.requests[cpu]", ('"-500m"', "greater than or equal to 0")),
    ("negative limit number", ("containers", 0, "resources", "limits", "cpu"), -1.5,
     "spec.containers[0].resources.limits[cpu]", ("-1.5", "greater than or equal to 0")),
    ("unreadable limit", ("containers", 0, "resources", "limits", "memory"), "lots",
     "spec.containers[0].resources.limits[memory]", ('"lots"', "must be a quantity", "1.5Gi")),
    ("unreadable overhead", ("overhead", "cpu"), "1e999999", "spec.overhead[cpu]",
     ('"1e999999"', "must be a quantity")),
    ("empty request", ("containers", 0, "resources", "requests", "memory"), "",
     "spec.containers[0].resources.requests[memory]", ('""', "must be a quantity")),
]


@pytest.mark.parametrize(("path", "value", "field", "words"), [c[1:] for c in BAD_QUANTITIES],
                         ids=[c[0] for c in BAD_QUANTITIES])
def test_a_bad_quantity_is_invalid_naming_the_field(client: httpx.Client, path: tuple[Any, ...], value: Any,
                                                    field: str, words: tuple[str, ...]) -> None:
    body = status(client.post(PODS, content=orjson.dumps(pod("quantity", changed(path, value)))), 422,
                  'Pod "quantity" is invalid', field, *words)
    assert body["reason"] == "Invalid", body
    assert [c["field"] for c in body["details"]["causes"]] == [field], body
    assert client.get(f"{PODS}/quantity").status_code == 404


def test_an_init_containers_quantity_is_checked_too(client: httpx.Client) -> None:
    spec = good_spec()
    spec["initContainers"] = [{"name": "init", "image": "busybox:1", "resources": {"limits": {"cpu": "-2"}}}]
    status(client.post(PODS, content=orjson.dumps(pod("init", spec))), 422,
           'spec.initContainers[0].resources.limits[cpu]: Invalid value: "-2"')


def test_a_long_bad_quantity_is_shortened_in_the_message(client: httpx.Client) -> None:
    body = status(client.post(PODS, content=orjson.dumps(pod("long", changed(("overhead", "cpu"), "x" * 5000)))),
                  422, "spec.overhead[cpu]", "x" * 57 + "...")
    assert len(body["message"]) < 1000, body["message"]


def test_well_formed_scheduling_fields_are_stored_as_sent(client: httpx.Client) -> None:
    sent = good_spec()
    created = client.post(PODS, content=orjson.dumps(pod("good", copy.deepcopy(sent))))
    assert created.status_code == 201, created.text
    stored = client.get(f"{PODS}/good").json()["spec"]
    for key in ("tolerations", "affinity", "overhead"):
        assert stored[key] == sent[key], (key, stored[key])
    assert stored["containers"][0]["resources"] == sent["containers"][0]["resources"]
    client.delete(f"{PODS}/good")


def test_a_patch_that_breaks_a_field_is_refused_and_changes_nothing(client: httpx.Client) -> None:
    created = client.post(PODS, content=orjson.dumps(pod("patched", good_spec())))
    assert created.status_code == 201, created.text
    merge = {"content-type": "application/merge-patch+json"}
    status(client.patch(f"{PODS}/patched", content=orjson.dumps({"spec": {"tolerations": [{"key": 5}]}}),
                        headers=merge), 400, "spec.tolerations[0].key", "a string")
    seconds = {"spec": {"tolerations": [{"key": "k", "tolerationSeconds": "x"}]}}
    status(client.patch(f"{PODS}/patched", content=orjson.dumps(seconds), headers=merge), 400,
           "spec.tolerations[0].tolerationSeconds", "an integer")
    after = client.get(f"{PODS}/patched").json()
    assert after["spec"]["tolerations"] == good_spec()["tolerations"]
    assert after["metadata"]["resourceVersion"] == created.json()["metadata"]["resourceVersion"]
    client.delete(f"{PODS}/patched")


def test_a_workloads_pod_template_is_held_to_the_same_table(client: httpx.Client) -> None:
    spec = changed(("tolerations", 0, "key"), 5)
    deployment: dict[str, Any] = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
                                  "spec": {"selector": {"matchLabels": {"app": "d"}},
                           "template": {"metadata": {"labels": {"app": "d"}}, "spec": spec}}}
    status(client.post(DEPLOYMENTS, content=orjson.dumps(deployment)), 400,
           "spec.template.spec.tolerations[0].key", "a string", "5")
    deployment["spec"]["template"]["spec"] = changed(("overhead", "cpu"), "-1")
    status(client.post(DEPLOYMENTS, content=orjson.dumps(deployment)), 422,
           "spec.template.spec.overhead[cpu]", "greater than or equal to 0")


def test_an_integer_beyond_64_bits_is_a_float_that_an_integer_field_refuses(client: httpx.Client) -> None:
    """The body reader takes the literal as a float (tfusion.api.documents), as kube does for
    unstructured objects; spec.priority wants an integer and says so."""
    spec = orjson.dumps(good_spec())[:-1] + b',"priority":123456789012345678901234567890}'
    body = b'{"apiVersion":"v1","kind":"Pod","metadata":{"name":"big"},"spec":' + spec + b"}"
    status(client.post(PODS, content=body), 400, "spec.priority", "an integer", "float 1.2345678901234568e+29")
    overhead = orjson.dumps(good_spec())[:-1] + b',"overhead":{"cpu":123456789012345678901234567890}}'
    stored = client.post(PODS, content=b'{"metadata":{"name":"bigq"},"spec":' + overhead + b"}")
    assert stored.status_code == 201, stored.text  # a quantity may be a number, and this one is not negative
    client.delete(f"{PODS}/bigq")
