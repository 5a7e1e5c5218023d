"""S3 XML response bodies, written as text.

String building beats an ElementTree for the hot listing path and keeps the
element order S3 uses. Every value goes through ``_text``; with
``encoding-type=url`` the key-like values are percent-encoded first, as S3
does, so keys with characters XML 1.0 cannot carry survive the trip.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import format_datetime
from urllib.parse import quote
from xml.sax.saxutils import escape

from gateway.origins.base import BucketInfo, ListPage

NAMESPACE = "http://s3.amazonaws.com/doc/2006-03-01/"
DECLARATION = '<?xml version="1.0" encoding="UTF-8"?>\n'
OWNER_ID = "hoard"


@functools.lru_cache(maxsize=4096)  # a dataset's files share few distinct times
def iso8601(moment: datetime) -> str:
    """S3's timestamp form: ``2026-11-21T17:42:39.000Z``."""
    if moment.tzinfo is not UTC:
        moment = moment.astimezone(UTC)
    return moment.isoformat(timespec="milliseconds")[:-6] + "Z"  # less its "+00:00"


# Characters XML 1.0 cannot carry (control bytes, lone surrogates from undecodable
# input). Error fields echo client input, so they must never break the document.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def http_date(moment: datetime) -> str:
    """RFC 9110 IMF-fixdate, as in Last-Modified: ``Sat, 21 Nov 2026 17:42:39 GMT``."""
    # Kept by the whole second it shows: objects written together share theirs, where
    # their microseconds made each datetime an entry of its own (a miss per object).
    return _http_date_of(moment.replace(microsecond=0))


@functools.lru_cache(maxsize=8192)
def _http_date_of(moment: datetime) -> str:
    return format_datetime(moment.astimezone(UTC), usegmt=True)


