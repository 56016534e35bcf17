"""The real kubectl explains the built-in and the tensor-fusion.ai/v1 kinds from the embedded API server's OpenAPI.

`kubectl explain` reads /openapi/v3, so this checks the whole path: for our kinds, attribute
docstrings in the models -> generated CRD -> API server -> what a user reads; for the built-in
kinds, Kubernetes' own definitions (tfusion/apiserver/kubeschemas.py) -> API server -> kubectl.
kubectl also reads OpenAPI to merge client-side `kubectl apply` by the schema's merge keys and to
learn that the server validates fields, and falls back to the protobuf /openapi/v2 in some paths:
those uses are checked here too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers.kubectl import Kubectl, needs_kubectl
from tfusion.api import crds
from tfusion.apiserver import kubeschemas

REPO = Path(__file__).resolve().parents[2]

pytestmark = needs_kubectl


@pytest.fixture
def kubectl(apiserver: Any, tmp_path: Path) -> Kubectl:
    client = Kubectl(apiserver.kubeconfig, tmp_path / "kubectl-cache")
    client("apply", "-f", str(REPO / "deploy" / "base" / "crds"))
    return client


def object_paths(schema: dict[str, Any], path: str) -> list[str]:
    """`path` and every object-valued field below it (list items included), as kubectl spells them."""
    found = [path] if schema.get("properties") else []
    item = schema.get("items") if schema.get("type") == "array" else schema
    for name, sub in (item or {}).get("properties", {}).items():
        found += object_paths(sub, f"{path}.{name}")
    return found


def test_capacity_config_fields_are_described(kubectl: Kubectl) -> None:
    out = kubectl.out("explain", "gpupool.spec.capacityConfig")
    assert "<empty>" not in out
    assert "FIELD: capacityConfig <Object>" in out
    assert "Capacity bounds, warm capacity and oversubscription." in out
    for field in ("maxResources", "minResources", "oversubscription", "warmResources"):
        assert f"  {field}\t<Object>" in out
    out = kubectl.out("explain", "gpupool.spec.capacityConfig.oversubscription.tflopsOversellRatio")
    assert "Default 500" in out and "<empty>" not in out


def test_workload_spec_recursive_and_every_object_below_it(kubectl: Kubectl) -> None:
    out = kubectl.out("explain", "tensorfusionworkload.spec", "--recursive")
    assert "<empty>" not in out
    assert "The GPU request; written by a user or by the webhook" in out
    for field in ("gangScheduling", "minMembers", "resources", "requests", "tflops", "vram", "nodeAffinity"):
        assert f"{field}\t<" in out, f"{field} missing from the recursive listing"
    schema: Any = crds.openapi_schema_view("TensorFusionWorkload")
    spec = schema["properties"]["spec"]
    for path in object_paths(spec, "tensorfusionworkload.spec"):
        out = kubectl.out("explain", path)
        assert "<empty>" not in out, f"kubectl explain {path} shows a field without description:\n{out}"
    tflops = kubectl.out("explain", "tensorfusionworkload.spec.resources.requests.tflops")
    assert "Kubernetes quantity such as 20 or 1500m" in tflops


def words(text: str) -> str:
    """`text` with its line breaks and indentation gone, as kubectl's wrapping is undone."""
    return " ".join(text.split())


def described(schema: dict[str, Any]) -> str:
    """The opening of a description as kubectl prints it (its start is enough to recognise it)."""
    return words(schema["description"])[:70]


def kube_field(group: str, version: str, kind: str, *path: str) -> dict[str, Any]:
    """The definition of a field of a built-in kind, following references, from the Kubernetes release served."""
    release = kubeschemas.load()
    schema = release.schema_for(group, version, kind)
    assert schema is not None
    for name in path:
        schema = release.resolve(schema.get("items", schema))["properties"][name]
    return schema


