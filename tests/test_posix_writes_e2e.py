"""Writes through Hoard onto a posix origin, end to end: real clients, checked on disk."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import os
import socket
import subprocess
import time
import uuid
from pathlib import Path

import boto3
import botocore.exceptions
import pytest
import requests
import s3fs
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from tests.harness import ACCESS_KEY, SECRET_KEY, HoardProcess, s3_client
from tests.rawhttp import send, sign_headers

MiB = 1024 * 1024
LIMITED_KEY, LIMITED_SECRET = "limited", "limited-secret"
STAGING = ".hoard-uploads"


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("posix-root")
    (root / "frozen-dir").mkdir()
    (root / "frozen-dir" / "old.txt").write_bytes(b"old")
    (root / "data").mkdir()
    return root


@pytest.fixture(scope="module")
def hoard(tmp_path_factory, root):
    config = {
        "origins": {"disk": {"type": "posix", "path": str(root)}},
        "default_origin": "disk",
        "mounts": [
            {"bucket": "frozen", "origin": "disk", "origin_bucket": "frozen-dir", "readonly": True},
            {"bucket": "nested", "origin": "disk", "origin_bucket": "data", "prefix": "sub/dir/"},
        ],
        "credentials": [
            {"access_key": ACCESS_KEY, "secret_key": SECRET_KEY},
            {"access_key": LIMITED_KEY, "secret_key": LIMITED_SECRET, "buckets": ["nested"]},
        ],
    }  # fmt: skip
    node = HoardProcess(tmp_path_factory.mktemp("hoard-pw"), config).start()
    yield node
    assert node.stop() == 0


@pytest.fixture
def bucket(root) -> str:
    """A fresh bucket: on a posix origin, a directory at the root."""
    name = f"p-{uuid.uuid4().hex[:10]}"
    (root / name).mkdir()
    return name


def client(hoard, **config):
    return s3_client(hoard.endpoint, **config)


def code(excinfo: pytest.ExceptionInfo) -> str:
    return excinfo.value.response["Error"]["Code"]


def status(excinfo: pytest.ExceptionInfo) -> int:
    return excinfo.value.response["ResponseMetadata"]["HTTPStatusCode"]


def files(directory: Path) -> list[str]:
    """Every file below ``directory`` (hidden temp files included), relative, sorted."""
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())


def md5_etag(data: bytes) -> str:
    return f'"{hashlib.md5(data).hexdigest()}"'


def raw(hoard, method: str, target: str, body: bytes = b"", headers: dict | None = None):
    """One SigV4-signed request (payload hash included), sent byte for byte."""
    host = f"127.0.0.1:{hoard.port}"
    request = AWSRequest(method=method, url=f"http://{host}{target}", data=body,
                         headers=dict(headers or {}))  # fmt: skip
    request.headers["x-amz-content-sha256"] = hashlib.sha256(body).hexdigest()
    S3SigV4Auth(Credentials(ACCESS_KEY, SECRET_KEY), "s3", "us-east-1").add_auth(request)
    signed = {**dict(request.headers.items()), "Host": host, "Content-Length": str(len(body))}
    return send(hoard.port, method, target, signed, body)


# --- PutObject, HEAD, GET, LIST, DeleteObject ----------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 70_000, 5 * MiB + 3])
@pytest.mark.parametrize("checksums", ["when_supported", "when_required"])
def test_put_head_get_list_delete(hoard, root, bucket, size, checksums):
    data = os.urandom(size)
    s3 = client(hoard, request_checksum_calculation=checksums)
    expires = dt.datetime(2031, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    put = s3.put_object(
        Bucket=bucket, Key="dir/obj.bin", Body=data, ContentType="application/x-data",
        Metadata={"Owner": "t", "step": "42"}, CacheControl="no-store",
        ContentDisposition="inline", ContentEncoding="identity", ContentLanguage="en",
        Expires=expires,
    )  # fmt: skip
    assert put["ETag"] == md5_etag(data)
    assert "VersionId" not in put
    assert (root / bucket / "dir" / "obj.bin").read_bytes() == data
    head = s3.head_object(Bucket=bucket, Key="dir/obj.bin")
    assert head["ETag"] == put["ETag"] and head["ContentLength"] == size
    assert head["ContentType"] == "application/x-data"
    assert head["Metadata"] == {"owner": "t", "step": "42"}
    assert head["CacheControl"] == "no-store" and head["ContentDisposition"] == "inline"
    assert head["ContentEncoding"] == "identity" and head["ContentLanguage"] == "en"
    assert head["ResponseMetadata"]["HTTPHeaders"]["expires"] == "Thu, 02 Jan 2031 03:04:05 GMT"
    assert "x-amz-version-id" not in head["ResponseMetadata"]["HTTPHeaders"]
    assert s3.get_object(Bucket=bucket, Key="dir/obj.bin")["Body"].read() == data
    listed = s3.list_objects_v2(Bucket=bucket)["Contents"]
    assert [(o["Key"], o["Size"], o["ETag"]) for o in listed] == [
        ("dir/obj.bin", size, put["ETag"])
    ]
    deleted = s3.delete_object(Bucket=bucket, Key="dir/obj.bin")
    assert deleted["ResponseMetadata"]["HTTPStatusCode"] == 204
    assert files(root / bucket) == []
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        s3.head_object(Bucket=bucket, Key="dir/obj.bin")
    assert status(excinfo) == 404
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0
    # Deleting what is not there is a 204 too, as in S3.
    again = s3.delete_object(Bucket=bucket, Key="dir/obj.bin")
    assert again["ResponseMetadata"]["HTTPStatusCode"] == 204


def test_put_without_content_type_stores_s3s_default(hoard, bucket):
    s3 = client(hoard)
    answer = raw(hoard, "PUT", f"/{bucket}/notype.txt", b"plain")
    assert answer.status == 200 and answer.headers["ETag"] == md5_etag(b"plain")
    assert s3.head_object(Bucket=bucket, Key="notype.txt")["ContentType"] == "binary/octet-stream"


@pytest.mark.parametrize("algorithm", ["CRC32", "CRC32C", "CRC64NVME", "SHA1", "SHA256"])
def test_put_each_checksum_algorithm(hoard, root, bucket, algorithm):
    data = os.urandom(300_001)
    put = client(hoard).put_object(Bucket=bucket, Key="c", Body=data, ChecksumAlgorithm=algorithm)
    assert (root / bucket / "c").read_bytes() == data
    assert put[f"Checksum{algorithm}"]  # echoed, as S3 does
    assert put["ETag"] == md5_etag(data)


def test_wrong_content_md5_and_checksum_leave_no_file(hoard, root, bucket):
    s3 = client(hoard)
    s3.put_object(Bucket=bucket, Key="kept", Body=b"original")
    wrong_md5 = base64.b64encode(hashlib.md5(b"other").digest()).decode()
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        s3.put_object(Bucket=bucket, Key="md5", Body=b"payload", ContentMD5=wrong_md5)
    assert code(excinfo) == "BadDigest"
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        s3.put_object(Bucket=bucket, Key="kept", Body=b"replacement", ContentMD5=wrong_md5)
    assert code(excinfo) == "BadDigest"
    wrong_sha = base64.b64encode(hashlib.sha256(b"other").digest()).decode()
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        s3.put_object(Bucket=bucket, Key="sha", Body=b"payload", ChecksumSHA256=wrong_sha)
    assert code(excinfo) in ("BadDigest", "XAmzContentSHA256Mismatch")
    assert files(root / bucket) == ["kept"]  # no object, no temp file left behind
    assert (root / bucket / "kept").read_bytes() == b"original"
    assert s3.get_object(Bucket=bucket, Key="kept")["Body"].read() == b"original"


def cut_short(hoard, target: str) -> None:
    """A PUT that declares 5000 bytes, sends 1000 and goes away."""
    host = f"127.0.0.1:{hoard.port}"
    signed = sign_headers("PUT", host, target)
    signed.update({"Host": host, "Content-Length": "5000"})
    with socket.create_connection(("127.0.0.1", hoard.port), timeout=10) as sock:
        head = "".join(f"{k}: {v}\r\n" for k, v in signed.items())
        sock.sendall(f"PUT {target} HTTP/1.1\r\n{head}\r\n".encode() + b"x" * 1000)
        sock.shutdown(socket.SHUT_WR)
        while sock.recv(65536):
            pass


def eventually(predicate, timeout: float = 10.0) -> bool:
    """Whether ``predicate`` holds within ``timeout``: the server may close the
    connection of a client that went away before its handler has cleaned up."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_client_gone_mid_body_leaves_no_file_and_no_part(hoard, root, bucket):
    cut_short(hoard, f"/{bucket}/short")
    assert eventually(lambda: files(root / bucket) == [])
    s3 = client(hoard)
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key="mp")["UploadId"]
    cut_short(hoard, f"/{bucket}/mp?partNumber=1&uploadId={upload_id}")
    assert eventually(lambda: files(root / STAGING / upload_id) == ["upload.json"])
    assert s3.list_parts(Bucket=bucket, Key="mp", UploadId=upload_id).get("Parts", []) == []
    s3.abort_multipart_upload(Bucket=bucket, Key="mp", UploadId=upload_id)
    assert not (root / STAGING / upload_id).exists()
    assert "Traceback" not in hoard.log()  # a client gone is no internal error


