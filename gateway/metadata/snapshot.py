"""A listing snapshot: a prefix's whole listing held in columns, not an object per key.

A cached listing of ImageNet's training set is 1.28 M keys. Held as a Python
list of ``ListEntry`` it costs ~300 bytes a key (the dataclass, its key, ETag
and size objects, a datetime, a pointer), about 400 MB, and building a page
walks objects that are never served. Here the same listing is a handful of
flat arrays, about 40 bytes a key plus the key's own bytes after the prefix:

  * keys: one UTF-8 blob of every key *minus the listed prefix* (every key
    starts with it), and an array of offsets into it;
  * ETags: 16 packed bytes each when they have S3's usual form (a quoted
    32-digit lowercase hex MD5, or a posix origin's MD5-shaped fingerprint);
    any other ETag (multipart ``"…-N"``, upper case) is kept as a string in a
    small side table by index;
  * sizes and last-modified times (microseconds since the epoch, exact) as
    64-bit integer arrays;
  * storage class, checksum algorithms and owner, which repeat across a whole
    listing, as one index per key into the snapshot's table of distinct
    combinations;
  * *directory runs*: the index of every key whose directory (the key up to
    its last ``/``) differs from the key before it, one integer per
    directory, not per key.

The runs make ``/``-delimited pages cheap. A page of ImageNet's class
directories rolls up a thousand common prefixes, and after each it must skip
every key under it: a bisect decoding a key per probe, ~8 µs, 8 ms a page.
Every key of one directory starts with a rolled-up prefix ending in ``/`` or
none does, so the first key past the prefix is the first *run* that does not
start with it: usually the next run, one array bisect and one key decoded
(``Keys.skip_under``).

A ``Snapshot`` is a read-only ``Sequence[ListEntry]`` that builds an entry
only when one is asked for, and exposes its keys as a ``Sequence[str]``
(``keys``) so that ``paginate`` and ``bisect`` find their place in O(log n)
key decodings and build entries only for the page served.

``SnapshotBuilder`` takes origin pages as they come and reports the bytes
held so far, so a walk can stop as soon as a prefix outgrows the memory it
may take, having never held more than that.

NOT guaranteed: entries are trusted to arrive sorted by key, without
duplicates, and starting with the prefix (as ``paginate`` trusts them); a
snapshot never changes once built (a refresh builds a new one).
"""

from __future__ import annotations

import functools
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import overload

from gateway.origins.base import ListEntry
from gateway.origins.listing import prefix_end

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_Attrs = tuple[str, tuple[str, ...], tuple[str, str] | None]  # storage class, checksums, owner
# The fixed bytes per key: offset (8), ETag (16), size (8), time (8), attrs index (4).
FIXED_BYTES = 44
_SAMPLE = 64  # every 64th key kept decoded, to bisect on
_HOPS = 4  # directory runs tried before bisecting past a rolled-up prefix


def microseconds(moment: datetime) -> int:
    """``moment`` as whole microseconds since the epoch (exact, unlike a float)."""
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


@functools.lru_cache(maxsize=4096)  # a dataset's files share few distinct times
def moment(us: int) -> datetime:
    """The UTC datetime ``us`` microseconds after the epoch."""
    return _EPOCH + timedelta(microseconds=us)


def pack_etag(etag: str) -> bytes | None:
    """The 16 bytes of a quoted 32-digit lowercase hex ETag, or ``None`` for any other form."""
    if len(etag) != 34 or etag[0] != '"' or etag[-1] != '"':
        return None
    try:
        packed = bytes.fromhex(etag[1:-1])
    except ValueError:
        return None
    return packed if packed.hex() == etag[1:-1] else None  # upper case would not round-trip


def unpack_etag(packed: bytes) -> str:
    return f'"{packed.hex()}"'


