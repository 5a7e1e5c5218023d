"""The write path: send a mutation to the origin, then invalidate what it touched.

Hoard serves reads itself; every other S3 request (writes, multipart, copies,
deletes, tagging, ACLs, versioning, bucket configuration…) goes to the origin
that owns the bucket, re-signed with the origin's credentials and streamed
both ways, and is answered with the origin's status, headers and body. Names
are translated on the way (gateway bucket → origin bucket, key → mount prefix
+ key, ``x-amz-copy-source``), and after a successful mutation the key's
metadata, its listings and its blocks are dropped *before* the client sees
the answer, so a read after a write through Hoard sees the new state.

An origin that takes no raw forwarding (posix) is written through its own
write API instead (``put_object``, ``copy_object``, the multipart calls…):
``forwards`` tells the S3 front which of the two a bucket takes, and the
methods below the forwarder take gateway names, translate them exactly as
the forwarder does, and return plain values (``PutResult``, ``PartInfo``,
``UploadInfo``) for ``s3/writes.py`` to answer with. Read-only mounts are
refused before a byte of a body is read; invalidation follows each success.

Write-through (``through.py``): the bytes of a PutObject (up to the
mount's ``write_through_max``) are teed off as they stream to the origin and,
after the origin's 2xx and the invalidation, handed to the read path in the
background. Which of the two ways an origin is written is its capability
(``origins/writable.py``).

Not guaranteed: XML answers that name keys (ListParts, ListMultipartUploads,
ListObjectVersions) are passed as the origin wrote them, so under a mount
with a key prefix they show origin keys (the posix path translates them);
a copy between two different origins is refused (NotImplemented). Write
conditions (If-Match, If-None-Match, x-amz-copy-source-if-*) on a posix
origin are checked with a HEAD just before the write: a concurrent writer
can slip in between.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable, Mapping
from urllib.parse import quote, unquote

from gateway.coherence.invalidator import Invalidator
from gateway.core import errors
from gateway.core.invalidation import Broadcast
from gateway.origins.base import ObjectInfo
from gateway.origins.namespace import Mount, Namespace
from gateway.origins.s3_forward import ForwardRequest, ForwardResponse
from gateway.origins.writable import Capability, PartInfo, PutResult, UploadInfo, Writable
from gateway.write.capture import Budget, Capture
from gateway.write.through import WriteThroughs

__all__ = ["Budget", "Capture", "ForwardResponse", "PartInfo", "PutResult", "UploadInfo", "Writer"]


# Called with the object a write would replace (None if there is none); raises to refuse.
WriteCheck = Callable[[ObjectInfo | None], None]
# Called with the source of a copy; raises to refuse.
SourceCheck = Callable[[ObjectInfo], None]

# Query parameters that name keys and so carry the mount prefix at the origin.
_KEY_PARAMETERS = ("prefix", "key-marker", "marker", "start-after")


@dataclasses.dataclass(frozen=True, slots=True)
class Attributes:
    """What a write stores beside the bytes: Content-Type, user metadata, representation headers."""

    content_type: str | None = None
    metadata: dict[str, str] = dataclasses.field(default_factory=dict)  # without x-amz-meta-
    headers: dict[str, str] = dataclasses.field(default_factory=dict)

    def kwargs(self) -> dict[str, object]:
        return {
            "content_type": self.content_type,
            "metadata": self.metadata,
            "headers": self.headers,
        }


class Writer:
    """Sends writes to their origins and has ``coherence`` forget what they touched."""

    def __init__(
        self,
        namespace: Namespace,
        coherence: Invalidator,
        write_throughs: WriteThroughs,
        broadcast: Broadcast | None = None,
    ) -> None:
        self.namespace = namespace
        self._coherence = coherence
        self._broadcast = broadcast  # a cluster: tell the other nodes, bounded wait
        self.write_throughs = write_throughs
        self.budget = self.write_throughs.budget

    async def settle(self) -> None:
        """Wait until the write-throughs under way have ended."""
        await self.write_throughs.settle()

    async def close(self) -> None:
        """Stop the write-throughs under way (at shutdown)."""
        await self.write_throughs.close()

    async def forward(
        self,
        *,
        method: str,
        bucket: str,
        key: str | None,
        query: list[tuple[str, str]],
        headers: Mapping[str, str],
        body: AsyncIterator[bytes] | None,
        content_length: int | None,
        mutating: bool,
        touched_keys: list[str] | None = None,
        write_through: bool = False,
    ) -> ForwardResponse:
        """Send one request to the origin of ``bucket``; invalidate on success.

        ``touched_keys`` names the keys a mutation changes besides ``key``
        (DeleteObjects lists them in its body). ``write_through``: the request
        stores ``body`` whole as ``key`` (a plain PutObject), so its bytes may
        also be cached; the ETag comes from the origin's answer.
        """
        mount = self.namespace.resolve(bucket)
        if mutating and mount.readonly:
            raise errors.AccessDenied("This bucket is mounted read-only.")
        origin = self._capability(mount).forwarding
        if origin is None:
            raise errors.NotImplementedByOrigin(
                "This operation is not supported by a posix origin."
            )
        outgoing = dict(headers)
        if "x-amz-copy-source" in {name.lower() for name in outgoing}:
            _translate_copy_source(outgoing, self.namespace, mount)
        capture = None
        if write_through and key is not None and body is not None:
            capture = self.write_throughs.capture(mount, content_length)
            body = capture.tee(body) if capture is not None else body
        try:
            answer = await origin.forward(
                ForwardRequest(
                    method=method,
                    bucket=mount.origin_bucket,
                    key=mount.origin_key(key) if key is not None else None,
                    query=_translate_query(query, mount),
                    headers=outgoing,
                    body=body,
                    content_length=content_length,
                )
            )
            if mutating and 200 <= answer.status < 300:
                await self._invalidate(bucket, key, touched_keys or [])
                etag = next((v for n, v in answer.headers if n.lower() == "etag"), None)
                if capture is not None and key is not None and etag is not None:
                    self.write_throughs.later(bucket, key, etag, capture)
                    capture = None  # the task owns it now
        finally:
            if capture is not None:
                capture.release()
        return answer

    # -- origins written through their own API (posix) ---------------------------------

    def forwards(self, bucket: str) -> bool:
        """Whether ``bucket``'s origin takes raw forwarding; else its write API is used."""
        return self._capability(self.namespace.resolve(bucket)).forwarding is not None

    def _capability(self, mount: Mount) -> Capability:
        return Capability.of(mount.origin)  # declared by the origin: nothing to discover

    def _writable(self, bucket: str, *, mutating: bool = True) -> tuple[Mount, Writable]:
        mount = self.namespace.resolve(bucket)
        if mutating and mount.readonly:
            raise errors.AccessDenied("This bucket is mounted read-only.")
        origin = self._capability(mount).writable
        if origin is None:
            raise errors.NotImplementedByOrigin("This operation is not supported by this origin.")
        return mount, origin

    def _source(self, bucket: str, key: str, target: Writable) -> tuple[str, str]:
        """A copy source in gateway names → (origin bucket, origin key) on ``target``'s origin."""
        mount = self.namespace.resolve(bucket)
        if self._capability(mount).writable is not target:
            raise errors.NotImplementedByOrigin("Copying between two origins is not supported.")
        return mount.origin_bucket, mount.origin_key(key)

    @staticmethod
    async def _current(origin: Writable, bucket: str, key: str) -> ObjectInfo | None:
        try:
            return await origin.head_object(bucket, key)
        except errors.NoSuchKey:
            return None

    @staticmethod
    async def _source_info(origin: Writable, bucket: str, key: str, client_key: str) -> ObjectInfo:
        try:
            return await origin.head_object(bucket, key)
        except errors.NoSuchKey:
            raise errors.NoSuchKey(client_key) from None  # never show the mount prefix

    async def put_object(
        self,
        bucket: str,
        key: str,
        body: AsyncIterator[bytes],
        attrs: Attributes,
        check: WriteCheck | None = None,
        length: int | None = None,
    ) -> PutResult:
        """Store ``body`` (``length`` bytes, if known) as ``key``; nothing if it raises midway."""
        mount, origin = self._writable(bucket)
        okey = mount.origin_key(key)
        if check is not None:
            check(await self._current(origin, mount.origin_bucket, okey))
        capture = self.write_throughs.capture(mount, length)
        try:
            if capture is not None:
                body = capture.tee(body)
            result = await origin.put_object(mount.origin_bucket, okey, body, **attrs.kwargs())
            await self._invalidate(bucket, key, [])
            if capture is not None:
                self.write_throughs.later(bucket, key, result.etag, capture)
                capture = None  # the task owns it now
        finally:
            if capture is not None:
                capture.release()
        return result

    async def copy_object(
        self,
        source: tuple[str, str],
        bucket: str,
        key: str,
        *,
        replace: Attributes | None,
        check: SourceCheck | None = None,
    ) -> PutResult:
        """Copy ``source`` (gateway bucket, key) to ``key``; ``replace``: new attributes or None."""
        mount, origin = self._writable(bucket)
        src_bucket, src_key = self._source(*source, origin)
        if check is not None:
            check(await self._source_info(origin, src_bucket, src_key, source[1]))
        attrs = replace.kwargs() if replace is not None else {}
        try:
            result = await origin.copy_object(
                src_bucket,
                src_key,
                mount.origin_bucket,
                mount.origin_key(key),
                replace_metadata=replace is not None,
                **attrs,
            )
        except errors.NoSuchKey:
            raise errors.NoSuchKey(source[1]) from None  # the source: a target is never missing
        await self._invalidate(bucket, key, [])
        return result

    async def delete_object(self, bucket: str, key: str) -> None:
        """Remove ``key``; an absent key is no error, as in S3."""
        mount, origin = self._writable(bucket)
        await _delete(origin, mount.origin_bucket, mount.origin_key(key))
        await self._invalidate(bucket, key, [])

    async def delete_objects(self, bucket: str, keys: list[str]) -> list[errors.HoardError | None]:
        """Delete each key; per key, None when deleted (or absent) or the error that stopped it."""
        mount, origin = self._writable(bucket)
        outcomes: list[errors.HoardError | None] = []
        for key in keys:
            try:
                await _delete(origin, mount.origin_bucket, mount.origin_key(key))
            except errors.HoardError as exc:
                outcomes.append(exc)
            else:
                outcomes.append(None)
        deleted = [key for key, outcome in zip(keys, outcomes, strict=True) if outcome is None]
        if deleted:
            await self._invalidate(bucket, None, deleted)
        return outcomes

    async def create_bucket(self, bucket: str) -> bool:
        """Make ``bucket`` at its origin; False if it was there (a mount always is)."""
        if self.namespace.resolve(bucket).mounted:
            return False
        mount, origin = self._writable(bucket)
        created = await origin.create_bucket(mount.origin_bucket)
        await self._invalidate(bucket, None, [])  # negative entries of the new bucket's keys
        return created

    async def delete_bucket(self, bucket: str) -> None:
        """Remove the empty ``bucket`` at its origin; a mount is removed in the config."""
        if self.namespace.resolve(bucket).mounted:
            raise errors.NotImplementedByOrigin("A mounted bucket is removed from the config.")
        mount, origin = self._writable(bucket)
        await origin.delete_bucket(mount.origin_bucket)
        await self._invalidate(bucket, None, [])

    async def create_multipart_upload(self, bucket: str, key: str, attrs: Attributes) -> str:
        mount, origin = self._writable(bucket)
        return await origin.create_multipart_upload(
            mount.origin_bucket, mount.origin_key(key), **attrs.kwargs()
        )

    async def upload_part(
        self, bucket: str, key: str, upload_id: str, part_number: int, body: AsyncIterator[bytes]
    ) -> PartInfo:
        mount, origin = self._writable(bucket)
        return await origin.upload_part(
            mount.origin_bucket, mount.origin_key(key), upload_id, part_number, body
        )

    async def upload_part_copy(
        self,
        bucket: str,
        key: str,
        upload_id: str,
        part_number: int,
        source: tuple[str, str],
        byte_range: tuple[int, int] | None,
        check: SourceCheck | None = None,
    ) -> PartInfo:
        """Stage a part from (the inclusive ``byte_range`` of) ``source``.

        Raises ``RangeNotSatisfiable`` (with the source's size) for a range
        that does not lie inside the source.
        """
        mount, origin = self._writable(bucket)
        src_bucket, src_key = self._source(*source, origin)
        info = await self._source_info(origin, src_bucket, src_key, source[1])
        if check is not None:
            check(info)
        if byte_range is not None and not (0 <= byte_range[0] <= byte_range[1] < info.size):
            raise errors.RangeNotSatisfiable(info.size)
        return await origin.upload_part_copy(
            mount.origin_bucket,
            mount.origin_key(key),
            upload_id,
            part_number,
            src_bucket,
            src_key,
            byte_range,
        )

    async def complete_multipart_upload(
        self,
        bucket: str,
        key: str,
        upload_id: str,
        parts: list[tuple[int, str]],
        check: WriteCheck | None = None,
    ) -> PutResult:
        mount, origin = self._writable(bucket)
        okey = mount.origin_key(key)
        if check is not None:
            check(await self._current(origin, mount.origin_bucket, okey))
        result = await origin.complete_multipart_upload(mount.origin_bucket, okey, upload_id, parts)
        await self._invalidate(bucket, key, [])
        return result

    async def abort_multipart_upload(self, bucket: str, key: str, upload_id: str) -> None:
        mount, origin = self._writable(bucket)
        await origin.abort_multipart_upload(mount.origin_bucket, mount.origin_key(key), upload_id)

    async def list_parts(self, bucket: str, key: str, upload_id: str) -> list[PartInfo]:
        mount, origin = self._writable(bucket, mutating=False)
        return await origin.list_parts(mount.origin_bucket, mount.origin_key(key), upload_id)

    async def list_multipart_uploads(self, bucket: str, prefix: str = "") -> list[UploadInfo]:
        """Uploads in progress whose key starts with ``prefix``, by key then age; client keys."""
        mount, origin = self._writable(bucket, mutating=False)
        found = await origin.list_multipart_uploads(mount.origin_bucket, mount.origin_key(prefix))
        return [dataclasses.replace(u, key=mount.client_key(u.key)) for u in found]

    async def _invalidate(self, bucket: str, key: str | None, touched: list[str]) -> None:
        if key is None and not touched:
            await self._coherence.invalidate_prefix(bucket, "")  # a bucket-level change
            items = [self.namespace.resolve(bucket).invalidation(None)]
        else:
            names = ([key] if key is not None else []) + touched
            for name in names:
                await self._coherence.invalidate(bucket, name)
            items = [self.namespace.resolve(bucket).invalidation(name) for name in names]
        if self._broadcast is not None:
            await self._broadcast(items)


