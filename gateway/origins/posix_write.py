"""Whole-object writes to a posix origin: put and delete, each atomic.

``posix.py`` turns a bucket and key into a checked :class:`Target` (a real
parent directory and a name, never outside the root); the modules beside this
one turn bytes into files there, and know no bucket rules and no key syntax:

- ``posix_files.py``: the atomic file (a temp file beside its name, renamed
  in or removed; the order of a commit; fsync; OSError as S3 errors);
- ``posix_records.py``: the record kept beside the bytes (Content-Type, user
  metadata, representation headers and the ETag, in an xattr);
- ``posix_multipart.py``: multipart uploads, staged as part files;
- this module: PutObject and DeleteObject.

A PUT streams its body into a temp file beside the target while hashing it;
its ETag is the quoted MD5 of the bytes, what S3 clients expect (some SDKs
compare it with the MD5 they computed), and it is stored in the record before
the rename. A key ending in ``/`` is a folder marker and becomes a directory.
A delete removes the directory entry (a symlink's link, never what it points
to) and prunes the directories it left empty, up to the bucket's.

NOT guaranteed:

- Concurrent writes of one key: the last rename wins, as in S3.
- A folder marker with a body is refused: a directory holds no bytes.
- A delete racing a write into the directory it prunes may make that write
  retry its directories (``open_beside`` tries three times).
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os
from collections.abc import AsyncIterator

from gateway.core import errors
from gateway.origins.posix_files import (
    Target,
    commit_to,
    domain_errors,
    drain,
    make_dirs,
    open_beside,
    quoted_md5,
    undo,
)
from gateway.origins.posix_records import Attrs, Records, last_modified
from gateway.origins.writable import PutResult


class PosixWriter:
    """PutObject and DeleteObject under one posix root (see the module docstring).

    ``put`` consumes a body and is a coroutine; ``delete`` blocks and is meant
    for a worker thread.
    """

    def __init__(self, root: str, records: Records, *, fsync: bool = False) -> None:
        self._root = root  # real path
        self._records = records
        self._fsync = fsync

    async def put(self, target: Target, body: AsyncIterator[bytes], attrs: Attrs) -> PutResult:
        """Store ``body`` as ``target``, atomically; raises domain errors only."""
        if target.folder:
            return await self._put_folder(target, body)
        tmp, created = await asyncio.to_thread(open_beside, target)
        try:
            await drain(body, tmp)
            assert tmp.md5 is not None
            etag = quoted_md5(tmp.md5.digest())
            st = await commit_to(
                tmp, target, fsync=self._fsync, record=(self._records, etag, attrs)
            )
        except BaseException:
            await undo(tmp, created)
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
            with domain_errors(target.key):
                make_dirs(target.path, target.key)
                return os.stat(target.path)

        st = await asyncio.to_thread(make)
        return PutResult(
            quoted_md5(hashlib.md5(usedforsecurity=False).digest()), last_modified(st), 0
        )

    def delete(self, target: Target) -> None:
        """Remove the object's directory entry (``posix.py`` checked it is a visible object).

        A folder key removes its directory only if empty. Directories left
        empty are pruned up to, not including, the bucket directory and the
        root's own subdirectories (which may be buckets of other mounts).
        """
        with domain_errors(target.key):
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
