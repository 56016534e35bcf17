"""Checks on how our HTTP servers refuse a request, and the OpenAPI document without the worker-command routes."""

from __future__ import annotations

import copy
from typing import Any

import httpx


def assert_refused(response: httpx.Response, status: int, *fragments: str) -> None:
    assert response.status_code == status, response.text[:500]
    body = response.json()
    assert isinstance(body.get("error"), str), body
    for fragment in fragments:
        assert fragment in body["error"], (fragment, body["error"])


def without_worker_commands(document: dict[str, Any]) -> dict[str, Any]:
    """The hypervisor's document minus the fields that would make a generated worker run a program."""
    trimmed = copy.deepcopy(document)
    for name, schema in trimmed.get("components", {}).get("schemas", {}).items():
        if name.startswith("WorkerCreateRequest"):
            for field in ("command", "env", "workingDir"):
                schema.get("properties", {}).pop(field, None)
            schema["additionalProperties"] = False
    return trimmed
