"""Discovery documents (/version, /api, /apis, per group-version lists) and the OpenAPI documents.

kubectl reads OpenAPI for three things: `kubectl explain` (every field's type and description),
the strategic-merge keys of client-side `kubectl apply`, and whether the server takes the
`fieldValidation` query parameter, which it finds on the PATCH operation of a kind in /openapi/v3
and which makes it leave validation to the server. So each group-version document holds, as
kube-apiserver's does, the definitions of the kinds served there as Kubernetes publishes them
(kubeschemas.py: the release /version reports, with everything they refer to), the schemas of the
custom resources (from their CRDs) and a POST and PATCH per kind declaring that parameter.
/openapi/v2 holds every definition in one Swagger document, JSON or protobuf (openapi_pb.py).
Documents are built on first request and kept, encoded, until the kinds they describe change.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import orjson

from tfusion.apiserver import kubeschemas, openapi_pb
from tfusion.apiserver.kubeschemas import KubeSchemas
from tfusion.apiserver.resources import ResourceInfo

VERSION = {
    "major": "1",
    "minor": kubeschemas.SERVED_MINOR,
    "gitVersion": f"v1.{kubeschemas.SERVED_MINOR}.0-tfusion",
    "gitCommit": "tfusion",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "python3.11",
    "compiler": "cpython",
    "platform": "linux/amd64",
}

_SUBRESOURCE_KINDS = {
    "binding": ("", "v1", "Binding", ("create",)),
    "eviction": ("policy", "v1", "Eviction", ("create",)),
    "token": ("authentication.k8s.io", "v1", "TokenRequest", ("create",)),
    "scale": ("autoscaling", "v1", "Scale", ("get", "patch", "update")),
}


def api_versions(server_address: str) -> dict[str, Any]:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    }


def _group_entry(group: str, versions: list[str]) -> dict[str, Any]:
    listed = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"name": group, "versions": listed, "preferredVersion": listed[0]}


def api_group_list(groups: dict[str, list[str]]) -> dict[str, Any]:
    return {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [_group_entry(g, vs) for g, vs in sorted(groups.items())],
    }


def api_group(group: str, versions: list[str]) -> dict[str, Any]:
    return {"kind": "APIGroup", "apiVersion": "v1", **_group_entry(group, versions)}


def resource_list(group_version: str, infos: list[ResourceInfo]) -> dict[str, Any]:
    resources: list[dict[str, Any]] = []
    for info in sorted(infos, key=lambda i: i.plural):
        entry: dict[str, Any] = {
            "name": info.plural,
            "singularName": info.singular,
            "namespaced": info.namespaced,
            "kind": info.kind,
            "verbs": list(info.verbs),
            "storageVersionHash": hashlib.sha256(info.storage_key.encode()).hexdigest()[:12],
        }
        if info.short_names:
            entry["shortNames"] = list(info.short_names)
        if info.categories:
            entry["categories"] = list(info.categories)
        resources.append(entry)
        for sub in info.subresources:
            if sub == "status":
                resources.append(
                    {
                        "name": f"{info.plural}/status",
                        "singularName": "",
                        "namespaced": info.namespaced,
                        "kind": info.kind,
                        "verbs": ["get", "patch", "update"],
                    }
                )
            else:
                group, version, kind, verbs = _SUBRESOURCE_KINDS[sub]
                sub_entry: dict[str, Any] = {
                    "name": f"{info.plural}/{sub}",
                    "singularName": "",
                    "namespaced": info.namespaced,
                    "kind": kind,
                    "verbs": list(verbs),
                }
                if group:
                    sub_entry["group"], sub_entry["version"] = group, version
                resources.append(sub_entry)
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources}


# ------------------------------------------------------------------------------------------ OpenAPI
def _gv_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def _custom_name(info: ResourceInfo) -> str:
    """The definition name of a kind the Kubernetes release does not define (a custom resource)."""
    prefix = ".".join(reversed(info.group.split("."))) if info.group else "io.k8s.api.core"
    return f"{prefix}.{info.version}.{info.kind}"


def _gvk(info: ResourceInfo) -> dict[str, str]:
    return {"group": info.group, "version": info.version, "kind": info.kind}


def _custom_schema(info: ResourceInfo, object_meta: bool) -> dict[str, Any]:
    """A CRD's schema; its metadata made an ObjectMeta (as kube publishes it) when the document defines one."""
    schema = dict(info.schema or {"type": "object", "x-kubernetes-preserve-unknown-fields": True})
    schema["x-kubernetes-group-version-kind"] = [_gvk(info)]
    properties = schema.get("properties")
    if object_meta and isinstance(properties, dict):
        metadata = properties.get("metadata")
        typed: dict[str, Any] = {"allOf": [{"$ref": kubeschemas.V3_REF + kubeschemas.OBJECT_META}]}
        if isinstance(metadata, dict) and "description" in metadata:
            typed["description"] = metadata["description"]
        schema["properties"] = {**properties, "metadata": typed}
    return schema


