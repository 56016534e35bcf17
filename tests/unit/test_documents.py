"""The bounded JSON/YAML loader (`tfusion.api.documents`): what it accepts, and that each hostile
document is refused with a message that says what was wrong."""

from __future__ import annotations

import gc

import pytest

from tfusion.api.documents import (
    DocumentError,
    DocumentTooLarge,
    check_decoded,
    check_value,
    collector_paused,
    load_json,
    load_json_or_yaml,
    load_yaml,
)

LIMIT = 1024 * 1024


def test_json_compatible_yaml_reads_as_kube_would() -> None:
    text = b"a: 0x1F\nb: 1_000\nc: 2024-01-01\nd: yes\ne: ~\nf: 1.5\ng: '007'\n5: five\n"
    assert load_yaml(text, max_bytes=LIMIT) == {"a": 31, "b": 1000, "c": "2024-01-01", "d": True, "e": None,
                                                "f": 1.5, "g": "007", "5": "five"}


def test_merge_keys_and_plain_aliases_within_the_budget() -> None:
    text = b"base: &b {x: 1, y: 1}\nc:\n  <<: *b\n  y: 2\nd: [*b, *b]\n"
    assert load_yaml(text, max_bytes=LIMIT) == {"base": {"x": 1, "y": 1}, "c": {"x": 1, "y": 2},
                                                "d": [{"x": 1, "y": 1}, {"x": 1, "y": 1}]}


def test_earlier_merge_sources_win_and_own_keys_win_over_all() -> None:
    text = b"a: &a {x: a, y: a}\nb: &b {x: b, z: b}\nc:\n  <<: [*a, *b]\n  z: own\n"
    assert load_yaml(text, max_bytes=LIMIT)["c"] == {"x": "a", "y": "a", "z": "own"}
    with pytest.raises(DocumentError, match="a merge key"):
        load_yaml(b"a: &a [1]\nb: {<<: *a}\n", max_bytes=LIMIT)


def test_json_first_then_yaml() -> None:
    assert load_json_or_yaml(b'{"kind": "Pod"}', max_bytes=LIMIT) == {"kind": "Pod"}
    assert load_json_or_yaml(b"kind: Pod\n", max_bytes=LIMIT) == {"kind": "Pod"}
    assert load_json_or_yaml(b"", max_bytes=LIMIT) is None


