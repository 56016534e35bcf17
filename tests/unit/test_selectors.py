"""Label and field selectors: Kubernetes grammar, validation messages, and matching."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tfusion.api.selectors import (
    EVERYTHING,
    NOTHING,
    SelectorError,
    label_selector_from_dict,
    parse_field_selector,
    parse_label_selector,
)

LABELS = {"app": "web", "tier": "frontend", "tensor-fusion.ai/pool": "p1", "gen": "3", "empty": ""}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", True),
        ("   ", True),
        ("app=web", True),
        ("app==web", True),
        ("app = web", True),
        ("app=db", False),
        ("app!=db", True),
        ("app!=web", False),
        ("missing!=x", True),
        ("app in (web,db)", True),
        ("app in ( db , web )", True),
        ("app in (db)", False),
        ("missing in (web)", False),
        ("app notin (db, cache)", True),
        ("app notin (web)", False),
        ("missing notin (web)", True),
        ("app", True),
        ("missing", False),
        ("!missing", True),
        ("!app", False),
        ("! app", False),
        ("app=web,tier=frontend", True),
        ("app=web,tier=backend", False),
        ("app=web, tier in (frontend), !missing, gen", True),
        ("tensor-fusion.ai/pool=p1", True),
        ("tensor-fusion.ai/pool in (p2)", False),
        ("empty=", True),
        ("empty==", True),
        ("app=", False),
        ("empty in (,x)", True),
        ("empty in ()", True),
        ("gen>2", True),
        ("gen>3", False),
        ("gen<4", True),
        ("app>1", False),
        ("missing<9", False),
        ("app in(web)", True),
    ],
)
def test_label_selector_text_matches(text: str, expected: bool) -> None:
    assert parse_label_selector(text).matches(LABELS) is expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("app in web", "expected '\\(' to open the value set"),
        ("app in (web", "missing '\\)'"),
        ("app in (a b)", "unexpected 'b'"),
        ("app=web tier=x", "expected ',' or end of selector"),
        ("app=web,", "expected a label key, found end of selector"),
        (",app", "expected a label key, found ','"),
        ("app=(x)", "expected a value for key 'app'"),
        ("app=-bad", "invalid label value '-bad' for key 'app'"),
        ("app=" + "v" * 64, "63 characters or less"),
        ("-app=x", "invalid label key '-app'"),
        ("Bad_Prefix/app=x", "prefix 'Bad_Prefix' must be a lowercase DNS subdomain"),
        ("/app=x", "prefix part must be non-empty"),
        ("k" * 64 + "=x", "invalid label key"),
        ("gen>x", "must be an integer"),
        ("app%in (x)", "invalid label key 'app%in'"),
        ("!", "expected a label key after '!'"),
    ],
)
def test_label_selector_text_errors(text: str, message: str) -> None:
    with pytest.raises(SelectorError, match=message):
        parse_label_selector(text)


def test_label_selector_unknown_word_operator() -> None:
    with pytest.raises(SelectorError, match="unknown operator 'within'"):
        parse_label_selector("app within (x)")


def test_label_selector_matches_none_labels_and_round_trips() -> None:
    sel = parse_label_selector("app!=x,!gone,tier notin (a)")
    assert sel.matches(None)
    assert parse_label_selector(str(sel)) == sel
    assert parse_label_selector("app").matches(None) is False
    assert str(parse_label_selector("a in (y,x),b,!c,d>3")) == "a in (x,y),b,!c,d>3"


def test_empty_and_nil_selectors() -> None:
    assert parse_label_selector("") is EVERYTHING and EVERYTHING.empty
    assert label_selector_from_dict({}).matches({}) and label_selector_from_dict({}).empty
    assert label_selector_from_dict(None) is NOTHING
    assert not NOTHING.matches(LABELS) and not NOTHING.empty


def test_label_selector_from_dict() -> None:
    sel = label_selector_from_dict(
        {
            "matchLabels": {"app": "web"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["frontend", "x"]},
                {"key": "stage", "operator": "NotIn", "values": ["prod"]},
                {"key": "gen", "operator": "Exists"},
                {"key": "legacy", "operator": "DoesNotExist"},
            ],
        }
    )
    assert sel.matches(LABELS)
    assert not sel.matches({**LABELS, "legacy": "1"})
    assert not sel.matches({**LABELS, "stage": "prod"})
    assert not sel.matches({**LABELS, "app": "db"})
    assert not sel.matches({k: v for k, v in LABELS.items() if k != "gen"})


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        (
            {"matchExpressions": [{"key": "a", "operator": "Equals", "values": ["x"]}]},
            r"matchExpressions\[0\]\.operator: unsupported value 'Equals'; "
            "allowed: In, NotIn, Exists, DoesNotExist",
        ),
        (
            {"matchExpressions": [{"key": "a", "operator": "In", "values": []}]},
            r"\.values: must be non-empty for operator In",
        ),
        (
            {"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]},
            r"must be empty for operator Exists",
        ),
        ({"matchExpressions": [{"operator": "Exists"}]}, r"matchExpressions\[0\]\.key: required string"),
        ({"matchExpressions": [{"key": "a b", "operator": "Exists"}]}, r"\.key: invalid label key 'a b'"),
        (
            {"matchExpressions": [{"key": "a", "operator": "In", "values": ["ok", "not ok"]}]},
            r"\.values: invalid label value 'not ok'",
        ),
        ({"matchLabels": {"a": "-x"}}, r"selector\.matchLabels: invalid label value '-x'"),
        ({"matchLabels": {"a": 1}}, r"must be strings"),
        ({"matchLabels": ["a"]}, r"matchLabels: must be a map"),
        ({"matchExpressions": {}}, r"matchExpressions: must be a list"),
        ("app=x", r"must be an object"),
    ],
)
def test_label_selector_from_dict_errors(selector: Any, message: str) -> None:
    with pytest.raises(SelectorError, match=message):
        label_selector_from_dict(selector)


def test_field_name_in_dict_errors() -> None:
    with pytest.raises(SelectorError, match=r"^spec\.objectSelector\.matchLabels"):
        label_selector_from_dict({"matchLabels": {"a": "-"}}, field="spec.objectSelector")


label_values = st.from_regex(r"\A([A-Za-z0-9]([-A-Za-z0-9_.]{0,10}[A-Za-z0-9])?)?\Z")


@given(st.dictionaries(st.sampled_from(["a", "b", "c", "x.io/d"]), label_values, max_size=4), label_values)
def test_equality_and_set_forms_agree(labels: dict[str, str], value: str) -> None:
    for key in ("a", "x.io/d"):
        eq = parse_label_selector(f"{key}={value}").matches(labels)
        assert eq == parse_label_selector(f"{key} in ({value})").matches(labels)
        assert eq == (labels.get(key) == value)
        assert parse_label_selector(f"{key}!={value}").matches(labels) is not eq
        assert parse_label_selector(f"{key}").matches(labels) == (key in labels)


# ------------------------------------------------------------------------------------------------
# field selectors

POD = {
    "metadata": {"name": "p1", "namespace": "default", "labels": {"a": "b"}},
    "spec": {"nodeName": "node-1", "hostNetwork": True, "priority": 5},
    "status": {"phase": "Running"},
}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", True),
        ("metadata.name=p1", True),
        ("metadata.name==p1", True),
        ("metadata.name!=p1", False),
        ("metadata.namespace=default,status.phase=Running", True),
        ("metadata.namespace=default,status.phase!=Running", False),
        ("spec.nodeName=", False),
        ("spec.schedulerName=", True),
        ("spec.schedulerName!=", False),
        ("spec.nodeName!=", True),
        ("spec.hostNetwork=true", True),
        ("spec.priority=5", True),
        ("status.podIP=", True),
        ("metadata.name.deeper=", True),
        (" metadata.name = p1 ", False),
        ("metadata.name=p1 , status.phase=Running", False),
    ],
)
def test_field_selector_matches(text: str, expected: bool) -> None:
    assert parse_field_selector(text).matches(POD) is expected


def test_field_selector_escapes() -> None:
    obj = {"metadata": {"name": "a,b=c\\d"}}
    sel = parse_field_selector(r"metadata.name=a\,b\=c\\d")
    assert sel.matches(obj)
    assert parse_field_selector(str(sel)) == sel
    assert sel.value_for("metadata.name") == "a,b=c\\d"
    assert sel.paths == frozenset({"metadata.name"})


def test_field_selector_whitespace_around_terms() -> None:
    sel = parse_field_selector("metadata.name=p1, status.phase=Running")
    assert sel.matches(POD)
    assert [r.path for r in sel.requirements] == ["metadata.name", "status.phase"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("metadata.name", "expected <field>=<value>"),
        ("=x", "expected <field>=<value>"),
        ("metadata..name=x", "must be dot-separated names"),
        ("metadata.name=a=b", "unescaped '='"),
        (r"metadata.name=a\x", "must be followed by"),
    ],
)
def test_field_selector_errors(text: str, message: str) -> None:
    with pytest.raises(SelectorError, match=message):
        parse_field_selector(text)