def _documented_kinds(info: ResourceInfo) -> Iterator[tuple[str, str, str]]:
    """The kinds a resource's paths read or write: its own, its list, and those of its subresources."""
    yield info.group, info.version, info.kind
    yield info.group, info.version, info.list_kind
    for sub in info.subresources:
        if sub in _SUBRESOURCE_KINDS:
            group, version, kind, _ = _SUBRESOURCE_KINDS[sub]
            yield group, version, kind


def _kube_definitions(schemas: KubeSchemas, infos: Iterable[ResourceInfo]) -> list[str]:
    """The definitions of a document serving `infos`: their kinds, the meta kinds, and all these refer to."""
    roots = [*kubeschemas.COMMON, kubeschemas.OBJECT_META]  # the custom resources' metadata refers to it
    for info in infos:
        if not info.is_custom:
            roots += [name for gvk in _documented_kinds(info) if (name := schemas.name_for(*gvk))]
    return schemas.closure(roots)


def _kind_name(schemas: KubeSchemas, info: ResourceInfo) -> str | None:
    """The release's definition of a built-in kind (None: a custom resource, or a kind the release lacks)."""
    return None if info.is_custom else schemas.name_for(info.group, info.version, info.kind)


_FIELD_VALIDATION = {
    "name": "fieldValidation",
    "in": "query",
    "schema": {"type": "string"},
    "description": "Strict, Warn or Ignore",
}


_PATCH_TYPES = ("application/apply-patch+yaml", "application/json-patch+json", "application/merge-patch+json")
_PATCH_REF = {"$ref": kubeschemas.V3_REF + "io.k8s.apimachinery.pkg.apis.meta.v1.Patch"}


def _patch_body(info: ResourceInfo) -> dict[str, Any]:
    """The patch types a kind takes; client-side `kubectl apply` merges by the schema only where SMP is listed."""
    types = _PATCH_TYPES if info.is_custom else (*_PATCH_TYPES, "application/strategic-merge-patch+json")
    return {"content": {t: {"schema": _PATCH_REF} for t in types}, "required": True}


def _operations(prefix: str, info: ResourceInfo) -> dict[str, Any]:
    """POST and PATCH declaring `fieldValidation` (what kubectl looks for before leaving validation to us)."""
    gvk = _gvk(info)
    base = f"{prefix}/namespaces/{{namespace}}/{info.plural}" if info.namespaced else f"{prefix}/{info.plural}"
    create = {
        "operationId": f"create{info.kind}",
        "parameters": [_FIELD_VALIDATION],
        "x-kubernetes-action": "post",
        "x-kubernetes-group-version-kind": gvk,
        "responses": {"201": {"description": "Created"}},
    }
    patch = {
        "operationId": f"patch{info.kind}",
        "parameters": [_FIELD_VALIDATION],
        "requestBody": _patch_body(info),
        "x-kubernetes-action": "patch",
        "x-kubernetes-group-version-kind": gvk,
        "responses": {"200": {"description": "OK"}},
    }
    return {base: {"post": create}, f"{base}/{{name}}": {"patch": patch}}


def _info() -> dict[str, str]:
    return {"title": "Kubernetes", "version": VERSION["gitVersion"].split("-")[0]}


def openapi_v3_root(hashes: Mapping[tuple[str, str], str]) -> dict[str, Any]:
    """The index of group-version documents; each URL carries the hash of its document's content."""
    paths = {}
    for (group, version), digest in sorted(hashes.items()):
        path = _gv_path(group, version)
        paths[path] = {"serverRelativeURL": f"/openapi/v3/{path}?hash={digest}"}
    return {"paths": paths}


def openapi_v3_group_version(
    group: str, version: str, infos: list[ResourceInfo], schemas: KubeSchemas | None = None
) -> dict[str, Any]:
    """One group-version's OpenAPI 3.0 document: the release's definitions of its built-in kinds, its CRD schemas."""
    schemas = schemas or kubeschemas.load()
    components = {
        name: kubeschemas.openapi_v3(schemas.definitions[name]) for name in _kube_definitions(schemas, infos)
    }
    paths: dict[str, Any] = {}
    prefix = "/" + _gv_path(group, version)
    for info in infos:
        if _kind_name(schemas, info) is None:
            components[_custom_name(info)] = _custom_schema(info, kubeschemas.OBJECT_META in components)
        paths.update(_operations(prefix, info))
    return {"openapi": "3.0.0", "info": _info(), "paths": paths, "components": {"schemas": components}}


