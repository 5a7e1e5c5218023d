"""The S3 read API end to end: real boto3/s3fs → a Hoard process → moto and a directory."""

from __future__ import annotations

import datetime as dt
import os
import uuid
from email.utils import format_datetime
from pathlib import Path

import botocore.auth
import botocore.exceptions
import pytest
import requests
import s3fs

from tests.conftest import ORIGIN_KEY, ORIGIN_SECRET, seed
from tests.harness import HoardProcess
from tests.rawhttp import presign, send, signed_send

BUCKET = f"data-{uuid.uuid4().hex[:8]}"
PREFIXED = f"pfx-{uuid.uuid4().hex[:8]}"
BODY = os.urandom(3 * 1024 * 1024 + 17)
SMALL = b"0123456789abcdefghij"
ODD_KEYS = ["with space.txt", "unicodé/ключ.bin", "plus+sign.txt", "tilde~x", "a/b/../c"]


@pytest.fixture(scope="module")
def seeded(origin_client) -> None:
    origin_client.create_bucket(Bucket=BUCKET)
    origin_client.put_object(
        Bucket=BUCKET, Key="big.bin", Body=BODY, ContentType="application/x-test",
        Metadata={"owner": "team-a"}, CacheControl="max-age=60", ContentEncoding="identity",
    )  # fmt: skip
    origin_client.put_object(Bucket=BUCKET, Key="small.txt", Body=SMALL)
    origin_client.put_object(Bucket=BUCKET, Key="empty", Body=b"")
    for key in ODD_KEYS:
        origin_client.put_object(Bucket=BUCKET, Key=key, Body=key.encode())
    origin_client.create_bucket(Bucket=PREFIXED)
    origin_client.put_object(Bucket=PREFIXED, Key="sub/dir/x.txt", Body=b"inside")
    origin_client.put_object(Bucket=PREFIXED, Key="outside.txt", Body=b"outside")


@pytest.fixture(scope="module")
def posix_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("posix")
    (root / "files" / "nested").mkdir(parents=True)
    (root / "files" / "hello.txt").write_bytes(b"hello from disk")
    (root / "files" / "nested" / "deep.bin").write_bytes(os.urandom(70_000))
    (root / "scratch").mkdir()
    (root / "scratch" / "note.txt").write_bytes(b"scratch note")
    (root / "secret.txt").write_bytes(b"outside any bucket")
    return root


@pytest.fixture(scope="module")
def hoard(tmp_path_factory, moto_endpoint, seeded, posix_root):
    config = {
        "origins": {
            "moto": {"type": "s3", "endpoint": moto_endpoint, "access_key": ORIGIN_KEY,
                     "secret_key": ORIGIN_SECRET, "addressing_style": "path"},
            "disk": {"type": "posix", "path": str(posix_root)},
        },
        "default_origin": "moto",
        "mounts": [
            {"bucket": "local-files", "origin": "disk", "origin_bucket": "files"},
            {"bucket": "scratch-mount", "origin": "disk", "prefix": "scratch/"},
            {"bucket": "prefixed", "origin": "moto", "origin_bucket": PREFIXED, "prefix": "sub/dir/"},
        ],
    }  # fmt: skip
    node = HoardProcess(tmp_path_factory.mktemp("hoard"), config).start()
    yield node
    assert node.stop() == 0


@pytest.fixture(scope="module")
def s3(hoard):
    return hoard.client()


def error_code(excinfo: pytest.ExceptionInfo) -> str:
    return excinfo.value.response["Error"]["Code"]


# --- buckets ---------------------------------------------------------------------------


def test_list_buckets_shows_origin_buckets_and_mounts(s3):
    names = [b["Name"] for b in s3.list_buckets()["Buckets"]]
    assert BUCKET in names and "local-files" in names and "prefixed" in names
    assert names == sorted(names)