def test_write_then_read_head_list_see_the_new_state(hoard, root, bucket):
    s3 = client(hoard)
    s3.put_object(Bucket=bucket, Key="dir/a", Body=b"first")
    assert s3.get_object(Bucket=bucket, Key="dir/a")["Body"].read() == b"first"  # now cached
    assert s3.head_object(Bucket=bucket, Key="dir/a")["ContentLength"] == 5
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="dir/")["Contents"]] == [
        "dir/a"
    ]
    s3.put_object(Bucket=bucket, Key="dir/a", Body=b"second, longer")
    s3.put_object(Bucket=bucket, Key="dir/b", Body=b"new")
    assert s3.get_object(Bucket=bucket, Key="dir/a")["Body"].read() == b"second, longer"
    assert s3.head_object(Bucket=bucket, Key="dir/a")["ContentLength"] == 14
    listed = s3.list_objects_v2(Bucket=bucket, Prefix="dir/")["Contents"]
    assert [(o["Key"], o["Size"]) for o in listed] == [("dir/a", 14), ("dir/b", 3)]
    s3.delete_object(Bucket=bucket, Key="dir/a")
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        s3.get_object(Bucket=bucket, Key="dir/a")
    assert code(excinfo) == "NoSuchKey"
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="dir/")["Contents"]] == [
        "dir/b"
    ]
    s3.copy_object(Bucket=bucket, Key="dir/c", CopySource={"Bucket": bucket, "Key": "dir/b"})
    assert s3.get_object(Bucket=bucket, Key="dir/c")["Body"].read() == b"new"
    s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "dir/b"}, {"Key": "dir/c"}]})
    assert s3.list_objects_v2(Bucket=bucket, Prefix="dir/")["KeyCount"] == 0
    assert files(root / bucket) == []


