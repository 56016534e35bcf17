"""Field sets (the unit of server-side apply ownership): the FieldsV1 encoding kube writes, the set
algebra, which fields an object sets under list-map, set and atomic schemas, and the apply merge."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfusion.apiserver import managedfields, serverside
from tfusion.apiserver.errors import ApiError
from tfusion.apiserver.fieldsets import (
    FieldsError,
    FieldSet,
    Shape,
    compare,
    encoded_has,
    encoded_with,
    encoded_without,
    fields_of,
    fields_v1_of,
    path_text,
    shape_for,
)

CRD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "properties": {
                "ports": {"type": "array", "x-kubernetes-list-type": "map",
                          "x-kubernetes-list-map-keys": ["name", "protocol"],
                          "items": {"type": "object", "properties": {
                              "name": {"type": "string"}, "protocol": {"type": "string"},
                              "port": {"type": "integer"}}}},
                "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
                "args": {"type": "array", "items": {"type": "string"}},
                "selector": {"type": "object", "x-kubernetes-map-type": "atomic",
                             "additionalProperties": {"type": "string"}},
                "env": {"type": "object", "additionalProperties": {
                    "type": "object", "properties": {"value": {"type": "string"}}}},
            },
        }
    },
}
SHAPE = shape_for("Widget", CRD_SCHEMA)


def test_fieldsv1_encoding_is_kubes() -> None:
    fields = FieldSet({("f:spec", "f:replicas"), ("f:spec", "f:containers", 'k:{"name":"a"}'),
                       ("f:spec", "f:containers", 'k:{"name":"a"}', "f:image"), ("f:spec", "f:tags", 'v:"x"')})
    assert fields.encode() == {"f:spec": {
        "f:containers": {'k:{"name":"a"}': {".": {}, "f:image": {}}},
        "f:replicas": {},
        "f:tags": {'v:"x"': {}},
    }}
    assert FieldSet.decode(fields.encode()) == fields


def test_decoding_refuses_what_is_not_fieldsv1() -> None:
    bad: Any
    for bad in ([], {"spec": {}}, {"f:spec": []}, {"k:{oops": {}}, {"k:[1]": {}}, {"f:a": {".": {"x": {}}}}):
        with pytest.raises(FieldsError):
            FieldSet.decode(bad)


def test_set_algebra() -> None:
    a = FieldSet({("f:a",), ("f:b",)})
    b = FieldSet({("f:b",), ("f:c", "f:d")})
    assert a.union(b) == FieldSet({("f:a",), ("f:b",), ("f:c", "f:d")})
    assert a.difference(b) == FieldSet({("f:a",)})
    assert a.intersection(b) == FieldSet({("f:b",)})
    assert ("f:c",) in b.prefixes() and () in b.prefixes()
    assert not FieldSet() and len(a) == 2


def test_fields_of_a_custom_resource_follow_its_schema() -> None:
    obj = {"spec": {
        "ports": [{"name": "http", "protocol": "TCP", "port": 80}],
        "tags": ["a", "b"],
        "args": ["--x"],
        "selector": {"app": "w"},
        "env": {"HOME": {"value": "/"}},
    }}
    assert fields_of(obj, SHAPE) == {
        ("f:spec", "f:ports", 'k:{"name":"http","protocol":"TCP"}'),
        ("f:spec", "f:ports", 'k:{"name":"http","protocol":"TCP"}', "f:name"),
        ("f:spec", "f:ports", 'k:{"name":"http","protocol":"TCP"}', "f:protocol"),
        ("f:spec", "f:ports", 'k:{"name":"http","protocol":"TCP"}', "f:port"),
        ("f:spec", "f:tags", 'v:"a"'),
        ("f:spec", "f:tags", 'v:"b"'),
        ("f:spec", "f:args"),  # untyped lists are atomic
        ("f:spec", "f:selector"),  # an atomic map is one leaf
        ("f:spec", "f:env", "f:HOME"),  # a map entry is a member even with members below
        ("f:spec", "f:env", "f:HOME", "f:value"),
    }


def test_fields_of_a_builtin_kind_come_from_its_merge_keys() -> None:
    pod = shape_for("Pod")
    obj = {"metadata": {"labels": {"a": "1"}, "finalizers": ["x"]},
           "spec": {"containers": [{"name": "c", "image": "i", "ports": [{"containerPort": 80}]}],
                    "tolerations": [{"key": "k"}]}}
    fields = fields_of(obj, pod)
    item = ("f:spec", "f:containers", 'k:{"name":"c"}')
    assert item in fields and (*item, "f:image") in fields
    assert (*item, "f:ports", 'k:{"containerPort":80}', "f:containerPort") in fields
    assert ("f:spec", "f:tolerations") in fields  # no merge key: atomic
    assert ("f:metadata", "f:finalizers", 'v:"x"') in fields
    assert ("f:metadata", "f:labels", "f:a") in fields


def test_compare_reports_added_modified_and_removed_paths() -> None:
    old = {"spec": {"ports": [{"name": "a", "protocol": "TCP", "port": 1}], "tags": ["x"], "args": ["1"]}}
    new = {"spec": {"ports": [{"name": "a", "protocol": "TCP", "port": 2}], "tags": ["y"], "args": ["2"]}}
    result = compare(old, new, SHAPE)
    key = 'k:{"name":"a","protocol":"TCP"}'
    assert result.modified == {("f:spec", "f:ports", key, "f:port"), ("f:spec", "f:args")}
    assert result.added == {("f:spec", "f:tags", 'v:"y"')}
    assert result.removed == {("f:spec", "f:tags", 'v:"x"')}
    assert compare(old, old, SHAPE).same


def test_conflict_paths_print_as_kube_prints_them() -> None:
    assert path_text(("f:spec", "f:replicas")) == ".spec.replicas"
    assert path_text(("f:spec", "f:containers", 'k:{"name":"web"}', "f:image")) == \
        '.spec.containers[name="web"].image'
    assert path_text(("f:spec", "f:ports", 'k:{"port":80,"protocol":"TCP"}')) == '.spec.ports[port=80,protocol="TCP"]'
    assert path_text(("f:metadata", "f:finalizers", 'v:"x"')) == '.metadata.finalizers[="x"]'


def test_apply_merges_prunes_and_conflicts() -> None:
    version = "example.com/v1"
    live: dict[str, Any] = {"apiVersion": version, "kind": "Widget", "metadata": {"name": "w"},
                            "spec": {"tags": ["keep"]}}
    first = serverside.apply(live, {"spec": {"tags": ["a"], "args": ["1"], "env": {"HOME": {"value": "/"}}}},
                             SHAPE, manager="m", api_version=version)
    assert first.obj["spec"] == {"tags": ["keep", "a"], "args": ["1"], "env": {"HOME": {"value": "/"}}}
    live = {**first.obj, "metadata": {**first.obj["metadata"], "managedFields": first.entries}}
    second = serverside.apply(live, {"spec": {"tags": ["b"], "env": {"HOME": {"value": "/"}}}}, SHAPE,
                              manager="m", api_version=version)
    assert second.obj["spec"] == {"tags": ["keep", "b"], "env": {"HOME": {"value": "/"}}}  # m's alone: gone
    live = {**second.obj, "metadata": {**second.obj["metadata"], "managedFields": second.entries}}
    with pytest.raises(ApiError) as caught:
        serverside.apply(live, {"spec": {"env": {"HOME": {"value": "/root"}}}}, SHAPE, manager="other",
                         api_version=version)
    assert caught.value.code == 409
    assert caught.value.message == 'Apply failed with 1 conflict: conflict with "m": .spec.env.HOME.value'
    forced = serverside.apply(live, {"spec": {"env": {"HOME": {"value": "/root"}}}}, SHAPE, manager="other",
                              api_version=version, force=True)
    owners = {e["manager"]: FieldSet.decode(e["fieldsV1"]) for e in forced.entries}
    assert ("f:spec", "f:env", "f:HOME", "f:value") in owners["other"]
    assert ("f:spec", "f:env", "f:HOME", "f:value") not in owners["m"]
    same = serverside.apply(live, {"spec": {"tags": ["b"], "env": {"HOME": {"value": "/"}}}}, SHAPE,
                            manager="m", api_version=version)
    assert same.obj == second.obj and same.entries == second.entries  # a repeat changes nothing, not even time


def test_an_update_takes_changed_fields_from_other_managers() -> None:
    shape = shape_for("Deployment")
    old = {"spec": {"replicas": 1, "paused": False}}
    new = {"spec": {"replicas": 3, "paused": False}}
    applier = serverside.created(old, shape, "gitops", "apps/v1")
    tracking = managedfields.Tracking("scaler", "apps/v1")
    entries = managedfields.update_entries(applier, compare(old, new, shape), tracking)
    by_manager = {e["manager"]: FieldSet.decode(e["fieldsV1"]) for e in entries}
    assert by_manager["scaler"] == FieldSet({("f:spec", "f:replicas")})
    assert by_manager["gitops"] == FieldSet({("f:spec", "f:paused")})
    assert [e["operation"] for e in entries] == ["Apply", "Update"]


# ---------------------------------------------------------------------------------------------- properties

_names = st.sampled_from(["spec", "ports", "tags", "env", "name", "protocol", "a", "x.y"])
_scalars = st.one_of(st.integers(-5, 5), st.booleans(), st.text(max_size=3))
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.dictionaries(_names, inner, max_size=3), st.lists(inner, max_size=3)),
    max_leaves=12,
)
_objects = st.dictionaries(_names, _values, max_size=4)


@settings(max_examples=200, deadline=None)
@given(_objects)
def test_decode_of_encode_is_identity(obj: dict[str, Any]) -> None:
    fields = FieldSet(fields_of(obj, Shape()))
    assert FieldSet.decode(fields.encode()) == fields


@settings(max_examples=200, deadline=None)
@given(_objects, _objects)
def test_an_applied_object_holds_every_field_applied(live: dict[str, Any], config: dict[str, Any]) -> None:
    merged = serverside.merge(live, config, SHAPE)
    # every applied field is there (an applied empty map may have gained members below it from live)
    assert fields_of(config, SHAPE) <= FieldSet(fields_of(merged, SHAPE)).prefixes()


_paths = st.lists(st.sampled_from(["f:a", "f:b", 'k:{"n":1}', 'v:"x"']), min_size=1, max_size=4).map(tuple)
_sets = st.sets(_paths, max_size=8).map(FieldSet)


@settings(max_examples=300, deadline=None)
@given(_sets, _sets)
def test_editing_an_encoded_set_agrees_with_the_set_algebra(a: FieldSet, b: FieldSet) -> None:
    encoded = a.encode()
    assert FieldSet.decode(encoded_without(encoded, b)) == a.difference(b)
    assert FieldSet.decode(encoded_with(encoded, b)) == a.union(b)
    assert encoded == a.encode()  # the edits copy, never change their input
    assert all(encoded_has(encoded, p) == (p in a) for p in b)


@settings(max_examples=300, deadline=None)
@given(_objects)
def test_the_one_walk_encoding_agrees_with_the_set(obj: dict[str, Any]) -> None:
    for shape in (SHAPE, shape_for("Pod"), Shape()):
        assert FieldSet.decode(fields_v1_of(obj, shape)) == FieldSet(fields_of(obj, shape))


def test_a_spec_seen_before_is_answered_by_its_json_and_as_a_copy() -> None:
    """The pods of one template share a spec: its FieldsV1 is found again by its JSON (the same as
    a walk gives), whatever the rest of the object says; an answer changed by its caller changes no
    later one, and a shape made again (a CRD changed) never takes the old shape's answer."""
    shape = shape_for("Pod")
    spec = {"containers": [{"name": "a", "image": "x", "env": [{"name": "E", "value": "1"}]}], "nodeName": "n"}
    first = fields_v1_of({"metadata": {"name": "p-1"}, "spec": spec}, shape)
    first["f:spec"]["f:containers"].clear()
    again = fields_v1_of({"metadata": {"name": "p-2", "labels": {"a": "b"}}, "spec": dict(spec)}, shape)
    walked = FieldSet(fields_of({"metadata": {"name": "p-2", "labels": {"a": "b"}}, "spec": spec}, shape))
    assert FieldSet.decode(again) == walked and again["f:spec"]["f:containers"]
    crd = {"type": "object", "properties": {"spec": {"type": "object", "properties": {
        "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}}}}}}
    tags = {"spec": {"tags": ["x", "y"]}}
    as_set = fields_v1_of(tags, shape_for("Widget", crd))
    atomic = fields_v1_of(tags, shape_for("Widget", {"type": "object", "properties": {"spec": {
        "type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}}}}}}))
    assert as_set["f:spec"]["f:tags"] == {'v:"x"': {}, 'v:"y"': {}} and atomic["f:spec"]["f:tags"] == {}
