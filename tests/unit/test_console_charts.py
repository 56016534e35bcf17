"""The history chart: well-formed markup, every label escaped, what a screen reader gets (role,
title, a label with the latest values, the data table), the empty box, and colours with enough
contrast on the chart's background."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

from tfusion.console.charts import BACKGROUND, OTHER_STYLE, PALETTE, format_value, render_chart
from tfusion.console.history import History, Series

SVG = "{http://www.w3.org/2000/svg}"
T0 = 1_764_000_000.0
EVIL = '<script>alert("x")</script> & co'


def history(*series: Series, note: str = "", metric: str = "cost") -> History:
    return History(metric=metric, group_by="namespace", since=T0, until=T0 + 180, step=60,  # type: ignore[arg-type]
                   series=series, source="files: /var/<log>", note=note)


def two() -> History:
    return history(Series("team-a", ((T0, 1.0), (T0 + 60, 2.5), (T0 + 120, 3.0))),
                   Series(EVIL, ((T0, 0.5), (T0 + 60, 0.25), (T0 + 120, 0.125))), note="1 unreadable line(s) skipped")


def parse(html: str) -> ET.Element:
    return ET.fromstring(html)  # well-formed XML, or this raises


def test_the_chart_is_an_image_with_a_title_a_summary_and_one_line_per_series() -> None:
    figure = parse(render_chart(two(), unit="USD"))
    svg = figure.find(f"{SVG}svg")
    assert svg is not None and svg.get("role") == "img"
    title = svg.find(f"{SVG}title")
    assert title is not None and title.text == "Cost by namespace (files: /var/<log>)"
    assert svg.get("aria-label") == f"Cost by namespace, latest (16:02 UTC): team-a 3 USD, {EVIL} 0.125 USD"
    lines = svg.findall(f"{SVG}polyline")
    assert len(lines) == 2
    assert [line.find(f"{SVG}title").text for line in lines] == ["team-a", EVIL]  # type: ignore[union-attr]
    # time runs left to right and the larger value is higher up
    coords = [tuple(map(float, p.split(","))) for p in lines[0].get("points", "").split()]
    assert [x for x, _ in coords] == sorted(x for x, _ in coords) and coords[2][1] < coords[0][1]
    assert lines[0].get("stroke") != lines[1].get("stroke") and lines[1].get("stroke-dasharray")
    caption = figure.find("figcaption")
    assert caption is not None and caption.text == "1 unreadable line(s) skipped"


def test_every_label_is_escaped() -> None:
    html = render_chart(two(), unit="<u>")
    assert "<script>" not in html and "<u>" not in html and "/var/<log>" not in html
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; co" in html


def test_the_numbers_are_in_a_visually_hidden_table() -> None:
    table = parse(render_chart(two(), unit="USD")).find("table")
    assert table is not None and table.get("class") == "visually-hidden"
    headers = [th.text for th in table.iter("th") if th.get("scope") == "col"]
    assert headers == ["bucket start", "team-a", EVIL]
    rows = [[cell.text for cell in row] for row in table.find("tbody")]  # type: ignore[union-attr]
    assert rows == [["16:00 UTC", "1 USD", "0.5 USD"], ["16:01 UTC", "2.5 USD", "0.25 USD"],
                    ["16:02 UTC", "3 USD", "0.125 USD"]]


def test_no_data_is_a_clear_box_naming_the_source() -> None:
    html = render_chart(history(note="no metrics recorded in this window yet"), unit="USD")
    figure = parse(html)
    svg = figure.find(f"{SVG}svg")
    assert svg is not None and svg.get("role") == "img"
    assert svg.get("aria-label") == "no data yet (source files: /var/<log>): no metrics recorded in this window yet"
    assert [t.text for t in svg.iter(f"{SVG}text")] == ["no data yet (source files: /var/<log>)",
                                                        "no metrics recorded in this window yet"]
    assert figure.find(f"{SVG}polyline") is None
    # series without any point are no data either
    assert "no data yet" in render_chart(history(Series("a", ())), unit="USD")


def test_a_lone_point_is_marked_and_bytes_read_as_binary_units() -> None:
    html = render_chart(history(Series("a", ((T0, 3 * 1024 ** 3),)), metric="vram_used"), unit="bytes")
    svg = parse(html).find(f"{SVG}svg")
    assert svg is not None and len(svg.findall(f"{SVG}circle")) == 1
    assert svg.get("aria-label", "").endswith("a 3 GiB")
    assert format_value(1536, "bytes") == "1.5 KiB" and format_value(12, "bytes") == "12 B"
    assert format_value(1234.4, "TFLOPS") == "1,234 TFLOPS" and format_value(0.01234, "USD") == "0.0123 USD"


def test_the_rest_is_grey_and_too_small_a_chart_is_refused() -> None:
    many = [Series(f"n{i}", ((T0, float(10 - i)),)) for i in range(8)] + [Series("other", ((T0, 0.1),))]
    svg = parse(render_chart(history(*many), unit="")).find(f"{SVG}svg")
    assert svg is not None
    strokes = [line.get("stroke") for line in svg.findall(f"{SVG}polyline")]
    assert strokes[-1] == OTHER_STYLE[0] and len(set(strokes[:-1])) == 8
    with pytest.raises(ValueError, match=r"width=100, height=60: too small"):
        render_chart(two(), unit="", width=100, height=60)


def _luminance(colour: str) -> float:
    channels = [int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


@pytest.mark.parametrize("colour", [c for c, _ in PALETTE] + [OTHER_STYLE[0]])
def test_colours_have_text_contrast_on_the_background(colour: str) -> None:
    assert re.fullmatch(r"#[0-9a-f]{6}", colour)
    light, dark = _luminance(BACKGROUND), _luminance(colour)
    assert (light + 0.05) / (dark + 0.05) >= 4.5
