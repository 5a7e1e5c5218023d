"""Real S3 clients of training pipelines through Hoard, byte-exact, over two origins.

Each client here speaks S3 its own way (its own signing, multipart sizes,
range requests, listing parameters and bucket checks): pyarrow's S3FileSystem
(the AWS C++ SDK), obstore (Rust's object_store, which polars uses too), the
Mountpoint client of s3torchconnector (``s3torchconnectorclient``: Rust over the
AWS Common Runtime's S3 client, which splits a GET into parallel ranged parts;
PyTorch's ``S3MapDataset`` / ``S3IterableDataset`` and DLIO read through it),
rclone (Go's AWS SDK; it also creates its bucket before an upload) and the aws CLI. Each
drives the same sequence through Hoard: a small put, a multipart put, whole and
ranged gets (twice: cold, then from the cache), a listing, and deletes — once in
front of moto (``default_origin``), once over a directory as the embedded default
serves ``./data``. Every byte read back is compared with what was written, and
what was written is checked at the origin itself.

A client whose package or binary is not installed is skipped (``scripts/test``
installs them). boto3, s3fs and minio-py are covered by the other modules;
s3torchconnector itself is a thin torch layer over the client tested here (torch
is not installed: ~1 GB for no request of its own).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pytest

from tests.conftest import ORIGIN_KEY, ORIGIN_SECRET
from tests.harness import ACCESS_KEY, SECRET_KEY, HoardProcess

MiB = 1024 * 1024
MULTIPART = 11 * MiB  # over every client's multipart threshold set below; 5 MiB parts


class Client(Protocol):
    def put(self, key: str, data: bytes) -> None: ...
    def put_multipart(self, key: str, data: bytes) -> None: ...
    def get(self, key: str) -> bytes: ...
    def get_range(self, key: str, start: int, length: int) -> bytes: ...
    def list(self, prefix: str) -> list[str]: ...
    def delete(self, key: str) -> None: ...


@dataclass
class Target:
    """Where a client points: Hoard's endpoint and a bucket, and how to see the origin."""

    node: HoardProcess
    bucket: str
    stored: Any  # key -> the bytes at the origin, or None

    @property
    def host_port(self) -> str:
        return f"127.0.0.1:{self.node.port}"


# --- the clients ------------------------------------------------------------------------


class PyArrow:
    def __init__(self, target: Target) -> None:
        from pyarrow import fs

        self.fs = fs.S3FileSystem(
            access_key=ACCESS_KEY, secret_key=SECRET_KEY, region="us-east-1", scheme="http",
            endpoint_override=target.host_port, allow_bucket_creation=False,
        )  # fmt: skip
        self.bucket = target.bucket

    def put(self, key: str, data: bytes) -> None:
        with self.fs.open_output_stream(f"{self.bucket}/{key}") as out:
            out.write(data)

    put_multipart = put  # the C++ SDK switches to multipart uploads past 10 MiB by itself

    def get(self, key: str) -> bytes:
        with self.fs.open_input_stream(f"{self.bucket}/{key}") as stream:
            return stream.read()

    def get_range(self, key: str, start: int, length: int) -> bytes:
        with self.fs.open_input_file(f"{self.bucket}/{key}") as handle:
            return handle.read_at(length, start)

    def list(self, prefix: str) -> list[str]:
        from pyarrow import fs

        selector = fs.FileSelector(f"{self.bucket}/{prefix.rstrip('/')}", recursive=True)
        try:
            infos = self.fs.get_file_info(selector)
        except FileNotFoundError:
            # Nothing under the prefix: pyarrow calls that a missing directory. (On S3 the
            # marker objects it leaves, "ds/deep/", keep it; a directory origin lists none.)
            return []
        return sorted(
            i.path.removeprefix(f"{self.bucket}/") for i in infos if i.type == fs.FileType.File
        )

    def delete(self, key: str) -> None:
        self.fs.delete_file(f"{self.bucket}/{key}")


