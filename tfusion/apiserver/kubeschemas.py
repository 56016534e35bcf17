"""The Kubernetes definitions of release 1.32, by group/version/kind.

The built-in kinds the embedded API server serves are documented from the schemas Kubernetes itself
publishes, not from copies we would have to keep in step: the `kubernetes-validate` package ships,
per release, one JSON Schema file whose `$defs` are kube's OpenAPI definitions (descriptions, the
`x-kubernetes-group-version-kind` of each kind, list types, map types, patch merge keys). This
module reads the file of the release /version reports, once and only when first asked (it is
1.3 MB), without importing that package's validation machinery, and hands the definitions out in a
neutral form others can read list types and merge keys from:

- JSON Schema's nullable types (`["object", "null"]`) become the single type kube publishes;
- the `apiVersion`/`kind` enums the JSON Schema converter added to each kind are dropped;
- references stay `#/$defs/<name>`; `openapi_v3` and `swagger_v2` rewrite them into the form and
  the prefix of each OpenAPI document (`#/components/schemas/...`, `#/definitions/...`).
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import anyio.to_thread
import orjson

log = logging.getLogger(__name__)

#: the Kubernetes minor release whose API this server speaks (/version reports it)
SERVED_MINOR = "32"
DEFS_REF = "#/$defs/"
V3_REF = "#/components/schemas/"
V2_REF = "#/definitions/"

Schema = dict[str, Any]
OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
#: the meta kinds kube-apiserver puts in every group-version document, whatever that group serves
COMMON = (
    "io.k8s.apimachinery.pkg.apis.meta.v1.APIResourceList",
    "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions",
    "io.k8s.apimachinery.pkg.apis.meta.v1.Patch",
    "io.k8s.apimachinery.pkg.apis.meta.v1.Status",
    "io.k8s.apimachinery.pkg.apis.meta.v1.WatchEvent",
)


def definitions_file(minor: str = SERVED_MINOR) -> Path | None:
    """Where the installed kubernetes-validate keeps release 1.`minor`'s definitions (None: not installed)."""
    spec = importlib.util.find_spec("kubernetes_validate")  # finds the package without running it
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        path = Path(root) / "kubernetes-json-schema" / f"v1.{minor}.0-local" / "_definitions.json"
        if path.is_file():
            return path
    return None


