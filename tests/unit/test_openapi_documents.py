"""The OpenAPI documents the embedded API server serves (tfusion/apiserver/discovery.py OpenApiDocuments).

Checked on a real Registry, as the server holds it: each group-version document holds its own
kinds with everything they refer to and nothing of other groups, references resolve inside the
document, the index's hashes follow the content, and a document is rebuilt only when the kinds it
describes change. kubectl reading them is tests/integration/test_kubectl_explain.py.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from tfusion.apiserver import kubeschemas, openapi_pb
from tfusion.apiserver.discovery import OpenApiDocuments
from tfusion.apiserver.resources import BUILTINS, Registry, ResourceInfo

META = "io.k8s.apimachinery.pkg.apis.meta.v1."


def widget(description: str = "A widget.") -> ResourceInfo:
    schema = {"type": "object", "description": description, "properties": {"spec": {"type": "object"}}}
    return ResourceInfo("example.com", "v1", "widgets", "Widget", True, schema=schema, crd_name="widgets.example.com")


def refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from refs(value)


def gv_document(documents: OpenApiDocuments, registry: Registry, group: str, version: str) -> dict[str, Any]:
    encoded = documents.v3_group_version(registry.all(), group, version)
    assert encoded is not None, f"{group}/{version} is not served"
    document: dict[str, Any] = orjson.loads(encoded)
    return document


def by_gvk(schemas: dict[str, Any], group: str, version: str, kind: str) -> dict[str, Any]:
    gvk = {"group": group, "version": version, "kind": kind}
    found = [s for s in schemas.values() if gvk in s.get("x-kubernetes-group-version-kind", ())]
    assert len(found) == 1, f"{kind}: {len(found)} schemas"
    schema: dict[str, Any] = found[0]
    return schema


@pytest.fixture
def registry() -> Registry:
    return Registry()


def test_each_group_version_holds_its_kinds_and_what_they_refer_to(registry: Registry) -> None:
    documents = OpenApiDocuments()
    apps = gv_document(documents, registry, "apps", "v1")["components"]["schemas"]
    for name in ("io.k8s.api.apps.v1.Deployment", "io.k8s.api.apps.v1.DeploymentList", "io.k8s.api.core.v1.PodSpec",
                 "io.k8s.api.autoscaling.v1.Scale", f"{META}ObjectMeta", f"{META}Status", f"{META}DeleteOptions"):
        assert name in apps, f"{name} missing from apps/v1"
    assert "io.k8s.api.core.v1.Pod" not in apps and "io.k8s.api.batch.v1.Job" not in apps
    core = gv_document(documents, registry, "", "v1")["components"]["schemas"]
    for name in ("io.k8s.api.core.v1.Pod", "io.k8s.api.core.v1.Binding", "io.k8s.api.policy.v1.Eviction",
                 "io.k8s.api.authentication.v1.TokenRequest"):
        assert name in core, f"{name} (a kind or subresource kind of core/v1) missing"
    assert "io.k8s.api.apps.v1.Deployment" not in core


def test_every_served_kind_is_documented_with_its_descriptions(registry: Registry) -> None:
    documents = OpenApiDocuments()
    release = kubeschemas.load()
    for info in BUILTINS:
        schemas = gv_document(documents, registry, info.group, info.version)["components"]["schemas"]
        schema = by_gvk(schemas, info.group, info.version, info.kind)
        assert schema["description"] == release.definitions[release.name_for(info.group, info.version, info.kind)
                                                             or ""]["description"]


def test_references_resolve_inside_each_document(registry: Registry) -> None:
    registry.add(widget())
    documents = OpenApiDocuments()
    root = orjson.loads(documents.v3_root(registry.all()))
    assert root["paths"], "no group-version listed"
    for path in root["paths"]:
        group, version = ("", path.split("/")[1]) if path.startswith("api/") else tuple(path.split("/")[1:3])
        document = gv_document(documents, registry, group, version)
        schemas = document["components"]["schemas"]
        for ref in refs(document):
            assert ref.startswith(kubeschemas.V3_REF) and ref.removeprefix(kubeschemas.V3_REF) in schemas, (path, ref)
    swagger = orjson.loads(documents.v2(registry.all(), protobuf=False))
    for ref in refs(swagger["definitions"]):
        assert ref.startswith(kubeschemas.V2_REF) and ref.removeprefix(kubeschemas.V2_REF) in swagger["definitions"]


def test_patch_operations_declare_field_validation_and_their_patch_types(registry: Registry) -> None:
    registry.add(widget())
    documents = OpenApiDocuments()
    apps = gv_document(documents, registry, "apps", "v1")["paths"]
    patch = apps["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["patch"]
    assert {"name": "fieldValidation", "in": "query"}.items() <= patch["parameters"][0].items()
    assert "application/strategic-merge-patch+json" in patch["requestBody"]["content"]
    custom = gv_document(documents, registry, "example.com", "v1")
    widgets = custom["paths"]["/apis/example.com/v1/namespaces/{namespace}/widgets/{name}"]["patch"]
    # a custom resource has no strategic merge: kube lists the other patch types only
    assert "application/strategic-merge-patch+json" not in widgets["requestBody"]["content"]
    assert "application/merge-patch+json" in widgets["requestBody"]["content"]
    schema = by_gvk(custom["components"]["schemas"], "example.com", "v1", "Widget")
    assert schema["description"] == "A widget." and schema["properties"]["spec"] == {"type": "object"}
    # as kube publishes a custom resource, its metadata is the ObjectMeta the document defines
    assert schema["properties"]["metadata"] == {"allOf": [{"$ref": f"{kubeschemas.V3_REF}{META}ObjectMeta"}]}
    assert f"{META}ObjectMeta" in custom["components"]["schemas"]
    stored = registry.get("example.com", "v1", "widgets")
    assert stored is not None and stored.schema is not None
    assert "metadata" not in stored.schema["properties"], "the served document must not change the CRD's schema"


def test_the_index_hashes_the_content_of_each_document(registry: Registry) -> None:
    documents = OpenApiDocuments()
    root = orjson.loads(documents.v3_root(registry.all()))
    apps = documents.v3_group_version(registry.all(), "apps", "v1")
    assert apps is not None
    digest = hashlib.sha512(apps).hexdigest().upper()
    assert root["paths"]["apis/apps/v1"]["serverRelativeURL"] == f"/openapi/v3/apis/apps/v1?hash={digest}"
    assert documents.v3_group_version(registry.all(), "example.com", "v1") is None
    registry.add(widget())
    grown = orjson.loads(documents.v3_root(registry.all()))
    assert "apis/example.com/v1" in grown["paths"] and "apis/example.com/v1" not in root["paths"]
    before = grown["paths"]["apis/example.com/v1"]["serverRelativeURL"]
    registry.add(widget("A changed widget."))
    after = orjson.loads(documents.v3_root(registry.all()))["paths"]["apis/example.com/v1"]["serverRelativeURL"]
    assert before != after, "a changed CRD schema must change its document's hash"
    assert grown["paths"]["apis/apps/v1"] == root["paths"]["apis/apps/v1"]


def test_documents_are_built_once_and_rebuilt_when_their_kinds_change(registry: Registry) -> None:
    documents = OpenApiDocuments()
    apps = documents.v3_group_version(registry.all(), "apps", "v1")
    core = documents.v3_group_version(registry.all(), "", "v1")
    swagger = documents.v2(registry.all(), protobuf=True)
    registry.add(widget())  # another group: the built-in documents stay as they are
    assert documents.v3_group_version(registry.all(), "apps", "v1") is apps
    assert documents.v3_group_version(registry.all(), "", "v1") is core
    first = documents.v3_group_version(registry.all(), "example.com", "v1")
    assert first is not None and documents.v3_group_version(registry.all(), "example.com", "v1") is first
    assert documents.v2(registry.all(), protobuf=True) is not swagger, "v2 holds every kind: a new one changes it"
    registry.remove_crd("widgets.example.com")
    assert documents.v3_group_version(registry.all(), "example.com", "v1") is None


def test_v2_is_one_document_of_every_kind_in_json_and_protobuf(registry: Registry) -> None:
    registry.add(widget())
    documents = OpenApiDocuments()
    swagger = orjson.loads(documents.v2(registry.all(), protobuf=False))
    definitions = swagger["definitions"]
    for info in BUILTINS:
        by_gvk(definitions, info.group, info.version, info.kind)
    assert by_gvk(definitions, "example.com", "v1", "Widget")["type"] == "object"
    assert definitions["io.k8s.apimachinery.pkg.util.intstr.IntOrString"]["format"] == "int-or-string"
    encoded = documents.v2(registry.all(), protobuf=True)
    assert encoded == openapi_pb.document(swagger)
    assert b"io.k8s.api.core.v1.PodSpec" in encoded and b"io.example.com.v1.Widget" not in encoded
    assert b"com.example.v1.Widget" in encoded


def test_answer_routes_the_openapi_paths(registry: Registry) -> None:
    documents, served = OpenApiDocuments(), registry.all()
    assert documents.answer(["v3", "api", "v1"], served, False) == documents.v3_group_version(served, "", "v1")
    assert documents.answer(["v3", "apis", "apps", "v1"], served, False) == documents.v3_group_version(
        served, "apps", "v1"
    )
    assert documents.answer(["v3"], served, False) == documents.v3_root(served)
    assert documents.answer(["v2"], served, True) == documents.v2(served, protobuf=True)
    assert documents.answer(["v2"], served, False) == documents.v2(served, protobuf=False)
    for path in (["v3", "api", "v2"], ["v3", "apis", "apps"], ["v3", "apis", "apps", "v1", "x"], ["v4"], []):
        assert documents.answer(path, served, False) is None, path
