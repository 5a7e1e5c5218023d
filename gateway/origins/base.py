"""The one interface every origin implements, and the values that cross it.

An origin is a real store (an S3 endpoint, a posix directory). It knows
nothing of clients, caching or HTTP status codes: it answers in these value
types and raises only ``gateway.core.errors``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class BucketInfo:
    name: str
    created: datetime


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What a HEAD tells about an object.

    ``etag`` keeps its quotes, as S3 sends it (``"9b2c..."``), so it can be
    compared with If-Match values and echoed without reformatting.
    ``headers`` holds the stored representation headers that S3 returns on
    GET/HEAD (Content-Encoding, Cache-Control, ...) under their canonical names.
    """

    key: str
    size: int
    etag: str
    last_modified: datetime
    content_type: str = "binary/octet-stream"
    metadata: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    storage_class: str = "STANDARD"
    version_id: str | None = None


def same_etag(one: str, other: str) -> bool:
    """Whether two ETags name the same version, quoted or not, in any case of hex."""
    return _bare(one) == _bare(other)


def _bare(etag: str) -> str:
    return etag.strip().strip('"').lower()


@dataclass(frozen=True, slots=True)
class ListEntry:
    """One key of a listing (the <Contents> element).

    ``checksum_algorithms`` and ``owner`` are what an S3 origin reports
    (``ChecksumAlgorithm``, ``Owner`` as (ID, DisplayName)); a posix origin has neither.
    """

    key: str
    size: int
    etag: str
    last_modified: datetime
    storage_class: str = "STANDARD"
    checksum_algorithms: tuple[str, ...] = ()
    owner: tuple[str, str] | None = None


@dataclass(frozen=True, slots=True)
class ListPage:
    """One page of a listing, already rolled up by delimiter.

    ``next_marker`` is the last key or common prefix on the page; a caller asks
    for the next page by passing it back as ``start_after``. A common prefix
    used as a marker skips every key that rolls up into it.
    """

    entries: list[ListEntry]
    common_prefixes: list[str]
    is_truncated: bool
    next_marker: str | None


class ObjectStream(Protocol):
    """An open GET: its metadata, then its bytes in bounded chunks.

    ``start``/``end`` are the inclusive byte range being delivered. Always
    ``aclose()`` it (or use ``async with``), also when abandoning it early: an
    unclosed stream holds an origin connection.
    """

    info: ObjectInfo
    start: int
    end: int

    def chunks(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...

    async def __aenter__(self) -> ObjectStream: ...

    async def __aexit__(self, *exc: object) -> None: ...


@runtime_checkable
class Origin(Protocol):
    """A store Hoard reads from. ``bucket`` is the origin's own bucket name.

    ``get_object`` takes an inclusive ``(start, end)`` range already resolved
    against the object size, or ``None`` for the whole object; ``if_match``
    makes the origin refuse (``OriginChanged``) if the ETag moved.
    """

    name: str

    async def list_buckets(self) -> list[BucketInfo]: ...

    async def head_bucket(self, bucket: str) -> None: ...

    async def bucket_region(self, bucket: str) -> str: ...

    async def head_object(self, bucket: str, key: str) -> ObjectInfo: ...

    async def get_object(
        self,
        bucket: str,
        key: str,
        byte_range: tuple[int, int] | None = None,
        if_match: str | None = None,
    ) -> ObjectStream: ...

    async def list_objects(
        self,
        bucket: str,
        prefix: str = "",
        delimiter: str = "",
        start_after: str = "",
        max_keys: int = 1000,
    ) -> ListPage: ...

    async def close(self) -> None: ...
