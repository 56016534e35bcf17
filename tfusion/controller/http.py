"""The controller's HTTP API under /api (the TensorFusion routes that clients already call).

For now: `GET /api/config`, the dynamic config as `{"config": …}` with the file's camelCase keys.
The allocation, simulate-schedule, connection and port/index routes are added next to it by the
modules that own those services.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from litestar import get
from litestar.handlers import HTTPRouteHandler

from tfusion.controller.dynamic_config import DynamicConfig


class ConfigBody(msgspec.Struct, forbid_unknown_fields=True):
    """The dynamic config now in force."""

    config: Annotated[dict[str, Any], msgspec.Meta(
        description="The dynamic config file's content, with its camelCase keys (metricsTTL, alertRules, ...)")]


def config_handlers(config: DynamicConfig) -> list[HTTPRouteHandler]:
    @get("/api/config", sync_to_thread=False, summary="The controller's dynamic config")
    def api_config() -> ConfigBody:
        return ConfigBody(config=config.current)

    return [api_config]