class Obstore:
    def __init__(self, target: Target) -> None:
        from obstore.store import S3Store

        self.store = S3Store(
            target.bucket, endpoint=target.node.endpoint, access_key_id=ACCESS_KEY,
            secret_access_key=SECRET_KEY, region="us-east-1", virtual_hosted_style_request=False,
            client_options={"allow_http": True},
        )  # fmt: skip

    def put(self, key: str, data: bytes) -> None:
        import obstore

        obstore.put(self.store, key, data, use_multipart=False)

    def put_multipart(self, key: str, data: bytes) -> None:
        import obstore

        obstore.put(self.store, key, data, use_multipart=True, chunk_size=5 * MiB)

    def get(self, key: str) -> bytes:
        import obstore

        return bytes(obstore.get(self.store, key).bytes())

    def get_range(self, key: str, start: int, length: int) -> bytes:
        import obstore

        return bytes(obstore.get_range(self.store, key, start=start, length=length))

    def list(self, prefix: str) -> list[str]:
        import obstore

        return sorted(meta["path"] for batch in obstore.list(self.store, prefix) for meta in batch)

    def delete(self, key: str) -> None:
        import obstore

        obstore.delete(self.store, key)


class Mountpoint:
    """s3torchconnector's S3 client; it takes credentials from the environment only.

    Its uploads are always multipart, and it reads the object's ETag from the
    CompleteMultipartUpload answer, whose root moto names
    ``CompleteMultipartUploadResponse`` (S3: ``...Result``), so the CRT finds
    none: against moto straight, too. In front of moto, objects are written
    with boto3 through Hoard; everything else goes through this client.
    """

    def __init__(self, target: Target, env: pytest.MonkeyPatch) -> None:
        from s3torchconnectorclient._mountpoint_s3_client import MountpointS3Client

        env.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        env.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        env.delenv("AWS_SESSION_TOKEN", raising=False)
        # A small part size, so that a multipart upload and a GET split in parts both happen.
        self.client = MountpointS3Client(
            "us-east-1", endpoint=target.node.endpoint, force_path_style=True,
            part_size=5 * MiB, max_attempts=1,
        )  # fmt: skip
        self.bucket = target.bucket
        in_front_of_moto = target.node.config.get("default_origin") == "moto"
        self.writer = target.node.client() if in_front_of_moto else None

    def put(self, key: str, data: bytes) -> None:
        if self.writer is not None:
            self.writer.put_object(Bucket=self.bucket, Key=key, Body=data)
            return
        stream = self.client.put_object(self.bucket, key)
        stream.write(data)
        stream.close()

    put_multipart = put  # the CRT uploads in part_size parts past one part

    def get(self, key: str) -> bytes:
        return b"".join(self.client.get_object(self.bucket, key))

    def get_range(self, key: str, start: int, length: int) -> bytes:
        return b"".join(self.client.get_object(self.bucket, key, start, start + length))

    def list(self, prefix: str) -> list[str]:
        pages = self.client.list_objects(self.bucket, prefix)
        return sorted(info.key for page in pages for info in page.object_info)

    def delete(self, key: str) -> None:
        self.client.delete_object(self.bucket, key)


