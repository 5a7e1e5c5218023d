"""The write path end to end: real clients → Hoard → moto, checked at the origin."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import socket
import subprocess
import uuid

import boto3
import botocore.exceptions
import pytest
import requests
import s3fs
from botocore.config import Config

from tests.conftest import ORIGIN_KEY, ORIGIN_SECRET
from tests.harness import ACCESS_KEY, SECRET_KEY, HoardProcess, s3_client
from tests.rawhttp import sign_headers

MiB = 1024 * 1024
LIMITED_KEY, LIMITED_SECRET = "limited", "limited-secret"
READER_KEY, READER_SECRET = "reader", "reader-secret"


@pytest.fixture(scope="module")
def hoard(tmp_path_factory, moto_endpoint, origin_client):
    origin_client.create_bucket(Bucket="frozen-origin")
    origin_client.put_object(Bucket="frozen-origin", Key="old", Body=b"old")
    config = {
        "origins": {"moto": {"type": "s3", "endpoint": moto_endpoint, "access_key": ORIGIN_KEY,
                             "secret_key": ORIGIN_SECRET, "addressing_style": "path"}},
        "default_origin": "moto",
        "mounts": [{"bucket": "frozen", "origin": "moto", "origin_bucket": "frozen-origin",
                    "readonly": True}],
        "credentials": [
            {"access_key": ACCESS_KEY, "secret_key": SECRET_KEY},
            {"access_key": LIMITED_KEY, "secret_key": LIMITED_SECRET, "buckets": ["frozen"]},
            {"access_key": READER_KEY, "secret_key": READER_SECRET, "readonly": True},
        ],
    }  # fmt: skip
    node = HoardProcess(tmp_path_factory.mktemp("hoard-w"), config).start()
    yield node
    node.stop()


@pytest.fixture
def bucket(hoard) -> str:
    name = f"w-{uuid.uuid4().hex[:10]}"
    hoard.client().create_bucket(Bucket=name)
    return name


def client(hoard, **config):
    return s3_client(hoard.endpoint, **config)


def code(excinfo: pytest.ExceptionInfo) -> str:
    return excinfo.value.response["Error"]["Code"]


def origin_bytes(origin_client, bucket: str, key: str) -> bytes:
    return origin_client.get_object(Bucket=bucket, Key=key)["Body"].read()


def origin_has(origin_client, bucket: str, key: str) -> bool:
    try:
        origin_client.head_object(Bucket=bucket, Key=key)
        return True
    except botocore.exceptions.ClientError:
        return False


@pytest.mark.parametrize("size", [0, 1, 70_000, 5 * MiB + 3])
@pytest.mark.parametrize("checksums", ["when_supported", "when_required"])
def test_put_object_default_checksum_settings(hoard, bucket, origin_client, size, checksums):
    data = os.urandom(size)
    s3 = client(hoard, request_checksum_calculation=checksums)
    s3.put_object(Bucket=bucket, Key="obj", Body=data, ContentType="application/x-data",
                  Metadata={"owner": "t"}, CacheControl="no-store", ContentDisposition="inline")  # fmt: skip
    assert origin_bytes(origin_client, bucket, "obj") == data
    head = origin_client.head_object(Bucket=bucket, Key="obj")
    assert head["ContentType"] == "application/x-data" and head["Metadata"] == {"owner": "t"}
    assert head["CacheControl"] == "no-store" and head["ContentDisposition"] == "inline"


@pytest.mark.parametrize("algorithm", ["CRC32", "CRC32C", "CRC64NVME", "SHA1", "SHA256"])
def test_put_object_each_checksum_algorithm(hoard, bucket, origin_client, algorithm):
    data = os.urandom(300_001)
    client(hoard).put_object(Bucket=bucket, Key="c", Body=data, ChecksumAlgorithm=algorithm)
    assert origin_bytes(origin_client, bucket, "c") == data


def test_upload_and_download_file_multipart(hoard, bucket, origin_client, tmp_path):
    source = tmp_path / "big.bin"
    source.write_bytes(os.urandom(100 * MiB))
    transfer = boto3.s3.transfer.TransferConfig(multipart_threshold=8 * MiB, multipart_chunksize=8 * MiB,
                                                max_concurrency=8)  # fmt: skip
    s3 = client(hoard)
    s3.upload_file(str(source), bucket, "big.bin", Config=transfer)
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    assert hashlib.sha256(origin_bytes(origin_client, bucket, "big.bin")).hexdigest() == digest
    target = tmp_path / "back.bin"
    s3.download_file(bucket, "big.bin", str(target), Config=transfer)
    assert hashlib.sha256(target.read_bytes()).hexdigest() == digest
    etag = s3.head_object(Bucket=bucket, Key="big.bin")["ETag"]
    assert etag == origin_client.head_object(Bucket=bucket, Key="big.bin")["ETag"] and "-13" in etag


def test_write_then_read_head_list_see_the_new_state(hoard, bucket):
    s3 = client(hoard)
    s3.put_object(Bucket=bucket, Key="dir/a", Body=b"first")
    assert s3.get_object(Bucket=bucket, Key="dir/a")["Body"].read() == b"first"  # now cached
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="dir/")["Contents"]] == [
        "dir/a"
    ]
    s3.put_object(Bucket=bucket, Key="dir/a", Body=b"second, longer")
    s3.put_object(Bucket=bucket, Key="dir/b", Body=b"new")
    assert s3.get_object(Bucket=bucket, Key="dir/a")["Body"].read() == b"second, longer"
    assert s3.head_object(Bucket=bucket, Key="dir/a")["ContentLength"] == len(b"second, longer")
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
    result = s3.delete_objects(
        Bucket=bucket, Delete={"Objects": [{"Key": "dir/b"}, {"Key": "dir/c"}]}
    )
    assert len(result["Deleted"]) == 2
    assert s3.list_objects_v2(Bucket=bucket, Prefix="dir/")["KeyCount"] == 0


def test_wrong_content_md5_and_checksum_store_nothing(hoard, bucket, origin_client):
    s3 = client(hoard)
    wrong_md5 = base64.b64encode(hashlib.md5(b"other").digest()).decode()
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        s3.put_object(Bucket=bucket, Key="md5", Body=b"payload", ContentMD5=wrong_md5)
    assert code(excinfo) == "BadDigest"
    assert not origin_has(origin_client, bucket, "md5")
    wrong_sha = base64.b64encode(hashlib.sha256(b"other").digest()).decode()
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        s3.put_object(Bucket=bucket, Key="sha", Body=b"payload", ChecksumSHA256=wrong_sha)
    assert code(excinfo) in ("BadDigest", "XAmzContentSHA256Mismatch")
    assert not origin_has(origin_client, bucket, "sha")


def _raw_put(
    hoard, path: str, body: bytes, headers: dict[str, str], declared: int | None = None
) -> bytes:
    host = f"127.0.0.1:{hoard.port}"
    signed = sign_headers("PUT", host, path, headers)
    signed.update(
        {"Host": host, "Content-Length": str(len(body) if declared is None else declared)}
    )
    with socket.create_connection(("127.0.0.1", hoard.port), timeout=10) as sock:
        head = "".join(f"{k}: {v}\r\n" for k, v in signed.items())
        sock.sendall(f"PUT {path} HTTP/1.1\r\n{head}\r\n".encode() + body)
        if declared is not None and declared > len(body):
            sock.shutdown(socket.SHUT_WR)  # a truncated body: the client gives up
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
            if b"\r\n\r\n" in answer and answer.endswith(b">"):
                break
        return answer


def test_truncated_and_oversized_bodies_store_nothing(hoard, bucket, origin_client):
    _raw_put(hoard, f"/{bucket}/short", b"x" * 1000, {}, declared=5000)
    assert not origin_has(origin_client, bucket, "short")
    streaming = {"x-amz-decoded-content-length": "5", "Content-Encoding": "aws-chunked"}
    long_body = b"a\r\n0123456789\r\n0\r\n\r\n"  # 10 bytes where 5 were declared
    answer = _raw_put(hoard, f"/{bucket}/long", long_body, streaming)
    assert b"400" in answer.split(b"\r\n", 1)[0]
    assert not origin_has(origin_client, bucket, "long")


def test_presigned_put(hoard, bucket, origin_client):
    url = client(hoard, signature_version="s3v4").generate_presigned_url(
        "put_object", Params={"Bucket": bucket, "Key": "presigned"}
    )
    assert requests.put(url, data=b"via presigned url", timeout=10).status_code == 200
    assert origin_bytes(origin_client, bucket, "presigned") == b"via presigned url"


def test_readonly_mount_and_limited_credentials(hoard, bucket, origin_client):
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        client(hoard).put_object(Bucket="frozen", Key="new", Body=b"x")
    assert code(excinfo) == "AccessDenied"
    assert not origin_has(origin_client, "frozen-origin", "new")
    limited = s3_client(hoard.endpoint, LIMITED_KEY, LIMITED_SECRET)
    assert limited.get_object(Bucket="frozen", Key="old")["Body"].read() == b"old"
    assert [b["Name"] for b in limited.list_buckets()["Buckets"]] == ["frozen"]
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        limited.list_objects_v2(Bucket=bucket)
    assert code(excinfo) == "AccessDenied"
    reader = s3_client(hoard.endpoint, READER_KEY, READER_SECRET)
    assert reader.list_objects_v2(Bucket=bucket)["KeyCount"] == 0
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        reader.put_object(Bucket=bucket, Key="nope", Body=b"x")
    assert code(excinfo) == "AccessDenied"
    assert not origin_has(origin_client, bucket, "nope")


def test_passthrough_operations(hoard, bucket, origin_client):
    s3 = client(hoard)
    s3.put_object(Bucket=bucket, Key="t", Body=b"tagged")
    s3.put_object_tagging(Bucket=bucket, Key="t", Tagging={"TagSet": [{"Key": "k", "Value": "v"}]})
    assert s3.get_object_tagging(Bucket=bucket, Key="t")["TagSet"] == [{"Key": "k", "Value": "v"}]
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    assert s3.get_bucket_versioning(Bucket=bucket)["Status"] == "Enabled"
    s3.put_object(Bucket=bucket, Key="v", Body=b"one")
    s3.put_object(Bucket=bucket, Key="v", Body=b"two")
    versions = s3.list_object_versions(Bucket=bucket, Prefix="v")["Versions"]
    assert len(versions) == 2
    upload = s3.create_multipart_upload(Bucket=bucket, Key="mp")
    assert s3.list_multipart_uploads(Bucket=bucket)["Uploads"][0]["UploadId"] == upload["UploadId"]
    s3.abort_multipart_upload(Bucket=bucket, Key="mp", UploadId=upload["UploadId"])
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        s3.get_object_tagging(Bucket=bucket, Key="absent")
    assert code(excinfo) == "NoSuchKey"  # the origin's own error comes back as it is
    other = f"w-{uuid.uuid4().hex[:10]}"
    s3.create_bucket(Bucket=other)
    assert other in [b["Name"] for b in origin_client.list_buckets()["Buckets"]]
    s3.delete_bucket(Bucket=other)
    assert other not in [b["Name"] for b in origin_client.list_buckets()["Buckets"]]


def test_s3fs_writes(hoard, bucket, origin_client):
    fs = s3fs.S3FileSystem(key=ACCESS_KEY, secret=SECRET_KEY,
                           client_kwargs={"endpoint_url": hoard.endpoint, "region_name": "us-east-1"})  # fmt: skip
    fs.pipe(f"{bucket}/piped", b"piped bytes")
    payload = os.urandom(12 * MiB)
    with fs.open(f"{bucket}/written", "wb", block_size=5 * MiB) as handle:
        handle.write(payload)
    assert origin_bytes(origin_client, bucket, "piped") == b"piped bytes"
    assert origin_bytes(origin_client, bucket, "written") == payload
    assert fs.cat(f"{bucket}/written") == payload
    fs.rm(f"{bucket}/piped")
    assert not origin_has(origin_client, bucket, "piped")


def test_aws_cli_cp_sync_rm(hoard, bucket, origin_client, tmp_path):
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    files = {"a.txt": b"a", "sub/b.bin": os.urandom(9 * MiB)}
    for name, data in files.items():
        (tree / name).write_bytes(data)
    env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
           "AWS_DEFAULT_REGION": "us-east-1", "HOME": str(tmp_path)}  # fmt: skip

    def aws(*args: str) -> None:
        result = subprocess.run(["aws", "--endpoint-url", hoard.endpoint, "s3", *args],
                                capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
        assert result.returncode == 0, result.stderr

    aws("cp", str(tree / "a.txt"), f"s3://{bucket}/single.txt")
    aws("sync", str(tree), f"s3://{bucket}/synced/")
    for name, data in files.items():
        assert origin_bytes(origin_client, bucket, f"synced/{name}") == data
    assert origin_bytes(origin_client, bucket, "single.txt") == b"a"
    aws("rm", "--recursive", f"s3://{bucket}/synced/")
    assert origin_client.list_objects_v2(Bucket=bucket, Prefix="synced/")["KeyCount"] == 0


def test_minio_client(hoard, bucket, origin_client):
    minio = pytest.importorskip("minio")
    mc = minio.Minio(f"127.0.0.1:{hoard.port}", access_key=ACCESS_KEY, secret_key=SECRET_KEY,
                     secure=False, region="us-east-1")  # fmt: skip
    data = os.urandom(6 * MiB + 1)
    mc.put_object(bucket, "from-minio", io.BytesIO(data), len(data), part_size=5 * MiB)
    assert origin_bytes(origin_client, bucket, "from-minio") == data
    assert mc.get_object(bucket, "from-minio").read() == data
    mc.remove_object(bucket, "from-minio")
    assert not origin_has(origin_client, bucket, "from-minio")


def test_boto3_with_unsigned_payload_over_http(hoard, bucket, origin_client):
    s3 = boto3.client(
        "s3", endpoint_url=hoard.endpoint, region_name="us-east-1", aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        config=Config(s3={"payload_signing_enabled": False, "addressing_style": "path"}),
    )  # fmt: skip
    s3.put_object(Bucket=bucket, Key="unsigned", Body=b"unsigned payload")
    assert origin_bytes(origin_client, bucket, "unsigned") == b"unsigned payload"


def test_limited_credential_cannot_copy_from_a_bucket_it_may_not_read(hoard, bucket, origin_client):
    client(hoard).put_object(Bucket=bucket, Key="secret", Body=b"not for limited")
    limited = s3_client(hoard.endpoint, LIMITED_KEY, LIMITED_SECRET)
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        limited.copy_object(
            Bucket="frozen", Key="stolen", CopySource={"Bucket": bucket, "Key": "secret"}
        )
    assert code(excinfo) == "AccessDenied"
    assert not origin_has(origin_client, "frozen-origin", "stolen")
