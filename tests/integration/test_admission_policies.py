"""ValidatingAdmissionPolicy in the embedded API server, over HTTPS with real ServiceAccount tokens.

First the policy deploy/ ships: one node's hypervisor (a token naming node-a, bound to its pod or to
its Node) may write node-a's GPUs and GPUNode and is refused node-b's, while the controller's and the
admin's tokens are not affected. Then the policy machinery itself on ConfigMaps: matching, match
conditions, variables, failure policies, binding actions, and policies refused when written.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.apiserver_fixture import ApiServerHandle, apply_crds_sync
from tests.helpers.kubectl import KUBECTL, needs_kubectl
from tfusion.embedded.identities import shipped_rbac

REPO = Path(__file__).resolve().parents[2]
SHIPPED_POLICY = REPO / "deploy" / "base" / "hypervisor" / "admissionpolicy.yaml"
POLICY = "tensor-fusion-hypervisor-own-node"
NAMESPACE = "tensor-fusion-sys"
HYPERVISOR = "tensor-fusion-hypervisor-sa"
CONTROLLER = "tensor-fusion-operator"
TF = "/apis/tensor-fusion.ai/v1"
ADMISSION = "/apis/admissionregistration.k8s.io/v1"
POLICIES = f"{ADMISSION}/validatingadmissionpolicies"
BINDINGS = f"{ADMISSION}/validatingadmissionpolicybindings"
MERGE = {"content-type": "application/merge-patch+json"}
NODE_STATUS = {"status": {"phase": "Running", "totalGPUs": 1, "managedGPUs": 1, "totalTFlops": "100",
                          "totalVRAM": "16Gi"}}


def created(client: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post(path, json=body)
    assert response.status_code == 201, response.text
    result: dict[str, Any] = response.json()
    return result


def as_token(apiserver: ApiServerHandle, token: str) -> httpx.Client:
    return httpx.Client(base_url=apiserver.url, verify=apiserver.ssl_context, timeout=10,
                        headers={"authorization": f"Bearer {token}"})


def token(admin: httpx.Client, account: str, bound: dict[str, Any] | None = None) -> str:
    spec = {"boundObjectRef": bound} if bound else {}
    issued = admin.post(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{account}/token", json={"spec": spec})
    assert issued.status_code == 201, issued.text
    return str(issued.json()["status"]["token"])


def path_of(doc: dict[str, Any]) -> str:
    plural = {"ServiceAccount": "serviceaccounts", "Role": "roles", "RoleBinding": "rolebindings",
              "ClusterRole": "clusterroles", "ClusterRoleBinding": "clusterrolebindings",
              "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
              "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings"}[doc["kind"]]
    base = "/api/v1" if doc["apiVersion"] == "v1" else f"/apis/{doc['apiVersion']}"
    namespace = doc["metadata"].get("namespace")
    return f"{base}/namespaces/{namespace}/{plural}" if namespace else f"{base}/{plural}"


def gpu(name: str, node: str) -> dict[str, Any]:
    return {"apiVersion": "tensor-fusion.ai/v1", "kind": "GPU",
            "metadata": {"name": name, "labels": {"tensor-fusion.ai/managed-by": node}}}


def status_of(node: str) -> dict[str, Any]:
    capacity = {"tflops": "100", "vram": "16Gi"}
    return {"status": {"uuid": "x", "phase": "Pending", "gpuModel": "A100", "message": "managed",
                       "capacity": capacity, "available": capacity,
                       "nodeSelector": {"kubernetes.io/hostname": node}}}


class Cluster:
    """The shipped RBAC and policy, nodes node-a and node-b, their GPUNodes and one GPU each."""

    def __init__(self, apiserver: ApiServerHandle, admin: httpx.Client) -> None:
        self.apiserver, self.admin = apiserver, admin
        rbac = [dict(d.raw) for d in shipped_rbac(NAMESPACE)]
        for doc in rbac + [d for d in yaml.safe_load_all(SHIPPED_POLICY.read_text()) if d]:
            created(admin, path_of(doc), doc)
        self.nodes = {n: created(admin, "/api/v1/nodes", {"metadata": {"name": n}}) for n in ("node-a", "node-b")}
        for node in self.nodes:
            created(admin, f"{TF}/gpunodes", {"apiVersion": "tensor-fusion.ai/v1", "kind": "GPUNode",
                                             "metadata": {"name": node}, "spec": {}})
            created(admin, f"{TF}/gpus", gpu(f"gpu-{node}", node))
            status = admin.patch(f"{TF}/gpus/gpu-{node}/status", json=status_of(node), headers=MERGE)
            assert status.status_code == 200, status.text

    def hypervisor_pod_token(self, node: str) -> str:
        """The token a hypervisor pod on `node` gets (bound to the pod, naming the node)."""
        pod = created(self.admin, f"/api/v1/namespaces/{NAMESPACE}/pods", {
            "metadata": {"name": f"hypervisor-{node}"},
            "spec": {"nodeName": node, "serviceAccountName": HYPERVISOR,
                     "containers": [{"name": "hypervisor", "image": "tfusion"}]}})
        return token(self.admin, HYPERVISOR, {"kind": "Pod", "apiVersion": "v1", "name": pod["metadata"]["name"],
                                              "uid": pod["metadata"]["uid"]})

    def client(self, token_: str) -> httpx.Client:
        return as_token(self.apiserver, token_)


@pytest.fixture
def cluster(apiserver: ApiServerHandle) -> Iterator[Cluster]:
    apply_crds_sync(apiserver)
    with apiserver.sync_http() as admin:
        yield Cluster(apiserver, admin)


def refused(response: httpx.Response, wanted: str) -> None:
    assert response.status_code == 403, response.text
    body = response.json()
    assert body["reason"] == "Forbidden"
    assert body["message"].startswith(f"ValidatingAdmissionPolicy '{POLICY}' with binding '{POLICY}' denied request: ")
    assert wanted in body["message"], body["message"]


# --- the shipped policy --------------------------------------------------------------------------------
def test_a_hypervisor_token_of_node_a_is_refused_node_b_gpus_and_gpunode(cluster: Cluster) -> None:
    with cluster.client(cluster.hypervisor_pod_token("node-a")) as hypervisor:
        stamp = {"metadata": {"annotations": {"tensor-fusion.ai/last-sync": "now"}}}
        refused(hypervisor.patch(f"{TF}/gpus/gpu-node-b", json=stamp, headers=MERGE),
                "the hypervisor of node node-a may not write GPU gpu-node-b")
        refused(hypervisor.patch(f"{TF}/gpus/gpu-node-b/status", json=status_of("node-b"), headers=MERGE),
                "may not write GPU gpu-node-b")
        refused(hypervisor.patch(f"{TF}/gpunodes/node-b/status", json=NODE_STATUS,
                                 headers=MERGE),
                "the hypervisor of node node-a may not write GPUNode node-b")
        refused(hypervisor.post(f"{TF}/gpus", json=gpu("gpu-new", "node-b")), "may not write GPU gpu-new")
        refused(hypervisor.delete(f"{TF}/gpus/gpu-node-b"), "may not write GPU gpu-node-b")
        # nor can it take node-b's GPU by relabelling it, or give its own GPU away, or place it elsewhere
        take = {"metadata": {"labels": {"tensor-fusion.ai/managed-by": "node-a"}}}
        refused(hypervisor.patch(f"{TF}/gpus/gpu-node-b", json=take, headers=MERGE), "may not write GPU")
        give = {"metadata": {"labels": {"tensor-fusion.ai/managed-by": "node-b"}}}
        refused(hypervisor.patch(f"{TF}/gpus/gpu-node-a", json=give, headers=MERGE), "may not write GPU")
        refused(hypervisor.patch(f"{TF}/gpus/gpu-node-a/status", json=status_of("node-b"), headers=MERGE),
                "may not place GPU gpu-node-a on another node")
        # what the hypervisor does on its own node goes through
        assert hypervisor.patch(f"{TF}/gpus/gpu-node-a", json=stamp, headers=MERGE).status_code == 200
        assert hypervisor.patch(f"{TF}/gpus/gpu-node-a/status", json=status_of("node-a"),
                                headers=MERGE).status_code == 200
        assert hypervisor.patch(f"{TF}/gpunodes/node-a/status", json=NODE_STATUS,
                                headers=MERGE).status_code == 200
        assert hypervisor.post(f"{TF}/gpus", json=gpu("gpu-new", "node-a")).status_code == 201
        assert hypervisor.delete(f"{TF}/gpus/gpu-new").status_code == 200
    gpu_b = cluster.admin.get(f"{TF}/gpus/gpu-node-b").json()
    assert gpu_b["metadata"]["labels"] == {"tensor-fusion.ai/managed-by": "node-b"}
    assert "annotations" not in gpu_b["metadata"]


def test_a_node_bound_token_is_held_to_that_node(cluster: Cluster) -> None:
    """The token --role=all gives its hypervisor: bound to the Node itself."""
    node_a = cluster.nodes["node-a"]["metadata"]
    bound = token(cluster.admin, HYPERVISOR, {"kind": "Node", "apiVersion": "v1", "name": "node-a",
                                              "uid": node_a["uid"]})
    with cluster.client(bound) as hypervisor:
        refused(hypervisor.patch(f"{TF}/gpunodes/node-b/status", json=NODE_STATUS,
                                 headers=MERGE), "may not write GPUNode node-b")
        assert hypervisor.patch(f"{TF}/gpunodes/node-a/status", json=NODE_STATUS,
                                headers=MERGE).status_code == 200


def test_a_hypervisor_token_naming_no_node_may_write_no_gpu(cluster: Cluster) -> None:
    with cluster.client(token(cluster.admin, HYPERVISOR)) as hypervisor:
        refused(hypervisor.patch(f"{TF}/gpus/gpu-node-a/status", json=status_of("node-a"), headers=MERGE),
                "this hypervisor token names no node")
        refused(hypervisor.patch(f"{TF}/gpunodes/node-a/status", json=NODE_STATUS,
                                 headers=MERGE), "names no node")
        # reading is RBAC's business, and the policy judges only writes
        assert hypervisor.get(f"{TF}/gpus/gpu-node-b").status_code == 200


def test_the_controller_and_the_admin_are_not_affected(cluster: Cluster) -> None:
    stamp = {"metadata": {"annotations": {"checked": "yes"}}}
    with cluster.client(token(cluster.admin, CONTROLLER)) as controller:
        # the controller writes GPU status only (its allocations are a merge patch of the status, on
        # the resourceVersion it read), and RBAC grants it no PUT
        gpu = controller.get(f"{TF}/gpus/gpu-node-b").json()
        assert controller.patch(f"{TF}/gpus/gpu-node-b/status", json={
            "metadata": {"resourceVersion": gpu["metadata"]["resourceVersion"]}, **status_of("node-a")},
            headers=MERGE).status_code == 200
        assert controller.put(f"{TF}/gpus/gpu-node-b/status", json=gpu).status_code == 403
        assert controller.patch(f"{TF}/gpunodes/node-b/status", json=NODE_STATUS,
                                headers=MERGE).status_code == 200
    assert cluster.admin.patch(f"{TF}/gpus/gpu-node-a", json=stamp, headers=MERGE).status_code == 200
    assert cluster.admin.delete(f"{TF}/gpus/gpu-node-b").status_code == 200


def test_removing_the_binding_lifts_the_policy(cluster: Cluster) -> None:
    with cluster.client(cluster.hypervisor_pod_token("node-a")) as hypervisor:
        stamp = {"metadata": {"annotations": {"x": "y"}}}
        refused(hypervisor.patch(f"{TF}/gpus/gpu-node-b", json=stamp, headers=MERGE), "may not write GPU")
        assert cluster.admin.delete(f"{BINDINGS}/{POLICY}").status_code == 200
        assert hypervisor.patch(f"{TF}/gpus/gpu-node-b", json=stamp, headers=MERGE).status_code == 200


# --- the machinery, on ConfigMaps ------------------------------------------------------------------
CONFIGMAPS = "/api/v1/namespaces/default/configmaps"


def policy(name: str, validations: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    match = spec.pop("matchConstraints", {"resourceRules": [{
        "apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"],
        "operations": ["CREATE", "UPDATE", "DELETE"]}]})
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name}, "spec": {"matchConstraints": match, "validations": validations, **spec}}


def bind(name: str, policy_name: str, actions: list[str] | None = None, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {"policyName": policy_name, "validationActions": actions or ["Deny"], **spec}}


def configmap(name: str, **data: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"kind": name}}, "data": data}


@pytest.fixture
def admin(apiserver: ApiServerHandle) -> Iterator[httpx.Client]:
    with apiserver.sync_http() as client:
        yield client


def test_a_failed_validation_is_422_invalid_with_its_message_by_default(admin: httpx.Client) -> None:
    created(admin, POLICIES, policy("colour", [
        {"expression": "object.data.colour in ['red', 'green']", "message": "colour must be red or green"},
        {"expression": "object.data.colour != 'green'",
         "messageExpression": "'no ' + object.data.colour + ' here'"}]))
    created(admin, BINDINGS, bind("colour-binding", "colour"))
    blue = admin.post(CONFIGMAPS, json=configmap("a", colour="blue"))
    assert blue.status_code == 422
    assert blue.json()["reason"] == "Invalid"
    assert blue.json()["message"] == ("ValidatingAdmissionPolicy 'colour' with binding 'colour-binding' denied "
                                      "request: colour must be red or green")
    green = admin.post(CONFIGMAPS, json=configmap("a", colour="green"))
    assert green.json()["message"].endswith("denied request: no green here")
    assert admin.post(CONFIGMAPS, json=configmap("a", colour="red")).status_code == 201
    # update (and dry run, which stores nothing) and patch are judged too
    blue_patch = {"data": {"colour": "blue"}}
    assert admin.patch(f"{CONFIGMAPS}/a", json=blue_patch, headers=MERGE).status_code == 422
    assert admin.patch(f"{CONFIGMAPS}/a?dryRun=All", json=blue_patch, headers=MERGE).status_code == 422
    assert admin.get(f"{CONFIGMAPS}/a").json()["data"] == {"colour": "red"}


def test_delete_sees_the_old_object_and_no_object(admin: httpx.Client) -> None:
    created(admin, POLICIES, policy("keep", [{"expression": "object != null || oldObject.data.keep != 'yes'",
                                              "reason": "Forbidden", "message": "kept"}]))
    created(admin, BINDINGS, bind("keep", "keep"))
    created(admin, CONFIGMAPS, configmap("kept", keep="yes"))
    created(admin, CONFIGMAPS, configmap("free", keep="no"))
    assert admin.delete(f"{CONFIGMAPS}/kept").status_code == 403
    assert admin.delete(f"{CONFIGMAPS}/free").status_code == 200


def test_match_conditions_selectors_exclusions_and_resource_names(admin: httpx.Client) -> None:
    never = {"expression": "false", "message": "refused"}
    created(admin, POLICIES, policy("conditions", [never], matchConditions=[
        {"name": "only-x", "expression": "has(object.data) && 'x' in object.data"}]))
    created(admin, BINDINGS, bind("conditions", "conditions"))
    assert admin.post(CONFIGMAPS, json=configmap("plain", y="1")).status_code == 201
    assert admin.post(CONFIGMAPS, json=configmap("with-x", x="1")).status_code == 422
    assert admin.delete(f"{BINDINGS}/conditions").status_code == 200
    created(admin, POLICIES, policy("narrow", [never], matchConstraints={
        "objectSelector": {"matchLabels": {"kind": "watched"}},
        "resourceRules": [{"apiGroups": [""], "apiVersions": ["*"], "resources": ["configmaps"],
                           "operations": ["*"]}],
        "excludeResourceRules": [{"apiGroups": [""], "apiVersions": ["*"], "resources": ["configmaps"],
                                  "operations": ["*"], "resourceNames": ["watched-but-excluded"]}]}))
    created(admin, BINDINGS, bind("narrow", "narrow", matchResources={
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "default"}}}))
    assert admin.post(CONFIGMAPS, json=configmap("other")).status_code == 201
    watched = configmap("watched")
    assert admin.post(CONFIGMAPS, json=watched).status_code == 422
    excluded = {**configmap("watched-but-excluded"), "metadata": {"name": "watched-but-excluded",
                                                                  "labels": {"kind": "watched"}}}
    assert admin.post(CONFIGMAPS, json=excluded).status_code == 201
    assert admin.post("/api/v1/namespaces/kube-public/configmaps", json=watched).status_code == 201


def test_variables_and_the_request(admin: httpx.Client, apiserver: ApiServerHandle) -> None:
    created(admin, POLICIES, policy("who", [
        {"expression": "variables.user != 'system:admin' || request.operation != 'UPDATE'",
         "messageExpression": "variables.user + ' may not ' + request.operation + ' ' + request.name + ' in ' "
                              "+ request.namespace + ' (' + request.resource.resource + ')'"}],
        variables=[{"name": "user", "expression": "request.userInfo.username"}]))
    created(admin, BINDINGS, bind("who", "who"))
    created(admin, CONFIGMAPS, configmap("c"))
    updated = admin.patch(f"{CONFIGMAPS}/c", json={"data": {"a": "b"}}, headers=MERGE)
    assert updated.json()["message"].endswith("system:admin may not UPDATE c in default (configmaps)")


def test_failure_policy_decides_what_an_evaluation_error_does(admin: httpx.Client) -> None:
    broken = [{"expression": "object.data.missing == 'x'"}]
    created(admin, POLICIES, policy("fails-closed", broken))
    created(admin, BINDINGS, bind("fails-closed", "fails-closed"))
    refused_ = admin.post(CONFIGMAPS, json=configmap("e", present="1"))
    assert refused_.status_code == 422
    assert "expression 'object.data.missing == 'x'' could not be evaluated" in refused_.json()["message"]
    admin.delete(f"{BINDINGS}/fails-closed")
    created(admin, POLICIES, policy("fails-open", broken, failurePolicy="Ignore"))
    created(admin, BINDINGS, bind("fails-open", "fails-open"))
    assert admin.post(CONFIGMAPS, json=configmap("e", present="1")).status_code == 201


def test_warn_and_audit_let_the_request_through(admin: httpx.Client) -> None:
    created(admin, POLICIES, policy("noisy", [{"expression": "false"}]))
    created(admin, BINDINGS, bind("noisy", "noisy", ["Warn", "Audit"]))
    assert admin.post(CONFIGMAPS, json=configmap("n")).status_code == 201
    # a binding naming a policy that does not exist binds nothing
    created(admin, BINDINGS, bind("dangling", "no-such-policy"))
    assert admin.post(CONFIGMAPS, json=configmap("m")).status_code == 201


def causes(response: httpx.Response) -> dict[str, str]:
    assert response.status_code == 422, response.text
    return {c["field"]: c["message"] for c in response.json()["details"]["causes"]}


def test_a_policy_with_bad_cel_is_refused_naming_the_field(admin: httpx.Client) -> None:
    bad = admin.post(POLICIES, json=policy("bad", [{"expression": "object.data.x ==", "message": "m"},
                                                   {"expression": "self.x == 1"},
                                                   {"expression": "true", "messageExpression": "'a' +"}],
                                           matchConditions=[{"name": "c", "expression": "authorizer.x"}]))
    found = causes(bad)
    assert found["spec.validations[0].expression"].startswith('Invalid value: "object.data.x ==": compilation '
                                                               "failed: syntax error")
    assert "undeclared reference to 'self'" in found["spec.validations[1].expression"]
    assert "compilation failed" in found["spec.validations[2].messageExpression"]
    assert "the authorizer variable is not offered" in found["spec.matchConditions[0].expression"]
    assert admin.get(f"{POLICIES}/bad").status_code == 404
    # and an update that breaks a stored policy is refused the same way
    created(admin, POLICIES, policy("good", [{"expression": "true"}]))
    broken = admin.patch(f"{POLICIES}/good", json={"spec": {"validations": [{"expression": "1 +"}]}},
                         headers=MERGE)
    assert "spec.validations[0].expression" in causes(broken)


def test_malformed_policies_and_bindings_are_refused(admin: httpx.Client) -> None:
    found = causes(admin.post(POLICIES, json=policy(
        "odd", [{"expression": "true", "reason": "Teapot"}], failurePolicy="Sometimes",
        paramKind={"apiVersion": "v1", "kind": "ConfigMap"},
        matchConstraints={"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
                                             "operations": ["READ"]}]},
        variables=[{"name": "not-an-identifier", "expression": "1"}])))
    assert found["spec.failurePolicy"] == 'Unsupported value: "Sometimes": supported values: "Fail", "Ignore"'
    assert found["spec.validations[0].reason"].startswith('Unsupported value: "Teapot"')
    assert "spec.paramKind" in found
    assert found["spec.matchConstraints.resourceRules[0].operations[0]"].startswith('Unsupported value: "READ"')
    assert "must be a CEL identifier" in found["spec.variables[0].name"]
    empty = causes(admin.post(POLICIES, json={"metadata": {"name": "empty"}, "spec": {}}))
    assert set(empty) == {"spec.matchConstraints", "spec.validations"}
    bindings = causes(admin.post(BINDINGS, json={"metadata": {"name": "b"},
                                                 "spec": {"validationActions": ["Deny", "Warn", "Shout"]}}))
    assert set(bindings) == {"spec.policyName", "spec.validationActions", "spec.validationActions[2]"}


def test_an_expression_too_deep_to_evaluate_is_refused_when_written(admin: httpx.Client) -> None:
    deep = "(" * 60 + "true" + ")" * 60
    found = causes(admin.post(POLICIES, json=policy("deep", [{"expression": deep}])))
    assert "levels deep, at most 250 are allowed" in found["spec.validations[0].expression"]
    deepest = "(" * 23 + "object.data.ok == 'yes'" + ")" * 23  # about as deep as allowed: it evaluates
    created(admin, POLICIES, policy("deepest", [{"expression": deepest}]))
    created(admin, BINDINGS, bind("deepest", "deepest"))
    assert admin.post(CONFIGMAPS, json=configmap("deep", ok="no")).status_code == 422
    assert admin.post(CONFIGMAPS, json=configmap("deep", ok="yes")).status_code == 201


def test_a_policy_with_too_much_cel_is_refused_before_it_is_parsed(admin: httpx.Client) -> None:
    long = " || ".join(["object.data.x == 'y'"] * 4000)
    response = admin.post(POLICIES, json=policy("long", [{"expression": long}]))
    assert response.status_code == 422
    (cause,) = response.json()["details"]["causes"]
    assert cause["field"] == "spec" and cause["message"].startswith("Too long: the CEL expressions of a policy may ")


@needs_kubectl
def test_kubectl_applies_the_shipped_policy_twice(apiserver: ApiServerHandle, tmp_path: Path) -> None:
    def kubectl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([KUBECTL, "--kubeconfig", apiserver.kubeconfig, "--cache-dir",
                               str(tmp_path / "cache"), *args], capture_output=True, text=True, timeout=60)

    first = kubectl("apply", "-f", str(SHIPPED_POLICY))
    assert first.returncode == 0, first.stderr
    assert first.stdout.split("\n")[0].endswith(f"{POLICY} created")
    changed = tmp_path / "policy.yaml"
    changed.write_text(SHIPPED_POLICY.read_text().replace("validationActions: [Deny]", "validationActions: [Warn]"))
    second = kubectl("apply", "-f", str(changed))
    assert second.returncode == 0, second.stderr
    assert f"validatingadmissionpolicybinding.admissionregistration.k8s.io/{POLICY} configured" in second.stdout
    shown = kubectl("get", "validatingadmissionpolicybinding", POLICY, "-o", "jsonpath={.spec.validationActions}")
    assert shown.stdout == '["Warn"]'


def test_admission_configuration_is_exempt_so_a_policy_refusing_everything_can_be_unbound(
        admin: httpx.Client) -> None:
    everything = {"resourceRules": [{"apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*", "*/*"],
                                     "operations": ["*"]}]}
    created(admin, POLICIES, policy("wall", [{"expression": "false", "message": "nothing passes"}],
                                    matchConstraints=everything))
    created(admin, BINDINGS, bind("wall", "wall"))
    assert admin.post(CONFIGMAPS, json=configmap("blocked")).json()["message"].endswith("nothing passes")
    assert admin.delete(f"{BINDINGS}/wall").status_code == 200
    assert admin.post(CONFIGMAPS, json=configmap("blocked")).status_code == 201
