"""kubectl for the deploy/ tests and a lookup of rendered objects by kind and name."""

from __future__ import annotations

import functools
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
