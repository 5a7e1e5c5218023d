"""Writes to a posix origin: whole objects, deletes and multipart uploads, each atomic.

``posix.py`` turns a bucket and key into a checked :class:`Target` (a real
parent directory and a name, never outside the root); this module turns bytes
into files there. It knows no bucket rules and no key syntax.

Every object is written to a hidden temp file (``.hoard-tmp-<random>``) in the
directory it will live in, then renamed over its name. The rename is the commit:
a reader sees the old file or the new one, never a mix, and a descriptor opened
on the old file keeps reading the old bytes. The temp file sits beside its
destination rather than in a central spool because a bucket directory may be
another filesystem (an NFS mount under the root), and rename does not cross
filesystems. Until the rename nothing is visible: if the body iterator raises
(the client went away, a checksum failed) or the task is cancelled, the temp
file and the directories made for it are removed and the old object, if any,
is untouched. The order inside the commit is deliberate:

1. ``fstat`` the finished temp file, then store its record (below) on it, so
   the record names exactly these bytes;
2. close it before the rename: on NFS, close-to-open consistency sends the
   bytes to the server at close (and reports ENOSPC there), so no other client
   can open the new name and find it short;
3. rename; a directory in the way (``put a`` while ``a/b`` exists) is refused
   first, since POSIX cannot hold a file and a directory of one name.

Data is not fsynced unless the writer is built with ``fsync=True``: a crash
of the machine may then lose a write that was answered. With it, the file is
fsynced before the rename and its directory after.

The record. Content-Type, user metadata, the representation headers S3
returns on GET/HEAD (Cache-Control, Content-Disposition, Content-Encoding,
Content-Language, Expires) and the ETag handed to the client are kept as one
JSON blob in the ``user.hoard.meta`` extended attribute, with the file's
(size, mtime_ns, inode) at commit. Reads serve the stored ETag while those
three still match, else the fingerprint ETag of ``posix.py``: a file changed
behind Hoard's back gets a new ETag, as it must. An MD5 ETag for a PUT (and the
S3 multipart form ``"<md5 of part digests>-<N>"``) is what S3 clients expect:
some SDKs compare it with the MD5 they computed.

Multipart uploads are staged under ``<root>/.hoard-uploads/<upload id>/``:
``upload.json`` (target bucket, key, record attributes, start time) and one
file per part, ``part-00001``, each a temp file renamed in. A part file is its
bytes followed by a 24-byte trailer (the part's MD5 digest and a magic tag),
so a part and its ETag are committed by one rename and can never disagree.
Completing copies the parts into a temp file beside the target
(``copy_file_range``: in the kernel, a reflink on filesystems that have them),
renames it in and removes the staging directory; aborting removes it.
``posix.py`` hides the staging tree from buckets, keys and listings.

NOT guaranteed:

- Without xattr support (ENOTSUP: many NFS servers, some FUSE mounts), only
  the bytes are kept: HEAD then guesses the content type, shows no metadata,
  and gives the fingerprint ETag, not the one the PUT returned.
- Metadata stays with the inode: an in-place rewrite behind Hoard's back keeps
  the stored Content-Type and metadata (the ETag does move).
- A crash (kill -9, power) mid-write leaves a hidden temp file beside the
  destination; listings and reads skip it, nothing removes it. Stale staged
  uploads are removed by :meth:`PosixWriter.cleanup_stale_uploads`, when
  someone calls it.
- A task cancelled while its commit runs in a worker thread may still commit:
  the thread cannot be stopped between the rename and the answer.
- Completing an upload writes its bytes a second time (staging to target),
  unless the filesystem reflinks.
- Concurrent writes of one key: the last rename wins, as in S3; concurrent
  completes of one upload may both succeed.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import itertools
import json
import os
import re
import secrets
import shutil
import stat
import threading
import time
import weakref
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from gateway import errors
from gateway.errors import (  # defined with the other domain errors; imported from here too
    EntityTooSmall,
    InvalidArgument,
    InvalidPart,
    InvalidPartOrder,
    MetadataTooLarge,
    NoSuchUpload,
)

STAGING_DIR = ".hoard-uploads"  # at the root; never a bucket, a key or a prefix
TEMP_PREFIX = ".hoard-tmp-"  # names of files being written; reserved, never listed
META_XATTR = "user.hoard.meta"
REPRESENTATION_HEADERS = (
    "Cache-Control",
    "Content-Disposition",
    "Content-Encoding",
    "Content-Language",
    "Expires",
)
MIN_PART_SIZE = 5 * 1024 * 1024  # S3's minimum for every part but the last
MAX_PART_NUMBER = 10_000
_CHUNK = 1 << 20
_TRAILER_MAGIC = b"hoardpt1"
_TRAILER_SIZE = 16 + len(_TRAILER_MAGIC)  # MD5 digest + magic
_UPLOAD_ID_RE = re.compile(r"[A-Za-z0-9_-]{16,128}")
_PART_RE = re.compile(r"part-(\d{5})")
_NO_XATTR = frozenset({errno.ENOTSUP, errno.EOPNOTSUPP})
_XATTR_TOO_BIG = frozenset({errno.E2BIG, errno.ENOSPC, errno.ERANGE})
_KERNEL_COPY_UNSUPPORTED = frozenset(
    {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL}
)


# -- values and errors -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PutResult:
    etag: str  # quoted, as S3 sends it
    last_modified: datetime
    size: int


@dataclass(frozen=True, slots=True)
class PartInfo:
    part_number: int
    etag: str
    size: int
    last_modified: datetime


@dataclass(frozen=True, slots=True)
class UploadInfo:
    key: str
    upload_id: str
    initiated: datetime


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


@dataclass(frozen=True, slots=True)
class Attrs:
    """What is stored beside the bytes: Content-Type, user metadata, representation headers."""

    content_type: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)  # names without x-amz-meta-
    headers: dict[str, str] = field(default_factory=dict)  # canonical names

    @classmethod
    def of(
        cls,
        content_type: str | None = None,
        metadata: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Attrs:
        """Metadata names lower-cased (as S3 returns them); headers kept if representation ones."""
        canonical = {name.lower(): name for name in REPRESENTATION_HEADERS}
        return cls(
            content_type or None,
            {name.lower(): value for name, value in (metadata or {}).items()},
            {
                canonical[name.lower()]: value
                for name, value in (headers or {}).items()
                if name.lower() in canonical
            },
        )


@dataclass(frozen=True, slots=True)
class Record:
    """The ``user.hoard.meta`` blob: attributes, plus the ETag valid for one version of the bytes."""

    etag: str
    fingerprint: tuple[int, int, int]  # (size, mtime_ns, inode) at commit
    attrs: Attrs

    def etag_for(self, st: os.stat_result) -> str | None:
        """The stored ETag if ``st`` is still the file it was stored for."""
        return self.etag if (st.st_size, st.st_mtime_ns, st.st_ino) == self.fingerprint else None


class Records:
    """Reads and writes records; remembers filesystems (by st_dev) that have no user xattrs."""

    def __init__(self) -> None:
        self._unsupported: set[int] = set()  # st_dev values answered ENOTSUP

    def read(self, file: str | int, st: os.stat_result) -> Record | None:
        """The record of a path or descriptor whose stat is ``st``; None if absent or unreadable."""
        if st.st_dev in self._unsupported or not hasattr(os, "getxattr"):
            return None
        try:
            blob = json.loads(os.getxattr(file, META_XATTR))
            content_type = blob["content_type"]
            attrs = Attrs(
                None if content_type is None else str(content_type),
                {str(k): str(v) for k, v in blob["metadata"].items()},
                {str(k): str(v) for k, v in blob["headers"].items()},
            )
            size, mtime_ns, ino = (int(n) for n in blob["fingerprint"])
            return Record(str(blob["etag"]), (size, mtime_ns, ino), attrs)
        except OSError as err:
            if err.errno in _NO_XATTR:
                self._unsupported.add(st.st_dev)
            return None  # ENODATA (a file not written by Hoard), or it vanished
        except (ValueError, KeyError, TypeError, AttributeError):
            return None  # not ours, or damaged: the fingerprint ETag is still right

    def store(self, fd: int, st: os.stat_result, etag: str, attrs: Attrs) -> os.stat_result:
        """Store a record for the open file ``fd`` whose stat is ``st``; the stat after."""
        self._write(fd, st, etag, attrs)
        after = os.fstat(fd)  # an xattr write should not move mtime; if it did, store again
        if (after.st_size, after.st_mtime_ns) != (st.st_size, st.st_mtime_ns):
            self._write(fd, after, etag, attrs)
        return after

    def _write(self, fd: int, st: os.stat_result, etag: str, attrs: Attrs) -> None:
        if st.st_dev in self._unsupported or not hasattr(os, "setxattr"):
            return
        blob = {
            "etag": etag,
            "fingerprint": [st.st_size, st.st_mtime_ns, st.st_ino],
            "content_type": attrs.content_type,
            "metadata": attrs.metadata,
            "headers": attrs.headers,
        }
        try:
            os.setxattr(fd, META_XATTR, json.dumps(blob, separators=(",", ":")).encode())
        except OSError as err:
            if err.errno in _NO_XATTR:
                self._unsupported.add(st.st_dev)  # documented: keep only the bytes
            elif err.errno in _XATTR_TOO_BIG:
                raise MetadataTooLarge("The metadata does not fit in the origin's xattrs") from err
            else:
                raise


# -- the temp file -------------------------------------------------------------


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
                n = os.copy_file_range(src, dst, min(count - done, 64 * _CHUNK), done)
                if n == 0:
                    raise errors.OriginChanged("a staged part shrank")
                done += n
            return
        except OSError as err:
            if err.errno not in _KERNEL_COPY_UNSUPPORTED:
                raise
    while done < count:  # resumes where the kernel stopped
        data = os.pread(src, min(_CHUNK, count - done), done)
        if not data:
            raise errors.OriginChanged("a staged part shrank")
        _write_all(dst, data)
        done += len(data)


class _TempFile:
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

    def append_file(self, path: str, size: int, digest: bytes) -> None:
        """Append a staged part's payload, if its trailer still carries ``digest``."""
        with self._lock:
            self._check_open()
            src = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                found = _read_trailer(src, os.fstat(src))
                if found is None or found != (size, digest):
                    raise InvalidPart("A part was replaced while the upload was being completed")
                _copy_range(src, self.fd, size)
            finally:
                os.close(src)

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


