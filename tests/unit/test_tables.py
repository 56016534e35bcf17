"""Printer-column JSONPath evaluation of the embedded API server (the subset kubectl columns use)."""

from __future__ import annotations

from typing import Any

import pytest

from tfusion.apiserver.tables import json_path

OBJ: dict[str, Any] = {
    "spec": {"items": [{"name": "a"}, {"name": "b"}]},
    "status": {
        "nodeSelector": {"kubernetes.io/hostname": "node-1"},
        "conditions": [{"type": "Ready", "status": "True"}, {"type": "Other", "status": "False"}],
    },
}


@pytest.mark.parametrize(("expression", "expected"), [
    (".spec.items[0].name", "a"),
    (".spec.items[*].name", "a"),  # the first match, as kube-apiserver's table converter prints
    (r".status.nodeSelector.kubernetes\.io/hostname", "node-1"),
    (".status.nodeSelector['kubernetes.io/hostname']", "node-1"),
    ('.status.conditions[?(@.type=="Ready")].status', "True"),
    (".status.missing", None),
])
def test_json_path(expression: str, expected: Any) -> None:
    value = json_path(expression)(OBJ)
    assert value == expected