def test_head_bucket_and_location(s3):
    assert s3.head_bucket(Bucket=BUCKET)["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert s3.get_bucket_location(Bucket=BUCKET)["LocationConstraint"] is None
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        s3.head_bucket(Bucket="no-such-bucket-here")
    assert excinfo.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        s3.get_bucket_location(Bucket="no-such-bucket-here")
    assert error_code(excinfo) == "NoSuchBucket"


# --- objects ---------------------------------------------------------------------------


def test_get_and_head_carry_s3_headers(s3, origin_client):
    expected = origin_client.head_object(Bucket=BUCKET, Key="big.bin")
    head = s3.head_object(Bucket=BUCKET, Key="big.bin")
    got = s3.get_object(Bucket=BUCKET, Key="big.bin")
    for answer in (head, got):
        assert answer["ContentLength"] == len(BODY)
        assert answer["ETag"] == expected["ETag"]
        assert answer["LastModified"] == expected["LastModified"]
        assert answer["ContentType"] == "application/x-test"
        assert answer["Metadata"] == {"owner": "team-a"}
        assert answer["CacheControl"] == "max-age=60"
        assert answer["ContentEncoding"] == "identity"
        assert answer["AcceptRanges"] == "bytes"
        assert answer["ResponseMetadata"]["HTTPHeaders"]["x-amz-request-id"]
    assert got["Body"].read() == BODY


def test_empty_object(s3):
    answer = s3.get_object(Bucket=BUCKET, Key="empty")
    assert answer["ContentLength"] == 0 and answer["Body"].read() == b""


@pytest.mark.parametrize(
    ("header", "expected_range", "status"),
    [
        ("bytes=0-0", (0, 0), 206),
        (f"bytes={len(SMALL) - 1}-{len(SMALL) - 1}", (len(SMALL) - 1, len(SMALL) - 1), 206),
        ("bytes=5-", (5, len(SMALL) - 1), 206),
        ("bytes=-3", (len(SMALL) - 3, len(SMALL) - 1), 206),
        ("bytes=-1000", (0, len(SMALL) - 1), 206),
        ("bytes=3-1000", (3, len(SMALL) - 1), 206),
        ("bytes=9-4", None, 200),
        ("items=0-1", None, 200),
    ],
)
def test_ranges(s3, header, expected_range, status):
    answer = s3.get_object(Bucket=BUCKET, Key="small.txt", Range=header)
    assert answer["ResponseMetadata"]["HTTPStatusCode"] == status
    if expected_range is None:
        assert answer["Body"].read() == SMALL
        return
    first, last = expected_range
    assert answer["ContentRange"] == f"bytes {first}-{last}/{len(SMALL)}"
    assert answer["ContentLength"] == last - first + 1
    assert answer["Body"].read() == SMALL[first : last + 1]


def test_range_across_origin_chunks_is_byte_exact(s3):
    first, last = 1_000_000, 2_500_123
    body = s3.get_object(Bucket=BUCKET, Key="big.bin", Range=f"bytes={first}-{last}")["Body"].read()
    assert body == BODY[first : last + 1]


@pytest.mark.parametrize("header", ["bytes=20-", "bytes=100-200", "bytes=-0"])
def test_unsatisfiable_range(s3, header):
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        s3.get_object(Bucket=BUCKET, Key="small.txt", Range=header)
    assert error_code(excinfo) == "InvalidRange"
    assert excinfo.value.response["ResponseMetadata"]["HTTPStatusCode"] == 416


def test_head_with_range(s3):
    answer = s3.head_object(Bucket=BUCKET, Key="small.txt", Range="bytes=2-5")
    assert answer["ResponseMetadata"]["HTTPStatusCode"] == 206
    assert answer["ContentLength"] == 4 and answer["ContentRange"] == f"bytes 2-5/{len(SMALL)}"


def test_conditionals(s3):
    head = s3.head_object(Bucket=BUCKET, Key="small.txt")
    etag, modified = head["ETag"], head["LastModified"]
    before, after = modified - dt.timedelta(days=1), modified + dt.timedelta(days=1)
    assert s3.get_object(Bucket=BUCKET, Key="small.txt", IfMatch=etag)["Body"].read() == SMALL

    def status_of(**conditions) -> int:
        try:
            return s3.get_object(Bucket=BUCKET, Key="small.txt", **conditions)["ResponseMetadata"][
                "HTTPStatusCode"
            ]
        except botocore.exceptions.ClientError as exc:
            return exc.response["ResponseMetadata"]["HTTPStatusCode"]

    assert status_of(IfMatch='"nope"') == 412
    assert status_of(IfNoneMatch=etag) == 304
    assert status_of(IfNoneMatch='"other"') == 200
    assert status_of(IfModifiedSince=after) == 304
    assert status_of(IfModifiedSince=before) == 200
    assert status_of(IfUnmodifiedSince=before) == 412
    assert status_of(IfUnmodifiedSince=after) == 200
    # S3's documented precedence: If-Match true wins over If-Unmodified-Since false…
    assert status_of(IfMatch=etag, IfUnmodifiedSince=before) == 200
    # …and If-None-Match false with If-Modified-Since true is still a 304.
    assert status_of(IfNoneMatch=etag, IfModifiedSince=before) == 304
    # 412 is decided before 304 and before the range.
    assert status_of(IfMatch='"nope"', IfNoneMatch=etag) == 412
    assert status_of(IfMatch='"nope"', Range="bytes=500-600") == 412


def test_not_modified_keeps_etag(hoard):
    target = f"/{BUCKET}/small.txt"
    first = signed_send(hoard.port, "GET", target)
    answer = signed_send(
        hoard.port, "GET", target, headers={"If-None-Match": first.headers["ETag"]}
    )
    assert answer.status == 304 and answer.body == b""
    assert answer.headers["ETag"] == first.headers["ETag"]


def test_response_header_overrides(s3):
    answer = s3.get_object(
        Bucket=BUCKET, Key="small.txt", ResponseContentType="text/x-override",
        ResponseContentDisposition='attachment; filename="x.txt"', ResponseCacheControl="no-cache",
        ResponseContentLanguage="fr", ResponseContentEncoding="gzip",
        ResponseExpires=dt.datetime(2030, 1, 1, tzinfo=dt.UTC),
    )  # fmt: skip
    assert answer["ContentType"] == "text/x-override"
    assert answer["ContentDisposition"] == 'attachment; filename="x.txt"'
    assert answer["CacheControl"] == "no-cache"
    assert answer["ContentLanguage"] == "fr"
    assert answer["ContentEncoding"] == "gzip"


def test_missing_key_and_bucket(s3, hoard):
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        s3.get_object(Bucket=BUCKET, Key="nope")
    assert error_code(excinfo) == "NoSuchKey"
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        s3.get_object(Bucket="no-such-bucket-here", Key="x")
    assert error_code(excinfo) == "NoSuchBucket"
    raw = signed_send(hoard.port, "GET", f"/{BUCKET}/nope")
    assert b"<Code>NoSuchKey</Code>" in raw.body and b"<RequestId>" in raw.body
    assert b"<Resource>" in raw.body and raw.headers["x-amz-request-id"]
    head = signed_send(hoard.port, "HEAD", f"/{BUCKET}/nope")
    assert head.status == 404 and head.body == b"" and head.headers["x-amz-request-id"]


@pytest.mark.parametrize("key", ODD_KEYS)
def test_keys_needing_encoding(s3, key):
    assert s3.get_object(Bucket=BUCKET, Key=key)["Body"].read() == key.encode()
    assert s3.head_object(Bucket=BUCKET, Key=key)["ContentLength"] == len(key.encode())


def test_unknown_method(hoard):
    answer = signed_send(hoard.port, "PATCH", f"/{BUCKET}/small.txt")
    assert answer.status == 405 and b"MethodNotAllowed" in answer.body


# --- addressing ------------------------------------------------------------------------


def test_virtual_hosted_style(hoard):
    host = f"{BUCKET}.localhost:{hoard.port}"
    got = signed_send(hoard.port, "GET", "/small.txt", host=host)
    assert got.status == 200 and got.body == SMALL
    listing = signed_send(hoard.port, "GET", "/?list-type=2&prefix=small", host=host)
    assert listing.status == 200 and b"<Key>small.txt</Key>" in listing.body


# --- auth ------------------------------------------------------------------------------


def test_presigned_get(hoard):
    s3 = hoard.client(signature_version="s3v4")
    url = s3.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": "small.txt"})
    assert requests.get(url, timeout=10).content == SMALL
    tampered = url.replace("X-Amz-Signature=", "X-Amz-Signature=0")
    answer = requests.get(tampered, timeout=10)
    assert answer.status_code == 403 and b"SignatureDoesNotMatch" in answer.content
    other_key = url.replace("small.txt", "big.bin")
    assert requests.get(other_key, timeout=10).status_code == 403


def test_presigned_expired(hoard):
    host = f"127.0.0.1:{hoard.port}"
    target = presign("GET", host, f"/{BUCKET}/small.txt", expires=1)
    # Re-date the URL into the past, re-signed, so it is valid but expired.
    old = target.replace("X-Amz-Date=", "X-Amz-Date=x")  # break date: malformed
    assert send(hoard.port, "GET", old, {"Host": host}).status in (400, 403)
    import time

    time.sleep(2.1)
    answer = send(hoard.port, "GET", target, {"Host": host})
    assert answer.status == 403 and b"expired" in answer.body


def test_wrong_secret_unknown_key_and_anonymous(hoard):
    wrong = hoard.client()
    wrong._request_signer._credentials.secret_key = "not-the-secret"
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        wrong.get_object(Bucket=BUCKET, Key="small.txt")
    assert error_code(excinfo) == "SignatureDoesNotMatch"
    unknown = signed_send(hoard.port, "GET", f"/{BUCKET}/small.txt", access_key="nobody")
    assert unknown.status == 403 and b"InvalidAccessKeyId" in unknown.body
    anonymous = send(hoard.port, "GET", f"/{BUCKET}/small.txt", {"Host": "x"})
    assert anonymous.status == 403 and b"AccessDenied" in anonymous.body


@pytest.mark.parametrize("minutes", [-20, 20])
def test_skewed_date(hoard, monkeypatch, minutes):
    skewed = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=minutes)
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: skewed)
    answer = signed_send(hoard.port, "GET", f"/{BUCKET}/small.txt")
    assert answer.status == 403 and b"RequestTimeTooSkewed" in answer.body


