"""A directory (local disk, NFS, Lustre) served as an S3 origin.

Layout: every top-level directory of the root whose name is a valid S3 bucket
name is a bucket, and its files are the bucket's objects, keyed by their path
with ``/`` separators. Bucket ``""`` is the root itself, for a mount that maps
one directory to one gateway bucket. Directories are not objects: S3 has no
empty directories, so a directory shows up only as the common prefix of the
files below it.

Safety comes first, because keys come from clients. A key is checked as text
(no NUL, no empty, ``.`` or ``..`` component, no leading ``/``), then resolved
with ``realpath`` and must stay inside the root's real path; a symlink that
leads out is answered as a missing key, exactly as the listing (which skips
it) shows it. Keys are not percent-decoded here: the S3 front already did, so
``%2e%2e`` is a literal file name. Sockets, FIFOs and devices are not objects.

Writes (``posix_write.py``, ``posix_multipart.py``) go to a temp file beside
the destination and are renamed into place; the same key rules apply, and a
key leading out of the root, into the multipart staging area (``.hoard-uploads``
at the root) or onto a reserved temp name is refused. Content-Type, user metadata, representation
headers and the ETag a write returned are stored in an xattr; reads return
them, the ETag only while the file's (size, mtime_ns, inode) are still the
ones it was stored for. The staging area and temp files never show up as
buckets, keys or prefixes.

Every blocking call (stat, scandir, open, read, close) runs in a worker
thread. A GET opens the file once and reads it with ``pread`` in 1 MiB chunks
from that descriptor, so memory stays flat and a rename during the read does
not mix two files. A listing walks the tree in key order, only below the
deepest directory the prefix names, skips subtrees before ``start_after``,
does not descend into directories that roll up into a common prefix (it only
checks they hold a file, when the page reaches them), stats only the files
that land on the page, and stops once the page is full.

NOT guaranteed:

- For files not written through Hoard (or changed since), the ETag fingerprints
  (size, mtime_ns, inode), not the content: a ``touch`` changes it (a needless
  refetch), and an in-place rewrite that restores size and mtime keeps it (a
  stale cache).
- A file rewritten in place while it is read may deliver mixed bytes; only
  replacement by rename is safe. ``if_match`` is checked once, at open.
- Files without a stored record (not written through Hoard, or a filesystem
  without user xattrs) have no metadata and a content type guessed from the name.
- A listing is a walk, not a snapshot: concurrent changes may or may not show.
- Names that are not valid UTF-8 cannot be S3 keys and are invisible.
- Symlinks are resolved before open and the last component is opened with
  ``O_NOFOLLOW``; someone with write access to the tree who swaps a parent
  directory for a symlink between the two can still race it. Clients cannot
  create symlinks through Hoard.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import mimetypes
import os
import stat
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from gateway import errors
from gateway.origins import posix_buckets as buckets
from gateway.origins.base import BucketInfo, ListEntry, ListPage, ObjectInfo
from gateway.origins.listing import common_prefix, paginate, prefix_end
from gateway.origins.posix_buckets import valid_bucket_name
from gateway.origins.posix_files import TEMP_PREFIX, PutResult, Target
from gateway.origins.posix_multipart import STAGING_DIR, PartInfo, PosixUploads, UploadInfo
from gateway.origins.posix_records import Attrs, Record, Records
from gateway.origins.posix_write import PosixWriter

CHUNK_SIZE = 1 << 20
_EPOCH = datetime.fromtimestamp(0, tz=UTC)
_MISSING = frozenset({errno.ENOENT, errno.ENOTDIR, errno.ENAMETOOLONG, errno.ELOOP, errno.EISDIR})
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _utf8(text: str) -> bool:
    # scandir smuggles undecodable bytes in as lone surrogates; those are no S3 key.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _safe_relpath(rel: str) -> bool:
    """Whether ``rel`` names a path strictly below a directory, with no tricks."""
    if not rel or "\0" in rel or not _utf8(rel):
        return False
    return all(part not in ("", ".", "..") for part in rel.split("/"))


def _check_key(key: str) -> None:
    body = key[:-1] if key.endswith("/") else key
    if not _safe_relpath(body):
        raise errors.InvalidObjectName(f"The key cannot name a file safely: {key!r}")
    if key.endswith("/"):
        raise errors.NoSuchKey(key)  # a "folder" key: directories are not objects
    if _is_temp(body.rpartition("/")[2]):
        raise errors.NoSuchKey(key)  # a write in progress (or a crashed one's leftover)


def _is_temp(name: str) -> bool:
    return name.startswith(TEMP_PREFIX)


def _os_error(err: OSError, key: str) -> errors.HoardError:
    if err.errno in _MISSING:
        return errors.NoSuchKey(key)
    if err.errno in (errno.EACCES, errno.EPERM):
        return errors.AccessDenied(f"Access denied by the posix origin: {key!r}")
    return errors.OriginUnavailable(f"posix origin: {err.strerror}")


def etag_of(st: os.stat_result) -> str:
    """A quoted, MD5-shaped fingerprint of (size, mtime_ns, inode); some clients parse ETags."""
    material = f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}".encode()
    return '"' + hashlib.blake2b(material, digest_size=16).hexdigest() + '"'


def _mtime(st: os.stat_result) -> datetime:
    # Whole seconds: HTTP dates carry no more, and If-Modified-Since compares them.
    return datetime.fromtimestamp(st.st_mtime_ns // 1_000_000_000, tz=UTC)


def _content_type(key: str) -> str:
    kind, encoding = mimetypes.guess_type(key.rsplit("/", 1)[-1], strict=False)
    # "x.csv.gz" guesses text/csv + gzip. The bytes are gzip, and sending
    # Content-Encoding would make HTTP clients inflate them: treat as opaque.
    return kind if kind and not encoding else "binary/octet-stream"


def _info(key: str, st: os.stat_result, record: Record | None) -> ObjectInfo:
    if record is None:
        return ObjectInfo(key, st.st_size, etag_of(st), _mtime(st), _content_type(key))
    return ObjectInfo(
        key,
        st.st_size,
        record.etag_for(st) or etag_of(st),
        _mtime(st),
        record.attrs.content_type or _content_type(key),
        metadata=dict(record.attrs.metadata),
        headers=dict(record.attrs.headers),
    )


def _span(byte_range: tuple[int, int] | None, size: int) -> tuple[int, int]:
    if byte_range is None:
        return 0, size - 1
    start, end = byte_range
    if start < 0 or start > end or start >= size:
        raise errors.RangeNotSatisfiable(size)
    return start, min(end, size - 1)


class _Fd:
    """A descriptor read by worker threads and closed once.

    The lock makes close wait for a ``pread`` in flight: closing under it would
    free the number for another open, and the pread would read that file.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._lock = threading.Lock()
        # Also closes it when dropped unclosed: a stream never aclose()d, or an
        # open whose caller was cancelled while the worker thread finished it.
        self._close = weakref.finalize(self, os.close, fd)

    @property
    def closed(self) -> bool:
        return not self._close.alive

    def pread(self, size: int, offset: int) -> bytes:
        with self._lock:
            if self.closed:
                raise ValueError("read from a closed stream")
            return os.pread(self.fd, size, offset)

    def close(self) -> None:
        with self._lock:
            self._close()


