"""The region Hoard serves (``region``, us-east-1 by default): a SigV4 scope must name it.

S3 refuses a signature scoped to another region than the endpoint's, header or
presigned URL, with the region to use; Hoard accepted any. Real HTTP against
Hoard in-process over a directory origin.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.inprocess import threaded_app
from tests.rawhttp import presign, send, signed_send


@pytest.fixture
def hoard(tmp_path: Path):
    (tmp_path / "origin" / "data").mkdir(parents=True)
    (tmp_path / "origin" / "data" / "k").write_bytes(b"hello")
    config = {"origins": {"dir": {"type": "posix", "path": str(tmp_path / "origin")}},
              "default_origin": "dir", "region": "eu-west-1"}  # fmt: skip
    with threaded_app(tmp_path, config) as running:
        yield running


def test_only_the_served_region_signs(hoard) -> None:
    assert signed_send(hoard.port, "GET", "/data/k", region="eu-west-1").body == b"hello"
    wrong = signed_send(hoard.port, "GET", "/data/k", region="us-east-1")
    assert wrong.status == 400
    assert b"<Code>AuthorizationHeaderMalformed</Code>" in wrong.body
    assert b"the region 'us-east-1' is wrong; expecting 'eu-west-1'" in wrong.body
    assert b"<Region>eu-west-1</Region>" in wrong.body
    host = f"127.0.0.1:{hoard.port}"
    right = send(hoard.port, "GET", presign("GET", host, "/data/k", region="eu-west-1"),
                 {"Host": host})  # fmt: skip
    assert (right.status, right.body) == (200, b"hello")
    url = send(hoard.port, "GET", presign("GET", host, "/data/k", region="us-west-2"),
               {"Host": host})  # fmt: skip
    assert url.status == 400 and b"<Code>AuthorizationQueryParametersError</Code>" in url.body
    assert b"<Region>eu-west-1</Region>" in url.body


def test_auto_names_no_region_and_any_accepts_every_region(hoard, tmp_path: Path) -> None:
    """Tigris and R2 clients sign with "auto"; ``region: any`` turns the check off."""
    assert signed_send(hoard.port, "GET", "/data/k", region="auto").body == b"hello"
    config = {"origins": {"dir": {"type": "posix", "path": str(tmp_path / "origin")}},
              "default_origin": "dir", "region": "any"}  # fmt: skip
    with threaded_app(tmp_path / "any", config) as anywhere:
        for region in ("eu-west-1", "ap-south-1", "auto"):
            assert signed_send(anywhere.port, "GET", "/data/k", region=region).body == b"hello"


def test_boto3_signs_again_in_the_region_named(hoard) -> None:
    """botocore's region redirector reads the error's Region: a client configured for
    another region still reads, one request later, as it does from S3."""
    client = hoard.client()  # us-east-1
    assert client.get_object(Bucket="data", Key="k")["Body"].read() == b"hello"
