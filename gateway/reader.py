"""The read path: namespace → metadata → byte range → origin.

This is the one module that combines the leaves, the way groupcache.go
combines singleflight, hashing and peers. The S3 front calls it with gateway
bucket names and client keys and gets back values (``ObjectInfo``,
``ListPage``) or an ``ObjectRead`` to stream; how the bytes are obtained stays
behind this seam.

Today every read goes to the origin; the block cache plugs in here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from gateway import errors
from gateway.namespace import Mount, Namespace
from gateway.origins.base import BucketInfo, ListPage, ObjectInfo, ObjectStream

Precondition = Callable[[ObjectInfo], None]


@dataclass(frozen=True, slots=True)
class RangeSpec:
    """One HTTP byte range before the object size is known (RFC 9110 §14.1.2).

    ``bytes=a-b`` → first=a, last=b; ``bytes=a-`` → first=a; ``bytes=-n`` → suffix=n.
    """

    first: int | None = None
    last: int | None = None
    suffix: int | None = None

    def resolve(self, size: int) -> tuple[int, int]:
        """The inclusive (start, end) this range selects, or ``RangeNotSatisfiable``."""
        if self.suffix is not None:
            if self.suffix == 0 or size == 0:
                raise errors.RangeNotSatisfiable(size)
            return max(0, size - self.suffix), size - 1
        first = self.first or 0
        if first >= size:
            raise errors.RangeNotSatisfiable(size)
        last = size - 1 if self.last is None else min(self.last, size - 1)
        return first, last


class ObjectRead:
    """An object (or a range of it) being read: metadata first, then bytes.

    The caller must ``aclose()`` it, also when it stops early.
    """

    def __init__(
        self, info: ObjectInfo, start: int, end: int, partial: bool, stream: ObjectStream | None
    ) -> None:
        self.info = info
        self.start = start
        self.end = end
        self.partial = partial
        self._stream = stream

    @property
    def length(self) -> int:
        return self.end - self.start + 1

    async def chunks(self) -> AsyncIterator[bytes]:
        if self._stream is None:
            return
        async for chunk in self._stream.chunks():
            yield chunk

    async def aclose(self) -> None:
        if self._stream is not None:
            stream, self._stream = self._stream, None
            await stream.aclose()


class Reader:
    """Answers reads for gateway buckets."""

    def __init__(self, namespace: Namespace) -> None:
        self.namespace = namespace

    async def list_buckets(self) -> list[BucketInfo]:
        return await self.namespace.list_buckets()

    async def head_bucket(self, bucket: str) -> Mount:
        mount = self.namespace.resolve(bucket)
        await mount.origin.head_bucket(mount.origin_bucket)
        return mount

    async def bucket_region(self, bucket: str) -> str:
        mount = await self.head_bucket(bucket)
        return await mount.origin.bucket_region(mount.origin_bucket)

    async def head_object(self, bucket: str, key: str) -> ObjectInfo:
        mount = self.namespace.resolve(bucket)
        info = await mount.origin.head_object(mount.origin_bucket, mount.origin_key(key))
        return dataclasses.replace(info, key=key)

    async def open_object(
        self,
        bucket: str,
        key: str,
        byte_range: RangeSpec | None = None,
        precondition: Precondition | None = None,
    ) -> ObjectRead:
        """Open ``key`` for reading; ``precondition`` runs on the metadata before any range."""
        mount = self.namespace.resolve(bucket)
        info = await self.head_object(bucket, key)
        if precondition is not None:
            precondition(info)
        start, end = byte_range.resolve(info.size) if byte_range else (0, info.size - 1)
        if info.size == 0:
            return ObjectRead(info, 0, -1, False, None)
        # If-Match pins the version we just described: a concurrent overwrite fails
        # the read instead of mixing old headers with new bytes.
        stream = await mount.origin.get_object(
            mount.origin_bucket, mount.origin_key(key), (start, end), if_match=info.etag
        )
        return ObjectRead(info, start, end, byte_range is not None, stream)

    async def list_objects(
        self,
        bucket: str,
        prefix: str = "",
        delimiter: str = "",
        start_after: str = "",
        max_keys: int = 1000,
    ) -> ListPage:
        mount = self.namespace.resolve(bucket)
        page = await mount.origin.list_objects(
            mount.origin_bucket,
            prefix=mount.origin_key(prefix),
            delimiter=delimiter,
            start_after=mount.origin_key(start_after) if start_after else "",
            max_keys=max_keys,
        )
        return _strip_prefix(page, mount) if mount.prefix else page


def _strip_prefix(page: ListPage, mount: Mount) -> ListPage:
    return ListPage(
        entries=[dataclasses.replace(e, key=mount.client_key(e.key)) for e in page.entries],
        common_prefixes=[mount.client_key(p) for p in page.common_prefixes],
        is_truncated=page.is_truncated,
        next_marker=mount.client_key(page.next_marker) if page.next_marker else None,
    )
