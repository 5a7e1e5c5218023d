"""An origin for any S3-compatible store, through aiobotocore.

This module only translates: each Origin call is one S3 request, each answer
a value from ``base.py``, each failure a ``gateway.core.errors`` exception made in
``_translated`` -- the one place that knows how botocore spells "not found",
"refused" or "unreachable". No botocore or aiohttp exception leaves it.

botocore makes one try per call: retries (``max_attempts`` tries in all, with
backoff and a retry budget) are the guard's (``guard.py``), so that they are
counted and bounded. A failure is ``OriginThrottled`` (the origin asked us to
slow down) or ``OriginUnavailable`` (no usable answer). Checksums are "when_required" only:
a ranged GET cannot be checked against a whole-object checksum, and the
cache checks its own blocks. Every GET/HEAD still asks for the object's checksums
(``x-amz-checksum-mode``), so that they are kept with the rest of its headers and
clients that ask for them get them from the cache.

A GET hands back its body unread. ``chunks()`` takes at most ``CHUNK_SIZE``
bytes per step from aiohttp's buffer, so memory is bounded by the chunk, not
the object. aiohttp returns the connection to its pool by itself at the end
of the body; ``aclose()`` before that closes the socket instead, because a
connection with unread body bytes cannot carry another request.

Not guaranteed:
- A failure mid-body is not retried here: it surfaces from ``chunks()`` as
  ``OriginUnavailable``; the guard resumes the body from the next byte
  (``resume.py``).
- A 404 from HEAD has no body, so ``head_object`` tells a missing bucket from a
  missing key with one extra HeadBucket, on misses only.
- An origin that ignores Range and answers 200 is reported as it is
  (``start=0, end=size-1``); the caller sees it delivers more than it asked.
"""

from __future__ import annotations

import asyncio
import functools
import math
import re
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, contextmanager
from typing import Any

import aiohttp
from aiobotocore.session import get_session
from botocore.config import Config as BotoConfig
from botocore.exceptions import BotoCoreError, ClientError, ParamValidationError

from gateway.config.settings import S3OriginConfig
from gateway.core import errors
from gateway.origins import s3_get
from gateway.origins.base import BucketInfo, ListEntry, ListPage, ObjectInfo
from gateway.origins.s3_forward import ForwardRequest, ForwardResponse, S3Forwarder
from gateway.origins.writable import Capability

CHUNK_SIZE = 1024 * 1024  # largest piece chunks() yields
_LIST_LIMIT = 1000  # S3 never returns more keys per ListObjectsV2 page

# Stored representation headers S3 echoes on GET/HEAD, by canonical name; every other
# header of the object is kept under the lower-case name botocore reports it by.
_CANONICAL_NAMES = {
    name.lower(): name
    for name in ("Cache-Control", "Content-Disposition", "Content-Encoding",
                 "Content-Language", "Expires")
}  # fmt: skip
# Headers of a GET/HEAD answer that say nothing about the object: per connection (RFC
# 9110 §7.6.1), per response or per requester; or kept in ObjectInfo's own fields.
_NOT_OBJECT_HEADERS = frozenset((
    "accept-ranges", "age", "connection", "content-length", "content-range", "date",
    "keep-alive", "proxy-connection", "server", "te", "trailer", "transfer-encoding",
    "upgrade", "vary", "via", "x-amz-id-2", "x-amz-request-id", "x-amzn-requestid",
    "x-amz-request-charged", "x-amz-content-sha256", "etag", "last-modified", "content-type", "x-amz-storage-class",
    "x-amz-version-id",
))  # fmt: skip
_NOT_OBJECT_PREFIXES = ("x-amz-meta-", "access-control-")
# The headers that mark a 404 as a delete marker (S3 HeadObject/GetObject).
_DELETE_MARKER_HEADERS = ("x-amz-delete-marker", "x-amz-version-id")
_THROTTLE_CODES = frozenset(
    {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequests"}
)
_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+)$")
_UNSATISFIED_RANGE = re.compile(r"^bytes \*/(\d+)$")


@contextmanager
def _translated(bucket: str, key: str | None = None) -> Iterator[None]:
    """Turn whatever botocore/aiohttp raise into a ``gateway.core.errors`` exception.

    ``key`` is None for bucket operations: a 404 there means the bucket.
    """
    try:
        yield
    except ClientError as err:
        raise _from_client_error(err, bucket, key) from err
    except ParamValidationError as err:
        # A name botocore will not send (``a:b``): the request's fault, not the origin's.
        raise errors.InvalidArgument(f"The origin client cannot send this request: {err}") from err
    except (BotoCoreError, aiohttp.ClientError, TimeoutError) as err:
        # Connection refused/reset/closed, timeouts, short bodies: no usable answer.
        raise errors.OriginUnavailable(f"origin request failed: {err}") from err


