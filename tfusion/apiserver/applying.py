"""Server-side apply as a request: the applied configuration checked as kube-apiserver checks it,
then merged (serverside.py) into the stored object and written through the Engine like any update,
again when another write lands while admission runs.

Why a module of its own: the Engine (objects.py) owns what every write shares; this is one verb's
sequence on top of it, as the scale subresource's is (scale.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tfusion.api.merge import clone
from tfusion.apiserver import errors, serverside, shapes
from tfusion.apiserver.conversion import to_served, to_storage
from tfusion.apiserver.errors import ApiError
from tfusion.apiserver.managedfields import Tracking
from tfusion.apiserver.objects import Engine, check_url_identity
from tfusion.apiserver.resources import ResourceInfo
from tfusion.apiserver.store import Entry


async def apply(
    engine: Engine,
    info: ResourceInfo,
    namespace: str,
    name: str,
    document: Callable[[], Any],
    tracking: Tracking,
    *,
    force: bool = False,
    subresource: str = "",
    dry_run: bool = False,
    field_validation: str = "",
) -> tuple[Entry, bool]:
    """Server-side apply of `document` by `tracking`'s manager: the stored object, and whether the
    apply created it."""
    config = applied_config(engine, info, namespace, name, document(), subresource)
    shape = engine.shape(info)
    for _ in range(8):  # another write may land while admission runs: apply again to the newer object
        current = engine.store.get(info.storage_key, namespace if info.namespaced else "", name)
        if current is None:
            if subresource:
                raise errors.not_found(info.plural, info.group, name)
            entries = serverside.created(config, shape, tracking.manager, tracking.api_version)
            created = Tracking(tracking.manager, tracking.api_version, applied=entries)
            try:
                return await engine.create(info, namespace, clone(config), dry_run=dry_run,
                                         field_validation=field_validation, tracking=created), True
            except ApiError as exc:
                if exc.reason != "AlreadyExists":
                    raise
                continue  # created by someone else meanwhile (admission awaits): apply to theirs
        applied = serverside.apply(to_served(info, current.copy()), config, shape, manager=tracking.manager,
                                   api_version=tracking.api_version, subresource=subresource, force=force)
        obj = to_storage(info, applied.obj)
        shapes.check(info.storage_key, info.kind, info.version, obj)
        await engine.strict(info, obj, field_validation)
        precondition = config["metadata"].get("resourceVersion")
        obj["metadata"]["resourceVersion"] = precondition or str(current.rv)
        decided = Tracking(tracking.manager, tracking.api_version, subresource, applied=applied.entries)
        try:
            entry = await engine.replace(info, namespace, name, obj, subresource=subresource, dry_run=dry_run,
                                        tracking=decided)
        except ApiError as exc:
            latest = engine.store.get(info.storage_key, namespace if info.namespaced else "", name)
            if precondition or exc.code != 409 or exc.reason != "Conflict" or latest is current:
                raise
            continue
        return entry, False
    raise errors.conflict(info.plural, info.group, name)


def applied_config(
    engine: Engine, info: ResourceInfo, namespace: str, name: str, config: Any, subresource: str
) -> dict[str, Any]:
    """The applied configuration, checked as kube checks it: a whole typed object for this URL."""
    if not isinstance(config, dict):
        raise errors.bad_request(f"the applied configuration must be an object describing a {info.kind}")
    for key in ("apiVersion", "kind"):
        if not isinstance(config.get(key), str) or not config[key]:
            raise errors.bad_request(f"{key} must be set in an applied configuration")
    checked = engine.check_body(info, serverside.drop_nulls(config))
    meta = checked["metadata"]
    if meta.get("managedFields") is not None:
        raise errors.bad_request("metadata.managedFields must be nil")
    check_url_identity(info, meta, name, namespace)
    meta["name"] = name
    if info.namespaced:
        meta["namespace"] = namespace
    else:
        meta.pop("namespace", None)
    served = to_served(info, checked)
    if info.status_split:
        # the main resource ignores status and the status subresource everything else, as on update
        if subresource == "status":
            return {"apiVersion": served["apiVersion"], "kind": served["kind"],
                    "metadata": {k: v for k, v in meta.items() if k in ("name", "namespace")},
                    **({"status": served["status"]} if "status" in served else {})}
        served.pop("status", None)
    return served
