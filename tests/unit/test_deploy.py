"""deploy/ is one kustomize tree that installs: every overlay renders with `kubectl kustomize`, every
built-in object validates against the Kubernetes schemas of a current release (kubernetes-validate,
strict: unknown fields fail), every tensor-fusion.ai object against our CRDs, no Role or ClusterRole
has a wildcard, and the shipped RBAC, read by our own authorizer, grants what the controller and the
hypervisor do and not more than they need of Secrets."""

from __future__ import annotations

import copy

import pytest
import yaml

from tests.helpers.deploy import DEPLOY, REPO, Doc, by_key, rendered
from tests.helpers.kubectl import needs_kubectl
from tfusion.api import crds
from tfusion.api.annotations import priority_class_name
from tfusion.api.schema import apply_defaults, prune, unknown_fields, validate
from tfusion.apiserver import rbac

OVERLAYS = ("builtin-scheduler", "kube-scheduler", "defaults")
NAMESPACE = "tensor-fusion-sys"
CONTROLLER_SA = rbac.service_account_user(NAMESPACE, "tensor-fusion-operator")
HYPERVISOR_SA = rbac.service_account_user(NAMESPACE, "tensor-fusion-hypervisor-sa")
RBAC_KINDS = ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")

pytestmark = needs_kubectl


def is_ours(doc: Doc) -> bool:
    return str(doc.get("apiVersion", "")).startswith("tensor-fusion.ai/")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_renders(overlay: str) -> None:
    assert rendered(overlay)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_built_in_objects_validate_against_the_kubernetes_schemas(overlay: str) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    version = kubernetes_validate.latest_version()
    checked = 0
    for doc in rendered(overlay):
        if is_ours(doc):
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']}: {exc.message} at {list(exc.path)}")
        checked += 1
    assert checked or overlay == "defaults"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_tensor_fusion_objects_validate_against_our_crds(overlay: str) -> None:
    for doc in (d for d in rendered(overlay) if is_ours(d)):
        schema = crds.openapi_schema(doc["kind"])
        obj = copy.deepcopy(doc)
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        assert unknown_fields(schema, obj) == [], f"{where}: fields the CRD does not know would be pruned"
        apply_defaults(schema, prune(schema, obj))
        assert validate(schema, obj) == [], where


def test_the_defaults_are_the_charts_three_objects() -> None:
    found = {(kind, name) for kind, name in by_key("defaults")}
    assert found == {("TensorFusionCluster", "tensor-fusion"), ("ProviderConfig", "nvidia-provider"),
                     ("SchedulingConfigTemplate", "tf-scheduling-config")}
    cluster = by_key("defaults")[("TensorFusionCluster", "tensor-fusion")]
    (pool,) = cluster["spec"]["gpuPools"]
    assert pool["name"] == "shared" and pool["isDefault"] is True
    assert pool["specTemplate"]["schedulingConfigTemplate"] == "tf-scheduling-config"
    endpoint = pool["specTemplate"]["componentConfig"]["client"]["operatorEndpoint"]
    service = by_key("builtin-scheduler")[("Service", "tensor-fusion-controller")]
    assert endpoint == f"http://tensor-fusion-controller.{NAMESPACE}.svc:{service['spec']['ports'][0]['port']}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_role_has_a_wildcard(overlay: str) -> None:
    for doc in rendered(overlay):
        if doc["kind"] not in ("Role", "ClusterRole"):
            continue
        for rule in doc.get("rules") or []:
            for key in ("verbs", "apiGroups", "resources", "nonResourceURLs"):
                assert not any("*" in value for value in rule.get(key) or []), \
                    f"{doc['kind']}/{doc['metadata']['name']}: wildcard in {key}: {rule}"


def test_the_base_ships_every_generated_crd_and_nothing_else() -> None:
    shipped = {d["metadata"]["name"] for d in rendered("builtin-scheduler") if d["kind"] == "CustomResourceDefinition"}
    generated: list[Doc] = crds.all_crds()
    assert shipped == {crd["metadata"]["name"] for crd in generated}
    listed = yaml.safe_load((DEPLOY / "base" / "kustomization.yaml").read_text())["resources"]
    assert sorted(p for p in listed if p.startswith("crds/")) == \
        sorted(f"crds/{p.name}" for p in (DEPLOY / "base" / "crds").glob("*.yaml"))


