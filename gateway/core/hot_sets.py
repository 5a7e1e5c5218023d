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
"""

from __future__ import annotations

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
