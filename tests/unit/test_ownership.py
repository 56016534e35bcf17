"""Owner references: adoption replaces the controller and keeps every other owner."""

from __future__ import annotations

from tfusion.api.accessors import Body
from tfusion.api.jsontypes import json_object
from tfusion.kube import resources as r
from tfusion.kube.ownership import controller_reference, owner_reference, with_controller


def test_a_new_controller_replaces_the_old_one_and_keeps_the_other_owners() -> None:
    old = json_object(controller_reference(Body({"metadata": {"name": "old", "uid": "u-old"}}), r.PODS))
    other = json_object(owner_reference(Body({"metadata": {"name": "cm", "uid": "u-cm"}}), r.CONFIGMAPS))
    new = json_object(controller_reference(Body({"metadata": {"name": "new", "uid": "u-new"}}), r.PODS))
    stale_copy = {**new, "controller": False}  # a plain reference to the object taking control
    refs = with_controller([old, other, stale_copy], new)
    assert refs == [other, new]
    assert with_controller(refs, new) == refs  # already the controller: unchanged