@pytest.mark.parametrize("overlay", ("builtin-scheduler", "kube-scheduler"))
def test_image_and_namespace_come_from_the_base(overlay: str) -> None:
    base = yaml.safe_load((DEPLOY / "base" / "kustomization.yaml").read_text())
    (image,) = base["images"]
    wanted = f"{image['newName']}:{image['newTag']}"
    ours = [c["image"] for d in rendered(overlay) if d["kind"] in ("Deployment", "DaemonSet")
            for c in d["spec"]["template"]["spec"]["containers"] if "kube-scheduler" not in c["image"]]
    assert ours and set(ours) == {wanted}
    assert base["namespace"] == NAMESPACE
    for doc in rendered(overlay):
        namespace = doc["metadata"].get("namespace")
        if namespace is not None and doc["kind"] != "RoleBinding":
            assert namespace == NAMESPACE, f"{doc['kind']}/{doc['metadata']['name']}"
        for subject in doc.get("subjects") or []:
            assert subject.get("namespace") == NAMESPACE


def test_the_controller_deployment_is_hardened_and_elects_a_leader() -> None:
    deployment = by_key("builtin-scheduler")[("Deployment", "tensor-fusion-controller")]
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "tensor-fusion-operator"
    assert pod["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["containers"]
    assert "--leader-elect" in container["args"] and "--role=controller" in container["args"]
    assert "--scheduler=builtin" in container["args"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert set(container["resources"]["requests"]) == {"cpu", "memory"}
    assert set(container["resources"]["limits"]) == {"cpu", "memory"}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8080, "probes": 8081, "webhook": 9443}
    assert "--health-probe-bind-address=:8081" in container["args"]
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        assert container[probe]["httpGet"] == {"path": path, "port": "probes"}
    extender = by_key("kube-scheduler")[("Deployment", "tensor-fusion-controller")]
    assert "--scheduler=extender" in extender["spec"]["template"]["spec"]["containers"][0]["args"]


def test_the_services_and_the_network_policy() -> None:
    docs = by_key("builtin-scheduler")
    api = docs[("Service", "tensor-fusion-controller")]["spec"]
    assert api["type"] == "ClusterIP" and [(p["port"], p["targetPort"]) for p in api["ports"]] == [(8080, 8080)]
    webhook = docs[("Service", "tensor-fusion-webhook")]["spec"]
    assert [(p["port"], p["targetPort"]) for p in webhook["ports"]] == [(443, 9443)]
    labels = docs[("Deployment", "tensor-fusion-controller")]["spec"]["template"]["metadata"]["labels"]
    for spec in (api, webhook):
        assert spec["selector"].items() <= labels.items()
    policy = docs[("NetworkPolicy", "tensor-fusion-controller")]["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= labels.items()
    api_rule = next(r for r in policy["ingress"] if {"port": 8080, "protocol": "TCP"} in r["ports"])
    assert len(api_rule["from"]) == 3, "only GPU pods, the other replicas and the kube-scheduler"


def test_the_priority_classes_are_those_the_webhook_names() -> None:
    classes = {name: d["value"] for (kind, name), d in by_key("builtin-scheduler").items() if kind == "PriorityClass"}
    assert classes == {priority_class_name("critical"): 100000, priority_class_name("high"): 10000,
                       priority_class_name("medium"): 0}


def test_the_hypervisor_daemonset_has_nvml_shm_and_device_plugin_paths() -> None:
    daemonset = by_key("builtin-scheduler")[("DaemonSet", "tensor-fusion-hypervisor")]
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "tensor-fusion-hypervisor-sa"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert {"/run/tensor-fusion", "/run/nvidia/driver", "/var/lib/kubelet/device-plugins"} <= mounts


# --- the shipped RBAC, read by the embedded API server's authorizer -----------------------------------
def policy(overlay: str = "builtin-scheduler") -> rbac.PolicyIndex:
    docs = rendered(overlay)

    def of(kind: str) -> list[Doc]:
        return [d for d in docs if d["kind"] == kind]

    return rbac.PolicyIndex(of("Role"), of("ClusterRole"), of("RoleBinding"), of("ClusterRoleBinding"))


def can(index: rbac.PolicyIndex, user: str, verb: str, resource: str, *, group: str = "", namespace: str = "",
        name: str = "") -> bool:
    account = rbac.split_service_account(user)
    assert account is not None
    groups = (rbac.SERVICE_ACCOUNTS_GROUP, f"{rbac.SERVICE_ACCOUNTS_GROUP}:{account[0]}", rbac.AUTHENTICATED)
    resource, _, subresource = resource.partition("/")
    attributes = rbac.Attributes(rbac.UserInfo(user, groups=groups), verb, True, api_group=group, resource=resource,
                                 subresource=subresource, namespace=namespace, name=name)
    return index.allows(attributes)


@pytest.mark.parametrize(("verb", "resource", "group", "namespace", "name"), [
    ("create", "pods/binding", "", "ml", "p"),
    ("patch", "pods/status", "", "ml", "p"),
    ("create", "pods/eviction", "", "ml", "p"),
    ("watch", "poddisruptionbudgets", "policy", "ml", ""),
    ("delete", "pods", "", "ml", "worker"),
    ("patch", "nodes", "", "", "n1"),
    ("create", "events", "", "ml", ""),
    ("update", "leases", "coordination.k8s.io", NAMESPACE, "85104305.tensor-fusion.ai"),
    ("patch", "configmaps", "", NAMESPACE, "tensor-fusion-operator-leader-info"),
    ("get", "secrets", "", NAMESPACE, "tensor-fusion-webhook-certs"),
    ("update", "mutatingwebhookconfigurations", "admissionregistration.k8s.io", "", "tensor-fusion-pod-webhook"),
    ("create", "tokenreviews", "authentication.k8s.io", "", ""),
    ("get", "replicasets", "apps", "ml", "web-1"),
    ("patch", "jobs", "batch", "ml", "nightly-28000"),
    ("create", "tensorfusionconnections", "tensor-fusion.ai", "ml", ""),
    ("patch", "tensorfusionconnections/status", "tensor-fusion.ai", "ml", "c"),
    ("patch", "gpus/status", "tensor-fusion.ai", "", "gpu-1"),
    ("watch", "gpuresourcequotas", "tensor-fusion.ai", "", ""),
])
def test_the_controller_may(verb: str, resource: str, group: str, namespace: str, name: str) -> None:
    assert can(policy(), CONTROLLER_SA, verb, resource, group=group, namespace=namespace, name=name)


@pytest.mark.parametrize(("verb", "resource", "namespace", "name"), [
    ("get", "secrets", NAMESPACE, "someone-elses"),
    ("list", "secrets", "ml", ""),
    ("update", "leases", "kube-system", "kube-scheduler"),
    ("create", "serviceaccounts/token", "ml", "default"),
    ("delete", "namespaces", "", "ml"),
])
def test_the_controller_may_not(verb: str, resource: str, namespace: str, name: str) -> None:
    assert not can(policy(), CONTROLLER_SA, verb, resource, namespace=namespace, name=name)


@pytest.mark.parametrize(("verb", "resource", "group"), [
    ("patch", "deployments", "apps"), ("get", "deployments", "apps"), ("patch", "daemonsets", "apps"),
    ("patch", "cronjobs", "batch"), ("watch", "replicasets", "apps"), ("patch", "gpus", "tensor-fusion.ai"),
    ("delete", "workloadprofiles", "tensor-fusion.ai"),
])
def test_the_controller_touches_no_workload_kind_it_does_not_call(verb: str, resource: str, group: str) -> None:
    assert not can(policy(), CONTROLLER_SA, verb, resource, group=group, namespace="ml", name="x")


def test_the_hypervisor_reports_gpus_and_reads_the_rest() -> None:
    index = policy()
    tf = "tensor-fusion.ai"
    assert can(index, HYPERVISOR_SA, "create", "gpus", group=tf)
    assert can(index, HYPERVISOR_SA, "patch", "gpus/status", group=tf, name="g")
    assert can(index, HYPERVISOR_SA, "patch", "gpunodes/status", group=tf, name="n")
    assert can(index, HYPERVISOR_SA, "watch", "pods", namespace="ml")
    assert not can(index, HYPERVISOR_SA, "get", "nodes", name="n")
    assert can(index, HYPERVISOR_SA, "create", "events", namespace="ml")
    assert not can(index, HYPERVISOR_SA, "delete", "gpunodes", group=tf, name="n")
    assert not can(index, HYPERVISOR_SA, "patch", "pods", namespace="ml", name="p")
    assert not can(index, HYPERVISOR_SA, "get", "secrets", namespace=NAMESPACE, name="tensor-fusion-webhook-certs")


def test_the_containerfile_runs_every_role_as_non_root() -> None:
    lines = [line.strip() for line in (REPO / "Containerfile").read_text().splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    final_stage = lines[max(i for i, line in enumerate(lines) if line.startswith("FROM ")):]
    user = next(line for line in reversed(final_stage) if line.startswith("USER "))
    assert user.split()[1].split(":")[0] not in ("0", "root")
    assert 'ENTRYPOINT ["tfusion"]' in final_stage
    installs = " ".join(line for line in lines if "pip install" in line)
    # runtime dependencies and the aws extra (boto3: Provisioned pools on EC2), no dev tools
    assert "--prefix=/install '.[aws]'" in installs and "dev" not in installs, "runtime dependencies only"
    # the Deployment and the DaemonSet run this image (named tfusion, set once in the base)
    for kind, name in (("Deployment", "tensor-fusion-controller"), ("DaemonSet", "tensor-fusion-hypervisor")):
        (container,) = by_key("builtin-scheduler")[(kind, name)]["spec"]["template"]["spec"]["containers"]
        assert container["image"].split(":")[0] == "tfusion"
        assert any(arg.startswith("--role=") for arg in container["args"])
