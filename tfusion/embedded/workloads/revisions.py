"""ControllerRevisions: the pod-template history DaemonSets and StatefulSets keep, as kube's controllers do.

Why it exists: `kubectl rollout history` and `kubectl rollout undo` for DaemonSets and StatefulSets
read the set's apps/v1 ControllerRevisions (those its selector selects and it controls) and restore
one by patching the set with the revision's `data`. So each distinct pod template gets one revision
named `<set>-<hash>`, labelled with the template's labels plus `controller-revision-hash`, annotated
as the set is (`kubernetes.io/change-cause` shows in the history), controlled by the set, holding
the strategic merge patch `{"spec": {"template": {..., "$patch": "replace"}}}` and a `revision` one
above the highest so far. Going back to an earlier template moves its revision to the top rather than
making a new one. Revisions that neither the set nor any of its pods use are pruned beyond
`spec.revisionHistoryLimit` (default 10), oldest first.
"""

from __future__ import annotations

from collections.abc import Collection

from tfusion.api.accessors import Body, section
from tfusion.api.jsontypes import JsonMapping, JsonObject, json_copy, json_object
from tfusion.embedded.workloads.common import OWNER_INDEX, Workbench, controller_uid
from tfusion.kube.client import AlreadyExists, NotFound
from tfusion.kube.ownership import controller_reference
from tfusion.kube.resources import ApiResource

CONTROLLER_REVISIONS = ApiResource("apps", "v1", "controllerrevisions", "ControllerRevision", True)
REVISION_HASH = "controller-revision-hash"
DEFAULT_HISTORY_LIMIT = 10


def revision_data(template: JsonMapping) -> JsonObject:
    """What kubectl's rollout undo patches the set with: the whole template, replacing the old one."""
    return {"spec": {"template": {**json_object(template), "$patch": "replace"}}}


def revision_number(revision: Body) -> int:
    value = revision.raw.get("revision")
    return value if isinstance(value, int) else 0


def history_limit(owner: Body) -> int:
    value = owner.spec.get("revisionHistoryLimit")
    return value if isinstance(value, int) and value >= 0 else DEFAULT_HISTORY_LIMIT


class History:
    """The ControllerRevisions of the sets, read from a shared informer indexed by controlling owner."""

    def __init__(self, bench: Workbench) -> None:
        self.bench = bench
        self.revisions = bench.manager.cache.informer(CONTROLLER_REVISIONS)
        self.revisions.add_index(OWNER_INDEX, lambda obj: controller_uid(Body(obj)))

    def of(self, owner: Body) -> list[Body]:
        """The owner's revisions, lowest revision number first."""
        owned = map(Body, self.revisions.by_index(OWNER_INDEX, owner.uid))
        return sorted((o for o in owned if o.namespace == owner.namespace), key=revision_number)

    async def record(self, owner: Body, resource: ApiResource, name: str, label: str) -> str:
        """Make the owner's current template the newest revision (creating `name`, labelled
        `controller-revision-hash: <label>`, for a template never seen; renumbering an older one
        that holds it); the name of the revision that holds it."""
        history = self.of(owner)
        data = revision_data(section(owner.spec, "template"))
        top = max(map(revision_number, history), default=0)
        same = next((h for h in history if h.raw.get("data") == data), None)
        if same is None:
            await self._create(owner, resource, (name, label), data, top + 1)
            return name
        if revision_number(same) < top:
            await self._renumber(same, top + 1)
        return same.name

    async def _create(self, owner: Body, resource: ApiResource, named: tuple[str, str], data: JsonObject,
                      number: int) -> None:
        name, label = named
        template_meta = section(owner.spec, "template", "metadata")
        labels = {**json_object(section(template_meta, "labels")), REVISION_HASH: label}
        meta: JsonObject = {"name": name, "namespace": owner.namespace, "labels": labels,
                            "ownerReferences": [json_object(controller_reference(owner, resource))]}
        if owner.meta.annotations:
            meta["annotations"] = json_copy(dict(owner.meta.annotations))
        body: JsonObject = {"apiVersion": "apps/v1", "kind": "ControllerRevision", "metadata": meta,
                            "data": data, "revision": number}
        try:
            await self.bench.client.create(CONTROLLER_REVISIONS, body, namespace=owner.namespace)
        except AlreadyExists:
            pass  # made by an earlier pass the cache has not shown yet

    async def _renumber(self, revision: Body, number: int) -> None:
        try:
            await self.bench.client.patch(CONTROLLER_REVISIONS, revision.name, {"revision": number},
                                          namespace=revision.namespace)
        except NotFound:
            pass  # pruned meanwhile; the next pass makes it again

    async def prune(self, owner: Body, in_use: Collection[str]) -> None:
        """Delete the oldest revisions nothing uses, keeping `revisionHistoryLimit` of them."""
        unused = [h for h in self.of(owner) if h.name not in in_use]
        for revision in unused[:max(0, len(unused) - history_limit(owner))]:
            try:
                await self.bench.client.delete(CONTROLLER_REVISIONS, revision.name, namespace=revision.namespace,
                                               preconditions={"uid": revision.uid})
            except NotFound:
                continue


__all__ = ["CONTROLLER_REVISIONS", "REVISION_HASH", "History", "history_limit", "revision_data",
           "revision_number"]
