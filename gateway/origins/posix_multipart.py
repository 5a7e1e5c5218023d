"""Multipart uploads to a posix origin: parts staged as files, completed by one rename.

S3's multipart upload lets a client send an object in numbered parts (up to
10,000, each at least 5 MiB but the last) and then name the ones that make
the object. Here an upload is staged under ``<root>/.hoard-uploads/<upload id>/``:
``upload.json`` (target bucket, key, record attributes, start time) and one
file per part, ``part-00001``, each an atomic temp file (``posix_files.py``)
renamed in. A part file is its bytes followed by a 24-byte trailer (the part's
MD5 digest and a magic tag), so a part and its ETag are committed by one
rename and can never disagree; a part whose trailer changed while an upload
completes is refused (InvalidPart).

Completing checks the list as S3 does (ascending numbers, known ETags, size
minimum), copies the parts into a temp file beside the target
(``copy_file_range``: in the kernel, a reflink on filesystems that have them),
renames it in with the record (``posix_records.py``) and the S3 multipart ETag
``"<md5 of part digests>-<N>"``, then removes the staging directory; aborting
removes it. Removal renames the directory away first, so an upload is gone at
once for a part still being written. ``posix.py`` hides the staging tree from
buckets, keys and listings.

NOT guaranteed:

- Stale staged uploads are removed by :meth:`PosixUploads.cleanup_stale_uploads`,
  when someone calls it; nothing else expires them.
- Completing an upload writes its bytes a second time (staging to target),
  unless the filesystem reflinks.
- Concurrent completes of one upload may both succeed.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import os
import re
import secrets
import shutil
import stat
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime

from gateway.core import errors
from gateway.core.errors import (
    EntityTooSmall,
    InvalidArgument,
    InvalidPart,
    InvalidPartOrder,
    NoSuchUpload,
)
from gateway.origins.base import same_etag
from gateway.origins.posix_files import (
    TEMP_PREFIX,
    Target,
    TempFile,
    commit_to,
    domain_errors,
    drain,
    open_beside,
    quoted_md5,
    undo,
)
from gateway.origins.posix_records import Attrs, Records, last_modified
from gateway.origins.writable import PartInfo, PutResult, UploadInfo

STAGING_DIR = ".hoard-uploads"  # at the root; never a bucket, a key or a prefix

MIN_PART_SIZE = 5 * 1024 * 1024  # S3's minimum for every part but the last

MAX_PART_NUMBER = 10_000

_TRAILER_MAGIC = b"hoardpt1"

_TRAILER_SIZE = 16 + len(_TRAILER_MAGIC)  # MD5 digest + magic

_UPLOAD_ID_RE = re.compile(r"[A-Za-z0-9_-]{16,128}")

_PART_RE = re.compile(r"part-(\d{5})")


class PosixUploads:
    """The multipart uploads of one posix root, staged under ``.hoard-uploads`` (module docstring).

    ``upload_part`` and ``complete`` consume a body and are coroutines; the
    others block and are meant for a worker thread.
    """

    def __init__(self, root: str, records: Records, *, fsync: bool = False) -> None:
        self._staging = os.path.join(root, STAGING_DIR)
        self._records = records
        self._fsync = fsync

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
        with domain_errors(key):
            os.makedirs(upload_dir)
            try:
                tmp = TempFile(upload_dir, hashing=False)
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

        def open_temp() -> TempFile:
            with domain_errors(key, missing=gone):
                return TempFile(upload_dir, hashing=True)

        tmp = await asyncio.to_thread(open_temp)
        try:
            await drain(body, tmp)
            assert tmp.md5 is not None
            digest = tmp.md5.digest()
            await asyncio.to_thread(tmp.write, digest + _TRAILER_MAGIC, hashed=False)

            def commit() -> os.stat_result:
                with domain_errors(key, missing=gone):
                    dest = os.path.join(upload_dir, f"part-{part_number:05d}")
                    return tmp.commit(dest, fsync=self._fsync)

            st = await asyncio.to_thread(commit)
        except BaseException:
            await undo(tmp, [])
            raise
        return PartInfo(
            part_number, quoted_md5(digest), st.st_size - _TRAILER_SIZE, last_modified(st)
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
                info = PartInfo(number, quoted_md5(digest), size, last_modified(st))
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
            if found is None or not same_etag(found[1].etag, etag):
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
        tmp, created = await asyncio.to_thread(open_beside, target, hashing=False)
        gone = NoSuchUpload(upload_id)
        try:
            for path, size, digest in chosen:  # a thread hop per part: cancellable in between

                def append(path: str = path, size: int = size, digest: bytes = digest) -> None:
                    with domain_errors(key, missing=gone):
                        _append_part(tmp, path, size, digest)

                await asyncio.to_thread(append)
            st = await commit_to(
                tmp, target, fsync=self._fsync, record=(self._records, etag, attrs)
            )
        except BaseException:
            await undo(tmp, created)
            raise
        with contextlib.suppress(OSError):  # a concurrent complete or abort got there first
            await asyncio.to_thread(self._remove_upload, upload_dir)
        return PutResult(etag, last_modified(st), st.st_size)

    def abort(self, bucket: str, key: str, upload_id: str) -> None:
        upload_dir, _ = self._upload(bucket, key, upload_id)
        with domain_errors(key, missing=NoSuchUpload(upload_id)):
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


def _read_trailer(fd: int, st: os.stat_result) -> tuple[int, bytes] | None:
    """(payload size, MD5 digest) of a part file, or None if it has no valid trailer."""
    if st.st_size < _TRAILER_SIZE:
        return None
    tail = os.pread(fd, _TRAILER_SIZE, st.st_size - _TRAILER_SIZE)
    if len(tail) != _TRAILER_SIZE or not tail.endswith(_TRAILER_MAGIC):
        return None
    return st.st_size - _TRAILER_SIZE, tail[:16]


def _append_part(tmp: TempFile, path: str, size: int, digest: bytes) -> None:
    """Append a staged part's payload to ``tmp``, if its trailer still carries ``digest``."""
    src = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if _read_trailer(src, os.fstat(src)) != (size, digest):
            raise InvalidPart("A part was replaced while the upload was being completed")
        tmp.append_from(src, size)
    finally:
        os.close(src)


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