def test_conditional_put(hoard, bucket):
    s3 = client(hoard)
    first = s3.put_object(Bucket=bucket, Key="once", Body=b"1", IfNoneMatch="*")
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        s3.put_object(Bucket=bucket, Key="once", Body=b"2", IfNoneMatch="*")
    assert code(excinfo) == "PreconditionFailed"
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        s3.put_object(Bucket=bucket, Key="once", Body=b"2", IfMatch='"0123"')
    assert code(excinfo) == "PreconditionFailed"
    s3.put_object(Bucket=bucket, Key="once", Body=b"3", IfMatch=first["ETag"])
    assert s3.get_object(Bucket=bucket, Key="once")["Body"].read() == b"3"
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        s3.put_object(Bucket=bucket, Key="never", Body=b"x", IfMatch=first["ETag"])
    assert code(excinfo) == "NoSuchKey"


def test_presigned_put(hoard, root, bucket):
    url = client(hoard, signature_version="s3v4").generate_presigned_url(
        "put_object", Params={"Bucket": bucket, "Key": "presigned"}
    )
    assert requests.put(url, data=b"via presigned url", timeout=10).status_code == 200
    assert (root / bucket / "presigned").read_bytes() == b"via presigned url"


# --- CopyObject ------------------------------------------------------------------------------


def test_copy_object_copy_and_replace(hoard, root, bucket):
    s3 = client(hoard)
    put = s3.put_object(Bucket=bucket, Key="src", Body=b"source bytes", ContentType="text/x-src",
                        Metadata={"a": "1"}, CacheControl="max-age=60")  # fmt: skip
    copied = s3.copy_object(Bucket=bucket, Key="copy", CopySource={"Bucket": bucket, "Key": "src"})
    assert copied["CopyObjectResult"]["ETag"] == put["ETag"]
    assert isinstance(copied["CopyObjectResult"]["LastModified"], dt.datetime)
    head = s3.head_object(Bucket=bucket, Key="copy")
    assert (head["ContentType"], head["Metadata"], head["CacheControl"]) == (
        "text/x-src", {"a": "1"}, "max-age=60",
    )  # fmt: skip
    replaced = s3.copy_object(
        Bucket=bucket, Key="deep/replaced", CopySource=f"{bucket}/src", MetadataDirective="REPLACE",
        ContentType="text/x-new", Metadata={"b": "2"},
    )  # fmt: skip
    assert replaced["CopyObjectResult"]["ETag"] == put["ETag"]
    head = s3.head_object(Bucket=bucket, Key="deep/replaced")
    assert (head["ContentType"], head["Metadata"]) == ("text/x-new", {"b": "2"})
    assert "CacheControl" not in head
    assert (root / bucket / "deep" / "replaced").read_bytes() == b"source bytes"
    # Onto itself: only with new metadata.
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        s3.copy_object(Bucket=bucket, Key="src", CopySource={"Bucket": bucket, "Key": "src"})
    assert code(excinfo) == "InvalidRequest"
    s3.copy_object(Bucket=bucket, Key="src", CopySource={"Bucket": bucket, "Key": "src"},
                   MetadataDirective="REPLACE", Metadata={"c": "3"})  # fmt: skip
    assert s3.head_object(Bucket=bucket, Key="src")["Metadata"] == {"c": "3"}
    assert s3.get_object(Bucket=bucket, Key="src")["Body"].read() == b"source bytes"


