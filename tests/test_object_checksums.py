"""The checksum headers of GET and HEAD through Hoard are S3's, whatever the origin's HEAD said.

boto3 >= 1.36 asks for checksums on every GetObject and checks the body against
any value without a ``-N``. moto (like some S3 servers) answers HEAD with a
multipart object's composite checksum bare: Hoard, which keeps what a HEAD told
it, must not replay that on a GET. The end-to-end cases use a default boto3
client (checksum validation on) against Hoard in front of moto; the rules
themselves are checked on ``object_checksums.served`` directly.
"""

from __future__ import annotations

import base64
import zlib
from pathlib import Path

import pytest

from gateway.s3.object_checksums import served
from tests.conftest import moto_origin
from tests.inprocess import threaded_app

MiB = 1024 * 1024
PARTS = (b"a" * (5 * MiB), b"b" * 1000)


def _crc32(data: bytes) -> str:
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def _multipart(client, bucket: str, key: str, **extra: str) -> None:
    upload = client.create_multipart_upload(
        Bucket=bucket, Key=key, ChecksumAlgorithm="CRC32", **extra
    )["UploadId"]
    done = []
    for number, body in enumerate(PARTS, 1):
        answer = client.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=number,
                                    Body=body, ChecksumAlgorithm="CRC32")  # fmt: skip
        done.append({"PartNumber": number, "ETag": answer["ETag"],
                     "ChecksumCRC32": answer["ChecksumCRC32"]})  # fmt: skip
    client.complete_multipart_upload(
        Bucket=bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": done}
    )


def _composite_or_none(answer: dict) -> None:
    """S3's spelling of a composite checksum (its -N and its type), or none at all: moto's
    HEAD leaves Hoard unable to tell, and then no checksum is better than a wrong one."""
    if "ChecksumCRC32" in answer or "ChecksumType" in answer:
        assert answer["ChecksumCRC32"].endswith("-2")
        assert answer["ChecksumType"] == "COMPOSITE"


@pytest.fixture
def hoard(tmp_path: Path, proxy):
    with threaded_app(tmp_path, {"origins": {"s3": moto_origin(proxy)},
                                 "default_origin": "s3"}) as running:  # fmt: skip
        yield running


def test_multipart_object_reads_after_a_head_with_checksum_validation(
    hoard, origin_client, bucket: str
) -> None:
    _multipart(origin_client, bucket, "big")
    client = hoard.client()  # boto3's defaults: checksums asked for and validated
    head = client.head_object(Bucket=bucket, Key="big", ChecksumMode="ENABLED")
    got = client.get_object(Bucket=bucket, Key="big")
    assert got["Body"].read() == b"".join(PARTS)  # FlexibleChecksumError before the fix
    _composite_or_none(head)
    _composite_or_none(got)
    ranged = client.get_object(Bucket=bucket, Key="big", Range="bytes=1-10")
    assert ranged["Body"].read() == b"a" * 10
    assert "ChecksumCRC32" not in ranged and "ChecksumType" not in ranged


def test_single_part_object_keeps_its_full_object_checksum(
    hoard, origin_client, bucket: str
) -> None:
    origin_client.put_object(Bucket=bucket, Key="small", Body=b"hello", ChecksumAlgorithm="CRC32")
    client = hoard.client()
    client.head_object(Bucket=bucket, Key="small", ChecksumMode="ENABLED")
    got = client.get_object(Bucket=bucket, Key="small", ChecksumMode="ENABLED")
    assert got["Body"].read() == b"hello"
    assert got["ChecksumCRC32"] == _crc32(b"hello")  # as moto sends it: no type named


def test_full_object_multipart_checksum_is_served_with_its_type(
    hoard, origin_client, bucket: str
) -> None:
    _multipart(origin_client, bucket, "full", ChecksumType="FULL_OBJECT")
    client = hoard.client()
    got = client.get_object(Bucket=bucket, Key="full")  # moto's GET names the type
    assert got["Body"].read() == b"".join(PARTS)  # validated against the whole body
    assert got["ChecksumCRC32"] == _crc32(b"".join(PARTS))
    assert got["ChecksumType"] == "FULL_OBJECT"


MULTIPART_ETAG, SINGLE_ETAG = '"0123456789abcdef0123456789abcdef-3"', '"0123456789abcdef"'


@pytest.mark.parametrize(
    ("stored", "etag", "expected"),
    [
        # moto's HEAD: a composite value bare, no type -> undecidable, none
        ({"x-amz-checksum-crc32": "AAAAAA=="}, MULTIPART_ETAG, {}),
        # S3's own spelling, with or without the type
        ({"x-amz-checksum-crc32": "AAAAAA==-3"}, MULTIPART_ETAG,
         {"x-amz-checksum-crc32": "AAAAAA==-3", "x-amz-checksum-type": "COMPOSITE"}),
        # the type said, the -N missing: the ETag's part count
        ({"x-amz-checksum-crc32": "AAAAAA==", "x-amz-checksum-type": "COMPOSITE"}, MULTIPART_ETAG,
         {"x-amz-checksum-crc32": "AAAAAA==-3", "x-amz-checksum-type": "COMPOSITE"}),
        ({"x-amz-checksum-crc32": "AAAAAA==", "x-amz-checksum-type": "COMPOSITE"}, SINGLE_ETAG, {}),
        ({"x-amz-checksum-crc64nvme": "AAAAAAAAAAA=", "x-amz-checksum-type": "FULL_OBJECT"},
         MULTIPART_ETAG,
         {"x-amz-checksum-crc64nvme": "AAAAAAAAAAA=", "x-amz-checksum-type": "FULL_OBJECT"}),
        # one body: its checksum is the full object's
        ({"x-amz-checksum-sha256": "x"}, SINGLE_ETAG, {"x-amz-checksum-sha256": "x"}),
        ({"x-amz-checksum-sha256": "x", "x-amz-checksum-type": "FULL_OBJECT"}, SINGLE_ETAG,
         {"x-amz-checksum-sha256": "x", "x-amz-checksum-type": "FULL_OBJECT"}),
        ({"x-amz-checksum-type": "FULL_OBJECT"}, SINGLE_ETAG, {}),
        ({"x-amz-server-side-encryption": "AES256"}, SINGLE_ETAG, {}),
    ],
)  # fmt: skip
def test_served_checksums(stored: dict, etag: str, expected: dict) -> None:
    assert served(stored, etag) == expected
