"""When a packed record may be lent without reading it back: what a segment's fingerprint vouches for.

A record is checked (read back, checksummed: ``segment_files.verify``) before
a process first lends it, and again whenever its segment's fingerprint (inode,
mtime, ctime) changes, so bytes changed in place are never served. Most of
those checks prove what is already known:

- **The writer's own records.** A segment is appended to by one process, which
  checksummed each record's bytes on their way in. While the file shows the
  fingerprint that process's last append left, nobody else has changed it, so
  its records need no check. An append that finds the file changed since the
  last one ends that trust for the segment, for good (so do a cut-back and a
  dropped segment).
- **A sibling's reads of them.** Each group commit records that fingerprint in
  the segment's index row (``segments.written``, NULL once the writer lost its
  trust). A sibling asks the index once per segment, again when the file
  changes or a second later (the writer's next batch may vouch for what it
  appended since), and trusts the file as the writer does while it shows it.

Without this, the first epoch after a cold one (training's second) read back
and checksummed every block just written, in a thread above 64 KiB: 200 µs of
CPU a 112 KiB hit with one worker, against 73; 210-220 against 156-161 with
two (``loadtest/results/example-smallobjects.md``, session 12).

A vouch is trusted only from this boot: after a power cut a record the writer
vouched for may be torn (its bytes never reached the disk, while the file's
size and times did, as some file systems allow), so a fingerprint whose ctime
is older than the boot is checked record by record, as before.

Not guaranteed: that a change is caught if it leaves the fingerprint as it was
(a write in the same clock tick as the last check or append, on a kernel
without fine-grained timestamps, before Linux 6.13), or if it comes between the
``fstat`` and the ``pwritev`` of an append (it is then taken for the writer's own).
"""

from __future__ import annotations

import math
import os
import sqlite3
import time
from collections.abc import Callable

from gateway.cache import segment_files
from gateway.cache.segment_files import Fingerprint, Segment

_ASK_AGAIN = 1.0  # seconds before the index is asked again what a segment's writer vouched for


class SegmentTrust:
    """The segments this process writes, and what their writers vouched for."""

    def __init__(self, read_vouched: Callable[[str], str | None]) -> None:
        """``read_vouched(name)``: the fingerprint the segment's writer recorded in the
        index, read on the loop; raises ``sqlite3.OperationalError`` if it is busy."""
        self._read_vouched = read_vouched
        self._booted_ns = booted_at() * 1_000_000_000
        # Segments this process writes, with the fingerprint its last append left, while
        # nobody else has changed them (one entry a segment, dropped with it).
        self._written: dict[str, Fingerprint] = {}

    def created(self, name: str, fd: int) -> None:
        self._written[name] = segment_files.fingerprint(os.fstat(fd))

    def unchanged(self, name: str, fd: int) -> bool:
        """Before an append: whether the file is as this process's last append left it."""
        return self._written.get(name) == segment_files.fingerprint(os.fstat(fd))

    def appended(self, name: str, fd: int, unchanged: bool) -> None:
        """After an append (``unchanged``: as ``unchanged`` said before it)."""
        if unchanged:
            self._written[name] = segment_files.fingerprint(os.fstat(fd))
        else:
            self._written.pop(name, None)

    def forget(self, name: str) -> None:
        """The segment was cut back, or dropped: its records are checked from now on."""
        self._written.pop(name, None)

    def vouch(self, name: str) -> str | None:
        """What this process vouches for of a segment it writes, for its index row: the
        fingerprint its last append left (a later append than the batch's only adds
        records of its own); None: nothing."""
        fingerprint = self._written.get(name)
        return None if fingerprint is None else segment_files.fingerprint_text(fingerprint)

    def lendable(self, segment: Segment, name: str, digest: str, fingerprint: Fingerprint) -> bool:
        """Whether a record of ``segment`` (file ``name``, now showing ``fingerprint``)
        may be lent without a check: it passed one since the file last changed, or this
        process wrote the file as it is, or the writer vouched for it in the index."""
        if segment.verified.get(digest) == fingerprint:
            return True
        if self._written.get(name) == fingerprint:
            return True
        return self._vouched(segment, name, fingerprint)

    def _vouched(self, segment: Segment, name: str, fingerprint: Fingerprint) -> bool:
        if segment.vouched == fingerprint:
            return True
        now = time.monotonic()
        asked = segment.asked
        if asked is not None and asked[0] == fingerprint and now - asked[1] < _ASK_AGAIN:
            return False
        try:
            recorded = self._read_vouched(name)
        except sqlite3.OperationalError:  # busy: the record is checked instead
            return False
        segment.asked = (fingerprint, now)
        if recorded != segment_files.fingerprint_text(fingerprint):
            return False
        if fingerprint[2] < self._booted_ns:  # vouched before a reboot: maybe torn since
            return False
        segment.vouched = fingerprint
        return True


def booted_at() -> float:
    """When this machine booted (seconds since the epoch, ``/proc/stat``); infinity if
    unknown, so that no vouch is trusted."""
    try:
        with open("/proc/stat") as stat:
            for line in stat:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except OSError:
        pass
    return math.inf
