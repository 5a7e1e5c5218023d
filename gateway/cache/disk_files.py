"""How the disk tier's blocks live in files: open and verify, claim, seal, tail.

Everything here is plain blocking file-system work on one file at a time (the
``Disk`` half of python-diskcache's split); ``disk.py`` runs it in threads and
decides when. A block file is ``block.HEADER_SIZE`` bytes of header followed
by the data. A fill in progress is a part file holding a provisional header
(its checksum is not yet known, but its length is, which tells followers how
long the block will be), locked with ``flock`` by the process filling it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xxhash

from gateway.cache.block import HEADER_SIZE, BlockId, decode_header

_VERIFY_CHUNK = 1 << 20  # bytes read per step when checking a block's checksum
_POLL = 0.003  # seconds between fstat polls of a followed part file
_PROBE = 0.025  # seconds between checks that a followed filler is still alive
_HEADER_TIMEOUT = 10.0  # a filler writes the header right after it claims the part
_TAIL_CHUNK = 1 << 20  # bytes a follower reads from the part file at a time


class FillAbandoned(Exception):
    """The process filling a block went away before the block was complete."""


@dataclass
class BlockFile:
    """A verified block on disk, open for reading; send ``length`` bytes from ``data_offset``.

    ``fingerprint`` is the file's (inode, size, mtime, ctime) when it was verified.
    """

    fd: int
    data_offset: int
    length: int
    fingerprint: tuple[int, ...] = ()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> BlockFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True, slots=True)
class Corrupt:
    """Why a block file cannot be served, and which file it was."""

    why: str
    identity: tuple[int, int]  # (st_dev, st_ino): remove it only if the name still leads here


class PartFollower:
    """Tails a part file another process is filling (see ``DiskTier.follow``).

    ``fd`` reads the part's inode, so it keeps reading the same bytes after
    the filler renames the part into ``blocks/`` or removes it.
    """

    def __init__(self, fd: int, probe: int) -> None:
        self.fd = fd
        self.data_offset = HEADER_SIZE
        self.length = 0  # known once the header is read (``read_header``)
        self._probe = probe  # a second open file description: flock on it tests the filler

    def available(self) -> int:
        return max(0, min(os.fstat(self.fd).st_size - HEADER_SIZE, self.length))

    async def wait_for(self, n: int, timeout: float = 30.0) -> int:
        """Wait until at least ``n`` data bytes are readable; return how many are.

        Raises FillAbandoned if the filler went away before the block was
        complete, TimeoutError if the bytes do not arrive within ``timeout``.
        """
        await self._wait_size(HEADER_SIZE + min(n, self.length), timeout)
        return self.available()

    async def read_header(self, block: BlockId) -> None:
        """Learn the block's length from the filler's provisional header."""
        await self._wait_size(HEADER_SIZE, _HEADER_TIMEOUT)
        header = decode_header(os.pread(self.fd, HEADER_SIZE, 0), block)
        if header is None:
            raise FillAbandoned(f"part file of {block.digest} has no valid header")
        self.length = header.length

    async def copy_to(self, sink: Callable[[bytes], None], chunk: int = _TAIL_CHUNK) -> None:
        """Hand every data byte to ``sink`` as the filler writes it, ``chunk`` at a time
        (raises as ``wait_for``)."""
        have = 0
        while have < self.length:
            available = await self.wait_for(min(have + chunk, self.length))
            data = await asyncio.to_thread(
                os.pread, self.fd, available - have, self.data_offset + have
            )
            sink(data)
            have += len(data)

    def close(self) -> None:
        for fd in (self.fd, self._probe):
            if fd >= 0:
                os.close(fd)
        self.fd = self._probe = -1

    async def _wait_size(self, size: int, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        probed = loop.time()
        while os.fstat(self.fd).st_size < size:
            now = loop.time()
            if now - probed >= _PROBE:
                probed = now
                # a free lock means the filler is gone; it may have finished just before
                if lock_is_free(self._probe) and os.fstat(self.fd).st_size < size:
                    raise FillAbandoned(f"filler left at {self.available()} of {self.length} bytes")
            if now >= deadline:
                raise TimeoutError(f"part file still short of {size} bytes after {timeout}s")
            await asyncio.sleep(_POLL)


_VERIFIED_MEMORY = 262_144  # fingerprints of verified block files kept per process

# -- reading a block ---------------------------------------------------------------


def open_block(
    path: Path, block: BlockId, verified: dict[str, tuple[int, ...]] | None = None
) -> BlockFile | Corrupt | None:
    """The verified block at ``path``, None if there is no file, Corrupt if it is bad.

    ``verified`` remembers files whose data checksum passed, by their stat
    fingerprint (inode, size, mtime, ctime). Any write, truncation, rename over
    or chmod changes the fingerprint and brings the full check back, so only
    silent media corruption of an unchanged file escapes until the next
    restart; a hot block is not re-hashed on every hit.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        length, why, fingerprint = _check(fd, block, verified)
    except OSError as exc:
        length, why, fingerprint = 0, f"unreadable: {exc}", ()
    except BaseException:
        os.close(fd)
        raise
    if why is None:
        return BlockFile(fd, HEADER_SIZE, length, fingerprint)
    bad = Corrupt(why, identity(fd))
    os.close(fd)
    return bad


