"""The allocator's readers use its public surface only, and its names say what they are.

explain.py, suggest.py and framework.py used to reach into ten private attributes of GpuAllocator,
which tied them to its insides; they now go through public read methods. This test reads their
source and fails on any `obj._name` access other than on `self`, so the coupling cannot creep back.
"""

from __future__ import annotations

import ast
import inspect
from types import ModuleType

import pytest

import tfusion.allocator
from tfusion.allocator import explain, framework, suggest
from tfusion.allocator.allocator import GpuAllocator, GpuPlacement


def private_reads(source: str) -> list[str]:
    """`value._attr` accesses in `source` whose value is not `self` (dunders aside), as "line: text"."""
    tree = ast.parse(source)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        name = node.attr
        if not name.startswith("_") or name.startswith("__"):
            continue
        if isinstance(node.value, ast.Name) and node.value.id == "self":
            continue
        found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("module", [explain, suggest, framework], ids=lambda m: m.__name__)
def test_readers_of_the_allocator_use_no_private_attribute(module: ModuleType) -> None:
    assert private_reads(inspect.getsource(module)) == []


def test_the_check_sees_a_private_read() -> None:
    source = "def f(alloc, self):\n    return alloc._nodes, self._gpus, alloc.__class__, alloc.nodes()\n"
    assert private_reads(source) == ["2: alloc._nodes"]


def test_the_allocator_placement_has_its_own_name() -> None:
    assert not hasattr(tfusion.allocator, "Placement")  # the hypervisor's workers/placement.py owns that word
    assert tfusion.allocator.GpuPlacement is GpuPlacement
    assert tfusion.allocator.GpuAllocator is GpuAllocator
