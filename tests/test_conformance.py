"""Differential conformance: each request sent to moto directly and through Hoard.

Hoard is judged by running S3 suites and clients through it in front of moto:
whatever passes against moto should pass through Hoard. So each case below is
one raw, SigV4-signed request, sent once to moto and once to Hoard (whose
``default_origin`` passes every bucket through to the same moto bucket); the
answers are compared field by field: status, the headers clients read, and
the body (bytes for objects; XML flattened element by element, without
RequestId/HostId). Reads go to Hoard twice, cold then warm, because the cache
must not change the answer.

Reads share their seeded objects (one copy per case, so the first Hoard read
is cold). Writes act on keys of their own per side (``{p}`` is the per-side
prefix), then the stored state at moto is compared too. Where Hoard follows
AWS's documented behaviour and moto does not, the case names the difference
in ``known``, with a comment citing the S3 behaviour.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import re
import uuid
import zlib
from collections import Counter
from dataclasses import dataclass, field
from email.utils import format_datetime
from pprint import pformat
from typing import Any
from urllib.parse import quote, urlsplit
from xml.etree import ElementTree

import pytest
from awscrt import checksums as crt

from tests.conftest import ORIGIN_KEY, ORIGIN_SECRET, seed
from tests.harness import ACCESS_KEY, SECRET_KEY, HoardProcess
from tests.rawhttp import RawResponse, signed_send

MiB = 1024 * 1024
RUN = uuid.uuid4().hex[:8]
MAIN, VERSIONED, LISTING = f"conf-{RUN}", f"conf-{RUN}-ver", f"conf-{RUN}-list"
LOCKED = f"conf-{RUN}-lock"  # object lock enabled
MISSING = f"conf-{RUN}-missing"
SMALL = b"0123456789abcdefghij"
PAYLOAD = b"hello, conformance"
PART = b"p" * (5 * MiB)  # the smallest part S3 accepts before the last one

# Headers whose values clients act on; any x-amz-meta-* and x-amz-checksum-* too.
COMPARED_HEADERS = (
    "Content-Length", "Content-Range", "ETag", "Last-Modified", "Content-Type",
    "Accept-Ranges", "Cache-Control", "Content-Disposition", "Content-Encoding",
    "Content-Language", "Expires", "x-amz-version-id", "x-amz-delete-marker",
)  # fmt: skip
# Every object-level header an origin sends on GET/HEAD (SSE-S3/KMS/C, tagging count,
# object lock, checksums...), which a cached answer must repeat.
PREFIXED_HEADERS = (
    "x-amz-meta-", "x-amz-checksum-", "x-amz-server-side-encryption", "x-amz-tagging-count",
    "x-amz-object-lock-", "x-amz-website-redirect-location", "x-amz-restore", "x-amz-expiration",
    "x-amz-replication-status", "x-amz-mp-parts-count", "x-amz-storage-class",
)  # fmt: skip
# Per-request identifiers that differ on every answer, wherever they come from.
IGNORED_ELEMENTS = frozenset({"RequestId", "HostId"})
# Values a write produces anew on each side: compared as present/absent only.
FRESH_FIELDS = ("h:last-modified", "h:x-amz-version-id", "/LastModified", "/UploadId",
                "/Initiated", "/VersionId")  # fmt: skip
# Continuation tokens are opaque (S3 API: "obfuscated and is not a real key"): Hoard
# makes its own, so only their presence is compared (pagination itself is).
OPAQUE_FIELDS = ("/NextContinuationToken",)
# Fields Hoard sends where moto sends none, for answers with these statuses. Each
# follows S3's documentation or RFC 9110; none changes what a client does.
HOARD_ADDS = (
    # S3 API, "Error responses": the REST error body names the <Resource>.
    (r"/Resource\[0\]", range(300, 600)),
    # RFC 9110 §15.5.17: a 416 SHOULD carry "Content-Range: bytes */<size>".
    (r"h:content-range", (416,)),
    # RFC 9110 §15.4.5 allows a 304 to carry Last-Modified; S3 sends it.
    (r"h:last-modified", (304,)),
    # S3 API ListObjects (v1): <Prefix> and <Marker> are always there, empty or not
    # (moto drops them when empty), and Contents carries ChecksumAlgorithm as in v2.
    (r"/(Prefix|Marker)\[0\]", (200,)),
    (r"/Contents\[\d+\]/ChecksumAlgorithm\[0\]", (200,)),
    # S3 API ListObjectsV2: "ContinuationToken: If ContinuationToken was sent with
    # the request, it is included in the response." moto leaves it out.
    (r"/ContinuationToken\[0\]", (200,)),
)


def checksum(algorithm: str, data: bytes) -> str:
    """The base64 x-amz-checksum-* value, as botocore computes it."""
    digest = {
        "crc32": lambda: zlib.crc32(data).to_bytes(4, "big"),
        "crc32c": lambda: crt.crc32c(data).to_bytes(4, "big"),
        "crc64nvme": lambda: crt.crc64nvme(data).to_bytes(8, "big"),
        "sha1": lambda: hashlib.sha1(data).digest(),
        "sha256": lambda: hashlib.sha256(data).digest(),
    }[algorithm]()
    return base64.b64encode(digest).decode()


def md5(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data).digest()).decode()


# --- the seeded objects reads ask for --------------------------------------------------

OBJECTS: dict[str, tuple[bytes, dict[str, Any]]] = {
    "small.txt": (SMALL, {}),
    "empty": (b"", {}),
    "typed.bin": (SMALL, {"ContentType": "application/x-test", "Metadata": {"owner": "team-a", "n": "1"},
                          "CacheControl": "max-age=60", "ContentDisposition": "attachment",
                          "ContentEncoding": "identity", "ContentLanguage": "en",
                          "Expires": dt.datetime(2030, 1, 1, tzinfo=dt.UTC)}),
    "with space.txt": (b"space", {}),
    "ünï/ключ.bin": (b"unicode", {}),
    "a+b.txt": (b"plus", {}),
    "100%.txt": (b"percent", {}),
    "a//b.txt": (b"double slash", {}),
    "sse.bin": (SMALL, {"ServerSideEncryption": "AES256"}),
    "kms.bin": (SMALL, {"ServerSideEncryption": "aws:kms", "BucketKeyEnabled": True,
                        "SSEKMSKeyId": "arn:aws:kms:us-east-1:123456789012:key/conformance"}),
    "tagged.bin": (SMALL, {"Tagging": "team=a&tier=1"}),
    "redirect.bin": (SMALL, {"WebsiteRedirectLocation": "/elsewhere.html"}),
    "sha256.bin": (SMALL, {"ChecksumAlgorithm": "SHA256"}),
    "cold.bin": (SMALL, {"StorageClass": "GLACIER"}),  # restored after the put: x-amz-restore
}  # fmt: skip
LOCKED_OBJECT = {"ObjectLockMode": "GOVERNANCE", "ObjectLockLegalHoldStatus": "ON",
                 "ObjectLockRetainUntilDate": dt.datetime(2099, 1, 1, tzinfo=dt.UTC)}  # fmt: skip
MULTIPART_KEY = "mpu.bin"
SIZES = {name: len(body) for name, (body, _) in OBJECTS.items()} | {
    MULTIPART_KEY: len(PART) + len(SMALL)
}


def seed_read(client, prefix: str, key: str | None) -> dict[str, str]:
    """The case's own copy of the object it reads; substitutions for its ETag and dates."""
    if key == MULTIPART_KEY:
        upload = client.create_multipart_upload(Bucket=MAIN, Key=prefix + key)["UploadId"]
        parts = [
            {"PartNumber": n, "ETag": client.upload_part(Bucket=MAIN, Key=prefix + key, UploadId=upload,
                                                         PartNumber=n, Body=body)["ETag"]}
            for n, body in ((1, PART), (2, SMALL))
        ]  # fmt: skip
        client.complete_multipart_upload(Bucket=MAIN, Key=prefix + key, UploadId=upload,
                                         MultipartUpload={"Parts": parts})  # fmt: skip
    elif key in OBJECTS:
        body, extra = OBJECTS[key]
        client.put_object(Bucket=MAIN, Key=prefix + key, Body=body, **extra)
        if extra.get("StorageClass") == "GLACIER":
            client.restore_object(Bucket=MAIN, Key=prefix + key, RestoreRequest={"Days": 1})
    else:
        return {}
    head = client.head_object(Bucket=MAIN, Key=prefix + key)
    modified = head["LastModified"].astimezone(dt.UTC)
    return {
        "etag": head["ETag"],
        "lm": format_datetime(modified, usegmt=True),
        "past": format_datetime(modified - dt.timedelta(days=1), usegmt=True),
        "future": format_datetime(modified + dt.timedelta(days=1), usegmt=True),
    }