def bomb(levels: int) -> bytes:
    lines = [b'a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [b"a%d: &a%d [%s]" % (i, i, b",".join([b"*a%d" % (i - 1)] * 9)) for i in range(1, levels)]
    return b"\n".join(lines)


@pytest.mark.parametrize(("text", "fragment"), [
    (bomb(9), "expands (with its aliases) to more than 1048576 bytes"),
    (b"a: &a [*a]", "an alias refers to the node that contains it"),
    (b"a: &a {b: *a}", "an alias refers to the node that contains it"),
    (b"a: !!binary aGVsbG8=", "tag:yaml.org,2002:binary is not allowed"),
    (b"a: !!set {x, y}", "tag:yaml.org,2002:set is not allowed"),
    (b"a: !!omap [{x: 1}]", "omap is not allowed"),
    (b"a: !!python/tuple [1]", "python/tuple is not allowed"),
    (b"a: !local x", "the tag !local is not allowed"),
    (b"a: " + b"9" * 5000, "an integer of 5000 characters does not fit in 64 bits"),
    (b"a: 18446744073709551616", "does not fit in 64 bits"),
    (b"a: -9223372036854775809", "does not fit in 64 bits"),
    (b"a: .nan", "not a finite number"),
    (b"a: -.inf", "not a finite number"),
    (b"- " * 101 + b"x", "nested more than 100 levels deep"),
    (b"[" * 5000 + b"]" * 5000, "nesting depth"),  # libyaml's own limit (1,000) is reached first
    (b"? [a]\n: b\n", "a mapping key must be a string"),
    (b"a: [1, 2", "invalid YAML"),
])
def test_hostile_yaml_is_refused(text: bytes, fragment: str) -> None:
    with pytest.raises(DocumentError, match="invalid YAML") as refused:
        load_yaml(text, max_bytes=LIMIT)
    assert fragment in str(refused.value)


def test_an_alias_bomb_is_refused_before_it_is_built() -> None:
    # 9**8 scalars if expanded; the refusal comes from measuring the composed graph
    with pytest.raises(DocumentError, match="expands"):
        load_yaml(bomb(9), max_bytes=LIMIT)
    small = load_yaml(bomb(3), max_bytes=LIMIT)  # 729 scalars: fine
    assert small["a1"] == [["x"] * 9] * 9 and small["a2"] == [small["a1"]] * 9


def test_a_large_plain_document_is_told_apart_from_an_alias_bomb() -> None:
    # over the budget by its own text: DocumentTooLarge (an edge may answer 413), with the size counted
    with pytest.raises(DocumentTooLarge, match="larger than 1048576 bytes") as large:
        load_yaml(b"k: " + b"x" * (LIMIT + 10), max_bytes=LIMIT)
    assert large.value.size > LIMIT
    # over it through aliases: a plain DocumentError
    with pytest.raises(DocumentError) as bombed:
        load_yaml(bomb(9), max_bytes=LIMIT)
    assert not isinstance(bombed.value, DocumentTooLarge)


def test_problem_is_the_message_without_its_lead() -> None:
    with pytest.raises(DocumentError) as refused:
        load_yaml(b"a: !!binary aGVsbG8=", max_bytes=LIMIT)
    assert str(refused.value) == f"invalid YAML: {refused.value.problem}"
    assert refused.value.problem.startswith("line 1: the tag tag:yaml.org,2002:binary")


@pytest.mark.parametrize(("value", "fragment"), [
    ({"a": [2**64]}, "the integer 18446744073709551616 does not fit in 64 bits"),
    ([-(2**63) - 1], "does not fit in 64 bits"),
    ({"a": 10**400}, "the integer of about 400 digits"),
    ({"a": {"b": float("inf")}}, "inf is not a finite number"),
    (float("nan"), "nan is not a finite number"),
    ({"a": [[[]]]}, "nested more than 3 levels deep"),
])
def test_check_value_refuses_what_the_loaders_refuse(value: object, fragment: str) -> None:
    with pytest.raises(DocumentError) as refused:
        check_value(value, 3)
    assert fragment in str(refused.value)


def test_check_value_accepts_the_edges_of_the_bounds() -> None:
    check_value({"a": [[2**64 - 1, -(2**63), 1.5, True, None, "x"]]}, 3)


@pytest.mark.parametrize(("text", "fragment"), [
    (b"[" * 2000 + b"]" * 2000, "nested more than 100 levels deep"),
    (b"[" * 101 + b"]" * 101, "nested more than 100 levels deep"),
    (b'{"a": ' + b"7" * 5000 + b"}", "a number is too large"),
    (b"{nope", "invalid JSON"),
])
def test_hostile_json_is_refused(text: bytes, fragment: str) -> None:
    with pytest.raises(DocumentError) as refused:
        load_json(text)
    assert fragment in str(refused.value)
    assert load_json(b"[" * 100 + b"]" * 100) is not None  # 100 levels are allowed


def test_decoded_json_is_walked_only_when_its_brackets_could_nest_too_deep() -> None:
    deep = b"[" * 4 + b"]" * 4
    with pytest.raises(DocumentError, match="nested more than 3 levels deep"):
        check_decoded([[[[]]]], deep, 3)
    # brackets inside strings are counted too, so the value is walked, and found within bounds
    in_strings = b'{"a": "[[[[{{{{", "b": [[]]}'
    check_decoded({"a": "[[[[{{{{", "b": [[]]}, in_strings, 3)
    # ...and a string of brackets is no container at all
    check_decoded("[[[[", b'"[[[["', 3)
    # few brackets: nothing to walk (the value passed does not matter then, which is the point)
    check_decoded([[[[]]]], b"[[]]", 3)
    # a deep object found among brackets in strings is refused all the same
    deep_under_strings = b'{"s": "[[[[", "a": {"b": {"c": {}}}}'
    with pytest.raises(DocumentError, match="nested more than 3 levels deep"):
        check_decoded(load_json(deep_under_strings), deep_under_strings, 3)


def test_json_out_of_bounds_is_not_retried_as_yaml() -> None:
    with pytest.raises(DocumentError, match=r"^invalid JSON: nested more than 100"):
        load_json_or_yaml(b"[" * 2000 + b"]" * 2000, max_bytes=LIMIT)
    with pytest.raises(DocumentError, match=r"^neither JSON nor YAML: invalid JSON: .*; invalid YAML"):
        load_json_or_yaml(b"{not json: [", max_bytes=LIMIT)
    with pytest.raises(DocumentError, match="not UTF-8"):
        load_json_or_yaml(b"\xff\xfe\x00\x01", max_bytes=LIMIT)


def test_the_collector_pause_nests_and_restores() -> None:
    assert gc.isenabled()
    with collector_paused():
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # it was off before: it stays off
    finally:
        gc.enable()


def test_a_refused_document_leaves_the_collector_on() -> None:
    for text in (bomb(9), b"a: &a [*a]", b"a: [1, 2"):
        with pytest.raises(DocumentError):
            load_yaml(text, max_bytes=LIMIT)
    with pytest.raises(DocumentError):
        load_json(b"[" * 2000)
    assert gc.isenabled()
