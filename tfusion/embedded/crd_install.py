"""Installing the tensor-fusion.ai CRDs into the API server, and waiting until their kinds are served.

A CRD is created when missing and replaced when the one this tfusion version generates differs
from the one installed. "Differs" is judged by a hash of the generated CRD kept in an annotation,
not by comparing specs, because the API server fills in defaults: a restart of the same version
writes nothing, and an upgrade rewrites exactly the CRDs whose schema changed.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

import anyio
import orjson

from tfusion.api.accessors import Body
from tfusion.api.crds import all_crds
from tfusion.api.jsontypes import JsonMapping, JsonObject, json_object
from tfusion.kube.client import AlreadyExists, Conflict, KubeClient, KubeError
from tfusion.kube.resources import CUSTOMRESOURCEDEFINITIONS, ApiResource

log = logging.getLogger(__name__)

#: how long to wait for every CRD's kind to be served after it was written
SERVED_TIMEOUT_S = 15.0


class CrdInstallError(RuntimeError):
    """A CRD could not be installed or its kind is not served; the message names it."""


@dataclass
class CrdReport:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)

    def describe(self) -> str:
        return (f"{len(self.created)} created, {len(self.updated)} updated, "
                f"{len(self.unchanged)} unchanged")


def spec_hash(crd: Body) -> str:
    """A stable digest of what we generate for one CRD (its spec)."""
    canonical = orjson.dumps(crd.spec, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(canonical).hexdigest()[:16]


def served_resources(crd: Body) -> list[ApiResource]:
    """The REST resources a CRD makes the server serve (one per served version)."""
    spec = crd.spec
    names = spec["names"]
    return [ApiResource(spec["group"], version["name"], names["plural"], names["kind"], spec["scope"] == "Namespaced")
            for version in spec["versions"] if version.get("served", True)]


async def install_crds(client: KubeClient, *, hash_annotation: str,
                       crds: Iterable[JsonMapping] | None = None) -> CrdReport:
    """Create or update every CRD, then wait until all their kinds are served."""
    wanted = [Body(crd) for crd in (all_crds() if crds is None else crds)]
    report = CrdReport()
    for crd in wanted:
        await _apply(client, crd, hash_annotation, report)
    await wait_served(client, [res for crd in wanted for res in served_resources(crd)])
    return report


async def _apply(client: KubeClient, crd: Body, hash_annotation: str, report: CrdReport) -> None:
    name = crd.name
    digest = spec_hash(crd)
    for _ in range(5):  # 409: someone else wrote it between our read and write; read again
        try:
            existing = Body(await client.get(CUSTOMRESOURCEDEFINITIONS, name))
        except KubeError as exc:
            if exc.code != 404:
                raise CrdInstallError(f"reading CRD {name}: {exc}") from None
            body = _with_hash(crd, digest, hash_annotation)
            try:
                await client.create(CUSTOMRESOURCEDEFINITIONS, body)
            except AlreadyExists:
                continue
            except KubeError as exc:
                raise CrdInstallError(f"creating CRD {name}: {exc}") from None
            report.created.append(name)
            return
        if existing.meta.annotation(hash_annotation) == digest:
            report.unchanged.append(name)
            return
        body = _with_hash(crd, digest, hash_annotation, existing=existing)
        try:
            await client.replace(CUSTOMRESOURCEDEFINITIONS, body)
        except Conflict:
            continue
        except KubeError as exc:
            raise CrdInstallError(f"updating CRD {name}: {exc}") from None
        log.info("updated CRD %s to this version's schema", name)
        report.updated.append(name)
        return
    raise CrdInstallError(f"CRD {name}: kept changing while being written (409 five times)")


def _with_hash(crd: Body, digest: str, hash_annotation: str, existing: Body | None = None) -> JsonObject:
    """The CRD to write: ours, keeping the labels and annotations others put on the installed one."""
    old = existing.meta if existing is not None else None
    labels: JsonObject = {**(old.labels if old else {}), **crd.meta.labels}
    annotations: JsonObject = {**(old.annotations if old else {}), hash_annotation: digest}
    meta: JsonObject = {"name": crd.name, "labels": labels, "annotations": annotations}
    if old is not None and old.resource_version:
        meta["resourceVersion"] = old.resource_version
    return {**json_object(crd.raw), "metadata": meta}


async def wait_served(client: KubeClient, resources: list[ApiResource], timeout: float = SERVED_TIMEOUT_S) -> None:
    """Wait until a list of each resource succeeds (what every informer will do next)."""
    pending = list(resources)
    last_error = ""
    with anyio.move_on_after(timeout):
        while pending:
            still: list[ApiResource] = []
            for res in pending:
                try:
                    await client.request("GET", res, params={"limit": "1"})
                except KubeError as exc:
                    still.append(res)
                    last_error = f"{res.name}: {exc}"
            pending = still
            if pending:
                await anyio.sleep(0.1)
    if pending:
        raise CrdInstallError(f"CRDs written but not served after {timeout:.0f}s: "
                              f"{', '.join(r.name for r in pending)} (last error: {last_error})")
