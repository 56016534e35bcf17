"""`GET /api/node-scaler` (the node expander's state) and `GET /api/provision?enable=` (the kill
switch for every new GPUNodeClaim), in the original's shapes.

Both are answered by the leader, which holds the expander and the switch; a follower answers 503.
Without `--enable-auto-expander` the node scaler answers 503 `{"error": "node scaler not enabled"}`,
as the original does. The switch lasts until it is set again or the leader changes (a new leader
starts enabled), like the original's in-memory toggle; `enable` without a value shows it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec
from litestar import get
from litestar.params import Parameter

from tfusion.web import HttpError, error_responses

if TYPE_CHECKING:
    from tfusion.controller.provisioning.expander import NodeExpander
    from tfusion.controller.provisioning.pools import ProvisioningSwitch
    from tfusion.controller.runtime import ControllerRuntime


class InFlightNode(msgspec.Struct, forbid_unknown_fields=True):
    claim: str
    pool: str
    instanceType: str
    readyInSeconds: Annotated[int, msgspec.Meta(description="the provider's boot estimate, counted down")]
    pods: Annotated[list[str], msgspec.Meta(description="pods pre-scheduled onto this node (namespace/name)")]


class InFlightClaim(msgspec.Struct, forbid_unknown_fields=True):
    pool: str
    instanceType: str
    phase: str
    instanceID: str
    node: str
    expansionSource: Annotated[str, msgspec.Meta(description="the node whose type was cloned, or catalog")]


class NodeScalerState(msgspec.Struct, forbid_unknown_fields=True):
    inFlightNodes: dict[str, InFlightNode]
    inFlightNodeClaims: dict[str, InFlightClaim]
    preSchedulePods: Annotated[dict[str, str], msgspec.Meta(description="pod -> the node it waits for")]
    preScheduleTimerNum: Annotated[int, msgspec.Meta(description="pods waiting: buffered or pre-scheduled")]
    provisioningEnabled: bool


class NodeScalerAnswer(msgspec.Struct, forbid_unknown_fields=True):
    data: NodeScalerState


class ProvisionAnswer(msgspec.Struct, forbid_unknown_fields=True):
    enabled: Annotated[bool, msgspec.Meta(description="whether new GPUNodeClaims may be made")]


def provisioning_routes(runtime: ControllerRuntime, switch: ProvisioningSwitch,
                        expander: NodeExpander | None) -> list[Any]:
    @get("/api/node-scaler", summary="The node expander's in-flight nodes and pre-scheduled pods (leader)",
         responses=error_responses({503: "Not enabled (--enable-auto-expander), or not the leader"}))
    async def api_node_scaler() -> NodeScalerAnswer:
        if expander is None:
            raise HttpError(503, "node scaler not enabled")
        if not runtime.is_leader:
            raise runtime.not_leader("holds the node expander")
        return NodeScalerAnswer(msgspec.convert(expander.state(), NodeScalerState))

    @get("/api/provision", summary="Stop or resume every new GPUNodeClaim (leader)",
         responses=error_responses({400: "enable is not true or false", 503: "Not the leader"}))
    async def api_provision(
            enable: Annotated[Literal["true", "false"] | None,
                              Parameter(description="true or false; absent: only show")] = None,
    ) -> ProvisionAnswer:
        if not runtime.is_leader:
            raise runtime.not_leader("holds the provisioning switch")
        if enable is not None:
            switch.enabled = enable == "true"
        return ProvisionAnswer(switch.enabled)

    return [api_node_scaler, api_provision]