class Keys(Sequence[str]):
    """A snapshot's keys, decoded one at a time (what ``bisect`` and ``paginate`` probe).

    ``bisect_left`` first bisects a sample of every ``_SAMPLE``-th key, held as
    ``str`` (made on first use, ~1.5% of the snapshot), at C speed, then at most
    ``_SAMPLE`` decoded keys: a page rolling up a thousand common prefixes does a
    thousand bisects.
    """

    __slots__ = ("_sample", "_sampled", "blob", "offsets", "prefix", "runs")

    def __init__(
        self,
        prefix: str,
        blob: bytes | bytearray,
        offsets: array[int],
        runs: array[int],
        sampled: bool = True,
    ) -> None:
        """``sampled`` False: no sample is made (the keys of a listing still growing)."""
        self.prefix, self.blob, self.offsets, self.runs = prefix, blob, offsets, runs
        self._sample: list[str] | None = None
        self._sampled = sampled

    def skip_under(self, rolled: str, lo: int) -> int:
        """The index of the first key at or after ``lo`` that does not start with
        ``rolled``, where the key at ``lo`` does.

        A ``rolled`` ending in ``/`` holds whole directory runs (see the module
        docstring): try the next few runs' first keys, then bisect.
        """
        if rolled.endswith("/"):
            runs = self.runs
            first = bisect_right(runs, lo)  # the run after the one of ``lo``
            tried = range(first, min(first + _HOPS, len(runs)))
            for r in tried:
                if not self[runs[r]].startswith(rolled):
                    return runs[r]
            if tried.stop == len(runs):  # every run left starts with it
                return len(self)
            if tried:
                lo = runs[tried.stop - 1]
        end = prefix_end(rolled)
        return len(self) if end is None else self.bisect_left(end, lo)

    def bisect_left(self, key: str, lo: int = 0) -> int:
        """The index of the first key ``>= key`` at or after ``lo``."""
        hi = len(self)
        if self._sampled:
            if self._sample is None:
                self._sample = [self[i] for i in range(0, len(self), _SAMPLE)]
            block = bisect_left(self._sample, key, lo // _SAMPLE)  # sample[block] >= key
            hi = min(len(self), block * _SAMPLE)
            lo, hi = max(lo, hi - _SAMPLE), max(lo, hi)
        if not key.startswith(self.prefix):  # before or after every key: no probe decodes
            return bisect_left(self, key, lo, hi)
        # The last steps compare raw UTF-8 (its byte order is code point order, as
        # str's), sparing a key decoding per probe: a page rolling up a thousand
        # common prefixes does these steps a thousand times.
        target = key[len(self.prefix) :].encode("utf-8", "surrogatepass")
        blob, offsets = self.blob, self.offsets
        return lo + bisect_left(
            range(lo, hi), target, key=lambda j: blob[offsets[j] : offsets[j + 1]]
        )

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            start, stop, step = i.indices(len(self))
            if step == 1:
                return self._run(start, max(start, stop))
            return [self[j] for j in range(start, stop, step)]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self.prefix + self.blob[self.offsets[i] : self.offsets[i + 1]].decode(
            "utf-8", "surrogatepass"
        )

    def _run(self, start: int, stop: int) -> list[str]:
        """Keys ``start`` to ``stop``, decoded in one go (ASCII: sliced, not decoded each)."""
        offsets, base = self.offsets, self.offsets[start]
        blob = self.blob[base : offsets[stop]]
        text = blob.decode("utf-8", "surrogatepass")
        if len(text) != len(blob):  # not ASCII: byte offsets are not character offsets
            return [self[j] for j in range(start, stop)]
        prefix = self.prefix
        return [
            prefix + text[offsets[j] - base : offsets[j + 1] - base] for j in range(start, stop)
        ]


class Snapshot(Sequence[ListEntry]):
    """A prefix's whole listing, columnar; entries are built when read."""

    __slots__ = (
        "_attr_ids",
        "_attrs",
        "_etags",
        "_odd_etags",
        "_sizes",
        "_times",
        "keys",
        "nbytes",
        "prefix",
        "version",
    )  # fmt: skip

    def __init__(self, builder: SnapshotBuilder, version: int = 0, live: bool = False) -> None:
        """``version``: a number its owner gives no other snapshot (what rendered
        pages are keyed by, ``bodies.py``); ``live``: a view of what ``builder``
        holds so far, sharing its columns (no copy), to be used at once, before
        the builder grows (see ``SnapshotBuilder.so_far``)."""
        self.prefix, self.version = builder.prefix, version
        blob, self._etags = (
            (builder.blob, builder.etags) if live else (bytes(builder.blob), bytes(builder.etags))
        )
        self.keys = Keys(builder.prefix, blob, builder.offsets, builder.runs, sampled=not live)
        self._odd_etags = builder.odd_etags
        self._sizes, self._times = builder.sizes, builder.times
        self._attr_ids, self._attrs = builder.attr_ids, list(builder.attrs)
        self.nbytes = builder.nbytes

    def __len__(self) -> int:
        return len(self._sizes)

    @overload
    def __getitem__(self, i: int) -> ListEntry: ...
    @overload
    def __getitem__(self, i: slice) -> list[ListEntry]: ...
    def __getitem__(self, i: int | slice) -> ListEntry | list[ListEntry]:
        if isinstance(i, slice):
            start, stop, step = i.indices(len(self))
            if step == 1:
                return self._run(start, max(start, stop))
            return [self[j] for j in range(start, stop, step)]
        key = self.keys[i]  # checks the index
        i %= len(self)
        etag = self._odd_etags.get(i) or unpack_etag(self._etags[16 * i : 16 * i + 16])
        storage_class, checksums, owner = self._attrs[self._attr_ids[i]]
        return ListEntry(
            key, self._sizes[i], etag, moment(self._times[i]), storage_class, checksums, owner
        )

    def _run(self, start: int, stop: int) -> list[ListEntry]:
        """Entries ``start`` to ``stop``, their keys and ETags decoded in one go (a page)."""
        keys = self.keys[start:stop]
        hexes, odd = self._etags[16 * start : 16 * stop].hex(), self._odd_etags
        attrs, attr_ids, sizes, times = self._attrs, self._attr_ids, self._sizes, self._times
        page = []
        for n, j in enumerate(range(start, stop)):
            etag = odd.get(j) or f'"{hexes[32 * n : 32 * n + 32]}"'
            storage_class, checksums, owner = attrs[attr_ids[j]]
            page.append(ListEntry(keys[n], sizes[j], etag, moment(times[j]), storage_class,
                                  checksums, owner))  # fmt: skip
        return page

    def __iter__(self) -> Iterator[ListEntry]:
        return (self[i] for i in range(len(self)))

    def find(self, key: str) -> ListEntry | None:
        """The entry of ``key``, or ``None`` if it is not listed."""
        i = self.keys.bisect_left(key)
        return self[i] if i < len(self) and self.keys[i] == key else None

    def under(self, prefix: str) -> range:
        """Where the keys listed under ``prefix`` are (a bisection, no key decoded whole)."""
        lo = self.keys.bisect_left(prefix)
        end = prefix_end(prefix)
        return range(lo, len(self) if end is None else self.keys.bisect_left(end, lo))

    def size_of(self, rows: range) -> int:
        """The bytes of the objects at ``rows``."""
        return sum(self._sizes[rows.start : rows.stop])


class SnapshotBuilder:
    """Collects a listing page by page; ``nbytes`` is what the snapshot will weigh."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.blob = bytearray()
        self.offsets = array("q", [0])
        self.etags = bytearray()
        self.odd_etags: dict[int, str] = {}
        self.sizes = array("q")
        self.times = array("q")
        self.attr_ids = array("l")
        self.attrs: dict[_Attrs, int] = {}
        self.runs = array("q")  # where a directory run begins: see the module docstring
        self._directory = b"\xff"  # the last key's directory (no UTF-8 starts with 0xff)
        self.odd_bytes = 0

    @property
    def nbytes(self) -> int:
        """Bytes held: the columns, the side tables, and the fixed part of the object."""
        fixed = FIXED_BYTES * len(self.sizes) + 8 * len(self.runs)
        return len(self.blob) + fixed + self.odd_bytes + 512

    def add(self, entries: Iterable[ListEntry]) -> None:
        """Append ``entries`` (sorted, after every entry added before, under the prefix)."""
        start = len(self.prefix)
        for entry in entries:
            rest = entry.key[start:].encode("utf-8", "surrogatepass")
            directory = rest[: rest.rfind(b"/") + 1]
            if directory != self._directory:
                self.runs.append(len(self.sizes))
                self._directory = directory
            self.blob += rest
            self.offsets.append(len(self.blob))
            packed = pack_etag(entry.etag)
            if packed is None:
                self.odd_etags[len(self.sizes)] = entry.etag
                self.odd_bytes += 100 + len(entry.etag)  # a dict slot, an int and a str
                packed = bytes(16)
            self.etags += packed
            self.sizes.append(entry.size)
            self.times.append(microseconds(entry.last_modified))
            attrs = (entry.storage_class, entry.checksum_algorithms, entry.owner)
            attr_id = self.attrs.get(attrs)
            if attr_id is None:
                attr_id = self.attrs[attrs] = len(self.attrs)
                self.odd_bytes += 200  # one more distinct combination, held once
            self.attr_ids.append(attr_id)

    def build(self, version: int = 0) -> Snapshot:
        return Snapshot(self, version)

    def so_far(self) -> Snapshot:
        """The entries added so far, as a snapshot sharing the builder's columns:
        valid until the next ``add`` (a page answered from it is built at once)."""
        return Snapshot(self, live=True)


def snapshot(prefix: str, entries: Iterable[ListEntry]) -> Snapshot:
    """A snapshot of ``entries`` (sorted, all starting with ``prefix``)."""
    builder = SnapshotBuilder(prefix)
    builder.add(entries)
    return builder.build()
