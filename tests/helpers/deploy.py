"""kubectl for the deploy/ tests and a lookup of rendered objects by kind and name."""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.helpers.kubectl import KUBECTL

REPO = Path(__file__).resolve().parents[2]


DEPLOY = REPO / "deploy"


Doc = dict[str, Any]


@functools.cache
def rendered(overlay: str) -> tuple[Doc, ...]:
    out = subprocess.run([KUBECTL, "kustomize", str(DEPLOY / "overlays" / overlay)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return tuple(d for d in yaml.safe_load_all(out.stdout) if d)


def by_key(overlay: str) -> dict[tuple[str, str], Doc]:
    return {(d["kind"], d["metadata"]["name"]): d for d in rendered(overlay)}


def render_own(root: Path, *, overlay: str, components: tuple[str, ...] = (),
               patches: tuple[Doc, ...] = ()) -> dict[tuple[str, str], Doc]:
    """Render, as a user would, a kustomization of their own in `root` on top of one of deploy/'s
    overlays with deploy/'s components (by relative path: kustomize takes no other) and their patches."""
    root.mkdir()
    kustomization: Doc = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(DEPLOY / "overlays" / overlay, root)],
        "components": [os.path.relpath(DEPLOY / "overlays" / c, root) for c in components]}
    if patches:
        kustomization["patches"] = list(patches)
    (root / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    out = subprocess.run([KUBECTL, "kustomize", str(root)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(out.stdout) if d}
