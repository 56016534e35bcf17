"""The webhook's writes besides the pod: the workload's owner chain, the TensorFusionWorkload, and
the grey-release counter.

Why here and not in mutate.py: these need the API server. The owner chain (ReplicaSet ->
Deployment, Job -> CronJob) names the workload, so the pods of one Deployment share one
workload; owners are remembered by UID, so a Deployment's pods cost one lookup, not one each.
`WorkloadWriter.ensure` creates the workload or merge-patches it when its spec, labels,
annotations or owner differ from what the pod needs, and makes no API call when the cached copy
already matches (the common case: every pod after the first).
"""

from __future__ import annotations

import logging
import secrets
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import orjson

from tfusion.api import annotations as tfa
from tfusion.controller.webhook.mutate import Obj, Owner
from tfusion.kube import resources as r
from tfusion.kube.client import AlreadyExists, Conflict, KubeClient, NotFound
from tfusion.kube.informer import Informer

log = logging.getLogger(__name__)

REPLICASETS = r.Resource("apps", "v1", "replicasets", "ReplicaSet", True)
DEPLOYMENTS = r.Resource("apps", "v1", "deployments", "Deployment", True)
STATEFULSETS = r.Resource("apps", "v1", "statefulsets", "StatefulSet", True)
JOBS = r.Resource("batch", "v1", "jobs", "Job", True)
CRONJOBS = r.Resource("batch", "v1", "cronjobs", "CronJob", True)
_OWNER_KINDS = {(res.group, res.kind): res for res in (REPLICASETS, DEPLOYMENTS, STATEFULSETS, JOBS, CRONJOBS)}
#: the original's short-id alphabet (no 0, l, z: easy to read back)
SHORT_ID_ALPHABET = "123456789abcdefghijkmnopqrstuvwxy"
GREY_RELEASE_RETRIES = 5


def short_id(length: int = 8) -> str:
    return "".join(secrets.choice(SHORT_ID_ALPHABET) for _ in range(length))


def controller_ref(obj: Mapping[str, Any]) -> Obj | None:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return dict(ref)
    return None


def _group(api_version: str) -> str:
    return api_version.rpartition("/")[0] if "/" in api_version else ""


def _reference(ref: Mapping[str, Any]) -> Obj:
    return {"apiVersion": ref.get("apiVersion"), "kind": ref.get("kind"), "name": ref.get("name"),
            "uid": ref.get("uid"), "controller": True, "blockOwnerDeletion": True}


def _replicas(obj: Mapping[str, Any]) -> int | None:
    spec = obj.get("spec") or {}
    for key in ("replicas", "parallelism"):
        value = spec.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return 1 if obj.get("kind") == "Job" else None


def bare_workload_name(pod: Mapping[str, Any]) -> str:
    """A pod without a controller: its own name, or generateName plus a short id."""
    meta = pod.get("metadata") or {}
    if meta.get("name"):
        return str(meta["name"])
    prefix = str(meta.get("generateName") or "pod")
    return (prefix if prefix.endswith("-") else prefix + "-") + short_id()


class OwnerResolver:
    """The workload owner of a pod, from its controller chain (owners cached by UID)."""

    def __init__(self, client: KubeClient, *, cache_size: int = 4096) -> None:
        self.client = client
        self.cache_size = cache_size
        self._owners: OrderedDict[str, Owner] = OrderedDict()
        self.lookups = 0

    async def resolve(self, pod: Mapping[str, Any], namespace: str) -> Owner:
        ref = controller_ref(pod)
        if ref is None:
            return Owner(workload_name=bare_workload_name(pod))
        uid = str(ref.get("uid") or "")
        cached = self._owners.get(uid) if uid else None
        if cached is not None:
            self._owners.move_to_end(uid)
            return cached
        owner = await self._walk(ref, namespace)
        if uid:
            self._owners[uid] = owner
            while len(self._owners) > self.cache_size:
                self._owners.popitem(last=False)
        return owner

    async def _walk(self, ref: Obj, namespace: str) -> Owner:
        direct = _reference(ref)
        resource = _OWNER_KINDS.get((_group(str(ref.get("apiVersion") or "")), str(ref.get("kind") or "")))
        if resource is None:
            return Owner(workload_name=str(ref.get("name")), reference=direct, counter_owner=direct)
        self.lookups += 1
        try:
            obj = await self.client.get(resource, str(ref.get("name")), namespace=namespace)
        except NotFound:
            log.info("owner %s %s/%s of a pod is not there (yet); naming the workload after it",
                     ref.get("kind"), namespace, ref.get("name"))
            return Owner(workload_name=str(ref.get("name")), reference=direct, counter_owner=direct)
        top = controller_ref(obj)
        if resource in (REPLICASETS, JOBS) and top is not None and top.get("kind") in ("Deployment", "CronJob"):
            return Owner(workload_name=str(top.get("name")), reference=_reference(top),
                         replicas=_replicas(obj), counter_owner=direct)
        return Owner(workload_name=str(ref.get("name")), reference=direct, replicas=_replicas(obj),
                     counter_owner=direct)

    async def claim_grey_release(self, owner: Owner, namespace: str, template_hash: str, limit: int) -> str | None:
        """The grey-release counter key when this pod is one of the first `limit` of its owner (the
        counter is raised), None when the owner already has `limit` injected pods."""
        ref = owner.counter_owner
        resource = _OWNER_KINDS.get((_group(str((ref or {}).get("apiVersion") or "")), str((ref or {}).get("kind"))))
        if ref is None or resource is None:
            return None if limit <= 0 else tfa.tf_counter_key(template_hash)
        key = tfa.tf_counter_key(template_hash)
        for _ in range(GREY_RELEASE_RETRIES):
            obj = await self.client.get(resource, str(ref["name"]), namespace=namespace)
            meta = obj.get("metadata") or {}
            count = _counter((meta.get("annotations") or {}).get(key))
            if count >= limit:
                return None
            patch = {"metadata": {"resourceVersion": meta.get("resourceVersion"),
                                  "annotations": {key: str(count + 1)}}}
            try:
                await self.client.patch(resource, str(ref["name"]), patch, namespace=namespace)
                return key
            except Conflict:
                continue
        raise Conflict({"message": f"grey-release counter {key} on {ref.get('kind')} {namespace}/{ref['name']} "
                                   f"kept changing; try again"}, 409)


