"""The hypervisor role exports its soft workers' limiter families on /metrics (the wiring of
`register_usage_metrics` with the role's `SoftIsolation`); what they read is in
tests/unit/test_limiter_metrics.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import eventually
from tests.helpers.local_hypervisor import hypervisor

pytestmark = pytest.mark.anyio

FAMILIES = ("tfusion_worker_limiter_tokens", "tfusion_worker_limiter_capacity_tokens",
            "tfusion_worker_limiter_refill_tokens_per_second", "tfusion_worker_limiter_heartbeat_age_seconds",
            "tfusion_worker_frozen", "tfusion_worker_throttled_seconds_total")


async def test_a_soft_worker_has_limiter_families(tmp_path: Path) -> None:
    async with hypervisor(tmp_path) as http:
        created = await http.post("/api/v1/workers", json={"name": "soft-one", "isolation": "soft",
                                                           "requests": {"computePercent": 30},
                                                           "limits": {"computePercent": 30}})
        assert created.status_code == 201, created.text

        async def exported() -> str | None:  # the first sync tick maps the worker's file
            text = (await http.get("/metrics")).text
            return text if any(line.startswith("tfusion_worker_frozen{") and 'pod="soft-one"' in line
                               for line in text.splitlines()) else None

        text = await eventually(exported, 30, "the soft worker's tfusion_worker_frozen on /metrics")
    lines = [line for line in text.splitlines() if 'pod="soft-one"' in line]
    for family in FAMILIES:
        assert any(line.startswith(family + "{") for line in lines), family
    assert any(line.startswith("tfusion_worker_frozen{") and line.endswith(" 0.0") for line in lines), lines