def seed_locked(client, prefix: str) -> dict[str, str]:
    client.put_object(Bucket=LOCKED, Key=prefix + "held", Body=SMALL, **LOCKED_OBJECT)
    return {}


def seed_versions(client, prefix: str) -> dict[str, str]:
    v1 = client.put_object(Bucket=VERSIONED, Key=prefix + "doc", Body=b"one")["VersionId"]
    v2 = client.put_object(Bucket=VERSIONED, Key=prefix + "doc", Body=b"two, longer")["VersionId"]
    client.put_object(Bucket=VERSIONED, Key=prefix + "gone", Body=b"soon deleted")
    marker = client.delete_object(Bucket=VERSIONED, Key=prefix + "gone")["VersionId"]
    return {"v1": v1, "v2": v2, "dm": marker}


# --- what writes find before they run (per side, at moto) ------------------------------


def _existing(client, bucket: str, p: str) -> dict[str, str]:
    etag = client.put_object(Bucket=bucket, Key=p + "obj", Body=b"was here")["ETag"]
    return {"etag": etag}


def _source(client, bucket: str, p: str) -> dict[str, str]:
    head = client.put_object(Bucket=bucket, Key=p + "src", Body=SMALL, ContentType="text/x-src",
                             Metadata={"from": "src"}, CacheControl="no-cache")  # fmt: skip
    modified = client.head_object(Bucket=bucket, Key=p + "src")["LastModified"].astimezone(dt.UTC)
    return {
        "etag": head["ETag"],
        "past": format_datetime(modified - dt.timedelta(days=1), usegmt=True),
        "future": format_datetime(modified + dt.timedelta(days=1), usegmt=True),
    }


def _upload(client, bucket: str, p: str, **extra: Any) -> dict[str, str]:
    upload = client.create_multipart_upload(Bucket=bucket, Key=p + "obj", **extra)["UploadId"]
    return {"upload": upload}


def _parts(client, bucket: str, p: str, first: bytes = PART) -> dict[str, str]:
    found = _upload(client, bucket, p)
    for n, body in ((1, first), (2, SMALL)):
        found[f"etag{n}"] = client.upload_part(Bucket=bucket, Key=p + "obj", UploadId=found["upload"],
                                               PartNumber=n, Body=body)["ETag"]  # fmt: skip
    return found


def _checksum_parts(client, bucket: str, p: str, **extra: Any) -> dict[str, str]:
    found = _upload(client, bucket, p, ChecksumAlgorithm="CRC32", **extra)
    found["whole_crc"] = checksum("crc32", PART + SMALL)
    for n, body in ((1, PART), (2, SMALL)):
        answer = client.upload_part(Bucket=bucket, Key=p + "obj", UploadId=found["upload"],
                                    PartNumber=n, Body=body, ChecksumAlgorithm="CRC32")  # fmt: skip
        found[f"etag{n}"], found[f"crc{n}"] = answer["ETag"], answer["ChecksumCRC32"]
    return found


def _tagged(client, bucket: str, p: str) -> dict[str, str]:
    client.put_object(Bucket=bucket, Key=p + "obj", Body=b"tagged", Tagging="team=a&tier=1")
    return {}


def _two(client, bucket: str, p: str) -> dict[str, str]:
    for name in ("a", "b"):
        client.put_object(Bucket=bucket, Key=p + name, Body=name.encode())
    return {}


def _bucket(client, bucket: str, p: str) -> dict[str, str]:
    client.create_bucket(Bucket=bucket)
    return {}