class PosixObjectStream:
    """An open file delivering ``start..end`` (inclusive) in chunks of at most 1 MiB."""

    def __init__(self, fd: _Fd, info: ObjectInfo, start: int, end: int) -> None:
        self.info, self.start, self.end = info, start, end
        self._fd = fd

    async def chunks(self) -> AsyncIterator[bytes]:
        pos = self.start
        while pos <= self.end:
            want = min(CHUNK_SIZE, self.end + 1 - pos)
            data = await asyncio.to_thread(self._fd.pread, want, pos)
            if not data:
                raise errors.OriginChanged(f"{self.info.key} shrank while being read")
            pos += len(data)
            yield data

    async def aclose(self) -> None:
        if not self._fd.closed:
            await asyncio.to_thread(self._fd.close)

    async def __aenter__(self) -> PosixObjectStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


@dataclass(frozen=True, slots=True)
class _Node:
    key: str  # a file's key, or a directory's key prefix ending in "/"
    path: str  # real path (symlinks resolved)
    is_dir: bool


class PosixOrigin:
    """The Origin Protocol over the directory ``root`` (see the module docstring)."""

    def __init__(self, name: str, root: Path, *, fsync: bool = False) -> None:
        """``fsync``: flush every written file and its directory before answering."""
        self.name = name
        # Resolved once, at start-up: every containment check compares real paths.
        self._root = os.path.realpath(root)
        self._root_slash = self._root.rstrip("/") + "/"
        self._staging = os.path.join(self._root, STAGING_DIR)
        self._records = Records()
        self._writer = PosixWriter(self._root, self._records, fsync=fsync)
        self._uploads = PosixUploads(self._root, self._records, fsync=fsync)

    async def list_buckets(self) -> list[BucketInfo]:
        return await asyncio.to_thread(self._buckets)

    async def head_bucket(self, bucket: str) -> None:
        await asyncio.to_thread(self._bucket_dir, bucket)

    async def bucket_region(self, bucket: str) -> str:
        await self.head_bucket(bucket)
        return "us-east-1"

    async def create_bucket(self, bucket: str) -> bool:
        """Make ``bucket``'s directory; False if the bucket was already there.

        Raises InvalidBucketName, BucketAlreadyExists (the name is a file, or
        a symlink leading out of the tree) or AccessDenied.
        """
        return await asyncio.to_thread(buckets.create, self._root, bucket, self._bucket_dir)

    async def delete_bucket(self, bucket: str) -> None:
        """Remove ``bucket``'s directory and the empty directories under it.

        Raises NoSuchBucket, BucketNotEmpty (it holds a file, a symlink, or a
        write in progress: S3 has no empty directories, so only those count),
        or AccessDenied.
        """
        await asyncio.to_thread(buckets.delete, self._root, bucket, self._bucket_dir)

    def _within(self, real: str) -> bool:
        """Whether a real path is part of the served tree: inside the root, outside the staging."""
        if real == self._staging or real.startswith(self._staging + "/"):
            return False
        return real == self._root or real.startswith(self._root_slash)

    def _bucket_dir(self, bucket: str) -> str:
        if bucket and not valid_bucket_name(bucket):
            raise errors.NoSuchBucket(bucket)
        path = os.path.realpath(os.path.join(self._root, bucket)) if bucket else self._root
        if not self._within(path) or not os.path.isdir(path):
            raise errors.NoSuchBucket(bucket)
        return path

    def _buckets(self) -> list[BucketInfo]:
        try:
            with os.scandir(self._root) as it:
                names = sorted(entry.name for entry in it)
        except OSError as err:
            raise errors.OriginUnavailable(f"posix origin root unreadable: {err.strerror}") from err
        found = []
        for name in filter(valid_bucket_name, names):
            try:
                created = os.stat(self._bucket_dir(name)).st_ctime
            except (errors.NoSuchBucket, OSError):
                continue  # not a directory, leads out of the root, or just vanished
            found.append(BucketInfo(name, datetime.fromtimestamp(created, tz=UTC)))
        return found

    async def head_object(self, bucket: str, key: str) -> ObjectInfo:
        return await asyncio.to_thread(self._head, bucket, key)

    async def get_object(
        self,
        bucket: str,
        key: str,
        byte_range: tuple[int, int] | None = None,
        if_match: str | None = None,
    ) -> PosixObjectStream:
        fd, info = await asyncio.to_thread(self._open, bucket, key)
        try:
            if if_match is not None and if_match != info.etag:
                raise errors.OriginChanged(f"{key} changed: ETag {info.etag}, expected {if_match}")
            start, end = _span(byte_range, info.size)
        except errors.HoardError:
            fd.close()
            raise
        return PosixObjectStream(fd, info, start, end)

    async def close(self) -> None:
        """Nothing to release: every stream owns its own descriptor."""

    def _resolve(self, bucket: str, key: str) -> str:
        _check_key(key)
        real = os.path.realpath(os.path.join(self._bucket_dir(bucket), key))
        if not self._within(real):
            raise errors.NoSuchKey(
                key
            )  # a symlink leading out of the root: invisible, as in listings
        return real

    def _stat(self, bucket: str, key: str) -> tuple[str, os.stat_result]:
        real = self._resolve(bucket, key)
        try:
            st = os.stat(real)
        except OSError as err:
            raise _os_error(err, key) from err
        if not stat.S_ISREG(st.st_mode):
            raise errors.NoSuchKey(key)  # directories, sockets, FIFOs, devices
        return real, st

    def _head(self, bucket: str, key: str) -> ObjectInfo:
        real, st = self._stat(bucket, key)
        return _info(key, st, self._records.read(real, st))

    def _open(self, bucket: str, key: str) -> tuple[_Fd, ObjectInfo]:
        # Stat first so that a device or FIFO is never opened at all; O_NONBLOCK
        # and the fstat below cover one being swapped in between.
        real, _ = self._stat(bucket, key)
        try:
            fd = _Fd(os.open(real, _OPEN_FLAGS))
        except OSError as err:
            raise _os_error(err, key) from err
        try:
            st = os.fstat(fd.fd)
        except OSError as err:
            fd.close()
            raise _os_error(err, key) from err
        if not stat.S_ISREG(st.st_mode):
            fd.close()
            raise errors.NoSuchKey(key)
        # The descriptor's own stat, so the ETag names exactly the bytes we will read.
        return fd, _info(key, st, self._records.read(fd.fd, st))

    async def list_objects(
        self,
        bucket: str,
        prefix: str = "",
        delimiter: str = "",
        start_after: str = "",
        max_keys: int = 1000,
    ) -> ListPage:
        return await asyncio.to_thread(self._list, bucket, prefix, delimiter, start_after, max_keys)

    def _list(
        self, bucket: str, prefix: str, delimiter: str, start_after: str, max_keys: int
    ) -> ListPage:
        top = self._bucket_dir(bucket)
        walk = _Walk(self._within, self._records, prefix, delimiter, start_after)
        base_rel, _, partial = prefix.rpartition("/")
        entries: list[ListEntry] = []
        if base_rel == "" or _safe_relpath(base_rel):  # else no key can start with prefix
            base = os.path.realpath(os.path.join(top, base_rel)) if base_rel else top
            if self._within(base) and max_keys > 0:
                base_key = base_rel + "/" if base_rel else ""
                entries = walk.collect(walk.nodes(base, base_key, partial, (base,)), max_keys)
        return paginate(entries, prefix, delimiter, start_after, max_keys)

    # -- writes: posix_write/posix_multipart do the work, here keys become checked paths

    def _target(self, bucket: str, key: str) -> Target:
        """Where a write of ``key`` lands; refused if it cannot stay in the served tree."""
        folder = key.endswith("/")
        body = key[:-1] if folder else key
        parent_rel, _, name = body.rpartition("/")
        if not _safe_relpath(body) or _is_temp(name):
            raise errors.InvalidObjectName(f"The key cannot name a file safely: {key!r}")
        top = self._bucket_dir(bucket)
        # realpath resolves the existing part of the parent; what is missing stays
        # literal and is created later, below a directory already checked here.
        parent = os.path.realpath(os.path.join(top, parent_rel)) if parent_rel else top
        if not self._within(parent) or not self._within(os.path.join(parent, name)):
            raise errors.InvalidObjectName(f"The key leads out of the origin's tree: {key!r}")
        return Target(key, top, parent, name, folder)

    async def put_object(
        self,
        bucket: str,
        key: str,
        body: AsyncIterator[bytes],
        *,
        content_type: str | None = None,
        metadata: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> PutResult:
        """Store ``body`` (decoded bytes) as ``key``, atomically; the old object stays if it fails.

        A key ending in ``/`` with an empty body makes a directory (see posix_write).
        Raises NoSuchBucket, InvalidObjectName (unsafe key, a parent is a file,
        a directory has the name), AccessDenied, OriginUnavailable, or whatever
        the body raises.
        """
        target = await asyncio.to_thread(self._target, bucket, key)
        return await self._writer.put(target, body, Attrs.of(content_type, metadata, headers))

    async def delete_object(self, bucket: str, key: str) -> None:
        """Remove ``key`` if it is an object; a missing key (or a directory) is no error."""
        await asyncio.to_thread(self._delete, bucket, key)

    def _delete(self, bucket: str, key: str) -> None:
        if not key.endswith("/"):
            try:
                self._stat(bucket, key)  # only what HEAD shows as an object is deleted
            except errors.NoSuchKey:
                return  # also a symlink leading out, or into the staging area
        self._writer.delete(self._target(bucket, key))

    async def copy_object(
        self,
        src_bucket: str,
        src_key: str,
        dst_bucket: str,
        dst_key: str,
        *,
        replace_metadata: bool = False,
        content_type: str | None = None,
        metadata: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> PutResult:
        """Copy an object (streamed: a GET into a PUT). COPY keeps the source's
        Content-Type, metadata and headers; ``replace_metadata`` uses the given ones."""
        target = await asyncio.to_thread(self._target, dst_bucket, dst_key)
        async with await self.get_object(src_bucket, src_key) as source:
            info = source.info
            attrs = (
                Attrs.of(content_type, metadata, headers)
                if replace_metadata
                else Attrs.of(info.content_type, info.metadata, info.headers)
            )
            return await self._writer.put(target, source.chunks(), attrs)

    async def create_multipart_upload(
        self,
        bucket: str,
        key: str,
        *,
        content_type: str | None = None,
        metadata: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> str:
        """Start a multipart upload of ``key``; its upload id."""
        attrs = Attrs.of(content_type, metadata, headers)

        def create() -> str:
            if self._target(bucket, key).folder:
                raise errors.InvalidObjectName(f"A folder key cannot be uploaded: {key!r}")
            return self._uploads.create_upload(bucket, key, attrs)

        return await asyncio.to_thread(create)

    async def upload_part(
        self, bucket: str, key: str, upload_id: str, part_number: int, body: AsyncIterator[bytes]
    ) -> PartInfo:
        """Stage a part; its ETag is the quoted MD5 of its bytes, as in S3."""
        return await self._uploads.upload_part(bucket, key, upload_id, part_number, body)

    async def upload_part_copy(
        self,
        bucket: str,
        key: str,
        upload_id: str,
        part_number: int,
        src_bucket: str,
        src_key: str,
        byte_range: tuple[int, int] | None = None,
    ) -> PartInfo:
        """Stage a part from (an inclusive ``byte_range`` of) another object."""
        async with await self.get_object(src_bucket, src_key, byte_range) as source:
            return await self._uploads.upload_part(
                bucket, key, upload_id, part_number, source.chunks()
            )

    async def complete_multipart_upload(
        self, bucket: str, key: str, upload_id: str, parts: list[tuple[int, str]]
    ) -> PutResult:
        """Join the listed ``(part number, ETag)`` parts into the object.

        Raises InvalidPartOrder, InvalidPart, EntityTooSmall, NoSuchUpload (posix_multipart).
        """
        target = await asyncio.to_thread(self._target, bucket, key)
        return await self._uploads.complete(bucket, key, upload_id, parts, target)

    async def abort_multipart_upload(self, bucket: str, key: str, upload_id: str) -> None:
        await asyncio.to_thread(self._uploads.abort, bucket, key, upload_id)

    async def list_parts(self, bucket: str, key: str, upload_id: str) -> list[PartInfo]:
        return await asyncio.to_thread(self._uploads.list_parts, bucket, key, upload_id)

    async def list_multipart_uploads(self, bucket: str, prefix: str = "") -> list[UploadInfo]:
        def uploads() -> list[UploadInfo]:
            self._bucket_dir(bucket)
            return self._uploads.list_uploads(bucket, prefix)

        return await asyncio.to_thread(uploads)

    async def cleanup_stale_uploads(self, older_than: float) -> int:
        """Remove staged uploads idle for ``older_than`` seconds; how many were removed."""
        return await asyncio.to_thread(self._uploads.cleanup_stale_uploads, older_than)


class _Walk:
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

    def collect(self, nodes: Iterator[_Node], max_keys: int) -> list[ListEntry]:
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
    ) -> Iterator[_Node]:
        for node in self._children(path, key, name_prefix):
            if not node.is_dir:
                if node.key > self.start_after:
                    yield node
            elif self._before_marker(node) or _in_cycle(node.path, stack):
                continue  # a symlink loop is cut where it is found, delimiter or not
            elif common_prefix(node.key, self.prefix, self.delimiter) is not None:
                yield node  # all of it rolls into one common prefix: do not descend
            else:
                yield from self.nodes(node.path, node.key, "", (*stack, node.path))

    def _before_marker(self, node: _Node) -> bool:
        """Whether every key below the directory ``node`` sorts at or before the marker."""
        end = prefix_end(node.key)
        return end is not None and end <= self.start_after

    def _has_file(self, path: str, stack: tuple[str, ...]) -> bool:
        for node in self._children(path, "", ""):
            if not node.is_dir:
                return True
            if not _in_cycle(node.path, stack) and self._has_file(node.path, (*stack, node.path)):
                return True
        return False

    def _children(self, path: str, key: str, name_prefix: str) -> list[_Node]:
        """A directory's listable entries in key order; none if it vanished or is unreadable."""
        try:
            with os.scandir(path) as it:
                found = [
                    self._node(entry, key)
                    for entry in it
                    if entry.name.startswith(name_prefix) and _utf8(entry.name)
                ]
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            return []
        except OSError as err:
            raise errors.OriginUnavailable(f"posix origin: {err.strerror}") from err
        return sorted((node for node in found if node is not None), key=lambda n: n.key)

    def _node(self, entry: os.DirEntry[str], key: str) -> _Node | None:
        try:
            if entry.is_symlink():
                path = os.path.realpath(entry.path)
                if not self._within(path):
                    return None  # leads out of the root
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
        if is_file and _is_temp(entry.name):
            return None  # a write in progress
        if is_dir:
            return _Node(key + entry.name + "/", path, True)
        return _Node(key + entry.name, path, False) if is_file else None

    def _entry(self, node: _Node) -> ListEntry | None:
        try:
            st = os.stat(node.path)
        except OSError:
            return None  # deleted since the scan
        if not stat.S_ISREG(st.st_mode):
            return None
        record = self._records.read(node.path, st)
        etag = (record and record.etag_for(st)) or etag_of(st)
        return ListEntry(node.key, st.st_size, etag, _mtime(st))


def _in_cycle(path: str, stack: tuple[str, ...]) -> bool:
    """Whether descending into ``path`` re-enters a directory being walked (symlink loop)."""
    return any(s == path or s.startswith(path.rstrip("/") + "/") for s in stack)