def test_copy_errors_and_conditions(hoard, root, bucket):
    s3 = client(hoard)
    put = s3.put_object(Bucket=bucket, Key="src", Body=b"source")
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        s3.copy_object(Bucket=bucket, Key="dst", CopySource={"Bucket": bucket, "Key": "absent"})
    assert code(excinfo) == "NoSuchKey"
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        s3.copy_object(Bucket=bucket, Key="dst", CopySource={"Bucket": bucket, "Key": "src"},
                       CopySourceIfMatch='"0000"')  # fmt: skip
    assert code(excinfo) == "PreconditionFailed"
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        s3.copy_object(Bucket=bucket, Key="dst", CopySource={"Bucket": bucket, "Key": "src"},
                       CopySourceIfNoneMatch=put["ETag"])  # fmt: skip
    assert code(excinfo) == "PreconditionFailed"
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        s3.copy_object(Bucket=bucket, Key="dst", CopySource={"Bucket": bucket, "Key": "src"},
                       MetadataDirective="MERGE")  # fmt: skip
    assert code(excinfo) == "InvalidArgument"
    s3.copy_object(Bucket=bucket, Key="dst", CopySource={"Bucket": bucket, "Key": "src"},
                   CopySourceIfMatch=put["ETag"])  # fmt: skip
    assert sorted(files(root / bucket)) == ["dst", "src"]


def test_copy_between_posix_buckets(hoard, root, bucket):
    s3 = client(hoard)
    s3.put_object(Bucket=bucket, Key="x", Body=b"across")
    s3.copy_object(Bucket="nested", Key="copied-in", CopySource={"Bucket": bucket, "Key": "x"})
    assert (root / "data" / "sub" / "dir" / "copied-in").read_bytes() == b"across"
    s3.copy_object(Bucket=bucket, Key="back", CopySource={"Bucket": "nested", "Key": "copied-in"})
    assert (root / bucket / "back").read_bytes() == b"across"
    # A credential limited to "nested" cannot copy out of a bucket it may not read.
    limited = s3_client(hoard.endpoint, LIMITED_KEY, LIMITED_SECRET)
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        limited.copy_object(
            Bucket="nested", Key="stolen", CopySource={"Bucket": bucket, "Key": "x"}
        )
    assert code(excinfo) == "AccessDenied"
    assert not (root / "data" / "sub" / "dir" / "stolen").exists()
    limited.copy_object(
        Bucket="nested", Key="own", CopySource={"Bucket": "nested", "Key": "copied-in"}
    )
    assert (root / "data" / "sub" / "dir" / "own").read_bytes() == b"across"


# --- DeleteObjects -----------------------------------------------------------------------------


def test_delete_objects(hoard, root, bucket):
    s3 = client(hoard)
    for key in ("a", "b/c", "d"):
        s3.put_object(Bucket=bucket, Key=key, Body=key.encode())
    result = s3.delete_objects(
        Bucket=bucket, Delete={"Objects": [{"Key": "a"}, {"Key": "b/c"}, {"Key": "missing"}]}
    )
    assert sorted(d["Key"] for d in result["Deleted"]) == ["a", "b/c", "missing"]
    assert "Errors" not in result
    assert files(root / bucket) == ["d"]
    quiet = s3.delete_objects(
        Bucket=bucket,
        Delete={"Objects": [{"Key": "d"}, {"Key": "v", "VersionId": "abc"}], "Quiet": True},
    )
    assert "Deleted" not in quiet
    assert [(e["Key"], e["Code"]) for e in quiet["Errors"]] == [("v", "NoSuchVersion")]
    assert files(root / bucket) == []
    with_md5 = client(hoard, request_checksum_calculation="when_required")
    with_md5.put_object(Bucket=bucket, Key="e", Body=b"e")
    assert [d["Key"] for d in with_md5.delete_objects(
        Bucket=bucket, Delete={"Objects": [{"Key": "e"}]})["Deleted"]] == ["e"]  # fmt: skip


def test_delete_objects_needs_an_integrity_header(hoard, bucket):
    body = b"<Delete><Object><Key>a</Key></Object></Delete>"
    answer = raw(hoard, "POST", f"/{bucket}?delete", body)
    assert answer.status == 400 and b"<Code>InvalidRequest</Code>" in answer.body
    md5 = base64.b64encode(hashlib.md5(body).digest()).decode()
    answer = raw(hoard, "POST", f"/{bucket}?delete", body, {"Content-MD5": md5})
    assert answer.status == 200 and b"<Deleted><Key>a</Key></Deleted>" in answer.body
    bad = b"<Delete><Object><Key>a</Key></Object>"
    md5 = base64.b64encode(hashlib.md5(bad).digest()).decode()
    answer = raw(hoard, "POST", f"/{bucket}?delete", bad, {"Content-MD5": md5})
    assert answer.status == 400 and b"<Code>MalformedXML</Code>" in answer.body