def test_malformed_authorization(hoard):
    host = f"127.0.0.1:{hoard.port}"
    malformed = send(hoard.port, "GET", f"/{BUCKET}/small.txt", {
        "Host": host, "Authorization": "AWS4-HMAC-SHA256 Credential=garbage",
        "x-amz-content-sha256": "UNSIGNED-PAYLOAD",
        "x-amz-date": dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ"),
    })  # fmt: skip
    assert malformed.status == 400 and b"AuthorizationHeaderMalformed" in malformed.body


# --- listings --------------------------------------------------------------------------


def test_list_v2_and_v1_basics(s3):
    page = s3.list_objects_v2(Bucket=BUCKET, Prefix="unicodé/")
    assert [o["Key"] for o in page["Contents"]] == ["unicodé/ключ.bin"]
    assert page["KeyCount"] == 1 and page["IsTruncated"] is False
    top = s3.list_objects_v2(Bucket=BUCKET, Delimiter="/")
    assert {p["Prefix"] for p in top["CommonPrefixes"]} == {"a/", "unicodé/"}
    v1 = s3.list_objects(Bucket=BUCKET, Delimiter="/", MaxKeys=2)
    assert v1["IsTruncated"] is True and v1["NextMarker"]
    rest = s3.list_objects(Bucket=BUCKET, Delimiter="/", Marker=v1["NextMarker"])
    seen = [o["Key"] for o in v1.get("Contents", [])] + [
        p["Prefix"] for p in v1.get("CommonPrefixes", [])
    ]
    seen += [o["Key"] for o in rest.get("Contents", [])] + [
        p["Prefix"] for p in rest.get("CommonPrefixes", [])
    ]
    assert len(seen) == len(set(seen)) == len(top.get("Contents", [])) + 2


