"""docs/install.md's "overlay of your own", as a user would copy it: a directory beside the clone
that names a shipped overlay, rendered by kubectl's kustomize without touching `deploy/base`.
What it must give: every tfusion container on the user's image, the soft limiter's image flag
pointing at it too, and the shipped scheduler mode kept."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.helpers.kubectl import KUBECTL, TIMEOUT, needs_kubectl

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "install.md"
IMAGE = "registry.example.com/platform/tfusion:0.1.0"


def overlay_block() -> str:
    blocks: list[str] = re.findall(r"```yaml\n(.*?)```", PAGE.read_text(), re.DOTALL)
    found = [block for block in blocks if "kind: Kustomization" in block]
    assert len(found) == 1, f"{PAGE.relative_to(REPO)} should show one Kustomization, found {len(found)}"
    return found[0]


def containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc.get("spec", {}).get("template", {}).get("spec", {})
    return [*spec.get("initContainers", []), *spec.get("containers", [])]


@needs_kubectl
def test_the_documented_overlay_renders_on_the_users_image(tmp_path: Path) -> None:
    (tmp_path / "tfusion").symlink_to(REPO)  # the clone, beside the user's directory
    mine = tmp_path / "my-tfusion"
    mine.mkdir()
    (mine / "kustomization.yaml").write_text(overlay_block())
    done = subprocess.run([KUBECTL, "kustomize", str(mine)], capture_output=True, text=True, timeout=TIMEOUT,
                          check=False)
    assert done.returncode == 0, done.stderr
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    images = {c["image"] for d in docs for c in containers(d) if "tfusion" in c["image"]}
    assert images == {IMAGE}
    controller = next(d for d in docs
                      if d["kind"] == "Deployment" and d["metadata"]["name"] == "tensor-fusion-controller")
    args = controller["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--limiter-image={IMAGE}" in args and "--scheduler=builtin" in args
