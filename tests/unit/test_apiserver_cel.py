"""CRD validation rules (x-kubernetes-validations): compiling, evaluating, paths, oldSelf, the step bound."""

from __future__ import annotations

from typing import Any

import pytest

from tfusion.apiserver import crd_rules
from tfusion.apiserver.cel import CompileError, StepMeter, compile_expression
from tfusion.apiserver.crd_rules import crd_rule_causes, validate

GANG_RULE = "!has(self.gang) || self.gang.minMembers <= self.replicas"


def rules(*entries: str | dict[str, Any]) -> list[dict[str, Any]]:
    return [{"rule": e} if isinstance(e, str) else e for e in entries]


def widget_schema(**spec_extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "type": "object",
        "properties": {
            "replicas": {"type": "integer"},
            "ratio": {"type": "number"},
            "port": {"x-kubernetes-int-or-string": True},
            "gang": {"type": "object", "properties": {"minMembers": {"type": "integer"}}},
            "name": {"type": "string"},
            "parts": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}, "count": {"type": "integer"}},
                    "x-kubernetes-validations": rules("self.count > 0"),
                },
            },
            "ports": {
                "type": "array",
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["name"],
                "items": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}, "number": {"type": "integer"}},
                    "x-kubernetes-validations": rules(
                        {"rule": "self.number == oldSelf.number", "message": "port numbers are immutable"}
                    ),
                },
            },
            "limits": {
                "type": "object",
                "additionalProperties": {"type": "integer", "x-kubernetes-validations": rules("self <= 100")},
            },
            "numbers": {"type": "array", "items": {"type": "integer"}},
        },
    }
    spec.update(spec_extra)
    return {"type": "object", "properties": {"spec": spec, "status": {"type": "object"}}}


