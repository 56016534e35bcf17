"""RBAC in the embedded API server, from outside: ServiceAccount tokens over HTTPS, kubectl (`--as`,
`auth can-i`, `--list`, `auth whoami`) and kr8s, with kube's 403 bodies; and the RBAC that deploy/
ships, applied to the server, grants the controller what `kubectl auth can-i --list` shows."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import httpx
import kr8s
import pytest
import yaml

from tests.apiserver_fixture import ApiServerHandle
from tests.helpers.kubectl import KUBECTL, needs_kubectl
from tfusion.apiserver import security

REPO = Path(__file__).resolve().parents[2]
RBAC = "/apis/rbac.authorization.k8s.io/v1"


def kubectl(apiserver: ApiServerHandle, tmp: Path, *args: str, stdin: str | None = None,
            check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([KUBECTL, "--kubeconfig", apiserver.kubeconfig, "--cache-dir", str(tmp / "cache"),
                             *args], capture_output=True, text=True, input=stdin, timeout=60)
    if check:
        assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stdout}\n{result.stderr}"
    return result


def token_for(admin: httpx.Client, namespace: str, account: str) -> str:
    if admin.get(f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}").status_code == 404:
        assert admin.post(f"/api/v1/namespaces/{namespace}/serviceaccounts",
                          json={"metadata": {"name": account}}).status_code == 201
    issued = admin.post(f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token", json={"spec": {}})
    assert issued.status_code == 201, issued.text
    return str(issued.json()["status"]["token"])


def as_token(apiserver: ApiServerHandle, token: str) -> httpx.Client:
    return httpx.Client(base_url=apiserver.url, verify=apiserver.ssl_context, timeout=10,
                        headers={"authorization": f"Bearer {token}"})


def create(admin: httpx.Client, path: str, body: dict[str, Any]) -> None:
    response = admin.post(path, json=body)
    assert response.status_code == 201, response.text


def role(name: str, rules: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, **extra.pop("metadata", {})}, "rules": rules, **extra}


def binding(name: str, kind: str, role_name: str, subjects: list[dict[str, Any]]) -> dict[str, Any]:
    return {"metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role_name},
            "subjects": subjects}


def sa(name: str, namespace: str = "default") -> dict[str, Any]:
    return {"kind": "ServiceAccount", "name": name, "namespace": namespace}


# --- a pod's token -------------------------------------------------------------------------------------
def test_a_pod_token_can_no_longer_read_secrets_or_create_service_accounts(apiserver: ApiServerHandle) -> None:
    with apiserver.sync_http() as admin:
        create(admin, "/api/v1/namespaces/default/secrets", {"metadata": {"name": "db"}, "stringData": {"p": "x"}})
        create(admin, "/api/v1/namespaces/default/pods",
               {"metadata": {"name": "app"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
        pod_uid = admin.get("/api/v1/namespaces/default/pods/app").json()["metadata"]["uid"]
        issued = admin.post("/api/v1/namespaces/default/serviceaccounts/default/token", json={
            "spec": {"boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "app", "uid": pod_uid}}})
        token = issued.json()["status"]["token"]
    user = "system:serviceaccount:default:default"
    with as_token(apiserver, token) as pod:
        read = pod.get("/api/v1/namespaces/default/secrets/db")
        assert read.status_code == 403
        assert read.json() == {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "Forbidden",
            "code": 403, "details": {"name": "db", "kind": "secrets"},
            "message": f'secrets "db" is forbidden: User "{user}" cannot get resource "secrets" in API group "" '
                       f'in the namespace "default"'}
        made = pod.post("/api/v1/namespaces/default/serviceaccounts", json={"metadata": {"name": "evil"}})
        assert made.status_code == 403
        assert made.json()["message"] == (
            f'serviceaccounts is forbidden: User "{user}" cannot create resource "serviceaccounts" in API group "" '
            f'in the namespace "default"')
        minted = pod.post("/api/v1/namespaces/default/serviceaccounts/default/token", json={"spec": {}})
        assert minted.status_code == 403
        assert 'cannot create resource "serviceaccounts/token"' in minted.json()["message"]
        gone = pod.delete("/api/v1/namespaces/kube-system/serviceaccounts/default")
        assert gone.status_code == 403
        listed = pod.get("/api/v1/nodes")
        assert listed.json()["message"].endswith('cannot list resource "nodes" in API group "" at the cluster scope')
        path = pod.get("/")
        assert path.json()["message"] == f'forbidden: User "{user}" cannot get path "/"'
        assert pod.get("/apis").status_code == 200  # discovery: every authenticated user


# --- roles and bindings ---------------------------------------------------------------------------------
def test_role_binding_grants_in_its_namespace_only_with_names_and_subresources(apiserver: ApiServerHandle) -> None:
    with apiserver.sync_http() as admin:
        create(admin, "/api/v1/namespaces", {"metadata": {"name": "ml"}})
        for ns in ("default", "ml"):
            for name in ("one", "two"):
                create(admin, f"/api/v1/namespaces/{ns}/configmaps", {"metadata": {"name": name}})
        create(admin, f"{RBAC}/namespaces/ml/roles", role("cm", [
            {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["one"], "verbs": ["get", "update"]},
            {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["get"]},
        ]))
        create(admin, f"{RBAC}/namespaces/ml/rolebindings", binding("cm", "Role", "cm", [sa("bot", "default")]))
        token = token_for(admin, "default", "bot")
    with as_token(apiserver, token) as bot:
        assert bot.get("/api/v1/namespaces/ml/configmaps/one").status_code == 200
        assert bot.get("/api/v1/namespaces/ml/configmaps/two").status_code == 403
        assert bot.get("/api/v1/namespaces/default/configmaps/one").status_code == 403  # other namespace
        assert bot.get("/api/v1/namespaces/ml/configmaps").status_code == 403  # a list names no object
        # a field selector on metadata.name is a request for that one name, as in kube
        assert bot.get("/api/v1/namespaces/ml/configmaps", params={"fieldSelector": "metadata.name=one"}) \
            .status_code == 403  # list is not granted, only get
        assert bot.get("/api/v1/namespaces/ml/pods/p/status").status_code == 404  # allowed, and absent
        assert bot.get("/api/v1/namespaces/ml/pods/p").status_code == 403  # the pod itself is not


def test_cluster_roles_through_groups_and_the_service_account_groups(apiserver: ApiServerHandle) -> None:
    with apiserver.sync_http() as admin:
        create(admin, "/api/v1/namespaces", {"metadata": {"name": "team"}})
        create(admin, f"{RBAC}/clusterroles", role("node-reader", [
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}]))
        create(admin, f"{RBAC}/clusterroles", role("cm-lister", [
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}]))
        # every ServiceAccount of namespace team may list nodes, cluster-wide
        create(admin, f"{RBAC}/clusterrolebindings", binding("team-nodes", "ClusterRole", "node-reader", [
            {"kind": "Group", "name": "system:serviceaccounts:team", "apiGroup": "rbac.authorization.k8s.io"}]))
        # a ClusterRole bound by a RoleBinding applies in that namespace only
        create(admin, f"{RBAC}/namespaces/team/rolebindings", binding("cms", "ClusterRole", "cm-lister", [
            {"kind": "Group", "name": "system:serviceaccounts", "apiGroup": "rbac.authorization.k8s.io"}]))
        in_team, elsewhere = token_for(admin, "team", "a"), token_for(admin, "default", "b")
    with as_token(apiserver, in_team) as a, as_token(apiserver, elsewhere) as b:
        assert a.get("/api/v1/nodes").status_code == 200
        assert b.get("/api/v1/nodes").status_code == 403
        assert a.get("/api/v1/namespaces/team/configmaps").status_code == 200
        assert b.get("/api/v1/namespaces/team/configmaps").status_code == 200
        assert b.get("/api/v1/namespaces/default/configmaps").status_code == 403


def test_aggregation_and_non_resource_urls(apiserver: ApiServerHandle) -> None:
    with apiserver.sync_http() as admin:
        create(admin, f"{RBAC}/clusterroles", role("monitoring", [], aggregationRule={
            "clusterRoleSelectors": [{"matchLabels": {"example.com/aggregate-to-monitoring": "true"}}]}))
        create(admin, f"{RBAC}/clusterrolebindings", binding("monitoring", "ClusterRole", "monitoring", [sa("mon")]))
        token = token_for(admin, "default", "mon")
        with as_token(apiserver, token) as mon:
            assert mon.get("/api/v1/nodes").status_code == 403
            assert mon.get("/").status_code == 403
            create(admin, f"{RBAC}/clusterroles", role("monitoring-nodes", [
                {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]},
                {"nonResourceURLs": ["/"], "verbs": ["get"]},
            ], metadata={"labels": {"example.com/aggregate-to-monitoring": "true"}}))
            assert mon.get("/api/v1/nodes").status_code == 200  # aggregated into monitoring
            assert mon.get("/").status_code == 200
            assert admin.delete(f"{RBAC}/clusterroles/monitoring-nodes").status_code == 200
            assert mon.get("/api/v1/nodes").status_code == 403


def test_rbac_objects_are_validated(apiserver: ApiServerHandle) -> None:
    with apiserver.sync_http() as admin:
        bad = admin.post(f"{RBAC}/namespaces/default/roles", json=role("r", [
            {"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]))
        assert bad.status_code == 422 and "namespaced rules cannot apply to non-resource URLs" in bad.text
        no_group = admin.post(f"{RBAC}/clusterroles", json=role("r", [{"resources": ["pods"], "verbs": ["get"]}]))
        assert no_group.status_code == 422 and "rules[0].apiGroups" in no_group.text
        create(admin, f"{RBAC}/clusterrolebindings", binding("b", "ClusterRole", "view", [sa("x")]))
        current = admin.get(f"{RBAC}/clusterrolebindings/b").json()
        current["roleRef"]["name"] = "cluster-admin"
        changed = admin.put(f"{RBAC}/clusterrolebindings/b", json=current)
        assert changed.status_code == 422 and "cannot change roleRef" in changed.text
        unnamespaced = admin.post(f"{RBAC}/clusterrolebindings", json=binding("c", "ClusterRole", "view", [
            {"kind": "ServiceAccount", "name": "x"}]))
        assert unnamespaced.status_code == 422 and "subjects[0].namespace" in unnamespaced.text


def test_writing_rbac_needs_escalate_or_bind(apiserver: ApiServerHandle) -> None:
    with apiserver.sync_http() as admin:
        create(admin, f"{RBAC}/namespaces/default/roles", role("role-writer", [
            {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles", "rolebindings"],
             "verbs": ["create"]}]))
        create(admin, f"{RBAC}/namespaces/default/rolebindings",
               binding("role-writer", "Role", "role-writer", [sa("w")]))
        token = token_for(admin, "default", "w")
    with as_token(apiserver, token) as writer:
        grab = writer.post(f"{RBAC}/namespaces/default/roles", json=role("all-secrets", [
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]))
        assert grab.status_code == 403 and 'cannot escalate resource "roles"' in grab.json()["message"]
        bind = writer.post(f"{RBAC}/namespaces/default/rolebindings",
                           json=binding("me", "Role", "role-writer", [sa("other")]))
        assert bind.status_code == 403 and 'cannot bind resource "rolebindings"' in bind.json()["message"]


# --- reviews, impersonation, kubectl ---------------------------------------------------------------------
def test_access_reviews(apiserver: ApiServerHandle) -> None:
    with apiserver.sync_http() as admin:
        create(admin, f"{RBAC}/clusterroles", role("pod-reader", [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]))
        create(admin, f"{RBAC}/clusterrolebindings", binding("pod-reader", "ClusterRole", "pod-reader", [
            {"kind": "User", "name": "jane", "apiGroup": "rbac.authorization.k8s.io"}]))
        review = admin.post("/apis/authorization.k8s.io/v1/subjectaccessreviews", json={
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": "jane", "resourceAttributes": {"verb": "list", "resource": "pods", "namespace": "x"}}})
        assert review.status_code == 201 and review.json()["status"]["allowed"] is True
        denied = admin.post("/apis/authorization.k8s.io/v1/namespaces/x/localsubjectaccessreviews", json={
            "spec": {"user": "jane", "resourceAttributes": {"verb": "delete", "resource": "pods"}}})
        assert denied.json()["status"]["allowed"] is False
        as_jane = {"impersonate-user": "jane"}
        mine = admin.post("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", headers=as_jane, json={
            "spec": {"resourceAttributes": {"verb": "get", "resource": "pods", "namespace": "default"}}})
        assert mine.json()["status"]["allowed"] is True
        empty = admin.post("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", json={"spec": {}})
        assert empty.status_code == 422
        rules = admin.post("/apis/authorization.k8s.io/v1/selfsubjectrulesreviews", headers=as_jane,
                           json={"spec": {"namespace": "default"}}).json()["status"]
        assert {"verbs": ["get", "list"], "apiGroups": [""], "resources": ["pods"]} in rules["resourceRules"]
        whoami = admin.post("/apis/authentication.k8s.io/v1/selfsubjectreviews", headers={
            **as_jane, "impersonate-group": "devs"}, json={}).json()["status"]["userInfo"]
        assert whoami == {"username": "jane", "groups": ["devs", "system:authenticated"]}


def test_only_the_allowed_may_impersonate(apiserver: ApiServerHandle) -> None:
    with apiserver.sync_http() as admin:
        token = token_for(admin, "default", "plain")
        as_sa = admin.get("/api/v1/namespaces/default/secrets",
                          headers={"impersonate-user": "system:serviceaccount:default:plain"})
        assert as_sa.status_code == 403 and 'User "system:serviceaccount:default:plain"' in as_sa.json()["message"]
        group_only = admin.get("/api/v1/namespaces", headers={"impersonate-group": "system:masters"})
        assert group_only.status_code == 400 and "Impersonate-User" in group_only.text
    with as_token(apiserver, token) as plain:
        tried = plain.get("/api/v1/namespaces", headers={"impersonate-user": "admin",
                                                          "impersonate-group": "system:masters"})
        assert tried.status_code == 403
        assert tried.json()["message"] == ('users "admin" is forbidden: User "system:serviceaccount:default:plain" '
                                           'cannot impersonate resource "users" in API group "" at the cluster scope')


@needs_kubectl
def test_kubectl_auth_can_i_as_and_whoami(apiserver: ApiServerHandle, tmp_path: Path) -> None:
    bot = "system:serviceaccount:default:bot"
    kubectl(apiserver, tmp_path, "create", "serviceaccount", "bot")
    assert kubectl(apiserver, tmp_path, "auth", "can-i", "get", "secrets", "--as", bot, check=False).stdout \
        .strip() == "no"
    kubectl(apiserver, tmp_path, "create", "role", "reader", "--verb=get", "--resource=secrets",
            "--resource-name=s1")
    kubectl(apiserver, tmp_path, "create", "rolebinding", "reader", "--role=reader", "--serviceaccount=default:bot")
    assert kubectl(apiserver, tmp_path, "auth", "can-i", "get", "secrets/s1", "--as", bot).stdout.strip() == "yes"
    assert kubectl(apiserver, tmp_path, "auth", "can-i", "get", "secrets/s2", "--as", bot, check=False) \
        .stdout.strip() == "no"
    denied = kubectl(apiserver, tmp_path, "get", "secrets", "--as", bot, check=False)
    assert denied.returncode != 0
    assert (f'Error from server (Forbidden): secrets is forbidden: User "{bot}" cannot list resource "secrets" '
            f'in API group "" in the namespace "default"') in denied.stderr
    listed = kubectl(apiserver, tmp_path, "auth", "can-i", "--list", "--as", bot).stdout
    assert any(line.split()[:3] == ["secrets", "[]", "[s1]"] for line in listed.splitlines()), listed
    who = kubectl(apiserver, tmp_path, "auth", "whoami", "-o", "json", "--as", bot).stdout
    assert json.loads(who)["status"]["userInfo"]["username"] == bot
    assert kubectl(apiserver, tmp_path, "auth", "can-i", "create", "pods").stdout.strip() == "yes"  # the admin


@needs_kubectl
def test_shipped_rbac_lists_what_the_controller_cluster_role_grants(apiserver: ApiServerHandle,
                                                                     tmp_path: Path) -> None:
    rendered = subprocess.run([KUBECTL, "kustomize", str(REPO / "deploy/overlays/builtin-scheduler")],
                              capture_output=True, text=True, timeout=60, check=True).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    wanted = ("Namespace", "ServiceAccount", "Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")
    shipped = [d for d in docs if d["kind"] in wanted]
    applied = kubectl(apiserver, tmp_path, "apply", "-f", "-", stdin=yaml.safe_dump_all(shipped))
    assert "clusterrole.rbac.authorization.k8s.io/tensor-fusion-operator created" in applied.stdout
    controller = "system:serviceaccount:tensor-fusion-sys:tensor-fusion-operator"
    listed = kubectl(apiserver, tmp_path, "auth", "can-i", "--list", "-n", "tensor-fusion-sys", "--as",
                     controller).stdout
    rows: dict[str, str] = {}
    for line in listed.splitlines()[1:]:
        if line and not line.startswith(" "):
            rows[line.split()[0]] = rows.get(line.split()[0], "") + line
    cluster_role = next(d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] ==
                        "tensor-fusion-operator")
    for rule in cluster_role["rules"]:
        for resource in rule["resources"]:
            group = rule["apiGroups"][0]
            plural, slash, sub = resource.partition("/")
            name = (f"{plural}.{group}" if group else plural) + slash + sub
            assert name in rows, f"{name} missing from:\n{listed}"
            assert all(verb in rows[name] for verb in rule["verbs"]), rows[name]
    assert "leases.coordination.k8s.io" in rows  # the Role in its namespace
    assert kubectl(apiserver, tmp_path, "auth", "can-i", "get", "secrets", "-n", "default", "--as", controller,
                   check=False).stdout.strip() == "no"


@pytest.mark.anyio
async def test_kr8s_with_a_service_account_kubeconfig_sees_403(apiserver: ApiServerHandle, tmp_path: Path) -> None:
    with apiserver.sync_http() as admin:
        token = token_for(admin, "default", "viewer")
        create(admin, f"{RBAC}/namespaces/default/roles", role("cm", [
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "create"]}]))
        create(admin, f"{RBAC}/namespaces/default/rolebindings", binding("cm", "Role", "cm", [sa("viewer")]))
    path = tmp_path / "viewer.kubeconfig"
    security.write_kubeconfig(path, security.kubeconfig(apiserver.url, token=token, ca_pem=apiserver.server.ca_pem))
    api = await kr8s.asyncio.api(kubeconfig=str(path))
    from kr8s.asyncio.objects import APIObject, ConfigMap, Secret

    made = ConfigMap({"metadata": {"name": "mine", "namespace": "default"}, "data": {"a": "b"}}, api=api)
    await made.create()
    listed = [cm async for cm in api.async_get("configmaps", namespace="default")]
    assert [cm.name for cm in listed if isinstance(cm, APIObject)] == ["mine"]
    with pytest.raises(kr8s.ServerError) as denied:
        await Secret({"metadata": {"name": "nope", "namespace": "default"}}, api=api).create()
    assert denied.value.response is not None and denied.value.response.status_code == 403
