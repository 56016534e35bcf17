"""A StatefulSet's PersistentVolumeClaims: one per claim template and ordinal, made before the pod.

Why it exists: stateful workloads keep their data in a claim that outlives the pod, named
`<template>-<set>-<ordinal>` so a replacement pod finds the same one. As kube's StatefulSet
controller does, the claims are created (labelled with the set's selector) before the pod that
mounts them, the pod gets a `persistentVolumeClaim` volume per template (replacing a template volume
of the same name), and `persistentVolumeClaimRetentionPolicy` decides who owns each claim, so the
garbage collector deletes it or not: `whenDeleted: Delete` makes the set an owner (the claims go
with the set), `whenScaled: Delete` makes the pod of an ordinal at or above `replicas` an owner (its
claims go with it on scale-down); `Retain` (the default for both) leaves claims unowned, kept.
"""

from __future__ import annotations

from collections.abc import Iterable

from tfusion.api.accessors import Body, Pod, section, sequence_of_maps
from tfusion.api.jsontypes import JsonMapping, JsonObject, json_copy, json_object
from tfusion.embedded.volumes import PVCS
from tfusion.embedded.workloads.common import Workbench
from tfusion.kube.client import AlreadyExists, KubeError, NotFound
from tfusion.kube.resources import ApiResource

OwnerRef = dict[str, str]


def claim_templates(sts: Body) -> list[JsonMapping]:
    return [t for t in sequence_of_maps(sts.spec.get("volumeClaimTemplates")) if section(t, "metadata").get("name")]


def claim_name(template: JsonMapping, sts: Body, ordinal: int) -> str:
    return f"{section(template, 'metadata').get('name')}-{sts.name}-{ordinal}"


def mount_claims(sts: Body, ordinal: int, spec: JsonObject) -> None:
    """Give the pod spec a volume per claim template, naming the ordinal's claim."""
    templates = claim_templates(sts)
    if not templates:
        return
    names = {str(section(t, "metadata").get("name")) for t in templates}
    volumes = [json_object(v) for v in sequence_of_maps(spec.get("volumes")) if v.get("name") not in names]
    volumes += [{"name": str(section(t, "metadata").get("name")),
                 "persistentVolumeClaim": {"claimName": claim_name(t, sts, ordinal)}} for t in templates]
    spec["volumes"] = list(volumes)


def new_claim(sts: Body, template: JsonMapping, ordinal: int, owners: list[OwnerRef]) -> JsonObject:
    meta = json_object(section(template, "metadata"))
    labels = {**json_object(section(meta, "labels")), **json_object(section(sts.spec, "selector", "matchLabels"))}
    meta.update({"name": claim_name(template, sts, ordinal), "namespace": sts.namespace, "labels": labels})
    if owners:
        meta["ownerReferences"] = [json_object(ref) for ref in owners]
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta,
            "spec": json_copy(dict(section(template, "spec")))}


def _reference(obj: Body, api_version: str, kind: str) -> OwnerRef:
    return {"apiVersion": api_version, "kind": kind, "name": obj.name, "uid": obj.uid}


class SetClaims:
    """Creates a set's claims and keeps their owners as its retention policy says."""

    def __init__(self, bench: Workbench, sets: ApiResource) -> None:
        self.bench = bench
        self.sets = sets
        self.claims = bench.manager.cache.informer(PVCS)

    async def create(self, sts: Body, ordinal: int) -> str | None:
        """Make the ordinal's missing claims; the error of a failed create (the pod must then wait)."""
        policy = section(sts.spec, "persistentVolumeClaimRetentionPolicy")
        owners = [self._set_ref(sts)] if policy.get("whenDeleted") == "Delete" else []
        for template in claim_templates(sts):
            name = claim_name(template, sts, ordinal)
            if self.claims.get(f"{sts.namespace}/{name}") is not None:
                continue
            try:
                await self.bench.client.create(PVCS, new_claim(sts, template, ordinal, owners),
                                               namespace=sts.namespace)
            except AlreadyExists:
                continue  # ours from an earlier pass, or a user's claim of that name: kube uses it too
            except KubeError as exc:
                failure = f"create Claim {name} for Pod {sts.name}-{ordinal} in StatefulSet {sts.name} failed " \
                          f"error: {exc}"
                self.bench.event(sts, "FailedCreate", failure, warning=True)
                return failure
            self.bench.event(sts, "SuccessfulCreate",
                             f"create Claim {name} Pod {sts.name}-{ordinal} in StatefulSet {sts.name} success")
        return None

    async def keep_owners(self, sts: Body, pods: Iterable[tuple[int, Pod]], replicas: int) -> None:
        """Point each existing claim's owners at the set and/or its pod, as the retention policy says."""
        policy = section(sts.spec, "persistentVolumeClaimRetentionPolicy")
        set_ref = self._set_ref(sts)
        for ordinal, pod in pods:
            scaled_away = ordinal >= replicas
            wanted = []
            if policy.get("whenDeleted") == "Delete" and not (scaled_away and policy.get("whenScaled") == "Delete"):
                wanted.append(set_ref)
            if scaled_away and policy.get("whenScaled") == "Delete":
                wanted.append(_reference(pod, "v1", "Pod"))
            for template in claim_templates(sts):
                await self._own(sts, claim_name(template, sts, ordinal), {sts.uid, pod.uid}, wanted)

    def _set_ref(self, sts: Body) -> OwnerRef:
        return _reference(sts, self.sets.api_version, self.sets.kind)

    async def _own(self, sts: Body, name: str, ours: set[str], wanted: list[OwnerRef]) -> None:
        raw = self.claims.get(f"{sts.namespace}/{name}")
        if raw is None:
            return
        claim = Body(raw)
        others = [json_object(ref) for ref in claim.meta.owner_references if ref.get("uid") not in ours]
        refs = others + [json_object(ref) for ref in wanted]
        if refs == [json_object(ref) for ref in claim.meta.owner_references]:
            return
        try:
            await self.bench.client.patch(PVCS, name, {"metadata": {"ownerReferences": refs}},
                                          namespace=sts.namespace)
        except NotFound:
            pass  # deleted meanwhile


__all__ = ["SetClaims", "claim_name", "claim_templates", "mount_claims", "new_claim"]
