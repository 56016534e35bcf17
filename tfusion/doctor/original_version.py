"""Which release of the original TensorFusion operator is installed, against the one tfusion follows.

Why: tfusion re-implements the original's API (`tensor-fusion.ai/v1`) as one release defines it. Its
reference (upstream-controller.md) describes the Go project at commit 3e0a4901, which is the
release tagged v2.17.1. An older original's objects are a subset tfusion reads; a newer one may
carry fields tfusion's CRDs do not have, and the API server prunes unknown fields from objects of a
structural schema, so they would be lost once tfusion's CRDs replace the original's. The only place
the release shows is the operator image's tag (`tensorfusion/tensor-fusion-operator:2.17.1`); a tag
that is no version (`latest`, a digest alone) is reported as unknown, not guessed.
"""

from __future__ import annotations

import re

from tfusion.doctor.findings import Finding, info, ok, warning

API_VERSION = "tensor-fusion.ai/v1"
REFERENCE_VERSION: tuple[int, int, int] = (2, 17, 1)
REFERENCE = ".".join(map(str, REFERENCE_VERSION))
_VERSION = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?(?:[-+][0-9A-Za-z.+-]*)?")


def image_tag(image: str) -> str:
    """The tag of an image reference ("" when it has none); a registry's port is no tag."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return last.partition(":")[2]


def parse_version(tag: str) -> tuple[int, int, int] | None:
    """(major, minor, patch) of a release tag such as 2.17.1, v2.17.1 or 2.17.1-amd64; None otherwise."""
    found = _VERSION.fullmatch(tag.strip())
    if found is None:
        return None
    major, minor, patch = found.groups()
    return int(major), int(minor), int(patch or 0)


def version_finding(check: str, image: str) -> Finding:
    tag = image_tag(image)
    version = parse_version(tag)
    implements = f"tfusion implements {API_VERSION} as the original's release {REFERENCE} defines it"
    if version is None:
        shown = f"tag {tag!r}" if tag else "no tag"
        return info(check, f"image {image} has {shown}, so its release is unknown; {implements}",
                    f"compare the installed release with {REFERENCE} yourself: fields added after it are not "
                    "known to tfusion")
    release = tag.removeprefix("v")
    if version > REFERENCE_VERSION:
        return warning(check, f"the original's release {release} is newer than {REFERENCE}, the one tfusion "
                              f"implements ({API_VERSION}): fields added after {REFERENCE} are not known to tfusion",
                       f"check the original's changes since {REFERENCE} for fields you set; tfusion's CRDs drop "
                       "fields they do not know once they replace the original's")
    if version < REFERENCE_VERSION:
        return info(check, f"the original's release {release} is older than {REFERENCE}, the one tfusion "
                           f"implements ({API_VERSION}): its objects are read as they are, fields it lacks take "
                           "their defaults", "nothing to do; this is only so you know")
    return ok(check, f"the original's release {release} is the one tfusion implements ({API_VERSION})")
