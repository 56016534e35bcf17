"""Every annotation value the scheduler writes goes through a formatter of api/annotations.py, and
each formatter's output is read back by its parser to the same value (and an out-of-range value is
refused at write time instead of being written for a reader to reject later)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tfusion.api import annotations as ann


@pytest.mark.parametrize("names", [("gpu-1",), ("gpu-1a2b", "gpu-3c4d", "gpu-0")])
def test_gpu_ids_round_trip(names: tuple[str, ...]) -> None:
    assert ann.parse_gpu_ids(ann.format_gpu_ids(names)) == names


def test_container_gpus_round_trip() -> None:
    mapping = {"side": ("gpu-2",), "main": ("gpu-1", "gpu-3"), "idle": ()}
    assert ann.parse_container_gpus(ann.format_container_gpus(mapping)) == mapping


@pytest.mark.parametrize(("fmt", "parse", "good", "bad"), [
    (ann.format_pod_index, ann.parse_pod_index, (1, 9, 128), (0, 129, -1)),
    (ann.format_effective_hard_sm_percent, ann.parse_effective_hard_sm_percent, (1, 37, 100), (0, 101)),
    (ann.format_port_number, ann.parse_port_number, (1, 42000, 65535), (0, 65536)),
])
def test_int_formatters_round_trip(fmt: Callable[[int], str], parse: Callable[[str], int], good: tuple[int, ...],
                                   bad: tuple[int, ...]) -> None:
    for n in good:
        assert parse(fmt(n)) == n
    for n in bad:
        with pytest.raises(ValueError, match="out of range"):
            fmt(n)
    with pytest.raises(ValueError):
        fmt(True)