def test_list_start_after_and_bad_arguments(s3, hoard):
    after = s3.list_objects_v2(Bucket=BUCKET, StartAfter="plus+sign.txt")
    assert after["Contents"][0]["Key"] == "small.txt"
    assert signed_send(hoard.port, "GET", f"/{BUCKET}?list-type=2&max-keys=x").status == 400
    assert signed_send(hoard.port, "GET", f"/{BUCKET}?list-type=2&encoding-type=zip").status == 400
    bad_token = signed_send(hoard.port, "GET", f"/{BUCKET}?list-type=2&continuation-token=%25%25")
    assert bad_token.status == 400 and b"InvalidArgument" in bad_token.body


def test_list_encoding_type_url(hoard):
    answer = signed_send(hoard.port, "GET", f"/{BUCKET}?list-type=2&encoding-type=url&prefix=plus")
    assert b"<Key>plus%2Bsign.txt</Key>" in answer.body
    answer = signed_send(hoard.port, "GET", f"/{BUCKET}?list-type=2&encoding-type=url&prefix=with")
    assert b"<Key>with%20space.txt</Key>" in answer.body


def _walk(client, bucket: str, **params) -> list[tuple[list[str], list[str]]]:
    pages = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, **params):
        pages.append(
            (
                [o["Key"] for o in page.get("Contents", [])],
                [p["Prefix"] for p in page.get("CommonPrefixes", [])],
            )
        )
    return pages


