"""The Kubernetes definitions the built-in kinds are documented from (tfusion/apiserver/kubeschemas.py).

What is checked is what the OpenAPI documents and later readers (list types, merge keys, strict
field validation) rely on: every kind we serve is found by its group/version/kind, the neutral form
has kube's plain types and no dangling reference, each document form points its references at its
own prefix, and reading the file does not import kubernetes-validate's validation machinery.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tfusion.apiserver import kubeschemas
from tfusion.apiserver.discovery import VERSION
from tfusion.apiserver.kubeschemas import KubeSchemas
from tfusion.apiserver.resources import BUILTINS

INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
META = "io.k8s.apimachinery.pkg.apis.meta.v1."


@pytest.fixture(scope="module")
def release() -> KubeSchemas:
    return kubeschemas.load()


def schemas_in(node: Any) -> Iterator[dict[str, Any]]:
    """Every schema object below `node` (extension values excluded), `node` first."""
    if not isinstance(node, dict):
        return
    yield node
    for key, value in node.items():
        if key == "properties" and isinstance(value, dict):
            for sub in value.values():
                yield from schemas_in(sub)
        elif key in ("items", "additionalProperties", "not"):
            yield from schemas_in(value)
        elif key in ("allOf", "oneOf", "anyOf"):
            for sub in value:
                yield from schemas_in(sub)


def refs_in(node: Any) -> list[str]:
    return [s["$ref"] for s in schemas_in(node) if "$ref" in s]


def test_the_release_read_is_the_one_version_reports(release: KubeSchemas) -> None:
    assert release.release == f"{VERSION['major']}.{VERSION['minor']}"
    path = kubeschemas.definitions_file()
    assert path is not None and f"v1.{VERSION['minor']}.0-local" in str(path)
    assert kubeschemas.load() is release, "the 1.3 MB file is read once"
    assert kubeschemas.definitions() is release.definitions


def test_every_served_builtin_kind_and_its_list_has_a_described_definition(release: KubeSchemas) -> None:
    for info in BUILTINS:
        # the review kinds are only created: kube defines no list of them
        for kind in (info.kind, info.list_kind) if "list" in info.verbs else (info.kind,):
            schema = kubeschemas.schema_for(info.group, info.version, kind)
            assert schema is not None, f"{info.api_version} {kind} is not in release {release.release}"
            assert schema["description"], f"{kind} has no description"
            assert {"group": info.group, "version": info.version, "kind": kind} in schema[
                "x-kubernetes-group-version-kind"
            ]
    assert release.name_for("apps", "v1", "Deployment") == "io.k8s.api.apps.v1.Deployment"
    assert release.schema_for("apps", "v1", "NoSuchKind") is None
    assert release.schema_for("nosuch.example.com", "v1", "Deployment") is None


def test_the_meta_kinds_name_their_own_definition_first(release: KubeSchemas) -> None:
    # DeleteOptions is listed under every group; asking for it in one group still finds it
    assert release.name_for("apps", "v1", "DeleteOptions") == "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions"
    assert release.name_for("", "v1", "Status") == "io.k8s.apimachinery.pkg.apis.meta.v1.Status"


def test_neutral_form_has_single_types_and_no_dangling_reference(release: KubeSchemas) -> None:
    for name, definition in release.definitions.items():
        for schema in schemas_in(definition):
            kind = schema.get("type")
            assert kind is None or (isinstance(kind, str) and kind != "null"), f"{name}: type {kind!r}"
        for ref in refs_in(definition):
            assert ref.startswith(kubeschemas.DEFS_REF), f"{name}: {ref}"
            assert ref.removeprefix(kubeschemas.DEFS_REF) in release.definitions, f"{name}: {ref} dangles"


def test_the_converter_added_kind_enums_are_dropped(release: KubeSchemas) -> None:
    # kube publishes apiVersion and kind as plain strings (a list's items may be of another version)
    for name, definition in release.definitions.items():
        for field in ("apiVersion", "kind"):
            assert "enum" not in definition.get("properties", {}).get(field, {}), f"{name}.{field}"
    raw = kubeschemas.definitions_file()
    assert raw is not None and b'"enum"' in raw.read_bytes(), "the file no longer has them: drop the rule"


def test_list_types_and_merge_keys_are_there_for_others_to_read(release: KubeSchemas) -> None:
    containers = release.definitions["io.k8s.api.core.v1.PodSpec"]["properties"]["containers"]
    assert containers["x-kubernetes-list-type"] == "map" and containers["x-kubernetes-list-map-keys"] == ["name"]
    assert containers["x-kubernetes-patch-merge-key"] == "name"
    assert release.resolve(containers["items"]) is release.definitions["io.k8s.api.core.v1.Container"]


def test_closure_reaches_everything_a_kind_refers_to_and_nothing_else(release: KubeSchemas) -> None:
    names = release.closure(["io.k8s.api.apps.v1.Deployment"])
    assert {"io.k8s.api.core.v1.PodSpec", f"{META}ObjectMeta", INT_OR_STRING} <= set(names)
    assert "io.k8s.api.core.v1.Pod" not in names and "io.k8s.api.batch.v1.Job" not in names
    for name in names:
        for ref in refs_in(release.definitions[name]):
            assert ref.removeprefix(kubeschemas.DEFS_REF) in names, f"{name} reaches {ref} outside the closure"
    assert release.closure(["no.such.Definition"]) == []


def test_closure_follows_references_under_properties_named_like_extensions(release: KubeSchemas) -> None:
    # JSONSchemaProps has a *field* called x-kubernetes-validations whose items are ValidationRules
    names = release.closure(["io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.v1.JSONSchemaProps"])
    assert "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.v1.ValidationRule" in names


def test_openapi_v3_form_wraps_described_references(release: KubeSchemas) -> None:
    pod = kubeschemas.openapi_v3(release.definitions["io.k8s.api.core.v1.Pod"])
    spec = pod["properties"]["spec"]
    assert spec["allOf"] == [{"$ref": "#/components/schemas/io.k8s.api.core.v1.PodSpec"}]
    assert spec["description"] == release.definitions["io.k8s.api.core.v1.Pod"]["properties"]["spec"]["description"]
    items = kubeschemas.openapi_v3(release.definitions["io.k8s.api.core.v1.PodSpec"])["properties"]["containers"]
    assert items["items"] == {"$ref": "#/components/schemas/io.k8s.api.core.v1.Container"}
    for name in release.closure(["io.k8s.api.core.v1.Pod"]):
        for ref in refs_in(kubeschemas.openapi_v3(release.definitions[name])):
            assert ref.startswith(kubeschemas.V3_REF), ref
    assert kubeschemas.openapi_v3(release.definitions[QUANTITY])["oneOf"] == [{"type": "string"}, {"type": "number"}]


def test_swagger_v2_form_has_no_one_of(release: KubeSchemas) -> None:
    assert kubeschemas.swagger_v2(release.definitions[INT_OR_STRING])["format"] == "int-or-string"
    for name in (INT_OR_STRING, QUANTITY):
        converted = kubeschemas.swagger_v2(release.definitions[name])
        assert converted["type"] == "string" and "oneOf" not in converted
    spec = kubeschemas.swagger_v2(release.definitions["io.k8s.api.core.v1.Pod"])["properties"]["spec"]
    assert spec["$ref"] == "#/definitions/io.k8s.api.core.v1.PodSpec" and spec["description"]


def test_unknown_fields_are_named_as_kube_names_them(release: KubeSchemas) -> None:
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "labels": {"any": "key"}, "labelz": {}},
        "spec": {
            "foo": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"annotations": {"a": "b"}},
                "spec": {
                    "containers": [
                        {"name": "a", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}},
                        {"name": "b", "image": "y", "bogus": True, "ports": [{"containerPort": 80, "nope": 1}]},
                    ]
                },
            },
        },
    }
    assert release.unknown_fields("apps", "v1", "Deployment", deployment) == [
        "metadata.labelz",
        "spec.foo",
        "spec.template.spec.containers[1].bogus",
        "spec.template.spec.containers[1].ports[0].nope",
    ]
    clean = {"metadata": {"name": "web"}, "spec": {"selector": {}, "template": {"spec": {"containers": []}}}}
    assert release.unknown_fields("apps", "v1", "Deployment", clean) == []
    assert release.unknown_fields("example.com", "v1", "Widget", deployment) == []


def test_untyped_objects_take_anything(release: KubeSchemas) -> None:
    revision = {"metadata": {"managedFields": [{"fieldsV1": {"f:spec": {"f:x": {}}}}]}, "data": {"any": {"thing": 1}}}
    assert release.unknown_fields("apps", "v1", "ControllerRevision", revision) == []


def test_reading_the_definitions_leaves_the_validation_package_unimported() -> None:
    script = (
        "import sys; from tfusion.apiserver import kubeschemas as k; assert k.load().definitions; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('kubernetes_validate', 'jsonschema')))"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[]"


def test_a_release_that_is_not_installed_gives_no_definitions() -> None:
    assert kubeschemas.definitions_file("9") is None
    empty = kubeschemas.load("9")
    assert empty.definitions == {} and empty.schema_for("", "v1", "Pod") is None
