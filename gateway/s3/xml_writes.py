"""The XML of the write operations: the two request bodies read, the answers written.

Bodies in (DeleteObjects' ``<Delete>``, CompleteMultipartUpload's
``<CompleteMultipartUpload>``) are small, read whole by the caller under a size
limit, and parsed with ElementTree; the S3 namespace is optional, as S3 accepts
both, and a document type declaration is refused outright, in any encoding
(S3 accepts none, and it is where entity tricks live). A body is read in the encoding
its XML declaration names: expat reads UTF-8, UTF-16 and the single-byte ones itself,
and refuses the multi-byte ones (Shift_JIS, GBK, EUC-JP, Big5, UTF-7…) with a
``ValueError``, so those are decoded with Python's codec and handed on as UTF-8; an
encoding no codec knows, or bytes that are not in it, are ``MalformedXML``, as is
anything else wrong: never a 500.

Answers are built as text with the helpers of ``xml.py``, element order as in
the S3 API reference.
"""

from __future__ import annotations

import codecs
import re
import xml.etree.ElementTree as ElementTree
import xml.parsers.expat as pyexpat
from dataclasses import dataclass
from datetime import datetime

from gateway.s3.errors import Code, S3Error
from gateway.s3.numbers import natural
from gateway.s3.xml import DECLARATION, NAMESPACE, OWNER_ID, _element, _url, iso8601
from gateway.write.writer import PartInfo, UploadInfo

MAX_DELETE_KEYS = 1000  # S3's limit for one DeleteObjects request
_OWNER = f"<ID>{OWNER_ID}</ID><DisplayName>{OWNER_ID}</DisplayName>"
# The encoding an XML declaration names (in ASCII, as every encoding expat hands back is).
_DECLARED = re.compile(rb"""^<\?xml[^>]*?\sencoding\s*=\s*["']([A-Za-z][A-Za-z0-9._-]*)["']""")


# -- request bodies --------------------------------------------------------------------


def root_element(body: bytes, name: str) -> ElementTree.Element:
    """The root of a small XML request body named ``name`` (any namespace); MalformedXML
    for anything else, a document type declaration included (``_refuse_dtd``)."""
    try:
        _refuse_dtd(body)
    except ValueError:  # an encoding expat does not read itself
        body = _as_utf8(body)
        _refuse_dtd(body)
    try:
        root = ElementTree.fromstring(body)
    except (ElementTree.ParseError, ValueError, LookupError):
        raise S3Error(Code.MalformedXML) from None
    if local_name(root.tag) != name:
        raise S3Error(Code.MalformedXML)
    return root


def _as_utf8(body: bytes) -> bytes:
    """``body`` decoded as its declaration says, its declaration made to say UTF-8."""
    found = _DECLARED.match(body)
    if found is None:
        raise S3Error(Code.MalformedXML)
    try:
        text = codecs.decode(body[found.end() :], found.group(1).decode("ascii"))
    except (LookupError, UnicodeDecodeError):
        raise S3Error(Code.MalformedXML) from None
    head = body[: found.start(1)] + b"UTF-8" + body[found.end(1) : found.end()]
    return head + text.encode("utf-8")


def in_native_encoding(body: bytes) -> bool:
    """Whether expat reads ``body``'s declared encoding itself (so does any S3 store built
    on it: moto answers a Shift_JIS body with a 500)."""
    try:
        pyexpat.ParserCreate().Parse(body, True)
    except ValueError:
        return False
    except (pyexpat.ExpatError, LookupError):
        pass  # malformed, but not for its encoding: the parse proper says so
    return True


class _DocumentType(Exception):
    """A document type declaration was found (raised from an expat handler)."""


def _refuse(*_: object) -> None:
    raise _DocumentType


def _refuse_dtd(body: bytes) -> None:
    """``MalformedXML`` for a body with a document type declaration, in whatever
    encoding it declares (UTF-16 spells ``<!DOCTYPE`` in other bytes).

    expat reads the body as the parser proper will, so what it would find, this
    finds; a first pass costs little on bodies this small. The C ElementTree
    parser offers no handle on its expat, or this would be one pass.
    """
    expat = pyexpat.ParserCreate()
    expat.StartDoctypeDeclHandler = _refuse
    expat.EntityDeclHandler = _refuse
    try:
        expat.Parse(body, True)
    except (_DocumentType, pyexpat.ExpatError, LookupError):
        raise S3Error(Code.MalformedXML) from None


def local_name(tag: str) -> str:
    return tag.rpartition("}")[2]


def child_text(element: ElementTree.Element, name: str) -> str | None:
    for child in element:
        if local_name(child.tag) == name:
            return child.text or ""
    return None


@dataclass(frozen=True, slots=True)
class DeleteRequest:
    quiet: bool
    objects: list[tuple[str, str | None]]  # (key, version id)


def parse_delete(body: bytes) -> DeleteRequest:
    """``<Delete><Quiet>true</Quiet><Object><Key>k</Key><VersionId>v</VersionId></Object>…``."""
    root = root_element(body, "Delete")
    quiet = (child_text(root, "Quiet") or "").strip().lower() == "true"
    objects = []
    for element in root:
        if local_name(element.tag) != "Object":
            continue
        key = child_text(element, "Key")
        if key is None:
            raise S3Error(Code.MalformedXML)
        objects.append((key, child_text(element, "VersionId")))
    if not objects or len(objects) > MAX_DELETE_KEYS:
        raise S3Error(Code.MalformedXML)
    return DeleteRequest(quiet, objects)


