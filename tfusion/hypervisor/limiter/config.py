"""The hypervisor's scheduling config (HypervisorScheduling): rate-limit parameters and auto-freeze rules.

Why two sources: upstream, the operator copies the node's pool's SchedulingConfigTemplate
`spec.hypervisor` into the hypervisor pod's TF_HYPERVISOR_SCHEDULING_CONFIG, so a change of the
template reaches a node only when its hypervisor pod is recreated. Here, with the Kubernetes
backend, the hypervisor reads the template itself (GPUNode -> its GPUPool owner ->
`spec.schedulingConfigTemplate` -> the template's `spec.hypervisor`) every `REFRESH_S`, and the
environment variable, when set, still wins key by key over it (an operator's explicit setting).
A missing GPUNode, pool or template means "no template": the defaults and the variable apply.
"""

from __future__ import annotations

import logging
from typing import Any

import anyio
import orjson

from tfusion.api import accessors
from tfusion.api.jsontypes import JsonObject
from tfusion.hypervisor.limiter import erl
from tfusion.kube.client import KubeClient, KubeError, NotFound
from tfusion.kube.resources import GPUNODES, GPUPOOLS, SCHEDULINGCONFIGTEMPLATES

log = logging.getLogger(__name__)

REFRESH_S = 30.0


def parse_document(text: str) -> JsonObject:
    """TF_HYPERVISOR_SCHEDULING_CONFIG as a JSON object ({} when unset); ValueError naming the problem."""
    if not text.strip():
        return {}
    try:
        doc = orjson.loads(text)
    except ValueError as exc:
        raise ValueError(f"TF_HYPERVISOR_SCHEDULING_CONFIG is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"TF_HYPERVISOR_SCHEDULING_CONFIG must be a JSON object, got {type(doc).__name__}")
    return doc


def merged(base: JsonObject, over: JsonObject) -> JsonObject:
    """`over` on top of `base`, objects merged key by key, anything else replaced."""
    result = dict(base)
    for key, value in over.items():
        below = result.get(key)
        if isinstance(value, dict) and isinstance(below, dict):
            result[key] = merged(below, value)
        else:
            result[key] = value
    return result


class SchedulingConfig:
    """The effective HypervisorScheduling document of this node (see the module docstring)."""

    def __init__(self, env_text: str) -> None:
        self.env = parse_document(env_text)
        self.template: JsonObject = {}
        self.template_name = ""

    def document(self) -> JsonObject:
        return merged(self.template, self.env)

    def erl_params(self) -> erl.ErlParams:
        section = self.document().get("elasticRateLimitParameters")
        return erl.params_from_overrides(section if isinstance(section, dict) else None)

    async def refresh(self, client: KubeClient, node: str) -> bool:
        """Read the node's pool's template; True when the document changed."""
        name, hypervisor = await _template_of(client, node)
        changed = (name, hypervisor) != (self.template_name, self.template)
        self.template_name, self.template = name, hypervisor
        if changed:
            log.info("hypervisor scheduling config: template %s, parameters %s", name or "(none)",
                     self.erl_params())
        return changed


async def _template_of(client: KubeClient, node: str) -> tuple[str, JsonObject]:
    try:
        gpunode = await client.get(GPUNODES, node)
    except NotFound:
        return "", {}
    owners = [o for o in accessors.GpuNode(gpunode).meta.owner_references if o.get("kind") == "GPUPool"]
    if not owners:
        return "", {}
    try:
        pool = await client.get(GPUPOOLS, str(owners[0].get("name", "")))
    except NotFound:
        return "", {}
    name = accessors.text(pool, "spec", "schedulingConfigTemplate")
    if not name:
        return "", {}
    try:
        template = await client.get(SCHEDULINGCONFIGTEMPLATES, name)
    except NotFound:
        return name, {}
    return name, dict(accessors.section(template, "spec", "hypervisor"))


async def follow_template(config: SchedulingConfig, client: KubeClient, node: str, on_change: Any,
                          interval: float = REFRESH_S) -> None:
    """Refresh every `interval` until cancelled, calling `on_change()` when the document changed."""
    while True:
        try:
            if await config.refresh(client, node):
                on_change()
        except KubeError as exc:
            log.warning("cannot read the SchedulingConfigTemplate of node %s: %s", node, exc)
        await anyio.sleep(interval)
