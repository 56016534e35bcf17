"""Integers beyond 64 bits in a request body (issue 23): a JSON literal is read as the nearest float,
as kube-apiserver reads it into an unstructured object, so no reader ever holds an integer beyond
64 bits; YAML's and a decoded value's are refused; a literal beyond a float's range is refused."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tfusion.api.documents import DocumentError, check_value, load_json, load_json_or_yaml, load_yaml

BIG = 123456789012345678901234567890


@pytest.mark.parametrize("load", [load_json, lambda body: load_json_or_yaml(body, max_bytes=1 << 20)],
                         ids=["load_json", "load_json_or_yaml"])
def test_a_json_integer_beyond_64_bits_is_read_as_a_float(load: Callable[[bytes], Any]) -> None:
    value = load(b'{"a": %d, "b": [-%d]}' % (BIG, BIG))
    assert value == {"a": float(BIG), "b": [-float(BIG)]}
    assert isinstance(value["a"], float) and isinstance(value["b"][0], float)


@pytest.mark.parametrize(("literal", "expected"), [
    (b"18446744073709551615", 2**64 - 1), (b"-9223372036854775808", -(2**63)),
    (b"18446744073709551616", float(2**64)), (b"-9223372036854775809", float(-(2**63) - 1)),
])
def test_the_64_bit_edges(literal: bytes, expected: int | float) -> None:
    value = load_json(literal)
    assert value == expected and type(value) is type(expected)


def test_a_json_literal_beyond_a_floats_range_is_refused() -> None:
    with pytest.raises(DocumentError, match="too large"):
        load_json(b'{"a": 1' + b"0" * 400 + b"}")


def test_yaml_and_decoded_values_beyond_64_bits_are_refused() -> None:
    with pytest.raises(DocumentError, match="does not fit in 64 bits"):
        load_yaml(b"a: %d\n" % BIG, max_bytes=1 << 20)
    with pytest.raises(DocumentError, match="does not fit in 64 bits"):
        check_value({"a": [BIG]})
    check_value({"a": [float(BIG), 2**64 - 1]})
