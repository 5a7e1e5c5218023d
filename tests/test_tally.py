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


async def test_hits_of_a_turn_land_as_their_counts_added_one_by_one() -> None:
    """``Tally.hit``'s one entry per label set moves the five series as five ``add`` and
    ``observe`` calls per hit would, beside counts of the same series added plainly."""
    from prometheus_client import Counter

    registry = CollectorRegistry()
    names = ("answers", "body", "served", "hits")
    plain = [Counter(f"plain_{n}", "", registry=registry) for n in names]
    batched = [Counter(f"batched_{n}", "", registry=registry) for n in names]
    latency = {kind: Histogram(f"{kind}_seconds", "", buckets=BOUNDS, registry=registry)
               for kind in ("plain", "batched")}  # fmt: skip
    tally = Tally()
    series = (*batched, latency["batched"])
    hits = [(4096, 0.0005), (131072, 0.02), (100, 3.0)]
    for body_bytes, seconds in hits:  # within one loop turn: flushed once, at its end
        tally.hit(series, body_bytes, seconds)
        for counter, amount in zip(plain, (1, body_bytes, body_bytes, 1), strict=True):
            counter.inc(amount)
        latency["plain"].observe(seconds)
    tally.add(batched[0], 2.0)  # the same series counted another way in the same turn
    plain[0].inc(2.0)
    assert batched[0]._value.get() == 0  # nothing lands before the turn ends
    tally.flush()
    for mine, theirs in zip(batched, plain, strict=True):
        assert mine._value.get() == theirs._value.get()
    expected = {(n.replace("plain", "batched"), le): v
                for (n, le), v in _samples(latency["plain"]).items()}  # fmt: skip
    assert _samples(latency["batched"]) == expected
