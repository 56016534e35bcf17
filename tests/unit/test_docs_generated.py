"""The docs site's reference pages (docs/reference/) are what tools/gen_docs.py makes from the code
now: a flag, route, CRD field or annotation added without regenerating them fails here."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
GENERATOR = ROOT / "tools" / "gen_docs.py"


def generator() -> ModuleType:
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        return importlib.import_module("gen_docs")
    finally:
        sys.path.remove(str(ROOT / "tools"))


def test_generated_reference_pages_are_current() -> None:
    # a process of its own: the generator builds the roles' apps (their routes, metrics and loggers),
    # which this worker's other tests must not share
    done = subprocess.run([sys.executable, str(GENERATOR), "--check"], cwd=ROOT, capture_output=True, text=True,
                          timeout=110, check=False)
    assert done.returncode == 0, f"stale reference pages; run python tools/gen_docs.py\n{done.stderr}"


def test_the_check_names_a_changed_or_missing_page(tmp_path: Path) -> None:
    gen_docs = generator()
    (tmp_path / "settings.md").write_text("# Reference: settings\n")
    (tmp_path / "crds.md").write_text("# Reference: custom resources\n(an older field list)\n")
    pages = {"settings.md": "# Reference: settings\n", "crds.md": "# Reference: custom resources\n",
             "http.md": "# Reference: HTTP routes\n"}
    assert gen_docs.stale(pages, tmp_path) == [tmp_path / "crds.md", tmp_path / "http.md"]
