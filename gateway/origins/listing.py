"""S3 listing semantics as one pure function over a complete, sorted listing.

S3 answers ``ListObjects(V2)`` by walking its keys in UTF-8 byte order (which is
Python's ``str`` order: code points compare like their UTF-8 encodings), keeping
the keys that start with ``prefix`` and sort after ``start_after``, and rolling
every key whose remainder after the prefix contains the delimiter into one
*common prefix* (the key up to and including the first delimiter after the
prefix). Each key and each common prefix counts one toward ``max_keys``.

:func:`paginate` does exactly that over an in-memory listing, so an origin that
can enumerate its keys (the posix origin) or a cache that holds a prefix's whole
listing (the metadata cache) answers any page without the real store. It costs
O(page * log n), not O(n): it starts with a bisect and, after each common
prefix, bisects past every key under it, so a million keys rolling into one
prefix cost one step. It probes keys only and builds the entries of the page
served, so a columnar snapshot (``metadata/snapshot.py``, which offers its
``keys``) never materialises the rest.

Edge cases, checked against AWS's documentation where it speaks and against
moto 5 (``list_objects_v2``) where it is silent (``tests/test_listing.py``
compares page by page):

- ``max_keys=0`` gives an empty page that is *not* truncated (moto; AWS too,
  as S3-compatible servers that test against it report).
- Every returned item, key or common prefix, sorts after ``start_after``: the
  ListObjectsV2 reference says "CommonPrefixes is filtered out from results if
  it is not lexicographically greater than the StartAfter value", and moto does
  the same. A common prefix equal to the marker is therefore skipped with all
  its keys, which is how paging continues after a page that ended on one; so
  is a prefix *before* a marker pointing inside it (``start_after="a/b"``,
  delimiter ``/``: ``a/`` is not returned even though ``a/c`` exists).
- A delimiter may be several characters; only its first occurrence after the
  prefix counts. An empty delimiter means no roll-up; an empty prefix matches all.
- ``max_keys`` is not capped at 1000 here: the S3 front caps client requests,
  and the metadata cache may want larger pages.

Not guaranteed: ``entries`` is trusted to be sorted by key without duplicates;
an unsorted listing gives wrong pages, not an error.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from typing import Any

from gateway.origins.base import ListEntry, ListPage

_MAX_CHAR = chr(0x10FFFF)
_CHUNK = 1  # keys decoded at once after a roll-up; doubles while keys are listed


def common_prefix(key: str, prefix: str, delimiter: str) -> str | None:
    """The common prefix ``key`` rolls up into, or ``None`` if it is listed as itself.

    ``key`` must start with ``prefix``; the delimiter is searched only after it.
    """
    if not delimiter:
        return None
    i = key.find(delimiter, len(prefix))
    return None if i < 0 else key[: i + len(delimiter)]


def prefix_end(prefix: str) -> str | None:
    """The smallest string greater than every string starting with ``prefix``.

    ``None`` when there is none (empty prefix, or only U+10FFFF characters).
    """
    stripped = prefix.rstrip(_MAX_CHAR)
    if not stripped:
        return None
    return stripped[:-1] + chr(ord(stripped[-1]) + 1)


def paginate(
    entries: Sequence[ListEntry],
    prefix: str = "",
    delimiter: str = "",
    start_after: str = "",
    max_keys: int = 1000,
) -> ListPage:
    """One page of ``entries`` as S3 would list it.

    :param entries: the complete listing, sorted by key.
    :param prefix: only keys starting with it.
    :param delimiter: roll keys up into common prefixes at its first occurrence
        after ``prefix``; empty for a flat listing.
    :param start_after: only items (keys and common prefixes) sorting after it;
        pass the previous page's ``next_marker`` to continue.
    :param max_keys: at most this many keys plus common prefixes; ``<= 0``
        gives an empty, untruncated page.
    :returns: the page; ``next_marker`` is its last item (``None`` if empty),
        ``is_truncated`` says whether another item follows.
    """
    if max_keys <= 0:
        return ListPage(entries=[], common_prefixes=[], is_truncated=False, next_marker=None)
    keys = _keys_of(entries)
    i = _bisect(keys, prefix)
    if start_after:
        i = max(i, _bisect(keys, start_after + "\0"))  # the first key after it
    if not delimiter:  # no roll-up: the page is one run of keys
        return _run(entries, keys, prefix, i, max_keys)
    listed: list[int] = []  # indices of the keys listed as themselves
    prefixes: list[str] = []
    last: str | None = None
    chunk = _CHUNK
    while i < len(keys):
        # Keys are decoded a chunk at a time, more while none rolls up.
        rolled = None
        for key in keys[i : i + chunk]:
            if not key.startswith(prefix):
                return _page(entries, listed, prefixes, False, last)  # none follow
            rolled = common_prefix(key, prefix, delimiter)
            if rolled is not None:
                break
            if len(listed) + len(prefixes) == max_keys:
                return _page(entries, listed, prefixes, True, last)
            listed.append(i)
            last, i = key, i + 1
        if rolled is None:
            chunk = min(2 * chunk, 1024)
            continue
        chunk = _CHUNK
        i = _skip_under(keys, rolled, i)
        if rolled <= start_after:
            continue  # the marker is this prefix or lies inside it: already listed
        if len(listed) + len(prefixes) == max_keys:
            return _page(entries, listed, prefixes, True, last)
        prefixes.append(rolled)
        last = rolled
    return _page(entries, listed, prefixes, False, last)


def _page(
    entries: Sequence[ListEntry],
    listed: list[int],
    prefixes: list[str],
    truncated: bool,
    last: str | None,
) -> ListPage:
    """The page, its entries built now (a snapshot's are lazy), a run of indices at a time."""
    contents: list[ListEntry] = []
    start = 0
    for n in range(1, len(listed) + 1):
        if n == len(listed) or listed[n] != listed[n - 1] + 1:
            contents.extend(entries[listed[start] : listed[n - 1] + 1])
            start = n
    return ListPage(contents, prefixes, is_truncated=truncated, next_marker=last)


def _run(
    entries: Sequence[ListEntry], keys: Sequence[str], prefix: str, i: int, max_keys: int
) -> ListPage:
    """The flat page of up to ``max_keys`` keys from ``i`` on, all under ``prefix``."""
    end = prefix_end(prefix) if prefix else None
    stop = len(keys) if end is None else _bisect(keys, end, i)
    contents = list(entries[i : min(stop, i + max_keys)])
    last = contents[-1].key if contents else None
    return ListPage(contents, [], is_truncated=i + max_keys < stop, next_marker=last)


class _EntryKeys(Sequence[str]):
    """The keys of a plain list of entries, as a sequence ``bisect`` can probe."""

    def __init__(self, entries: Sequence[ListEntry]) -> None:
        self._entries = entries

    def __len__(self) -> int:
        return len(self._entries)

    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return [entry.key for entry in self._entries[i]]
        return self._entries[i].key


def _keys_of(entries: Sequence[ListEntry]) -> Sequence[str]:
    """A columnar listing's own key column (``metadata/snapshot.py``), else a view."""
    keys = getattr(entries, "keys", None)
    return keys if isinstance(keys, Sequence) else _EntryKeys(entries)


def _skip_under(keys: Sequence[str], rolled: str, lo: int) -> int:
    """Index of the first key at or after ``lo`` that does not start with ``rolled``
    (the key at ``lo`` does), by the key column's own (faster) way where it has one."""
    own = getattr(keys, "skip_under", None)
    if own is not None:
        return int(own(rolled, lo))
    end = prefix_end(rolled)
    if end is None:
        return len(keys)
    return _bisect(keys, end, lo)


def _bisect(keys: Sequence[str], key: str, lo: int = 0) -> int:
    """``bisect_left``, by the key column's own (faster) one where it has one."""
    own = getattr(keys, "bisect_left", None)
    return own(key, lo) if own is not None else bisect_left(keys, key, lo)
