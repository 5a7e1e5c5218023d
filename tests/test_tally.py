"""A turn's observations handed to a histogram at once land as if observed one by one."""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, Histogram

from gateway.obs.tally import Tally

BOUNDS = (0.001, 0.01, 0.1, 1.0)
VALUES = [0.0005, 0.001, 0.002, 0.01, 0.05, 0.1, 0.5, 1.0, 3.0, 250.0, 0.0, math.nan]


def _samples(histogram: Histogram) -> dict[tuple[str, str], float]:
    out = {}
    for metric in histogram.collect():
        for sample in metric.samples:
            if not sample.name.endswith("_created"):
                out[(sample.name, sample.labels.get("le", ""))] = sample.value
    return out


def test_a_flushed_turn_matches_values_observed_one_by_one() -> None:
    registry = CollectorRegistry()
    one_by_one = Histogram("one", "", ["op"], buckets=BOUNDS, registry=registry)
    batched = Histogram("batched", "", ["op"], buckets=BOUNDS, registry=registry)
    for value in VALUES:
        one_by_one.labels("get").observe(value)
    tally = Tally()  # no running loop: each observation would flush at once; hold them
    tally._observed[batched.labels("get")] = list(VALUES)
    tally.flush()
    expected = {(n.replace("one", "batched"), le): v for (n, le), v in
                _samples(one_by_one).items()}  # fmt: skip
    got = _samples(batched)
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        assert got[name] == value or (math.isnan(value) and math.isnan(got[name])), name