def _counter(value: Any) -> int:
    try:
        return max(0, int(str(value)))
    except ValueError:
        return 0


def _contains(actual: Any, wanted: Any) -> bool:
    """Whether `actual` carries everything `wanted` says (objects: a superset; others: equal)."""
    if isinstance(wanted, Mapping):
        return isinstance(actual, Mapping) and all(_contains(actual.get(k), v) for k, v in wanted.items())
    return bool(actual == wanted)


def _owner_present(cached: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    refs = (cached.get("metadata") or {}).get("ownerReferences") or []
    return any(isinstance(ref, Mapping) and ref.get("uid") == wanted.get("uid") for ref in refs)


def workload_matches(cached: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    meta, wanted = cached.get("metadata") or {}, desired.get("metadata") or {}
    return (_contains(cached.get("spec") or {}, desired.get("spec") or {})
            and _contains(meta.get("labels") or {}, wanted.get("labels") or {})
            and _contains(meta.get("annotations") or {}, wanted.get("annotations") or {})
            and all(_owner_present(cached, ref) for ref in wanted.get("ownerReferences") or []))


class WorkloadWriter:
    """Create-or-patch of TensorFusionWorkloads, reading the shared informer first."""

    def __init__(self, client: KubeClient, informer: Informer, *, memory: int = 4096) -> None:
        self.client = client
        self.informer = informer
        self.memory = memory
        self.writes = 0  # API calls made (tests and the benchmark read it)
        #: key -> (resourceVersion, desired JSON) of the last cached copy found to match
        self._matched: OrderedDict[str, tuple[str, bytes]] = OrderedDict()

    def _known_match(self, key: str, cached: Mapping[str, Any], desired: Obj) -> bool:
        """Whether this cached version was already found to match this exact desired workload (the
        common case: every pod of a Deployment asks for the same workload)."""
        version = str((cached.get("metadata") or {}).get("resourceVersion") or "")
        wanted = orjson.dumps(desired, option=orjson.OPT_SORT_KEYS)
        if self._matched.get(key) == (version, wanted):
            return True
        if not workload_matches(cached, desired):
            return False
        self._matched[key] = (version, wanted)
        self._matched.move_to_end(key)
        while len(self._matched) > self.memory:
            self._matched.popitem(last=False)
        return True

    async def ensure(self, desired: Obj) -> str:
        """"unchanged", "created" or "patched"."""
        meta = desired["metadata"]
        key = f"{meta['namespace']}/{meta['name']}"
        cached = self.informer.get(key)
        if cached is not None and self._known_match(key, cached, desired):
            return "unchanged"
        if cached is None:
            self.writes += 1
            try:
                await self.client.create(r.TENSORFUSIONWORKLOADS, desired, namespace=meta["namespace"])
                return "created"
            except AlreadyExists:
                self.writes += 1
                cached = await self.client.get(r.TENSORFUSIONWORKLOADS, meta["name"], namespace=meta["namespace"])
                if workload_matches(cached, desired):
                    return "unchanged"
        self.writes += 1
        await self.client.patch(r.TENSORFUSIONWORKLOADS, meta["name"], _patch_for(cached, desired),
                                namespace=meta["namespace"])
        return "patched"


def _patch_for(cached: Mapping[str, Any], desired: Obj) -> Obj:
    wanted = desired["metadata"]
    meta: Obj = {"labels": wanted.get("labels") or {}, "annotations": wanted.get("annotations") or {}}
    missing = [ref for ref in wanted.get("ownerReferences") or [] if not _owner_present(cached, ref)]
    if missing:
        meta["ownerReferences"] = list((cached.get("metadata") or {}).get("ownerReferences") or []) + missing
    return {"metadata": meta, "spec": desired.get("spec") or {}}
