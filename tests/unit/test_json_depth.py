"""`tfusion.web.json_depth_problem`, the scan that refuses JSON nested too deep before any decoder
sees it: exact at the bound, blind to brackets inside strings (escaped quotes and backslashes
included, wherever the scan's steps cut them), and cheap on the deepest bodies. Also Go's integer
grammar (`parse_go_int`) and the extender's body limit against the node it is derived from."""

from __future__ import annotations

from typing import Any

import hypothesis
import orjson
import pytest
from hypothesis import strategies as st

from tfusion.api.strconv import INT64_MAX, INT64_MIN
from tfusion.controller.scheduling.extender_sizing import POD_ALLOWANCE_BYTES, SIZED_FOR_NODES, extender_args_bytes
from tfusion.controller.scheduling.http import EXTENDER_MAX_BODY_BYTES
from tfusion.web import depth, json_depth_problem, parse_go_int


def depth_of(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((depth_of(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth_of(v) for v in value), default=0)
    return 0


def test_the_bound_is_exact() -> None:
    assert json_depth_problem(b"[" * 100 + b"]" * 100) is None
    assert json_depth_problem(b"[" * 101 + b"]" * 101) == "nested more than 100 levels deep"
    assert json_depth_problem(b'  {"a": ' * 50 + b'[' * 50 + b"1" + b"]" * 50 + b"}" * 50) is None
    assert json_depth_problem(b'\n{"a": ' * 51 + b'[' * 50 + b"1" + b"]" * 50 + b"}" * 51) is not None


def test_brackets_in_strings_do_not_count() -> None:
    text = '[' + '"' + '[' * 500 + '\\"' + '{' * 500 + '\\\\' + '"' + ', "x\\\\\\"[[[["]'
    assert orjson.loads(text)  # valid JSON, depth 1
    assert json_depth_problem(text.encode()) is None
    assert json_depth_problem(text.encode(), max_depth=0) is not None


def test_what_is_not_a_json_container_is_left_to_its_reader() -> None:
    assert json_depth_problem(b"a: " + b"[" * 500) is None  # YAML: its own reader bounds it
    assert json_depth_problem(b"") is None and json_depth_problem(b"   ") is None
    assert json_depth_problem(b'"[[[[["') is None


def test_a_two_hundred_thousand_deep_body_is_refused_quickly() -> None:
    body = bytearray(b"[" * 200_000 + b"]" * 200_000)
    assert json_depth_problem(body) is not None


json_strings = st.text(alphabet=st.sampled_from(list('[]{}"\\ab ')), max_size=12)
json_values = st.recursive(st.none() | st.integers(-1000, 1000) | json_strings,
                           lambda children: st.lists(children, max_size=4)
                           | st.dictionaries(json_strings, children, max_size=4), max_leaves=40)


@hypothesis.settings(max_examples=300, derandomize=True, database=None, deadline=None)
@hypothesis.given(value=json_values, bound=st.integers(0, 6), step=st.integers(1, 9), pad=st.integers(0, 3))
def test_the_scan_agrees_with_the_decoded_depth(value: Any, bound: int, step: int, pad: int) -> None:
    """Steps of a few bytes cut escapes, strings and brackets at every possible place."""
    body = b" " * pad + orjson.dumps(value)
    saved = depth._DEPTH_STEP
    depth._DEPTH_STEP = step
    try:
        verdict = json_depth_problem(body, max_depth=bound)
    finally:
        depth._DEPTH_STEP = saved
    if isinstance(value, dict | list):
        assert (verdict is not None) == (depth_of(value) > bound), (body, bound, step)
    else:
        assert verdict is None


@pytest.mark.parametrize(("text", "value"), [
    ("0", 0), ("7", 7), ("+5", 5), ("-12", -12), ("007", 7), ("-0", 0),
    (str(INT64_MAX), INT64_MAX), (str(INT64_MIN), INT64_MIN), ("0" * 30 + "1", 1),
])
def test_go_integers(text: str, value: int) -> None:
    assert parse_go_int(text) == value


@pytest.mark.parametrize("text", [
    "", "+", "-", "1_0", " 5", "5 ", "1e3", "5.0", "0x10", "\u0663", "١٢", str(INT64_MAX + 1), str(INT64_MIN - 1),
    "9" * 5000, "++1", "True",
])
def test_not_go_integers(text: str) -> None:
    assert parse_go_int(text) is None


def test_the_extender_limit_covers_a_5000_node_cluster() -> None:
    needed = extender_args_bytes(SIZED_FOR_NODES) + POD_ALLOWANCE_BYTES
    assert needed <= EXTENDER_MAX_BODY_BYTES < needed * 1.25, (needed, EXTENDER_MAX_BODY_BYTES)