def parse_complete(body: bytes) -> list[tuple[int, str]]:
    """``<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>"…"</ETag></Part>…``.

    Part checksums (``<ChecksumCRC32>``…) are accepted and not checked.
    """
    root = root_element(body, "CompleteMultipartUpload")
    parts = []
    for element in root:
        if local_name(element.tag) != "Part":
            continue
        number, etag = child_text(element, "PartNumber"), child_text(element, "ETag")
        part_number = natural(number.strip(), 5) if number is not None else None
        if part_number is None or etag is None:
            raise S3Error(Code.MalformedXML)
        parts.append((part_number, etag.strip()))
    if not parts:
        raise S3Error(Code.MalformedXML)
    return parts


# -- answers ---------------------------------------------------------------------------


def _document(name: str, inner: str) -> bytes:
    return f'{DECLARATION}<{name} xmlns="{NAMESPACE}">{inner}</{name}>'.encode()


def copy_object_result(etag: str, last_modified: datetime) -> bytes:
    inner = _element("LastModified", iso8601(last_modified)) + _element("ETag", etag)
    return _document("CopyObjectResult", inner)


def copy_part_result(etag: str, last_modified: datetime) -> bytes:
    inner = _element("LastModified", iso8601(last_modified)) + _element("ETag", etag)
    return _document("CopyPartResult", inner)


def initiate_multipart_upload(bucket: str, key: str, upload_id: str) -> bytes:
    inner = _element("Bucket", bucket) + _element("Key", key) + _element("UploadId", upload_id)
    return _document("InitiateMultipartUploadResult", inner)


def complete_multipart_upload(location: str, bucket: str, key: str, etag: str) -> bytes:
    inner = (
        _element("Location", location)
        + _element("Bucket", bucket)
        + _element("Key", key)
        + _element("ETag", etag)
    )
    return _document("CompleteMultipartUploadResult", inner)


@dataclass(frozen=True, slots=True)
class DeleteOutcome:
    key: str
    version_id: str | None = None
    code: str | None = None  # None: deleted
    message: str = ""


def delete_result(outcomes: list[DeleteOutcome], quiet: bool) -> bytes:
    """``<Deleted>`` per deleted key (none when quiet) and ``<Error>`` per refused one."""
    parts = []
    for outcome in outcomes:
        version = "" if outcome.version_id is None else _element("VersionId", outcome.version_id)
        if outcome.code is None:
            if not quiet:
                parts.append(f"<Deleted>{_element('Key', outcome.key)}{version}</Deleted>")
        else:
            parts.append(
                f"<Error>{_element('Key', outcome.key)}{version}{_element('Code', outcome.code)}"
                f"{_element('Message', outcome.message)}</Error>"
            )
    return _document("DeleteResult", "".join(parts))


def list_parts(
    bucket: str,
    key: str,
    upload_id: str,
    parts: list[PartInfo],
    *,
    part_number_marker: int,
    max_parts: int,
    truncated: bool,
    encode: bool,
) -> bytes:
    head = [_element("Bucket", bucket), _element("Key", _url(key, encode))]
    head.append(_element("UploadId", upload_id))
    head.append(f"<Initiator>{_OWNER}</Initiator><Owner>{_OWNER}</Owner>")
    head.append("<StorageClass>STANDARD</StorageClass>")
    head.append(f"<PartNumberMarker>{part_number_marker}</PartNumberMarker>")
    if parts:
        head.append(f"<NextPartNumberMarker>{parts[-1].part_number}</NextPartNumberMarker>")
    head.append(f"<MaxParts>{max_parts}</MaxParts>")
    if encode:
        head.append("<EncodingType>url</EncodingType>")
    head.append(f"<IsTruncated>{'true' if truncated else 'false'}</IsTruncated>")
    rows = "".join(
        f"<Part><PartNumber>{p.part_number}</PartNumber>"
        f"{_element('LastModified', iso8601(p.last_modified))}"
        f"{_element('ETag', p.etag)}<Size>{p.size}</Size></Part>"
        for p in parts
    )
    return _document("ListPartsResult", "".join(head) + rows)


def list_multipart_uploads(
    bucket: str,
    uploads: list[UploadInfo],
    common_prefixes: list[str],
    *,
    prefix: str,
    delimiter: str,
    key_marker: str,
    upload_id_marker: str,
    next_markers: tuple[str, str] | None,
    max_uploads: int,
    truncated: bool,
    encode: bool,
) -> bytes:
    head = [
        _element("Bucket", bucket),
        _element("KeyMarker", _url(key_marker, encode)),
        _element("UploadIdMarker", upload_id_marker),
    ]
    if next_markers is not None:
        head.append(_element("NextKeyMarker", _url(next_markers[0], encode)))
        head.append(_element("NextUploadIdMarker", next_markers[1]))
    head.append(_element("Prefix", _url(prefix, encode)))
    if delimiter:
        head.append(_element("Delimiter", _url(delimiter, encode)))
    head.append(f"<MaxUploads>{max_uploads}</MaxUploads>")
    if encode:
        head.append("<EncodingType>url</EncodingType>")
    head.append(f"<IsTruncated>{'true' if truncated else 'false'}</IsTruncated>")
    rows = "".join(
        f"<Upload>{_element('Key', _url(u.key, encode))}{_element('UploadId', u.upload_id)}"
        f"<Initiator>{_OWNER}</Initiator><Owner>{_OWNER}</Owner>"
        f"<StorageClass>STANDARD</StorageClass>"
        f"{_element('Initiated', iso8601(u.initiated))}</Upload>"
        for u in uploads
    )
    rolled = "".join(
        f"<CommonPrefixes>{_element('Prefix', _url(p, encode))}</CommonPrefixes>"
        for p in common_prefixes
    )
    return _document("ListMultipartUploadsResult", "".join(head) + rows + rolled)
