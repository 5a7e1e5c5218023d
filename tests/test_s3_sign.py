"""The origin signer (``gateway/origins/s3_sign.py``) makes botocore's headers, byte for byte.

Each case is a request of a shape Hoard sends an S3 origin (the cold path's
ranged GET, a conditional GET, forwarded writes with a streamed body, query
sub-resources, odd keys and header values, temporary credentials, a client's
``Date``); botocore's ``S3SigV4Auth`` signs the same request at the same
instant, and every header must match. That the signatures are accepted by a
real server is covered end to end by every test that reads through an S3
origin (moto checks nothing, so ``test_s3_origin.py``'s signed requests are
what an origin would see).
"""

from __future__ import annotations

import datetime

import pytest
from botocore import auth as botocore_auth
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import ReadOnlyCredentials

from gateway.origins.s3_sign import EMPTY_SHA256, UNSIGNED_PAYLOAD, Signer

NOW = datetime.datetime(2026, 11, 25, 6, 30, 5, tzinfo=datetime.UTC)
STATIC = ReadOnlyCredentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", None)
TEMPORARY = ReadOnlyCredentials("ASIAEXAMPLE", "secret/with+chars", "FwoGZXIvYXdzE//token==")

CASES = [
    ("GET", "http://127.0.0.1:9000/small/train/0000001.jpg",
     {"Host": "127.0.0.1:9000", "x-amz-checksum-mode": "ENABLED", "Range": "bytes=0-8388607"},
     False),
    ("GET", "http://127.0.0.1:9000/b/k%20with%20spaces/%C3%A9t%C3%A9~x",
     {"Host": "127.0.0.1:9000", "Range": "bytes=8388608-16777215", "If-Match": '"abc"'}, False),
    ("HEAD", "https://bucket.s3.eu-west-1.amazonaws.com/a/b.bin",
     {"Host": "bucket.s3.eu-west-1.amazonaws.com", "x-amz-checksum-mode": "ENABLED"}, False),
    ("PUT", "http://127.0.0.1:9000/b/key?partNumber=2&uploadId=a%2Fb%3D",
     {"Host": "127.0.0.1:9000", "Content-Length": "5", "Content-Type": "text/plain",
      "x-amz-meta-Note": "  two   spaces  ", "User-Agent": "not signed", "Expect": "100-continue"},
     True),
    ("POST", "http://127.0.0.1:9000/b/key?uploads",
     {"Host": "127.0.0.1:9000", "Content-Length": "0"}, False),
    ("GET", "http://127.0.0.1:9000/b?list-type=2&prefix=a%2F&delimiter=%2F&max-keys=1000",
     {"Host": "127.0.0.1:9000"}, False),
    ("PUT", "http://127.0.0.1:9000/b/dated",
     {"Host": "127.0.0.1:9000", "Date": "Mon, 01 Jan 2001 00:00:00 GMT", "Content-Length": "1"},
     True),
]  # fmt: skip


def botocore_headers(
    credentials: ReadOnlyCredentials, method: str, url: str, headers: dict[str, str], body: bool
) -> dict[str, str]:
    request = AWSRequest(method=method, url=url, headers=headers)
    request.context["client_config"] = Config(s3={"payload_signing_enabled": not body})
    S3SigV4Auth(credentials, "s3", "eu-west-1").add_auth(request)
    return dict(request.headers.items())


@pytest.mark.parametrize("credentials", [STATIC, TEMPORARY], ids=["static", "temporary"])
@pytest.mark.parametrize(("method", "url", "headers", "body"), CASES)
def test_signs_as_botocore_does(
    monkeypatch: pytest.MonkeyPatch,
    credentials: ReadOnlyCredentials,
    method: str,
    url: str,
    headers: dict[str, str],
    body: bool,
) -> None:
    monkeypatch.setattr(botocore_auth, "get_current_datetime", lambda: NOW.replace(tzinfo=None))
    expected = botocore_headers(credentials, method, url, dict(headers), body)
    payload = UNSIGNED_PAYLOAD if body else EMPTY_SHA256
    made = Signer("eu-west-1").sign(credentials, method, url, headers, payload, NOW.timestamp())
    assert made == expected


def test_a_new_day_signs_with_a_new_key() -> None:
    signer = Signer("us-east-1")
    headers = {"Host": "h"}
    today = signer.sign(STATIC, "GET", "http://h/b/k", headers, now=NOW.timestamp())
    tomorrow = signer.sign(STATIC, "GET", "http://h/b/k", headers, now=NOW.timestamp() + 86400)
    assert "/20261125/" in today["Authorization"]
    assert "/20261126/" in tomorrow["Authorization"]
    assert today["Authorization"].rsplit("=", 1)[1] != tomorrow["Authorization"].rsplit("=", 1)[1]
