"""kube-apiserver's rules for label and annotation keys and values.

Labels are matched by selectors and printed by kubectl, annotations are read by controllers; kube
refuses keys and values outside these rules with 422, and so must we, or a client that works
against tfusion breaks against a real cluster (and a 300 KB annotation sits in every list and
watch event of its kind).

- a key is a qualified name: an optional prefix (a DNS-1123 subdomain of at most 253 characters)
  and `/`, then a name of at most 63 characters: `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`;
- a label value is empty or matches the same pattern as a name, at most 63 characters;
- annotation keys follow the key rules (compared in lower case, as kube does) and all annotations
  together, keys and values, are at most 256 KiB.
"""

from __future__ import annotations

import re
from typing import Any

Cause = tuple[str, str, str]  # (field path, reason, message), as in validation.py

MAX_NAME = 63
MAX_PREFIX = 253
MAX_ANNOTATIONS_BYTES = 256 * 1024
_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_NAME_RULE = (
    "must be at most 63 characters: alphanumerics, '-', '_' or '.', starting and ending with an "
    "alphanumeric (e.g. 'MyName', 'my.name' or '123-abc'; regex '[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?')"
)


def _invalid(field: str, value: str, why: str) -> Cause:
    shown = value if len(value) <= 80 else value[:77] + "..."
    return field, "FieldValueInvalid", f'Invalid value: "{shown}": {why}'


def key_problems(key: str) -> list[str]:
    """Why `key` is not a qualified name (empty when it is one)."""
    parts = key.split("/")
    if len(parts) > 2:
        return ["at most one '/': an optional DNS subdomain prefix and '/', then a name (e.g. 'example.com/MyName')"]
    problems: list[str] = []
    if len(parts) == 2:
        prefix = parts[0]
        if not prefix:
            problems.append("the prefix before '/' may not be empty")
        elif len(prefix) > MAX_PREFIX:
            problems.append(f"the prefix must be at most {MAX_PREFIX} characters")
        elif not _SUBDOMAIN.fullmatch(prefix):
            problems.append("the prefix must be a lowercase DNS subdomain (e.g. 'example.com')")
    name = parts[-1]
    if not name:
        problems.append("the name part may not be empty")
    elif len(name) > MAX_NAME or not _NAME.fullmatch(name):
        problems.append(f"the name part {_NAME_RULE}")
    return problems


def value_problem(value: str) -> str:
    """Why `value` is not a valid label value ("" when it is one)."""
    if value and (len(value) > MAX_NAME or not _NAME.fullmatch(value)):
        return f"a label value may be empty, or {_NAME_RULE}"
    return ""


def check_map(field: str, values: dict[str, Any]) -> list[Cause]:
    """Causes for a `labels` or `annotations` map (its values are already known to be strings or reported)."""
    path = f"metadata.{field}"
    causes: list[Cause] = []
    for key, value in values.items():
        checked_key = key.lower() if field == "annotations" else key
        causes += [_invalid(path, key, why) for why in key_problems(checked_key)]
        if field == "labels" and isinstance(value, str):
            problem = value_problem(value)
            if problem:
                causes.append(_invalid(path, value, problem))
    if field == "annotations":
        total = sum(len(k.encode()) + len(v.encode()) for k, v in values.items() if isinstance(v, str))
        if total > MAX_ANNOTATIONS_BYTES:
            causes.append((path, "FieldValueTooLong", f"Too long: must have at most {MAX_ANNOTATIONS_BYTES} bytes"))
    return causes
