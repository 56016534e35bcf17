"""A hypervisor on the local backend in a test."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx

from tfusion.hypervisor import role
from tfusion.settings import Settings

SPEC = "sim:2xA100-SXM4-80GB,1xH100-SXM5-80GB"


def settings_for(state: Path, **extra: Any) -> Settings:
    flags = {"backend": "local", "devices": SPEC, "hypervisor_port": 0, "state_dir": str(state),
             "metrics_output_path": str(state / "metrics.log"), "metrics_interval": 0.3, "node_name": "box-1",
             **extra}
    return Settings.load(flags, env={}, roles=("hypervisor",))


@asynccontextmanager
async def hypervisor(state: Path, **extra: Any) -> AsyncIterator[httpx.AsyncClient]:
    async with anyio.create_task_group() as tg:
        port = await tg.start(role.run, settings_for(state, **extra))
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            yield client
        tg.cancel_scope.cancel()