def _full_bucket(client, bucket: str, p: str) -> dict[str, str]:
    client.create_bucket(Bucket=bucket)
    client.put_object(Bucket=bucket, Key="x", Body=b"x")
    return {}


PREPARE = {
    "existing": _existing, "source": _source, "upload": _upload, "parts": _parts,
    "small_parts": lambda c, b, p: _parts(c, b, p, first=b"x"), "checksum_parts": _checksum_parts,
    "full_object_parts": lambda c, b, p: _checksum_parts(c, b, p, ChecksumType="FULL_OBJECT"),
    "tagged": _tagged, "two": _two, "bucket": _bucket, "full_bucket": _full_bucket,
}  # fmt: skip


# --- the table -------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One request. ``key`` None is a bucket request, ``bucket`` "" the service.

    ``bucket``: "main", "versioned", "listing", "missing", "fresh" (a new bucket per
    side) or "" (ListBuckets). ``query``, ``headers`` and ``body`` may name
    substitutions: ``{p}`` the case's key prefix, ``{b}`` the bucket, ``{md5}`` the
    body's Content-MD5, and what seeding or ``prepare`` found (``{etag}``, ``{upload}``...).
    ``known``: fields where Hoard answers differently from moto on purpose, with
    Hoard's value (moto's is not compared).
    """

    id: str
    method: str
    key: str | None = "small.txt"
    query: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | None = None
    bucket: str = "main"
    prepare: str | None = None
    known: dict[str, object] = field(default_factory=dict)

    @property
    def writes(self) -> bool:
        return self.method not in ("GET", "HEAD")


def get(id: str, key: str | None = "small.txt", **kw: Any) -> Case:
    return Case(id, "GET", key, **kw)


def head(id: str, key: str | None = "small.txt", **kw: Any) -> Case:
    return Case(id, "HEAD", key, **kw)


def rng(value: str) -> dict[str, str]:
    return {"Range": value}


def listing(id: str, query: str, **kw: Any) -> Case:
    return Case(id, "GET", None, query, bucket="listing", **kw)


def put(
    id: str, headers: dict[str, str] | None = None, body: bytes | None = PAYLOAD, **kw: Any
) -> Case:
    return Case(id, "PUT", kw.pop("key", "obj"), headers=headers or {}, body=body, **kw)


def copy(id: str, headers: dict[str, str], key: str = "obj", **kw: Any) -> Case:
    return Case(id, "PUT", key, headers={"x-amz-copy-source": "/{b}/{p}src", **headers},
                prepare="source", **kw)  # fmt: skip


def complete(parts: str) -> bytes:
    """A CompleteMultipartUpload body from ``n:etag-substitution[:crc-substitution]`` items."""
    items = []
    for part in parts.split():
        number, etag, *crc = part.split(":")
        extra = f"<ChecksumCRC32>{{{crc[0]}}}</ChecksumCRC32>" if crc else ""
        items.append(
            f"<Part><PartNumber>{number}</PartNumber><ETag>{{{etag}}}</ETag>{extra}</Part>"
        )
    return f"<CompleteMultipartUpload>{''.join(items)}</CompleteMultipartUpload>".encode()


def delete_body(quiet: bool, *keys: str) -> bytes:
    objects = "".join(f"<Object><Key>{{p}}{key}</Key></Object>" for key in keys)
    return f"<Delete><Quiet>{str(quiet).lower()}</Quiet>{objects}</Delete>".encode()


def hoard_answers(status: int, code: str | None = None, **more: object) -> dict[str, object]:
    """``known`` for a case where moto departs from S3: Hoard's status and error code."""
    return {"status": status, **({"/Code[0]": code} if code else {}), **more}


