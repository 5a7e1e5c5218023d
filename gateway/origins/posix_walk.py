"""A posix listing: the walk of a directory tree in S3 key order, doing as little as it can.

S3 lists keys in byte order of their UTF-8; a directory tree holds them in
directories. A listing walks the tree in key order, only below the deepest
directory the prefix names, skips subtrees before ``start_after``, does not
descend into directories that roll up into a common prefix (it only checks
they hold a file, when the page reaches them), stats only the files that land
on the page, and stops once the page is full (``max_keys + 1`` items, enough
for ``listing.paginate`` to say whether the page is truncated).

What is listed is what a GET can read: regular files inside the bucket's
folder (``within``: that folder, minus the multipart staging area), through
symlinks that stay inside it (one leading out is neither shown nor descended), never temp files of writes in progress, never names that
are not UTF-8. A symlink loop is cut where it is found. The ETag of an entry
is the record's (``posix_records.py``) while it still names the file, else
the fingerprint, exactly as HEAD answers.

NOT guaranteed: a listing is a walk, not a snapshot: concurrent changes may
or may not show.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

from gateway.core import errors
from gateway.origins.base import ListEntry
from gateway.origins.listing import common_prefix, prefix_end
from gateway.origins.posix_keys import is_temp, safe_relpath, utf8
from gateway.origins.posix_records import Records, etag_of, last_modified

_EPOCH = datetime.fromtimestamp(0, tz=UTC)


def list_entries(
    top: str,
    within: Callable[[str], bool],
    records: Records,
    prefix: str,
    delimiter: str,
    start_after: str,
    max_keys: int,
) -> list[ListEntry]:
    """The first ``max_keys + 1`` items under the bucket directory ``top`` (placeholders for prefixes)."""
    base_rel, _, partial = prefix.rpartition("/")
    if not (base_rel == "" or safe_relpath(base_rel)):
        return []  # no key can start with prefix
    base = os.path.realpath(os.path.join(top, base_rel)) if base_rel else top
    if not within(base) or max_keys <= 0:
        return []
    walk = Walk(within, records, prefix, delimiter, start_after)
    base_key = base_rel + "/" if base_rel else ""
    return walk.collect(walk.nodes(base, base_key, partial, (base,)), max_keys)


@dataclass(frozen=True, slots=True)
class Node:
    key: str  # a file's key, or a directory's key prefix ending in "/"
    path: str  # real path (symlinks resolved)
    is_dir: bool


class Walk:
    """One listing's walk: yields files in key order, and rolled-up directories unopened."""

    def __init__(
        self,
        within: Callable[[str], bool],
        records: Records,
        prefix: str,
        delimiter: str,
        start_after: str,
    ) -> None:
        self._within, self._records = within, records
        self.prefix, self.delimiter, self.start_after = prefix, delimiter, start_after

    def collect(self, nodes: Iterator[Node], max_keys: int) -> list[ListEntry]:
        """Entries for the first ``max_keys + 1`` listed items, enough for ``paginate``."""
        entries: list[ListEntry] = []
        items, last_rolled = 0, None
        for node in nodes:
            rolled = common_prefix(node.key, self.prefix, self.delimiter)
            if rolled is None:
                entry = self._entry(node)
                if entry is None:
                    continue
            elif rolled <= self.start_after or rolled == last_rolled:
                continue  # skipped by paginate, or already represented
            elif node.is_dir and not self._has_file(node.path, (node.path,)):
                continue  # S3 has no empty directories
            else:
                entry, last_rolled = ListEntry(node.key, 0, "", _EPOCH), rolled  # placeholder
            entries.append(entry)
            items += 1
            if items > max_keys:
                break
        return entries

    def nodes(
        self, path: str, key: str, name_prefix: str, stack: tuple[str, ...]
    ) -> Iterator[Node]:
        for node in self._children(path, key, name_prefix):
            if not node.is_dir:
                if node.key > self.start_after:
                    yield node
            elif self._before_marker(node) or in_cycle(node.path, stack):
                continue  # a symlink loop is cut where it is found, delimiter or not
            elif common_prefix(node.key, self.prefix, self.delimiter) is not None:
                yield node  # all of it rolls into one common prefix: do not descend
            else:
                yield from self.nodes(node.path, node.key, "", (*stack, node.path))

    def _before_marker(self, node: Node) -> bool:
        """Whether every key below the directory ``node`` sorts at or before the marker."""
        end = prefix_end(node.key)
        return end is not None and end <= self.start_after

    def _has_file(self, path: str, stack: tuple[str, ...]) -> bool:
        for node in self._children(path, "", ""):
            if not node.is_dir:
                return True
            if not in_cycle(node.path, stack) and self._has_file(node.path, (*stack, node.path)):
                return True
        return False

    def _children(self, path: str, key: str, name_prefix: str) -> list[Node]:
        """A directory's listable entries in key order; none if it vanished or is unreadable."""
        try:
            with os.scandir(path) as it:
                found = [
                    self._node(entry, key)
                    for entry in it
                    if entry.name.startswith(name_prefix) and utf8(entry.name)
                ]
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            return []
        except OSError as err:
            raise errors.OriginUnavailable(f"posix origin: {err.strerror}") from err
        return sorted((node for node in found if node is not None), key=lambda n: n.key)

    def _node(self, entry: os.DirEntry[str], key: str) -> Node | None:
        try:
            if entry.is_symlink():
                path = os.path.realpath(entry.path)
                if not self._within(path):
                    return None  # leads out of the bucket's folder
                mode = os.stat(path).st_mode
                is_dir, is_file = stat.S_ISDIR(mode), stat.S_ISREG(mode)
            else:
                path = entry.path
                if not self._within(path):
                    return None  # the multipart staging area, seen from the root
                is_dir = entry.is_dir(follow_symlinks=False)
                is_file = entry.is_file(follow_symlinks=False)
        except OSError:
            return None  # vanished mid-walk
        if is_file and is_temp(entry.name):
            return None  # a write in progress
        if is_dir:
            return Node(key + entry.name + "/", path, True)
        return Node(key + entry.name, path, False) if is_file else None

    def _entry(self, node: Node) -> ListEntry | None:
        try:
            st = os.stat(node.path)
        except OSError:
            return None  # deleted since the scan
        if not stat.S_ISREG(st.st_mode):
            return None
        record = self._records.read(node.path, st)
        etag = (record and record.etag_for(st)) or etag_of(st)
        return ListEntry(node.key, st.st_size, etag, last_modified(st))


def in_cycle(path: str, stack: tuple[str, ...]) -> bool:
    """Whether descending into ``path`` re-enters a directory being walked (symlink loop)."""
    return any(s == path or s.startswith(path.rstrip("/") + "/") for s in stack)
