"""Rendezvous placement: key movement on membership change, weights, determinism.

Shares are statistical, so each check allows a tolerance of several standard
deviations of the binomial count (`_tolerance`) — a failure is a real skew, not bad
luck — while "no other key moves" is checked exactly.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.cluster.rendezvous import Node, NoNodes, Ranking

KEYS = 20_000
SIGMAS = 6  # a correct ranking fails a 6-sigma check about once in 500 million

node_names = st.lists(
    st.from_regex(r"http://10\.0\.[0-9]{1,3}\.[0-9]{1,3}:9[0-9]{3}", fullmatch=True),
    min_size=2,
    max_size=10,
    unique=True,
)
weights = st.sampled_from([0.5, 1.0, 1.0, 1.0, 2.0, 3.0])
property_settings = settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def _keys(salt: str, count: int = KEYS) -> list[str]:
    # Shaped like BlockId.digest (40 hex characters), the keys the read path ranks.
    return [f"{salt}{index:08x}".rjust(40, "0") for index in range(count)]


def _tolerance(share: float, count: int = KEYS) -> float:
    """How far an observed fraction may sit from ``share``: SIGMAS binomial deviations."""
    return SIGMAS * math.sqrt(share * (1 - share) / count)


def _owners(ranking: Ranking, keys: list[str]) -> list[str]:
    return [ranking.owner(key).name for key in keys]


@property_settings
@given(names=node_names, data=st.data(), salt=st.text("0123456789abcdef", max_size=8))
def test_removing_a_node_moves_only_its_keys_about_its_share(names, data, salt):
    nodes = [Node(name, data.draw(weights)) for name in names]
    gone = nodes[data.draw(st.integers(0, len(nodes) - 1))]
    keys = _keys(salt)
    before = _owners(Ranking(nodes), keys)
    after = _owners(Ranking([n for n in nodes if n != gone]), keys)

    moved = [i for i, (b, a) in enumerate(zip(before, after, strict=True)) if b != a]
    # Exactly the keys the removed node owned move, and no key owned by a survivor.
    assert all(before[i] == gone.name for i in moved)
    assert before.count(gone.name) == len(moved)
    share = gone.weight / sum(n.weight for n in nodes)
    assert abs(len(moved) / KEYS - share) <= _tolerance(share)


@property_settings
@given(names=node_names, salt=st.text("0123456789abcdef", max_size=8))
def test_adding_a_node_takes_about_its_share_and_only_for_itself(names, salt):
    *old, new = names
    keys = _keys(salt)
    before = _owners(Ranking(old), keys)
    after = _owners(Ranking(names), keys)

    moved = [i for i, (b, a) in enumerate(zip(before, after, strict=True)) if b != a]
    assert all(after[i] == new for i in moved)
    share = 1 / len(names)
    assert abs(len(moved) / KEYS - share) <= _tolerance(share)


@pytest.mark.parametrize("count", [3, 5, 8])
def test_a_node_of_weight_two_gets_twice_the_keys(count):
    nodes = [Node(f"http://10.0.0.{i}:9000", 2.0 if i == 0 else 1.0) for i in range(count)]
    owners = _owners(Ranking(nodes), _keys("w"))
    share = 2 / (count + 1)
    assert abs(owners.count(nodes[0].name) / KEYS - share) <= _tolerance(share)
    light = [owners.count(n.name) for n in nodes[1:]]
    assert 1.8 <= owners.count(nodes[0].name) / (sum(light) / len(light)) <= 2.2


def test_equal_weights_share_keys_evenly():
    nodes = [f"http://10.0.0.{i}:9000" for i in range(4)]
    owners = _owners(Ranking(nodes), _keys("even"))
    for node in nodes:
        assert abs(owners.count(node) / KEYS - 0.25) <= _tolerance(0.25)


@settings(max_examples=50, deadline=None)
@given(names=node_names, key=st.text(), count=st.integers(1, 12))
def test_owners_are_distinct_and_a_prefix_of_rank(names, key, count):
    ranking = Ranking([Node(name) for name in names])
    ranked = ranking.rank(key)
    owners = ranking.owners(key, count)
    assert owners == ranked[: min(count, len(names))]
    assert len({node.name for node in owners}) == len(owners)
    assert ranking.owner(key) == ranked[0]
    assert sorted(node.name for node in ranked) == sorted(names)


@settings(max_examples=50, deadline=None)
@given(names=node_names, key=st.text())
def test_ranking_does_not_depend_on_input_order_or_object(names, key):
    forward = Ranking(names).rank(key)
    assert Ranking(list(reversed(names))).rank(key) == forward
    assert Ranking(names).rank(key) == forward


_NODES = ["http://10.0.0.11:9000", "http://10.0.0.12:9000", "http://10.0.0.13:9000"]
_SCRIPT = (
    "from gateway.cluster.rendezvous import Ranking\n"
    f"r = Ranking({_NODES!r})\n"
    "print([[n.name for n in r.rank(f'key-{i}')] for i in range(200)])\n"
)


def test_ranking_is_the_same_in_other_processes_whatever_the_hash_seed():
    here = str([[n.name for n in Ranking(_NODES).rank(f"key-{i}")] for i in range(200)])
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        result = subprocess.run(
            [sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, check=True
        )
        assert result.stdout.strip() == here


def test_ranking_is_pinned():
    # Nodes of different versions must agree on owners during a rolling upgrade:
    # a change to the hash or the mixer fails here, not silently in a cluster.
    ranking = Ranking(_NODES)
    ranked = [[node.name[-7:-5] for node in ranking.rank(f"key-{i}")] for i in range(4)]
    assert ranked == [
        ["13", "12", "11"],
        ["12", "11", "13"],
        ["11", "12", "13"],
        ["13", "12", "11"],
    ]


def test_no_nodes_is_an_explicit_error():
    with pytest.raises(NoNodes):
        Ranking([]).rank("k")
    with pytest.raises(NoNodes):
        Ranking([]).owner("k")
    with pytest.raises(NoNodes):
        Ranking([]).owners("k", 1)


@pytest.mark.parametrize("weight", [0.0, -1.0, math.inf, math.nan])
def test_bad_weights_and_duplicates_are_refused(weight):
    with pytest.raises(ValueError):
        Ranking([Node("a", weight)])
    with pytest.raises(ValueError):
        Ranking(["a", "a"])
    with pytest.raises(ValueError):
        Ranking(["a"]).owners("k", 0)
