"""How many keys' hit state a worker keeps: the bounds of the hit path's hot sets.

A warm hit is cheap when what it needs was worked out on an earlier read of
the same key and kept: the presigned URL's verdict and route (``s3/front.py``,
``s3/auth.py``), the key's lookups (``read/tickets.py``), block 0's name
(``read/reader.py``), the rendered header block (``s3/hits.py``), and a
request's bytes (or signed form) with its answer's decisions (``s3/express.py``).
Each is a hot set, oldest out first. A key not kept is answered all the same, by
working it out again: at 20,000 4 KiB objects cycled, more than the default
sets hold, a hit cost ~350 µs of CPU where one kept costs ~50 (in process:
``loadtest hitprofile``; ``small 4k wide`` in the capacity workload).

``urls`` bounds the sets that hold a request's URL (a presigned one is ~450
bytes, so about 1 KB an entry each); ``keys`` the ones that hold a key's
metadata and headers. ``cache.hit_keys`` unset keeps the defaults, sized so
a load of fresh URLs grows a worker by a few MB (issue 34's soak); set, it
sizes every set to that many keys, for a dataset read every epoch to stay
hot where memory allows (about 3-4 KB a key, per worker, for presigned reads).

A full set takes a new key in only on its second sight (``Doorkeeper``). A
loader reads its dataset in epochs; over one wider than a set, a set that took
every new key in dropped each before its next epoch came back to it: every
read paid for keeping what it made (a lane, a ticket, a verdict: ~10 % of a
hit that keeps nothing, and as much again to drop the oldest), and no read
was ever answered from the set. With the doorkeeper a full set keeps what it
holds while the epoch's other keys pass through, and each epoch's reads of
those it holds are kept hits; a key asked for again soon (a working set that
fits, come back to) is taken in on its next pass or the one after, the oldest
out.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HotSets:
    keys: int = 16_384  # tickets, header blocks
    urls: int = 4_096  # presigned verdicts, routes, block 0's names, express lanes

    @classmethod
    def sized(cls, hit_keys: int | None) -> HotSets:
        """The sets for ``cache.hit_keys``: None, the defaults; else every set that many."""
        return cls() if hit_keys is None else cls(hit_keys, hit_keys)


DEFAULT = HotSets()  # frozen: one shared value for every default argument


class Doorkeeper:
    """Whether a full hot set takes in a key it does not hold: on the key's second sight
    (TinyLFU's doorkeeper: Einziger, Friedman and Manes, "TinyLFU: A Highly Efficient
    Cache Admission Policy", 2017).

    The first sight of a key is remembered by its hash (a collision admits a key early,
    which costs only the keeping), among at most ``remembered`` of them; past that all
    are forgotten at once, as TinyLFU resets its doorkeeper, so a key's second sight
    counts while fewer than ``remembered`` other first sights came between.
    ``remembered`` is the set's own bound: a working set that fits in the set, come
    back to, is taken in on its next pass (or, past a reset, the one after); of one
    more than twice as wide as the set, none is, and the set keeps what it holds.
    """

    __slots__ = ("_remembered", "_seen")

    def __init__(self, remembered: int) -> None:
        self._remembered = remembered
        self._seen: set[int] = set()

    def refuses(self, key: Hashable, held: Collection[Hashable], bound: int) -> bool:
        """Whether a set holding ``held`` (at most ``bound``) leaves ``key`` out: a new
        key while the set is full, at its first sight (``admits``)."""
        return key not in held and len(held) >= bound and not self.admits(key)

    def admits(self, key: Hashable) -> bool:
        """Whether to take ``key`` in now (its second sight); else its first is noted."""
        seen = self._seen
        mark = hash(key)
        if mark in seen:
            seen.discard(mark)
            return True
        if len(seen) >= self._remembered:
            seen.clear()
        seen.add(mark)
        return False