def fingerprint_of(stat: os.stat_result) -> tuple[int, ...]:
    """What changes when a file is rewritten, truncated, replaced or chmod'ed."""
    return (stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


def _check(
    fd: int, block: BlockId, verified: dict[str, tuple[int, ...]] | None
) -> tuple[int, str | None, tuple[int, ...]]:
    """(data length, None, fingerprint) for a sound block file, else (0, what is wrong, ())."""
    header = decode_header(os.pread(fd, HEADER_SIZE, 0), block)
    if header is None:
        return 0, "bad header: torn, overwritten or another block's file", ()
    stat = os.fstat(fd)
    if stat.st_size != HEADER_SIZE + header.length:
        return 0, f"{stat.st_size} bytes on disk for {header.length} data bytes", ()
    fingerprint = fingerprint_of(stat)
    if verified is not None and verified.get(block.digest) == fingerprint:
        return header.length, None, fingerprint
    if _data_checksum(fd, header.length) != header.checksum:
        return 0, "checksum mismatch", ()
    if verified is not None:
        if len(verified) >= _VERIFIED_MEMORY:
            verified.clear()  # cheap bound; re-verifying later is only a cost
        verified[block.digest] = fingerprint
    return header.length, None, fingerprint


def _data_checksum(fd: int, length: int) -> int:
    # pread into one small buffer rather than mmap: a file truncated under an
    # mmap raises SIGBUS and kills the process; a short read is just corrupt.
    hasher = xxhash.xxh3_64()
    view = memoryview(bytearray(min(length, _VERIFY_CHUNK)))
    done = 0
    while done < length:
        n = os.preadv(fd, [view[: length - done]], HEADER_SIZE + done)
        if n == 0:
            raise OSError(errno.EIO, f"file ends after {done} of {length} data bytes")
        hasher.update(view[:n])
        done += n
    return hasher.intdigest()


# -- filling a block ---------------------------------------------------------------


def claim(part: Path, final: Path, header: bytes) -> int | None:
    """Open and flock ``part``, write ``header``; None if another process holds
    the part or the block is already in place."""
    while True:
        fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        # The previous holder may have renamed or removed this inode just
        # before we locked it; the claim counts only if the name still leads here.
        found = os.fstat(fd)
        if names(part, (found.st_dev, found.st_ino)):
            break
        os.close(fd)
    try:
        done = final.exists()
        if not done:
            pwrite_all(fd, header, 0)
            if found.st_size > HEADER_SIZE:  # a stale part's data: dropped (a new part has none)
                os.ftruncate(fd, HEADER_SIZE)
    except BaseException:
        unlink(part)
        os.close(fd)
        raise
    if done:
        unlink(part)
        os.close(fd)
        return None
    return fd


def append(fd: int, hasher: Any, data: bytes, offset: int) -> None:
    pwrite_all(fd, data, offset)
    hasher.update(data)


def seal(fd: int, header: bytes, part: Path, final: Path, fsync: bool) -> None:
    """Write the final header and rename the part into place (one thread hop)."""
    pwrite_all(fd, header, 0)
    if fsync:
        os.fsync(fd)
    final.parent.mkdir(exist_ok=True)
    os.rename(part, final)
    if fsync:  # the rename is durable only once the directory is
        dir_fd = os.open(final.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def open_part(part: Path) -> PartFollower | None:
    """A follower on ``part`` (header not read yet), or None if there is no part."""
    try:
        fd = os.open(part, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        probe = os.open(part, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        os.close(fd)
        return None
    follower = PartFollower(fd, probe)
    if identity(fd) != identity(probe):  # renamed and recreated between the two opens
        follower.close()
        return None
    return follower


def remove_stale_parts(tmp: Path) -> int:
    """Remove part files whose filler is gone; returns how many."""
    removed = 0
    for entry in os.scandir(tmp):
        if not entry.name.endswith(".part"):
            continue
        try:
            fd = os.open(entry.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            if lock_is_free(fd, keep=True) and names(Path(entry.path), identity(fd)):
                unlink(Path(entry.path))
                removed += 1
        finally:
            os.close(fd)
    return removed


def scan_blocks(blocks: Path) -> set[str]:
    """The digests of every block file under ``blocks``."""
    return {entry.name for sub in os.scandir(blocks) if sub.is_dir() for entry in os.scandir(sub)}


def older_than(paths: list[Path], cutoff: float) -> list[Path]:
    """The files among ``paths`` last written before ``cutoff`` (time.time())."""
    old = []
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            if path.stat().st_mtime < cutoff:
                old.append(path)
    return old


# -- small pieces --------------------------------------------------------------------


def open_if_locked(path: Path) -> int | None:
    """A descriptor of ``path`` while another holds its lock (a filler that has renamed
    it into place and is indexing it); None if there is no such file or nobody holds it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    if lock_is_free(fd):
        os.close(fd)
        return None
    return fd


def lock_is_free(fd: int, keep: bool = False) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    if not keep:
        # a probe must not hold off the next filler; for the instant it holds
        # the lock a concurrent claim sees a fill in progress and follows it
        fcntl.flock(fd, fcntl.LOCK_UN)
    return True


def identity(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def names(path: Path, file_identity: tuple[int, int]) -> bool:
    """Whether ``path`` currently names the file with ``file_identity``."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    return (st.st_dev, st.st_ino) == file_identity


def pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):  # another process got there first: expected
        os.unlink(path)


def unlink_many(paths: list[Path]) -> None:
    for path in paths:
        unlink(path)
