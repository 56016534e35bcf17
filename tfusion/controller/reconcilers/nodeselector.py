"""Which GPUPool selects a Node, and does a core/v1 NodeSelector select it.

Which pool selects a node (the Node and GPUPool reconcilers use it; the embedded stage names the
pool in its start-up summary with it); one term is matched by the scheduler's node checks
(`scheduling.nodes.term_matches`), so both follow one reading of kube's rules. Matching follows
k8s.io/component-helpers nodeaffinity: terms are ORed, the requirements of one term ANDed; an
empty term selects nothing, an empty or absent selector everything. Operators: In, NotIn, Exists,
DoesNotExist, Gt, Lt (integers) on labels; `matchFields` knows `metadata.name` (In/NotIn), as
kube-scheduler does.

A pool's selector is `nodeManagerConfig.multiVendorNodeSelector[<vendor>]`, else
`nodeManagerConfig.nodeSelector`; the vendor is the Node's `tensor-fusion.ai/hardware-vendor`
label, else the pool's `defaultVendor` (NVIDIA). A pool with neither selector selects no Node:
AutoSelect adopts only the nodes a pool asks for (the original's MatchNodeSelectorTerms with a nil
selector matches nothing too), so a pool without one never turns every CPU node into a GPUNode.
"""

from __future__ import annotations

from collections.abc import Iterable

from tfusion.api import annotations as tfa
from tfusion.api.accessors import GpuPool, Node, items, section
from tfusion.api.hashing import content_hash
from tfusion.api.jsontypes import JsonMapping
from tfusion.controller.defaults import pool_vendor
from tfusion.controller.scheduling.nodes import term_matches


def node_selector_matches(selector: JsonMapping | None, node: Node) -> bool:
    """Whether a core/v1 NodeSelector (a free-form block of a pool's spec) selects the node."""
    if not selector:
        return True
    return any(term_matches(term, node) for term in items(selector, "nodeSelectorTerms"))


def node_vendor(node: Node, pool: GpuPool) -> str:
    return node.meta.label(tfa.HARDWARE_VENDOR) or pool_vendor(pool)


def selector_for(pool: GpuPool, vendor: str) -> JsonMapping | None:
    config = pool.node_manager_config
    return section(config, "multiVendorNodeSelector", vendor) or section(config, "nodeSelector") or None


def pool_selects(pool: GpuPool, node: Node) -> bool:
    """Whether the pool (not being deleted) asks for the node; a pool without a selector asks for none."""
    if pool.meta.deleting:
        return False
    selector = selector_for(pool, node_vendor(node, pool))
    return bool(selector) and node_selector_matches(selector, node)


def select_pool(pools: Iterable[GpuPool], node: Node) -> str | None:
    """The name of the first pool (by name) that selects the node; None when none does."""
    for pool in sorted(pools, key=lambda p: p.name):
        if pool_selects(pool, node):
            return pool.name
    return None


def selector_hash(pool: GpuPool) -> str:
    """A short stable hash of the pool's node selectors (the `node-selector-hash` Node label)."""
    config = pool.node_manager_config
    return content_hash([config.get("nodeSelector"), config.get("multiVendorNodeSelector")], 16)