def _read_trailer(fd: int, st: os.stat_result) -> tuple[int, bytes] | None:
    """(payload size, MD5 digest) of a part file, or None if it has no valid trailer."""
    if st.st_size < _TRAILER_SIZE:
        return None
    tail = os.pread(fd, _TRAILER_SIZE, st.st_size - _TRAILER_SIZE)
    if len(tail) != _TRAILER_SIZE or not tail.endswith(_TRAILER_MAGIC):
        return None
    return st.st_size - _TRAILER_SIZE, tail[:16]


# -- helpers -------------------------------------------------------------------


def last_modified(st: os.stat_result) -> datetime:
    """Whole seconds, the rule ``posix.py`` uses for HEAD (tests hold the two together)."""
    return datetime.fromtimestamp(st.st_mtime_ns // 1_000_000_000, tz=UTC)


def _quoted_md5(digest: bytes) -> str:
    return f'"{digest.hex()}"'


def _bare_etag(etag: str) -> str:
    return etag.strip().strip('"').lower()


@contextlib.contextmanager
def _domain_errors(key: str, missing: errors.HoardError | None = None) -> Iterator[None]:
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


def _make_dirs(path: str, key: str) -> list[str]:
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
                _remove_dirs(created)
                raise errors.InvalidObjectName(f"A parent of the key is a file: {key!r}") from None
            continue
        except BaseException:
            _remove_dirs(created)
            raise
        created.append(directory)
    return created


def _remove_dirs(created: list[str]) -> None:
    """Remove directories made for a write that failed, innermost first, while empty."""
    for directory in reversed(created):
        try:
            os.rmdir(directory)
        except OSError:
            return


async def _drain(body: AsyncIterator[bytes], tmp: _TempFile) -> None:
    """Write ``body`` into ``tmp`` in worker threads, about 1 MiB per hop (bounded memory)."""
    pending = bytearray()
    async for chunk in body:
        if not pending and len(chunk) >= _CHUNK:
            await asyncio.to_thread(tmp.write, chunk)
            continue
        pending += chunk
        if len(pending) >= _CHUNK:
            await asyncio.to_thread(tmp.write, pending)
            pending = bytearray()
    if pending:
        await asyncio.to_thread(tmp.write, pending)


async def _undo(tmp: _TempFile, created: list[str]) -> None:
    """Discard a failed write in a thread that runs to its end even if we are cancelled again."""

    def undo() -> None:
        tmp.discard()
        _remove_dirs(created)

    await asyncio.shield(asyncio.to_thread(undo))


# -- the writer ------------------------------------------------------------------


class PosixWriter:
    """The write operations of one posix root (see the module docstring).

    Methods that consume a body (``put``, ``upload_part``, ``complete``) are
    coroutines; the others block and are meant for a worker thread.
    """

    def __init__(self, root: str, records: Records, *, fsync: bool = False) -> None:
        self._root = root  # real path
        self._staging = os.path.join(root, STAGING_DIR)
        self._records = records
        self._fsync = fsync

    # -- whole objects

    async def put(self, target: Target, body: AsyncIterator[bytes], attrs: Attrs) -> PutResult:
        """Store ``body`` as ``target``, atomically; raises domain errors only."""
        if target.folder:
            return await self._put_folder(target, body)
        tmp, created = await asyncio.to_thread(self._open_temp, target)
        try:
            await _drain(body, tmp)
            assert tmp.md5 is not None
            etag = _quoted_md5(tmp.md5.digest())
            st = await asyncio.to_thread(self._commit, tmp, target, (self._records, etag, attrs))
        except BaseException:
            await _undo(tmp, created)
            raise
        return PutResult(etag, last_modified(st), st.st_size)

    async def _put_folder(self, target: Target, body: AsyncIterator[bytes]) -> PutResult:
        # NOTE: S3 stores "a/b/" as an object; a directory tree cannot. An empty
        # folder marker (what consoles and some sync tools create) becomes the
        # directory, which lists only once it holds a file; a body is refused.
        async for chunk in body:
            if chunk:
                raise errors.InvalidObjectName(
                    f"A key ending in '/' can only be an empty folder marker here: {target.key!r}"
                )

        def make() -> os.stat_result:
            with _domain_errors(target.key):
                _make_dirs(target.path, target.key)
                return os.stat(target.path)

        st = await asyncio.to_thread(make)
        return PutResult(
            _quoted_md5(hashlib.md5(usedforsecurity=False).digest()), last_modified(st), 0
        )

    def _open_temp(self, target: Target, *, hashing: bool = True) -> tuple[_TempFile, list[str]]:
        """A temp file beside ``target`` and the directories made for it; fails before any body."""
        key = target.key
        with _domain_errors(key):
            if os.path.isdir(target.path):
                raise IsADirectoryError(errno.EISDIR, "Is a directory", target.path)
            for _ in range(3):  # a concurrent delete may prune a directory we just made
                created: list[str] = []
                try:
                    created = _make_dirs(target.parent, key)
                    return _TempFile(target.parent, hashing=hashing), created
                except FileNotFoundError:
                    _remove_dirs(created)
                except BaseException:
                    _remove_dirs(created)
                    raise
            raise errors.OriginUnavailable(f"posix origin: {key!r}'s directory keeps vanishing")

    def _commit(
        self, tmp: _TempFile, target: Target, record: tuple[Records, str, Attrs]
    ) -> os.stat_result:
        with _domain_errors(target.key):
            return tmp.commit(target.path, fsync=self._fsync, record=record)

    def delete(self, target: Target) -> None:
        """Remove the object's directory entry (``posix.py`` checked it is a visible object).

        A folder key removes its directory only if empty. Directories left
        empty are pruned up to, not including, the bucket directory and the
        root's own subdirectories (which may be buckets of other mounts).
        """
        with _domain_errors(target.key):
            try:
                if target.folder:
                    if target.parent == self._root:
                        return  # a top-level directory may be another mount's bucket
                    os.rmdir(target.path)
                else:
                    os.unlink(target.path)  # a symlink: the link, never what it points to
            except OSError as err:
                if err.errno in (errno.ENOENT, errno.ENOTDIR, errno.ENOTEMPTY, errno.EEXIST):
                    return  # gone already, or a non-empty folder: S3 answers 204 anyway
                raise
            self._prune(target.parent, target.top)

    def _prune(self, directory: str, top: str) -> None:
        top_slash = top.rstrip("/") + "/"
        while directory.startswith(top_slash) and os.path.dirname(directory) != self._root:
            try:
                os.rmdir(directory)
            except OSError:
                return  # not empty (or busy): the common case, and the end of the walk
            directory = os.path.dirname(directory)

    # -- multipart

    def create_upload(self, bucket: str, key: str, attrs: Attrs) -> str:
        """Start a staged upload of ``bucket``/``key``; its id."""
        upload_id = secrets.token_urlsafe(24)
        upload_dir = os.path.join(self._staging, upload_id)
        record = {
            "bucket": bucket,
            "key": key,
            "initiated": time.time(),
            "content_type": attrs.content_type,
            "metadata": attrs.metadata,
            "headers": attrs.headers,
        }
        with _domain_errors(key):
            os.makedirs(upload_dir)
            try:
                tmp = _TempFile(upload_dir, hashing=False)
                tmp.write(json.dumps(record).encode())
                tmp.commit(os.path.join(upload_dir, "upload.json"), fsync=self._fsync)
            except BaseException:
                shutil.rmtree(upload_dir, ignore_errors=True)
                raise
        return upload_id

    def _remove_upload(self, upload_dir: str) -> None:
        """Rename the staging directory away, then delete it.

        After the rename the upload is gone at once for everyone: a part still
        being written fails its commit with NoSuchUpload instead of landing in
        a directory that rmtree is emptying. Leftovers of a failed rmtree carry
        a temp name and are removed by ``cleanup_stale_uploads``.
        """
        doomed = os.path.join(self._staging, TEMP_PREFIX + secrets.token_hex(8))
        os.rename(upload_dir, doomed)
        shutil.rmtree(doomed, ignore_errors=True)

    def _upload(self, bucket: str, key: str, upload_id: str) -> tuple[str, dict]:
        """The staging directory and record of an upload of exactly this bucket and key."""
        if not _UPLOAD_ID_RE.fullmatch(upload_id):
            raise NoSuchUpload(upload_id)  # also keeps the id from naming any other path
        upload_dir = os.path.join(self._staging, upload_id)
        try:
            with open(os.path.join(upload_dir, "upload.json"), "rb") as handle:
                record = json.load(handle)
        except (OSError, ValueError) as err:
            raise NoSuchUpload(upload_id) from err
        if record.get("bucket") != bucket or record.get("key") != key:
            raise NoSuchUpload(upload_id)
        return upload_dir, record

    async def upload_part(
        self, bucket: str, key: str, upload_id: str, part_number: int, body: AsyncIterator[bytes]
    ) -> PartInfo:
        """Stage one part (replacing an earlier one of that number); its ETag is its quoted MD5."""
        if not 1 <= part_number <= MAX_PART_NUMBER:
            raise InvalidArgument(f"Part number must be an integer between 1 and {MAX_PART_NUMBER}")
        upload_dir, _ = await asyncio.to_thread(self._upload, bucket, key, upload_id)
        gone = NoSuchUpload(upload_id)

        def open_temp() -> _TempFile:
            with _domain_errors(key, missing=gone):
                return _TempFile(upload_dir, hashing=True)

        tmp = await asyncio.to_thread(open_temp)
        try:
            await _drain(body, tmp)
            assert tmp.md5 is not None
            digest = tmp.md5.digest()
            await asyncio.to_thread(tmp.write, digest + _TRAILER_MAGIC, hashed=False)

            def commit() -> os.stat_result:
                with _domain_errors(key, missing=gone):
                    dest = os.path.join(upload_dir, f"part-{part_number:05d}")
                    return tmp.commit(dest, fsync=self._fsync)

            st = await asyncio.to_thread(commit)
        except BaseException:
            await _undo(tmp, [])
            raise
        return PartInfo(
            part_number, _quoted_md5(digest), st.st_size - _TRAILER_SIZE, last_modified(st)
        )

    def _parts(self, upload_dir: str, upload_id: str) -> dict[int, tuple[str, PartInfo, bytes]]:
        """Staged parts by number: (path, info, digest)."""
        found = {}
        try:
            names = os.listdir(upload_dir)
        except OSError as err:
            raise NoSuchUpload(upload_id) from err
        for name in names:
            match = _PART_RE.fullmatch(name)
            if not match:
                continue  # upload.json, temp files of parts in flight
            path = os.path.join(upload_dir, name)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                continue  # replaced or aborted meanwhile
            try:
                st = os.fstat(fd)
                trailer = _read_trailer(fd, st)
            finally:
                os.close(fd)
            if trailer is not None:
                size, digest = trailer
                number = int(match.group(1))
                info = PartInfo(number, _quoted_md5(digest), size, last_modified(st))
                found[number] = (path, info, digest)
        return found

    def list_parts(self, bucket: str, key: str, upload_id: str) -> list[PartInfo]:
        upload_dir, _ = self._upload(bucket, key, upload_id)
        return [info for _, (_, info, _) in sorted(self._parts(upload_dir, upload_id).items())]

    def _check_parts(
        self, upload_dir: str, upload_id: str, parts: list[tuple[int, str]]
    ) -> list[tuple[str, int, bytes]]:
        """The (path, size, digest) to concatenate, after S3's checks, in S3's order."""
        if not parts:
            raise InvalidPart("You must specify at least one part")
        numbers = [number for number, _ in parts]
        if any(b <= a for a, b in itertools.pairwise(numbers)):
            raise InvalidPartOrder("The list of parts was not in ascending order.")
        staged = self._parts(upload_dir, upload_id)
        chosen = []
        for number, etag in parts:
            found = staged.get(number)
            if found is None or _bare_etag(found[1].etag) != _bare_etag(etag):
                raise InvalidPart(
                    f"Part {number} was not uploaded, or its ETag is not {etag}: "
                    "one or more of the specified parts could not be found."
                )
            chosen.append((found[0], found[1].size, found[2]))
        for number, (_, size, _) in zip(numbers[:-1], chosen[:-1], strict=True):
            if size < MIN_PART_SIZE:
                raise EntityTooSmall(
                    f"Part {number} is {size} bytes: every part but the last must be at least 5 MiB."
                )
        return chosen

    async def complete(
        self, bucket: str, key: str, upload_id: str, parts: list[tuple[int, str]], target: Target
    ) -> PutResult:
        """Concatenate the listed parts into ``target``, atomically; then drop the staging."""
        upload_dir, record = await asyncio.to_thread(self._upload, bucket, key, upload_id)
        chosen = await asyncio.to_thread(self._check_parts, upload_dir, upload_id, parts)
        digests = b"".join(digest for _, _, digest in chosen)
        etag = f'"{hashlib.md5(digests, usedforsecurity=False).hexdigest()}-{len(chosen)}"'
        attrs = Attrs.of(record.get("content_type"), record.get("metadata"), record.get("headers"))
        tmp, created = await asyncio.to_thread(self._open_temp, target, hashing=False)
        gone = NoSuchUpload(upload_id)
        try:
            for path, size, digest in chosen:  # a thread hop per part: cancellable in between

                def append(path: str = path, size: int = size, digest: bytes = digest) -> None:
                    with _domain_errors(key, missing=gone):
                        tmp.append_file(path, size, digest)

                await asyncio.to_thread(append)
            st = await asyncio.to_thread(self._commit, tmp, target, (self._records, etag, attrs))
        except BaseException:
            await _undo(tmp, created)
            raise
        with contextlib.suppress(OSError):  # a concurrent complete or abort got there first
            await asyncio.to_thread(self._remove_upload, upload_dir)
        return PutResult(etag, last_modified(st), st.st_size)

    def abort(self, bucket: str, key: str, upload_id: str) -> None:
        upload_dir, _ = self._upload(bucket, key, upload_id)
        with _domain_errors(key, missing=NoSuchUpload(upload_id)):
            self._remove_upload(upload_dir)

    def list_uploads(self, bucket: str, prefix: str = "") -> list[UploadInfo]:
        """Uploads in progress for ``bucket`` whose key starts with ``prefix``, by key then age."""
        try:
            ids = os.listdir(self._staging)
        except FileNotFoundError:
            return []
        except OSError as err:
            raise errors.OriginUnavailable(f"posix origin: {err.strerror}") from err
        found = []
        for upload_id in ids:
            if not _UPLOAD_ID_RE.fullmatch(upload_id):
                continue
            try:
                with open(os.path.join(self._staging, upload_id, "upload.json"), "rb") as handle:
                    record = json.load(handle)
            except (OSError, ValueError):
                continue  # being created, or finished meanwhile
            key = record.get("key")
            if record.get("bucket") == bucket and isinstance(key, str) and key.startswith(prefix):
                initiated = datetime.fromtimestamp(float(record.get("initiated", 0)), tz=UTC)
                found.append(UploadInfo(key, upload_id, initiated))
        return sorted(found, key=lambda u: (u.key, u.initiated, u.upload_id))

    def cleanup_stale_uploads(self, older_than: float) -> int:
        """Remove staged uploads with no activity for ``older_than`` seconds; how many."""
        try:
            entries = os.listdir(self._staging)
        except FileNotFoundError:
            return 0
        cutoff = time.time() - older_than
        removed = 0
        for name in entries:
            path = os.path.join(self._staging, name)
            if _newest_mtime(path) < cutoff:
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    with contextlib.suppress(OSError):
                        os.unlink(path)
                removed += 1
        return removed


def _newest_mtime(path: str) -> float:
    """The latest mtime of ``path`` and, for a directory, of its entries (a part being written)."""
    try:
        st = os.lstat(path)
        newest = st.st_mtime
        if stat.S_ISDIR(st.st_mode):
            with os.scandir(path) as it:
                for entry in it:
                    with contextlib.suppress(OSError):
                        newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
    except OSError:
        return float("inf")  # vanished: nothing to clean
    return newest