@pytest.mark.parametrize(
    ("path", "gvk", "fields", "header"),
    [
        ("pod.spec.containers", ("", "v1", "Pod", "spec", "containers"), ("image", "ports"),
         "FIELD: containers <[]Container>"),
        ("deployment.spec.strategy", ("apps", "v1", "Deployment", "spec", "strategy"), ("rollingUpdate", "type"),
         "FIELD: strategy <DeploymentStrategy>"),
        ("daemonset", ("apps", "v1", "DaemonSet"), ("spec", "status"), "KIND:       DaemonSet"),
        ("cronjob.spec", ("batch", "v1", "CronJob", "spec"), ("schedule", "jobTemplate"), "FIELD: spec <CronJobSpec>"),
        ("pdb.spec.maxUnavailable", ("policy", "v1", "PodDisruptionBudget", "spec", "maxUnavailable"), (),
         "FIELD: maxUnavailable <IntOrString>"),
    ],
)
def test_builtin_kinds_are_explained_from_the_kubernetes_definitions(
    kubectl: Kubectl, path: str, gvk: tuple[str, ...], fields: tuple[str, ...], header: str
) -> None:
    out = kubectl.out("explain", path)
    assert header in out and "<empty>" not in out, out
    schema = kube_field(*gvk)
    assert described(schema) in words(out), f"the description of {path} is missing:\n{out}"
    release = kubeschemas.load()
    below = release.resolve(schema.get("items", schema))
    for field in fields:
        assert f"  {field}\t<" in out, f"{field} is not listed under {path}"
        assert described(below["properties"][field]) in words(out)


def test_custom_resource_metadata_is_explained_as_object_meta(kubectl: Kubectl) -> None:
    out = kubectl.out("explain", "gpupool.metadata")
    assert "FIELD: metadata <ObjectMeta>" in out
    assert "Standard Kubernetes object metadata" in words(out), "the CRD's own description is kept"
    for field in ("labels", "annotations", "ownerReferences"):
        assert f"  {field}\t<" in out, f"{field} is not listed under gpupool.metadata"
    out = kubectl.out("explain", "gpupool.metadata.ownerReferences")
    assert described(kube_field("", "v1", "Pod", "metadata", "ownerReferences")) in words(out)


def test_a_kind_nobody_serves_is_refused_as_kubectl_refuses_it(kubectl: Kubectl, tmp_path: Path) -> None:
    result = kubectl("explain", "nosuchkind", check=False)
    assert result.returncode != 0
    assert 'the server doesn\'t have a resource type "nosuchkind"' in result.stderr
    manifest = tmp_path / "storageclass.yaml"
    manifest.write_text("apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: {name: fast}\nprovisioner: x\n")
    applied = kubectl("apply", "--validate=true", "-f", str(manifest), check=False)
    assert applied.returncode != 0
    assert 'no matches for kind "StorageClass" in version "storage.k8s.io/v1"' in applied.stderr, applied.stderr


def test_the_protobuf_v2_document_parses_and_explains(kubectl: Kubectl) -> None:
    # kubectl's own parser refuses the whole document on one dangling reference or a two-typed schema
    out = kubectl.out("explain", "pod.spec.containers", "--output=plaintext-openapiv2")
    assert "RESOURCE: containers <[]Object>" in out
    assert described(kube_field("", "v1", "Pod", "spec", "containers")) in words(out)
    out = kubectl.out("explain", "crd.spec.versions.schema.openAPIV3Schema", "--output=plaintext-openapiv2")
    assert "RESOURCE: openAPIV3Schema <Object>" in out


DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - {name: main, image: nginx, env: [{name: MODE, value: "%s"}]}
      - {name: side, image: busybox}
"""


def test_client_side_apply_merges_by_the_v3_schema(kubectl: Kubectl, tmp_path: Path) -> None:
    manifest = tmp_path / "deployment.yaml"
    manifest.write_text(DEPLOYMENT % "first")
    kubectl.out("apply", "-f", str(manifest))
    manifest.write_text(DEPLOYMENT % "second")
    # -v=8 logs each request with its headers, and why kubectl would leave the v3 document for the v2 one
    applied = kubectl("-v=8", "apply", "-f", str(manifest), check=False)
    assert applied.returncode == 0, applied.stderr
    assert "does not support strategic merge patch" not in applied.stderr
    assert "/openapi/v2" not in applied.stderr, "kubectl fell back to /openapi/v2 to build its patch"
    assert "Content-Type: application/strategic-merge-patch+json" in applied.stderr
    assert '$setElementOrder/containers' in applied.stderr, "the patch was not built from the merge keys"
    containers = kubectl.out("get", "deployment", "web", "-o", "jsonpath={.spec.template.spec.containers[*].env}")
    assert "second" in containers and "first" not in containers
