"""The write path: send a mutation to the origin, then invalidate what it touched.

Hoard serves reads itself; every other S3 request (writes, multipart, copies,
deletes, tagging, ACLs, versioning, bucket configuration…) goes to the origin
that owns the bucket, re-signed with the origin's credentials and streamed
both ways, and is answered with the origin's status, headers and body. Names
are translated on the way (gateway bucket → origin bucket, key → mount prefix
+ key, ``x-amz-copy-source``), and after a successful mutation the key's
metadata, its listings and its blocks are dropped *before* the client sees
the answer, so a read after a write through Hoard sees the new state.

Not guaranteed: XML answers that name keys (ListParts, ListMultipartUploads,
ListObjectVersions) are passed as the origin wrote them, so under a mount
with a key prefix they show origin keys; a copy between two different origins
is refused (NotImplemented).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Protocol, runtime_checkable
from urllib.parse import quote, unquote

from gateway import errors
from gateway.namespace import Mount, Namespace
from gateway.origins.s3_forward import ForwardRequest, ForwardResponse
from gateway.reader import Reader

__all__ = ["ForwardResponse", "Writer"]

# Query parameters that name keys and so carry the mount prefix at the origin.
_KEY_PARAMETERS = ("prefix", "key-marker", "marker", "start-after")


@runtime_checkable
class Forwarding(Protocol):
    async def forward(self, request: ForwardRequest) -> ForwardResponse: ...


class Writer:
    def __init__(self, namespace: Namespace, reader: Reader) -> None:
        self.namespace = namespace
        self.reader = reader

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
    ) -> ForwardResponse:
        """Send one request to the origin of ``bucket``; invalidate on success.

        ``touched_keys`` names the keys a mutation changes besides ``key``
        (DeleteObjects lists them in its body).
        """
        mount = self.namespace.resolve(bucket)
        if mutating and mount.readonly:
            raise errors.AccessDenied("This bucket is mounted read-only.")
        origin = mount.origin
        if not isinstance(origin, Forwarding):
            raise errors.NotImplementedByOrigin(
                "This operation is not supported by a posix origin."
            )
        outgoing = dict(headers)
        if "x-amz-copy-source" in {name.lower() for name in outgoing}:
            _translate_copy_source(outgoing, self.namespace, mount)
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
        return answer

    async def _invalidate(self, bucket: str, key: str | None, touched: list[str]) -> None:
        if key is None and not touched:
            await self.reader.invalidate_prefix(bucket, "")  # a bucket-level change
            return
        for name in ([key] if key is not None else []) + touched:
            await self.reader.invalidate(bucket, name)


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
