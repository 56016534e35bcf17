"""The bounded JSON/YAML loader (`tfusion.api.documents`): what it accepts, and that each hostile
document is refused with a message that says what was wrong."""

from __future__ import annotations

import gc

import pytest

from tfusion.api.documents import DocumentError, collector_paused, load_json, load_json_or_yaml, load_yaml

LIMIT = 1024 * 1024


def test_json_compatible_yaml_reads_as_kube_would() -> None:
    text = b"a: 0x1F\nb: 1_000\nc: 2024-01-01\nd: yes\ne: ~\nf: 1.5\ng: '007'\n5: five\n"
    assert load_yaml(text, max_bytes=LIMIT) == {"a": 31, "b": 1000, "c": "2024-01-01", "d": True, "e": None,
                                                "f": 1.5, "g": "007", "5": "five"}


def test_merge_keys_and_plain_aliases_within_the_budget() -> None:
    text = b"base: &b {x: 1, y: 1}\nc:\n  <<: *b\n  y: 2\nd: [*b, *b]\n"
    assert load_yaml(text, max_bytes=LIMIT) == {"base": {"x": 1, "y": 1}, "c": {"x": 1, "y": 2},
                                                "d": [{"x": 1, "y": 1}, {"x": 1, "y": 1}]}


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
