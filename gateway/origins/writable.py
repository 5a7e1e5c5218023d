"""What an origin can be asked to change: raw forwarding (S3) or its own write API (posix).

Hoard serves reads itself and sends every other request to the origin. An
S3 origin takes the request as it came (re-signed, names translated):
``Forwarding``. A directory cannot take S3 requests, so the posix origin
offers the writes S3 clients make as plain calls in origin names, each
returning a value the S3 front answers with: ``Writable``. The writer asks
which of the two a mount's origin is, once per request, and refuses an
operation the origin offers neither way (NotImplemented).

Both are structural protocols checked at run time (``isinstance``), so an
origin wrapped in the guard (``guard.py``) is seen through it. The check is
made once per origin, when the writer is built (``Capability.of``), not on
every request: through the guard, each ``isinstance`` asks for every method
of the protocol.

Not guaranteed: ``isinstance`` on a runtime protocol checks that the methods
exist, not their signatures.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from gateway.origins.base import ObjectInfo
from gateway.origins.posix_files import PutResult
from gateway.origins.posix_multipart import PartInfo, UploadInfo
from gateway.origins.s3_forward import ForwardRequest, ForwardResponse


@runtime_checkable
class Forwarding(Protocol):
    async def forward(self, request: ForwardRequest) -> ForwardResponse: ...


@runtime_checkable
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

    forwarding: Forwarding | None
    writable: Writable | None

    @classmethod
    def of(cls, origin: object) -> Capability:
        return cls(
            origin if isinstance(origin, Forwarding) else None,
            origin if isinstance(origin, Writable) else None,
        )
