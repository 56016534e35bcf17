"""Discovery documents (/version, /api, /apis, per group-version lists) and the minimal OpenAPI kubectl needs.

kubectl 1.32 validates manifests by asking the server whether it supports the `fieldValidation`
query parameter, which it reads from /openapi/v3: each group-version document below declares a
PATCH operation per kind with that parameter, so kubectl leaves validation to the server (which
validates custom resources against their schemas) instead of failing to download a full spec.
"""

from __future__ import annotations

import hashlib
from typing import Any

from tfusion.apiserver.resources import ResourceInfo

VERSION = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.0-tfusion",
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


def openapi_v3_root(groups: dict[tuple[str, str], list[ResourceInfo]], generation: int) -> dict[str, Any]:
    paths = {}
    for (group, version), _ in sorted(groups.items()):
        path = _gv_path(group, version)
        paths[path] = {"serverRelativeURL": f"/openapi/v3/{path}?hash={generation:016X}"}
    return {"paths": paths}


def openapi_v3_group_version(group: str, version: str, infos: list[ResourceInfo]) -> dict[str, Any]:
    field_validation = {
        "name": "fieldValidation",
        "in": "query",
        "schema": {"type": "string"},
        "description": "Strict, Warn or Ignore",
    }
    paths: dict[str, Any] = {}
    schemas: dict[str, Any] = {}
    prefix = "/" + _gv_path(group, version)
    for info in infos:
        gvk = {"group": group, "version": version, "kind": info.kind}
        ref_name = f"{'.'.join(reversed(group.split('.'))) if group else 'io.k8s.api.core'}.{version}.{info.kind}"
        schemas[ref_name] = dict(info.schema or {"type": "object", "x-kubernetes-preserve-unknown-fields": True})
        schemas[ref_name]["x-kubernetes-group-version-kind"] = [gvk]
        base = f"{prefix}/namespaces/{{namespace}}/{info.plural}" if info.namespaced else f"{prefix}/{info.plural}"
        operation = {
            "operationId": f"patch{info.kind}",
            "parameters": [field_validation],
            "x-kubernetes-action": "patch",
            "x-kubernetes-group-version-kind": gvk,
            "responses": {"200": {"description": "OK"}},
        }
        create = {
            "operationId": f"create{info.kind}",
            "parameters": [field_validation],
            "x-kubernetes-action": "post",
            "x-kubernetes-group-version-kind": gvk,
            "responses": {"201": {"description": "Created"}},
        }
        paths[base] = {"post": create}
        paths[f"{base}/{{name}}"] = {"patch": operation}
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.32.0"},
        "paths": paths,
        "components": {"schemas": schemas},
    }


def openapi_v2(infos: list[ResourceInfo]) -> dict[str, Any]:
    """A Swagger 2.0 document naming every kind (kubectl's v2 fallback reads kinds from it)."""
    definitions = {}
    for info in infos:
        group = info.group
        name = f"{'.'.join(reversed(group.split('.'))) if group else 'io.k8s.api.core'}.{info.version}.{info.kind}"
        definitions[name] = {
            "type": "object",
            "x-kubernetes-group-version-kind": [{"group": group, "version": info.version, "kind": info.kind}],
        }
    return {
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": "v1.32.0"},
        "paths": {},
        "definitions": definitions,
    }
