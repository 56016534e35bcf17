"""Server-side apply against the embedded API server, with the clients people use it from: kubectl
(`apply --server-side`, `--force-conflicts`, client-side apply and edit-style updates before it) and
the official Python client's DynamicClient. What each answer must look like is kube-apiserver's:
the same status codes, the conflict message naming manager and field, managedFields per manager."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.kubectl import Kubectl, needs_kubectl
from tests.helpers.official_client import official_client
from tests.helpers.widgets import widget_crd as shared_widget_crd

APPLY = {"content-type": "application/apply-patch+yaml"}
DEPLOYMENTS = "/apis/apps/v1/namespaces/default/deployments"


@pytest.fixture
def kubectl(apiserver: Any, tmp_path: Path) -> Kubectl:
    return Kubectl(apiserver.kubeconfig, tmp_path / "cache")


def deployment(replicas: int = 2, *, image: str = "nginx:1.27", labels: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "web", "namespace": "default"}
    if labels:
        meta["labels"] = labels
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": image}]},
            },
        },
    }


def read(apiserver: Any, path: str) -> dict[str, Any]:
    with apiserver.sync_http() as http:
        response = http.get(path)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def managers(obj: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """(manager, operation) -> its fieldsV1."""
    return {(e["manager"], e["operation"]): e["fieldsV1"] for e in obj["metadata"].get("managedFields", [])}


def owns(fields_v1: dict[str, Any], *steps: str) -> bool:
    node: Any = fields_v1
    for step in steps:
        if not isinstance(node, dict) or step not in node:
            return False
        node = node[step]
    return isinstance(node, dict) and (not node or "." in node)


@needs_kubectl
def test_kubectl_server_side_apply_twice_conflict_and_force(kubectl: Kubectl, apiserver: Any) -> None:
    out = kubectl.out("apply", "--server-side", "-f", "-", input=json.dumps(deployment()))
    assert "serverside-applied" in out
    first = read(apiserver, f"{DEPLOYMENTS}/web")
    entries = managers(first)
    assert set(entries) == {("kubectl", "Apply")}
    assert owns(entries["kubectl", "Apply"], "f:spec", "f:replicas")
    assert owns(entries["kubectl", "Apply"], "f:spec", "f:template", "f:spec", "f:containers", 'k:{"name":"web"}')
    entry = first["metadata"]["managedFields"][0]
    assert entry["fieldsType"] == "FieldsV1" and entry["apiVersion"] == "apps/v1" and entry["time"]

    kubectl.out("apply", "--server-side", "-f", "-", input=json.dumps(deployment()))
    again = read(apiserver, f"{DEPLOYMENTS}/web")
    assert again["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]

    conflict = kubectl("apply", "--server-side", "--field-manager=scaler", "-f", "-", input=json.dumps(deployment(5)),
                       check=False)
    assert conflict.returncode != 0
    assert 'conflict with "kubectl": .spec.replicas' in conflict.stderr, conflict.stderr
    assert read(apiserver, f"{DEPLOYMENTS}/web")["spec"]["replicas"] == 2

    kubectl.out("apply", "--server-side", "--field-manager=scaler", "--force-conflicts", "-f", "-",
               input=json.dumps(deployment(5)))
    taken = read(apiserver, f"{DEPLOYMENTS}/web")
    assert taken["spec"]["replicas"] == 5
    entries = managers(taken)
    assert owns(entries["scaler", "Apply"], "f:spec", "f:replicas")
    assert not owns(entries["kubectl", "Apply"], "f:spec", "f:replicas")
    # the image both apply with the same value: shared, so no conflict and both keep it
    path = ("f:spec", "f:template", "f:spec", "f:containers", 'k:{"name":"web"}', "f:image")
    assert owns(entries["scaler", "Apply"], *path) and owns(entries["kubectl", "Apply"], *path)


@needs_kubectl
def test_a_field_dropped_from_the_manifest_is_removed_unless_another_manager_owns_it(
    kubectl: Kubectl, apiserver: Any
) -> None:
    kubectl.out("apply", "--server-side", "-f", "-", input=json.dumps(deployment(labels={"team": "a", "tier": "web"})))
    kubectl.out("apply", "--server-side", "--field-manager=other", "-f", "-",
               input=json.dumps({"apiVersion": "apps/v1", "kind": "Deployment",
                         "metadata": {"name": "web", "labels": {"tier": "web"}}}))
    kubectl.out("apply", "--server-side", "-f", "-", input=json.dumps(deployment()))
    labels = read(apiserver, f"{DEPLOYMENTS}/web")["metadata"].get("labels", {})
    assert labels == {"tier": "web"}  # team went with its only owner; tier stays with "other"

    two = deployment()
    two["spec"]["template"]["spec"]["containers"].append({"name": "side", "image": "busybox"})
    kubectl.out("apply", "--server-side", "-f", "-", input=json.dumps(two))
    assert len(read(apiserver, f"{DEPLOYMENTS}/web")["spec"]["template"]["spec"]["containers"]) == 2
    kubectl.out("apply", "--server-side", "-f", "-", input=json.dumps(deployment()))
    containers = read(apiserver, f"{DEPLOYMENTS}/web")["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["web"]


@needs_kubectl
def test_client_side_apply_then_server_side_apply_conflicts_as_in_kube(kubectl: Kubectl, apiserver: Any) -> None:
    kubectl.out("apply", "-f", "-", input=json.dumps(deployment(2)))
    created = read(apiserver, f"{DEPLOYMENTS}/web")
    entries = managers(created)
    assert owns(entries["kubectl-client-side-apply", "Update"], "f:spec", "f:replicas")
    # an edit-style update (kubectl scale / edit / replace send their own manager) takes the field
    kubectl.out("patch", "deployment", "web", "--type=merge", "-p", '{"spec":{"replicas":3}}')
    patched = managers(read(apiserver, f"{DEPLOYMENTS}/web"))
    assert owns(patched["kubectl-patch", "Update"], "f:spec", "f:replicas")
    assert not owns(patched["kubectl-client-side-apply", "Update"], "f:spec", "f:replicas")

    conflict = kubectl("apply", "--server-side", "--field-manager=gitops", "-f", "-", input=json.dumps(deployment(4)),
                       check=False)
    assert conflict.returncode != 0
    assert 'conflict with "kubectl-patch" using apps/v1: .spec.replicas' in conflict.stderr, conflict.stderr
    # the same value as live is shared ownership, not a conflict
    kubectl.out("apply", "--server-side", "--field-manager=gitops", "-f", "-", input=json.dumps(deployment(3)))


def widget_crd() -> dict[str, Any]:
    ports = {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
             "items": {"type": "object", "required": ["name"],
                       "properties": {"name": {"type": "string"}, "port": {"type": "integer"}}}}
    tags = {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}}
    return shared_widget_crd({"type": "object", "properties": {
        "spec": {"type": "object", "properties": {
            "ports": ports, "tags": tags,
            "selector": {"type": "object", "x-kubernetes-map-type": "atomic",
                         "additionalProperties": {"type": "string"}},
        }},
    }})


def widget(ports: list[dict[str, Any]], tags: list[str], selector: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"ports": ports, "tags": tags}
    if selector is not None:
        spec["selector"] = selector
    return {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": spec}


@needs_kubectl
def test_custom_resource_list_maps_sets_and_atomic_maps_follow_the_crd_schema(
    kubectl: Kubectl, apiserver: Any
) -> None:
    kubectl.out("apply", "--server-side", "-f", "-", input=json.dumps(widget_crd()))
    kubectl.out("wait", "--for=condition=Established", "crd/widgets.example.com", "--timeout=30s")
    path = "/apis/example.com/v1/namespaces/default/widgets/w"
    kubectl.out("apply", "--server-side", "--field-manager=a", "-f", "-",
               input=json.dumps(widget([{"name": "http", "port": 80}], ["x"], {"app": "w"})))
    kubectl.out("apply", "--server-side", "--field-manager=b", "-f", "-",
               input=json.dumps(widget([{"name": "grpc", "port": 9090}], ["y"])))
    stored = read(apiserver, path)
    assert sorted(p["name"] for p in stored["spec"]["ports"]) == ["grpc", "http"]
    assert sorted(stored["spec"]["tags"]) == ["x", "y"]
    entries = managers(stored)
    assert owns(entries["a", "Apply"], "f:spec", "f:ports", 'k:{"name":"http"}', "f:port")
    assert owns(entries["b", "Apply"], "f:spec", "f:tags", 'v:"y"')
    assert owns(entries["a", "Apply"], "f:spec", "f:selector")  # atomic: one leaf
    assert not owns(entries["a", "Apply"], "f:spec", "f:selector", "f:app")

    conflict = kubectl("apply", "--server-side", "--field-manager=b", "-f", "-",
                       input=json.dumps(widget([{"name": "grpc", "port": 9090}, {"name": "http", "port": 81}], ["y"])),
                       check=False)
    assert conflict.returncode != 0
    assert '.spec.ports[name="http"].port' in conflict.stderr, conflict.stderr

    # a drops its item and tag: they go; b's stay
    kubectl.out("apply", "--server-side", "--field-manager=a", "-f", "-",
                input=json.dumps(widget([], [], {"app": "w"})))
    stored = read(apiserver, path)
    assert [p["name"] for p in stored["spec"]["ports"]] == ["grpc"]
    assert stored["spec"]["tags"] == ["y"]


def test_official_python_client_server_side_apply(apiserver: Any) -> None:
    from kubernetes import dynamic
    from kubernetes.client.exceptions import ApiException

    api = dynamic.DynamicClient(official_client(apiserver.kubeconfig))  # type: ignore[no-untyped-call]
    deployments = api.resources.get(api_version="apps/v1", kind="Deployment")
    created = deployments.server_side_apply(body=deployment(1), namespace="default", field_manager="py")
    assert created.spec.replicas == 1
    updated = deployments.server_side_apply(body=deployment(1, image="nginx:1.28"), namespace="default",
                                            field_manager="py")
    assert updated.spec.template.spec.containers[0].image == "nginx:1.28"
    assert updated.metadata.resourceVersion != created.metadata.resourceVersion
    with pytest.raises(ApiException) as caught:
        deployments.server_side_apply(body=deployment(7, image="nginx:1.28"), namespace="default",
                                      field_manager="other")
    assert caught.value.status == 409
    status = json.loads(str(caught.value.body))
    assert status["reason"] == "Conflict"
    assert status["message"] == 'Apply failed with 1 conflict: conflict with "py": .spec.replicas'
    assert status["details"]["causes"] == [
        {"type": "FieldManagerConflict", "message": 'conflict with "py"', "field": ".spec.replicas"}]
    forced = deployments.server_side_apply(body=deployment(7, image="nginx:1.28"), namespace="default",
                                           field_manager="other", force_conflicts=True)
    assert forced.spec.replicas == 7


def test_plural_conflicts_name_each_field_under_its_manager(apiserver: Any) -> None:
    with apiserver.sync_http() as http:
        first = http.patch(f"{DEPLOYMENTS}/web", params={"fieldManager": "one"}, headers=APPLY,
                           content=yaml.safe_dump(deployment(1)))
        assert first.status_code == 201, first.text
        second = http.patch(f"{DEPLOYMENTS}/web", params={"fieldManager": "two"}, headers=APPLY,
                            content=json.dumps(deployment(2, image="nginx:2")))
    assert second.status_code == 409
    status = second.json()
    assert status["message"] == (
        'Apply failed with 2 conflicts: conflicts with "one":\n- .spec.replicas\n'
        '- .spec.template.spec.containers[name="web"].image'
    ) or status["message"] == (
        'Apply failed with 2 conflicts: conflicts with "one":\n'
        '- .spec.template.spec.containers[name="web"].image\n- .spec.replicas'
    )
    assert {c["field"] for c in status["details"]["causes"]} == {
        ".spec.replicas", '.spec.template.spec.containers[name="web"].image'}


def test_dry_run_apply_writes_nothing(apiserver: Any) -> None:
    with apiserver.sync_http() as http:
        dry = http.patch(f"{DEPLOYMENTS}/web", params={"fieldManager": "m", "dryRun": "All"}, headers=APPLY,
                         content=json.dumps(deployment()))
        assert dry.status_code == 201, dry.text
        assert dry.json()["metadata"]["managedFields"][0]["manager"] == "m"
        assert http.get(f"{DEPLOYMENTS}/web").status_code == 404
        made = http.patch(f"{DEPLOYMENTS}/web", params={"fieldManager": "m"}, headers=APPLY,
                          content=json.dumps(deployment()))
        rv = made.json()["metadata"]["resourceVersion"]
        dry = http.patch(f"{DEPLOYMENTS}/web", params={"fieldManager": "m", "dryRun": "All"}, headers=APPLY,
                         content=json.dumps(deployment(9)))
        assert dry.status_code == 200 and dry.json()["spec"]["replicas"] == 9
        stored = http.get(f"{DEPLOYMENTS}/web").json()
    assert stored["spec"]["replicas"] == 2 and stored["metadata"]["resourceVersion"] == rv


def test_bad_apply_requests_get_a_4xx_naming_the_problem(apiserver: Any) -> None:
    with apiserver.sync_http() as http:
        missing = http.patch(f"{DEPLOYMENTS}/web", headers=APPLY, content=json.dumps(deployment()))
        assert missing.status_code == 422
        assert missing.json()["message"] == (
            'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is required for apply patch')
        bad_yaml = http.patch(f"{DEPLOYMENTS}/web", params={"fieldManager": "m"}, headers=APPLY,
                              content=b"spec: [unclosed\n")
        assert bad_yaml.status_code == 400 and "YAML" in bad_yaml.json()["message"]
        no_kind = http.patch(f"{DEPLOYMENTS}/web", params={"fieldManager": "m"}, headers=APPLY,
                             content=b"metadata: {name: web}\n")
        assert no_kind.status_code == 400 and "apiVersion" in no_kind.json()["message"]
        with_entries = deployment()
        with_entries["metadata"]["managedFields"] = [{"manager": "x", "operation": "Apply"}]
        refused = http.patch(f"{DEPLOYMENTS}/web", params={"fieldManager": "m"}, headers=APPLY,
                             content=json.dumps(with_entries))
        assert refused.status_code == 400 and "managedFields" in refused.json()["message"]
        http.patch(f"{DEPLOYMENTS}/web", params={"fieldManager": "m"}, headers=APPLY, content=json.dumps(deployment()))
        forced = http.patch(f"{DEPLOYMENTS}/web", params={"force": "true"},
                            headers={"content-type": "application/merge-patch+json"}, content=b"{}")
        assert forced.status_code == 422
        assert "force: Forbidden: may not be specified for non-apply patch" in forced.json()["message"]


def test_updates_record_their_manager_and_managed_fields_can_be_reset(apiserver: Any) -> None:
    with apiserver.sync_http() as http:
        made = http.post(DEPLOYMENTS, json=deployment(), headers={"user-agent": "my-operator/1.2 (linux)"})
        assert made.status_code == 201, made.text
        entry = made.json()["metadata"]["managedFields"][0]
        assert (entry["manager"], entry["operation"], entry["apiVersion"]) == ("my-operator", "Update", "apps/v1")
        assert owns(entry["fieldsV1"], "f:spec", "f:replicas")

        scaled = http.patch(f"{DEPLOYMENTS}/web", params={"fieldManager": "scaler"}, json={"spec": {"replicas": 4}},
                            headers={"content-type": "application/merge-patch+json"})
        entries = managers(scaled.json())
        assert owns(entries["scaler", "Update"], "f:spec", "f:replicas")
        assert not owns(entries["my-operator", "Update"], "f:spec", "f:replicas")

        status = http.put(f"{DEPLOYMENTS}/web/status", params={"fieldManager": "ctl"},
                          json={**scaled.json(), "status": {"replicas": 4}})
        assert status.status_code == 200, status.text
        by_ctl = [e for e in status.json()["metadata"]["managedFields"] if e["manager"] == "ctl"]
        assert by_ctl[0]["subresource"] == "status" and owns(by_ctl[0]["fieldsV1"], "f:status", "f:replicas")

        malformed = http.patch(f"{DEPLOYMENTS}/web", json={"metadata": {"managedFields": [{"operation": "Sing"}]}},
                               headers={"content-type": "application/merge-patch+json"})
        assert malformed.status_code == 422
        assert "metadata.managedFields[0].operation" in malformed.json()["message"]

        kept = http.patch(f"{DEPLOYMENTS}/web", json={"metadata": {"managedFields": []}},
                          headers={"content-type": "application/merge-patch+json"})
        assert kept.json()["metadata"].get("managedFields")
        reset = http.patch(f"{DEPLOYMENTS}/web", json={"metadata": {"managedFields": [{}]}},
                           headers={"content-type": "application/merge-patch+json"})
        assert reset.status_code == 200, reset.text
        assert "managedFields" not in reset.json()["metadata"]


def test_managed_fields_survive_a_restart_and_a_no_op_apply_emits_no_watch_event(apiserver: Any) -> None:
    body = json.dumps(deployment())
    with apiserver.sync_http() as http:
        first = http.patch(f"{DEPLOYMENTS}/web", params={"fieldManager": "m"}, headers=APPLY, content=body).json()
    apiserver.restart()
    with apiserver.sync_http() as http:
        stored = http.get(f"{DEPLOYMENTS}/web").json()
        assert stored["metadata"]["managedFields"] == first["metadata"]["managedFields"]
        again = http.patch(f"{DEPLOYMENTS}/web", params={"fieldManager": "m"}, headers=APPLY, content=body)
        assert again.json()["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
        rv = first["metadata"]["resourceVersion"]
        with http.stream("GET", DEPLOYMENTS, params={"watch": "true", "resourceVersion": rv,
                                                     "timeoutSeconds": "1"}) as events:
            lines = [line for line in events.iter_lines() if line]
    assert lines == []


@needs_kubectl
def test_kubectl_moves_its_client_side_fields_to_server_side_apply(kubectl: Kubectl, apiserver: Any) -> None:
    kubectl.out("apply", "-f", "-", input=json.dumps(deployment(2)))
    # kubectl's own upgrade: its client-side fields become its server-side apply entry, no conflict
    kubectl.out("apply", "--server-side", "-f", "-", input=json.dumps(deployment(6)))
    stored = read(apiserver, f"{DEPLOYMENTS}/web")
    assert stored["spec"]["replicas"] == 6
    assert owns(managers(stored)["kubectl", "Apply"], "f:spec", "f:replicas")


def test_apply_to_the_status_subresource_owns_status_fields_only(apiserver: Any) -> None:
    with apiserver.sync_http() as http:
        http.patch(f"{DEPLOYMENTS}/web", params={"fieldManager": "m"}, headers=APPLY, content=json.dumps(deployment()))
        status = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
                  "spec": {"replicas": 50}, "status": {"observedGeneration": 1, "replicas": 2}}
        applied = http.patch(f"{DEPLOYMENTS}/web/status", params={"fieldManager": "ctl"}, headers=APPLY,
                             content=json.dumps(status))
        assert applied.status_code == 200, applied.text
    body = applied.json()
    assert body["status"]["replicas"] == 2 and body["spec"]["replicas"] == 2  # spec is not the status's to apply
    entry = next(e for e in body["metadata"]["managedFields"] if e["manager"] == "ctl")
    assert (entry["operation"], entry["subresource"]) == ("Apply", "status")
    assert owns(entry["fieldsV1"], "f:status", "f:replicas") and "f:spec" not in entry["fieldsV1"]
