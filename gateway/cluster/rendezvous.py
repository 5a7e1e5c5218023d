"""Rendezvous (highest-random-weight) placement: which nodes hold a key, best first.

Each node scores each key by mixing the key's digest with its own precomputed
digest; the highest score owns the key, the next ones hold its replicas and are
where a caller falls back to. A node's score for a key depends on that node and
that key alone, so removing a node moves exactly the keys it owned (each to its
runner-up) and adding one takes only the keys it now wins: no other key changes
owner. Weights scale shares: with the score ``-weight / ln(u)``, ``u`` the mixed
digest as a fraction in (0, 1), a node wins a key with probability
weight / total weight (the scores are exponential races).

The ranking is a pure function of (node names, weights, key), built from xxh3-64
and splitmix64, never Python's salted ``hash()``: every process of every node
agrees. Callers pass only the live nodes (maintenance and unhealthy ones are
simply left out) and build a new ``Ranking`` when that set changes.

Not guaranteed: balance is statistical (a share of keys, not of bytes or load);
a ranking costs O(N) hashes per key, meant for tens of nodes, not thousands.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable
from dataclasses import dataclass

import xxhash

_MASK = (1 << 64) - 1


class NoNodes(LookupError):
    """A key was ranked over an empty set of nodes."""


@dataclass(frozen=True, slots=True)
class Node:
    name: str  # the peer URL in Hoard; its digest is the node's identity in the ranking
    weight: float = 1.0  # relative share of keys, e.g. proportional to disk size


def digest(text: str) -> int:
    """The stable 64-bit digest of a node name or key."""
    return xxhash.xxh3_64_intdigest(text.encode("utf-8", "surrogatepass"))


def _mix(value: int) -> int:
    # splitmix64's step (AIStore's xoshiro256.Hash): XOR of two digests is not itself
    # random enough to rank by, a full-avalanche mixer of it is.
    value = (value + 0x9E3779B97F4A7C15) & _MASK
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK
    return value ^ (value >> 31)


def _score(key_digest: int, node_digest: int, weight: float) -> float:
    # The top 53 bits, centred, as a fraction strictly inside (0, 1): a raw h / 2**64
    # can be 0 (log is -inf) or round to 1.0 (log is 0, a division by zero).
    fraction = ((_mix(key_digest ^ node_digest) >> 11) + 0.5) / (1 << 53)
    return -weight / math.log(fraction)


class Ranking:
    """The nodes of one membership version, ready to rank keys. Immutable."""

    def __init__(self, nodes: Iterable[Node | str]) -> None:
        self.nodes = tuple(node if isinstance(node, Node) else Node(node) for node in nodes)
        names = [node.name for node in self.nodes]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate node names in {sorted(names)}")
        for node in self.nodes:
            if not (math.isfinite(node.weight) and node.weight > 0):
                raise ValueError(f"node {node.name!r}: weight must be positive and finite")
        # (node, digest) pairs, digests computed once per membership, not once per key.
        self._digested = tuple((node, digest(node.name)) for node in self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def _scores(self, key: str) -> list[tuple[float, str, Node]]:
        if not self._digested:
            raise NoNodes(f"no nodes to place {key!r} on")
        key_digest = digest(key)
        # The name breaks (astronomically unlikely) ties the same way everywhere.
        return [(_score(key_digest, d, n.weight), n.name, n) for n, d in self._digested]

    def rank(self, key: str) -> list[Node]:
        """Every node, best first: the owner, then the replicas, then the fallbacks."""
        return [node for *_, node in sorted(self._scores(key), reverse=True)]

    def owner(self, key: str) -> Node:
        """The node that holds ``key`` (``rank(key)[0]`` without the sort)."""
        return max(self._scores(key))[2]

    def owners(self, key: str, count: int) -> list[Node]:
        """The first ``count`` nodes of ``rank(key)`` (all of them if there are fewer)."""
        if count < 1:
            raise ValueError(f"count must be at least 1, not {count}")
        return [node for *_, node in heapq.nlargest(count, self._scores(key))]