def openapi_v2(infos: list[ResourceInfo], schemas: KubeSchemas | None = None) -> dict[str, Any]:
    """The Swagger 2.0 document: every served kind's definition (kubectl's v2 fallback reads kinds from it)."""
    schemas = schemas or kubeschemas.load()
    names = _kube_definitions(schemas, infos)
    definitions = {name: kubeschemas.swagger_v2(schemas.definitions[name]) for name in names}
    for info in infos:
        if _kind_name(schemas, info) is None:
            # a CRD's schema may use what Swagger 2.0 cannot say (anyOf, int-or-string): its kind alone is named
            definitions[_custom_name(info)] = {"type": "object", "x-kubernetes-group-version-kind": [_gvk(info)]}
    return {"swagger": "2.0", "info": _info(), "paths": {}, "definitions": definitions}


class OpenApiDocuments:
    """The encoded OpenAPI documents of a registry, each built on first request and kept while its kinds stay.

    A document is rebuilt only when the resources it describes change (a CRD of its group added,
    changed or removed): the registry hands out new `ResourceInfo` objects then, so the cache
    compares the objects a document was built from, by identity, with those served now.
    """

    def __init__(self, schemas: Callable[[], KubeSchemas] = kubeschemas.load) -> None:
        self._schemas = schemas
        self._built: dict[str, tuple[tuple[ResourceInfo, ...], bytes]] = {}

    def _cached(self, key: str, infos: list[ResourceInfo], build: Callable[[], bytes]) -> bytes:
        entry = self._built.get(key)
        if entry and len(entry[0]) == len(infos) and all(a is b for a, b in zip(entry[0], infos, strict=True)):
            return entry[1]
        data = build()
        self._built[key] = (tuple(infos), data)
        return data

    @staticmethod
    def _by_group_version(served: Iterable[ResourceInfo]) -> dict[tuple[str, str], list[ResourceInfo]]:
        by_gv: dict[tuple[str, str], list[ResourceInfo]] = {}
        for info in sorted(served, key=lambda i: (i.group, i.version, i.plural)):
            by_gv.setdefault((info.group, info.version), []).append(info)
        return by_gv

    def _group_version(self, group: str, version: str, infos: list[ResourceInfo]) -> bytes:
        return self._cached(
            f"v3/{group}/{version}",
            infos,
            lambda: orjson.dumps(openapi_v3_group_version(group, version, infos, self._schemas())),
        )

    def v3_group_version(self, served: Iterable[ResourceInfo], group: str, version: str) -> bytes | None:
        """The encoded document of a group-version (None: nothing of `served` is there)."""
        infos = self._by_group_version(served).get((group, version))
        return self._group_version(group, version, infos) if infos else None

    def v3_root(self, served: Iterable[ResourceInfo]) -> bytes:
        """The index; building it builds every group-version document, since it names their hashes."""
        by_gv = self._by_group_version(served)

        def build() -> bytes:
            hashes = {
                gv: hashlib.sha512(self._group_version(*gv, infos)).hexdigest().upper() for gv, infos in by_gv.items()
            }
            return orjson.dumps(openapi_v3_root(hashes))

        return self._cached("v3", [info for infos in by_gv.values() for info in infos], build)

    def v2(self, served: Iterable[ResourceInfo], *, protobuf: bool) -> bytes:
        every = [info for infos in self._by_group_version(served).values() for info in infos]
        swagger = self._cached("v2", every, lambda: orjson.dumps(openapi_v2(every, self._schemas())))
        if not protobuf:
            return swagger
        return self._cached("v2;protobuf", every, lambda: openapi_pb.document(orjson.loads(swagger)))

    def answer(self, path: list[str], served: list[ResourceInfo], protobuf: bool) -> bytes | None:
        """The encoded document at /openapi/<path> for the resources `served` (None: no document there).

        Safe in a worker thread: `served` is the caller's snapshot, and two threads building one
        document at once both build it and one result is kept.
        """
        if path == ["v2"]:
            return self.v2(served, protobuf=protobuf)
        if path == ["v3"]:
            return self.v3_root(served)
        if path[:2] == ["v3", "api"] and len(path) == 3:
            return self.v3_group_version(served, "", path[2])
        if path[:2] == ["v3", "apis"] and len(path) == 4:
            return self.v3_group_version(served, path[2], path[3])
        return None