def _from_client_error(err: ClientError, bucket: str, key: str | None) -> errors.HoardError:
    error = err.response.get("Error", {})
    code = str(error.get("Code", ""))
    status = int(err.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
    message = error.get("Message") or code or f"HTTP {status}"
    if code == "NoSuchBucket" or (status == 404 and key is None):
        return errors.NoSuchBucket(bucket)
    if status == 404 or code == "NoSuchKey":
        raw = err.response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
        said = {name: raw[name] for name in _DELETE_MARKER_HEADERS if name in raw}
        return errors.NoSuchKey(key or "", said if "x-amz-delete-marker" in said else None)
    if status == 403 or code == "AccessDenied":
        return errors.AccessDenied(message)
    if status == 412 or code == "PreconditionFailed":
        return errors.OriginChanged(f"{bucket}/{key} changed at the origin")
    if status == 416 or code == "InvalidRange":
        size = _actual_size(err.response)
        if size is not None:
            return errors.RangeNotSatisfiable(size)
    if code in _THROTTLE_CODES or status in (429, 503):
        return errors.OriginThrottled(f"origin throttled: {message}")
    return errors.OriginUnavailable(f"origin answered {status} {code}: {message}")


def _actual_size(response: dict[str, Any]) -> int | None:
    """The object size a 416 reveals: S3's ActualObjectSize or ``Content-Range: bytes */N``."""
    actual = response.get("Error", {}).get("ActualObjectSize")
    if actual is not None and str(actual).isdigit():
        return int(actual)
    headers = response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
    match = _UNSATISFIED_RANGE.match(headers.get("content-range", ""))
    return int(match.group(1)) if match else None


def _object_info(key: str, response: dict[str, Any], size: int) -> ObjectInfo:
    raw = response.get("ResponseMetadata", {}).get("HTTPHeaders", {})  # lower-cased names
    return ObjectInfo(
        key=key,
        size=size,
        etag=response.get("ETag", ""),
        last_modified=response["LastModified"],
        content_type=response.get("ContentType") or "binary/octet-stream",
        metadata=dict(response.get("Metadata", {})),
        headers=object_headers(raw),
        storage_class=response.get("StorageClass") or "STANDARD",
        version_id=response.get("VersionId"),
    )


def object_headers(raw: dict[str, str]) -> dict[str, str]:
    """Every header the origin sent about the object itself (SSE, tagging count,
    object lock, checksums, restore, expiration...), as raw text: botocore's
    parsed values differ (it turns Expires into a datetime, drops unknown ones)."""
    return {
        _CANONICAL_NAMES.get(name, name): value
        for name, value in raw.items()
        if name not in _NOT_OBJECT_HEADERS and not name.startswith(_NOT_OBJECT_PREFIXES)
    }


def _ask_checksums(request: Any, **_: Any) -> None:
    """Ask for the object's checksums on every GET/HEAD (S3 sends them only when asked),
    as a header rather than ``ChecksumMode``: that parameter would also make botocore
    validate the body against them, which a ranged answer cannot pass (the cache
    checks its own blocks)."""
    request.headers["x-amz-checksum-mode"] = "ENABLED"


def _delivered_range(response: dict[str, Any]) -> tuple[int, int, int]:
    """(full size, start, end) of a GET answer; a 206 carries the size in Content-Range."""
    content_range = response.get("ContentRange")
    if content_range is None:
        size = int(response.get("ContentLength", 0))
        return size, 0, size - 1
    match = _CONTENT_RANGE.match(content_range)
    if match is None:
        raise errors.OriginUnavailable(f"origin sent an unusable Content-Range: {content_range!r}")
    start, end, size = (int(part) for part in match.groups())
    return size, start, end


class S3ObjectStream:
    """An open GET. The body stays on its connection until read or closed."""

    def __init__(self, info: ObjectInfo, start: int, end: int, body: Any, bucket: str) -> None:
        self.info = info
        self.start = start
        self.end = end
        self._body = body  # s3_get.ResponseBody: an aiohttp ClientResponse's body
        self._bucket = bucket
        self._closed = False

    def chunks(self) -> AsyncIterator[bytes]:
        # The stream is its own iterator, not an async generator: an abandoned
        # async generator is finalised later by a task the loop creates, which
        # is exactly the leftover task an early aclose() must not leave behind.
        return self

    def __aiter__(self) -> S3ObjectStream:
        return self

    def arrived(self) -> bool:
        """Whether the whole body is here: no read of it waits for the origin."""
        return bool(self._body.arrived())

    async def __anext__(self) -> bytes:
        with _translated(self._bucket, self.info.key):
            # aiohttp's read(n) returns what is buffered, at most n bytes; b"" at
            # the end, after aiobotocore checked the length against Content-Length.
            chunk = await self._body.read(CHUNK_SIZE)
        if not chunk:
            raise StopAsyncIteration
        return chunk

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        # ClientResponse.close(): after the end of the body aiohttp has already
        # released the connection to the pool and this is a no-op; before it,
        # the socket is closed rather than pooled with unread bytes on it.
        await self._body.aclose()

    async def __aenter__(self) -> S3ObjectStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class S3Origin:
    """An S3-compatible store. The client is built on first use, inside the running loop."""

    def __init__(self, name: str, config: S3OriginConfig) -> None:
        self.name = name
        self.capability = Capability(forwarding=self)  # requests it does not serve go as they are
        self._config = config
        self._lock = asyncio.Lock()
        self._stack: AsyncExitStack | None = None
        self._client: Any = None
        self._forwarder: S3Forwarder | None = None

    async def _s3(self) -> Any:
        if self._client is None:
            async with self._lock:
                # Re-check: another caller may have built it while we waited.
                if self._client is None:
                    stack = AsyncExitStack()
                    creator = get_session().create_client("s3", **self._client_args())
                    client = await stack.enter_async_context(creator)
                    for operation in ("GetObject", "HeadObject"):
                        client.meta.events.register(f"before-sign.s3.{operation}", _ask_checksums)
                    self._client, self._stack = client, stack
        return self._client

    def _client_args(self) -> dict[str, Any]:
        cfg = self._config
        args: dict[str, Any] = {
            "region_name": cfg.region,
            "endpoint_url": cfg.endpoint or None,
            "config": BotoConfig(
                region_name=cfg.region,
                signature_version="s3v4",
                # One try: the guard retries, within its budget ("total_" counts all tries).
                retries={"mode": "standard", "total_max_attempts": 1},
                max_pool_connections=cfg.max_connections,
                connect_timeout=_timeout(cfg.connect_timeout),
                read_timeout=_timeout(cfg.read_timeout),
                s3={"addressing_style": cfg.addressing_style},
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            ),
        }
        # Without explicit keys botocore walks the standard chain (env, profile, role).
        if cfg.access_key is not None:
            args["aws_access_key_id"] = cfg.access_key
            secret = cfg.secret_key
            args["aws_secret_access_key"] = secret.get_secret_value() if secret else None
        return args

    async def close(self) -> None:
        async with self._lock:
            stack, self._stack, self._client = self._stack, None, None
        forwarder, self._forwarder = self._forwarder, None
        if forwarder is not None:
            await forwarder.close()
        if stack is not None:
            await stack.aclose()

    async def forward(self, request: ForwardRequest) -> ForwardResponse:
        """Pass any other S3 request to the origin as it is, re-signed (``s3_forward.py``)."""
        if self._forwarder is None:
            self._forwarder = S3Forwarder(self._config)
        return await self._forwarder.forward(request)

    async def list_buckets(self) -> list[BucketInfo]:
        client = await self._s3()
        buckets: list[BucketInfo] = []
        params: dict[str, Any] = {}
        while True:
            with _translated(""):
                response = await client.list_buckets(**params)
            buckets += [BucketInfo(b["Name"], b["CreationDate"]) for b in response["Buckets"]]
            token = response.get("ContinuationToken")
            if not token:
                return buckets
            params["ContinuationToken"] = token

    async def head_bucket(self, bucket: str) -> None:
        client = await self._s3()
        with _translated(bucket):
            await client.head_bucket(Bucket=bucket)

    async def bucket_region(self, bucket: str) -> str:
        client = await self._s3()
        with _translated(bucket):
            response = await client.get_bucket_location(Bucket=bucket)
        # Legacy spellings: no constraint means us-east-1, "EU" is eu-west-1.
        location = response.get("LocationConstraint") or "us-east-1"
        return "eu-west-1" if location == "EU" else location

    async def head_object(self, bucket: str, key: str) -> ObjectInfo:
        client = await self._s3()
        try:
            with _translated(bucket, key):
                response = await client.head_object(Bucket=bucket, Key=key)
        except errors.NoSuchKey:
            # A HEAD 404 has no body to say which is missing; only the bucket check can
            # tell (misses only, and the metadata cache keeps them negative).
            await self.head_bucket(bucket)
            raise
        return _object_info(key, response, int(response.get("ContentLength", 0)))

    async def get_object(
        self,
        bucket: str,
        key: str,
        byte_range: tuple[int, int] | None = None,
        if_match: str | None = None,
    ) -> S3ObjectStream:
        # One signed aiohttp GET rather than botocore's client pipeline (s3_get.py).
        if self._forwarder is None:
            self._forwarder = S3Forwarder(self._config)
        headers = s3_get.request_headers(byte_range, if_match)
        with _translated(bucket, key):
            answer = await self._forwarder.send_once("GET", bucket, key, headers)
            if answer.status not in (200, 206):
                raise await s3_get.error_of(answer)
        body = s3_get.ResponseBody(answer)
        try:
            response = s3_get.response_fields(answer.headers)
            size, start, end = _delivered_range(response)
            info = _object_info(key, response, size)
        except Exception as exc:
            await body.aclose()  # never handed out, so nobody else would close it
            if isinstance(exc, errors.HoardError):
                raise
            raise errors.OriginUnavailable(f"origin sent an unusable answer: {exc!r}") from exc
        return S3ObjectStream(info, start, end, body, bucket)

    async def list_objects(
        self,
        bucket: str,
        prefix: str = "",
        delimiter: str = "",
        start_after: str = "",
        max_keys: int = 1000,
    ) -> ListPage:
        client = await self._s3()
        max_keys = max(0, min(max_keys, _LIST_LIMIT))
        # One spare: the common prefix equal to start_after is dropped below.
        params: dict[str, Any] = {
            "Bucket": bucket,
            "Prefix": prefix,
            "MaxKeys": min(max_keys + 1, _LIST_LIMIT),
            # ListObjects (v1) always names each key's owner, v2 on request: keep it for both.
            "FetchOwner": True,
        }
        if delimiter:
            params["Delimiter"] = delimiter
        if start_after:
            params["StartAfter"] = start_after
        # botocore asks for EncodingType=url and decodes keys and prefixes itself.
        with _translated(bucket):
            response = await client.list_objects_v2(**params)
        entries = [_list_entry(item) for item in response.get("Contents", [])]
        # A page that ended on a common prefix continues from it; S3 repeats
        # that prefix (the keys under it sort after it), so skip it here.
        prefixes = [
            item["Prefix"]
            for item in response.get("CommonPrefixes", [])
            if item["Prefix"] != start_after
        ]
        return _page(entries, prefixes, max_keys, bool(response.get("IsTruncated")))


def _list_entry(item: dict[str, Any]) -> ListEntry:
    owner = item.get("Owner")
    return ListEntry(
        key=item["Key"],
        size=int(item.get("Size", 0)),
        etag=item.get("ETag", ""),
        last_modified=item["LastModified"],
        storage_class=item.get("StorageClass") or "STANDARD",
        # Interned: a bucket has few owners and algorithms, a cached listing many entries.
        checksum_algorithms=tuple(sys.intern(a) for a in item.get("ChecksumAlgorithm", ())),
        owner=_owner(owner) if owner else None,
    )


@functools.lru_cache(maxsize=64)
def _owner_pair(owner_id: str, name: str) -> tuple[str, str]:
    return owner_id, name


def _owner(owner: dict[str, str]) -> tuple[str, str]:
    """One shared (ID, DisplayName) tuple per owner, however many entries name it."""
    return _owner_pair(owner.get("ID", ""), owner.get("DisplayName", ""))


def _page(entries: list[ListEntry], prefixes: list[str], max_keys: int, more: bool) -> ListPage:
    """Keep the first ``max_keys`` keys and prefixes in S3's (code point) order."""
    named = [(entry.key, entry) for entry in entries] + [(p, None) for p in prefixes]
    merged = sorted(named, key=lambda pair: pair[0])
    kept = merged[:max_keys]
    # Without a last name there is nothing to continue from, so never claim more.
    truncated = bool(kept) and (more or len(merged) > len(kept))
    return ListPage(
        entries=[entry for _, entry in kept if entry is not None],
        common_prefixes=[name for name, entry in kept if entry is None],
        is_truncated=truncated,
        next_marker=kept[-1][0] if kept else None,
    )


def _timeout(seconds: float) -> float | None:
    """``forever`` in the config is ``inf``; aiohttp spells "no timeout" as None."""
    return None if math.isinf(seconds) else seconds
