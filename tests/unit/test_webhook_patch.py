"""The webhook's JSON patch: for any two JSON documents, the patch turns the first into the second."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from tfusion.apiserver.patch import json_patch
from tfusion.controller.webhook.patch import json_diff

KEYS = st.sampled_from(["a", "b", "c/d", "e~f", "metadata", "0"])
SCALARS = st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from([1.0, 0.5]) | st.sampled_from(["", "x"])
DOCUMENTS = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4),
                         max_leaves=20)


def as_json(value: Any) -> bytes:
    """JSON text in which numbers compare as numbers (1 == 1.0) and booleans are not numbers."""

    def numbers(v: Any) -> Any:
        if isinstance(v, float) and v.is_integer():
            return int(v)
        if isinstance(v, list):
            return [numbers(x) for x in v]
        if isinstance(v, dict):
            return {k: numbers(x) for k, x in v.items()}
        return v

    return orjson.dumps(numbers(value), option=orjson.OPT_SORT_KEYS)


@settings(max_examples=400, deadline=None)
@given(before=st.dictionaries(KEYS, DOCUMENTS, max_size=5), after=st.dictionaries(KEYS, DOCUMENTS, max_size=5))
def test_the_patch_turns_before_into_after(before: dict[str, Any], after: dict[str, Any]) -> None:
    patched = json_patch(before, json_diff(before, after))
    assert as_json(patched) == as_json(after)


@given(doc=st.dictionaries(KEYS, DOCUMENTS, max_size=5))
def test_an_unchanged_document_needs_no_operation(doc: dict[str, Any]) -> None:
    assert json_diff(doc, orjson.loads(orjson.dumps(doc))) == []
