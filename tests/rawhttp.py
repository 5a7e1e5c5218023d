"""Byte-exact HTTP requests for tests that need control over the request line.

``requests``/urllib3 normalise paths (``..`` segments) and pick the Host
header themselves; traversal and virtual-host tests need neither.
"""

from __future__ import annotations

import http.client
from dataclasses import dataclass

from botocore.auth import S3SigV4Auth, S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from tests.harness import ACCESS_KEY, SECRET_KEY


@dataclass
class RawResponse:
    status: int
    headers: http.client.HTTPMessage
    body: bytes


def sign_headers(
    method: str,
    host: str,
    target: str,
    headers: dict[str, str] | None = None,
    access_key: str = ACCESS_KEY,
    secret_key: str = SECRET_KEY,
    body: bytes | None = None,
    region: str = "us-east-1",
) -> dict[str, str]:
    """SigV4 header signing of ``target`` (path + query exactly as it will be sent).

    Without a ``body`` the payload is UNSIGNED-PAYLOAD; with one, its SHA-256 is signed.
    """
    request = AWSRequest(
        method=method, url=f"http://{host}{target}", headers=dict(headers or {}), data=body
    )
    if body is None:
        request.headers["x-amz-content-sha256"] = "UNSIGNED-PAYLOAD"
    S3SigV4Auth(Credentials(access_key, secret_key), "s3", region).add_auth(request)
    return dict(request.headers.items())


def presign(
    method: str,
    host: str,
    target: str,
    expires: int = 300,
    access_key: str = ACCESS_KEY,
    secret_key: str = SECRET_KEY,
    region: str = "us-east-1",
) -> str:
    """A presigned target (path + query) for ``target``."""
    request = AWSRequest(method=method, url=f"http://{host}{target}")
    S3SigV4QueryAuth(Credentials(access_key, secret_key), "s3", region, expires=expires).add_auth(
        request
    )
    url = request.url
    return url[url.index(host) + len(host) :]


def send(
    port: int,
    method: str,
    target: str,
    headers: dict[str, str] | None = None,
    body: bytes | None = None,
) -> RawResponse:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
        for name, value in (headers or {}).items():
            conn.putheader(name, value)
        conn.endheaders(body)
        response = conn.getresponse()
        return RawResponse(response.status, response.headers, response.read())
    finally:
        conn.close()


def signed_send(
    port: int,
    method: str,
    target: str,
    host: str | None = None,
    headers: dict[str, str] | None = None,
    body: bytes | None = None,
    **keys: str,
) -> RawResponse:
    host = host or f"127.0.0.1:{port}"
    signed = sign_headers(method, host, target, headers, body=body, **keys)
    signed["Host"] = host
    if body is not None:  # putheader leaves the length to us
        signed["Content-Length"] = str(len(body))
    return send(port, method, target, signed, body)
