"""The S3 writes Hoard answers itself, for origins that take no raw forwarding (posix).

An S3 origin gets every write forwarded as it is (``passthrough.py``); a posix
directory cannot answer S3, so for its buckets these handlers speak S3 and
call the writer, which writes through the origin's own API and invalidates.
The operations: CreateBucket, DeleteBucket, PutObject, CopyObject,
DeleteObject, DeleteObjects, and the multipart set (Create, UploadPart, UploadPartCopy, Complete, Abort, ListParts,
ListMultipartUploads). Every other operation, and any of these carrying a
sub-resource this origin has no place for (``?tagging``, ``?acl``,
``?retention``…), is NotImplemented: a PUT with ``?tagging`` must never
overwrite the object with the tagging document.

Bodies are ``RequestBody``: decoded (aws-chunked) and verified (signatures,
checksums, Content-MD5) as they stream into the origin's temp file; a body
that fails raises its S3 error from the iterator, the origin discards the
temp file, and the old object (if any) stays. Only the small XML bodies of
DeleteObjects and CompleteMultipartUpload are read whole, under a size limit.

NOTE (departures from S3, all because a directory keeps no more than bytes
and one xattr): no versions (a ``versionId`` other than ``null`` is
NoSuchVersion); storage class, SSE, tagging, ACL and object-lock headers are
ignored; flexible checksums are verified and echoed on PutObject/UploadPart
but not stored, so a later HEAD with checksum mode shows none and a
CompleteMultipartUpload's part checksums are not compared; If-Match,
If-None-Match and x-amz-copy-source-if-* are checked just before the write,
not atomically with it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from urllib.parse import parse_qsl, quote, unquote

from aiohttp import web

from gateway.core import errors
from gateway.origins.base import ObjectInfo
from gateway.s3 import upload_lists, xml_writes
from gateway.s3.call import Call
from gateway.s3.checksums import of_the_body
from gateway.s3.chunked import RequestBody, read_whole
from gateway.s3.conditionals import Conditions
from gateway.s3.errors import Code, S3Error, from_domain
from gateway.s3.numbers import natural
from gateway.s3.xml import XML_TYPE
from gateway.write.writer import Attributes, SourceCheck, WriteCheck

log = logging.getLogger(__name__)

Handler = Callable[[Call], Awaitable[web.StreamResponse]]

MAX_OBJECT_SIZE = 5 * 1024**3  # one PutObject, one part
MAX_METADATA_SIZE = 2048  # user metadata: names and values, UTF-8 bytes
_REPRESENTATION = ("Cache-Control", "Content-Disposition", "Content-Language", "Expires")
# What makes copying an object onto itself legal besides a REPLACE directive.
_SELF_COPY_CHANGES = ("x-amz-storage-class", "x-amz-website-redirect-location",
                      "x-amz-server-side-encryption")  # fmt: skip
_COPY_RANGE = re.compile(r"bytes=([0-9]{1,19})-([0-9]{1,19})")
_SELF_COPY_MESSAGE = (
    "This copy request is illegal because it is trying to copy an object to itself without "
    "changing the object's metadata, storage class, website redirect location or encryption "
    "attributes."
)


# -- the pieces of a request -------------------------------------------------------------


def _body(call: Call) -> RequestBody:
    """The verified payload of a PutObject or UploadPart; refused before a byte is read."""
    request = call.request
    chunked = "chunked" in request.headers.get("Transfer-Encoding", "").lower()
    if request.content_length is None and not chunked:
        raise S3Error(Code.MissingContentLength)
    body = RequestBody(call.body_source(), request.headers, call.principal.context)
    _refuse_too_large(body.length)
    return body


def refuse_declared_too_large(call: Call) -> None:
    """``EntityTooLarge`` for a PutObject or UploadPart that declares more than 5 GiB.

    Called before ``100 Continue`` goes out (any origin, passed through or not): S3
    answers such an upload at once, and its client never sends the body. The payload
    length is ``x-amz-decoded-content-length`` for an aws-chunked body (its
    Content-Length counts the chunk framing too); ``_body`` checks it exactly later.
    """
    if call.route.operation not in ("PutObject", "UploadPart"):
        return
    headers = call.request.headers
    declared = headers.get("x-amz-decoded-content-length") or headers.get("Content-Length", "")
    if declared.strip().isdigit():
        _refuse_too_large(int(declared.strip()))


def _refuse_too_large(length: int | None) -> None:
    if length is not None and length > MAX_OBJECT_SIZE:
        fields = {"ProposedSize": str(length), "MaxSizeAllowed": str(MAX_OBJECT_SIZE)}
        raise S3Error(Code.EntityTooLarge, fields=fields)


def _xml_body(call: Call) -> RequestBody:
    declared = of_the_body(call.request.headers, call.route.operation)
    return RequestBody(call.body_source(), declared, call.principal.context)


def _checksum_headers(body: RequestBody, *, full_object: bool = False) -> dict[str, str]:
    """S3 echoes the flexible checksum a body was sent (and verified) with."""
    algorithm = body.expected.algorithm
    if algorithm is None or algorithm.name not in body.checksums:
        return {}
    headers = {algorithm.header: body.checksums[algorithm.name]}
    if full_object:
        headers["x-amz-checksum-type"] = "FULL_OBJECT"
    return headers


def _attributes(headers: Mapping[str, str], content_encoding: str | None) -> Attributes:
    """Content-Type, x-amz-meta-* and the representation headers a write stores."""
    metadata: dict[str, str] = {}
    for name, value in headers.items():  # a repeated header comes twice: S3 joins them
        lower = name.lower()
        if lower.startswith("x-amz-meta-"):
            meta = lower.removeprefix("x-amz-meta-")
            metadata[meta] = f"{metadata[meta]},{value}" if meta in metadata else value
    size = sum(len(f"{n}{v}".encode("utf-8", "surrogateescape")) for n, v in metadata.items())
    if size > MAX_METADATA_SIZE:
        fields = {"Size": str(size), "MaxSizeAllowed": str(MAX_METADATA_SIZE)}
        raise S3Error(Code.MetadataTooLarge, fields=fields)
    kept = {name: headers[name] for name in _REPRESENTATION if name in headers}
    if content_encoding:
        kept["Content-Encoding"] = content_encoding
    # S3's type for an object sent without one.
    content_type = headers.get("Content-Type") or "binary/octet-stream"
    return Attributes(content_type, metadata, kept)


def _write_check(headers: Mapping[str, str], key: str) -> WriteCheck | None:
    """If-None-Match: * (no object may exist) and If-Match (this ETag must be there)."""
    if_none, if_match = headers.get("If-None-Match"), headers.get("If-Match")
    if if_none is None and if_match is None:
        return None
    if if_none is not None and if_none.strip() != "*":
        raise S3Error(Code.NotImplemented, fields={"Header": "If-None-Match"})
    matching = Conditions.from_headers({"If-Match": if_match} if if_match is not None else {})

    def check(current: ObjectInfo | None) -> None:
        if current is None:
            if if_match is not None:
                raise errors.NoSuchKey(key)
            return
        if if_none is not None:
            raise errors.PreconditionFailed("If-None-Match")
        matching.check(current)

    return check


def _copy_source(call: Call) -> tuple[str, str]:
    """``x-amz-copy-source``: ``[/]bucket/key[?versionId=v]``, percent-encoded; gateway names."""
    value = call.request.headers["x-amz-copy-source"]
    path, _, query = value.partition("?")
    try:
        path = unquote(path, errors="strict")
    except UnicodeDecodeError:
        path = ""
    bucket, _, key = path.removeprefix("/").partition("/")
    if not bucket or not key:
        raise S3Error(
            Code.InvalidArgument,
            "Copy Source must mention the source bucket and key: sourcebucket/sourcekey",
            fields={"ArgumentName": "x-amz-copy-source", "ArgumentValue": value},
        )
    version = dict(parse_qsl(query, keep_blank_values=True)).get("versionId")
    if version is not None and version != "null":
        raise S3Error(Code.NoSuchVersion, fields={"Key": key, "VersionId": version})
    return bucket, key


def _source_check(headers: Mapping[str, str]) -> SourceCheck | None:
    """x-amz-copy-source-if-*: the GET conditions on the source, every failure a 412."""
    names = ("If-Match", "If-None-Match", "If-Modified-Since", "If-Unmodified-Since")
    given = {
        n: headers[f"x-amz-copy-source-{n}"] for n in names if f"x-amz-copy-source-{n}" in headers
    }
    conditions = Conditions.from_headers(given)
    if not conditions:
        return None

    def check(source: ObjectInfo) -> None:
        try:
            conditions.check(source)
        except errors.PreconditionFailed as exc:
            raise errors.PreconditionFailed(f"x-amz-copy-source-{exc.condition}") from None
        except errors.NotModified:
            failed = "If-None-Match" if "If-None-Match" in given else "If-Modified-Since"
            raise errors.PreconditionFailed(f"x-amz-copy-source-{failed}") from None

    return check


def part_number(query: Mapping[str, str]) -> int:
    raw = query.get("partNumber", "")
    number = natural(raw, 5)
    if number is None or not 1 <= number <= 10_000:
        raise S3Error(
            Code.InvalidArgument,
            "Part number must be an integer between 1 and 10000, inclusive",
            fields={"ArgumentName": "partNumber", "ArgumentValue": raw},
        )
    return number


def _xml(body: bytes) -> web.Response:
    return web.Response(body=body, content_type=XML_TYPE)


# -- whole objects -------------------------------------------------------------------------


async def put_object(call: Call) -> web.StreamResponse:
    if "x-amz-copy-source" in call.request.headers:
        return await copy_object(call)
    headers = call.request.headers
    check = _write_check(headers, call.key)
    body = _body(call)
    attrs = _attributes(headers, body.content_encoding)
    result = await call.writer.put_object(
        call.bucket, call.key, aiter(body), attrs, check, length=body.length
    )
    return web.Response(headers={"ETag": result.etag, **_checksum_headers(body, full_object=True)})


async def copy_object(call: Call) -> web.StreamResponse:
    headers = call.request.headers
    source = _copy_source(call)
    directive = headers.get("x-amz-metadata-directive", "COPY")
    if directive not in ("COPY", "REPLACE"):
        raise S3Error(
            Code.InvalidArgument,
            "Unknown metadata directive.",
            fields={"ArgumentName": "x-amz-metadata-directive", "ArgumentValue": directive},
        )
    changes = any(name.lower().startswith(_SELF_COPY_CHANGES) for name in headers)
    if source == (call.bucket, call.key) and directive == "COPY" and not changes:
        raise S3Error(Code.InvalidRequest, _SELF_COPY_MESSAGE)
    replace = (
        _attributes(headers, headers.get("Content-Encoding")) if directive == "REPLACE" else None
    )
    result = await call.writer.copy_object(
        source, call.bucket, call.key, replace=replace, check=_source_check(headers)
    )
    return _xml(xml_writes.copy_object_result(result.etag, result.last_modified))


async def delete_object(call: Call) -> web.StreamResponse:
    version = call.query.get("versionId")
    if version is not None and version != "null":
        raise S3Error(Code.NoSuchVersion, fields={"Key": call.key, "VersionId": version})
    await call.writer.delete_object(call.bucket, call.key)
    return web.Response(status=204)


async def delete_objects(call: Call) -> web.StreamResponse:
    body = _xml_body(call)
    if body.expected.md5 is None and body.expected.algorithm is None:
        raise S3Error(Code.InvalidRequest, "Missing required header for this request: Content-MD5")
    request = xml_writes.parse_delete(await read_whole(body))
    deletable = [(key, v) for key, v in request.objects if v is None or v == "null"]
    outcomes = await call.writer.delete_objects(call.bucket, [key for key, _ in deletable])
    found = dict(zip(deletable, outcomes, strict=True))
    rows = []
    for key, version in request.objects:
        if (key, version) not in found:
            code = Code.NoSuchVersion
            rows.append(xml_writes.DeleteOutcome(key, version, code.name, code.default_message))
        elif (error := found[(key, version)]) is not None:
            s3 = from_domain(error)
            rows.append(xml_writes.DeleteOutcome(key, version, s3.code.name, s3.message))
        else:
            rows.append(xml_writes.DeleteOutcome(key, version))
    return _xml(xml_writes.delete_result(rows, request.quiet))


# -- multipart uploads -----------------------------------------------------------------------


async def create_multipart_upload(call: Call) -> web.StreamResponse:
    headers = call.request.headers
    attrs = _attributes(headers, headers.get("Content-Encoding"))
    upload_id = await call.writer.create_multipart_upload(call.bucket, call.key, attrs)
    return _xml(xml_writes.initiate_multipart_upload(call.bucket, call.key, upload_id))


async def upload_part(call: Call) -> web.StreamResponse:
    number = part_number(call.query)
    upload_id = call.query["uploadId"]
    if "x-amz-copy-source" in call.request.headers:
        return await _upload_part_copy(call, upload_id, number)
    body = _body(call)
    part = await call.writer.upload_part(call.bucket, call.key, upload_id, number, aiter(body))
    return web.Response(headers={"ETag": part.etag, **_checksum_headers(body)})


async def _upload_part_copy(call: Call, upload_id: str, number: int) -> web.StreamResponse:
    headers = call.request.headers
    source = _copy_source(call)
    byte_range, spec = None, headers.get("x-amz-copy-source-range")
    if spec is not None:
        match = _COPY_RANGE.fullmatch(spec.strip())
        if match is None:
            raise S3Error(
                Code.InvalidArgument,
                "The x-amz-copy-source-range value must be of the form bytes=first-last where "
                "first and last are the zero-based offsets of the first and last bytes to copy",
                fields={"ArgumentName": "x-amz-copy-source-range", "ArgumentValue": spec},
            )
        byte_range = (int(match.group(1)), int(match.group(2)))
    try:
        part = await call.writer.upload_part_copy(
            call.bucket, call.key, upload_id, number, source, byte_range, _source_check(headers)
        )
    except errors.RangeNotSatisfiable as exc:
        raise S3Error(
            Code.InvalidArgument,
            f"Range specified is not valid for source object of size: {exc.size}",
            fields={"ArgumentName": "x-amz-copy-source-range", "ArgumentValue": spec or ""},
        ) from None
    return _xml(xml_writes.copy_part_result(part.etag, part.last_modified))


async def complete_multipart_upload(call: Call) -> web.StreamResponse:
    check = _write_check(call.request.headers, call.key)
    parts = xml_writes.parse_complete(await read_whole(_xml_body(call)))
    upload_id = call.query["uploadId"]
    result = await call.writer.complete_multipart_upload(
        call.bucket, call.key, upload_id, parts, check
    )
    request = call.request
    location = f"{request.scheme}://{request.host}/{quote(call.bucket)}/{quote(call.key)}"
    return _xml(xml_writes.complete_multipart_upload(location, call.bucket, call.key, result.etag))


async def abort_multipart_upload(call: Call) -> web.StreamResponse:
    await call.writer.abort_multipart_upload(call.bucket, call.key, call.query["uploadId"])
    return web.Response(status=204)


# -- buckets -----------------------------------------------------------------------------------


async def create_bucket(call: Call) -> web.StreamResponse:
    """CreateBucket: the region of a posix origin is us-east-1, where S3 answers 200 to
    the owner's CreateBucket of a bucket that exists (other regions: 409
    BucketAlreadyOwnedByYou). A CreateBucketConfiguration body is not needed here."""
    await call.writer.create_bucket(call.route.bucket)
    return web.Response(status=200, headers={"Location": "/" + quote(call.route.bucket)})


async def delete_bucket(call: Call) -> web.StreamResponse:
    await call.writer.delete_bucket(call.route.bucket)
    return web.Response(status=204)


async def preflight(call: Call) -> web.StreamResponse:
    """OPTIONS: a directory keeps no CORS rules, and S3 refuses a preflight to a bucket
    without them (403 CORSResponse)."""
    await call.reader.head_bucket(call.route.bucket)  # NoSuchBucket first, as S3
    raise S3Error(Code.CORSResponse)


# -- dispatch ----------------------------------------------------------------------------------

# Per operation: the query parameters it takes, and its handler. Presigned-URL
# parameters (X-Amz-*, SigV2's three) and ``x-id`` (an SDK's operation hint) go
# with any of them.
_LIST_UPLOADS_TAKES = frozenset(
    {"uploads", "prefix", "delimiter", "max-uploads", "key-marker", "upload-id-marker",
     "encoding-type"}
)  # fmt: skip
_OPERATIONS: dict[str, tuple[frozenset[str], Handler]] = {
    "CreateBucket": (frozenset(), create_bucket),
    "DeleteBucket": (frozenset(), delete_bucket),
    "PutObject": (frozenset(), put_object),
    "UploadPart": (frozenset({"partNumber", "uploadId"}), upload_part),
    "DeleteObject": (frozenset({"versionId"}), delete_object),
    "DeleteObjects": (frozenset({"delete"}), delete_objects),
    "CreateMultipartUpload": (frozenset({"uploads"}), create_multipart_upload),
    "CompleteMultipartUpload": (frozenset({"uploadId"}), complete_multipart_upload),
    "AbortMultipartUpload": (frozenset({"uploadId"}), abort_multipart_upload),
    "ListParts": (
        frozenset({"uploadId", "max-parts", "part-number-marker", "encoding-type"}),
        upload_lists.list_parts,
    ),
    "ListMultipartUploads": (_LIST_UPLOADS_TAKES, upload_lists.list_multipart_uploads),
    "CopyObject": (frozenset(), put_object),
    "UploadPartCopy": (frozenset({"partNumber", "uploadId"}), upload_part),
    "PreflightRequest": (frozenset(), preflight),
}
_ANY_OPERATION = frozenset({"x-id", "awsaccesskeyid", "signature", "expires"})


def handler_for(call: Call) -> Handler | None:
    """The handler of this request's operation, or None: NotImplemented for this origin."""
    found = _OPERATIONS.get(call.route.operation)
    if found is None:
        return None
    takes, handler = found
    return None if has_subresource(call.query, takes) else handler


def has_subresource(query: Mapping[str, str], takes: frozenset[str] = frozenset()) -> bool:
    """Whether ``query`` names a sub-resource (?tagging, ?acl, ?retention…) beyond ``takes``."""
    for name in query:
        lower = name.lower()
        if name not in takes and lower not in _ANY_OPERATION and not lower.startswith("x-amz-"):
            return True
    return False
