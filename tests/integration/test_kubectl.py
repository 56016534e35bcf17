"""The real kubectl (1.32) against the embedded API server: apply, get with printer columns, status
patches, deletion with a finalizer, and watching."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.kubectl import Kubectl, needs_kubectl

REPO = Path(__file__).resolve().parents[2]

pytestmark = needs_kubectl


@pytest.fixture
def kubectl(apiserver: Any, tmp_path: Path) -> Kubectl:
    return Kubectl(apiserver.kubeconfig, tmp_path / "kubectl-cache")


@pytest.fixture
def crd_dir(tmp_path: Path) -> Path:
    shipped = REPO / "deploy" / "base" / "crds"
    if shipped.is_dir() and any(shipped.glob("*.yaml")):
        return shipped
    try:
        from tfusion.api.crds import all_crds
    except ImportError:
        pytest.skip("deploy/base/crds is missing and tfusion.api.crds is not available")
    out = tmp_path / "crds"
    out.mkdir()
    crd: Any
    for crd in all_crds():
        (out / f"{crd['metadata']['name']}.yaml").write_text(yaml.safe_dump(dict(crd)))
    return out


def _table(output: str) -> tuple[list[str], list[str]]:
    lines = [line for line in output.splitlines() if line.strip()]
    return lines[0].split(), lines[1:]


def test_apply_crds_and_samples_then_get(kubectl: Kubectl, crd_dir: Path) -> None:
    applied = kubectl("apply", "-f", str(crd_dir))
    assert "customresourcedefinition.apiextensions.k8s.io/gpus.tensor-fusion.ai created" in applied.stdout
    again = kubectl("apply", "-f", str(crd_dir))
    assert "unchanged" in again.stdout or "configured" in again.stdout
    samples = REPO / "deploy" / "samples"
    if not samples.is_dir():
        pytest.skip("deploy/samples is not there yet")
    for path in samples.glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            namespace = (doc or {}).get("metadata", {}).get("namespace")
            if namespace and namespace != "default":
                kubectl("create", "namespace", namespace, check=False)
                kubectl(
                    "apply",
                    "-f",
                    "-",
                    input=json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}),
                )
    result = kubectl("apply", "-f", str(samples))
    assert "gpupool.tensor-fusion.ai/tensor-fusion-h100 created" in result.stdout
    assert "configured" not in result.stdout
    reapplied = kubectl("apply", "-f", str(samples))
    assert "unchanged" in reapplied.stdout
    header, rows = _table(kubectl("get", "gpupools").stdout)
    assert header[:2] == ["NAME", "PHASE"] and "MODE" in header and "AGE" in header
    assert any(row.startswith("tensor-fusion-h100") and "AutoSelect" in row for row in rows)
    header, rows = _table(kubectl("get", "gpus").stdout)
    assert header[0] == "NAME" and len(header) > 2 and len(rows) >= 1
    # the Node column reads one key of the nodeSelector map (a JSONPath with an escaped dot)
    sample_gpu = yaml.safe_load((samples / "gpu.yaml").read_text())
    name, status = sample_gpu["metadata"]["name"], sample_gpu["status"]
    kubectl("patch", "gpu", name, "--subresource=status", "--type=merge", "-p", json.dumps({"status": status}))
    header, rows = _table(kubectl("get", "gpus").stdout)
    node = status["nodeSelector"]["kubernetes.io/hostname"]
    assert "NODE" in header and any(row.startswith(name) and row.split()[-2] == node for row in rows), rows
    as_json = json.loads(kubectl("get", "gpupool", "tensor-fusion-h100", "-o", "json").stdout)
    assert as_json["kind"] == "GPUPool"
    assert "kubectl.kubernetes.io/last-applied-configuration" in as_json["metadata"]["annotations"]


def _widget_crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "gadgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Cluster",
            "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [{"name": "Phase", "type": "string", "jsonPath": ".status.phase"}],
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {"type": "object", "properties": {"size": {"type": "integer"}}},
                                "status": {"type": "object", "properties": {"phase": {"type": "string"}}},
                            },
                        }
                    },
                }
            ],
        },
    }


def test_status_patch_finalizer_delete_and_validation(kubectl: Kubectl) -> None:
    kubectl("apply", "-f", "-", input=json.dumps(_widget_crd()))
    gadget = {
        "apiVersion": "example.com/v1",
        "kind": "Gadget",
        "metadata": {"name": "g1", "finalizers": ["example.com/keep"]},
        "spec": {"size": 1},
    }
    kubectl("apply", "-f", "-", input=json.dumps(gadget))
    kubectl("patch", "gadget", "g1", "--subresource=status", "--type=merge", "-p", '{"status":{"phase":"Ready"}}')
    header, rows = _table(kubectl("get", "gadgets").stdout)
    assert header[:2] == ["NAME", "PHASE"] and rows[0].split()[:2] == ["g1", "Ready"]
    invalid = kubectl(
        "apply",
        "-f",
        "-",
        check=False,
        input=json.dumps({**gadget, "metadata": {"name": "g2"}, "spec": {"size": "big"}}),
    )
    assert invalid.returncode != 0 and "spec.size" in invalid.stderr
    deleted = kubectl("delete", "gadget", "g1", "--wait=false")
    assert 'gadget.example.com "g1" deleted' in deleted.stdout
    still = json.loads(kubectl("get", "gadget", "g1", "-o", "json").stdout)
    assert still["metadata"]["deletionTimestamp"]
    kubectl("patch", "gadget", "g1", "--type=json", "-p", '[{"op":"remove","path":"/metadata/finalizers"}]')
    gone = kubectl("get", "gadget", "g1", check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr


def test_get_watch_streams_changes(kubectl: Kubectl) -> None:
    kubectl("create", "namespace", "watched", check=False)
    kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "first", "namespace": "default"}}
        ),
    )
    watcher = subprocess.Popen(
        [*kubectl.base, "get", "configmaps", "--watch", "--request-timeout=20s"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert watcher.stdout is not None
        header = watcher.stdout.readline()
        assert header.split()[:2] == ["NAME", "DATA"]
        assert watcher.stdout.readline().split()[0] == "first"
        time.sleep(0.3)
        kubectl(
            "apply",
            "-f",
            "-",
            input=json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": "second", "namespace": "default"},
                    "data": {"a": "b"},
                }
            ),
        )
        line = watcher.stdout.readline()
        assert line.split()[:2] == ["second", "1"], line
    finally:
        watcher.kill()
        watcher.communicate(timeout=10)


def test_discovery_and_basic_commands(kubectl: Kubectl) -> None:
    version = json.loads(kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["minor"] == "32"
    resources = kubectl("api-resources").stdout
    assert "leases" in resources and "customresourcedefinitions" in resources
    namespaces = kubectl("get", "namespaces").stdout
    assert "tensor-fusion-sys" in namespaces and "Active" in namespaces
    kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "labelled", "labels": {"app": "x"}}}
        ),
    )
    kubectl("label", "configmap", "labelled", "tier=web")
    assert "labelled" in kubectl("get", "cm", "-l", "tier=web,app=x").stdout
    kubectl("delete", "cm", "labelled")
    assert "No resources found" in kubectl("get", "cm", "-l", "app=x").stderr


def test_typed_create_commands_sending_protobuf(kubectl: Kubectl) -> None:
    """kubectl's generators send protobuf bodies for built-in kinds; the server reads these."""
    assert "namespace/team-a created" in kubectl("create", "namespace", "team-a").stdout
    kubectl("create", "configmap", "settings", "--from-literal=mode=fast", "-n", "team-a")
    kubectl("create", "secret", "generic", "creds", "--from-literal=password=hunter2", "-n", "team-a")
    kubectl("create", "serviceaccount", "robot", "-n", "team-a")
    configmap = json.loads(kubectl("get", "configmap", "settings", "-n", "team-a", "-o", "json").stdout)
    assert configmap["data"] == {"mode": "fast"}
    secret = json.loads(kubectl("get", "secret", "creds", "-n", "team-a", "-o", "json").stdout)
    assert secret["data"] == {"password": "aHVudGVyMg=="} and secret["type"] == "Opaque"
    token = kubectl("create", "token", "robot", "-n", "team-a").stdout.strip()
    assert token.count(".") == 2
    namespace = json.loads(kubectl("get", "namespace", "team-a", "-o", "json").stdout)
    assert namespace["status"]["phase"] == "Active" and "generateName" not in namespace["metadata"]
    unsupported = kubectl("create", "priorityclass", "high", "--value=1000", check=False)
    assert unsupported.returncode != 0 and "application/json" in unsupported.stderr