# --- multipart -----------------------------------------------------------------------------------


def test_upload_and_download_file_multipart(hoard, root, bucket, tmp_path):
    source = tmp_path / "big.bin"
    source.write_bytes(os.urandom(24 * MiB))
    transfer = boto3.s3.transfer.TransferConfig(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB,
                                                max_concurrency=4)  # fmt: skip
    s3 = client(hoard)
    s3.upload_file(str(source), bucket, "ckpt/big.bin", Config=transfer,
                   ExtraArgs={"Metadata": {"epoch": "3"}, "ContentType": "application/x-ckpt"})  # fmt: skip
    assert (root / bucket / "ckpt" / "big.bin").read_bytes() == source.read_bytes()
    head = s3.head_object(Bucket=bucket, Key="ckpt/big.bin")
    digests = b"".join(
        hashlib.md5(source.read_bytes()[i : i + 5 * MiB]).digest()
        for i in range(0, 24 * MiB, 5 * MiB)
    )
    assert head["ETag"] == f'"{hashlib.md5(digests).hexdigest()}-5"'
    assert head["Metadata"] == {"epoch": "3"} and head["ContentType"] == "application/x-ckpt"
    assert s3.list_objects_v2(Bucket=bucket)["Contents"][0]["ETag"] == head["ETag"]
    target = tmp_path / "back.bin"
    s3.download_file(bucket, "ckpt/big.bin", str(target), Config=transfer)
    assert target.read_bytes() == source.read_bytes()
    assert not any((root / STAGING).iterdir())  # the staging area is cleaned on complete


def test_list_parts_list_uploads_abort(hoard, root, bucket):
    s3 = client(hoard)
    upload = s3.create_multipart_upload(Bucket=bucket, Key="mp/one", ContentType="text/plain")
    assert upload["Bucket"] == bucket and upload["Key"] == "mp/one"
    upload_id = upload["UploadId"]
    etags = [
        s3.upload_part(Bucket=bucket, Key="mp/one", UploadId=upload_id, PartNumber=n,
                       Body=bytes([n]) * 100)["ETag"]
        for n in (1, 2, 3)
    ]  # fmt: skip
    assert etags[0] == md5_etag(b"\x01" * 100)
    first = s3.list_parts(Bucket=bucket, Key="mp/one", UploadId=upload_id, MaxParts=2)
    assert [p["PartNumber"] for p in first["Parts"]] == [1, 2]
    assert first["IsTruncated"] and first["NextPartNumberMarker"] == 2
    assert [p["ETag"] for p in first["Parts"]] == etags[:2] and first["Parts"][0]["Size"] == 100
    rest = s3.list_parts(Bucket=bucket, Key="mp/one", UploadId=upload_id, PartNumberMarker=2)
    assert [p["PartNumber"] for p in rest["Parts"]] == [3] and not rest["IsTruncated"]
    paginated = s3.get_paginator("list_parts").paginate(
        Bucket=bucket, Key="mp/one", UploadId=upload_id, PaginationConfig={"PageSize": 1}
    )
    assert [p["PartNumber"] for page in paginated for p in page["Parts"]] == [1, 2, 3]

    others = [s3.create_multipart_upload(Bucket=bucket, Key=k)["UploadId"]
              for k in ("mp/two", "mp/two", "other/x")]  # fmt: skip
    listed = s3.list_multipart_uploads(Bucket=bucket, Prefix="mp/")
    assert [u["Key"] for u in listed["Uploads"]] == ["mp/one", "mp/two", "mp/two"]
    assert listed["Uploads"][0]["UploadId"] == upload_id
    page = s3.list_multipart_uploads(Bucket=bucket, MaxUploads=2)
    assert page["IsTruncated"] and len(page["Uploads"]) == 2
    after = s3.list_multipart_uploads(
        Bucket=bucket, KeyMarker=page["NextKeyMarker"], UploadIdMarker=page["NextUploadIdMarker"]
    )
    everything = page["Uploads"] + after["Uploads"]
    assert sorted(u["UploadId"] for u in everything) == sorted([upload_id, *others])
    rolled = s3.list_multipart_uploads(Bucket=bucket, Delimiter="/")
    assert [p["Prefix"] for p in rolled["CommonPrefixes"]] == ["mp/", "other/"]
    every = s3.get_paginator("list_multipart_uploads").paginate(
        Bucket=bucket, PaginationConfig={"PageSize": 1}
    )
    assert len([u for page in every for u in page.get("Uploads", [])]) == 4

    aborted = s3.abort_multipart_upload(Bucket=bucket, Key="mp/one", UploadId=upload_id)
    assert aborted["ResponseMetadata"]["HTTPStatusCode"] == 204
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        s3.list_parts(Bucket=bucket, Key="mp/one", UploadId=upload_id)
    assert code(excinfo) == "NoSuchUpload" and status(excinfo) == 404
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        s3.abort_multipart_upload(Bucket=bucket, Key="mp/one", UploadId=upload_id)
    assert code(excinfo) == "NoSuchUpload"
    for key, other in zip(("mp/two", "mp/two", "other/x"), others, strict=True):
        s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=other)
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    assert files(root / bucket) == []