# Anything _text would change: most values (keys, ETags) have none, and are kept as they are.
_NOT_PLAIN = re.compile("[&<>\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _text(value: str) -> str:
    if _NOT_PLAIN.search(value) is None:  # a listing page has thousands of values
        return value
    return escape(_NOT_XML.sub("\ufffd", value))


def _element(name: str, value: str) -> str:
    return f"<{name}>{_text(value)}</{name}>"


def _url(value: str, encode: bool) -> str:
    return quote(value, safe="/") if encode else value


def _field(name: str, value: str | list[str]) -> str:
    """One extra element of an error; a list of keys as ``<Key>`` children (``MissingKeys``)."""
    if isinstance(value, str):
        return _element(name, value)
    return f"<{name}>{''.join(_element('Key', key) for key in value)}</{name}>"


def error(code: str, message: str, request_id: str, fields: Mapping[str, str | list[str]]) -> bytes:
    extra = "".join(_field(name, value) for name, value in fields.items())
    body = (
        f"<Error>{_element('Code', code)}{_element('Message', message)}{extra}"
        f"{_element('RequestId', request_id)}{_element('HostId', request_id)}</Error>"
    )
    return (DECLARATION + body).encode()


XML_TYPE = "application/xml"


def list_buckets(
    buckets: list[BucketInfo], prefix: str | None = None, continuation_token: str | None = None
) -> bytes:
    """``prefix`` is echoed when it was asked; ``continuation_token`` when more follow."""
    items = "".join(
        f"<Bucket>{_element('Name', b.name)}{_element('CreationDate', iso8601(b.created))}</Bucket>"
        for b in buckets
    )
    owner = f"<Owner><ID>{OWNER_ID}</ID><DisplayName>{OWNER_ID}</DisplayName></Owner>"
    tail = _element("ContinuationToken", continuation_token) if continuation_token else ""
    tail += _element("Prefix", prefix) if prefix is not None else ""
    return (
        f'{DECLARATION}<ListAllMyBucketsResult xmlns="{NAMESPACE}">{owner}'
        f"<Buckets>{items}</Buckets>{tail}</ListAllMyBucketsResult>"
    ).encode()


def location(region: str) -> bytes:
    # us-east-1 is the one region S3 reports as an empty constraint.
    constraint = "" if region == "us-east-1" else _text(region)
    return f'{DECLARATION}<LocationConstraint xmlns="{NAMESPACE}">{constraint}</LocationConstraint>'.encode()


def _owner(owner: tuple[str, str] | None) -> str:
    if owner is None:
        return ""
    return f"<Owner>{_element('ID', owner[0])}{_element('DisplayName', owner[1])}</Owner>"


def _contents(page: ListPage, encode: bool, owner: bool) -> str:
    """``owner``: v1 always names each key's owner, v2 only with ``fetch-owner=true``."""
    if not encode and _plain(page):
        return _plain_contents(page, owner)
    parts = []
    for entry in page.entries:
        checksums = "".join(_element("ChecksumAlgorithm", a) for a in entry.checksum_algorithms)
        parts.append(
            f"<Contents>{_element('Key', _url(entry.key, encode))}"
            f"{_element('LastModified', iso8601(entry.last_modified))}"
            f"{_element('ETag', entry.etag)}{checksums}<Size>{entry.size}</Size>"
            f"{_element('StorageClass', entry.storage_class)}"
            f"{_owner(entry.owner) if owner else ''}</Contents>"
        )
    for prefix in page.common_prefixes:
        parts.append(f"<CommonPrefixes>{_element('Prefix', _url(prefix, encode))}</CommonPrefixes>")
    return "".join(parts)


def _plain(page: ListPage) -> bool:
    """Whether no value of the page needs escaping: one search instead of one per value."""
    values = [
        value for e in page.entries for value in (e.key, e.etag, e.storage_class, *(e.owner or ()))
    ]
    return _NOT_PLAIN.search("".join(values)) is None and not any(
        e.checksum_algorithms for e in page.entries
    )


def _plain_contents(page: ListPage, owner: bool) -> str:
    """``_contents`` of a page whose values need no escaping (the common case, and a
    thousand-key page from a cached listing must cost the server well under 5 ms)."""
    parts = [
        f"<Contents><Key>{e.key}</Key><LastModified>{iso8601(e.last_modified)}</LastModified>"
        f"<ETag>{e.etag}</ETag><Size>{e.size}</Size><StorageClass>{e.storage_class}"
        f"</StorageClass>{_owner(e.owner) if owner else ''}</Contents>"
        for e in page.entries
    ]
    parts.extend(
        f"<CommonPrefixes>{_element('Prefix', p)}</CommonPrefixes>" for p in page.common_prefixes
    )
    return "".join(parts)


def _list_bucket_result(
    head: list[str], page: ListPage, *, max_keys: int, delimiter: str, encode: bool, owner: bool
) -> bytes:
    """The part of a ListBucketResult both versions share, after their own leading elements."""
    head.append(f"<MaxKeys>{max_keys}</MaxKeys>")
    if delimiter:
        head.append(_element("Delimiter", _url(delimiter, encode)))
    if encode:
        head.append("<EncodingType>url</EncodingType>")
    head.append(f"<IsTruncated>{'true' if page.is_truncated else 'false'}</IsTruncated>")
    return (
        f'{DECLARATION}<ListBucketResult xmlns="{NAMESPACE}">{"".join(head)}'
        f"{_contents(page, encode, owner)}</ListBucketResult>"
    ).encode()


def list_objects_v2(
    bucket: str,
    page: ListPage,
    *,
    prefix: str,
    delimiter: str,
    max_keys: int,
    start_after: str,
    continuation_token: str | None,
    next_token: str | None,
    encode: bool,
    fetch_owner: bool,
) -> bytes:
    head = [_element("Name", bucket), _element("Prefix", _url(prefix, encode))]
    if start_after:
        head.append(_element("StartAfter", _url(start_after, encode)))
    if continuation_token is not None:
        head.append(_element("ContinuationToken", continuation_token))
    if next_token is not None:
        head.append(_element("NextContinuationToken", next_token))
    head.append(f"<KeyCount>{len(page.entries) + len(page.common_prefixes)}</KeyCount>")
    return _list_bucket_result(
        head, page, max_keys=max_keys, delimiter=delimiter, encode=encode, owner=fetch_owner
    )


def list_objects_v1(
    bucket: str,
    page: ListPage,
    *,
    prefix: str,
    delimiter: str,
    max_keys: int,
    marker: str,
    encode: bool,
) -> bytes:
    head = [
        _element("Name", bucket),
        # S3 sends ListObjects' own <Prefix> as it was asked, even with encoding-type=url.
        _element("Prefix", prefix),
        _element("Marker", _url(marker, encode)),
    ]
    # S3 sends NextMarker only with a delimiter; without one the last key is the marker.
    if page.is_truncated and delimiter and page.next_marker is not None:
        head.append(_element("NextMarker", _url(page.next_marker, encode)))
    return _list_bucket_result(
        head, page, max_keys=max_keys, delimiter=delimiter, encode=encode, owner=True
    )
