"""CRDs: every tensor-fusion.ai kind installed, at this tfusion's schema.

Why it matters: a missing CRD stops the controller's informers for that kind (and `--role=all`
refuses to start); a CRD at another schema makes the API server reject or prune fields this tfusion
writes, which shows up far from the cause (a status that never changes, a spec field that vanishes).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tfusion.api import crds as tf_crds
from tfusion.api.accessors import Body
from tfusion.doctor.context import Context
from tfusion.doctor.findings import Finding, error, ok
from tfusion.kube import resources as r

CHECK = "crds"
FIX = ("apply this tfusion's CRDs: `tfusion crds | kubectl apply --server-side --force-conflicts -f -` "
       "(--role=all installs them when it starts: restart it)")
#: what of a version must match; the API server may add fields of its own elsewhere
_VERSION_KEYS = ("schema", "served", "storage", "subresources")


def first_difference(wanted: object, found: object, path: str = "") -> str:
    """Where `found` first differs from `wanted` ("" when equal), e.g. `.properties.spec: missing`."""
    if isinstance(wanted, Mapping) and isinstance(found, Mapping):
        for key in sorted(set(wanted) | set(found)):
            if key not in found:
                return f"{path}.{key}: missing on the cluster"
            if key not in wanted:
                return f"{path}.{key}: not in this tfusion's schema"
            if where := first_difference(wanted[key], found[key], f"{path}.{key}"):
                return where
        return ""
    if isinstance(wanted, list) and isinstance(found, list) and len(wanted) == len(found):
        for index, (a, b) in enumerate(zip(wanted, found, strict=True)):
            if where := first_difference(a, b, f"{path}[{index}]"):
                return where
        return ""
    return "" if wanted == found else f"{path or '.'}: {found!r} on the cluster, {wanted!r} here"


def schema_difference(wanted: Mapping[str, object], found: Mapping[str, object]) -> str:
    """The first difference between two CRDs' versions ("" when they agree)."""
    found_versions = {v.get("name"): v for v in _versions(found)}
    for version in _versions(wanted):
        name = version.get("name")
        theirs = found_versions.get(name)
        if theirs is None:
            return f"version {name} is not defined"
        for key in _VERSION_KEYS:
            if where := first_difference(version.get(key), theirs.get(key), f"{name}.{key}"):
                return where
    return ""


def _versions(crd: Mapping[str, object]) -> Sequence[Mapping[str, object]]:
    spec = crd.get("spec")
    versions = spec.get("versions") if isinstance(spec, Mapping) else None
    return [v for v in versions if isinstance(v, Mapping)] if isinstance(versions, list) else []


async def check(ctx: Context) -> list[Finding]:
    ours = {Body(crd).name: crd for crd in tf_crds.all_crds()}
    installed = {Body(crd).name: crd for crd in await ctx.client.list(r.CUSTOMRESOURCEDEFINITIONS)
                 if Body(crd).name in ours}
    findings = []
    missing = [name for name in ours if name not in installed]
    if missing:
        findings.append(error(CHECK, f"{len(missing)} of {len(ours)} CRDs are not installed: {', '.join(missing)}; "
                                     "tfusion cannot watch or write those kinds", FIX))
    for name, crd in installed.items():
        if where := schema_difference(ours[name], crd):
            findings.append(error(CHECK, f"CRD {name} is not at this tfusion's schema ({where}); the API server "
                                         "would reject or drop fields tfusion writes", FIX))
    return findings or [ok(CHECK, f"all {len(ours)} CRDs are installed at this tfusion's schema")]