NOTHING_STORED = {"stored:keys": []}
CHECKSUMS = {"x-amz-checksum-mode": "ENABLED"}
TAGS = b"<Tagging><TagSet><Tag><Key>team</Key><Value>b</Value></Tag></TagSet></Tagging>"
READS = [
    # whole objects
    get("get"), head("head"), get("get-empty", "empty"), head("head-empty", "empty"),
    get("get-typed", "typed.bin"), head("head-typed", "typed.bin"),
    get("get-multipart", MULTIPART_KEY), head("head-multipart", MULTIPART_KEY),
    # ranges
    get("range-a-b", headers=rng("bytes=2-5")), head("head-range-a-b", headers=rng("bytes=2-5")),
    get("range-a-", headers=rng("bytes=15-")), get("range-suffix", headers=rng("bytes=-4")),
    get("range-0-0", headers=rng("bytes=0-0")), get("range-last-byte", headers=rng("bytes=19-19")),
    get("range-end-past-size", headers=rng("bytes=10-999")),
    get("range-start-at-size", headers=rng("bytes=20-")), get("range-beyond-end", headers=rng("bytes=50-60")),
    head("head-range-beyond-end", headers=rng("bytes=50-60")),
    get("range-suffix-longer", headers=rng("bytes=-100")), get("range-suffix-zero", headers=rng("bytes=-0")),
    get("range-multiple", headers=rng("bytes=0-1,4-5")), get("range-reversed", headers=rng("bytes=5-2")),
    get("range-garbage", headers=rng("bytes=abc")),
    # RFC 9110 §14.1: a Range in a unit the server does not know is ignored; moto reads "items" as bytes.
    get("range-other-unit", headers=rng("items=0-1"), known=hoard_answers(200)),
    # A Range without a unit is ignored (RFC 9110 §14.2); moto fails with an HTML 500.
    get("range-no-unit", headers=rng("0-1"), known=hoard_answers(200)), get("range-spaces", headers=rng("bytes= 1 - 2")),
    get("range-empty-object", "empty", headers=rng("bytes=0-0")),
    get("range-suffix-empty-object", "empty", headers=rng("bytes=-5")),
    get("range-across-parts", MULTIPART_KEY, headers=rng(f"bytes={5 * MiB - 2}-{5 * MiB + 2}")),
    # conditionals
    get("if-match", headers={"If-Match": "{etag}"}), get("if-match-wrong", headers={"If-Match": '"nope"'}),
    # RFC 9110 §13.1.1 (S3 GetObject follows it): If-Match "*" matches any current object,
    # and a list matches if any entity tag does; moto answers both 412.
    get("if-match-star", headers={"If-Match": "*"}, known=hoard_answers(200)),
    get("if-match-list", headers={"If-Match": '"x", {etag}'}, known=hoard_answers(200)),
    # moto's HEAD 412 describes the object (ETag, Last-Modified, its type); a failed
    # precondition describes no representation, so Hoard's carries none.
    head("head-if-match-wrong", headers={"If-Match": '"nope"'},
         known={"h:etag": None, "h:last-modified": None, "h:accept-ranges": None, "h:content-type": "application/xml"}),
    get("if-none-match", headers={"If-None-Match": "{etag}"}),
    get("if-none-match-other", headers={"If-None-Match": '"nope"'}),
    # RFC 9110 §13.1.2: If-None-Match "*" is false when the object exists: 304. moto: 200.
    get("if-none-match-star", headers={"If-None-Match": "*"}, known=hoard_answers(304)),
    # moto adds Accept-Ranges to a HEAD 304 (not to a GET 304); Hoard sends it on neither.
    head("head-if-none-match", headers={"If-None-Match": "{etag}"}, known={"h:accept-ranges": None}),
    get("if-modified-since-past", headers={"If-Modified-Since": "{past}"}),
    get("if-modified-since-future", headers={"If-Modified-Since": "{future}"}),
    get("if-modified-since-equal", headers={"If-Modified-Since": "{lm}"}),
    # RFC 9110 §13.1.3: an invalid date is ignored; moto fails with an HTML 500.
    get("if-modified-since-garbage", headers={"If-Modified-Since": "yesterday"}, known=hoard_answers(200)),
    get("if-unmodified-since-past", headers={"If-Unmodified-Since": "{past}"}),
    get("if-unmodified-since-future", headers={"If-Unmodified-Since": "{future}"}),
    # S3 GetObject: "If-Match evaluates to true, and If-Unmodified-Since evaluates to false;
    # then, S3 returns 200 OK and the data requested." moto answers 412.
    get("if-match-and-unmodified-since-false", headers={"If-Match": "{etag}", "If-Unmodified-Since": "{past}"},
        known=hoard_answers(200)),
    get("if-none-match-false-and-modified-since-true", headers={"If-None-Match": '"nope"', "If-Modified-Since": "{past}"}),
    get("if-none-match-true-and-modified-since-false", headers={"If-None-Match": "{etag}", "If-Modified-Since": "{future}"}),
    get("if-match-wrong-and-none-match", headers={"If-Match": '"nope"', "If-None-Match": "{etag}"}),
    get("if-match-with-range", headers={"If-Match": "{etag}", **rng("bytes=0-3")}),
    get("if-none-match-with-range", headers={"If-None-Match": "{etag}", **rng("bytes=0-3")}),
    get("if-match-wrong-range-beyond", headers={"If-Match": '"nope"', **rng("bytes=50-")}),
    # response-* overrides: S3 GetObject/HeadObject set these headers from the query
    # (signed requests only); moto ignores them.
    get("response-overrides", known={"h:content-type": "text/x", "h:cache-control": "no-store",
        "h:content-disposition": "inline", "h:content-encoding": "gzip", "h:content-language": "fr",
        "h:expires": "Thu, 01 Jan 2032 00:00:00 GMT"}, query="response-content-type=text%2Fx&response-cache-control=no-store&"
        "response-content-disposition=inline&response-content-encoding=gzip&"
        "response-content-language=fr&response-expires=Thu%2C%2001%20Jan%202032%2000%3A00%3A00%20GMT"),
    head("head-response-override", "typed.bin", query="response-content-type=text%2Fplain",
         known={"h:content-type": "text/plain"}),
    get("response-override-with-range", query="response-content-type=text%2Fx", headers=rng("bytes=1-2"),
        known={"h:content-type": "text/x"}),
    # object-level headers the origin keeps with an object, repeated from the cache
    *[case(f"{name}-{kind}", key) for name, key in (("sse-s3", "sse.bin"), ("sse-kms", "kms.bin"),
      ("tagging-count", "tagged.bin"), ("website-redirect", "redirect.bin")) for kind, case in (("get", get), ("head", head))],
    head("head-restore", "cold.bin"),
    get("object-lock", "held", bucket="locked"), head("head-object-lock", "held", bucket="locked"),
    get("sse-kms-range", "kms.bin", headers=rng("bytes=1-3")),
    # x-amz-checksum-mode: ENABLED asks for the object's checksums (whole objects only)
    get("checksum-mode", headers=CHECKSUMS), head("head-checksum-mode", headers=CHECKSUMS),
    get("checksum-mode-sha256", "sha256.bin", headers=CHECKSUMS), head("head-checksum-mode-sha256", "sha256.bin", headers=CHECKSUMS),
    get("checksum-mode-multipart", MULTIPART_KEY, headers=CHECKSUMS), get("checksum-mode-empty", "empty", headers=CHECKSUMS),
    get("checksum-mode-not-asked", "sha256.bin"),
    # S3 sends no checksum for a range (they describe the whole object; MinIO matched it
    # in minio/minio#17105); moto sends the whole object's.
    get("checksum-mode-range", "sha256.bin", headers={**CHECKSUMS, **rng("bytes=1-3")},
        known={"h:x-amz-checksum-sha256": None, "h:x-amz-checksum-type": None}),
    # RFC 9110 §10.1.1: an expectation other than 100-continue may be ignored; S3 does.
    get("expect-unknown", headers={"Expect": "200"}), head("head-expect-unknown", headers={"Expect": "200"}),
    # partNumber
    get("part-1-of-multipart", MULTIPART_KEY, query="partNumber=1"),
    head("head-part-2-of-multipart", MULTIPART_KEY, query="partNumber=2"),
    get("part-out-of-range", MULTIPART_KEY, query="partNumber=3"),
    get("part-1-of-simple", query="partNumber=1"), get("part-2-of-simple", query="partNumber=2"),
    # missing things and odd keys
    # moto types some HEAD 404s text/html; S3 types every error application/xml.
    get("missing-key", "nope"), head("head-missing-key", "nope", known={"h:content-type": "application/xml"}),
    get("missing-bucket", bucket="missing"), head("head-missing-bucket", bucket="missing"),
    get("key-with-space", "with space.txt"), get("key-unicode", "ünï/ключ.bin"),
    get("key-plus", "a+b.txt"), get("key-percent", "100%.txt"), get("key-double-slash", "a//b.txt"),
    head("head-key-unicode", "ünï/ключ.bin"),
    # versions
    get("version-current", "doc", bucket="versioned"), get("version-old", "doc", query="versionId={v1}", bucket="versioned"),
    head("head-version-old", "doc", query="versionId={v1}", bucket="versioned"),
    get("version-missing", "doc", query="versionId=nonexistent", bucket="versioned"),
    # A 404 whose current version is a delete marker names it (x-amz-delete-marker and
    # its version id), also when Hoard answers the warm HEAD from its negative entry.
    get("delete-marker", "gone", bucket="versioned"), head("head-delete-marker", "gone", bucket="versioned"),
    get("delete-marker-by-version", "gone", query="versionId={dm}", bucket="versioned"),
    get("list-versions", None, query="versions&prefix={p}", bucket="versioned"),
    get("list-versions-max-1", None, query="versions&prefix={p}&max-keys=1", bucket="versioned"),
    # buckets
    # Hoard answers ListBuckets itself, for every origin and mount it serves: the owner is Hoard.
    Case("list-buckets", "GET", None, bucket="", known={"/Owner[0]/ID[0]": "hoard", "/Owner[0]/DisplayName[0]": "hoard"}),
    Case("list-buckets-prefix", "GET", None, f"prefix=conf-{RUN}-l", bucket="",
         known={"/Owner[0]/ID[0]": "hoard", "/Owner[0]/DisplayName[0]": "hoard"}),
    Case("list-buckets-max-1", "GET", None, f"prefix=conf-{RUN}&max-buckets=1", bucket="",
         known={"/Owner[0]/ID[0]": "hoard", "/Owner[0]/DisplayName[0]": "hoard"}),
    head("head-bucket", None),
    # A name no SDK can send is the origin's to judge (Hoard's origin client cannot send it).
    get("colon-bucket-object", "k", bucket="colon"), head("head-colon-bucket-object", "k", bucket="colon"),
    get("colon-bucket-list", None, query="list-type=2", bucket="colon"), head("head-colon-bucket", None, bucket="colon"),
    head("head-missing-bucket-itself", None, bucket="missing", known={"h:content-type": "application/xml"}),
    get("bucket-location", None, query="location"), get("bucket-location-missing", None, query="location", bucket="missing"),
    get("list-missing-bucket", None, query="list-type=2", bucket="missing"),
    get("object-acl", query="acl"),
    # listings
    # S3 ListObjects (v1): "NextMarker ... is returned only if you have the delimiter
    # request parameter specified"; moto sends one (an internal token) without a delimiter.
    listing("list-v2", "list-type=2"), listing("list-v1", "", known={"/NextMarker[0]": None}),
    listing("list-v2-prefix", "list-type=2&prefix=dir%2F"), listing("list-v2-delimiter", "list-type=2&delimiter=%2F"),
    listing("list-v2-prefix-delimiter", "list-type=2&prefix=dir%2F&delimiter=%2F"),
    listing("list-v1-prefix-delimiter", "prefix=dir%2F&delimiter=%2F"),
    listing("list-v2-max-0", "list-type=2&max-keys=0"), listing("list-v2-max-1", "list-type=2&max-keys=1"),
    # S3 returns at most 1000 keys whatever max-keys asks; moto returns 1001.
    listing("list-v2-max-1000", "list-type=2&max-keys=1000"),
    listing("list-v2-max-1001", "list-type=2&max-keys=1001", known={"/KeyCount[0]": "1000", "/Contents[1000]*": None}),
    listing("list-v1-max-0", "max-keys=0"), listing("list-v1-max-1", "max-keys=1", known={"/NextMarker[0]": None}),
    # max-keys counts keys and common prefixes together (S3 ListObjects); moto adds every
    # prefix beyond it, and its NextMarker is a token rather than the last key.
    listing("list-v1-max-1-delimiter", "max-keys=1&delimiter=%2F", known={"/NextMarker[0]": "a", "/CommonPrefixes*": None}),
    listing("list-v1-max-1001", "max-keys=1001", known={"/NextMarker[0]": None, "/Contents[1000]*": None}),
    # S3 refuses a negative or non-numeric max-keys (400 InvalidArgument); moto lists all
    # keys for -1 and fails with an HTML 500 for "x".
    listing("list-v2-max-negative", "list-type=2&max-keys=-1", known=hoard_answers(400, "InvalidArgument")),
    listing("list-v2-max-garbage", "list-type=2&max-keys=x", known=hoard_answers(400, "InvalidArgument")),
    listing("list-v2-start-after", "list-type=2&start-after=dir%2Fb"),
    listing("list-v2-start-after-past-end", "list-type=2&start-after=zzz"),
    listing("list-v1-marker", "marker=dir%2Fb", known={"/NextMarker[0]": None}),
    listing("list-v2-continuation", "list-type=2&max-keys=2&continuation-token={token}"),
    # S3: 400 InvalidArgument "The continuation token provided is incorrect"; moto: HTML 500.
    listing("list-v2-continuation-invalid", "list-type=2&continuation-token=bm90LWEtdG9rZW4",
            known=hoard_answers(400, "InvalidArgument")),
    listing("list-v2-encoding-url", "list-type=2&encoding-type=url"),
    listing("list-v1-encoding-url", "encoding-type=url", known={"/NextMarker[0]": None}),
    listing("list-v1-encoding-url-prefix", "encoding-type=url&prefix=e%20f"),
    # S3 refuses an encoding-type other than url (400 InvalidArgument); moto ignores it.
    listing("list-v2-encoding-bad", "list-type=2&encoding-type=zip", known=hoard_answers(400, "InvalidArgument")),
    listing("list-v2-fetch-owner", "list-type=2&fetch-owner=true&prefix=dir%2F"),
    listing("list-v1-owner", "prefix=dir%2F"),
    listing("list-v2-prefix-nothing", "list-type=2&prefix=nothing-here"),
    listing("list-multipart-uploads", "uploads"),
]  # fmt: skip
WRITES = [
    put("put"), put("put-empty", body=b""),
    # S3 checks Content-MD5 and x-amz-checksum-* against the body (400 BadDigest, or
    # InvalidDigest for an unreadable one) and stores nothing; moto stores the object.
    put("put-md5-right", {"Content-MD5": md5(PAYLOAD)}),
    put("put-md5-wrong", {"Content-MD5": md5(b"other")}, known=hoard_answers(400, "BadDigest", **NOTHING_STORED)),
    put("put-md5-garbage", {"Content-MD5": "not-base64!"}, known=hoard_answers(400, "InvalidDigest", **NOTHING_STORED)),
    *[put(f"put-{alg}-right", {f"x-amz-checksum-{alg}": checksum(alg, PAYLOAD)})
      for alg in ("crc32", "crc32c", "crc64nvme", "sha1", "sha256")],
    *[put(f"put-{alg}-wrong", {f"x-amz-checksum-{alg}": checksum(alg, b"other")},
          known=hoard_answers(400, "BadDigest", **NOTHING_STORED))
      for alg in ("crc32", "crc32c", "crc64nvme", "sha1", "sha256")],
    put("put-headers", {"Content-Type": "text/x-mine", "Cache-Control": "max-age=5", "Content-Disposition": "inline",
                        "Content-Encoding": "identity", "Content-Language": "de", "x-amz-meta-owner": "me",
                        "x-amz-meta-Mixed-Case": "v", "Expires": "Thu, 01 Jan 2032 00:00:00 GMT"}),
    put("put-if-none-match-new", {"If-None-Match": "*"}),
    put("put-if-none-match-existing", {"If-None-Match": "*"}, prepare="existing"),
    put("put-overwrite", prepare="existing"), put("put-versioned", bucket="versioned"),
    put("put-missing-bucket", bucket="missing"),
    put("put-tagging-header", {"x-amz-tagging": "a=1&b=2"}),
    # copies
    copy("copy", {}), copy("copy-replace", {"x-amz-metadata-directive": "REPLACE", "Content-Type": "text/x-new",
                                            "x-amz-meta-fresh": "yes"}),
    copy("copy-to-itself", {}, key="src"),
    copy("copy-to-itself-replace", {"x-amz-metadata-directive": "REPLACE", "x-amz-meta-again": "1"}, key="src"),
    copy("copy-if-match", {"x-amz-copy-source-if-match": "{etag}"}),
    copy("copy-if-match-wrong", {"x-amz-copy-source-if-match": '"nope"'}),
    copy("copy-if-none-match", {"x-amz-copy-source-if-none-match": "{etag}"}),
    copy("copy-if-modified-since-future", {"x-amz-copy-source-if-modified-since": "{future}"}),
    copy("copy-if-unmodified-since-past", {"x-amz-copy-source-if-unmodified-since": "{past}"}),
    copy("copy-missing-source", {"x-amz-copy-source": "/{b}/{p}nope"}),
    # deletes
    Case("delete", "DELETE", "obj", prepare="existing"), Case("delete-missing", "DELETE", "nope"),
    Case("delete-missing-bucket", "DELETE", "nope", bucket="missing"),
    Case("delete-objects", "POST", None, "delete", {"Content-MD5": "{md5}"}, delete_body(False, "a", "b", "nope"), prepare="two"),
    Case("delete-objects-quiet", "POST", None, "delete", {"Content-MD5": "{md5}"}, delete_body(True, "a", "nope"), prepare="two"),
    # multipart
    Case("mpu-create", "POST", "obj", "uploads", {"Content-Type": "text/x-mpu", "x-amz-meta-m": "1"}),
    Case("mpu-upload-part", "PUT", "obj", "partNumber=1&uploadId={upload}", body=PAYLOAD, prepare="upload"),
    Case("mpu-upload-part-md5-wrong", "PUT", "obj", "partNumber=1&uploadId={upload}", {"Content-MD5": md5(b"x")},
         PAYLOAD, prepare="upload", known=hoard_answers(400, "BadDigest")),
    Case("mpu-upload-part-no-upload", "PUT", "obj", "partNumber=1&uploadId=nope", body=PAYLOAD),
    Case("mpu-list-parts", "GET", "obj", "uploadId={upload}", prepare="parts"),
    Case("mpu-list-parts-max-1", "GET", "obj", "uploadId={upload}&max-parts=1", prepare="parts"),
    Case("mpu-list-uploads", "GET", None, "uploads&prefix={p}", prepare="parts"),
    Case("mpu-complete", "POST", "obj", "uploadId={upload}", body=complete("1:etag1 2:etag2"), prepare="parts"),
    Case("mpu-complete-too-small", "POST", "obj", "uploadId={upload}", body=complete("1:etag1 2:etag2"), prepare="small_parts"),
    Case("mpu-complete-wrong-etag", "POST", "obj", "uploadId={upload}", body=complete("1:etag2 2:etag2"), prepare="parts"),
    Case("mpu-complete-out-of-order", "POST", "obj", "uploadId={upload}", body=complete("2:etag2 1:etag1"), prepare="parts"),
    Case("mpu-complete-checksums", "POST", "obj", "uploadId={upload}", body=complete("1:etag1:crc1 2:etag2:crc2"),
         prepare="checksum_parts"),
    # The whole object's checksum on a Complete is the origin's to check, not the XML body's.
    Case("mpu-complete-full-object-checksum", "POST", "obj", "uploadId={upload}",
         {"x-amz-checksum-crc32": "{whole_crc}", "x-amz-checksum-type": "FULL_OBJECT"},
         complete("1:etag1:crc1 2:etag2:crc2"), prepare="full_object_parts"),
    Case("mpu-complete-no-upload", "POST", "obj", "uploadId=nope", body=complete("1:etag1"), prepare="parts"),
    Case("mpu-abort", "DELETE", "obj", "uploadId={upload}", prepare="upload"),
    Case("mpu-abort-no-upload", "DELETE", "obj", "uploadId=nope"),
    # tagging
    Case("tagging-get", "GET", "obj", "tagging", prepare="tagged"),
    Case("tagging-put", "PUT", "obj", "tagging", {"Content-MD5": "{md5}"}, TAGS, prepare="tagged"),
    Case("tagging-delete", "DELETE", "obj", "tagging", prepare="tagged"),
    Case("tagging-get-missing-key", "GET", "nope", "tagging"),
    # buckets
    Case("bucket-create", "PUT", None, bucket="fresh"), Case("bucket-create-existing", "PUT", None, bucket="fresh", prepare="bucket"),
    Case("bucket-delete", "DELETE", None, bucket="fresh", prepare="bucket"),
    Case("bucket-delete-not-empty", "DELETE", None, bucket="fresh", prepare="full_bucket"),
    Case("bucket-delete-missing", "DELETE", None, bucket="missing"),
]  # fmt: skip


