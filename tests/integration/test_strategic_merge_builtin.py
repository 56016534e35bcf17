"""Client-side `kubectl apply` sends a strategic merge patch the second time it applies an object, so
every built-in kind we serve needs its patch strategies: lists without a tag (a Role's rules, a
binding's subjects) are replaced whole, tagged lists (a Service's ports, webhooks) merge by key."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tests.helpers.kubectl import KUBECTL, needs_kubectl
from tfusion.api.merge import STRATEGIC_MERGE_KINDS
from tfusion.apiserver.resources import BUILTINS

STRATEGIC = {"content-type": "application/strategic-merge-patch+json"}
WEBHOOKS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"



def apply(apiserver: Any, tmp_path: Path, document: dict[str, Any]) -> str:
    """Client-side `kubectl apply` of one object; its stdout ("... created" / "... configured")."""
    command = [KUBECTL, "--kubeconfig", apiserver.kubeconfig, "--cache-dir", str(tmp_path / "cache"),
               "apply", "-f", "-"]
    result = subprocess.run(command, input=json.dumps(document), capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"kubectl apply failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def read(apiserver: Any, path: str) -> dict[str, Any]:
    with apiserver.sync_http() as http:
        response = http.get(path)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_every_patchable_builtin_kind_has_patch_strategies() -> None:
    missing = {info.kind for info in BUILTINS if "patch" in info.verbs} - STRATEGIC_MERGE_KINDS
    assert not missing


def role(rules: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "reader", "namespace": "default"}, "rules": rules}


@needs_kubectl
def test_reapplying_a_changed_role_replaces_its_rules(apiserver: Any, tmp_path: Path) -> None:
    first = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
             {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}]
    assert "created" in apply(apiserver, tmp_path, role(first))
    second = [{"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "watch"]}]
    assert "configured" in apply(apiserver, tmp_path, role(second))
    stored = read(apiserver, "/apis/rbac.authorization.k8s.io/v1/namespaces/default/roles/reader")
    assert stored["rules"] == second


def binding(subjects: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "readers"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
            "subjects": subjects}


@needs_kubectl
def test_reapplying_a_changed_cluster_role_binding_replaces_its_subjects(apiserver: Any, tmp_path: Path) -> None:
    alice = {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}
    bob = {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "bob"}
    apply(apiserver, tmp_path, binding([alice]))
    assert "configured" in apply(apiserver, tmp_path, binding([bob]))
    stored = read(apiserver, "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/readers")
    assert stored["subjects"] == [bob]


def service(ports: list[dict[str, Any]], **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "default",
                                                                "labels": labels},
            "spec": {"selector": {"app": "web"}, "ports": ports}}


@needs_kubectl
def test_reapplying_a_changed_service_merges_ports_by_port(apiserver: Any, tmp_path: Path) -> None:
    apply(apiserver, tmp_path, service([{"name": "http", "port": 80, "targetPort": 8080},
                                        {"name": "metrics", "port": 9090}], tier="a"))
    path = "/api/v1/namespaces/default/services/web"
    cluster_ip = read(apiserver, path)["spec"].get("clusterIP")
    changed = [{"name": "http", "port": 80, "targetPort": 8081}]
    assert "configured" in apply(apiserver, tmp_path, service(changed, tier="b"))
    stored = read(apiserver, path)
    assert [(p["port"], p.get("targetPort")) for p in stored["spec"]["ports"]] == [(80, 8081)]
    assert stored["metadata"]["labels"] == {"tier": "b"}
    assert stored["spec"].get("clusterIP") == cluster_ip  # a field the server set survives the patch


def webhook(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "clientConfig": {"url": f"https://127.0.0.1:9443{path}"},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"],
                       "scope": "Namespaced"}],
            "objectSelector": {"matchLabels": {"never-matched-by-this-test": "x"}}}


def test_strategic_patch_merges_webhooks_by_name(apiserver: Any) -> None:
    config = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
              "metadata": {"name": "hooks"},
              "webhooks": [webhook("a.example.com", "/a"), webhook("b.example.com", "/b")]}
    with apiserver.sync_http() as http:
        assert http.post(WEBHOOKS, json=config).status_code == 201
        patch = {"webhooks": [{"name": "b.example.com", "timeoutSeconds": 7},
                              {"name": "a.example.com", "$patch": "delete"}]}
        response = http.patch(f"{WEBHOOKS}/hooks", content=json.dumps(patch), headers=STRATEGIC)
    assert response.status_code == 200, response.text
    hooks = response.json()["webhooks"]
    assert [h["name"] for h in hooks] == ["b.example.com"]
    assert hooks[0]["timeoutSeconds"] == 7 and hooks[0]["clientConfig"]["url"].endswith("/b")
    assert read(apiserver, f"{WEBHOOKS}/hooks")["webhooks"] == hooks


def test_strategic_patch_replaces_a_roles_rules_whole(apiserver: Any) -> None:
    path = "/apis/rbac.authorization.k8s.io/v1/namespaces/default/roles"
    rules = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]
    with apiserver.sync_http() as http:
        assert http.post(path, json=role(rules)).status_code == 201
        patch = {"rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["list"]}]}
        response = http.patch(f"{path}/reader", content=json.dumps(patch), headers=STRATEGIC)
    assert response.status_code == 200, response.text
    assert response.json()["rules"] == patch["rules"]