def test_apply_rejects_unknown_fields_like_kube(kubectl: Kubectl) -> None:
    kubectl("apply", "-f", "-", input=json.dumps(_widget_crd()))
    bad = {"apiVersion": "example.com/v1", "kind": "Gadget", "metadata": {"name": "g"}, "spec": {"sizee": 1}}
    result = kubectl("apply", "-f", "-", input=json.dumps(bad), check=False)
    assert result.returncode != 0 and 'unknown field "spec.sizee"' in result.stderr


def test_apply_rejects_unknown_fields_of_built_in_kinds(kubectl: Kubectl) -> None:
    """kubectl asks for fieldValidation=Strict; a built-in kind's undeclared fields are named as kube
    names them (from the Kubernetes definitions), on create and on a later patch alike."""
    deployment: dict[str, Any] = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "c", "image": "nginx", "bogus": 1}]}}},
    }
    refused = kubectl("apply", "-f", "-", input=json.dumps(deployment), check=False)
    assert refused.returncode != 0
    assert 'unknown field "spec.template.spec.containers[0].bogus"' in refused.stderr, refused.stderr
    del deployment["spec"]["template"]["spec"]["containers"][0]["bogus"]
    kubectl("apply", "-f", "-", input=json.dumps(deployment))
    deployment["spec"]["replicass"] = 2
    again = kubectl("apply", "-f", "-", input=json.dumps(deployment), check=False)
    assert again.returncode != 0 and 'unknown field "spec.replicass"' in again.stderr, again.stderr