# --- answers as flat fields ------------------------------------------------------------


def _xml_fields(node: ElementTree.Element, path: str, out: dict[str, object]) -> None:
    seen: Counter[str] = Counter()
    for child in node:
        tag = child.tag.rpartition("}")[2]
        if tag in IGNORED_ELEMENTS:
            continue
        here = f"{path}/{tag}[{seen[tag]}]"
        seen[tag] += 1
        if len(child):
            _xml_fields(child, here, out)
        else:
            out[here] = child.text or ""


def fields(answer: RawResponse, unsubstitute: dict[str, str]) -> dict[str, object]:
    """Status, compared headers and body, with per-side names put back as placeholders."""

    def norm(value: str) -> str:
        for name, actual in unsubstitute.items():
            value = value.replace(actual, f"{{{name}}}")
        return value

    out: dict[str, object] = {"status": answer.status}
    for name, value in answer.headers.items():
        lower = name.lower()
        if lower in {h.lower() for h in COMPARED_HEADERS} or lower.startswith(PREFIXED_HEADERS):
            out[f"h:{lower}"] = norm(value)
    root = _xml(answer.body)
    if root is None:
        out["body"] = answer.body
        return out
    out["xml"] = root.tag  # the root element, with its namespace
    if root.tag.endswith("ListAllMyBucketsResult"):
        # S3 lists buckets by name, moto in creation order: compared as a set.
        found = root.find("{*}Buckets")
        if found is not None:
            found[:] = sorted(found, key=lambda bucket: bucket.findtext("{*}Name") or "")
    _xml_fields(root, "", out)
    for name in [n for n in out if n.startswith("/")]:
        out[name] = norm(str(out[name]))
    # The elements are compared one by one; their byte count depends on formatting.
    out.pop("h:content-length", None)
    return out


