"""Read-after-write across the workers of one node, with a new connection per request.

S3's promise: a write acknowledged through any worker is seen by every request
that starts after it, whichever worker the kernel hands the next connection to
(SO_REUSEPORT spreads them). Before the node's invalidation journal, a sibling
worker kept answering from its own memory: 4 of 6 reads after a DELETE returned
the deleted object, and reads after an overwrite returned the old bytes or 503.

Each case first reads the old state many times on fresh connections, so every
worker has it cached (metadata in memory, blocks in the tiers), then writes
through Hoard and reads again on fresh connections: every read must be current.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.conftest import moto_origin
from tests.harness import HoardProcess
from tests.origin_proxy import OriginProxy

KiB, MiB = 1024, 1024 * 1024
READS = 16  # per check, each on its own connection: every worker is hit with p > 1 - 2^-15 each


def _config(origins: dict, workers: int) -> dict:
    return {
        "origins": origins,
        "default_origin": next(iter(origins)),
        "allow_anonymous": True,
        "workers": workers,
        "cache": {"block_size": "1MiB", "size": "256MiB", "memory": "64MiB"},
    }


@pytest.fixture(params=[2, 4], ids=["workers2", "workers4"])
def s3_node(request, tmp_path: Path, proxy: OriginProxy) -> Iterator[HoardProcess]:
    origins = {"moto": moto_origin(proxy)}
    node = HoardProcess(tmp_path, _config(origins, request.param)).start()
    yield node
    node.stop()


@pytest.fixture
def posix_node(tmp_path: Path) -> Iterator[HoardProcess]:
    (tmp_path / "root" / "data").mkdir(parents=True)
    origins = {"disk": {"type": "posix", "path": str(tmp_path / "root")}}
    node = HoardProcess(tmp_path, _config(origins, 2)).start()
    yield node
    node.stop()


def _fresh_get(node: HoardProcess, bucket: str, key: str) -> tuple[int, bytes]:
    """One GET on a connection of its own (a session per request: no pooling)."""
    with requests.Session() as session:
        answer = session.get(f"{node.endpoint}/{bucket}/{key}", timeout=30)
        return answer.status_code, answer.content


def _fresh_head(node: HoardProcess, bucket: str, key: str) -> tuple[int, str]:
    with requests.Session() as session:
        answer = session.head(f"{node.endpoint}/{bucket}/{key}", timeout=30)
        return answer.status_code, answer.headers.get("ETag", "")


def _fresh_keys(node: HoardProcess, bucket: str, prefix: str) -> list[str]:
    with requests.Session() as session:
        answer = session.get(
            f"{node.endpoint}/{bucket}", params={"list-type": "2", "prefix": prefix}, timeout=30
        )
        assert answer.status_code == 200, answer.text
        return sorted(part.split("</Key>")[0] for part in answer.text.split("<Key>")[1:])


def _every_read(node: HoardProcess, bucket: str, key: str, expected: bytes | None) -> None:
    """``READS`` fresh GETs and HEADs all see ``expected`` (None: the key is gone)."""
    etag = f'"{hashlib.md5(expected).hexdigest()}"' if expected is not None else ""
    for _ in range(READS):
        status, body = _fresh_get(node, bucket, key)
        if expected is None:
            assert status == 404, f"a deleted key was served ({len(body)} bytes)"
        else:
            assert status == 200, body[:300]
            assert hashlib.md5(body).hexdigest() == hashlib.md5(expected).hexdigest(), "stale"
        head_status, head_etag = _fresh_head(node, bucket, key)
        assert head_status == (404 if expected is None else 200)
        assert head_etag == etag


def _warm(node: HoardProcess, bucket: str, key: str, prefix: str) -> None:
    """Every worker caches the key's metadata and blocks, and the prefix's listing."""
    for _ in range(READS):
        assert _fresh_get(node, bucket, key)[0] == 200
        _fresh_keys(node, bucket, prefix)


def _sizes() -> list[int]:
    return [64 * KiB, 3 * MiB + 5]  # one block; several (later blocks fetched with If-Match)


@pytest.mark.parametrize("size", _sizes(), ids=["64KiB", "3MiB"])
def test_overwrite_and_delete_seen_by_every_worker(s3_node, origin_client, bucket, size):
    client = s3_node.client()
    key = f"raw/{uuid.uuid4().hex}"
    v1, v2 = os.urandom(size), os.urandom(size)
    client.put_object(Bucket=bucket, Key=key, Body=v1)
    _warm(s3_node, bucket, key, "raw/")

    client.put_object(Bucket=bucket, Key=key, Body=v2)
    _every_read(s3_node, bucket, key, v2)

    client.delete_object(Bucket=bucket, Key=key)
    _every_read(s3_node, bucket, key, None)
    assert _fresh_keys(s3_node, bucket, "raw/") == []

    client.put_object(Bucket=bucket, Key=key, Body=v1)  # the negative entries go too
    _every_read(s3_node, bucket, key, v1)
    assert _fresh_keys(s3_node, bucket, "raw/") == [key]


def test_delete_objects_copy_and_multipart_seen_by_every_worker(s3_node, bucket):
    client = s3_node.client()
    keys = [f"many/{i}" for i in range(3)]
    old = {key: os.urandom(32 * KiB) for key in keys}
    for key, data in old.items():
        client.put_object(Bucket=bucket, Key=key, Body=data)
        _warm(s3_node, bucket, key, "many/")

    client.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": keys[0]}]})
    _every_read(s3_node, bucket, keys[0], None)

    client.copy_object(Bucket=bucket, Key=keys[1], CopySource={"Bucket": bucket, "Key": keys[2]})
    _every_read(s3_node, bucket, keys[1], old[keys[2]])

    parts = [os.urandom(5 * MiB), os.urandom(1 * MiB)]
    upload = client.create_multipart_upload(Bucket=bucket, Key=keys[2])["UploadId"]
    sent = [
        client.upload_part(Bucket=bucket, Key=keys[2], UploadId=upload, PartNumber=n, Body=part)
        for n, part in enumerate(parts, start=1)
    ]
    etags = [answer["ETag"] for answer in sent]
    client.complete_multipart_upload(
        Bucket=bucket, Key=keys[2], UploadId=upload,
        MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e} for n, e in enumerate(etags, 1)]},
    )  # fmt: skip
    for _ in range(READS):  # a multipart ETag is no MD5: compare the bytes
        status, body = _fresh_get(s3_node, bucket, keys[2])
        assert status == 200 and body == b"".join(parts), "stale after multipart"
    assert _fresh_keys(s3_node, bucket, "many/") == keys[1:]


def test_posix_origin_writes_seen_by_every_worker(posix_node):
    client = posix_node.client()
    key = "images/a.jpg"
    v1, v2 = os.urandom(100 * KiB), os.urandom(90 * KiB)
    client.put_object(Bucket="data", Key=key, Body=v1)
    _warm(posix_node, "data", key, "images/")

    client.put_object(Bucket="data", Key=key, Body=v2)
    _every_read(posix_node, "data", key, v2)

    client.delete_object(Bucket="data", Key=key)
    _every_read(posix_node, "data", key, None)
    assert _fresh_keys(posix_node, "data", "images/") == []
