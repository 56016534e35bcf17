"""Nodes on demand: GPUNodeClaims turned into cloud instances, pools kept at their minimum and warm
capacity, the node expander for pods that fit nowhere, and compaction that gives idle nodes back.

The pure parts: `catalog` (instance types with GPUs and prices), `plan` (the gap to a pool's targets,
the cheapest claims that close it, the expander's choice), `compaction_plan` (which empty nodes may
go, which workers a defrag may move). The parts that meet the world: `providers` (simulated,
karpenter, aws: create, terminate and list instances), `claims` (the GPUNodeClaim reconciler and its
finalizer), `pools` (pool provisioning), `expander` (the scheduler's node expander and its routes)
and `compaction` (the compaction and defrag loop).
"""
