"""Shared fixtures: real servers on loopback ports, never mocked HTTP."""

from __future__ import annotations

import compileall
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

import boto3
import pytest
from moto.core import DEFAULT_ACCOUNT_ID
from moto.s3.models import s3_backends
from moto.s3.utils import compute_checksum
from moto.server import ThreadedMotoServer

from tests.harness import REPO, free_port
from tests.origin_proxy import OriginProxy

ORIGIN_KEY = "origin-access"
ORIGIN_SECRET = "origin-secret"


def pytest_sessionstart(session: pytest.Session) -> None:
    """Compile the gateway (and loadtest) to bytecode once, before any process starts.

    With PYTHONDONTWRITEBYTECODE set (this machine sets it), no process writes
    ``__pycache__``, so every ``hoard serve`` the suite starts (each subprocess
    test starts one or more) compiled all of gateway/ from source again, about
    0.15 s of CPU per start.
    Processes still read bytecode that exists, and compileall writes it
    whatever that variable says (``__pycache__`` is git-ignored); unchanged
    files are not compiled twice.
    """
    if sys.dont_write_bytecode:
        for package in ("gateway", "loadtest"):
            compileall.compile_dir(REPO / package, quiet=1)


def moto_origin(proxy: OriginProxy, **settings: object) -> dict:
    """The config of an origin that is moto behind the counting ``proxy``.

    Hedging is off: a hedge is a deliberate second origin request for a GET that
    stays silent for ``retry.hedge_after``, and on a loaded CI machine moto can be
    that slow, so a test counting origin requests would count it (the tests of
    hedging, in test_faults.py, turn it on).
    """
    return {"type": "s3", "endpoint": proxy.endpoint, "access_key": ORIGIN_KEY,
            "secret_key": ORIGIN_SECRET, "addressing_style": "path",
            "retry": {"hedge_after": "forever"}, **settings}  # fmt: skip


def seed(bucket: str, objects: Mapping[str, bytes]) -> None:
    """Put ``objects`` (key -> body) in ``bucket`` of the moto origin, as a data set a test reads.

    moto's threaded server runs in this process, so a PUT over HTTP costs this
    process about 5 ms of CPU (botocore signing it, moto parsing it) under one
    GIL, and a data set of a thousand keys took seconds whatever the threads.
    The objects go straight into the store that server answers from, as the
    ``FakeKey``s boto3's PUT makes (ETag, size, LastModified, and the CRC32
    checksum boto3 sends by default), so every request a test makes still goes
    over HTTP to the real moto. A bucket moto does not know fails here
    (MissingBucket), never later in the test.
    """
    store = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
    for key, body in objects.items():
        checksum = compute_checksum(body, "CRC32").decode()
        store.put_object(bucket, key, body, checksum_value=checksum).checksum_algorithm = "CRC32"


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """moto's threaded S3 server on a loopback port: the origin of most tests."""
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture(scope="session")
def origin_client(moto_endpoint: str):
    """A boto3 client talking to moto directly (to seed data and compare answers)."""
    return boto3.client(
        "s3",
        endpoint_url=moto_endpoint,
        region_name="us-east-1",
        aws_access_key_id=ORIGIN_KEY,
        aws_secret_access_key=ORIGIN_SECRET,
    )


def _running_proxy(moto_endpoint: str) -> Iterator[OriginProxy]:
    """A counting (and fault-injecting) proxy in front of moto: what reaches the origin."""
    running = OriginProxy(moto_endpoint).start()
    yield running
    running.stop()


proxy = pytest.fixture(_running_proxy, name="proxy")
# One proxy for a module whose Hoard processes outlive a test (module-scoped nodes
# name its endpoint); a module uses it as its ``proxy`` with ``proxy = module_proxy``.
module_proxy = pytest.fixture(_running_proxy, scope="module")


@pytest.fixture
def bucket(origin_client) -> str:
    """A fresh bucket at the moto origin."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    origin_client.create_bucket(Bucket=name)
    return name


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs a test can fill up (needs root and mount rights; skipped otherwise)."""
    yield from _tmpfs(tmp_path / "tiny", "1m")


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """An 8 MiB tmpfs: room for a tier of a few dozen blocks and a filler beside it."""
    yield from _tmpfs(tmp_path / "small", "8m")


def _tmpfs(mountpoint: Path, size: str) -> Iterator[Path]:
    mountpoint.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                             str(mountpoint)], capture_output=True, text=True, check=False)  # fmt: skip
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to fill up: {result.stderr.strip()}")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], check=False)