class Command:
    """A command-line client: files in a scratch directory, bytes through stdout."""

    def __init__(self, target: Target, scratch: Path) -> None:
        self.target, self.scratch = target, scratch
        self.env = {**os.environ, "HOME": str(scratch), "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                    "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_DEFAULT_REGION": "us-east-1"}  # fmt: skip

    def run(self, *args: str, ok: tuple[int, ...] = (0,)) -> bytes:
        done = subprocess.run(args, capture_output=True, timeout=120, env=self.env)
        assert done.returncode in ok, done.stderr.decode(errors="replace")
        return done.stdout

    def local(self, data: bytes) -> str:
        path = self.scratch / uuid.uuid4().hex
        path.write_bytes(data)
        return str(path)


class Rclone(Command):
    def __init__(self, target: Target, scratch: Path) -> None:
        super().__init__(target, scratch)
        self.env.pop("AWS_CA_BUNDLE", None)  # rclone's HTTP client refuses one for plain HTTP
        self.env.update({
            "RCLONE_CONFIG_HOARD_TYPE": "s3", "RCLONE_CONFIG_HOARD_PROVIDER": "Other",
            "RCLONE_CONFIG_HOARD_ENDPOINT": target.node.endpoint,
            "RCLONE_CONFIG_HOARD_ACCESS_KEY_ID": ACCESS_KEY,
            "RCLONE_CONFIG_HOARD_SECRET_ACCESS_KEY": SECRET_KEY,
            "RCLONE_CONFIG_HOARD_REGION": "us-east-1", "RCLONE_CONFIG_HOARD_FORCE_PATH_STYLE": "true",
            "RCLONE_CONFIG": str(scratch / "none.conf"),
        })  # fmt: skip
        self.remote = f"hoard:{target.bucket}"

    def put(self, key: str, data: bytes) -> None:
        # rclone creates the bucket first (CreateBucket; an existing one is no error).
        self.run("rclone", "copyto", self.local(data), f"{self.remote}/{key}")

    def put_multipart(self, key: str, data: bytes) -> None:
        self.run("rclone", "copyto", "--s3-upload-cutoff", "5M", "--s3-chunk-size", "5M",
                 self.local(data), f"{self.remote}/{key}")  # fmt: skip

    def get(self, key: str) -> bytes:
        return self.run("rclone", "cat", f"{self.remote}/{key}")

    def get_range(self, key: str, start: int, length: int) -> bytes:
        return self.run("rclone", "cat", "--offset", str(start), "--count", str(length),
                        f"{self.remote}/{key}")  # fmt: skip

    def list(self, prefix: str) -> list[str]:
        out = self.run("rclone", "lsf", "-R", "--files-only", f"{self.remote}/{prefix}")
        return sorted(prefix + line for line in out.decode().splitlines())

    def delete(self, key: str) -> None:
        self.run("rclone", "deletefile", f"{self.remote}/{key}")


class AwsCli(Command):
    def aws(self, *args: str) -> bytes:
        return self.run("aws", "--endpoint-url", self.target.node.endpoint, *args)

    def put(self, key: str, data: bytes) -> None:
        self.aws("s3", "cp", self.local(data), f"s3://{self.target.bucket}/{key}")

    put_multipart = put  # the CLI uploads in 8 MiB parts past 8 MiB

    def get(self, key: str) -> bytes:
        return self.aws("s3", "cp", f"s3://{self.target.bucket}/{key}", "-")

    def get_range(self, key: str, start: int, length: int) -> bytes:
        out = self.scratch / uuid.uuid4().hex
        self.aws("s3api", "get-object", "--bucket", self.target.bucket, "--key", key,
                 "--range", f"bytes={start}-{start + length - 1}", str(out))  # fmt: skip
        return out.read_bytes()

    def list(self, prefix: str) -> list[str]:
        out = self.run("aws", "--endpoint-url", self.target.node.endpoint, "s3", "ls",
                       "--recursive", f"s3://{self.target.bucket}/{prefix}", ok=(0, 1))  # 1: none  # fmt: skip
        return sorted(line.split(maxsplit=3)[3] for line in out.decode().splitlines())

    def delete(self, key: str) -> None:
        self.aws("s3", "rm", f"s3://{self.target.bucket}/{key}")


def _module(name: str) -> bool:
    try:
        __import__(name)
    except ImportError:
        return False
    return True


CLIENTS = {
    # name: (the client, given its target, a scratch directory and the test's environment)
    "pyarrow": (lambda t, s, e: PyArrow(t), lambda: _module("pyarrow")),
    "obstore": (lambda t, s, e: Obstore(t), lambda: _module("obstore")),
    "s3torchconnector": (
        lambda t, s, e: Mountpoint(t, e),
        lambda: _module("s3torchconnectorclient"),
    ),
    "rclone": (lambda t, s, e: Rclone(t, s), lambda: shutil.which("rclone") is not None),
    "aws-cli": (lambda t, s, e: AwsCli(t, s), lambda: shutil.which("aws") is not None),
}


# --- the targets ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def moto_hoard(tmp_path_factory, moto_endpoint) -> Iterator[HoardProcess]:
    config = {
        "origins": {"moto": {"type": "s3", "endpoint": moto_endpoint, "access_key": ORIGIN_KEY,
                             "secret_key": ORIGIN_SECRET, "addressing_style": "path"}},
        "default_origin": "moto",
    }  # fmt: skip
    node = HoardProcess(tmp_path_factory.mktemp("clients-moto"), config).start()
    yield node
    assert node.stop() == 0


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("clients-data")


@pytest.fixture(scope="module")
def posix_hoard(tmp_path_factory, data_dir) -> Iterator[HoardProcess]:
    # The embedded default's shape: a directory served as buckets, asked on every request.
    config = {"origins": {"local": {"type": "posix", "path": str(data_dir)}},
              "default_origin": "local", "default_metadata_ttl": 0, "default_negative_ttl": 0}  # fmt: skip
    node = HoardProcess(tmp_path_factory.mktemp("clients-posix"), config).start()
    yield node
    assert node.stop() == 0


@pytest.fixture(params=["moto", "posix"])
def target(request, origin_client, data_dir) -> Target:
    bucket = f"c-{uuid.uuid4().hex[:12]}"
    if request.param == "moto":
        origin_client.create_bucket(Bucket=bucket)

        def stored(key: str) -> bytes | None:
            try:
                return origin_client.get_object(Bucket=bucket, Key=key)["Body"].read()
            except origin_client.exceptions.NoSuchKey:
                return None

        return Target(request.getfixturevalue("moto_hoard"), bucket, stored)
    (data_dir / bucket).mkdir()

    def on_disk(key: str) -> bytes | None:
        path = data_dir / bucket / key
        return path.read_bytes() if path.is_file() else None

    return Target(request.getfixturevalue("posix_hoard"), bucket, on_disk)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", sorted(CLIENTS))
def test_client_round_trip_is_byte_exact(name: str, target: Target, tmp_path, monkeypatch) -> None:
    make, installed = CLIENTS[name]
    if not installed():
        pytest.skip(f"{name} is not installed")
    if name == "pyarrow" and target.node.config.get("default_origin") == "moto":
        # Straight against moto too, pyarrow reads moto's CompleteMultipartUpload answer as
        # "error embedded in a 200 OK" (INTERNAL_FAILURE): a moto answer, not Hoard's.
        pytest.skip("pyarrow does not accept moto's CompleteMultipartUpload answer")
    client: Client = make(target, tmp_path, monkeypatch)
    small, large = os.urandom(100_000), os.urandom(MULTIPART)
    client.put("ds/small.bin", small)
    client.put_multipart("ds/deep/large.bin", large)
    assert target.stored("ds/small.bin") == small
    assert target.stored("ds/deep/large.bin") == large
    for _ in range(2):  # cold, then from the cache
        assert client.get("ds/small.bin") == small
        assert client.get("ds/deep/large.bin") == large
        assert client.get_range("ds/small.bin", 1000, 5000) == small[1000:6000]
        start = 5 * MiB - 17  # across a part boundary
        assert client.get_range("ds/deep/large.bin", start, 100) == large[start : start + 100]
    assert client.list("ds/") == ["ds/deep/large.bin", "ds/small.bin"]
    client.delete("ds/small.bin")
    assert target.stored("ds/small.bin") is None
    assert client.list("ds/") == ["ds/deep/large.bin"]
    client.delete("ds/deep/large.bin")
    assert client.list("ds/") == []
