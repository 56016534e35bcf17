"""Object semantics of kube-apiserver over the store: create, update, patch, delete, list.

This is where metadata is owned (uid, creationTimestamp, generateName, generation, deletionTimestamp),
where optimistic concurrency is decided, where the status subresource is split from the main
resource, and where finalizers hold an object back from deletion. Kind-specific defaults and
validation live in kinds.py; HTTP in app.py; what a store is given when the server starts in seed.py.
"""

from __future__ import annotations

import base64
import binascii
import logging
import random
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from tfusion.api.merge import clone
from tfusion.api.timestamps import rfc3339
from tfusion.apiserver import (
    customresources,
    errors,
    kubeschemas,
    limits,
    managedfields,
    policies,
    shapes,
    validation,
)
from tfusion.apiserver.conversion import to_served, to_storage
from tfusion.apiserver.errors import ApiError
from tfusion.apiserver.fieldsets import Shape, shape_for
from tfusion.apiserver.kinds import (
    CRDS,
    NAMESPACES,
    PODS,
    KindRules,
)
from tfusion.apiserver.managedfields import Tracking
from tfusion.apiserver.resources import Registry, ResourceInfo
from tfusion.apiserver.store import Entry, Selection, Store, copy_json, encode_object

__all__ = ["CRDS", "FOREGROUND", "NAMESPACES", "PODS", "Engine"]
log = logging.getLogger(__name__)
FOREGROUND = "foregroundDeletion"
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"

#: (operation, info, object, old object or None, dry run) -> the object after mutating admission
Admit = Callable[[str, ResourceInfo, dict[str, Any], dict[str, Any] | None, bool], Awaitable[dict[str, Any]]]


def spec_part(obj: dict[str, Any], status_split: bool) -> dict[str, Any]:
    skip = ("metadata", "status", "apiVersion", "kind") if status_split else ("metadata", "apiVersion", "kind")
    return {k: v for k, v in obj.items() if k not in skip}


