"""Structural-schema validation, defaulting and pruning with hand-written schemas.

The expected texts are kube-apiserver's wording for the same violations, so that the embedded API
server's 422 responses read like a real cluster's.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfusion.api.schema import (
    FieldError,
    apply_defaults,
    format_errors,
    prune,
    subschema,
    unknown_fields,
    validate,
)

QUANTITY = {
    "anyOf": [{"type": "integer"}, {"type": "string"}],
    "pattern": (r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
                r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"),
    "x-kubernetes-int-or-string": True,
}


def root(spec: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                                             "metadata": {"type": "object"}, "spec": spec}}


def obj(spec: Any) -> dict[str, Any]:
    return {"apiVersion": "example.com/v1", "kind": "Thing", "metadata": {"name": "t"}, "spec": spec}


def errors_for(spec_schema: dict[str, Any], spec: Any) -> list[FieldError]:
    return validate(root(spec_schema), obj(spec))


def one_error(spec_schema: dict[str, Any], spec: Any) -> FieldError:
    errors = errors_for(spec_schema, spec)
    assert len(errors) == 1, errors
    return errors[0]


# --- types ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("type_", "good", "bad", "bad_name"), [
    ("string", "x", 1, "integer"),
    ("integer", 3, "3", "string"),
    ("integer", 3, 1.5, "number"),
    ("number", 1.5, "1.5", "string"),
    ("boolean", True, "true", "string"),
    ("object", {}, [], "array"),
    ("array", [], {}, "object"),
])
def test_type_check_accepts_the_type_and_rejects_others(type_: str, good: Any, bad: Any, bad_name: str) -> None:
    schema = {"type": "object", "properties": {"v": {"type": type_}}}
    assert errors_for(schema, {"v": good}) == []
    error = one_error(schema, {"v": bad})
    assert error == FieldError(
        "spec.v", "FieldValueTypeInvalid",
        f'Invalid value: "{bad_name}": spec.v in body must be of type {type_}: "{bad_name}"')


def test_booleans_are_not_integers_and_integral_floats_are() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    assert one_error(schema, {"n": True}).reason == "FieldValueTypeInvalid"
    assert errors_for(schema, {"n": 2.0}) == []


def test_null_is_a_type_error_unless_nullable() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string", "nullable": True}}}
    assert errors_for(schema, {"b": None}) == []
    assert one_error(schema, {"a": None}).message == (
        'Invalid value: "null": spec.a in body must be of type string: "null"')


def test_int_or_string_accepts_both_and_rejects_floats_and_bad_patterns() -> None:
    schema = {"type": "object", "properties": {"q": QUANTITY}}
    assert errors_for(schema, {"q": 100}) == []
    assert errors_for(schema, {"q": "1.5Gi"}) == []
    error = one_error(schema, {"q": 1.5})
    assert error == FieldError("spec.q", "FieldValueTypeInvalid",
                               'Invalid value: "number": spec.q in body must be of type integer,string: "number"')
    errors = errors_for(schema, {"q": "12 GB"})
    assert errors[0].field == "spec.q"
    assert errors[0].message.startswith('Invalid value: "12 GB": spec.q in body should match \'^(\\+|-)?')


# --- object rules --------------------------------------------------------------------------------


def test_required_names_the_missing_child() -> None:
    schema = {"type": "object", "required": ["name", "size"],
              "properties": {"name": {"type": "string"}, "size": {"type": "integer"}}}
    assert errors_for(schema, {"name": "a"}) == [FieldError("spec.size", "FieldValueRequired", "Required value")]
    assert [e.field for e in errors_for(schema, {})] == ["spec.name", "spec.size"]


def test_nested_paths_use_dots_and_indexes() -> None:
    labels = {"type": "object", "additionalProperties": {"type": "string"}}
    pool = {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}, "labels": labels}}
    schema = {"type": "object", "properties": {"pools": {"type": "array", "items": pool}}}
    errors = errors_for(schema, {"pools": [{"name": "a"}, {"labels": {"x": 1}}]})
    assert [(e.field, e.reason) for e in errors] == [
        ("spec.pools[1].name", "FieldValueRequired"), ("spec.pools[1].labels.x", "FieldValueTypeInvalid")]


def test_enum_lists_supported_values() -> None:
    schema = {"type": "object", "properties": {"mode": {"type": "string", "enum": ["soft", "hard"]}}}
    assert errors_for(schema, {"mode": "hard"}) == []
    assert one_error(schema, {"mode": "x"}) == FieldError(
        "spec.mode", "FieldValueNotSupported", 'Unsupported value: "x": supported values: "soft", "hard"')


def test_enum_of_integers_does_not_accept_booleans() -> None:
    schema = {"type": "object", "properties": {"n": {"enum": [1, 2]}}}
    assert errors_for(schema, {"n": 1}) == []
    assert one_error(schema, {"n": True}).reason == "FieldValueNotSupported"


def test_min_and_max_properties() -> None:
    schema = {"type": "object", "properties": {"m": {"type": "object", "minProperties": 1, "maxProperties": 2,
                                                     "additionalProperties": {"type": "string"}}}}
    assert errors_for(schema, {"m": {"a": "1"}}) == []
    assert one_error(schema, {"m": {}}).message == 'Invalid value: {}: spec.m in body should have at least 1 properties'
    assert one_error(schema, {"m": {"a": "1", "b": "2", "c": "3"}}).reason == "FieldValueTooMany"


# --- numbers -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("rule", "value", "message"), [
    ({"minimum": 1}, 0, "Invalid value: 0: spec.n in body should be greater than or equal to 1"),
    ({"minimum": 1, "exclusiveMinimum": True}, 1, "Invalid value: 1: spec.n in body should be greater than 1"),
    ({"maximum": 100}, 101, "Invalid value: 101: spec.n in body should be less than or equal to 100"),
    ({"maximum": 100, "exclusiveMaximum": True}, 100, "Invalid value: 100: spec.n in body should be less than 100"),
    ({"multipleOf": 5}, 7, "Invalid value: 7: spec.n in body should be a multiple of 5"),
    ({"format": "int32"}, 2**31, 'Invalid value: 2147483648: spec.n in body must be of type int32: "2147483648"'),
])
def test_number_bounds(rule: dict[str, Any], value: int, message: str) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer", **rule}}}
    assert one_error(schema, {"n": value}) == FieldError("spec.n", "FieldValueInvalid", message)


def test_bounds_are_inclusive_by_default() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 100}}}
    assert errors_for(schema, {"n": 0}) == []
    assert errors_for(schema, {"n": 100}) == []


def test_int64_range() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer", "format": "int64"}}}
    assert errors_for(schema, {"n": 2**62}) == []
    assert one_error(schema, {"n": 2**63}).reason == "FieldValueInvalid"


# --- strings -------------------------------------------------------------------------------------


def test_string_lengths_and_pattern() -> None:
    schema = {"type": "object", "properties": {
        "short": {"type": "string", "maxLength": 3},
        "long": {"type": "string", "minLength": 2},
        "dns": {"type": "string", "pattern": "^[a-z]+$"},
    }}
    assert errors_for(schema, {"short": "abc", "long": "ab", "dns": "abc"}) == []
    assert one_error(schema, {"short": "abcd"}) == FieldError(
        "spec.short", "FieldValueTooLong", "Too long: may not be more than 3 bytes")
    assert one_error(schema, {"long": "a"}) == FieldError(
        "spec.long", "FieldValueInvalid", 'Invalid value: "a": spec.long in body should be at least 2 chars long')
    assert one_error(schema, {"dns": "A1"}) == FieldError(
        "spec.dns", "FieldValueInvalid", "Invalid value: \"A1\": spec.dns in body should match '^[a-z]+$'")


@pytest.mark.parametrize("value", ["2024-05-01T10:00:00Z", "2024-05-01T10:00:00.123+02:00", "2024-05-01 10:00:00"])
def test_date_time_accepts_rfc3339(value: str) -> None:
    schema = {"type": "object", "properties": {"t": {"type": "string", "format": "date-time"}}}
    assert errors_for(schema, {"t": value}) == []


@pytest.mark.parametrize("value", ["yesterday", "2024-13-01T10:00:00Z", "2024-05-01"])
def test_date_time_rejects_other_text(value: str) -> None:
    schema = {"type": "object", "properties": {"t": {"type": "string", "format": "date-time"}}}
    assert one_error(schema, {"t": value}).message == (
        f'Invalid value: "{value}": spec.t in body must be of type date-time: "{value}"')


# --- arrays --------------------------------------------------------------------------------------


def test_array_item_counts_and_sets() -> None:
    schema = {"type": "object", "properties": {
        "few": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
        "some": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "set": {"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "set"},
    }}
    assert errors_for(schema, {"few": ["a", "b"], "some": ["a"], "set": ["a", "b"]}) == []
    assert one_error(schema, {"few": ["a", "b", "c"]}) == FieldError(
        "spec.few", "FieldValueTooMany", "Too many: 3: must have at most 2 items")
    assert one_error(schema, {"some": []}) == FieldError(
        "spec.some", "FieldValueInvalid", "Invalid value: []: spec.some in body should have at least 1 items")
    assert one_error(schema, {"set": ["a", "a"]}) == FieldError(
        "spec.set[1]", "FieldValueDuplicate", 'Duplicate value: "a"')


# --- combinators ---------------------------------------------------------------------------------


def test_any_of_passes_when_one_branch_passes() -> None:
    schema = {"type": "object", "properties": {"v": {"anyOf": [{"maximum": 10}, {"minimum": 100}]}}}
    assert errors_for(schema, {"v": 5}) == []
    assert errors_for(schema, {"v": 500}) == []
    assert one_error(schema, {"v": 50}).message == (
        "Invalid value: 50: spec.v in body must validate at least one schema (anyOf)")


def test_one_of_needs_exactly_one_branch() -> None:
    schema = {"type": "object", "properties": {"v": {"type": "integer", "oneOf": [{"minimum": 10}, {"maximum": 20}]}}}
    assert errors_for(schema, {"v": 5}) == []
    assert one_error(schema, {"v": 15}).message == (
        "Invalid value: 15: spec.v in body must validate one and only one schema (oneOf)")


def test_all_of_reports_every_branch() -> None:
    schema = {"type": "object", "properties": {"v": {"type": "integer", "allOf": [{"minimum": 10}, {"multipleOf": 3}]}}}
    assert errors_for(schema, {"v": 12}) == []
    assert len(errors_for(schema, {"v": 4})) == 2


def test_not_rejects_matching_values() -> None:
    schema = {"type": "object", "properties": {"v": {"type": "integer", "not": {"enum": [1]}}}}
    assert errors_for(schema, {"v": 2}) == []
    assert one_error(schema, {"v": 1}).message == "Invalid value: 1: spec.v in body must not validate the schema (not)"


# --- root, metadata, embedded resources, free-form ------------------------------------------------


def test_root_metadata_is_checked_loosely() -> None:
    schema = root({"type": "object"})
    good = obj({})
    good["metadata"] = {"name": "a", "labels": {"k": "v"}, "managedFields": [{"anything": 1}]}
    assert validate(schema, good) == []
    bad = obj({})
    bad["metadata"] = {"name": 5, "labels": {"k": 1}}
    assert [e.field for e in validate(schema, bad)] == ["metadata.name", "metadata.labels.k"]


def test_embedded_resource_needs_api_version_and_kind() -> None:
    schema = {"type": "object", "properties": {"template": {
        "type": "object", "x-kubernetes-embedded-resource": True, "x-kubernetes-preserve-unknown-fields": True}}}
    assert errors_for(schema, {"template": {"apiVersion": "v1", "kind": "Pod", "spec": {"x": 1}}}) == []
    errors = errors_for(schema, {"template": {"spec": {}}})
    assert [(e.field, e.message) for e in errors] == [
        ("spec.template.apiVersion", "Required value: must not be empty"),
        ("spec.template.kind", "Required value: must not be empty")]


def test_preserved_unknown_fields_are_not_validated() -> None:
    schema = {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
              "properties": {"known": {"type": "integer"}}}
    assert errors_for(schema, {"anything": {"goes": [1, "a"]}, "known": 1}) == []
    assert one_error(schema, {"known": "x"}).field == "spec.known"


def test_format_errors_joins_like_kube_apiserver() -> None:
    a = FieldError("spec.a", "FieldValueRequired", "Required value")
    b = FieldError("spec.b", "FieldValueRequired", "Required value")
    assert format_errors([a]) == "spec.a: Required value"
    assert format_errors([a, b]) == "[spec.a: Required value, spec.b: Required value]"


# --- defaulting ----------------------------------------------------------------------------------

DEFAULTED: dict[str, Any] = {
    "type": "object",
    "properties": {
        "mode": {"type": "string", "default": "soft"},
        "nested": {"type": "object", "properties": {"port": {"type": "integer", "default": 8000}}},
        "withDefaultObject": {"type": "object", "default": {},
                              "properties": {"ratio": {"type": "integer", "default": 500}}},
        "items": {"type": "array", "items": {"type": "object",
                                             "properties": {"op": {"type": "string", "default": "In"}}}},
        "map": {"type": "object", "additionalProperties": {
            "type": "object", "properties": {"enabled": {"type": "boolean", "default": True}}}},
        "optional": {"type": "string"},
        "nullable": {"type": "string", "nullable": True},
        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
    },
}


def test_defaults_fill_absent_fields_and_only_present_nested_objects() -> None:
    spec: dict[str, Any] = {"items": [{}, {"op": "Exists"}], "map": {"a": {}, "b": {"enabled": False}}}
    apply_defaults(DEFAULTED, spec)
    assert spec == {
        "mode": "soft",
        "withDefaultObject": {"ratio": 500},  # a defaulted object is defaulted inside too
        "items": [{"op": "In"}, {"op": "Exists"}],
        "map": {"a": {"enabled": True}, "b": {"enabled": False}},
    }
    assert "nested" not in spec  # absent objects stay absent


def test_defaults_replace_nulls_and_nulls_without_defaults_are_dropped() -> None:
    spec: dict[str, Any] = {"mode": None, "optional": None, "nullable": None, "nested": {"port": None},
                            "free": {"keep": None}}
    apply_defaults(DEFAULTED, spec)
    assert spec["mode"] == "soft"
    assert "optional" not in spec
    assert spec["nullable"] is None
    assert spec["nested"] == {"port": 8000}
    assert spec["free"] == {"keep": None}  # free-form content is the user's


def test_defaults_are_copies() -> None:
    first: dict[str, Any] = {}
    second: dict[str, Any] = {}
    apply_defaults(DEFAULTED, first)
    apply_defaults(DEFAULTED, second)
    first["withDefaultObject"]["ratio"] = 1
    assert second["withDefaultObject"]["ratio"] == 500
    assert DEFAULTED["properties"]["withDefaultObject"]["default"] == {}


# --- pruning -------------------------------------------------------------------------------------

PRUNED: dict[str, Any] = root({
    "type": "object",
    "properties": {
        "known": {"type": "string"},
        "nested": {"type": "object", "properties": {"a": {"type": "integer"}}},
        "list": {"type": "array", "items": {"type": "object", "properties": {"a": {"type": "integer"}}}},
        "map": {"type": "object", "additionalProperties": {"type": "object", "properties": {"a": {"type": "integer"}}}},
        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                 "properties": {"inner": {"type": "object", "properties": {"a": {"type": "integer"}}}}},
        "anyMap": {"type": "object", "additionalProperties": True},
    },
})


def messy() -> dict[str, Any]:
    thing = obj({
        "known": "x", "unknown": 1,
        "nested": {"a": 1, "b": 2},
        "list": [{"a": 1, "z": 0}],
        "map": {"k": {"a": 1, "y": 2}},
        "free": {"whatever": {"deep": 1}, "inner": {"a": 1, "drop": 1}},
        "anyMap": {"x": {"y": 1}},
    })
    thing["status"] = {"phase": "Running"}
    thing["metadata"]["labels"] = {"a": "b"}
    return thing


def test_prune_drops_unknown_fields_everywhere_but_where_preserved() -> None:
    thing = prune(PRUNED, messy())
    assert thing == {
        "apiVersion": "example.com/v1", "kind": "Thing", "metadata": {"name": "t", "labels": {"a": "b"}},
        "spec": {
            "known": "x",
            "nested": {"a": 1},
            "list": [{"a": 1}],
            "map": {"k": {"a": 1}},
            "free": {"whatever": {"deep": 1}, "inner": {"a": 1}},
            "anyMap": {"x": {"y": 1}},
        },
    }


def test_unknown_fields_lists_what_prune_drops_without_changing_anything() -> None:
    thing = messy()
    before = copy.deepcopy(thing)
    assert unknown_fields(PRUNED, thing) == [
        "spec.unknown", "spec.nested.b", "spec.list[0].z", "spec.map.k.y", "spec.free.inner.drop", "status"]
    assert thing == before


def test_prune_keeps_meta_of_embedded_resources() -> None:
    schema = root({"type": "object", "properties": {"tpl": {
        "type": "object", "x-kubernetes-embedded-resource": True,
        "properties": {"spec": {"type": "object", "properties": {"a": {"type": "integer"}}}}}}})
    thing = prune(schema, obj({"tpl": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                                       "spec": {"a": 1, "b": 2}, "extra": 1}}))
    assert thing["spec"] == {"tpl": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"a": 1}}}


# --- subschema -----------------------------------------------------------------------------------


def test_subschema_follows_field_paths_and_jsonpaths() -> None:
    schema = PRUNED
    assert subschema(schema, "spec.nested.a") == {"type": "integer"}
    assert subschema(schema, ".spec.list[*].a") == {"type": "integer"}
    assert subschema(schema, "spec.list[3].a") == {"type": "integer"}
    assert subschema(schema, 'spec.map["any.key"].a') == {"type": "integer"}
    assert subschema(schema, ".metadata.labels.app\\.kubernetes\\.io/name") == {}
    assert subschema(schema, "spec.free.whatever.deep") == {}
    assert subschema(schema, "spec.nested.missing") is None
    assert subschema(schema, ".status.mode") is None


# --- properties ----------------------------------------------------------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.sampled_from(["", "a", "soft"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["known", "nested", "list", "map", "free", "a", "b", "mode", "items", "x"]), inner,
        max_size=4),
    max_leaves=12)


@settings(max_examples=150, deadline=None)
@given(_json)
def test_prune_is_idempotent_and_leaves_nothing_unknown(spec: Any) -> None:
    thing = prune(PRUNED, obj(spec))
    assert unknown_fields(PRUNED, thing) == []
    assert prune(PRUNED, copy.deepcopy(thing)) == thing


@settings(max_examples=150, deadline=None)
@given(_json)
def test_defaulting_is_idempotent_and_never_fails(spec: Any) -> None:
    once = apply_defaults(DEFAULTED, copy.deepcopy(spec))
    assert apply_defaults(DEFAULTED, copy.deepcopy(once)) == once
    validate(root(DEFAULTED), obj(once))  # any shape of input yields errors, never an exception


# --- a version known to be valid (valid_old) -------------------------------------------------------

TYPED: dict[str, Any] = {"type": "object", "properties": {
    "count": {"type": "integer", "minimum": 0},
    "flag": {"type": "boolean"},
    "name": {"type": "string", "maxLength": 3},
    "items": {"type": "array", "items": {"type": "integer", "minimum": 0}},
    "nested": {"type": "object", "properties": {"mode": {"type": "string", "enum": ["a", "soft"]}}},
}}
_valid_spec = st.fixed_dictionaries({}, optional={
    "count": st.integers(0, 5), "flag": st.booleans(), "name": st.sampled_from(["", "a", "abc"]),
    "items": st.lists(st.integers(0, 5), max_size=3),
    "nested": st.fixed_dictionaries({}, optional={"mode": st.sampled_from(["a", "soft"])}),
})


@settings(max_examples=300, deadline=None)
@given(_valid_spec, st.dictionaries(st.sampled_from(["count", "flag", "name", "items", "nested"]), _json, max_size=3))
def test_a_valid_old_version_never_changes_the_outcome(old_spec: dict[str, Any], changes: dict[str, Any]) -> None:
    old = obj(old_spec)
    assert validate(root(TYPED), old) == []
    new = obj({**copy.deepcopy(old_spec), **changes})
    assert validate(root(TYPED), new, old) == validate(root(TYPED), new)


def test_what_equals_the_valid_old_version_is_not_walked_again() -> None:
    # the caller vouches for valid_old: a part equal to it is taken as valid without a look
    stale = obj({"count": "many", "name": "toolong"})
    assert [e.field for e in validate(root(TYPED), stale)] == ["spec.count", "spec.name"]
    assert validate(root(TYPED), stale, stale) == []
    changed = obj({"count": "many", "name": "toolonger"})
    assert [e.field for e in validate(root(TYPED), changed, stale)] == ["spec.name"]


@pytest.mark.parametrize(("was", "now"), [(1, True), (0, False), (1, 1.0)])
def test_values_python_calls_equal_are_checked_when_their_json_differs(was: Any, now: Any) -> None:
    # True == 1 and 1.0 == 1 in Python; as JSON they are other values, which a schema may refuse
    schema = root({"type": "object", "properties": {"n": {"type": "integer"}, "l": {"type": "array", "items": {
        "type": "integer"}}}})
    errors = validate(schema, obj({"n": now, "l": [now]}), obj({"n": was, "l": [was]}))
    assert errors == validate(schema, obj({"n": now, "l": [now]}))
    assert bool(errors) == isinstance(now, bool)  # an integral float is an integer, a boolean is not
