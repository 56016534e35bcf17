"""The pure parts of the embedded API server's RBAC: request attributes as kube parses them, rule
matching (wildcards, subresources, names, non-resource URLs), bindings by namespace, aggregation."""

from __future__ import annotations

from typing import Any

import pytest

from tfusion.apiserver import rbac

USER = rbac.UserInfo("alice", groups=("devs", rbac.AUTHENTICATED))


@pytest.mark.parametrize(("method", "path", "params", "expected"), [
    ("GET", "/api/v1/namespaces/ml/pods/p", {}, ("get", "", "pods", "", "ml", "p")),
    ("GET", "/api/v1/namespaces/ml/pods", {}, ("list", "", "pods", "", "ml", "")),
    ("GET", "/api/v1/namespaces/ml/pods", {"watch": "1"}, ("watch", "", "pods", "", "ml", "")),
    ("GET", "/api/v1/watch/namespaces/ml/pods", {}, ("watch", "", "pods", "", "ml", "")),
    ("GET", "/api/v1/pods", {"fieldSelector": "metadata.name=p,spec.nodeName=n"}, ("list", "", "pods", "", "", "p")),
    ("POST", "/api/v1/namespaces/ml/pods/p/binding", {}, ("create", "", "pods", "binding", "ml", "p")),
    ("PATCH", "/apis/tensor-fusion.ai/v1/gpus/g/status", {}, ("patch", "tensor-fusion.ai", "gpus", "status", "", "g")),
    ("DELETE", "/apis/apps/v1/namespaces/ml/deployments", {},
     ("deletecollection", "apps", "deployments", "", "ml", "")),
    ("GET", "/api/v1/namespaces/ml", {}, ("get", "", "namespaces", "", "ml", "ml")),
    ("PUT", "/api/v1/namespaces/ml/finalize", {}, ("update", "", "namespaces", "finalize", "ml", "ml")),
])
def test_request_attributes(method: str, path: str, params: dict[str, str], expected: tuple[str, ...]) -> None:
    a = rbac.request_attributes(USER, method, path, params)
    assert a.resource_request
    assert (a.verb, a.api_group, a.resource, a.subresource, a.namespace, a.name) == expected


@pytest.mark.parametrize("path", ["/api", "/api/v1", "/apis/apps", "/apis/apps/v1", "/version", "/openapi/v2", "/"])
def test_discovery_and_other_paths_are_non_resource(path: str) -> None:
    a = rbac.request_attributes(USER, "GET", path, {})
    assert not a.resource_request and a.verb == "get" and a.path == path


def attrs(verb: str, resource: str, *, group: str = "", name: str = "", namespace: str = "") -> rbac.Attributes:
    resource, _, sub = resource.partition("/")
    return rbac.Attributes(USER, verb, True, api_group=group, resource=resource, subresource=sub,
                           namespace=namespace, name=name)


def rule(**fields: Any) -> rbac.Rule:
    return rbac.Rule.parse(fields)


def test_rule_matching() -> None:
    pods = rule(apiGroups=[""], resources=["pods"], verbs=["get"])
    assert pods.allows(attrs("get", "pods"))
    assert not pods.allows(attrs("get", "pods/status")), "a subresource is its own resource"
    assert not pods.allows(attrs("list", "pods")) and not pods.allows(attrs("get", "pods", group="apps"))
    any_status = rule(apiGroups=["tensor-fusion.ai"], resources=["*/status"], verbs=["update"])
    assert any_status.allows(attrs("update", "gpus/status", group="tensor-fusion.ai"))
    assert not any_status.allows(attrs("update", "gpus", group="tensor-fusion.ai"))
    named = rule(apiGroups=[""], resources=["secrets"], resourceNames=["a"], verbs=["get"])
    assert named.allows(attrs("get", "secrets", name="a")) and not named.allows(attrs("get", "secrets"))
    everything = rule(apiGroups=["*"], resources=["*"], verbs=["*"])
    assert everything.allows(attrs("escalate", "roles/anything", group="x"))
    urls = rule(nonResourceURLs=["/metrics", "/logs/*"], verbs=["get"])
    assert urls.allows(rbac.Attributes(USER, "get", False, path="/logs/a/b"))
    assert not urls.allows(rbac.Attributes(USER, "get", False, path="/metricsx"))
    assert not urls.allows(attrs("get", "pods")), "a non-resource rule grants no resource"


