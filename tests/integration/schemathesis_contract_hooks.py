"""schemathesis hooks for tests/integration/test_controller_fuzz.py (loaded by the CLI through its
config file, not by pytest).

`not_a_server_error` is replaced by `no_server_error_beyond_the_contract`: every 5xx fails, except
the one the controller answers by contract, the original's 500 `{"error": "scheduler framework not
found"}` to a Pod manifest whose `spec.schedulerName` is not tensor-fusion-scheduler (the OpenAPI
document says so). schemathesis's own check cannot tell that answer from a bug's 500.
"""

from __future__ import annotations

import json
from typing import Any

import schemathesis

SCHEDULER_NAME = "tensor-fusion-scheduler"
CONTRACT = {"error": "scheduler framework not found"}


def _scheduler_name(body: Any) -> Any:
    spec = body.get("spec") if isinstance(body, dict) else None
    return spec.get("schedulerName") if isinstance(spec, dict) else None


def _is_the_contract(response: Any, case: Any) -> bool:
    if response.status_code != 500 or case.path != "/api/simulate-schedule":
        return False
    try:
        answer = json.loads(response.content)
    except ValueError:
        return False
    return bool(answer == CONTRACT and _scheduler_name(case.body) != SCHEDULER_NAME)


@schemathesis.check
def no_server_error_beyond_the_contract(ctx: Any, response: Any, case: Any) -> bool | None:
    """A 5xx is a bug unless it is the documented answer to a foreign schedulerName."""
    if response.status_code >= 500 and not _is_the_contract(response, case):
        raise AssertionError(f"{case.method} {case.path} answered {response.status_code}: {response.text[:300]}")
    return None
