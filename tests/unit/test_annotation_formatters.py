"""Every annotation value the scheduler writes goes through a formatter of api/annotations.py, and
each formatter's output is read back by its parser to the same value (and an out-of-range value is
refused at write time instead of being written for a reader to reject later)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tfusion.api import annotations as ann
from tfusion.api.quantity import Quantity


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


def test_gpu_count_round_trip() -> None:
    for n in (1, 8, 128):
        assert ann.parse_gpu_count(ann.format_gpu_count(n)) == n
    for n in (0, 129):
        with pytest.raises(ValueError, match="out of range"):
            ann.format_gpu_count(n)


def test_container_gpu_count_round_trip() -> None:
    counts = {"side": 1, "main": 3}
    text = ann.format_container_gpu_count(counts)
    assert text == '{"main":3,"side":1}'
    assert ann.parse_container_gpu_count(text) == counts


@pytest.mark.parametrize("value", [True, False])
def test_bool_round_trip(value: bool) -> None:
    assert ann.parse_bool(ann.format_bool(value), key=ann.IS_LOCAL_GPU) is value


@pytest.mark.parametrize("text", ["5000", "5k", "80Gi", "500m", "1.5", "0"])
def test_quantity_round_trip_is_canonical(text: str) -> None:
    quantity = Quantity.parse(text)
    formatted = ann.format_quantity(quantity)
    assert ann.parse_quantity_annotation(formatted, key=ann.TFLOPS_REQUEST) == quantity
    assert ann.format_quantity(ann.parse_quantity_annotation(formatted, key=ann.TFLOPS_REQUEST)) == formatted
