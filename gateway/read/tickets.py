"""A hit's lookups, done once per key and then only re-checked: a ticket per key.

Every warm hit of a key asks the same questions with the same answers: which
mount the bucket is, the key's name at the origin, its metadata (found in
the worker's table, unpacked, checked fresh, counted), block 0's name, the
object's headers as the client sees them. Asked anew, that is a dozen calls
and a fifth of a hit's CPU. A ticket keeps the answers, and beside them the
one thing that says whether they still hold: the stored record of the key's
metadata, the very object (``HeadTable.record``). Every change to what is
held of the key stores another object (a refresh, a write by this worker or,
caught up first, by a sibling, an eviction), and a ticket whose record is no
longer the one stored is thrown away, as is one whose answer is no longer
fresh. So a ticket is valid exactly when the lookups would find the same
answer fresh, and using it does what they do: the record marked recently
used (``MetadataCache.still_held``), the lookup counted as a metadata hit
once the block is found too (``used``).

What a ticket keeps of the block is at most a loan of it (``MemoryTier.lend``):
while the memory tier holds the block, the loan's bytes are the block's, and
from the moment the tier lets it go the loan holds nothing, so an evicted
block is freed as before. A block in a packed record on disk is kept as a
lease of it instead (``segment_leases.py``): lent again while its segment, its
place and the file's fingerprint are the ones it was lent under. Without
either (a block file of its own, a staged block, an evicted one, a lease run
out) ``BlockSource.cached_held`` looks it up, with its own checks. Tickets are a
hot set (``LIMIT``, oldest first out); a key without one takes the lookups,
and gets one.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from gateway.cache.memory import Loan
from gateway.cache.segment_leases import Lease
from gateway.core.hot_sets import DEFAULT, Doorkeeper
from gateway.metadata.heads import Entry, Mark
from gateway.metadata.memory import MetadataCache
from gateway.metadata.source import policy_of, scope_of
from gateway.origins.base import ObjectInfo
from gateway.origins.namespace import Mount
from gateway.pieces import BlockRef

# What ``Reader._held_entry`` finds: mount, origin key, held metadata, and its entry.
Known = tuple[Mount, str, ObjectInfo, Entry]


@dataclass(slots=True)
class Ticket:
    mark: Mark  # the metadata's stored record when the ticket was made
    fresh_until: float  # the metadata's freshness, on the metadata table's clock
    label: str  # the mount's label, as lookups are counted
    ref: BlockRef  # block 0
    info: ObjectInfo  # the object's metadata, named as the client named it
    loan: Loan | None  # block 0, the whole object, lent by the memory tier
    lease: Lease | None = None  # or its packed record on disk, lent again


class Tickets:
    """The tickets of the keys hit last (see the module)."""

    LIMIT = DEFAULT.keys  # ``core/hot_sets.py``; ~1 KB each with the key's headers

    def __init__(self, metadata: MetadataCache, limit: int = LIMIT) -> None:
        self._metadata = metadata
        self._limit = limit
        # Ordered: a plain dict's oldest key is found past every key deleted before it
        # (~20 us at 16,384 churned, every hit of a dataset wider than the set).
        self._kept: OrderedDict[tuple[str, str], Ticket] = OrderedDict()
        self._door = Doorkeeper(limit)  # what a full set takes in

    def __len__(self) -> int:
        return len(self._kept)

    def valid(self, bucket: str, key: str) -> Ticket | None:
        """``key``'s ticket if its answers still hold (the metadata marked recently used),
        else None; ``used`` counts it once the block is found too."""
        ticket = self._kept.get((bucket, key))
        if ticket is None:
            return None
        if not self._metadata.still_held(ticket.mark, ticket.fresh_until):
            del self._kept[(bucket, key)]
            return None
        return ticket

    def peek(self, bucket: str, key: str) -> Ticket | None:
        """``key``'s ticket as kept, valid or not (``Reader.held_again`` checks it)."""
        return self._kept.get((bucket, key))

    def used(self, ticket: Ticket, times: int = 1) -> None:
        """``ticket`` answered ``times`` reads: its metadata counted as a hit each, as the
        lookups count one (not before the block is found: a read that must wait is
        counted by the lookups it then makes)."""
        self._metadata.count_head_hit(ticket.label, times)

    def keep(
        self, bucket: str, key: str, known: Known, ref: BlockRef, info: ObjectInfo,
        loan: Loan | None = None, lease: Lease | None = None,
    ) -> None:  # fmt: skip
        """A ticket for what the lookups just found of ``key`` (nothing awaited since)."""
        kept = self._kept
        name = (bucket, key)
        if self._door.refuses(name, kept, self._limit):
            return
        mount, okey, _, entry = known
        scope = scope_of(mount)
        mark = self._metadata.record(scope, okey)
        if mark is None:
            return
        kept.pop(name, None)
        kept[name] = Ticket(mark, entry.fresh_until, policy_of(mount).label, ref, info, loan,
                            lease)  # fmt: skip
        if len(kept) > self._limit:
            kept.popitem(last=False)
