"""Every reader of a duration agrees: one table of texts goes to each consumer of each dialect.

Annotations (eviction-protection, gang-timeout, the webhook's check, the metrics recorder's
protection window) take Go's `time.ParseDuration` grammar, as the original reads them; flags and the
dynamic config file take that plus days and bare seconds. A consumer that grew its own grammar
would accept or refuse a row differently from `tfusion.api.durations` and fail here.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from tfusion.api import annotations as ann
from tfusion.api import durations
from tfusion.api.accessors import Pod
from tfusion.api.annotations import AnnotationError
from tfusion.api.jsontypes import JsonMapping
from tfusion.controller import dynamic_config
from tfusion.controller import metrics as metrics_controller
from tfusion.controller.webhook import mutate
from tfusion.settings import option, parse_duration

H, D = 3600.0, 86400.0
#: text, seconds in Go's grammar (None: refused), seconds for flags and config (None: refused)
TABLE: list[tuple[str, float | None, float | None]] = [
    ("0", 0.0, 0.0), ("0s", 0.0, 0.0), ("+0", 0.0, 0.0), ("-0", 0.0, 0.0), ("-0s", 0.0, 0.0),
    ("30s", 30.0, 30.0), ("+30s", 30.0, 30.0), ("5m", 300.0, 300.0), ("1h", H, H), ("1h30m", 1.5 * H, 1.5 * H),
    ("1.5h", 1.5 * H, 1.5 * H), (".5s", 0.5, 0.5), ("1.s", 1.0, 1.0), ("2h0m0s", 2 * H, 2 * H),
    ("500ms", 0.5, 0.5), ("250us", 250e-6, 250e-6), ("3µs", 3e-6, 3e-6), ("3μs", 3e-6, 3e-6),
    ("7ns", 7e-9, 7e-9), ("1h1m1s1ms", H + 61.001, H + 61.001), (" 5m ", 300.0, 300.0),
    ("2562047h", 2562047 * H, 2562047 * H),
    ("30d", None, 30 * D), ("1d12h", None, 1.5 * D), ("15", None, 15.0), ("2.5", None, 2.5),
    ("", None, None), ("-5s", None, None), ("-15", None, None), ("5 s", None, None), ("s", None, None),
    (".s", None, None), ("1h-30m", None, None), ("+-5s", None, None), ("1x", None, None), ("5s5", None, None),
    ("1w", None, None), ("00", None, 0.0), ("2562048h", None, None), ("1e3s", None, None), ("5S", None, None),
]
GO_DIALECT: dict[str, Callable[[str], float | None]] = {
    "durations": durations.parse_duration,
    "annotation": lambda text: ann.parse_duration(text, key=ann.EVICTION_PROTECTION),
    "gang-timeout": lambda text: ann.parse_gang_timeout(text) or 0.0,  # "0" is "wait forever" (None)
}
FLAG_DIALECT: dict[str, Callable[[str], float | None]] = {
    "durations": lambda text: durations.parse_duration(text, allow_days=True, bare_seconds=True),
    "settings": parse_duration,
    "--sync-interval": lambda text: float(option("sync_interval").parse(text)),
}
REFUSALS = (durations.DurationError, AnnotationError, ValueError)


def _outcome(parse: Callable[[str], float | None], text: str) -> float | None:
    try:
        return parse(text)
    except REFUSALS:
        return None


def _webhook_accepts(text: str) -> bool:
    try:
        mutate._check_misc({ann.EVICTION_PROTECTION: text})
    except AnnotationError:
        return False
    return True


def _protection_seconds(text: str) -> float | None:
    """The metrics recorder's protection window, less the creation time it starts from."""
    pod: JsonMapping = {"metadata": {"creationTimestamp": "1970-01-01T00:00:00Z",
                                     "annotations": {ann.EVICTION_PROTECTION: text}}}
    end = metrics_controller._protected_until(Pod(pod))
    return None if end == math.inf else end  # unreadable: protected for good


def _config_accepts(text: str) -> bool:
    try:
        dynamic_config.validate({"autoScalingInterval": text, "metricsTTL": text})
    except dynamic_config.ConfigError:
        return False
    return True


@pytest.mark.parametrize(("text", "go", "flag"), TABLE)
def test_every_annotation_reader_agrees(text: str, go: float | None, flag: float | None) -> None:
    outcomes = {name: _outcome(parse, text) for name, parse in GO_DIALECT.items()}
    assert outcomes == pytest.approx(dict.fromkeys(GO_DIALECT, go))
    if text:  # an empty annotation is no annotation, to the webhook and to the recorder
        assert _webhook_accepts(text) is (go is not None)
        assert _protection_seconds(text) == pytest.approx(go)


@pytest.mark.parametrize(("text", "go", "flag"), TABLE)
def test_every_flag_and_config_reader_agrees(text: str, go: float | None, flag: float | None) -> None:
    outcomes = {name: _outcome(parse, text) for name, parse in FLAG_DIALECT.items()}
    assert outcomes == pytest.approx(dict.fromkeys(FLAG_DIALECT, flag))
    assert _config_accepts(text) is (flag is not None)


@pytest.mark.parametrize(("text", "go", "flag"), TABLE)
def test_the_flag_dialect_only_adds_to_gos(text: str, go: float | None, flag: float | None) -> None:
    if go is not None:
        assert flag == pytest.approx(go)


def test_refusals_keep_each_consumers_error_and_name_the_annotation() -> None:
    with pytest.raises(AnnotationError, match=f'annotation {ann.GANG_TIMEOUT}: "-5s" is not allowed'):
        ann.parse_gang_timeout("-5s")
    with pytest.raises(durations.DurationError, match=r"got '-5s' \(it is negative\)"):
        parse_duration("-5s")
    with pytest.raises(durations.DurationError, match=r"got '2562048h' \(it is too long\)"):
        durations.parse_duration("2562048h")
