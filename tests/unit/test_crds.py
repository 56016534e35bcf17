"""The generated CRDs: deploy/base/crds is up to date, and every CRD is structurally sound."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tfusion import cli
from tfusion.api import crds
from tfusion.api.schema import iter_schema_paths, validate
from tfusion.api.schema import subschema as _subschema
from tfusion.api.types import KINDS

REPO = Path(__file__).resolve().parents[2]
DEPLOY_CRDS = REPO / "deploy" / "base" / "crds"

#: short names of built-in Kubernetes resources (kubectl api-resources), which ours must not shadow
CORE_SHORT_NAMES = {
    "cs", "cm", "ep", "ev", "limits", "ns", "no", "pvc", "pv", "po", "rc", "quota", "sa", "svc", "crd", "crds",
    "ds", "deploy", "rs", "sts", "hpa", "cj", "csr", "ing", "netpol", "pdb", "pc", "sc", "eps", "sp",
}


def _without_description(node: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in node.items() if key != "description"}


def subschema(schema: dict[str, Any], path: str) -> dict[str, Any]:
    """The schema at `path` minus its description (tested on its own below)."""
    found = _subschema(schema, path)
    assert found is not None, path
    return _without_description(found)


def test_deploy_crds_match_the_models_byte_for_byte(tmp_path: Path) -> None:
    written = crds.write_crds(tmp_path)
    assert sorted(p.name for p in written) == sorted(p.name for p in DEPLOY_CRDS.glob("*.yaml")), (
        "deploy/base/crds has other files than the generator writes; run `tfusion crds --out deploy/base/crds`")
    for path in written:
        assert path.read_bytes() == (DEPLOY_CRDS / path.name).read_bytes(), (
            f"deploy/base/crds/{path.name} is stale; run `tfusion crds --out deploy/base/crds`")


def test_generation_is_deterministic() -> None:
    assert crds.crds_yaml() == crds.crds_yaml()


def test_cli_prints_the_stream_and_writes_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["crds"]) == 0
    printed = capsys.readouterr().out
    docs = list(yaml.safe_load_all(printed))
    assert docs == crds.all_crds()
    assert [d["spec"]["names"]["kind"] for d in docs] == list(KINDS)
    assert cli.main(["crds", "--out", str(tmp_path / "out")]) == 0
    assert len(list((tmp_path / "out").glob("tensor-fusion.ai_*.yaml"))) == 12


@pytest.mark.parametrize("kind", list(KINDS))
def test_crd_names_scope_versions_and_subresources(kind: str) -> None:
    info = KINDS[kind]
    crd: Any = crds.crd_for(kind)
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["kind"] == "CustomResourceDefinition"
    assert crd["metadata"]["name"] == f"{info.plural}.tensor-fusion.ai"
    spec = crd["spec"]
    assert spec["group"] == "tensor-fusion.ai"
    assert spec["scope"] == ("Namespaced" if info.namespaced else "Cluster")
    names = spec["names"]
    assert names["kind"] == kind and names["listKind"] == f"{kind}List"
    assert names["plural"] == info.plural and names["singular"] == kind.lower()
    assert names.get("shortNames", []) == list(info.short_names)
    [version] = spec["versions"]
    assert version["name"] == "v1" and version["served"] is True and version["storage"] is True
    assert ("subresources" in version) == info.has_status
    if info.has_status:
        assert version["subresources"] == {"status": {}}
        assert "status" in version["schema"]["openAPIV3Schema"]["properties"]


def test_scopes_and_short_names() -> None:
    docs: dict[str, Any] = {kind: crds.crd_for(kind) for kind in KINDS}
    scopes = {kind: docs[kind]["spec"]["scope"] for kind in KINDS}
    assert {k for k, s in scopes.items() if s == "Namespaced"} == {
        "GPUResourceQuota", "TensorFusionWorkload", "WorkloadProfile", "TensorFusionConnection"}
    short = {kind: docs[kind]["spec"]["names"].get("shortNames", []) for kind in KINDS}
    assert short == {
        "TensorFusionCluster": ["tfc"], "GPUPool": ["gp"], "GPUNode": ["gn"], "GPU": [], "GPUNodeClass": ["gnc"],
        "GPUNodeClaim": ["gnclaim"], "SchedulingConfigTemplate": ["sct"], "GPUResourceQuota": ["gq"],
        "ProviderConfig": ["tfpc"], "TensorFusionWorkload": ["tfw"], "WorkloadProfile": ["wp"],
        "TensorFusionConnection": ["tfconn"]}
    every = [name for names in short.values() for name in names]
    assert len(every) == len(set(every))
    assert not set(every) & CORE_SHORT_NAMES


@pytest.mark.parametrize("kind", list(KINDS))
def test_printer_columns_point_at_fields_of_the_schema(kind: str) -> None:
    crd: Any = crds.crd_for(kind)
    [version] = crd["spec"]["versions"]
    schema = version["schema"]["openAPIV3Schema"]
    for column in version.get("additionalPrinterColumns", []):
        sub = subschema(schema, column["jsonPath"])
        assert sub is not None, f"{kind} column {column['name']!r}: {column['jsonPath']} is not in the schema"
        if column["type"] == "integer":
            assert sub.get("type") == "integer", column
        if column["type"] == "boolean":
            assert sub.get("type") == "boolean", column
        if column["type"] == "date":
            assert column["jsonPath"] == ".metadata.creationTimestamp" or sub.get("format") == "date-time"


def test_the_originals_broken_printer_paths_are_fixed() -> None:
    def paths(kind: str) -> dict[str, str]:
        crd: Any = crds.crd_for(kind)
        [version] = crd["spec"]["versions"]
        return {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}

    assert paths("GPUPool")["Mode"] == ".spec.nodeManagerConfig.provisioningMode"
    assert paths("SchedulingConfigTemplate")["Allow Local GPU"] == ".spec.placement.allowUsingLocalGPU"
    assert paths("GPUResourceQuota")["Requests TFlops Used"] == ".status.used.requests.tflops"
    schema = crds.openapi_schema("GPUPool")
    assert _subschema(schema, ".status.mode") is None  # the original's path really is broken


def all_nodes() -> list[tuple[str, str, dict[str, Any]]]:
    return [(kind, path, node) for kind in KINDS
            for path, node in iter_schema_paths(crds.openapi_schema(kind))]


def test_schemas_are_structural() -> None:
    for kind, path, node in all_nodes():
        where = f"{kind} {path}"
        free = node.get("x-kubernetes-preserve-unknown-fields") or node.get("x-kubernetes-int-or-string")
        assert "type" in node or free, f"{where} has no type"
        assert not ("properties" in node and "additionalProperties" in node), where
        if "anyOf" in node:
            assert node.get("x-kubernetes-int-or-string"), f"{where}: anyOf is only used for int-or-string"
        if "enum" in node:
            assert node["enum"] and all(isinstance(v, str) for v in node["enum"]), where
        if "default" in node:
            assert validate(node, node["default"]) == [], f"{where}: default does not fit its own schema"
        for name in node.get("required", []):
            assert name in node.get("properties", {}), f"{where}: required {name} is not a property"


def test_every_quantity_is_int_or_string_as_controller_gen_emits_it() -> None:
    quantities = [(kind, path, node) for kind, path, node in all_nodes() if node.get("x-kubernetes-int-or-string")]
    assert len(quantities) > 50
    for kind, path, node in quantities:
        assert _without_description(node) == {
            "anyOf": [{"type": "integer"}, {"type": "string"}], "pattern": crds.QUANTITY_PATTERN,
                        "x-kubernetes-int-or-string": True}, f"{kind} {path}"
    expected = {
        ("GPU", "status.capacity.tflops"), ("GPU", "status.available.vram"),
        ("GPUPool", "spec.capacityConfig.minResources.tflops"), ("GPUPool", "status.totalVRAM"),
        ("GPUNode", "status.availableTFlops"), ("GPUNodeClaim", "spec.vramOffered"),
        ("TensorFusionWorkload", "spec.resources.requests.compute"),
        ("GPUResourceQuota", "spec.single.defaultLimits.vram"),
        ("ProviderConfig", "spec.hardwareMetadata[*].fp16TFlops"),
        ("TensorFusionCluster", "spec.gpuPools[*].specTemplate.capacityConfig.warmResources.memory"),
    }
    assert expected <= {(kind, path) for kind, path, _ in quantities}


def test_raw_extensions_preserve_unknown_fields() -> None:
    pool = crds.openapi_schema("GPUPool")
    for path in ("spec.componentConfig.worker.podTemplate", "spec.componentConfig.client.patchToPod"):
        assert subschema(pool, path) == {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    workload = crds.openapi_schema("TensorFusionWorkload")
    assert subschema(workload, "spec.workerPodTemplate") == {
        "type": "object", "x-kubernetes-preserve-unknown-fields": True}


def test_enums_defaults_bounds_and_required_fields() -> None:
    pool: Any = crds.openapi_schema("GPUPool")
    mode = subschema(pool, "spec.nodeManagerConfig.provisioningMode")
    assert mode == {"default": "AutoSelect", "enum": ["Provisioned", "AutoSelect", "Karpenter"], "type": "string"}
    assert subschema(pool, "spec.capacityConfig.oversubscription.tflopsOversellRatio") == {
        "default": 500, "format": "int32", "maximum": 100000, "minimum": 100, "type": "integer"}
    assert pool["properties"]["spec"]["required"] == ["nodeManagerConfig"]
    assert pool["properties"]["status"]["required"] == [
        "availableTFlops", "availableVRAM", "componentStatus", "notReadyNodes", "phase", "readyNodes",
        "totalTFlops", "totalVRAM", "virtualTFlops", "virtualVRAM"]
    gpu: Any = crds.openapi_schema("GPU")
    assert gpu["properties"]["status"]["required"] == [
        "available", "capacity", "gpuModel", "message", "nodeSelector", "phase", "uuid", "vendor"]
    assert subschema(gpu, "status.vendor") == {"default": "NVIDIA", "type": "string"}
    workload = crds.openapi_schema("TensorFusionWorkload")
    assert subschema(workload, "spec.gpuCount") == {"format": "int32", "maximum": 128, "minimum": 1, "type": "integer"}
    assert subschema(workload, "spec.isolation") == {
        "default": "soft", "enum": ["shared", "soft", "hard", "partitioned"], "type": "string"}
    cluster = crds.openapi_schema("TensorFusionCluster")
    assert subschema(cluster, "status.retryCount") == {"default": 0, "format": "int64", "type": "integer"}
    sct = crds.openapi_schema("SchedulingConfigTemplate")
    assert subschema(sct, "spec.placement.allowUsingLocalGPU") == {"default": True, "type": "boolean"}
    assert subschema(sct, "spec")["required"] == ["placement"]
    conn: Any = crds.openapi_schema("TensorFusionConnection")
    assert conn["properties"]["status"]["required"] == ["connectionURL", "phase", "workerName"]


def _undescribed(schema: dict[str, Any], path: str) -> list[str]:
    """Every property below `schema` (list items and map values included) without a description."""
    missing = []
    for name, sub in schema.get("properties", {}).items():
        if not str(sub.get("description", "")).strip():
            missing.append(f"{path}.{name}")
        missing += _undescribed(sub, f"{path}.{name}")
    for key, suffix in (("items", "[]"), ("additionalProperties", "{}")):
        if isinstance(schema.get(key), dict):
            missing += _undescribed(schema[key], path + suffix)
    return missing


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_property_has_a_description(kind: str) -> None:
    schema = crds.openapi_schema(kind)
    assert schema.get("description"), f"{kind} has no top-level description"
    assert _undescribed(schema, kind) == []


def test_descriptions_come_from_attribute_docstrings() -> None:
    workload = crds.openapi_schema("TensorFusionWorkload")
    tflops = _subschema(workload, "spec.resources.requests.tflops") or {}
    assert "Kubernetes quantity such as 20 or 1500m" in tflops["description"]
    vram = _subschema(workload, "spec.resources.requests.vram") or {}
    assert "bytes" in vram["description"] and "8Gi" in vram["description"]
    assert "Default soft" in (_subschema(workload, "spec.isolation") or {})["description"]