def _xml(body: bytes) -> ElementTree.Element | None:
    if not body.lstrip().startswith(b"<"):
        return None
    try:
        return ElementTree.fromstring(body)
    except ElementTree.ParseError:
        return None  # compared as bytes


def blank_fresh(found: dict[str, object]) -> dict[str, object]:
    """A write's own timestamps and ids differ per side: keep only that they are there."""
    return {
        name: "<fresh>" if any(marker in name for marker in FRESH_FIELDS) else value
        for name, value in found.items()
    }


def stored(client, bucket: str, prefix: str, key: str | None) -> dict[str, object]:
    """What a write left at moto: the keys under the case's prefix, and the object itself."""
    from botocore.exceptions import ClientError

    state: dict[str, object] = {}
    try:
        listed = client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
        state["keys"] = sorted(
            (o["Key"].removeprefix(prefix), o["Size"], o["ETag"]) for o in listed
        )
        uploads = client.list_multipart_uploads(Bucket=bucket, Prefix=prefix).get("Uploads", [])
        state["uploads"] = len(uploads)
    except ClientError as err:
        state["bucket"] = err.response["Error"]["Code"]
    if key is not None and "keys" in state:
        try:
            got = client.get_object(Bucket=bucket, Key=prefix + key)
            headers = got["ResponseMetadata"]["HTTPHeaders"]
            state["body"] = got["Body"].read()
            state.update(
                {
                    f"h:{n}": v
                    for n, v in headers.items()
                    if n in _STORED_HEADERS or n.startswith("x-amz-meta-")
                }
            )
            state["tags"] = client.get_object_tagging(Bucket=bucket, Key=prefix + key)["TagSet"]
        except ClientError as err:
            state["object"] = err.response["Error"]["Code"]
    return state


