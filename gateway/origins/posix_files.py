"""Atomic files for the posix origin: a temp file beside its name, renamed in or removed.

Every object is written to a hidden temp file (``.hoard-tmp-<random>``) in the
directory it will live in, then renamed over its name. The rename is the commit:
a reader sees the old file or the new one, never a mix, and a descriptor opened
on the old file keeps reading the old bytes. The temp file sits beside its
destination rather than in a central spool because a bucket directory may be
another filesystem (an NFS mount under the root), and rename does not cross
filesystems. Until the rename nothing is visible: if the body iterator raises
(the client went away, a checksum failed) or the task is cancelled, the temp
file and the directories made for it are removed (``undo``) and the old
object, if any, is untouched. The order inside ``TempFile.commit`` is
deliberate:

1. ``fstat`` the finished temp file, then store its record
   (``posix_records.py``) on it, so the record names exactly these bytes;
2. close it before the rename: on NFS, close-to-open consistency sends the
   bytes to the server at close (and reports ENOSPC there), so no other client
   can open the new name and find it short;
3. rename; a directory in the way (``put a`` while ``a/b`` exists) is refused
   first, since POSIX cannot hold a file and a directory of one name.

Data is not fsynced unless asked (``fsync=True``): a crash of the machine may
then lose a write that was answered. With it, the file is fsynced before the
rename and its directory after.

Blocking calls here run in worker threads; ``drain`` moves a body into a temp
file about 1 MiB per thread hop, so memory stays flat. ``domain_errors``
turns an ``OSError`` into the S3 error a client can act on, in one place for
every write.

NOT guaranteed:

- A crash (kill -9, power) mid-write leaves a hidden temp file beside the
  destination; listings and reads skip it, nothing removes it.
- A task cancelled while its commit runs in a worker thread may still commit:
  the thread cannot be stopped between the rename and the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import os
import secrets
import threading
import weakref
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

from gateway.core import errors
from gateway.origins.posix_records import Attrs, Records

TEMP_PREFIX = ".hoard-tmp-"  # names of files being written; reserved, never listed

CHUNK = 1 << 20

_KERNEL_COPY_UNSUPPORTED = frozenset(
    {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL}
)


@dataclass(frozen=True, slots=True)
class Target:
    """Where a key's file goes, as ``posix.py`` resolved and checked it."""

    key: str  # for messages
    top: str  # real path of the bucket's directory: pruning stops below it
    parent: str  # real path of the directory holding the file (may not exist yet)
    name: str  # the last component
    folder: bool = False  # a "folder" key ending in "/": a directory, not a file

    @property
    def path(self) -> str:
        return os.path.join(self.parent, self.name)


def _discard(fd: int, path: str) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(path)


def _write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _copy_range(src: int, dst: int, count: int) -> None:
    """Append ``count`` bytes from the start of ``src`` to ``dst``; in the kernel when it can."""
    done = 0
    if hasattr(os, "copy_file_range"):
        try:
            while done < count:
                n = os.copy_file_range(src, dst, min(count - done, 64 * CHUNK), done)
                if n == 0:
                    raise errors.OriginChanged("a staged part shrank")
                done += n
            return
        except OSError as err:
            if err.errno not in _KERNEL_COPY_UNSUPPORTED:
                raise
    while done < count:  # resumes where the kernel stopped
        data = os.pread(src, min(CHUNK, count - done), done)
        if not data:
            raise errors.OriginChanged("a staged part shrank")
        _write_all(dst, data)
        done += len(data)


class TempFile:
    """A new file written by worker threads, then renamed into place or discarded.

    The lock makes ``discard`` wait for a write in flight (the task awaiting it
    may have been cancelled): closing under it would free the descriptor
    number for another open. Dropped undiscarded, it removes itself.
    """

    def __init__(self, directory: str, *, hashing: bool) -> None:
        self.path = os.path.join(directory, TEMP_PREFIX + secrets.token_hex(8))
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        self.fd = os.open(self.path, flags, 0o666)  # the umask decides, as for any new file
        self.md5 = hashlib.md5(usedforsecurity=False) if hashing else None
        self._lock = threading.Lock()
        self._finalizer = weakref.finalize(self, _discard, self.fd, self.path)

    def _check_open(self) -> None:
        if not self._finalizer.alive:
            raise ValueError("write to a discarded or committed temp file")

    def write(self, data: bytes | bytearray, *, hashed: bool = True) -> None:
        with self._lock:
            self._check_open()
            if hashed and self.md5 is not None:
                self.md5.update(data)
            _write_all(self.fd, data)

    def append_from(self, src: int, size: int) -> None:
        """Append the first ``size`` bytes of the open file ``src``."""
        with self._lock:
            self._check_open()
            _copy_range(src, self.fd, size)

    def commit(
        self, dest: str, *, fsync: bool, record: tuple[Records, str, Attrs] | None = None
    ) -> os.stat_result:
        """Store the ``(records, etag, attrs)`` record on the file, close it, rename it to ``dest``."""
        with self._lock:
            self._check_open()
            if fsync:
                os.fsync(self.fd)
            st = os.fstat(self.fd)
            if record is not None:
                records, etag, attrs = record
                st = records.store(self.fd, st, etag, attrs)
            self._finalizer.detach()
            try:
                os.close(self.fd)  # before the rename: NFS flushes (and fails) at close
                if os.path.isdir(dest):  # also a symlink to one: never replace a prefix
                    raise IsADirectoryError(errno.EISDIR, "Is a directory", dest)
                os.rename(self.path, dest)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(self.path)
                raise
        if fsync:
            _fsync_dir(os.path.dirname(dest))
        return st

    def discard(self) -> None:
        with self._lock:
            self._finalizer()


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def quoted_md5(digest: bytes) -> str:
    return f'"{digest.hex()}"'


