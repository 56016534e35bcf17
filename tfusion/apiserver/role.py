"""The `apiserver` role: serve the embedded Kubernetes API until cancelled.

Started by tfusion/roles.py; it reports the kubeconfig path through `task_status.started`, which
the other roles in the same process then use to reach it. When a controller runs in the same
process, pod creates wait (503, Retry-After) until roles.py sees its webhook registered.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import TaskStatus

from tfusion.apiserver.embedded import EmbeddedApiServer
from tfusion.apiserver.webhooks import PodCreateHold
from tfusion.errors import RoleError
from tfusion.settings import Settings

log = logging.getLogger(__name__)

HELD = ("tfusion is starting: pods are admitted once the controller's pod webhook is registered "
        "(a few seconds; kubectl retries by itself)")


@dataclass(frozen=True)
class ApiServerStarted:
    """What the role hands `task_status.started`: the kubeconfig it wrote, and the hold on pod
    creates that roles.py releases once the controller in this process has registered its webhook
    (None when no controller with a webhook runs here)."""

    kubeconfig: str
    pod_create_hold: PodCreateHold | None


async def run(settings: Settings, *, task_status: TaskStatus[Any] = anyio.TASK_STATUS_IGNORED) -> None:
    kubeconfig = Path(settings.kubeconfig_out).expanduser()
    hold = PodCreateHold(HELD) if settings.has_role("controller") and settings.enable_webhooks else None
    server = EmbeddedApiServer(
        Path(settings.state).expanduser(),
        listen=settings.apiserver_listen,
        watch_history=settings.watch_history,
        kubeconfig_path=kubeconfig,
        pod_create_hold=hold,
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
        task_status.started(ApiServerStarted(str(kubeconfig), hold))