_STORED_HEADERS = frozenset(h.lower() for h in COMPARED_HEADERS) - {
    "last-modified",
    "x-amz-version-id",
}


# --- the servers -----------------------------------------------------------------------

LISTED = ["a", "b", "dir/a", "dir/b", "dir/c", "dir/sub/x", "dir/sub/y", "e f", "plus+key",
          "ünï", "z/1", *(f"many/{n:04d}" for n in range(1001))]  # fmt: skip


@pytest.fixture(scope="module")
def buckets(origin_client) -> None:
    for name in (MAIN, VERSIONED, LISTING):
        origin_client.create_bucket(Bucket=name)
    origin_client.create_bucket(Bucket=LOCKED, ObjectLockEnabledForBucket=True)
    origin_client.put_bucket_versioning(
        Bucket=VERSIONED, VersioningConfiguration={"Status": "Enabled"}
    )
    seed(LISTING, {key: key.encode() for key in LISTED})
    origin_client.create_multipart_upload(Bucket=LISTING, Key="dir/in-progress")


@pytest.fixture(scope="module")
def hoard(tmp_path_factory, moto_endpoint, buckets):
    config = {
        "origins": {"moto": {"type": "s3", "endpoint": moto_endpoint, "access_key": ORIGIN_KEY,
                             "secret_key": ORIGIN_SECRET, "addressing_style": "path"}},
        "default_origin": "moto",
    }  # fmt: skip
    node = HoardProcess(tmp_path_factory.mktemp("hoard-conf"), config).start()
    yield node
    node.stop()