def test_complete_errors(hoard, root, bucket):
    s3 = client(hoard)
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key="k")["UploadId"]
    small = [
        s3.upload_part(Bucket=bucket, Key="k", UploadId=upload_id, PartNumber=n, Body=b"tiny")[
            "ETag"
        ]
        for n in (1, 2)
    ]

    def complete(parts):
        with pytest.raises(botocore.exceptions.ClientError) as excinfo:
            s3.complete_multipart_upload(Bucket=bucket, Key="k", UploadId=upload_id,
                                         MultipartUpload={"Parts": parts})  # fmt: skip
        return code(excinfo)

    assert complete([{"PartNumber": 1, "ETag": small[0]}, {"PartNumber": 2, "ETag": small[1]}]) == (
        "EntityTooSmall"
    )
    assert complete([{"PartNumber": 2, "ETag": small[1]}, {"PartNumber": 1, "ETag": small[0]}]) == (
        "InvalidPartOrder"
    )
    assert (
        complete([{"PartNumber": 1, "ETag": '"00000000000000000000000000000000"'}]) == "InvalidPart"
    )
    assert complete([{"PartNumber": 7, "ETag": small[0]}]) == "InvalidPart"
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        s3.upload_part(Bucket=bucket, Key="k", UploadId="no-such-upload-id-at-all", PartNumber=1,
                       Body=b"x")  # fmt: skip
    assert code(excinfo) == "NoSuchUpload"
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        s3.upload_part(Bucket=bucket, Key="k", UploadId=upload_id, PartNumber=10001, Body=b"x")
    assert code(excinfo) == "InvalidArgument"
    # The last part may be small; a single small part completes.
    done = s3.complete_multipart_upload(Bucket=bucket, Key="k", UploadId=upload_id,
                                        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": small[0]}]})  # fmt: skip
    assert done["ETag"].endswith('-1"') and done["Key"] == "k" and done["Bucket"] == bucket
    assert (root / bucket / "k").read_bytes() == b"tiny"
    assert s3.head_object(Bucket=bucket, Key="k")["ETag"] == done["ETag"]


def test_upload_part_copy(hoard, root, bucket):
    s3 = client(hoard)
    source = os.urandom(6 * MiB)
    s3.put_object(Bucket=bucket, Key="src", Body=source)
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key="joined")["UploadId"]
    first = s3.upload_part_copy(Bucket=bucket, Key="joined", UploadId=upload_id, PartNumber=1,
                                CopySource={"Bucket": bucket, "Key": "src"},
                                CopySourceRange=f"bytes=0-{5 * MiB - 1}")  # fmt: skip
    assert first["CopyPartResult"]["ETag"] == md5_etag(source[: 5 * MiB])
    second = s3.upload_part_copy(Bucket=bucket, Key="joined", UploadId=upload_id, PartNumber=2,
                                 CopySource=f"/{bucket}/src", CopySourceRange="bytes=10-19")  # fmt: skip
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        s3.upload_part_copy(Bucket=bucket, Key="joined", UploadId=upload_id, PartNumber=3,
                            CopySource={"Bucket": bucket, "Key": "src"},
                            CopySourceRange=f"bytes=0-{6 * MiB}")  # fmt: skip
    assert code(excinfo) == "InvalidArgument"
    parts = [{"PartNumber": 1, "ETag": first["CopyPartResult"]["ETag"]},
             {"PartNumber": 2, "ETag": second["CopyPartResult"]["ETag"]}]  # fmt: skip
    s3.complete_multipart_upload(Bucket=bucket, Key="joined", UploadId=upload_id,
                                 MultipartUpload={"Parts": parts})  # fmt: skip
    assert (root / bucket / "joined").read_bytes() == source[: 5 * MiB] + source[10:20]


def test_s3_copy_managed_multipart(hoard, root, bucket):
    s3 = client(hoard)
    data = os.urandom(11 * MiB)
    s3.put_object(Bucket=bucket, Key="src", Body=data)
    transfer = boto3.s3.transfer.TransferConfig(
        multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB
    )
    s3.copy({"Bucket": bucket, "Key": "src"}, bucket, "dst", Config=transfer)
    assert (root / bucket / "dst").read_bytes() == data
    assert s3.head_object(Bucket=bucket, Key="dst")["ETag"].endswith('-3"')


# --- mounts: read-only, prefixed -------------------------------------------------------------