def binding(kind: str, role: str, subjects: list[dict[str, Any]], namespace: str = "") -> dict[str, Any]:
    meta = {"name": f"b-{role}", **({"namespace": namespace} if namespace else {})}
    return {"metadata": meta, "roleRef": {"apiGroup": rbac.GROUP, "kind": kind, "name": role}, "subjects": subjects}


def cluster_role(name: str, rules: list[dict[str, Any]], labels: dict[str, str] | None = None,
                 selectors: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    role: dict[str, Any] = {"metadata": {"name": name, "labels": labels or {}}, "rules": rules}
    if selectors is not None:
        role["aggregationRule"] = {"clusterRoleSelectors": selectors}
    return role


def test_role_bindings_grant_in_their_namespace_and_never_urls() -> None:
    reader = cluster_role("reader", [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
                                     {"nonResourceURLs": ["/metrics"], "verbs": ["get"]}])
    index = rbac.PolicyIndex([], [reader], [binding("ClusterRole", "reader", [{"kind": "Group", "name": "devs"}],
                                                    namespace="ml")], [])
    assert index.allows(attrs("get", "pods", namespace="ml"))
    assert not index.allows(attrs("get", "pods", namespace="other"))
    assert not index.allows(attrs("get", "pods")), "cluster scope is not a namespace"
    assert not index.allows(rbac.Attributes(USER, "get", False, path="/metrics"))


def test_service_account_subjects_default_to_the_binding_namespace() -> None:
    role = {"metadata": {"name": "r", "namespace": "ml"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}]}
    index = rbac.PolicyIndex([role], [], [binding("Role", "r", [{"kind": "ServiceAccount", "name": "bot"}], "ml")], [])
    bot = rbac.UserInfo(rbac.service_account_user("ml", "bot"))
    assert index.allows(rbac.Attributes(bot, "list", True, resource="configmaps", namespace="ml"))


def test_aggregation_follows_chains_and_survives_cycles() -> None:
    view = cluster_role("view", [], labels={"agg-edit": "true"}, selectors=[{"matchLabels": {"agg-view": "true"}}])
    edit = cluster_role("edit", [], labels={"agg-view": "true"}, selectors=[{"matchLabels": {"agg-edit": "true"}}])
    pods = cluster_role("pods", [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}],
                        labels={"agg-view": "true"})
    rules = rbac.effective_cluster_role_rules([view, edit, pods])
    assert {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]} in rules["view"]
    assert {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]} in rules["edit"], "through view"


def test_masters_are_allowed_without_any_policy() -> None:
    from tfusion.apiserver.store import Store

    store = Store(":memory:", 10)
    try:
        authorizer = rbac.Authorizer(store)
        assert authorizer.allowed(rbac.Attributes(rbac.ADMIN, "delete", True, resource="nodes", name="n"))
        assert not authorizer.allowed(attrs("delete", "nodes", name="n"))
        with pytest.raises(Exception) as denied:
            authorizer.check(attrs("delete", "nodes", name="n"))
        assert str(denied.value) == ('nodes "n" is forbidden: User "alice" cannot delete resource "nodes" in API '
                                     'group "" at the cluster scope')
    finally:
        store.close()


def test_impersonating_a_service_account_adds_its_groups() -> None:
    from tfusion.apiserver.store import Store

    store = Store(":memory:", 10)
    try:
        user = rbac.impersonate(rbac.Authorizer(store), rbac.ADMIN,
                                {rbac.IMPERSONATE_USER: ["system:serviceaccount:ml:bot"]})
        assert user.groups == ("system:serviceaccounts", "system:serviceaccounts:ml", rbac.AUTHENTICATED)
    finally:
        store.close()