def _subschemas(node: Schema, fn: Callable[[Schema], Schema]) -> Schema:
    """`node` with `fn` applied to each schema directly inside it (extension values are left as they are)."""
    out: Schema = {}
    for key, value in node.items():
        if key == "properties" and isinstance(value, Mapping):
            value = {name: fn(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not") and isinstance(value, dict):
            value = fn(value)
        elif key in ("allOf", "oneOf", "anyOf") and isinstance(value, list):
            value = [fn(sub) for sub in value]
        out[key] = value
    return out


def _neutral(node: Schema) -> Schema:
    out = _subschemas(node, _neutral)
    kind = out.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        out["type"] = kinds[0] if len(kinds) == 1 else kinds
    return out


def _neutral_definition(node: Schema) -> Schema:
    out = _neutral(node)
    properties = out.get("properties")
    if out.get("x-kubernetes-group-version-kind") and isinstance(properties, dict):
        for name in ("apiVersion", "kind"):
            field = properties.get(name)
            if isinstance(field, dict) and "enum" in field:
                properties[name] = {k: v for k, v in field.items() if k != "enum"}
    return out


def references(node: object) -> Iterable[str]:
    """The definition names a schema refers to, at any depth."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith(DEFS_REF):
            yield ref[len(DEFS_REF) :]
        for key, value in node.items():
            if key == "properties" and isinstance(value, dict):
                # property names are the user's words: `x-kubernetes-validations` is a field there
                for sub in value.values():
                    yield from references(sub)
            elif not key.startswith("x-"):
                yield from references(value)
    elif isinstance(node, list):
        for value in node:
            yield from references(value)


def _v3(node: Schema) -> Schema:
    out = _subschemas(node, _v3)
    ref = out.pop("$ref", None)
    if not isinstance(ref, str):
        return out
    target = {"$ref": V3_REF + ref.removeprefix(DEFS_REF)}
    # OpenAPI 3.0 ignores whatever sits beside a $ref, so kube wraps it to keep the field's description
    return {"allOf": [target], **out} if out else target


def _v2(node: Schema) -> Schema:
    out = _subschemas(node, _v2)
    ref = out.get("$ref")
    if isinstance(ref, str):
        out["$ref"] = V2_REF + ref.removeprefix(DEFS_REF)
    alternatives = out.pop("oneOf", None)
    if alternatives and "type" not in out:
        # Swagger 2.0 has no oneOf: kube publishes int-or-string and quantities as formatted strings
        kinds = {a.get("type") for a in alternatives if isinstance(a, dict)}
        out["type"] = "string"
        if "integer" in kinds:
            out["format"] = "int-or-string"
    return out


def openapi_v3(schema: Schema) -> Schema:
    """A neutral schema as an OpenAPI 3.0 component (references into #/components/schemas/)."""
    return _v3(schema)


def swagger_v2(schema: Schema) -> Schema:
    """A neutral schema as a Swagger 2.0 definition (references into #/definitions/)."""
    return _v2(schema)


class KubeSchemas:
    """The definitions of one Kubernetes release, by name and by group/version/kind."""

    def __init__(self, definitions: Mapping[str, Schema], release: str) -> None:
        self.release = release
        self.definitions = definitions
        self._by_gvk: dict[tuple[str, str, str], str] = {}
        for name, schema in definitions.items():
            for gvk in schema.get("x-kubernetes-group-version-kind", ()):
                # the meta kinds (DeleteOptions, WatchEvent) name every group; the kind's own wins
                self._by_gvk.setdefault((gvk.get("group", ""), gvk.get("version", ""), gvk.get("kind", "")), name)

    def name_for(self, group: str, version: str, kind: str) -> str | None:
        """The definition name of a kind (`io.k8s.api.apps.v1.Deployment`), None when the release has none."""
        return self._by_gvk.get((group, version, kind))

    def schema_for(self, group: str, version: str, kind: str) -> Schema | None:
        """The neutral schema of a kind; its references name entries of `definitions`."""
        name = self.name_for(group, version, kind)
        return self.definitions[name] if name else None

    def closure(self, names: Iterable[str]) -> list[str]:
        """`names` and every definition they reach through references, sorted."""
        seen: set[str] = set()
        pending = [n for n in names if n in self.definitions]
        while pending:
            name = pending.pop()
            if name in seen:
                continue
            seen.add(name)
            pending.extend(r for r in references(self.definitions[name]) if r in self.definitions and r not in seen)
        return sorted(seen)

    def resolve(self, schema: Schema) -> Schema:
        """The schema a `$ref` names (`schema` itself when it names none, {} when the name is unknown)."""
        for _ in range(len(self.definitions) + 1):  # a reference that names itself stops here
            ref = schema.get("$ref")
            if not isinstance(ref, str):
                return schema
            schema = self.definitions.get(ref.removeprefix(DEFS_REF), {})
        return {}

    def unknown_fields(self, group: str, version: str, kind: str, obj: object) -> list[str]:
        """Paths of the fields of `obj` its kind does not declare, as kube's strict decoding names them.

        `spec.template.spec.containers[0].bogus`: what fieldValidation=Strict refuses and =Warn warns
        about. Maps (`labels`, `resources.limits`) take any key; untyped objects (RawExtension,
        FieldsV1) take anything; a kind the release does not define has none.
        """
        name = self.name_for(group, version, kind)
        found: list[str] = []
        if name is not None:
            self._collect_unknown(self.definitions[name], obj, "", found)
        return found

    def _collect_unknown(self, schema: Schema, value: object, path: str, found: list[str]) -> None:
        schema = self.resolve(schema)
        if isinstance(value, list):
            items = schema.get("items")
            if isinstance(items, dict):
                for index, item in enumerate(value):
                    self._collect_unknown(items, item, f"{path}[{index}]", found)
            return
        if not isinstance(value, dict):
            return
        properties = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, sub in value.items():
            field = f"{path}.{key}" if path else str(key)
            if isinstance(properties, dict) and key in properties:
                self._collect_unknown(properties[key], sub, field, found)
            elif isinstance(extra, dict):
                self._collect_unknown(extra, sub, field, found)
            elif isinstance(properties, dict):
                found.append(field)


@functools.cache
def load(minor: str = SERVED_MINOR) -> KubeSchemas:
    """Release 1.`minor`'s definitions, read on first use (empty, with a warning, when not installed)."""
    path = definitions_file(minor)
    if path is None:
        log.warning("kubernetes-validate has no definitions for Kubernetes 1.%s: built-in kinds go undocumented", minor)
        return KubeSchemas({}, f"1.{minor}")
    raw = orjson.loads(path.read_bytes()).get("$defs", {})
    return KubeSchemas({name: _neutral_definition(schema) for name, schema in raw.items()}, f"1.{minor}")


_loaded: dict[str, KubeSchemas] = {}


async def loaded(minor: str = SERVED_MINOR) -> KubeSchemas:
    """Release 1.`minor`'s definitions, read once per process in a worker thread (parsing 1.3 MB
    would hold the event loop for a tenth of a second) and kept for every later request."""
    if minor not in _loaded:
        _loaded[minor] = await anyio.to_thread.run_sync(load, minor)
    return _loaded[minor]


def schema_for(group: str, version: str, kind: str) -> Schema | None:
    """The served release's neutral schema of a kind (see `KubeSchemas.schema_for`)."""
    return load().schema_for(group, version, kind)


def definitions() -> Mapping[str, Schema]:
    """The served release's definitions by name (`io.k8s.api.core.v1.PodSpec`), references as `#/$defs/`."""
    return load().definitions
