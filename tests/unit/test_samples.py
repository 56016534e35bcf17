"""Every sample manifest decodes with the models and validates against the generated CRD schemas.

Two sets: ours (deploy/samples, one per kind) and the original project's published samples
(../shared/conformance/upstream-samples), which existing users already have and which must keep
working unchanged. Objects of other API groups in those files are context and are skipped.

For the original's samples the check is what `kubectl create` would do: kube-apiserver drops
`status` on create for kinds with a status subresource, so it is dropped here too (the original's
GPU sample carries a partial status that its own CRD would reject on a status update).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from tfusion.api import crds, types
from tfusion.api.quantity import Quantity
from tfusion.api.schema import apply_defaults, prune, unknown_fields, validate

REPO = Path(__file__).resolve().parents[2]
OUR_SAMPLES = REPO / "deploy" / "samples"
SHARED = REPO.parent / "shared"
UPSTREAM_SAMPLES = SHARED / "conformance" / "upstream-samples"


class _JsonLikeLoader(yaml.SafeLoader):
    """YAML as kubectl sends it: timestamps stay strings (JSON has no date type)."""


_JsonLikeLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def load_objects(directory: Path) -> list[tuple[str, dict[str, Any]]]:
    """(id, object) for every tensor-fusion.ai/v1 object in the YAML files of `directory`."""
    found = []
    for path in sorted(directory.glob("*.yaml")):
        with path.open(encoding="utf-8") as stream:
            for index, doc in enumerate(yaml.load_all(stream, Loader=_JsonLikeLoader)):
                if isinstance(doc, dict) and doc.get("apiVersion") == types.API_VERSION:
                    found.append((f"{path.name}#{index}:{doc['kind']}/{doc['metadata']['name']}", doc))
    return found


def as_created(doc: dict[str, Any]) -> dict[str, Any]:
    """The object kube-apiserver stores on create: status dropped where it is a subresource."""
    created = copy.deepcopy(doc)
    if types.KINDS[doc["kind"]].has_status:
        created.pop("status", None)
    return created


def check_against_schema(doc: dict[str, Any]) -> None:
    schema = crds.openapi_schema(doc["kind"])
    obj = copy.deepcopy(doc)
    assert unknown_fields(schema, obj) == [], "fields the CRD does not know would be pruned"
    apply_defaults(schema, prune(schema, obj))
    assert validate(schema, obj) == []


def normalized(schema: dict[str, Any], value: Any) -> Any:
    """`value` with canonical quantities and without zero-valued fields (which the models omit)."""
    if schema.get("x-kubernetes-int-or-string"):
        return str(Quantity.parse(value))
    if isinstance(value, dict):
        if schema.get("x-kubernetes-preserve-unknown-fields") and "properties" not in schema:
            return value
        properties = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        out = {}
        for key, item in value.items():
            sub = properties.get(key, extra if isinstance(extra, dict) else {})
            item = normalized(sub, item)
            if not _is_zero(item):
                out[key] = item
        return out
    if isinstance(value, list):
        items = schema.get("items", {})
        return [normalized(items, item) for item in value]
    return value


def _is_zero(value: Any) -> bool:
    if isinstance(value, bool):
        return value is False
    return value is None or value == 0 if isinstance(value, int | float) else value in ("", [], {}, None)


def with_objects_of(schema: dict[str, Any], encoded: Any, value: Any) -> None:
    """Add to `value` the empty objects the model always writes (as Go does for non-pointer structs)."""
    if isinstance(encoded, list) and isinstance(value, list):
        for enc_item, item in zip(encoded, value, strict=True):
            with_objects_of(schema.get("items", {}), enc_item, item)
    if not (isinstance(encoded, dict) and isinstance(value, dict)) or "properties" not in schema:
        return
    for key, sub in schema["properties"].items():
        if key in encoded and isinstance(encoded[key], dict) and value.get(key) is None:
            value[key] = {}
        if key in encoded and key in value:
            with_objects_of(sub, encoded[key], value[key])


def check_round_trip(doc: dict[str, Any]) -> None:
    """decode loses nothing: encode(decode(x)) is x after defaulting, up to zero values and quantity form."""
    schema = crds.openapi_schema(doc["kind"])
    model = types.decode(doc)
    encoded = types.encode(model)
    assert types.decode(encoded) == model
    given = prune(schema, copy.deepcopy(doc))
    with_objects_of(schema, encoded, given)
    defaulted_input = apply_defaults(schema, given)
    defaulted_output = apply_defaults(schema, copy.deepcopy(encoded))
    assert validate(schema, defaulted_output) == []
    assert normalized(schema, defaulted_output) == normalized(schema, defaulted_input)


OURS = load_objects(OUR_SAMPLES)


def test_there_is_one_sample_per_kind() -> None:
    kinds = sorted(doc["kind"] for _, doc in OURS)
    assert kinds == sorted(types.KINDS)


@pytest.mark.parametrize(("sample_id", "doc"), OURS, ids=[i for i, _ in OURS])
def test_our_sample_decodes_and_validates(sample_id: str, doc: dict[str, Any]) -> None:
    model = types.decode(doc)
    assert type(model) is types.KINDS[doc["kind"]].model
    check_against_schema(doc)
    check_round_trip(doc)


def test_cluster_sample_is_shaped_like_the_charts_default_but_replaces_no_default() -> None:
    [(_, doc)] = [(i, d) for i, d in OURS if d["kind"] == "TensorFusionCluster"]
    cluster = types.decode(doc)
    assert isinstance(cluster, types.TensorFusionCluster)
    assert cluster.metadata.name != "tensor-fusion", "the installation's own cluster keeps its name"
    [pool] = cluster.spec.gpu_pools
    assert pool.name == "shared" and not pool.is_default, "the installation's default pool stays the default"
    capacity = pool.spec_template.capacity_config
    assert capacity is not None and capacity.min_resources and capacity.warm_resources and capacity.max_resources
    assert (str(capacity.min_resources.tflops), str(capacity.min_resources.vram)) == ("20", "10Gi")
    assert (str(capacity.warm_resources.tflops), str(capacity.warm_resources.vram)) == ("10", "5Gi")
    assert (str(capacity.max_resources.tflops), str(capacity.max_resources.vram)) == ("100", "100Gi")
    assert capacity.oversubscription is not None and capacity.oversubscription.tflops_oversell_ratio == 2000
    assert pool.spec_template.scheduling_config_template == "example-scheduling"


def test_nvidia_provider_sample_knows_the_common_models() -> None:
    [(_, doc)] = [(i, d) for i, d in OURS if d["kind"] == "ProviderConfig"]
    provider = types.decode(doc)
    assert isinstance(provider, types.ProviderConfig) and provider.spec is not None
    models = {m.model: m for m in provider.spec.hardware_metadata}
    for name in ("A100_SXM_80G", "A800_SXM_80G", "H100_SXM", "H800_SXM", "H200", "L40S", "L4"):
        assert name in models
        assert models[name].fp16_tflops.value() > 0 and float(models[name].cost_per_hour) > 0
    refs = {ref for m in models.values() for ref in m.partition_template_refs}
    assert refs <= {t.id for t in provider.spec.virtualization_templates}


def _upstream() -> list[tuple[str, dict[str, Any]]]:
    return load_objects(UPSTREAM_SAMPLES) if UPSTREAM_SAMPLES.is_dir() else []


UPSTREAM = _upstream()
needs_upstream = pytest.mark.skipif(
    not UPSTREAM, reason=f"the original's samples are not at {UPSTREAM_SAMPLES} (../shared is absent)")


@needs_upstream
def test_upstream_samples_cover_the_kinds_users_write() -> None:
    kinds = {doc["kind"] for _, doc in UPSTREAM}
    assert {"TensorFusionCluster", "GPUPool", "ProviderConfig", "GPUResourceQuota", "TensorFusionWorkload",
            "WorkloadProfile", "TensorFusionConnection"} <= kinds


@needs_upstream
@pytest.mark.parametrize(("sample_id", "doc"), UPSTREAM, ids=[i for i, _ in UPSTREAM])
def test_upstream_sample_decodes_and_validates_unchanged(sample_id: str, doc: dict[str, Any]) -> None:
    created = as_created(doc)
    model = types.decode(created)
    assert type(model) is types.KINDS[doc["kind"]].model
    check_against_schema(created)
    check_round_trip(created)
