"""The `apiserver` role: serve the embedded Kubernetes API until cancelled.

Started by tfusion/roles.py; it reports the kubeconfig path through `task_status.started`, which
the other roles in the same process then use to reach it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import TaskStatus

from tfusion.apiserver.embedded import EmbeddedApiServer
from tfusion.errors import RoleError
from tfusion.settings import Settings

log = logging.getLogger(__name__)


async def run(settings: Settings, *, task_status: TaskStatus[Any] = anyio.TASK_STATUS_IGNORED) -> None:
    kubeconfig = Path(settings.kubeconfig_out).expanduser()
    server = EmbeddedApiServer(
        Path(settings.state).expanduser(),
        listen=settings.apiserver_listen,
        watch_history=settings.watch_history,
        kubeconfig_path=kubeconfig,
    )

    async def serve(*, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        try:
            await server.run(task_status=task_status)
        except OSError as exc:
            if server.started:
                raise
            raise RoleError(f"apiserver cannot start: {exc}") from None

    async with anyio.create_task_group() as tg:
        await tg.start(serve)
        log.info("embedded API server on %s (state %s, kubeconfig %s)", server.url, settings.state, kubeconfig)
        task_status.started(str(kubeconfig))
