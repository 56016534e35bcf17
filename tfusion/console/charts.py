"""A `History` as an inline SVG line chart, readable without JavaScript and by a screen reader.

Why server-side SVG: the console ships no JavaScript chart library (nothing fetched at run time,
nothing minified copied in), and a chart must be understandable without sight. So the SVG is an
image with a title and an `aria-label` that says the latest value of every series; the numbers
themselves are in a table after it that only assistive technology sees (class `visually-hidden`,
which the console's stylesheet defines). Series differ by colour and by dash pattern, so colour is
never the only cue; every colour has at least 4.5:1 contrast on the chart's white background.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from html import escape

from tfusion.console.history import OTHER, History, Series

#: (colour, dash pattern) per series, in order; "other" always gets the grey one
PALETTE: tuple[tuple[str, str], ...] = (
    ("#1f5fa8", ""), ("#b54708", "6 3"), ("#17753a", "2 3"), ("#8a3ea0", "8 3 2 3"),
    ("#b42318", "4 4"), ("#0e6d74", "10 4"), ("#7a5a00", "2 2"), ("#3b3b9c", "6 2 2 2"),
)
OTHER_STYLE = ("#555555", "1 3")
BACKGROUND = "#ffffff"
AXIS = "#555555"
GRID = "#d9d9d9"

METRIC_TITLES = {"cost": "Cost", "tflops_used": "TFLOPS used", "vram_used": "VRAM used",
                 "tflops_requested": "TFLOPS requested"}
_BINARY = (("TiB", 1024 ** 4), ("GiB", 1024 ** 3), ("MiB", 1024 ** 2), ("KiB", 1024))

# room for the axis labels
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 12, 12, 28
_LEGEND_ROW = 18


def format_value(value: float, unit: str) -> str:
    """A value for a label: bytes in binary units, anything else with three significant digits (whole
    numbers with thousands separators from 1,000 on)."""
    if unit == "bytes":
        for name, size in _BINARY:
            if abs(value) >= size:
                return f"{value / size:.3g} {name}"
        return f"{value:.0f} B"
    text = f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return f"{text} {unit}".strip()


def _time(at: float, span: float) -> str:
    fmt = "%H:%M" if span <= 86400 else "%m-%d %H:%M"
    return time.strftime(fmt, time.gmtime(at))


def _nice_max(value: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten at least `value` (the y axis's top)."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for factor in (1, 2, 5, 10):
        if factor * power >= value:
            return float(factor * power)
    return float(10 * power)


def _shorten(label: str, room: int) -> str:
    """A legend entry that fits its column (the full label is in its <title> and the table)."""
    room = max(room, 4)
    return label if len(label) <= room else label[:room - 1] + "\u2026"


def _dash(pattern: str) -> str:
    return f' stroke-dasharray="{pattern}"' if pattern else ""


def _summary(history: History, unit: str) -> str:
    title = f"{METRIC_TITLES.get(history.metric, history.metric)} by {history.group_by}"
    latest = [(s.label, s.points[-1]) for s in history.series if s.points]
    if not latest:
        return f"{title}: no data"
    at = max(point[0] for _, point in latest)
    values = ", ".join(f"{label} {format_value(value, unit)}" for label, (when, value) in latest if when == at)
    return f"{title}, latest ({_time(at, 0)} UTC): {values}"


def _empty(history: History, width: int, height: int) -> str:
    text = f"no data yet (source {history.source})"
    detail = history.note
    label = f"{text}: {detail}" if detail else text
    return (f'<figure class="chart chart-empty">'
            f'<svg xmlns="http://www.w3.org/2000/svg" role="img" aria-label="{escape(label)}" '
            f'width="{width}" height="{height}" viewBox="0 0 {width} {height}">'
            f'<title>{escape(label)}</title>'
            f'<rect x="1" y="1" width="{width - 2}" height="{height - 2}" fill="{BACKGROUND}" stroke="{AXIS}" '
            f'stroke-dasharray="6 4"/>'
            f'<text x="{width / 2:g}" y="{height / 2:g}" text-anchor="middle" fill="#222222" font-size="14">'
            f'{escape(text)}</text>'
            + (f'<text x="{width / 2:g}" y="{height / 2 + 20:g}" text-anchor="middle" fill="{AXIS}" '
               f'font-size="12">{escape(detail)}</text>' if detail else "")
            + "</svg></figure>")


def _table(history: History, unit: str, caption: str) -> str:
    starts = sorted({at for s in history.series for at, _ in s.points})
    span = history.until - history.since
    head = "".join(f'<th scope="col">{escape(s.label)}</th>' for s in history.series)
    rows = []
    for at in starts:
        cells = []
        for s in history.series:
            value = dict(s.points).get(at)
            cells.append(f"<td>{'' if value is None else escape(format_value(value, unit))}</td>")
        rows.append(f'<tr><th scope="row">{escape(_time(at, span))} UTC</th>{"".join(cells)}</tr>')
    return (f'<table class="visually-hidden"><caption>{escape(caption)}</caption>'
            f'<thead><tr><th scope="col">bucket start</th>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>')


def render_chart(history: History, *, unit: str, width: int = 720, height: int = 220) -> str:
    """The chart as HTML: a <figure> holding the SVG (one polyline per series, a legend) and a
    visually hidden table of the same numbers. Every label is escaped."""
    if history.empty:
        return _empty(history, width, height)
    series: Sequence[Series] = history.series
    starts = sorted({at for s in series for at, _ in s.points})
    x0, x1 = history.since, max(history.until, starts[-1] + history.step)
    x0 = min(x0, starts[0])
    top = _nice_max(max(value for s in series for _, value in s.points))
    legend_rows = math.ceil(len(series) / 4)
    plot_w = width - _LEFT - _RIGHT
    plot_h = height - _TOP - _BOTTOM - legend_rows * _LEGEND_ROW
    if plot_w < 40 or plot_h < 40:
        raise ValueError(f"width={width}, height={height}: too small for a chart of {len(series)} series")

    def x(at: float) -> float:
        return _LEFT + (at - x0) / (x1 - x0) * plot_w

    def y(value: float) -> float:
        return _TOP + plot_h - max(0.0, value) / top * plot_h

    summary = _summary(history, unit)
    parts = [f'<rect x="0" y="0" width="{width}" height="{height}" fill="{BACKGROUND}"/>']
    for i in range(5):  # horizontal grid lines with their values
        value = top * i / 4
        parts.append(f'<line x1="{_LEFT}" x2="{_LEFT + plot_w}" y1="{y(value):.1f}" y2="{y(value):.1f}" '
                     f'stroke="{GRID if i else AXIS}"/>')
        parts.append(f'<text x="{_LEFT - 6}" y="{y(value) + 4:.1f}" text-anchor="end" font-size="11" '
                     f'fill="{AXIS}">{escape(format_value(value, unit))}</text>')
    span = x1 - x0
    for i in range(4):  # time ticks
        at = x0 + span * i / 3
        anchor = "start" if i == 0 else "end" if i == 3 else "middle"
        parts.append(f'<text x="{x(at):.1f}" y="{_TOP + plot_h + 16}" text-anchor="{anchor}" font-size="11" '
                     f'fill="{AXIS}">{escape(_time(at, span))}{" UTC" if i == 3 else ""}</text>')
    legend_y = _TOP + plot_h + _BOTTOM
    for index, s in enumerate(series):
        other = index == len(series) - 1 and s.label in (OTHER, f"{OTHER} (rest)")
        colour, dash = OTHER_STYLE if other else PALETTE[index % len(PALETTE)]
        coords = " ".join(f"{x(at):.1f},{y(value):.1f}" for at, value in s.points)
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2"{_dash(dash)} points="{coords}">'
                     f'<title>{escape(s.label)}</title></polyline>')
        if len(s.points) == 1:  # a lone point is no line: mark it
            at, value = s.points[0]
            parts.append(f'<circle cx="{x(at):.1f}" cy="{y(value):.1f}" r="3" fill="{colour}"/>')
        lx = _LEFT + (index % 4) * (plot_w / 4)
        ly = legend_y + (index // 4) * _LEGEND_ROW
        parts.append(f'<line x1="{lx:.1f}" x2="{lx + 22:.1f}" y1="{ly - 4}" y2="{ly - 4}" stroke="{colour}" '
                     f'stroke-width="2"{_dash(dash)}/>')
        shown = _shorten(s.label, int((plot_w / 4 - 32) / 6.5))
        parts.append(f'<text x="{lx + 27:.1f}" y="{ly}" font-size="11" fill="#222222">'
                     f'{escape(shown)}<title>{escape(s.label)}</title></text>')
    title = f"{METRIC_TITLES.get(history.metric, history.metric)} by {history.group_by} ({history.source})"
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" role="img" aria-label="{escape(summary)}" '
           f'width="{width}" height="{height}" viewBox="0 0 {width} {height}">'
           f'<title>{escape(title)}</title>{"".join(parts)}</svg>')
    note = f'<figcaption class="chart-note">{escape(history.note)}</figcaption>' if history.note else ""
    return f'<figure class="chart">{svg}{note}{_table(history, unit, title)}</figure>'