async def _delete(origin: Writable, bucket: str, key: str) -> None:
    # A key no file can have names no object: deleting it deletes nothing, as S3 answers.
    with contextlib.suppress(errors.InvalidObjectName):
        await origin.delete_object(bucket, key)


def _translate_query(query: list[tuple[str, str]], mount: Mount) -> list[tuple[str, str]]:
    if not mount.prefix:
        return query
    return [
        (name, mount.origin_key(value) if name in _KEY_PARAMETERS else value)
        for name, value in query
    ]


def _translate_copy_source(headers: dict[str, str], namespace: Namespace, target: Mount) -> None:
    """``/bucket/key?versionId=v`` in gateway names → the same in origin names."""
    name = next(n for n in headers if n.lower() == "x-amz-copy-source")
    source, _, version = headers[name].partition("?")
    source_bucket, _, source_key = unquote(source).lstrip("/").partition("/")
    if not source_bucket or not source_key:
        raise errors.InvalidObjectName("x-amz-copy-source must be /bucket/key")
    mount = namespace.resolve(source_bucket)
    if mount.origin is not target.origin:
        raise errors.NotImplementedByOrigin("Copying between two origins is not supported.")
    translated = f"/{mount.origin_bucket}/{quote(mount.origin_key(source_key), safe='/~')}"
    headers[name] = translated + (f"?{version}" if version else "")
