"""An origin held in memory: the ``Origin`` protocol over dicts, for tests and experiments.

A test of the read path wants an origin it can count, hold and change at
will, without a server process or sleeps: this is one. Objects are bytes in
a dict per bucket, with an ``ObjectInfo`` made as S3 makes it (the quoted
MD5 as ETag, whole-second Last-Modified); a listing is the one pure listing
function (``listing.paginate``) over the sorted keys, so it pages, rolls up
and marks exactly as every other origin does. Errors are the domain errors
the real origins raise: ``NoSuchBucket``, ``NoSuchKey``,
``RangeNotSatisfiable``, and ``OriginChanged`` for an ``if_match`` that no
longer names the object.

Two things make it useful to tests beyond a fake store:

- ``calls`` counts every request by S3 operation name (``GetObject``,
  ``HeadObject``, ``ListObjectsV2``...), the way the suite proves caching by
  counting what reaches the origin;
- ``hold`` is an ``asyncio.Event`` every GET, HEAD and LIST waits on before
  answering (set by default), so a test can pile N readers onto one miss,
  see them all waiting, then release the origin: coalescing shown on events,
  not on timing. ``waiting`` says how many requests are held.

Not guaranteed: it is not S3. No versions, no checksums, no multipart, no
writes through the S3 front (it is neither ``Forwarding`` nor ``Writable``:
see ``writable.py``); ``put`` and ``delete`` are for the test's hands only.
One event loop; not thread-safe.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import Counter
from collections.abc import AsyncIterator
from datetime import UTC, datetime

from gateway.core import errors
from gateway.origins.base import BucketInfo, ListEntry, ListPage, ObjectInfo
from gateway.origins.listing import paginate

CHUNK_SIZE = 1 << 20  # largest piece chunks() yields, as the other origins


class MemoryObjectStream:
    """An open GET of ``start..end`` (inclusive) of bytes already in memory."""

    def __init__(self, info: ObjectInfo, data: bytes, start: int, end: int) -> None:
        self.info, self.start, self.end = info, start, end
        self._view = memoryview(data)[start : end + 1]

    async def chunks(self) -> AsyncIterator[bytes]:
        for at in range(0, len(self._view), CHUNK_SIZE):
            yield bytes(self._view[at : at + CHUNK_SIZE])

    async def aclose(self) -> None:
        """Nothing to release: the bytes stay with the origin."""

    async def __aenter__(self) -> MemoryObjectStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class MemoryOrigin:
    """The ``Origin`` protocol over buckets of bytes (see the module docstring)."""

    def __init__(self, name: str = "memory") -> None:
        self.name = name
        self.calls: Counter[str] = Counter()  # requests by S3 operation name
        self.hold = asyncio.Event()
        self.hold.set()
        self.waiting = 0  # requests held at ``hold`` now
        self._buckets: dict[str, dict[str, tuple[bytes, ObjectInfo]]] = {}
        self._created: dict[str, datetime] = {}

    # -- the test's hands -------------------------------------------------------------

    def create_bucket(self, bucket: str) -> None:
        self._buckets.setdefault(bucket, {})
        self._created.setdefault(bucket, _now())

    def put(
        self, bucket: str, key: str, data: bytes, content_type: str = "binary/octet-stream"
    ) -> ObjectInfo:
        """Store ``data`` as ``key`` (making the bucket if needed); its new metadata."""
        self.create_bucket(bucket)
        etag = f'"{hashlib.md5(data, usedforsecurity=False).hexdigest()}"'
        info = ObjectInfo(key, len(data), etag, _now(), content_type)
        self._buckets[bucket][key] = (bytes(data), info)
        return info

    def delete(self, bucket: str, key: str) -> None:
        self._objects(bucket).pop(key, None)

    # -- the Origin protocol ------------------------------------------------------------

    async def list_buckets(self) -> list[BucketInfo]:
        await self._answer("ListBuckets")
        return [BucketInfo(name, self._created[name]) for name in sorted(self._buckets)]

    async def head_bucket(self, bucket: str) -> None:
        await self._answer("HeadBucket")
        self._objects(bucket)

    async def bucket_region(self, bucket: str) -> str:
        await self._answer("GetBucketLocation")
        self._objects(bucket)
        return "us-east-1"

    async def head_object(self, bucket: str, key: str) -> ObjectInfo:
        await self._answer("HeadObject")
        return self._object(bucket, key)[1]

    async def get_object(
        self,
        bucket: str,
        key: str,
        byte_range: tuple[int, int] | None = None,
        if_match: str | None = None,
    ) -> MemoryObjectStream:
        await self._answer("GetObject")
        data, info = self._object(bucket, key)
        if if_match is not None and if_match != info.etag:
            raise errors.OriginChanged(f"{key} changed: ETag {info.etag}, expected {if_match}")
        if byte_range is None:
            return MemoryObjectStream(info, data, 0, info.size - 1)
        start, end = byte_range
        if start < 0 or start > end or start >= info.size:
            raise errors.RangeNotSatisfiable(info.size)
        return MemoryObjectStream(info, data, start, min(end, info.size - 1))

    async def list_objects(
        self,
        bucket: str,
        prefix: str = "",
        delimiter: str = "",
        start_after: str = "",
        max_keys: int = 1000,
    ) -> ListPage:
        await self._answer("ListObjectsV2")
        objects = self._objects(bucket)
        entries = [
            ListEntry(key, info.size, info.etag, info.last_modified)
            for key, (_, info) in sorted(objects.items())
            if key.startswith(prefix)
        ]
        return paginate(entries, prefix, delimiter, start_after, max_keys)

    async def close(self) -> None:
        """Nothing to release."""

    # -- inside ---------------------------------------------------------------------------

    async def _answer(self, operation: str) -> None:
        """Count the request, then wait until the test lets the origin answer."""
        self.calls[operation] += 1
        if self.hold.is_set():
            return
        self.waiting += 1
        try:
            await self.hold.wait()
        finally:
            self.waiting -= 1

    def _objects(self, bucket: str) -> dict[str, tuple[bytes, ObjectInfo]]:
        objects = self._buckets.get(bucket)
        if objects is None:
            raise errors.NoSuchBucket(bucket)
        return objects

    def _object(self, bucket: str, key: str) -> tuple[bytes, ObjectInfo]:
        found = self._objects(bucket).get(key)
        if found is None:
            raise errors.NoSuchKey(key)
        return found


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)