def test_pagination_over_1000_keys_matches_moto(s3, origin_client):
    bucket = f"many-{uuid.uuid4().hex[:8]}"
    origin_client.create_bucket(Bucket=bucket)
    keys = [f"k{i:05d}" for i in range(1100)] + [f"dir{i % 7}/f{i}" for i in range(300)]
    keys += ["with space/x", "plus+/y", "ü/z"]
    seed(bucket, dict.fromkeys(keys, b""))
    for params in (
        {},
        {"Delimiter": "/"},
        {"Prefix": "dir3/"},
        {"Delimiter": "/", "StartAfter": "k00500"},
        {"PaginationConfig": {"PageSize": 250}, "Delimiter": "/"},
    ):
        ours, theirs = _walk(s3, bucket, **params), _walk(origin_client, bucket, **params)
        assert [k for page in ours for k in page[0]] == [k for page in theirs for k in page[0]]
        assert [p for page in ours for p in page[1]] == [p for page in theirs for p in page[1]]
        if "Delimiter" not in params:
            assert ours == theirs  # without roll-up, pages are identical entry by entry


def test_s3fs_reads(hoard):
    fs = s3fs.S3FileSystem(
        key="test-access",
        secret="test-secret-key",
        client_kwargs={"endpoint_url": hoard.endpoint, "region_name": "us-east-1"},
    )
    assert fs.cat(f"{BUCKET}/small.txt") == SMALL
    assert sorted(fs.ls(f"{BUCKET}/unicodé")) == [f"{BUCKET}/unicodé/ключ.bin"]
    with fs.open(f"{BUCKET}/big.bin", "rb", block_size=256 * 1024) as handle:
        handle.seek(2_000_000)
        assert handle.read(100_000) == BODY[2_000_000:2_100_000]
    assert fs.info(f"{BUCKET}/big.bin")["size"] == len(BODY)


