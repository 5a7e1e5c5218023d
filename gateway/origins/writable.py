"""What an origin can be asked to change: raw forwarding (S3) or its own write API (posix).

Hoard serves reads itself and sends every other request to the origin. An
S3 origin takes the request as it came (re-signed, names translated):
``Forwarding``. A directory cannot take S3 requests, so the posix origin
offers the writes S3 clients make as plain calls in origin names, each
returning a value the S3 front answers with: ``Writable``. The writer asks
which of the two a mount's origin is, once per request, and refuses an
operation the origin offers neither way (NotImplemented).

An origin says which it offers by the ``capability`` it holds: the S3
origin ``Capability(forwarding=self)``, the posix origin
``Capability(writable=self)``; an origin that holds none (a test double, a
read-only store) can be read and not changed (``Capability.of``). The guard
(``guard.py``) passes its inner origin's capability on as it is: writes are
neither retried nor hedged (a body is consumed once, and a write is not
idempotent), so they go straight to the origin.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from gateway.origins.base import ObjectInfo
from gateway.origins.s3_forward import ForwardRequest, ForwardResponse


@dataclass(frozen=True, slots=True)
class PutResult:
    """A write stored by an origin's own write API."""

    etag: str  # quoted, as S3 sends it
    last_modified: datetime
    size: int


@dataclass(frozen=True, slots=True)
class PartInfo:
    """One part of a multipart upload in progress."""

    part_number: int
    etag: str
    size: int
    last_modified: datetime


@dataclass(frozen=True, slots=True)
class UploadInfo:
    """A multipart upload in progress."""

    key: str
    upload_id: str
    initiated: datetime


class Forwarding(Protocol):
    async def forward(self, request: ForwardRequest) -> ForwardResponse: ...


class Writable(Protocol):
    """An origin Hoard writes through its own API (the posix origin); names are origin names."""

    async def head_object(self, bucket: str, key: str) -> ObjectInfo: ...
    async def put_object(
        self,
        bucket: str,
        key: str,
        body: AsyncIterator[bytes],
        *,
        content_type: str | None = None,
        metadata: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> PutResult: ...
    async def delete_object(self, bucket: str, key: str) -> None: ...
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
    ) -> PutResult: ...
    async def create_multipart_upload(
        self,
        bucket: str,
        key: str,
        *,
        content_type: str | None = None,
        metadata: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> str: ...
    async def upload_part(
        self, bucket: str, key: str, upload_id: str, part_number: int, body: AsyncIterator[bytes]
    ) -> PartInfo: ...
    async def upload_part_copy(
        self,
        bucket: str,
        key: str,
        upload_id: str,
        part_number: int,
        src_bucket: str,
        src_key: str,
        byte_range: tuple[int, int] | None = None,
    ) -> PartInfo: ...
    async def complete_multipart_upload(
        self, bucket: str, key: str, upload_id: str, parts: list[tuple[int, str]]
    ) -> PutResult: ...
    async def abort_multipart_upload(self, bucket: str, key: str, upload_id: str) -> None: ...
    async def list_parts(self, bucket: str, key: str, upload_id: str) -> list[PartInfo]: ...
    async def list_multipart_uploads(self, bucket: str, prefix: str = "") -> list[UploadInfo]: ...
    async def create_bucket(self, bucket: str) -> bool: ...
    async def delete_bucket(self, bucket: str) -> None: ...


@dataclass(frozen=True, slots=True)
class Capability:
    """How one origin can be changed: the same origin seen as each protocol, or None."""

    forwarding: Forwarding | None = None
    writable: Writable | None = None

    @staticmethod
    def of(origin: object) -> Capability:
        """What ``origin`` declared it can be changed through; nothing: read-only."""
        declared = getattr(origin, "capability", None)
        return declared if isinstance(declared, Capability) else READ_ONLY


READ_ONLY = Capability()