@dataclass(frozen=True)
class Side:
    name: str
    port: int
    access_key: str
    secret_key: str

    def send(
        self, method: str, target: str, headers: dict[str, str], body: bytes | None
    ) -> RawResponse:
        return signed_send(self.port, method, target, headers=headers, body=body,
                           access_key=self.access_key, secret_key=self.secret_key)  # fmt: skip


@pytest.fixture(scope="module")
def sides(hoard, moto_endpoint) -> tuple[Side, Side]:
    moto_port = urlsplit(moto_endpoint).port
    assert moto_port is not None
    return (Side("moto", moto_port, ORIGIN_KEY, ORIGIN_SECRET),
            Side("hoard", hoard.port, ACCESS_KEY, SECRET_KEY))  # fmt: skip


# --- one case --------------------------------------------------------------------------


def _substitute(text: str, values: dict[str, str]) -> str:
    for name, value in values.items():
        text = text.replace(f"{{{name}}}", value)
    return text


def _bucket_name(case: Case, side: str) -> str:
    if case.bucket == "fresh":
        return f"conf-{RUN}-{hashlib.sha1(case.id.encode()).hexdigest()[:8]}-{side}"
    names = {"main": MAIN, "versioned": VERSIONED, "listing": LISTING, "locked": LOCKED,
             "colon": f"{MAIN}:colon"}  # fmt: skip
    return {**names, "missing": MISSING, "": ""}[case.bucket]


def _target(bucket: str, key: str | None, query: str) -> str:
    path = "/" if not bucket else f"/{bucket}"
    if key is not None:
        path += "/" + quote(key, safe="/~")
    return path + (f"?{query}" if query else "")


def _token(side: Side) -> str:
    first = side.send("GET", _target(LISTING, None, "list-type=2&max-keys=2"), {}, None)
    return ElementTree.fromstring(first.body).findtext("{*}NextContinuationToken") or ""


def _seed(case: Case, client, prefix: str) -> dict[str, str]:
    if case.bucket == "versioned":
        return seed_versions(client, prefix)
    if case.bucket == "main":
        return seed_read(client, prefix, case.key)
    if case.bucket == "locked":
        return seed_locked(client, prefix)
    return {}


def _ask(
    case: Case, side: Side, bucket: str, prefix: str, values: dict[str, str]
) -> dict[str, object]:
    values = {"p": prefix, "b": bucket, **values}
    if "{token}" in case.query:
        values["token"] = _token(side)
    body = _substitute(case.body.decode(), values).encode() if case.body is not None else None
    if body is not None:
        values["md5"] = md5(body)
    headers = {name: _substitute(value, values) for name, value in case.headers.items()}
    key = None if case.key is None else prefix + case.key
    # Query values are sent encoded, as SigV4's canonical query string spells them.
    encoded = {name: quote(value, safe="") for name, value in values.items()}
    target = _target(bucket, key, _substitute(case.query, encoded))
    answer = side.send(case.method, target, headers, body)
    unsubstitute = dict(sorted(values.items(), key=lambda item: -len(item[1])))
    found = fields(answer, {k: v for k, v in unsubstitute.items() if v})
    found = {n: "<token>" if n.startswith(OPAQUE_FIELDS) else v for n, v in found.items()}
    if case.method == "HEAD" and (answer.status >= 300 or case.key is None):
        # No object, no body: moto counts one anyway (0, or its XML error's length);
        # RFC 9110 §9.3.2 lets a HEAD answer leave Content-Length out.
        found.pop("h:content-length", None)
    return blank_fresh(found) if case.writes or case.prepare else found


def _differences(
    moto: dict[str, object], hoard: dict[str, object], case: Case
) -> dict[str, object]:
    """Fields that differ, once ``known`` and the module's HOARD_ADDS are accounted for.

    Every ``known`` field must hold Hoard's stated value. Where a known status
    differs from moto's, the two answers are different answers and nothing
    else is compared.
    """
    names = moto.keys() | hoard.keys()
    for name, expected in case.known.items():
        if name.endswith("*"):  # a whole subtree Hoard does not send
            subtree = {n for n in names if n.startswith(name[:-1])}
            assert not subtree & hoard.keys(), f"known {name}: Hoard now sends it"
            names -= subtree
        else:
            assert hoard.get(name) == expected, f"known {name}: Hoard answers {hoard.get(name)!r}"
            names.discard(name)
    if "status" in case.known and moto.get("status") != hoard.get("status"):
        return {}
    names -= {n for n in names if n not in moto and _hoard_adds(n, hoard)}
    return {n: (moto.get(n), hoard.get(n)) for n in sorted(names) if moto.get(n) != hoard.get(n)}


def _hoard_adds(name: str, hoard: dict[str, object]) -> bool:
    return any(
        re.fullmatch(field, name) and hoard.get("status") in statuses
        for field, statuses in HOARD_ADDS
    )


@pytest.mark.parametrize("case", READS + WRITES, ids=lambda case: case.id)
def test_same_answer_as_moto(case: Case, sides: tuple[Side, Side], origin_client) -> None:
    per_side = case.writes or case.prepare is not None
    answers: dict[str, list[dict[str, object]]] = {}
    shared: dict[str, str] = {} if per_side else _seed(case, origin_client, f"{case.id}/")
    for side in sides:
        prefix = (
            ""
            if case.bucket == "listing"
            else f"{case.id}/{side.name}/"
            if per_side
            else f"{case.id}/"
        )
        bucket = _bucket_name(case, side.name)
        values = dict(shared)
        if case.prepare is not None:
            values.update(PREPARE[case.prepare](origin_client, bucket, prefix))
        tries = 1 if case.writes or side.name == "moto" else 2  # Hoard: cold, then warm
        answers[side.name] = [_ask(case, side, bucket, prefix, values) for _ in range(tries)]
        if case.writes and case.bucket != "missing":  # and what the write left at moto
            state = stored(origin_client, bucket, prefix, case.key)
            answers[side.name][0].update(blank_fresh({f"stored:{k}": v for k, v in state.items()}))
    moto = answers["moto"][0]
    for n, hoard in enumerate(answers["hoard"]):
        differences = _differences(moto, hoard, case)
        assert not differences, f"{('cold', 'warm')[n]} (moto, hoard): {pformat(differences)}"
