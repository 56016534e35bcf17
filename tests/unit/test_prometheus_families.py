"""`families`: the rows of a tick as Prometheus families, one sample per row and field, labels
read from the row's tags, percentages scaled, strings and absent fields left out, and of two rows
with the same labels only the first."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from tfusion.metrics.points import Point
from tfusion.metrics.prometheus import MetricSpec, families

SPECS = [
    MetricSpec("t", "used", "x_used_ratio", "used share", (("node", "node"), ("pool", "pool")), scale=0.01),
    MetricSpec("t", "free", "x_free", "free", (("node", "node"), ("pool", "pool"))),
    MetricSpec("t", "served", "x_served", "served so far", (("pool", "pool"),), counter=True),
    MetricSpec("other", "used", "y_used", "another table", (("node", "node"),)),
]


def _samples(found: list[Metric]) -> dict[str, list[tuple[dict[str, str], float]]]:
    return {family.name: [(dict(s.labels), s.value) for s in family.samples] for family in found}


def test_each_field_of_each_row_is_a_sample_labelled_from_its_tags() -> None:
    rows = [Point("t", {"node": "n1", "pool": "p"}, {"used": 50, "free": 3.5, "served": 7}),
            Point("t", {"node": "n2"}, {"used": 10, "free": "unknown"}),
            Point("other", {"node": "n1"}, {"used": 1})]
    got = _samples(families(rows, SPECS))
    assert got["x_used_ratio"] == [({"node": "n1", "pool": "p"}, 0.5), ({"node": "n2", "pool": ""}, 0.1)]
    assert got["x_free"] == [({"node": "n1", "pool": "p"}, 3.5)]  # a string is no sample
    assert got["x_served"] == [({"pool": "p"}, 7.0)]  # n2 has no `served`
    assert got["y_used"] == [({"node": "n1"}, 1.0)]


def test_of_two_rows_with_the_same_labels_the_first_is_kept_whole() -> None:
    rows = [Point("t", {"node": "n1", "pool": "p"}, {"used": 50}),
            Point("t", {"node": "n1", "pool": "p"}, {"used": 70, "free": 2})]
    got = _samples(families(rows, SPECS))
    assert got["x_used_ratio"] == [({"node": "n1", "pool": "p"}, 0.5)]
    assert got["x_free"] == []  # not mixed in from the second row
    assert got["x_served"] == []


def test_a_counter_is_exposed_with_its_total_sample() -> None:
    found = families([Point("t", {"node": "n1", "pool": "p"}, {"served": 7})], SPECS)

    class Fixed(Collector):
        def collect(self) -> list[Metric]:
            return found

    registry = CollectorRegistry()
    registry.register(Fixed())
    text = generate_latest(registry).decode()
    assert 'x_served_total{pool="p"} 7.0' in text
    assert "# TYPE x_served_total counter" in text
