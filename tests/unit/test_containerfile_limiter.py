"""The image carries tfusion's soft limiter where the webhook's init container copies it from.

The image cannot be built in the tests (no container runtime), so this is a text check of the
Containerfile against the Makefile and limiter_source.py: a build stage runs `make -C native/limiter`
with gcc and no CUDA toolkit, and the final stage copies the Makefile's output to IMAGE_LIMITER_DIR.
"""

from __future__ import annotations

import re
from pathlib import Path

from tfusion.controller.limiter_source import IMAGE_LIMITER_DIR, OWN_LIMITER_LIBRARY

REPO = Path(__file__).resolve().parents[2]


def instructions() -> list[str]:
    """The Containerfile's instructions, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n\s*", " ", (REPO / "Containerfile").read_text())
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def stages() -> dict[str, list[str]]:
    named: dict[str, list[str]] = {}
    current = ""
    for line in instructions():
        if line.startswith("FROM "):
            words = line.split()
            current = words[3] if len(words) == 4 and words[2].upper() == "AS" else "final"
            named[current] = []
        named[current].append(line)
    return named


def makefile_output() -> str:
    """The library the Makefile's first rule builds, e.g. `libcuda_limiter.so`."""
    make = (REPO / "native" / "limiter" / "Makefile").read_text()
    first_rule = next(line for line in make.splitlines() if re.match(r"^\$\(BUILD\)/\S+:", line))
    return first_rule.split(":")[0].removeprefix("$(BUILD)/")


def test_the_makefile_builds_the_library_the_webhook_copies() -> None:
    assert makefile_output() == OWN_LIMITER_LIBRARY == "libcuda_limiter.so"


def test_a_build_stage_makes_the_limiter_without_cuda() -> None:
    all_stages = stages()
    builders = [name for name, lines in all_stages.items()
                if any(re.search(r"\bmake -C \S*native/limiter\b", line) for line in lines)]
    assert builders and builders[0] != "final", "the limiter is built in a stage of its own"
    stage = all_stages[builders[0]]
    assert any("gcc" in line and "make" in line and "apt-get install" in line for line in stage)
    assert not [line for line in stage if "cuda" in line.lower()], "no CUDA toolkit is needed"
    assert any(line.startswith("COPY native/limiter") for line in stage)


def test_the_final_stage_copies_the_makefiles_output_to_the_fixed_path() -> None:
    all_stages = stages()
    (builder,) = [name for name, lines in all_stages.items() if any("make -C" in line for line in lines)]
    build_dir = next(m.group(1) for line in all_stages[builder]
                     if (m := re.search(r"make -C \S+ BUILD=(\S+)", line)))
    copies = [line.split() for line in all_stages["final"] if line.startswith(f"COPY --from={builder} ")]
    assert [f"{build_dir}/{makefile_output()}", f"{IMAGE_LIMITER_DIR}/{OWN_LIMITER_LIBRARY}"] in \
        [words[-2:] for words in copies]
