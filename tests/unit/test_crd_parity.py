"""Our CRDs accept exactly what the original's published CRDs accept.

tests/fixtures/upstream_crd_facts.json holds the facts of the original's CRD schemas (per path:
type, format, enum, required, default, bounds, pattern, x-kubernetes-* keys, CEL rules; no
descriptions). This test flattens our generated CRDs the same way and fails on any difference
that is not on the allow-lists below, each with the reason it is deliberate.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

import pytest

from tfusion.api import crds
from tfusion.api.types import KINDS

FACTS: Final = json.loads(
    (Path(__file__).resolve().parents[1] / "fixtures" / "upstream_crd_facts.json").read_text(encoding="utf-8"))

#: schema keys that decide what an object may contain (descriptions and titles are left out)
COMPARED_KEYS: Final[tuple[str, ...]] = (
    "type", "format", "enum", "default", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "pattern",
    "minLength", "maxLength", "minItems", "maxItems", "anyOf", "nullable")

#: (path, attribute) -> why ours differs on purpose; empty: every schema attribute matches
ALLOWED_SCHEMA_DIFFERENCES: Final[dict[tuple[str, str], str]] = {
    ("GPU.status.usedBy", "enum"): (
        "any system name: the original's two-value enum refuses what its own device-plugin detector writes "
        "(3rd-party-device-plugin, a ProviderConfig's usedBySystemName)"),
}

#: CRD-level differences that change no validation, only how kubectl shows objects
ALLOWED_CRD_DIFFERENCES: Final[dict[str, str]] = {
    "names.shortNames": "we add short names (tfc, gp, gn, tfw, ...) for kubectl; the original has none",
    "additionalPrinterColumns": (
        "typed printer columns (integer/boolean instead of string), an Age column on every kind, and column "
        "paths fixed where the original's point at no field (GPUPool Mode, GPUResourceQuota used, "
        "SchedulingConfigTemplate allowUsingLocalGPU/autoFreeze, GPU Node)"),
}


def flatten(schema: dict[str, Any], path: str, out: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """path -> the attributes of `schema` that affect validation, for it and everything below it."""
    attributes: dict[str, Any] = {key: schema[key] for key in COMPARED_KEYS if key in schema}
    if "allOf" in schema:  # an allOf of enums accepts what all of them accept
        enums = [part["enum"] for part in schema["allOf"]]
        attributes["enum"] = [value for value in enums[0] if all(value in enum for enum in enums)]
    for key, value in schema.items():
        if key == "x-kubernetes-validations":
            attributes[key] = [{k: v for k, v in rule.items() if k != "message"} for rule in value]
        elif key.startswith("x-kubernetes-"):
            attributes[key] = value
    if "required" in schema:
        attributes["required"] = sorted(schema["required"])
    out[path] = attributes
    for name, sub in schema.get("properties", {}).items():
        flatten(sub, f"{path}.{name}", out)
    if isinstance(schema.get("items"), dict):
        flatten(schema["items"], f"{path}[]", out)
    if isinstance(schema.get("additionalProperties"), dict):
        flatten(schema["additionalProperties"], f"{path}{{}}", out)
    return out


def our_paths() -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for kind in KINDS:
        flatten(crds.openapi_schema_view(kind), kind, found)
    return found


def schema_differences() -> dict[tuple[str, str], tuple[Any, Any]]:
    """(path, attribute) -> (original's value, ours); a missing path shows as attribute '<path>'."""
    theirs, ours = FACTS["paths"], our_paths()
    differences: dict[tuple[str, str], tuple[Any, Any]] = {}
    for path in sorted(set(theirs) | set(ours)):
        if path not in theirs or path not in ours:
            differences[(path, "<path>")] = (path in theirs, path in ours)
            continue
        for key in sorted(set(theirs[path]) | set(ours[path])):
            if theirs[path].get(key) != ours[path].get(key):
                differences[(path, key)] = (theirs[path].get(key), ours[path].get(key))
    return differences


def test_the_fixture_covers_every_kind_and_many_paths() -> None:
    assert set(FACTS["kinds"]) == set(KINDS)
    assert len(FACTS["paths"]) > 1000


def test_every_schema_attribute_matches_the_original() -> None:
    unexpected = {k: v for k, v in schema_differences().items() if k not in ALLOWED_SCHEMA_DIFFERENCES}
    report = "\n".join(f"{path} {key}: original={theirs!r} ours={ours!r}"
                       for (path, key), (theirs, ours) in unexpected.items())
    assert not unexpected, f"{len(unexpected)} schema differences from the original:\n{report}"


def test_the_allow_list_has_no_stale_entries() -> None:
    differences = schema_differences()
    assert [entry for entry in ALLOWED_SCHEMA_DIFFERENCES if entry not in differences] == []


@pytest.mark.parametrize("kind", list(KINDS))
def test_names_scope_and_status_subresource_match(kind: str) -> None:
    theirs = FACTS["kinds"][kind]
    crd: Any = crds.crd_for(kind)
    spec = crd["spec"]
    [version] = spec["versions"]
    names = {key: value for key, value in spec["names"].items() if key != "shortNames"}
    assert names == theirs["names"]
    assert spec["scope"] == theirs["scope"]
    assert ("status" in version.get("subresources", {})) == theirs["statusSubresource"]


def test_the_gang_rule_sits_on_spec_of_workloads_and_profiles() -> None:
    for kind in ("TensorFusionWorkload", "WorkloadProfile"):
        schema: Any = crds.openapi_schema_view(kind)
        [rule] = schema["properties"]["spec"]["x-kubernetes-validations"]
        assert "self.gangScheduling.minMembers <= self.replicas" in rule["rule"]
        assert rule["message"] == "gangScheduling.minMembers must not exceed replicas"


def test_crd_level_allow_list_is_what_actually_differs() -> None:
    # the allow-listed CRD keys must really be where ours differs, or the entry is stale
    docs: list[Any] = [crds.crd_for(kind) for kind in KINDS]
    assert any(crd["spec"]["names"].get("shortNames") for crd in docs)
    columns = [c["name"] for crd in docs for c in crd["spec"]["versions"][0].get("additionalPrinterColumns", [])]
    assert "Age" in columns
    assert set(ALLOWED_CRD_DIFFERENCES) == {"names.shortNames", "additionalPrinterColumns"}
