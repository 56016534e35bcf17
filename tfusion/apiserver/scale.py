"""The `/scale` subresource of Deployments and ReplicaSets (autoscaling/v1 Scale), as `kubectl scale` uses it.

A Scale is a view of its parent: spec.replicas is the parent's, status.replicas and the selector
(as a string) come from the parent's status and spec. Writing it (PUT, or a merge / JSON /
strategic patch, which kubectl sends) changes only the parent's spec.replicas, through the
parent's own update path, so validation, generation and resourceVersion preconditions apply.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tfusion.apiserver import apps, errors, limits, shapes
from tfusion.apiserver.objects import Engine
from tfusion.apiserver.resources import ResourceInfo
from tfusion.apiserver.store import Entry

SCALE_KIND, SCALE_VERSION = "Scale", "autoscaling/v1"
_PATCH_TYPES = ["application/json-patch+json", "application/merge-patch+json", "application/strategic-merge-patch+json"]


def scale_of(entry: Entry) -> dict[str, Any]:
    obj = entry.obj
    meta = obj["metadata"]
    selector = apps.format_selector((obj.get("spec") or {}).get("selector"))
    scale_meta = {key: meta[key] for key in ("name", "namespace", "uid", "creationTimestamp") if key in meta}
    scale_meta["resourceVersion"] = str(entry.rv)
    return {
        "kind": SCALE_KIND,
        "apiVersion": SCALE_VERSION,
        "metadata": scale_meta,
        "spec": {"replicas": int((obj.get("spec") or {}).get("replicas") or 0)},
        "status": {"replicas": int((obj.get("status") or {}).get("replicas") or 0), "selector": selector},
    }


def get(engine: Engine, info: ResourceInfo, namespace: str, name: str) -> dict[str, Any]:
    return scale_of(engine.get(info, namespace, name))


async def update(
    engine: Engine, info: ResourceInfo, namespace: str, name: str, body: Any, *, dry_run: bool = False
) -> dict[str, Any]:
    """PUT /scale: the body is a Scale; its spec.replicas becomes the parent's."""
    _check_scale(body, name)
    current = engine.get(info, namespace, name)
    wanted_rv = (body.get("metadata") or {}).get("resourceVersion")
    return await _write(engine, info, namespace, name, current, body, wanted_rv, dry_run)


async def patch(
    engine: Engine,
    info: ResourceInfo,
    namespace: str,
    name: str,
    document: Callable[[], Any],
    content_type: str,
    *,
    dry_run: bool = False,
) -> dict[str, Any]:
    """PATCH /scale: the patch applies to the Scale view, then to the parent as a PUT would."""
    from tfusion.apiserver import patch as patching

    ctype = content_type.split(";")[0].strip().lower()
    if ctype not in _PATCH_TYPES:
        raise errors.unsupported_media_type(ctype, _PATCH_TYPES)
    current = engine.get(info, namespace, name)
    view = scale_of(current)
    try:
        if ctype == "application/json-patch+json":
            patched = patching.json_patch(view, document(), max_bytes=limits.MAX_OBJECT_BYTES)
        else:
            patch_body = document()
            if not isinstance(patch_body, dict):
                raise errors.bad_request("a merge patch must be a JSON object")
            patched = patching.merge_patch(view, patch_body)
    except patching.PatchTooLarge as exc:
        raise limits.object_too_large(exc.size) from None
    except patching.PatchError as exc:
        raise errors.invalid(SCALE_KIND, "autoscaling", name, [("patch", "FieldValueInvalid", str(exc))]) from None
    _check_scale(patched, name)
    wanted_rv = (patched.get("metadata") or {}).get("resourceVersion")
    if wanted_rv == view["metadata"]["resourceVersion"]:
        wanted_rv = None  # unchanged by the patch: no precondition, as kube-apiserver retries patches
    return await _write(engine, info, namespace, name, current, patched, wanted_rv, dry_run)


def _check_scale(body: Any, name: str) -> None:
    shapes.check_body(shapes.SCALE, SCALE_KIND, "v1", body)
    assert isinstance(body, dict)
    body_name = (body.get("metadata") or {}).get("name")
    if body_name and body_name != name:
        raise errors.bad_request(f"the name of the object ({body_name}) does not match the name on the URL ({name})")
    replicas = (body.get("spec") or {}).get("replicas")
    if replicas is None:
        replicas = 0
    if replicas < 0:
        raise errors.invalid(
            SCALE_KIND,
            "autoscaling",
            name,
            [("spec.replicas", "FieldValueInvalid", f"Invalid value: {replicas}: must be greater than or equal to 0")],
        )


async def _write(
    engine: Engine,
    info: ResourceInfo,
    namespace: str,
    name: str,
    current: Entry,
    scale: dict[str, Any],
    wanted_rv: Any,
    dry_run: bool,
) -> dict[str, Any]:
    if wanted_rv and str(wanted_rv) != str(current.rv):
        raise errors.conflict(info.plural, info.group, name)
    parent = current.copy()
    parent.setdefault("spec", {})["replicas"] = int((scale.get("spec") or {}).get("replicas") or 0)
    parent["metadata"]["resourceVersion"] = str(current.rv)
    entry = await engine.update(info, namespace, name, parent, dry_run=dry_run)
    return scale_of(entry)
