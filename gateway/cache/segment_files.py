"""A segment as a file: records appended, one descriptor kept and lent, a record checked.

The file side of packed blocks, as ``disk_files.py`` is the file side of a
block with its own file; ``segment_sql.py`` is their index side and
``disk_packed.py`` decides what runs when. A segment is a file of *records*
back to back, each ``block.HEADER_SIZE`` bytes of header and the block's data,
appended with one ``pwritev`` (``pwritev_all``) by the one process that owns
the segment while it is active.

A hit is lent the segment's one kept descriptor (``Segment``, shared by every
response, counted by its users): the descriptor is closed by its last user
once the segment is dropped, never under a response still sending from it. A
record is checked against its index row (header, length, checksum: ``verify``)
before it is first lent, and again whenever the segment's ``fingerprint``
(inode, mtime, ctime) changes, so bytes changed in place are never served (the
process that wrote a segment skips the check while the fingerprint is the one
its last append left, and so do its siblings once the writer has vouched for
that fingerprint in the index: ``segment_trust.py``).

Everything here is plain blocking file-system work on one descriptor; the
caller picks the thread.

Not guaranteed: that a record is complete before its row commits (it is
appended first; a power cut without ``fsync`` may tear it, and ``verify``
then fails it).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

import xxhash

from gateway.cache import disk_files as files
from gateway.cache.block import HEADER_SIZE, BlockId, decode_header
from gateway.cache.disk_files import BlockFile
from gateway.cache.segment_sql import Place

SUFFIX = ".seg"

Fingerprint = tuple[int, int, int]  # a segment file's (inode, mtime, ctime), in ns


class Segment:
    """One kept segment descriptor, shared by responses; closed by its last user once dropped."""

    __slots__ = ("asked", "fd", "kept", "users", "verified", "vouched")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.users = 0
        self.kept = True
        self.verified: dict[str, Fingerprint] = {}  # digest -> segment fingerprint
        # The fingerprint its writer vouched for in the index, when the file showed it;
        # and the fingerprint and clock time of the last time the index was asked.
        self.vouched: Fingerprint | None = None
        self.asked: tuple[Fingerprint, float] | None = None

    def release(self) -> None:
        self.users -= 1
        if not self.kept and self.users == 0:
            os.close(self.fd)


@dataclass(slots=True)
class PackedFile(BlockFile):
    """A packed block lent to one response: the segment's descriptor at the record's data."""

    segment: Segment | None = None

    def close(self) -> None:
        if self.segment is not None:
            segment, self.segment = self.segment, None
            segment.release()


class Bad(Exception):
    """A packed block's record cannot be served (truncated, checksum, header)."""


def fingerprint(stat: os.stat_result) -> Fingerprint:
    """What changes when a segment's bytes may have: its record checks are redone then."""
    return (stat.st_ino, stat.st_mtime_ns, stat.st_ctime_ns)


def fingerprint_text(fingerprint: Fingerprint) -> str:
    """A fingerprint as the index keeps it (``segments.written``)."""
    inode, modified, changed = fingerprint
    return f"{inode}:{modified}:{changed}"


def lend(segment: Segment, place: Place) -> PackedFile:
    segment.users += 1
    return PackedFile(segment.fd, place.offset + HEADER_SIZE, place.length, (), segment)


def create(path: Path) -> int:
    path.parent.mkdir(exist_ok=True)
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)


def verify(fd: int, block: BlockId, place: Place) -> None:
    raw = os.pread(fd, HEADER_SIZE + place.length, place.offset)
    header = decode_header(raw, block)
    if header is None or header.length != place.length or header.checksum != place.checksum:
        raise Bad("record header does not match its index row")
    if len(raw) != HEADER_SIZE + place.length:
        raise Bad("record cut short")
    if xxhash.xxh3_64_intdigest(memoryview(raw)[HEADER_SIZE:]) != place.checksum:
        raise Bad("checksum mismatch")


def pwritev_all(fd: int, buffers: list[bytes], offset: int) -> None:
    total = sum(len(b) for b in buffers)
    written = os.pwritev(fd, buffers, offset)
    if written < total:  # rare: finish byte by byte of what is left
        rest = b"".join(buffers)[written:]
        files.pwrite_all(fd, rest, offset + written)


def cut_back(fd: int, size: int) -> None:
    """Truncate a segment to ``size`` bytes: records past it were never indexed. Best
    effort (a file system that refuses leaves dead bytes until the segment goes)."""
    with contextlib.suppress(OSError):
        os.ftruncate(fd, size)


def cut_back_path(path: Path, size: int) -> None:
    """``cut_back`` of a segment this process no longer holds open (gone already: nothing)."""
    with contextlib.suppress(OSError):
        os.truncate(path, size)


def scan(directory: Path) -> set[str]:
    """The names of every segment file in ``directory``."""
    if not directory.exists():
        return set()
    return {e.name for e in os.scandir(directory) if e.name.endswith(SUFFIX)}
