"""A directory (local disk, NFS, Lustre) served as an S3 origin.

Layout: every top-level directory of the root whose name is a valid S3 bucket
name is a bucket, and its files are the bucket's objects, keyed by their path
with ``/`` separators. Bucket ``""`` is the root itself, for a mount that maps
one directory to one gateway bucket. Directories are not objects: S3 has no
empty directories, so a directory shows up only as the common prefix of the
files below it.

Safety comes first, because keys come from clients. A key is checked as text
(no NUL, no empty, ``.`` or ``..`` component, no leading ``/``), then resolved
with ``realpath`` and must stay inside the real path of its bucket's folder
(the root itself for bucket ``""``). Symlinks are followed while they stay in
that folder, so a dataset may link shards to one another; a symlink that
leads out of it (to another bucket, out of the root, into the staging area)
is answered as a missing key by HEAD, GET and ranged GET alike, exactly as
the listing (which neither shows nor descends into it) shows it. A key is
limited to its bucket, so a link must not reach past it. Keys are not
percent-decoded here: the S3 front already did, so ``%2e%2e`` is a literal
file name. Sockets, FIFOs and devices are not objects.

Writes (``posix_write.py``, ``posix_multipart.py``) go to a temp file beside
the destination and are renamed into place; the same key rules apply, and a
key leading out of the root, into the multipart staging area (``.hoard-uploads``
at the root) or onto a reserved temp name is refused. Content-Type, user metadata, representation
headers and the ETag a write returned are stored in an xattr; reads return
them, the ETag only while the file's (size, mtime_ns, inode) are still the
ones it was stored for. The staging area and temp files never show up as
buckets, keys or prefixes.

Every blocking call (stat, scandir, open, read, close) runs in a worker
thread. A GET opens the file once and reads it from that descriptor
(``posix_stream.py``); a listing is a walk of the tree in key order that
stops once the page is full (``posix_walk.py``). The modules beside this one,
each one concept: ``posix_keys.py`` (which keys may name a file),
``posix_records.py`` (the xattr record, ETags and HEAD answers),
``posix_stream.py``, ``posix_walk.py``, ``posix_buckets.py`` (bucket
directories), ``posix_files.py`` (atomic files), ``posix_write.py`` (put,
delete) and ``posix_multipart.py`` (staged uploads). This module is the
origin: it resolves buckets and keys to checked real paths and calls them.

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
- A mount's ``prefix`` is no boundary: a symlink under one prefix may lead to
  a file under another prefix of the same bucket folder. Give a folder that
  must be kept apart a bucket of its own.
- Symlinks are resolved before open and the last component is opened with
  ``O_NOFOLLOW``; someone with write access to the tree who swaps a parent
  directory for a symlink between the two can still race it. Clients cannot
  create symlinks through Hoard.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import os
import stat
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

from gateway.core import errors
from gateway.origins import posix_buckets as buckets
from gateway.origins.base import BucketInfo, ListPage, ObjectInfo
from gateway.origins.listing import paginate
from gateway.origins.posix_buckets import valid_bucket_name
from gateway.origins.posix_files import Target
from gateway.origins.posix_keys import check_key, is_temp, safe_relpath
from gateway.origins.posix_multipart import STAGING_DIR, PosixUploads
from gateway.origins.posix_records import Attrs, Records, object_info
from gateway.origins.posix_stream import Fd, PosixObjectStream, span
from gateway.origins.posix_walk import list_entries
from gateway.origins.posix_write import PosixWriter
from gateway.origins.writable import Capability, PartInfo, PutResult, UploadInfo

_MISSING = frozenset({errno.ENOENT, errno.ENOTDIR, errno.ENAMETOOLONG, errno.ELOOP, errno.EISDIR})
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _os_error(err: OSError, key: str) -> errors.HoardError:
    if err.errno in _MISSING:
        return errors.NoSuchKey(key)
    if err.errno in (errno.EACCES, errno.EPERM):
        return errors.AccessDenied(f"Access denied by the posix origin: {key!r}")
    return errors.OriginUnavailable(f"posix origin: {err.strerror}")


class PosixOrigin:
    """The Origin Protocol over the directory ``root`` (see the module docstring)."""

    def __init__(self, name: str, root: Path, *, fsync: bool = False) -> None:
        """``fsync``: flush every written file and its directory before answering."""
        self.name = name
        self.capability = Capability(writable=self)  # S3 writes as calls of its own API
        # Resolved once, at start-up: every containment check compares real paths.
        self._root = os.path.realpath(root)
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

    def _within(self, real: str, top: str) -> bool:
        """Whether a real path is part of the folder ``top`` (the root or a bucket's
        real directory) and outside the staging area: the one containment rule."""
        if real == self._staging or real.startswith(self._staging + "/"):
            return False
        return real == top or real.startswith(top.rstrip("/") + "/")

    def _bucket_dir(self, bucket: str) -> str:
        if bucket and not valid_bucket_name(bucket):
            raise errors.NoSuchBucket(bucket)
        path = os.path.realpath(os.path.join(self._root, bucket)) if bucket else self._root
        if not self._within(path, self._root) or not os.path.isdir(path):
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
            start, end = span(byte_range, info.size)
        except errors.HoardError:
            fd.close()
            raise
        return PosixObjectStream(fd, info, start, end)

    async def close(self) -> None:
        """Nothing to release: every stream owns its own descriptor."""

    def _resolve(self, bucket: str, key: str) -> str:
        check_key(key)
        top = self._bucket_dir(bucket)
        real = os.path.realpath(os.path.join(top, key))
        if not self._within(real, top):
            raise errors.NoSuchKey(key)  # a symlink leading out of the bucket: as in listings
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
        return object_info(key, st, self._records.read(real, st))

    def _open(self, bucket: str, key: str) -> tuple[Fd, ObjectInfo]:
        # Stat first so that a device or FIFO is never opened at all; O_NONBLOCK
        # and the fstat below cover one being swapped in between.
        real, _ = self._stat(bucket, key)
        try:
            fd = Fd(os.open(real, _OPEN_FLAGS))
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
        return fd, object_info(key, st, self._records.read(fd.fd, st))

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
        within = functools.partial(self._within, top=top)
        entries = list_entries(top, within, self._records, prefix, delimiter, start_after, max_keys)
        return paginate(entries, prefix, delimiter, start_after, max_keys)

    # -- writes: posix_write/posix_multipart do the work, here keys become checked paths

    def _target(self, bucket: str, key: str) -> Target:
        """Where a write of ``key`` lands; refused if it cannot stay in the served tree."""
        folder = key.endswith("/")
        body = key[:-1] if folder else key
        parent_rel, _, name = body.rpartition("/")
        if not safe_relpath(body) or is_temp(name):
            raise errors.InvalidObjectName(f"The key cannot name a file safely: {key!r}")
        top = self._bucket_dir(bucket)
        # realpath resolves the existing part of the parent; what is missing stays
        # literal and is created later, below a directory already checked here.
        parent = os.path.realpath(os.path.join(top, parent_rel)) if parent_rel else top
        if not self._within(parent, top) or not self._within(os.path.join(parent, name), top):
            raise errors.InvalidObjectName(f"The key leads out of the bucket's folder: {key!r}")
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