def widget(spec: dict[str, Any], name: str = "w") -> dict[str, Any]:
    return {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": name, "uid": "u"}, "spec": spec}


# ------------------------------------------------------------------------------ compiling
def test_compile_reports_syntax_errors_and_undeclared_names() -> None:
    with pytest.raises(CompileError, match="syntax error at line 1"):
        compile_expression("self.replicas ==")
    with pytest.raises(CompileError, match="undeclared reference to 'replicas'"):
        compile_expression("replicas > 0")


def test_compile_accepts_macro_variables_and_detects_old_self() -> None:
    _, uses_old_self = compile_expression("self.all(item, item.count > 0) && size(self) < 10")
    assert uses_old_self is False
    _, uses_old_self = compile_expression("self == oldSelf")
    assert uses_old_self is True


def crd_with(schemas: list[dict[str, Any]]) -> dict[str, Any]:
    return {"spec": {"versions": [{"name": f"v{i}", "schema": {"openAPIV3Schema": s}} for i, s in enumerate(schemas)]}}


def test_crd_rule_errors_name_the_rule_under_spec_validation_when_versions_share_a_schema() -> None:
    schema = widget_schema(**{"x-kubernetes-validations": rules(GANG_RULE, "self.replicas >")})
    causes = crd_rule_causes(crd_with([schema, schema]))
    assert len(causes) == 1
    field, reason, message = causes[0]
    assert field == "spec.validation.openAPIV3Schema.properties[spec].x-kubernetes-validations[1].rule"
    assert reason == "FieldValueInvalid"
    assert message.startswith('Invalid value: "self.replicas >": compilation failed: syntax error')


def test_crd_rule_errors_name_the_version_when_schemas_differ() -> None:
    bad = widget_schema(**{"x-kubernetes-validations": rules("nope")})
    causes = crd_rule_causes(crd_with([widget_schema(), bad]))
    assert [c[0] for c in causes] == [
        "spec.versions[1].schema.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule"
    ]


def test_crd_rule_checks_old_self_placement_reason_and_message_expression() -> None:
    schema = widget_schema()
    schema["properties"]["spec"]["properties"]["parts"]["items"]["x-kubernetes-validations"] = rules("self == oldSelf")
    schema["properties"]["status"]["x-kubernetes-validations"] = rules(
        {"rule": "true", "reason": "FieldValueWrong", "messageExpression": "'a' +"}
    )
    fields = sorted(c[0] for c in crd_rule_causes(crd_with([schema])))
    base = "spec.validation.openAPIV3Schema.properties"
    assert fields == [
        f"{base}[spec].properties[parts].items.x-kubernetes-validations[0].rule",
        f"{base}[status].x-kubernetes-validations[0].messageExpression",
        f"{base}[status].x-kubernetes-validations[0].reason",
    ]


def test_rules_are_compiled_once_per_schema() -> None:
    schema = widget_schema(**{"x-kubernetes-validations": rules(GANG_RULE)})
    first = crd_rules.rules_for(schema)
    assert first is not None and first is crd_rules.rules_for(dict(schema))
    assert crd_rules.rules_for({"type": "object"}) is None


# ------------------------------------------------------------------------------ evaluating
def test_rule_at_spec_passes_and_fails_with_kubes_cause() -> None:
    schema = widget_schema(**{"x-kubernetes-validations": rules(GANG_RULE)})
    assert validate(schema, widget({"replicas": 3, "gang": {"minMembers": 3}}), None) == []
    assert validate(schema, widget({"replicas": 3}), None) == []
    assert validate(schema, widget({"replicas": 2, "gang": {"minMembers": 3}}), None) == [
        ("spec", "FieldValueInvalid", f'Invalid value: "object": failed rule: {GANG_RULE}')
    ]


def test_message_message_expression_reason_and_field_path() -> None:
    schema = widget_schema(
        **{
            "x-kubernetes-validations": rules(
                {"rule": "self.replicas < 10", "message": " too many replicas "},
                {
                    "rule": "self.replicas != 7",
                    "messageExpression": "'replicas may not be ' + string(self.replicas)",
                    "reason": "FieldValueForbidden",
                    "fieldPath": ".replicas",
                },
            )
        }
    )
    assert validate(schema, widget({"replicas": 12}), None) == [
        ("spec", "FieldValueInvalid", 'Invalid value: "object": too many replicas')
    ]
    assert validate(schema, widget({"replicas": 7}), None) == [
        ("spec.replicas", "FieldValueForbidden", "Forbidden: replicas may not be 7")
    ]


def test_root_rule_sees_name_but_not_other_metadata_and_reports_a_nil_path() -> None:
    schema = widget_schema()
    schema["x-kubernetes-validations"] = rules("self.metadata.name.startsWith('w-') && !has(self.metadata.uid)")
    assert validate(schema, widget({}, name="w-1"), None) == []
    assert validate(schema, widget({}, name="x"), None) == [
        (
            "<nil>",
            "FieldValueInvalid",
            "Invalid value: \"object\": failed rule: self.metadata.name.startsWith('w-') && !has(self.metadata.uid)",
        )
    ]


def test_rule_at_a_nested_list_item_and_map_value_names_the_element() -> None:
    obj = widget({"parts": [{"name": "a", "count": 1}, {"name": "b", "count": 0}], "limits": {"gpu": 101, "cpu": 5}})
    assert validate(widget_schema(), obj, None) == [
        ("spec.parts[1]", "FieldValueInvalid", 'Invalid value: "object": failed rule: self.count > 0'),
        ("spec.limits[gpu]", "FieldValueInvalid", "Invalid value: 101: failed rule: self <= 100"),
    ]


def test_integer_number_and_int_or_string_map_to_cel_types() -> None:
    schema = widget_schema(
        **{
            "x-kubernetes-validations": rules(
                "type(self.replicas) == int",
                "type(self.ratio) == double",  # JSON 2 in a number field is a double, as in kube
                "type(self.port) == string || type(self.port) == int",
            )
        }
    )
    assert validate(schema, widget({"replicas": 1, "ratio": 2, "port": "http"}), None) == []
    assert validate(schema, widget({"replicas": 1, "ratio": 2.5, "port": 8080}), None) == []


def test_evaluation_errors_are_reported_with_the_rule() -> None:
    schema = widget_schema(**{"x-kubernetes-validations": rules("self.gang.minMembers > 0")})
    assert validate(schema, widget({}), None) == [
        (
            "spec",
            "FieldValueInvalid",
            'Invalid value: "object": no such key: gang evaluating rule: self.gang.minMembers > 0',
        )
    ]


def test_errors_on_both_sides_of_or_report_the_missing_key_and_type_errors_the_overload() -> None:
    or_rule = "self.gang.minMembers == 0 || self.gang.minMembers >= 2"
    schema = widget_schema(**{"x-kubernetes-validations": rules(or_rule, "self.name > 1")})
    assert validate(schema, widget({"gang": {}, "name": "n"}), None) == [
        ("spec", "FieldValueInvalid", f'Invalid value: "object": no such key: minMembers evaluating rule: {or_rule}'),
        (
            "spec",
            "FieldValueInvalid",
            "Invalid value: \"object\": 'no such overload': call arguments did not match a supported operator, "
            "function or macro signature for rule: self.name > 1",
        ),
    ]


# ------------------------------------------------------------------------------ oldSelf and ratcheting
IMMUTABLE_NAME = {
    "name": {
        "type": "string",
        "x-kubernetes-validations": rules({"rule": "self == oldSelf", "message": "name is immutable"}),
    }
}


def test_transition_rule_runs_only_on_update() -> None:
    schema = widget_schema()
    schema["properties"]["spec"]["properties"].update(IMMUTABLE_NAME)
    assert validate(schema, widget({"name": "a"}), None) == []
    assert validate(schema, widget({"name": "a"}), widget({"name": "a"})) == []
    assert validate(schema, widget({"name": "b"}), widget({"name": "a"})) == [
        ("spec.name", "FieldValueInvalid", 'Invalid value: "b": name is immutable')
    ]
    # no old value at this node (the field was unset): the transition rule does not run
    assert validate(schema, widget({"name": "b"}), widget({})) == []


def test_list_map_items_correlate_by_key_for_old_self() -> None:
    old = widget({"ports": [{"name": "http", "number": 80}, {"name": "grpc", "number": 90}]})
    reordered = widget({"ports": [{"name": "grpc", "number": 90}, {"name": "http", "number": 80}, {"name": "x"}]})
    assert validate(widget_schema(), reordered, old) == []
    changed = widget({"ports": [{"name": "grpc", "number": 91}]})
    assert validate(widget_schema(), changed, old) == [
        ("spec.ports[0]", "FieldValueInvalid", 'Invalid value: "object": port numbers are immutable')
    ]


def test_unchanged_values_are_ratcheted() -> None:
    schema = widget_schema(**{"x-kubernetes-validations": rules(GANG_RULE)})
    stored = widget({"replicas": 1, "gang": {"minMembers": 2}})  # written before the rule existed
    assert validate(schema, widget({"replicas": 1, "gang": {"minMembers": 2}}), stored) == []
    assert validate(schema, widget({"replicas": 1, "gang": {"minMembers": 3}}), stored) != []


# ------------------------------------------------------------------------------ the bound
def test_a_rule_past_its_step_limit_stops_validation() -> None:
    schema = widget_schema(**{"x-kubernetes-validations": rules("self.numbers.all(x, x >= 0)", "self.replicas > 100")})
    obj = widget({"replicas": 1, "numbers": list(range(1000))})
    assert validate(schema, obj, None) == [
        ("spec", "FieldValueInvalid", 'Invalid value: "object": failed rule: self.replicas > 100')
    ]
    causes = validate(schema, obj, None, StepMeter(rule_limit=500))
    assert causes == [
        (
            "spec",
            "FieldValueInvalid",
            "Invalid value: \"object\": 'operation cancelled: actual cost limit exceeded': no further validation "
            "rules will be run due to call cost exceeds limit for rule: self.numbers.all(x, x >= 0)",
        )
    ]


def test_the_object_budget_is_shared_by_all_rules() -> None:
    schema = widget_schema(**{"x-kubernetes-validations": rules("self.numbers.all(x, x >= 0)")})
    obj = widget({"numbers": list(range(100)), "parts": [{"name": "a", "count": 1}]})
    assert validate(schema, obj, None, StepMeter(remaining=10_000)) == []
    causes = validate(schema, obj, None, StepMeter(remaining=200))
    assert causes == [
        (
            "spec",
            "FieldValueInvalid",
            'Invalid value: "object": validation failed due to running out of cost budget, '
            "no further validation rules will be run",
        )
    ]


def test_default_bound_stops_a_huge_list() -> None:
    schema = widget_schema(**{"x-kubernetes-validations": rules("self.numbers.all(x, x >= 0)")})
    causes = validate(schema, widget({"numbers": list(range(100_000))}), None)
    assert len(causes) == 1 and "cost limit exceeded" in causes[0][2]


def test_remembered_results_keep_paths_and_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Equal values are evaluated once; each element still gets its own cause, and a remembered
    result is charged its steps, so the object budget runs out where it would without the memo."""
    schema = widget_schema()
    parts = [{"name": "a", "count": 0}] * 3
    assert validate(schema, widget({"parts": parts}), None) == [
        (f"spec.parts[{i}]", "FieldValueInvalid", 'Invalid value: "object": failed rule: self.count > 0')
        for i in range(3)
    ]
    many = widget({"parts": [{"name": "a", "count": 1}] * 2000})
    remembered = validate(schema, many, None, StepMeter(remaining=5_000))
    with monkeypatch.context() as patch:
        patch.setattr(crd_rules, "_MEMO_VALUE_BYTES", 0)  # nothing is remembered
        evaluated = validate(schema, many, None, StepMeter(remaining=5_000))
    assert remembered == evaluated and len(evaluated) == 1 and "running out of cost budget" in evaluated[0][2]
