"""The prefixes clients listed through any worker of the node, for auto-warm (``auto.py``).

A listing lives in the memory of the worker that served it; with ``workers: N``
the data loader's LIST and its GETs may reach different workers (one reader
on one keep-alive connection reads through one worker, its LIST came on
another), and a worker counts cold reads only against listings it holds. So
the worker that serves a client a listing page of a prefix records the
prefix here, a small file each in ``cache.dir/node/listed/``; a worker that
reads cold under a recorded prefix it holds no listing of lists it once
itself (through the reader: coalesced, cached, a page per 1,000 keys), and
then counts as the first one does.

Only what auto-warm can use is recorded: prefixes at a ``/`` boundary (or the
bucket's root), as ``MetadataCache.listed`` finds listings only there. Each
worker writes a prefix once, and reads the directory again only when its
modification time moved (a ``stat`` per cold read outside every held
listing). At most ``_MAX`` prefixes are recorded per node; past that, new
ones are not (logged once): the worker that served the listing still counts.

Not guaranteed: a record outlives the listing (a restart keeps the files; a
cold read under a recorded prefix then lists it again, one page per 1,000
keys, which is what the client's own listing cost).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Hashable
from dataclasses import asdict, dataclass
from pathlib import Path

from gateway.metadata.lookups import covering, directory_of
from gateway.metadata.source import scope_of
from gateway.node.shared import SharedDocument
from gateway.origins.namespace import Mount

log = logging.getLogger(__name__)

_MAX = 1024  # prefixes recorded per node


@dataclass(frozen=True, slots=True)
class Listed:
    """A prefix a client listed: in the origin's terms, and as the client named it."""

    origin: str
    origin_bucket: str
    prefix: str
    bucket: str
    client_prefix: str


class ListedPrefixes:
    """The node's record of listed prefixes, shared by its workers through a directory."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._written: set[str] = set()  # records this worker wrote or read
        self._known: dict[tuple[Hashable, str], Listed] = {}
        self._seen_mtime: float | None = None
        self._full_logged = False

    def record(self, mount: Mount, prefix: str) -> None:
        """A client was served a listing page of ``prefix`` (origin terms) through ``mount``."""
        if (prefix and not prefix.endswith("/")) or (scope_of(mount), prefix) in self._known:
            return  # a dictionary lookup per page served: listing hits run at a high rate
        name = _name(mount.origin.name, mount.origin_bucket, prefix)
        if name in self._written:
            return
        if len(self._written) >= _MAX:
            if not self._full_logged:
                self._full_logged = True
                log.warning("auto-warm: %d listed prefixes recorded; no more are", _MAX)
            return
        self._written.add(name)
        listed = Listed(mount.origin.name, mount.origin_bucket, prefix, mount.bucket,
                        mount.client_key(prefix))  # fmt: skip
        self._known[(scope_of(mount), prefix)] = listed
        try:
            SharedDocument(self._directory / f"{name}.json").write(asdict(listed))
        except OSError as exc:
            log.warning("auto-warm: cannot record listed prefix %r: %s", prefix, exc)

    def covering(self, mount: Mount, okey: str) -> Listed | None:
        """The recorded prefix nearest above ``okey`` (origin terms), if any."""
        self._refresh()
        scope = scope_of(mount)
        for candidate in covering(directory_of(okey)):
            found = self._known.get((scope, candidate))
            if found is not None:
                return found
        return None

    def _refresh(self) -> None:
        try:
            mtime = self._directory.stat().st_mtime
        except FileNotFoundError:
            return
        if mtime == self._seen_mtime:
            return
        self._seen_mtime = mtime
        for path in self._directory.glob("*.json"):
            if path.stem in self._written:
                continue
            body = SharedDocument(path).read()  # None, logged, if unreadable
            try:
                listed = Listed(**(body or {}))
            except TypeError:
                if body is not None:
                    log.warning("auto-warm: listed prefix record %s is not one: %s", path, body)
                continue
            self._written.add(path.stem)
            self._known[((listed.origin, listed.origin_bucket), listed.prefix)] = listed


def _name(origin: str, bucket: str, prefix: str) -> str:
    return hashlib.sha256(f"{origin}\0{bucket}\0{prefix}".encode()).hexdigest()[:32]