@contextlib.contextmanager
def domain_errors(key: str, missing: errors.HoardError | None = None) -> Iterator[None]:
    """OSError from a write, as the domain error a client can act on."""
    try:
        yield
    except OSError as err:
        code = err.errno
        if missing is not None and code == errno.ENOENT:
            raise missing from err
        if code in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise errors.AccessDenied(f"The posix origin refuses the write: {key!r}") from err
        if code in (errno.ENOTDIR, errno.EEXIST):
            raise errors.InvalidObjectName(f"A parent of the key is a file: {key!r}") from err
        if code == errno.EISDIR:
            raise errors.InvalidObjectName(f"A directory has the key's name: {key!r}") from err
        if code in (errno.ENAMETOOLONG, errno.ELOOP):
            raise errors.InvalidObjectName(f"The filesystem cannot name the key: {key!r}") from err
        raise errors.OriginUnavailable(f"posix origin: {err.strerror}") from err


def make_dirs(path: str, key: str) -> list[str]:
    """Create ``path`` and its missing parents; the ones created, outermost first."""
    missing = []
    probe = path
    while not os.path.lexists(probe):
        missing.append(probe)
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise errors.InvalidObjectName(f"A parent of the key is a file: {key!r}")
    created = []
    for directory in reversed(missing):
        try:
            os.mkdir(directory)
        except FileExistsError:
            if not os.path.isdir(directory):  # else a concurrent writer made it: fine
                remove_dirs(created)
                raise errors.InvalidObjectName(f"A parent of the key is a file: {key!r}") from None
            continue
        except BaseException:
            remove_dirs(created)
            raise
        created.append(directory)
    return created


def remove_dirs(created: list[str]) -> None:
    """Remove directories made for a write that failed, innermost first, while empty."""
    for directory in reversed(created):
        try:
            os.rmdir(directory)
        except OSError:
            return


def open_beside(target: Target, *, hashing: bool = True) -> tuple[TempFile, list[str]]:
    """A temp file beside ``target`` and the directories made for it; fails before any body."""
    key = target.key
    with domain_errors(key):
        if os.path.isdir(target.path):
            raise IsADirectoryError(errno.EISDIR, "Is a directory", target.path)
        for _ in range(3):  # a concurrent delete may prune a directory we just made
            created: list[str] = []
            try:
                created = make_dirs(target.parent, key)
                return TempFile(target.parent, hashing=hashing), created
            except FileNotFoundError:
                remove_dirs(created)
            except BaseException:
                remove_dirs(created)
                raise
        raise errors.OriginUnavailable(f"posix origin: {key!r}'s directory keeps vanishing")


async def commit_to(
    tmp: TempFile, target: Target, *, fsync: bool, record: tuple[Records, str, Attrs]
) -> os.stat_result:
    """Commit ``tmp`` as ``target``'s file with its record, in a worker thread.

    OSError comes back as the domain error."""

    def commit() -> os.stat_result:
        with domain_errors(target.key):
            return tmp.commit(target.path, fsync=fsync, record=record)

    return await asyncio.to_thread(commit)


async def drain(body: AsyncIterator[bytes], tmp: TempFile) -> None:
    """Write ``body`` into ``tmp`` in worker threads, about 1 MiB per hop (bounded memory)."""
    pending = bytearray()
    async for chunk in body:
        if not pending and len(chunk) >= CHUNK:
            await asyncio.to_thread(tmp.write, chunk)
            continue
        pending += chunk
        if len(pending) >= CHUNK:
            await asyncio.to_thread(tmp.write, pending)
            pending = bytearray()
    if pending:
        await asyncio.to_thread(tmp.write, pending)


async def undo(tmp: TempFile, created: list[str]) -> None:
    """Discard a failed write in a thread that runs to its end even if we are cancelled again."""

    def undo() -> None:
        tmp.discard()
        remove_dirs(created)

    await asyncio.shield(asyncio.to_thread(undo))