# --- mounts and the posix origin --------------------------------------------------------


def test_mount_with_prefix(s3):
    assert s3.get_object(Bucket="prefixed", Key="x.txt")["Body"].read() == b"inside"
    listed = s3.list_objects_v2(Bucket="prefixed")
    assert [o["Key"] for o in listed["Contents"]] == ["x.txt"]
    with pytest.raises(botocore.exceptions.ClientError):
        s3.get_object(Bucket="prefixed", Key="../outside.txt")


def test_posix_mount(s3):
    assert s3.get_object(Bucket="local-files", Key="hello.txt")["Body"].read() == b"hello from disk"
    listed = s3.list_objects_v2(Bucket="local-files", Delimiter="/")
    assert [o["Key"] for o in listed["Contents"]] == ["hello.txt"]
    assert [p["Prefix"] for p in listed["CommonPrefixes"]] == ["nested/"]
    ranged = s3.get_object(Bucket="local-files", Key="nested/deep.bin", Range="bytes=100-199")
    assert len(ranged["Body"].read()) == 100
    assert s3.get_object(Bucket="scratch-mount", Key="note.txt")["Body"].read() == b"scratch note"


@pytest.mark.parametrize(
    "target",
    [
        "/local-files/../secret.txt",
        "/local-files/..%2Fsecret.txt",
        "/local-files/%2E%2E/secret.txt",
        "/local-files/nested/../../secret.txt",
        "/local-files//etc/passwd",
        "/local-files/%2Fetc%2Fpasswd",
        "/scratch-mount/../secret.txt",
    ],
)
def test_posix_traversal_is_refused(hoard, target):
    answer = signed_send(hoard.port, "GET", target)
    assert answer.status in (400, 403, 404), answer.status
    assert b"outside any bucket" not in answer.body and b"root:" not in answer.body


def test_last_modified_is_http_date(hoard):
    answer = signed_send(hoard.port, "GET", f"/{BUCKET}/small.txt")
    parsed = dt.datetime.strptime(answer.headers["Last-Modified"], "%a, %d %b %Y %H:%M:%S GMT")
    assert (
        format_datetime(parsed.replace(tzinfo=dt.UTC), usegmt=True)
        == answer.headers["Last-Modified"]
    )


def test_sigv2_clients_and_default_presigned_urls(hoard, s3):
    url = s3.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": "small.txt"})
    assert "AWSAccessKeyId=" in url  # boto3's default presigning in us-east-1 is SigV2
    assert requests.get(url, timeout=10).content == SMALL
    assert requests.get(url.replace("Signature=", "Signature=A"), timeout=10).status_code == 403
    v2 = hoard.client(signature_version="s3")
    assert v2.get_object(Bucket=BUCKET, Key="with space.txt")["Body"].read() == b"with space.txt"
    assert v2.list_objects_v2(Bucket=BUCKET, Prefix="unicodé/")["KeyCount"] == 1


def test_presigned_url_reused_until_it_expires(hoard):
    host = f"127.0.0.1:{hoard.port}"
    target = presign("GET", host, f"/{BUCKET}/small.txt", expires=2)
    for _ in range(3):  # the second and third use come from the verified-URL memo
        assert send(hoard.port, "GET", target, {"Host": host}).body == SMALL
    other_host = send(hoard.port, "GET", target, {"Host": "evil.example"})
    assert other_host.status == 403
    with_amz_header = send(hoard.port, "GET", target, {"Host": host, "x-amz-meta-x": "1"})
    assert with_amz_header.status == 403  # a header that is not signed is still refused
    import time

    time.sleep(2.5)
    expired = send(hoard.port, "GET", target, {"Host": host})
    assert expired.status == 403 and b"expired" in expired.body
