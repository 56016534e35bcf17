"""The README stays what a newcomer reads on one screen, and keeps the two set-up commands that users
paste and CI runs (.ci/run) exactly as they are; everything else lives in the docs site (docs/)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
RUN = "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/tfusion --role=all"
TEST = "python3 -m venv .venv && .venv/bin/pip install -q -e '.[dev]' && .venv/bin/pytest -q -p no:cacheprovider"


def test_the_readme_fits_one_screen_and_keeps_the_set_up_commands() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 150
    blocks = re.findall(r"```sh\n(.*?)\n```", text, re.DOTALL)
    assert RUN in blocks and TEST in blocks
    assert TEST in (REPO / ".ci" / "run").read_text(), ".ci/run runs the README's test command"


def test_every_page_the_readme_links_exists() -> None:
    links = re.findall(r"\]\((docs/[^)#]+)", README.read_text())
    assert links, "the README links the docs site"
    missing = sorted({link for link in links if not (REPO / link).is_file()})
    assert missing == []