def test_readonly_mount_refuses_every_write(hoard, root, bucket):
    s3 = client(hoard)
    before = files(root / "frozen-dir")
    refused = [
        lambda: s3.put_object(Bucket="frozen", Key="new", Body=b"x"),
        lambda: s3.put_object(Bucket="frozen", Key="old.txt", Body=b"overwrite"),
        lambda: s3.delete_object(Bucket="frozen", Key="old.txt"),
        lambda: s3.delete_objects(Bucket="frozen", Delete={"Objects": [{"Key": "old.txt"}]}),
        lambda: s3.copy_object(Bucket="frozen", Key="c", CopySource={"Bucket": bucket, "Key": "x"}),
        lambda: s3.create_multipart_upload(Bucket="frozen", Key="mp"),
    ]
    for call in refused:
        with pytest.raises(botocore.exceptions.ClientError) as excinfo:
            call()
        assert code(excinfo) == "AccessDenied"
    assert files(root / "frozen-dir") == before
    assert (root / "frozen-dir" / "old.txt").read_bytes() == b"old"
    assert not (root / STAGING).exists() or not any((root / STAGING).iterdir())
    # Reading from it, and copying out of it, still work.
    assert s3.get_object(Bucket="frozen", Key="old.txt")["Body"].read() == b"old"
    s3.copy_object(Bucket=bucket, Key="thawed", CopySource={"Bucket": "frozen", "Key": "old.txt"})
    assert (root / bucket / "thawed").read_bytes() == b"old"


def test_prefixed_mount_writes_under_its_prefix(hoard, root):
    s3 = client(hoard)
    s3.put_object(Bucket="nested", Key="a/b.txt", Body=b"prefixed")
    assert (root / "data" / "sub" / "dir" / "a" / "b.txt").read_bytes() == b"prefixed"
    assert s3.get_object(Bucket="nested", Key="a/b.txt")["Body"].read() == b"prefixed"
    assert s3.get_object(Bucket="data", Key="sub/dir/a/b.txt")["Body"].read() == b"prefixed"
    upload_id = s3.create_multipart_upload(Bucket="nested", Key="a/mp")["UploadId"]
    listed = s3.list_multipart_uploads(Bucket="nested", Prefix="a/")["Uploads"]
    assert [(u["Key"], u["UploadId"]) for u in listed] == [("a/mp", upload_id)]
    etag = s3.upload_part(Bucket="nested", Key="a/mp", UploadId=upload_id, PartNumber=1,
                          Body=b"part")["ETag"]  # fmt: skip
    assert s3.list_parts(Bucket="nested", Key="a/mp", UploadId=upload_id)["Key"] == "a/mp"
    s3.complete_multipart_upload(Bucket="nested", Key="a/mp", UploadId=upload_id,
                                 MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]})  # fmt: skip
    assert (root / "data" / "sub" / "dir" / "a" / "mp").read_bytes() == b"part"
    result = s3.delete_objects(
        Bucket="nested", Delete={"Objects": [{"Key": "a/b.txt"}, {"Key": "a/mp"}]}
    )
    assert sorted(d["Key"] for d in result["Deleted"]) == ["a/b.txt", "a/mp"]
    assert not (root / "data" / "sub" / "dir" / "a").exists()  # emptied directories pruned
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        s3.get_object(Bucket="data", Key="sub/dir/a/b.txt")
    assert code(excinfo) == "NoSuchKey"


def test_other_operations_are_not_implemented(hoard, root, bucket):
    s3 = client(hoard)
    s3.put_object(Bucket=bucket, Key="t", Body=b"tagged?")
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        s3.put_object_tagging(
            Bucket=bucket, Key="t", Tagging={"TagSet": [{"Key": "k", "Value": "v"}]}
        )
    assert code(excinfo) == "NotImplemented" and status(excinfo) == 501
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        s3.delete_object_tagging(Bucket=bucket, Key="t")
    assert code(excinfo) == "NotImplemented"
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        s3.put_bucket_tagging(Bucket=bucket, Tagging={"TagSet": [{"Key": "k", "Value": "v"}]})
    assert code(excinfo) == "NotImplemented"
    assert (root / bucket / "t").read_bytes() == b"tagged?"  # neither overwritten nor deleted