class Engine:
    def __init__(self, store: Store, registry: Registry) -> None:
        self.store = store
        self.registry = registry
        self.kinds = KindRules(store, registry)
        store.cluster_scoped = registry.cluster_scoped
        self.admit: Admit | None = None
        self.on_namespace_terminating: Callable[[str], None] = lambda name: None
        #: set by the garbage collector: does anything name this uid as its owner?
        self.has_dependents: Callable[[str], bool] = lambda uid: False
        #: set by the garbage collector: an owner is waiting for its dependents (foreground deletion)
        self.on_foreground: Callable[[str], None] = lambda uid: None

    # ------------------------------------------------------------------------------ reads
    def get(self, info: ResourceInfo, namespace: str, name: str) -> Entry:
        entry = self.store.get(info.storage_key, namespace, name)
        if entry is None:
            raise errors.not_found(info.plural, info.group, name)
        return entry

    def namespace_check(self, info: ResourceInfo, namespace: str, *, creating: bool) -> None:
        if not info.namespaced:
            return
        ns = self.store.get(NAMESPACES, "", namespace)
        if ns is None:
            raise errors.not_found("namespaces", "", namespace)
        if creating and ns.obj["metadata"].get("deletionTimestamp"):
            raise ApiError(
                403,
                "Forbidden",
                f'{errors.qualified(info.plural, info.group)} "" is forbidden: '
                f"unable to create new content in namespace {namespace} because it "
                f"is being terminated",
                details={
                    "kind": info.plural,
                    "group": info.group,
                    "causes": [
                        {
                            "reason": "NamespaceTerminating",
                            "message": f"namespace {namespace} is being terminated",
                            "field": "metadata.namespace",
                        }
                    ],
                },
            )

    # ------------------------------------------------------------------------------ create
    async def create(
        self, info: ResourceInfo, namespace: str, body: Any, *, dry_run: bool = False, field_validation: str = "",
        tracking: Tracking | None = None,
    ) -> Entry:
        obj = self.check_body(info, body)
        await self.strict(info, obj, field_validation)
        meta = obj["metadata"]
        managedfields.take_sent(info.kind, info.group, meta, tracking, None)
        if info.namespaced:
            body_ns = meta.get("namespace")
            if body_ns and body_ns != namespace:
                raise errors.bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        name = meta.get("name") or ""
        if not isinstance(name, str):
            raise errors.bad_request("metadata.name must be a string")
        generate = meta.get("generateName") or ""
        if not name and (not generate or not isinstance(generate, str)):
            raise errors.invalid(
                info.kind, info.group, "", [validation.required("metadata.name", "name or generateName is required")]
            )
        self.namespace_check(info, namespace, creating=True)
        # the server assigns the uid (a Job's generated selector is made from it, after defaulting)
        for key in ("uid", "resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "managedFields",
                    "selfLink"):
            meta.pop(key, None)
        if info.status_split:
            obj.pop("status", None)
        self.kinds.defaults(info, obj, None)
        if self.admit is not None:
            # like kube-apiserver, webhooks see the request before generateName is resolved
            obj = await self.admit("CREATE", info, obj, None, dry_run)
            meta = obj["metadata"]
            meta["name"] = name
            if info.namespaced:
                meta["namespace"] = namespace
            else:
                meta.pop("namespace", None)
        # from here on no await: the existence check and the write are one atomic step
        self.namespace_check(info, namespace, creating=True)
        ns_key = namespace if info.namespaced else ""
        if not name:
            for _ in range(8):  # kube-apiserver retries generated names that collide
                name = generate + "".join(random.choices(_NAME_ALPHABET, k=5))
                if self.store.get(info.storage_key, ns_key, name) is None:
                    break
            meta["name"] = name
        if self.store.get(info.storage_key, ns_key, name) is not None:
            raise errors.already_exists(info.plural, info.group, name)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = rfc3339()
        if info.tracks_generation:
            meta["generation"] = 1
        else:
            meta.pop("generation", None)
        self.kinds.defaults(info, obj, None)
        self.kinds.validate(info, obj, None)
        policies.admit(self.store, "CREATE", info, "", obj, None, dry_run=dry_run)
        if tracking is not None:
            managedfields.record(None, obj, self.shape(info), tracking)
        if dry_run:
            return Entry(obj, encode_object(obj), self.store.rv)
        entry = self.store.put(info.storage_key, obj, None)
        self.kinds.after_write(info, entry, None)
        return entry

    @staticmethod
    async def strict(info: ResourceInfo, obj: dict[str, Any], field_validation: str) -> None:
        """fieldValidation=Strict (kubectl's default): fields the kind's schema does not declare are an error."""
        if field_validation != "Strict":
            return
        if info.is_custom:
            unknown = customresources.unknown_fields(info, obj)
        else:  # the fields of the version the client wrote, not of the stored one (events.k8s.io/v1 Events)
            served = to_served(info, clone(obj))
            unknown = (await kubeschemas.loaded()).unknown_fields(info.group, info.version, info.kind, served)
        if unknown:
            fields = ", ".join(f'unknown field "{path}"' for path in unknown)
            raise errors.bad_request(
                f'{info.kind} in version "{info.version}" cannot be handled as a {info.kind}: '
                f"strict decoding error: {fields}"
            )

    @staticmethod
    def shape(info: ResourceInfo) -> Shape:
        """The schema field ownership walks objects of this resource by (fieldsets.py)."""
        return shape_for(info.kind, info.schema)

    def check_body(self, info: ResourceInfo, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise errors.bad_request(f"the body of the request must be a JSON object describing a {info.kind}")
        kind = body.get("kind")
        if kind and kind != info.kind:
            raise errors.bad_request(
                f"the kind in the body ({kind}) does not match the kind of the resource ({info.kind})"
            )
        api_version = body.get("apiVersion")
        if api_version and api_version != info.api_version:
            raise errors.bad_request(
                f"the API version in the data ({api_version}) does not match the expected "
                f"API version ({info.api_version})"
            )
        body["kind"], body["apiVersion"] = info.kind, info.api_version
        meta = body.get("metadata")
        if meta is None:
            meta = body["metadata"] = {}
        if not isinstance(meta, dict):
            raise errors.bad_request("metadata must be an object")
        stored = to_storage(info, body)
        shapes.check(info.storage_key, info.kind, info.version, stored)
        return stored

    # ------------------------------------------------------------------------------ update / patch
    async def update(
        self,
        info: ResourceInfo,
        namespace: str,
        name: str,
        body: Any,
        *,
        subresource: str = "",
        dry_run: bool = False,
        field_validation: str = "",
        tracking: Tracking | None = None,
    ) -> Entry:
        obj = self.check_body(info, body)
        await self.strict(info, obj, field_validation)
        meta = obj["metadata"]
        # a read-modify-write sends back the entries it read: no need to check them again
        stored = self.store.get(info.storage_key, namespace if info.namespaced else "", name)
        previous = stored.obj["metadata"].get("managedFields") if stored else None
        managedfields.take_sent(info.kind, info.group, meta, tracking, previous)
        check_url_identity(info, meta, name, namespace)
        return await self.replace(info, namespace, name, obj, subresource=subresource, dry_run=dry_run,
                                   tracking=tracking)

    async def patch(
        self,
        info: ResourceInfo,
        namespace: str,
        name: str,
        patch_body: bytes | Callable[[], Any],
        content_type: str,
        *,
        subresource: str = "",
        dry_run: bool = False,
        field_validation: str = "",
        tracking: Tracking | None = None,
    ) -> Entry:
        from tfusion.apiserver import patch as patching

        ctype = content_type.split(";")[0].strip().lower()
        allowed = ["application/json-patch+json", "application/merge-patch+json"]
        if not info.is_custom:
            allowed.append("application/strategic-merge-patch+json")
        if ctype not in allowed:
            raise errors.unsupported_media_type(ctype, allowed)
        # bytes, or the request's decoder (app.py decodes large bodies off the event loop)
        document = limits.decode_json(patch_body, "patch") if isinstance(patch_body, bytes) else patch_body()
        current = self.get(info, namespace, name)
        # a private copy, so each patch applies in place; the stored object is the "before"
        target = to_served(info, current.copy())
        sent_before = current.obj["metadata"].get("managedFields")
        try:
            if ctype == "application/json-patch+json":
                patched = patching.json_patch(target, document, max_bytes=limits.MAX_OBJECT_BYTES, owned=True)
            elif ctype == "application/merge-patch+json":
                if not isinstance(document, dict):
                    raise errors.bad_request("a merge patch must be a JSON object")
                patched = patching.merge_patch(target, document, owned=True)
            else:
                patched = patching.strategic_merge_patch(target, document, info.kind, owned=True)
        except patching.PatchTooLarge as exc:
            raise limits.object_too_large(exc.size) from None
        except patching.PatchError as exc:
            raise errors.invalid(info.kind, info.group, name, [("patch", "FieldValueInvalid", str(exc))]) from None
        if ctype == "application/json-patch+json":
            # copy and move can nest the object deeper than either input; merges cannot
            limits.check_value(patched, "the patched object")
        if not isinstance(patched, dict) or not isinstance(patched.get("metadata"), dict):
            raise errors.invalid(
                info.kind,
                info.group,
                name,
                [("metadata", "FieldValueRequired", "Required value: a patch may not remove metadata")],
            )
        meta = patched["metadata"]
        managedfields.take_sent(info.kind, info.group, meta, tracking, sent_before)
        check_url_identity(info, meta, name, namespace, name_required=True)
        patched["kind"], patched["apiVersion"] = info.kind, info.api_version
        patched = to_storage(info, patched)
        shapes.check(info.storage_key, info.kind, info.version, patched)
        await self.strict(info, patched, field_validation)
        return await self.replace(info, namespace, name, patched, subresource=subresource, dry_run=dry_run,
                                   tracking=tracking)

    async def replace(
        self, info: ResourceInfo, namespace: str, name: str, obj: dict[str, Any], *, subresource: str, dry_run: bool,
        tracking: Tracking | None = None,
    ) -> Entry:
        ns = namespace if info.namespaced else ""
        self.namespace_check(info, ns, creating=False)
        old = self.get(info, ns, name)
        wanted_rv = obj["metadata"].get("resourceVersion")
        if wanted_rv and str(wanted_rv) != str(old.rv):
            raise errors.conflict(info.plural, info.group, name)
        wanted_uid, old_uid = obj["metadata"].get("uid"), old.obj["metadata"].get("uid")
        if wanted_uid and wanted_uid != old_uid:
            raise errors.conflict(
                info.plural,
                info.group,
                name,
                f"Precondition failed: UID in precondition: {wanted_uid}, UID in object meta: {old_uid}",
            )
        obj = self._merge_system_fields(info, old.obj, obj, subresource)
        if self.admit is not None and subresource == "":
            obj = await self.admit("UPDATE", info, obj, old.obj, dry_run)
            obj = self._merge_system_fields(info, old.obj, obj, subresource)
            # the object may have changed while the webhook ran: decide on the version the caller read
            latest = self.get(info, ns, name)
            if latest is not old:
                if wanted_rv:
                    raise errors.conflict(info.plural, info.group, name)
                return await self.replace(info, namespace, name, obj, subresource=subresource, dry_run=dry_run,
                                           tracking=tracking)
        return self.commit_update(info, old, obj, dry_run=dry_run, subresource=subresource, tracking=tracking)

    def _merge_system_fields(
        self, info: ResourceInfo, old: dict[str, Any], new: dict[str, Any], subresource: str
    ) -> dict[str, Any]:
        """Keep what clients cannot change: server-owned metadata, and spec/status per the subresource."""
        if subresource == "status":
            merged: dict[str, Any] = copy_json(old)
            if "status" in new:
                merged["status"] = new["status"]
            else:
                merged.pop("status", None)
            return merged
        meta, old_meta = new["metadata"], old["metadata"]
        for key in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation"):
            if key in old_meta:
                meta[key] = old_meta[key]
            else:
                meta.pop(key, None)
        meta["name"] = old_meta["name"]
        # kube-apiserver clears a namespace sent for a cluster-scoped object (else it would be stored
        # as a second object under that namespace); a namespaced object keeps the one it lives in
        if info.namespaced and old_meta.get("namespace"):
            meta["namespace"] = old_meta["namespace"]
        else:
            meta.pop("namespace", None)
        meta.pop("managedFields", None)
        meta.pop("selfLink", None)
        if info.status_split:
            if "status" in old:
                new["status"] = old["status"]
            else:
                new.pop("status", None)
        return new

    def commit_update(self, info: ResourceInfo, old: Entry, obj: dict[str, Any], *, dry_run: bool = False,
                      subresource: str = "", tracking: Tracking | None = None) -> Entry:
        """Validate and store `obj` as the next version of `old` (no await: atomic)."""
        meta, old_meta = obj["metadata"], old.obj["metadata"]
        if old_meta.get("deletionTimestamp"):
            added = set(meta.get("finalizers") or ()) - set(old_meta.get("finalizers") or ())
            if added:
                raise errors.invalid(
                    info.kind,
                    info.group,
                    meta["name"],
                    [
                        validation.forbidden(
                            "metadata.finalizers",
                            "no new finalizers can be added if the object is being deleted, found "
                            f"new finalizers {sorted(added)}",
                        )
                    ],
                )
        self.kinds.defaults(info, obj, old.obj)
        self.kinds.validate(info, obj, old.obj)
        policies.admit(self.store, "UPDATE", info, subresource, obj, old.obj, dry_run=dry_run)
        if tracking is not None:
            managedfields.record(old.obj, obj, self.shape(info), tracking)
        elif "managedFields" in old_meta:  # a write of the server's own keeps who owns what
            meta["managedFields"] = old_meta["managedFields"]
        if info.tracks_generation:
            generation = old_meta.get("generation", 1)
            if spec_part(obj, info.status_split) != spec_part(old.obj, info.status_split):
                generation += 1
            meta["generation"] = generation
        meta["resourceVersion"] = old_meta.get("resourceVersion")
        if obj == old.obj:
            return old  # no-op: kube-apiserver neither bumps the resourceVersion nor emits an event
        if dry_run:
            return Entry(obj, encode_object(obj), old.rv)
        if meta.get("deletionTimestamp") and not meta.get("finalizers") and info.storage_key != NAMESPACES:
            self.store.put(info.storage_key, obj, old)
            return self._remove(info, self.store.get(info.storage_key, meta.get("namespace", ""), meta["name"]))
        entry = self.store.put(info.storage_key, obj, old)
        self.kinds.after_write(info, entry, old)
        return entry

    # ------------------------------------------------------------------------------ delete
    def delete(
        self,
        info: ResourceInfo,
        namespace: str,
        name: str,
        options: dict[str, Any] | None = None,
        *,
        dry_run: bool = False,
    ) -> Entry:
        options = options or {}
        ns = namespace if info.namespaced else ""
        old = self.get(info, ns, name)
        preconditions = options.get("preconditions") or {}
        old_meta = old.obj["metadata"]
        if preconditions.get("uid") and preconditions["uid"] != old_meta.get("uid"):
            raise errors.conflict(
                info.plural,
                info.group,
                name,
                f"Precondition failed: UID in precondition: {preconditions['uid']}, UID in "
                f"object meta: {old_meta.get('uid')}",
            )
        if preconditions.get("resourceVersion") and str(preconditions["resourceVersion"]) != str(old.rv):
            raise errors.conflict(
                info.plural,
                info.group,
                name,
                f"Precondition failed: ResourceVersion in precondition: "
                f"{preconditions['resourceVersion']}, ResourceVersion in object meta: {old.rv}",
            )
        policy = options.get("propagationPolicy")
        if policy is None and options.get("orphanDependents") is True:
            policy = "Orphan"
        if policy not in (None, "Orphan", "Background", "Foreground"):
            raise errors.invalid(
                "DeleteOptions",
                "",
                "",
                [
                    validation.invalid_value(
                        "propagationPolicy", policy, 'supported values: "Orphan", "Background", "Foreground"'
                    )
                ],
            )
        policies.admit(self.store, "DELETE", info, "", None, old.obj, dry_run=dry_run)
        if dry_run:
            return old
        uid = old_meta.get("uid", "")
        if policy == "Orphan":
            self.orphan_dependents(uid)
        if info.storage_key == NAMESPACES:
            return self._terminate_namespace(info, old)
        finalizers = list(old_meta.get("finalizers") or ())
        if policy == "Foreground" and self.has_dependents(uid) and FOREGROUND not in finalizers:
            # kube's foreground cascade: the owner waits, marked, until its dependents are gone
            finalizers.append(FOREGROUND)
        if finalizers:
            if old_meta.get("deletionTimestamp") and finalizers == old_meta.get("finalizers"):
                return old
            obj = old.copy()
            meta = obj["metadata"]
            meta["finalizers"] = finalizers
            if not meta.get("deletionTimestamp"):
                meta["deletionTimestamp"] = rfc3339()
                meta["deletionGracePeriodSeconds"] = 0
                if info.tracks_generation:
                    meta["generation"] = old_meta.get("generation", 1) + 1
            entry = self.store.put(info.storage_key, obj, old)
            if FOREGROUND in finalizers:
                self.on_foreground(uid)
            return entry
        return self._remove(info, old)

    def _remove(self, info: ResourceInfo, entry: Entry | None) -> Entry:
        assert entry is not None
        final = self.store.remove(info.storage_key, entry)
        if info.storage_key == CRDS:
            self.kinds.crd_removed(entry.obj)
        return final

    def _terminate_namespace(self, info: ResourceInfo, old: Entry) -> Entry:
        if old.obj["metadata"].get("deletionTimestamp"):
            return old
        obj = old.copy()
        obj["metadata"]["deletionTimestamp"] = rfc3339()
        obj["metadata"]["deletionGracePeriodSeconds"] = 0
        obj.setdefault("status", {})["phase"] = "Terminating"
        entry = self.store.put(info.storage_key, obj, old)
        self.on_namespace_terminating(obj["metadata"]["name"])
        return entry

    def finish_namespace(self, name: str) -> bool:
        """Remove a terminating namespace once nothing is left in it; True when it is gone."""
        entry = self.store.get(NAMESPACES, "", name)
        if entry is None:
            return True
        for storage_key in self.store.storage_keys():
            if storage_key == NAMESPACES:
                continue
            for _ in self.store.items(storage_key, name):
                return False
        if entry.obj["metadata"].get("finalizers"):
            return False
        self.store.remove(NAMESPACES, entry)
        return True

    def orphan_dependents(self, owner_uid: str) -> None:
        if not owner_uid:
            return
        for storage_key in self.store.storage_keys():
            info = self.registry.storage_info(storage_key)
            if info is None:
                continue
            for _, entry in self.store.items(storage_key):
                refs = entry.obj["metadata"].get("ownerReferences") or []
                if any(r.get("uid") == owner_uid for r in refs):
                    obj = entry.copy()
                    kept = [r for r in refs if r.get("uid") != owner_uid]
                    if kept:
                        obj["metadata"]["ownerReferences"] = kept
                    else:
                        obj["metadata"].pop("ownerReferences", None)
                    self.store.put(storage_key, obj, entry)

    # ------------------------------------------------------------------------------ list
    def list(
        self,
        info: ResourceInfo,
        namespace: str | None,
        *,
        label_selector: Any = None,
        field_selector: Any = None,
        limit: int = 0,
        continue_token: str = "",
    ) -> tuple[list[Entry], str, int]:
        """Matching entries in key order, the continue token and the remaining count (when limited).

        A page costs what it returns (plus the objects its selectors skip), not the size of the
        resource: it starts at the continue key by binary search in the store's key order."""
        start: tuple[str, str] | None = None
        if continue_token:
            start = decode_continue(continue_token)
        order, first, end = self.store.ordered(info.storage_key, namespace, start)
        bucket = self.store.bucket(info.storage_key)
        selection = Selection(label_selector, field_selector)
        everything = selection.everything
        out: list[Entry] = []
        for index in range(first, end):
            entry = bucket[order[index]]
            if not everything and not selection.matches(entry):
                continue
            if limit and len(out) == limit:
                return out, encode_continue(self.store.rv, out[-1]), end - index
            out.append(entry)
        return out, "", 0


def check_url_identity(
    info: ResourceInfo, meta: dict[str, Any], name: str, namespace: str, *, name_required: bool = False
) -> None:
    """A body may not name another object than its URL does (kube's 400s); an unset name or
    namespace takes the URL's, unless `name_required` (a patch may not remove the name)."""
    if (name_required or meta.get("name")) and meta.get("name") != name:
        raise errors.bad_request(
            f"the name of the object ({meta.get('name')}) does not match the name on the URL ({name})"
        )
    if info.namespaced and meta.get("namespace") and meta["namespace"] != namespace:
        raise errors.bad_request(
            "the namespace of the provided object does not match the namespace sent on the request"
        )


def encode_continue(rv: int, last: Entry) -> str:
    raw = orjson.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": [last.namespace, last.name]})
    return base64.urlsafe_b64encode(raw).decode()


def decode_continue(token: str) -> tuple[str, str]:
    try:
        data = orjson.loads(base64.urlsafe_b64decode(token.encode() + b"=" * (-len(token) % 4)))
        ns, name = data["start"]
        return str(ns), str(name)
    except (binascii.Error, ValueError, KeyError, TypeError):
        raise errors.bad_request(f"continue key is not valid: {token!r}") from None
