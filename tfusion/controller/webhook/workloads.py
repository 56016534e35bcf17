"""The webhook's writes besides the pod: the workload's owner chain, the TensorFusionWorkload, and
the grey-release counter.

Why here and not in mutate.py: these need the API server. The owner chain (ReplicaSet ->
Deployment, Job -> CronJob) names the workload, so the pods of one Deployment share one
workload; owners are remembered by UID, so a Deployment's pods cost one lookup, not one each.
`WorkloadWriter.ensure` creates the workload or merge-patches it when its spec, labels,
annotations or owner differ from what the pod needs, and makes no API call when the cached copy
already matches (the common case: every pod after the first). A bare pod's workload is owned by
that pod; when a pod is deleted and created again under its name, the webhook takes the workload
back from the deleted pod before the garbage collector takes it away (`_released_pod`).

A bare local pod's workload that does not exist yet is not created at admission
(`ensure(create=False)`): the pod carries it (`pending-owned-workload-spec`) and the pod reconciler
creates it with this same writer once the pod exists, owned by the pod from the start (one write,
none of them on the pod's way to its node; kube-apiserver gives a pod its UID only after admission,
so the webhook could not name the owner). The writer's memory of its own answers keeps that
reconciler from creating it twice while its cache catches up.

A workload the webhook creates carries the controller's finalizer from the start (the workload
reconciler would add it in a write of its own otherwise), and a bare remote client's adoption (the
pod reconciler, reconcilers/pod.py) sets the owner and drops `AWAITING_POD` in one write.

Admission must leave nothing behind for a pod that never comes (a caller that made up the
review, an API server killed before it stored the pod, a pod refused after the webhook answered): a
bare remote client's workload the webhook creates carries `AWAITING_POD` (when it was created), and the
workload reconciler (reconcilers/workload.py) removes that annotation once a pod of the workload
exists, or deletes the workload when none has appeared within its grace. The state lives on the
workload, so a controller killed meanwhile finds it again at start. A workload created with a
controller owner (a Deployment's, a Job's) has no mark: the garbage collector removes it with that
owner, as it removes the pods the owner makes, and leaving the mark off saves the write that would
remove it for each Deployment.

The autoscaler's recommendation reaches new pods here too: when the pod's workload (as cached,
with the pod's own autoScalingConfig merged over it) has autoscaling enabled and a
`status.recommendation`, `apply_recommendation` makes it the pod's TFLOPS/compute and VRAM
requests and limits. The workload's spec keeps what the pod asked for (the autoscaler's base);
reading the informer's copy costs no API call.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import secrets
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping

import anyio
import orjson

from tfusion.api import annotations as tfa
from tfusion.api.accessors import Body, Pod, Workload, section, text
from tfusion.api.jsontypes import JsonMapping, JsonObject, json_object
from tfusion.api.quantity import Quantity, QuantityError
from tfusion.controller.defaults import ANNOTATION_OF, parse_quantity
from tfusion.controller.webhook.build import json_document
from tfusion.controller.webhook.mutate import Owner, Plan
from tfusion.kube import resources as r
from tfusion.kube.client import AlreadyExists, Conflict, KubeClient, NotFound
from tfusion.kube.informer import Informer
from tfusion.kube.ownership import controller_reference_to, with_controller

#: how long admission waits for a terminating workload of the same name to be removed, and how often it looks
TERMINATING_WAIT_S = 5.0
TERMINATING_POLL_S = 0.05

log = logging.getLogger(__name__)

#: the pod controllers looked up (get) and counted on (patch): the kinds Kubernetes' own controllers
#: make a pod's controller. A Deployment or CronJob above them is named from the ReplicaSet's or Job's
#: ownerReference, never fetched, so the controller's RBAC grants nothing on deployments or cronjobs
#: (controller/rbac_needs.py); a DaemonSet's pods, or any other owner's, are named after it unread.
_OWNER_KINDS = {(res.group, res.kind): res for res in (r.REPLICASETS, r.STATEFULSETS, r.JOBS)}
#: the original's short-id alphabet (no 0, l, z: easy to read back)
SHORT_ID_ALPHABET = "123456789abcdefghijkmnopqrstuvwxy"
GREY_RELEASE_RETRIES = 5
#: on a workload the webhook created: when (RFC 3339, UTC), until a pod of it is seen
AWAITING_POD = "tensor-fusion.ai/awaiting-pod-since"


def awaiting_pod_since(workload: Body) -> dt.datetime | None:
    """When the webhook created this workload, if no pod of it has been seen since; a value that is
    not a time counts as long ago (only the webhook writes it)."""
    value = workload.meta.annotation(AWAITING_POD)
    if value is None:
        return None
    try:
        found = dt.datetime.fromisoformat(value)
    except ValueError:
        return dt.datetime.min.replace(tzinfo=dt.UTC)
    return found if found.tzinfo is not None else found.replace(tzinfo=dt.UTC)


def _as_created(desired: JsonObject) -> JsonObject:
    """`desired` as created: marked with `AWAITING_POD` unless a controller owns it, and with the
    finalizer the workload reconciler would otherwise add in a write of its own (a copy; `desired`
    is shared)."""
    meta = desired.get("metadata")
    meta = dict(meta) if isinstance(meta, dict) else {}
    if Body(desired).meta.controller_ref() is None:
        notes = meta.get("annotations")
        stamp = dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")
        meta["annotations"] = {**(notes if isinstance(notes, dict) else {}), AWAITING_POD: stamp}
    finalizers = meta.get("finalizers")
    finalizers = [str(f) for f in finalizers] if isinstance(finalizers, list) else []
    meta["finalizers"] = finalizers if tfa.FINALIZER in finalizers else [*finalizers, tfa.FINALIZER]
    return {**desired, "metadata": meta}


def short_id(length: int = 8) -> str:
    """`length` random characters of SHORT_ID_ALPHABET, uniform: the digits of one random number
    (one draw from the system's source, not one per character: each draw is a system call)."""
    base = len(SHORT_ID_ALPHABET)
    number = secrets.randbelow(base ** length)
    chars = []
    for _ in range(length):
        number, digit = divmod(number, base)
        chars.append(SHORT_ID_ALPHABET[digit])
    return "".join(chars)


def _group(api_version: str) -> str:
    return api_version.rpartition("/")[0] if "/" in api_version else ""


def _replicas(owner: Body) -> int | None:
    for key in ("replicas", "parallelism"):
        value = owner.spec.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return 1 if owner.kind == "Job" else None


def bare_workload_name(pod: Pod) -> str:
    """A pod without a controller: its own name, or generateName plus a short id."""
    if pod.name:
        return pod.name
    prefix = text(pod.meta.raw, "generateName") or "pod"
    return (prefix if prefix.endswith("-") else prefix + "-") + short_id()


class KeyedLocks:
    """One lock per key, kept while somebody holds or waits for it. The pods of one Deployment
    arrive together (a ReplicaSet creates them back to back): each would look up the same owner and
    create the same workload before the first answer reached the cache (measured: 2.4 creates, 2.4
    admission calls and 2.4 reads per pod, 1,000 pods of 100 Deployments at 32 clients); in turn,
    the first does the call and the others find its answer."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[anyio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (None, 0))
        # fast_acquire: an uncontended lock (nearly every pod) is taken without a trip round the
        # event loop, which under load added a whole turn to each admission's answer
        lock = lock or anyio.Lock(fast_acquire=True)
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            users = self._locks[key][1] - 1
            if users:
                self._locks[key] = (lock, users)
            else:
                del self._locks[key]


class OwnerResolver:
    """The workload owner of a pod, from its controller chain (owners cached by UID)."""

    def __init__(self, client: KubeClient, *, cache_size: int = 4096) -> None:
        self.client = client
        self.cache_size = cache_size
        self._owners: OrderedDict[str, Owner] = OrderedDict()
        self._walking = KeyedLocks()
        self.lookups = 0

    async def resolve(self, pod: Pod, namespace: str) -> Owner:
        ref = pod.meta.controller_ref()
        if ref is None:
            return Owner(workload_name=bare_workload_name(pod))
        uid = text(ref, "uid")
        if not uid:
            return await self._walk(ref, namespace)
        if (cached := self._known(uid)) is not None:  # nearly every pod of a Deployment: no lock
            return cached
        async with self._walking.hold(uid):
            if (cached := self._known(uid)) is not None:  # another pod's walk found it meanwhile
                return cached
            owner = self._owners[uid] = await self._walk(ref, namespace)
        while len(self._owners) > self.cache_size:
            self._owners.popitem(last=False)
        return owner

    def _known(self, uid: str) -> Owner | None:
        cached = self._owners.get(uid)
        if cached is not None:
            self._owners.move_to_end(uid)
        return cached

    async def _walk(self, ref: JsonMapping, namespace: str) -> Owner:
        direct = json_object(controller_reference_to(ref))
        resource = _OWNER_KINDS.get((_group(str(ref.get("apiVersion") or "")), str(ref.get("kind") or "")))
        if resource is None or not ref.get("name"):  # no name: nothing to look up (the API server refuses it)
            return Owner(workload_name=str(ref.get("name")), reference=direct, counter_owner=direct)
        self.lookups += 1
        try:
            obj = await self.client.get(resource, str(ref.get("name")), namespace=namespace)
        except NotFound:
            log.info("owner %s %s/%s of a pod is not there (yet); naming the workload after it",
                     ref.get("kind"), namespace, ref.get("name"))
            return Owner(workload_name=str(ref.get("name")), reference=direct, counter_owner=direct)
        owner = Body(obj)
        top = owner.meta.controller_ref()
        if resource in (r.REPLICASETS, r.JOBS) and top is not None and top.get("kind") in ("Deployment", "CronJob"):
            return Owner(workload_name=str(top.get("name")), reference=json_object(controller_reference_to(top)),
                         replicas=_replicas(owner), counter_owner=direct)
        return Owner(workload_name=str(ref.get("name")), reference=direct, replicas=_replicas(owner),
                     counter_owner=direct)

    async def claim_grey_release(self, owner: Owner, namespace: str, template_hash: str, limit: int) -> str | None:
        """The grey-release counter key when this pod is one of the first `limit` of its owner (the
        counter is raised), None when the owner already has `limit` injected pods."""
        ref = owner.counter_owner
        resource = None if ref is None else _OWNER_KINDS.get((_group(text(ref, "apiVersion")), str(ref.get("kind"))))
        if ref is None or resource is None:
            return None if limit <= 0 else tfa.tf_counter_key(template_hash)
        key = tfa.tf_counter_key(template_hash)
        for _ in range(GREY_RELEASE_RETRIES):
            meta = Body(await self.client.get(resource, str(ref["name"]), namespace=namespace)).meta
            count = _counter(meta.annotation(key))
            if count >= limit:
                return None
            patch = {"metadata": {"resourceVersion": meta.resource_version or None,
                                  "annotations": {key: str(count + 1)}}}
            try:
                await self.client.patch(resource, str(ref["name"]), patch, namespace=namespace)
                return key
            except Conflict:
                continue
        raise Conflict({"message": f"grey-release counter {key} on {ref.get('kind')} {namespace}/{ref['name']} "
                                   f"kept changing; try again"}, 409)


def _counter(value: str | None) -> int:
    try:
        return max(0, int(str(value)))
    except ValueError:
        return 0


def _contains(actual: object, wanted: object) -> bool:
    """Whether `actual` carries everything `wanted` says (objects: a superset; others: equal)."""
    if isinstance(wanted, Mapping):
        return isinstance(actual, Mapping) and all(_contains(actual.get(k), v) for k, v in wanted.items())
    return bool(actual == wanted)


def _owner_present(cached: Body, wanted: JsonMapping) -> bool:
    return any(ref.get("uid") == wanted.get("uid") for ref in cached.meta.owner_references)


def workload_matches(have: Body, want: Body) -> bool:
    """Whether the workload `have` already carries everything `want` says (no write needed)."""
    return (_contains(have.spec, want.spec)
            and _contains(section(have.meta.raw, "labels"), section(want.meta.raw, "labels"))
            and _contains(section(have.meta.raw, "annotations"), section(want.meta.raw, "annotations"))
            and all(_owner_present(have, ref) for ref in want.meta.owner_references))


def _key(workload: Body) -> str:
    return f"{workload.namespace}/{workload.name}"


def _revision(resource_version: str | None) -> int:
    """A resourceVersion as a number (the API server's are etcd revisions); -1 when it is not one,
    which makes the informer's copy the newer."""
    try:
        return int(resource_version or "")
    except ValueError:
        return -1


class WorkloadWriter:
    """Create-or-patch of TensorFusionWorkloads, reading the shared informer first."""

    def __init__(self, client: KubeClient, informer: Informer, *, memory: int = 4096) -> None:
        self.client = client
        self.informer = informer
        self.memory = memory
        self.writes = 0  # API calls made (tests and the benchmark read it)
        #: key -> (resourceVersion, desired JSON, desired) of the last cached copy found to match;
        #: a desired document is never changed once it has been handed to `ensure`
        self._matched: OrderedDict[str, tuple[str, bytes, JsonObject]] = OrderedDict()
        #: key -> the workload as the API server last answered this writer, until the informer
        #: holds that version or a later one (client-go's mutation cache, which also compares
        #: resourceVersions as integers); dropped once the informer has seen past its version
        self._written: OrderedDict[str, JsonMapping] = OrderedDict()
        self._ensuring = KeyedLocks()

    def _known_match(self, key: str, cached: Body, desired: JsonObject) -> bool:
        """Whether this cached version was already found to match this exact desired workload (the
        common case: every pod of a Deployment asks for the same workload)."""
        version = cached.meta.resource_version
        known = self._matched.get(key)
        if known is not None and known[0] == version and known[2] is desired:
            return True  # the very object found to match (the webhook memo's plan hands it again)
        wanted = orjson.dumps(desired, option=orjson.OPT_SORT_KEYS)
        if known is not None and known[:2] == (version, wanted):
            return True
        if not workload_matches(cached, Body(desired)):
            return False
        self._matched[key] = (version, wanted, desired)
        self._matched.move_to_end(key)
        while len(self._matched) > self.memory:
            self._matched.popitem(last=False)
        return True

    def recommendation(self, desired: JsonObject) -> JsonMapping | None:
        """The cached workload's status.recommendation when autoscaling is on for it (no API call)."""
        wanted = Body(desired)
        cached = self.informer.get(f"{wanted.namespace or None}/{wanted.name or None}")
        return None if cached is None else recommendation_for(Workload(cached), desired)

    def current(self, key: str) -> JsonMapping | None:
        """The newer of the informer's copy and this writer's last answer. No copy in an informer
        that has seen past the answer's version means deleted since: a bare pod deleted and
        created again under its name must not be handed its deleted workload. (A delete handler
        dropping the answer came too late: the informer forgets the object before its handlers
        hear of it.)"""
        cached, written = self.informer.get(key), self._written.get(key)
        if written is None:
            return cached
        seen = self.informer.resource_version if cached is None else Body(cached).meta.resource_version
        if _revision(seen) >= _revision(Body(written).meta.resource_version):
            del self._written[key]
            return cached
        return written

    def _remember(self, key: str, answer: JsonMapping) -> None:
        self._written[key] = answer
        self._written.move_to_end(key)
        while len(self._written) > self.memory:
            self._written.popitem(last=False)

    async def ensure(self, desired: JsonObject, *, create: bool = True) -> str:
        """"unchanged", "created", "patched", or "left" (`create` false: there is no workload to
        bring up to date, or only one being deleted; nothing is created and nothing waited for)."""
        wanted = Body(desired)
        key = _key(wanted)
        async with self._ensuring.hold(key):
            return await self._ensure(key, desired, create)

    async def _ensure(self, key: str, desired: JsonObject, create: bool) -> str:
        found = self.current(key)
        if found is None or (not create and Body(found).meta.deleting):
            return await self._create(desired) if create else "left"
        cached = Body(found)
        if cached.meta.deleting:
            return await self._after_deletion(desired)
        released = await self._released_pod(cached, desired)
        if released is None and self._known_match(key, cached, desired):
            return "unchanged"
        return await self._patch(cached, desired, released, create)

    async def _create(self, desired: JsonObject) -> str:
        wanted = Body(desired)
        key = _key(wanted)
        self.writes += 1
        try:
            created = await self.client.create(r.TENSORFUSIONWORKLOADS, _as_created(desired),
                                               namespace=wanted.namespace)
            self._remember(key, created)
            return "created"
        except AlreadyExists:
            self.writes += 1
            current = Body(await self.client.get(r.TENSORFUSIONWORKLOADS, wanted.name, namespace=wanted.namespace))
            self._remember(key, current.raw)
        if current.meta.deleting:
            return await self._after_deletion(desired)
        released = await self._released_pod(current, desired)
        if released is None and workload_matches(current, wanted):
            return "unchanged"
        return await self._patch(current, desired, released)

    async def _patch(self, current: Body, desired: JsonObject, released: str | None, create: bool = True) -> str:
        wanted = Body(desired)
        self.writes += 1
        try:
            patched = await self.client.patch(r.TENSORFUSIONWORKLOADS, wanted.name,
                                              _patch_for(current, desired, released), namespace=wanted.namespace)
        except NotFound:  # collected with its old pod meanwhile: the new pod's own, then
            if not create:
                return "left"
            self.writes += 1
            created = await self.client.create(r.TENSORFUSIONWORKLOADS, _as_created(desired),
                                               namespace=wanted.namespace)
            self._remember(_key(wanted), created)
            return "created"
        self._remember(_key(wanted), patched)
        if Body(patched).meta.deleting:  # the cache was behind: it is going all the same
            return await self._after_deletion(desired)
        return "patched"

    async def _after_deletion(self, desired: JsonObject) -> str:
        """A workload of this name that is being deleted (collected with the old pod of a bare pod
        deleted and created again under its name) cannot serve the new pod, however it is patched:
        its finalizer's cleanup ends in its removal. Wait for that, then create the new pod's own."""
        wanted = Body(desired)
        with anyio.move_on_after(TERMINATING_WAIT_S):
            while True:
                self.writes += 1
                try:
                    current = Body(await self.client.get(r.TENSORFUSIONWORKLOADS, wanted.name,
                                                         namespace=wanted.namespace))
                except NotFound:
                    return await self._create(desired)
                if not current.meta.deleting:  # another pod's admission made it again meanwhile
                    return await self._patch(current, desired, await self._released_pod(current, desired))
                await anyio.sleep(TERMINATING_POLL_S)
        raise Conflict({"message": f"TensorFusionWorkload {wanted.namespace}/{wanted.name} is still being "
                                   f"deleted after {TERMINATING_WAIT_S:.0f} s; create the pod again"}, 409)

    async def _released_pod(self, current: Body, desired: JsonObject) -> str | None:
        """The UID of the deleted pod that still controls the workload a bare pod of the same name
        needs, else None. Such a workload is about to be garbage-collected with its old pod (a pod
        deleted and created again under its name, as `kubectl replace --force` does): the patch
        lets go of that pod, and the new pod adopts the workload as any bare pod does."""
        ref = current.meta.controller_ref()
        wanted = Body(desired).meta
        if wanted.owner_references or ref is None or ref.get("kind") != "Pod":
            return None
        self.writes += 1
        try:
            pod = await self.client.get(r.PODS, str(ref.get("name")), namespace=wanted.namespace)
        except NotFound:
            return str(ref.get("uid"))
        return None if Body(pod).uid == ref.get("uid") else str(ref.get("uid"))


def _patch_for(have: Body, desired: JsonObject, released: str | None = None) -> JsonObject:
    """A merge patch: the desired labels, annotations and spec, the owners it lacks added, and the
    `released` owner's reference (a UID) dropped. A pod that asks to control the workload (the pod
    reconciler's write for a bare pod) replaces the controller there was, as its adoption does."""
    wanted = Body(desired).meta
    meta: JsonObject = {"labels": json_document(section(wanted.raw, "labels")),
                        "annotations": json_document(section(wanted.raw, "annotations"))}
    have_refs = [json_object(ref) for ref in have.meta.owner_references]
    refs = [ref for ref in have_refs if released is None or ref.get("uid") != released]
    mine = wanted.controller_ref()
    if mine is not None and mine.get("kind") == "Pod":
        refs = with_controller(refs, mine)
    uids = {ref.get("uid") for ref in refs}
    refs += [json_object(ref) for ref in wanted.owner_references if ref.get("uid") not in uids]
    if refs != have_refs:
        meta["ownerReferences"] = [*refs]
    return {"metadata": meta, "spec": json_document(section(desired, "spec"))}


# --- the autoscaler's recommendation ----------------------------------------------------------------

def _merged(base: object, over: object) -> object:
    """`over` merged onto `base` as a merge patch merges (objects key by key, anything else replaced)."""
    if not isinstance(base, Mapping) or not isinstance(over, Mapping):
        return over if over is not None else base
    out = dict(base)
    for key, value in over.items():
        out[key] = _merged(base.get(key), value)
    return out


def autoscaling_enabled(config: object) -> bool:
    """An autoScalingConfig that recommends resources: autoSetResources or externalScaler enabled,
    or an enabled cron scaling rule."""
    if not isinstance(config, Mapping):
        return False
    for part in ("autoSetResources", "externalScaler"):
        found = config.get(part)
        if isinstance(found, Mapping) and found.get("enable") is True:
            return True
    rules = config.get("cronScalingRules")
    return isinstance(rules, list) and any(isinstance(x, Mapping) and x.get("enable") is True for x in rules)


def recommendation_for(have: Workload, desired: JsonMapping) -> JsonMapping | None:
    """The recommendation a new pod of this workload takes, or None. Autoscaling counts as the
    workload will have it once the pod's spec is merged in."""
    config = _merged(have.spec.get("autoScalingConfig"), section(desired, "spec").get("autoScalingConfig"))
    found = have.status.get("recommendation")
    if not autoscaling_enabled(config) or not isinstance(found, Mapping):
        return None
    return found


def _recommended(block: object, side: str, workload: str) -> dict[str, Quantity]:
    values: dict[str, Quantity] = {}
    if not isinstance(block, Mapping):
        return values
    for field in ("tflops", "compute", "vram"):
        raw = block.get(field)
        if raw in (None, ""):
            continue
        try:
            value = parse_quantity(raw)
        except QuantityError:
            log.warning("workload %s: status.recommendation.%s.%s %r is not a quantity; ignored",
                        workload, side, field, raw)
            continue
        if value:
            values[field] = value
    return values


def apply_recommendation(plan: Plan, recommendation: JsonMapping) -> bool:
    """Make the recommendation the pod's per-GPU requests and limits (TFLOPS and compute percent
    stay exclusive); True when anything changed. What the recommendation leaves out (or gives
    as zero) stays as the pod asked."""
    target = Body(plan.workload)
    workload = f"{target.namespace or None}/{target.name or None}"
    before = dict(plan.amounts)
    for side in ("requests", "limits"):
        values = _recommended(recommendation.get(side), side, workload)
        if values.get("tflops"):
            plan.amounts[(side, "tflops")] = values["tflops"]
            plan.amounts.pop((side, "compute"), None)
        elif values.get("compute"):
            plan.amounts[(side, "compute")] = values["compute"]
            plan.amounts.pop((side, "tflops"), None)
        if values.get("vram"):
            plan.amounts[(side, "vram")] = values["vram"]
    if plan.amounts == before:
        return False
    for pair, key in ANNOTATION_OF.items():
        if plan.amounts.get(pair):
            plan.annotations[key] = str(plan.amounts[pair])
            if key in plan.remove_annotations:
                plan.remove_annotations.remove(key)
        else:
            plan.annotations.pop(key, None)
            if key not in plan.remove_annotations:
                plan.remove_annotations.append(key)
    return True