def test_create_and_delete_bucket_make_and_remove_its_directory(hoard, root):
    s3 = client(hoard)
    name = f"made-{uuid.uuid4().hex[:10]}"
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        s3.head_bucket(Bucket=name)  # a miss first: nothing of it may linger
    assert status(excinfo) == 404
    answer = s3.create_bucket(Bucket=name)
    assert answer["Location"] == f"/{name}" and (root / name).is_dir()
    assert s3.create_bucket(Bucket=name)["ResponseMetadata"]["HTTPStatusCode"] == 200  # us-east-1
    s3.head_bucket(Bucket=name)
    assert name in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    s3.put_object(Bucket=name, Key="deep/er/x", Body=b"x")
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        s3.delete_bucket(Bucket=name)
    assert code(excinfo) == "BucketNotEmpty" and status(excinfo) == 409
    s3.delete_object(Bucket=name, Key="deep/er/x")
    (root / name / "only" / "empty").mkdir(parents=True)  # no object: S3 shows nothing
    assert s3.delete_bucket(Bucket=name)["ResponseMetadata"]["HTTPStatusCode"] == 204
    assert not (root / name).exists()
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        s3.delete_bucket(Bucket=name)
    assert code(excinfo) == "NoSuchBucket"


@pytest.mark.parametrize("name", ["Upper-Case", "a..b", "192.168.1.1", "-dash"])
def test_create_bucket_refuses_invalid_names(hoard, root, name):
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        client(hoard).create_bucket(Bucket=name)
    assert code(excinfo) == "InvalidBucketName" and status(excinfo) == 400
    assert not (root / name).exists()


def test_create_bucket_over_a_file_is_taken_and_a_mount_is_not_deleted(hoard, root):
    (root / "a-plain-file").write_bytes(b"not a bucket")
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        client(hoard).create_bucket(Bucket="a-plain-file")
    assert code(excinfo) == "BucketAlreadyExists" and status(excinfo) == 409
    assert client(hoard).create_bucket(Bucket="frozen")["ResponseMetadata"]["HTTPStatusCode"] == 200
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        client(hoard).delete_bucket(Bucket="nested")
    assert code(excinfo) == "NotImplemented"
    assert (root / "data").is_dir()


# --- other clients ---------------------------------------------------------------------------


def test_s3fs_pipe_put_rm(hoard, root, bucket, tmp_path):
    fs = s3fs.S3FileSystem(key=ACCESS_KEY, secret=SECRET_KEY,
                           client_kwargs={"endpoint_url": hoard.endpoint, "region_name": "us-east-1"})  # fmt: skip
    fs.pipe(f"{bucket}/piped", b"piped bytes")
    local = tmp_path / "local.bin"
    local.write_bytes(os.urandom(7 * MiB))
    fs.put(str(local), f"{bucket}/put/local.bin")
    payload = os.urandom(12 * MiB)
    with fs.open(f"{bucket}/written", "wb", block_size=5 * MiB) as handle:
        handle.write(payload)
    assert (root / bucket / "piped").read_bytes() == b"piped bytes"
    assert (root / bucket / "put" / "local.bin").read_bytes() == local.read_bytes()
    assert (root / bucket / "written").read_bytes() == payload
    assert fs.cat(f"{bucket}/written") == payload
    fs.rm(f"{bucket}/piped")
    fs.rm(f"{bucket}/put", recursive=True)
    assert files(root / bucket) == ["written"]
    fs.invalidate_cache()
    assert fs.ls(bucket) == [f"{bucket}/written"]


def test_aws_cli_cp_sync_rm(hoard, root, bucket, tmp_path):
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    content = {"a.txt": b"a", "sub/b.bin": os.urandom(9 * MiB), "sub/c.json": b"{}"}
    # S3 states LastModified in whole seconds, and `aws s3 sync` uploads a file whose local mtime is
    # later than the object's: written in the same second as their upload, the files would look
    # newer than their copies and be uploaded again. Their mtimes go a minute back.
    a_minute_ago = time.time() - 60
    for name, data in content.items():
        (tree / name).write_bytes(data)
        os.utime(tree / name, (a_minute_ago, a_minute_ago))
    env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
           "AWS_DEFAULT_REGION": "us-east-1", "HOME": str(tmp_path)}  # fmt: skip

    def aws(*args: str) -> str:
        result = subprocess.run(["aws", "--endpoint-url", hoard.endpoint, "s3", *args],
                                capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
        assert result.returncode == 0, result.stderr
        return result.stdout

    aws("cp", str(tree / "a.txt"), f"s3://{bucket}/single.txt")
    assert (root / bucket / "single.txt").read_bytes() == b"a"
    aws("sync", str(tree), f"s3://{bucket}/synced/")
    for name, data in content.items():
        assert (root / bucket / "synced" / name).read_bytes() == data
    assert "upload:" not in aws("sync", str(tree), f"s3://{bucket}/synced/")  # nothing changed
    back = tmp_path / "back"
    aws("cp", "--recursive", f"s3://{bucket}/synced/", str(back))
    assert (back / "sub" / "b.bin").read_bytes() == content["sub/b.bin"]
    aws("rm", "--recursive", f"s3://{bucket}/synced/")
    assert files(root / bucket) == ["single.txt"]
    client(hoard).head_object(Bucket=bucket, Key="single.txt")
    assert client(hoard).list_objects_v2(Bucket=bucket, Prefix="synced/")["KeyCount"] == 0
