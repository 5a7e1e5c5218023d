"""Any S3 request, passed to an S3 origin as it is and re-signed with the origin's keys.

Hoard answers reads itself; everything else a client may do against the origin
(uploads, multipart, copy, delete, tagging, ACLs, versioning, bucket settings...)
goes through this pipe and must behave exactly as against the origin. So the
forwarder is deliberately dumb: it places the request on the origin's URL, signs
it, streams it both ways and hands back whatever the origin said. It never reads
an S3 error; a 403, 404 or 409 is a response for the client to see as it is.

How one request travels:

- **URL.** ``origin_url`` puts bucket and key where botocore would: path style
  for custom endpoints (unless ``addressing_style: virtual``), virtual-hosted for
  AWS when the bucket is a DNS name. The key is percent-encoded once, as S3
  expects (``quote(key, safe="/~")``), and query parameters with the SigV4 rule,
  so the path and query on the wire are also the canonical ones that get signed.
- **Signature.** ``s3_sign.Signer`` signs the headers as botocore's ``S3SigV4Auth``
  would (at a fraction of its cost: a cold small object is one signed GET)
  with the origin's credentials (config keys, else the standard AWS chain;
  refreshable ones are frozen anew for every request). A body is signed as
  ``UNSIGNED-PAYLOAD``, so nothing has to be read ahead to hash it; a bodiless
  request signs the hash of the empty payload. Every header sent is signed, bar
  the few botocore never signs. The client's signature never reaches the origin.
- **Sending.** An own aiohttp session: pool of ``max_connections``, no redirects
  followed, no decompression, no cookies, no default headers (aiohttp would add
  Content-Type, which S3 would store). The body goes out as an async iterator
  with the caller's Content-Length, so the origin sees a plain, unchunked body.
  The answer's body is read in pieces of at most ``CHUNK_SIZE``.
- **Failures.** Only "no usable answer" is an error: ``OriginUnavailable``. An
  exception raised by the caller's body iterator (a client that went away, a
  checksum that did not match) is re-raised as it is; the origin connection is
  dropped before Content-Length was reached, so the origin stores nothing.
- **Retries.** Only a safe request (GET, HEAD, OPTIONS: RFC 9110 §9.2.1) that got
  no answer at all (a refused or reset connection, a timeout) is tried again,
  with full-jitter backoff, ``max_attempts`` tries in all. Every answer, a 500 or
  a 503 SlowDown included, goes back as it is: the client's SDK retries those
  under its own policy (botocore's standard mode: 5xx and throttles, with its
  own backoff and budget), and a gateway that retried them too would multiply
  its tries and delay its error by seconds. Anything else is sent once.

Not guaranteed:
- Streamed bodies are never retried: they cannot be replayed. A 5xx or a reset
  during an upload goes back to the client, whose SDK retries it.
- ``UNSIGNED-PAYLOAD`` must be acceptable to the origin over the configured
  scheme. AWS accepts it over HTTP and HTTPS; some S3-compatible stores may not.
- A body without ``content_length`` goes out with Transfer-Encoding: chunked,
  which S3 refuses (411 MissingContentLength): the caller must know the length.
- No bucket-region discovery: everything is signed for the configured region,
  and a 301/307 for a bucket elsewhere is handed back, not followed. No FIPS,
  dual-stack, accelerate, access-point or S3 Express endpoints; an IP endpoint
  is always path style. Proxy settings from the environment are not used.
- ``Expect: 100-continue`` is not passed on (the front answers it itself), nor
  hop-by-hop headers in either direction (RFC 9110 section 7.6.1).
- POST object (browser form upload) carries a policy signature made with the
  client's key inside the form; only the header signature is made anew here.
"""

from __future__ import annotations

import asyncio
import ipaddress
import math
import random
import re
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import quote, urlsplit

import aiohttp
from aiobotocore.credentials import AioCredentials
from aiobotocore.session import get_session
from botocore.credentials import ReadOnlyCredentials
from botocore.exceptions import BotoCoreError
from yarl import URL

from gateway.config.settings import S3OriginConfig
from gateway.core import errors
from gateway.origins.s3_sign import EMPTY_SHA256, UNSIGNED_PAYLOAD, Signer

CHUNK_SIZE = 1024 * 1024  # largest piece a response body yields

# RFC 9110 section 7.6.1, plus the non-standard Proxy-Connection.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
# Made here, never taken from the client: a client's signature or date would not
# match ours, the length is the decoded one, and the front answers Expect itself.
_MADE_HERE = frozenset(
    {
        "authorization",
        "x-amz-date",
        "x-amz-content-sha256",
        "x-amz-security-token",
        "host",
        "content-length",
        "expect",
    }
)
# aiohttp adds these unless told not to; the origin should see only the client's.
_NO_AUTO_HEADERS = ("Accept", "Accept-Encoding", "Content-Type", "User-Agent")
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})  # tried again when no answer came
_BACKOFF_BASE = 0.1  # seconds; the n-th retry waits up to base * 2**n
_BACKOFF_CAP = 20.0
_QUERY_SAFE = "-_.~"  # SigV4's unreserved set: what the canonical query leaves as it is
_KEY_SAFE = "/~"
_DNS_LABEL = re.compile(r"^[a-z0-9](?:[a-z0-9-]*[a-z0-9])?$")


@dataclass
class ForwardRequest:
    """One client request, translated to origin names, stripped of the client's auth."""

    method: str
    bucket: str  # origin bucket; "" for service-level requests (ListBuckets)
    key: str | None  # origin key; None for bucket-level requests
    query: list[tuple[str, str]]  # decoded, in order; a bare sub-resource has value ""
    headers: Mapping[str, str]  # the client's headers to pass on
    body: AsyncIterator[bytes] | None = None  # decoded payload, streamed
    content_length: int | None = None  # decoded length, when known


@dataclass
class ForwardResponse:
    """The origin's answer. ``body`` must be read to the end or ``aclose()``d."""

    status: int
    headers: list[tuple[str, str]]  # the origin's, minus hop-by-hop ones
    body: AsyncIterator[bytes]

    async def aclose(self) -> None:
        closer = getattr(self.body, "aclose", None)
        if closer is not None:
            await closer()

    async def __aenter__(self) -> ForwardResponse:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class CredentialSource(Protocol):
    """aiobotocore credentials: static or refreshable (a refresh happens in this call)."""

    async def get_frozen_credentials(self) -> ReadOnlyCredentials: ...


class S3Forwarder:
    """Forwards raw S3 requests to one S3 origin. Its session is built on first use."""

    def __init__(self, config: S3OriginConfig, credentials: CredentialSource | None = None) -> None:
        self._config = config
        self._credentials = credentials
        self._lock = asyncio.Lock()
        self._session: aiohttp.ClientSession | None = None
        self._signer = Signer(config.region)

    async def forward(self, request: ForwardRequest) -> ForwardResponse:
        """Send ``request`` to the origin; any HTTP answer is returned, not raised.

        Raises ``OriginUnavailable`` when no answer came, or whatever the request's
        body iterator raised.
        """
        url, host = origin_url(self._config, request.bucket, request.key, request.query)
        headers = _outgoing_headers(request.headers)
        headers["Host"] = host
        if request.content_length is not None:
            headers["Content-Length"] = str(request.content_length)
        # A streamed body is consumed by the first try: it cannot be sent twice.
        safe = request.body is None and request.method in _SAFE_METHODS
        attempts = self._config.max_attempts if safe else 1
        for attempt in range(1, attempts):
            response = await self._try(request.method, url, headers)
            if response is not None:
                return _forward_response(response)
            await asyncio.sleep(random.uniform(0, min(_BACKOFF_CAP, _BACKOFF_BASE * 2**attempt)))
        # The last (or only) try: whatever comes back is the answer.
        signed = await self._signed(request.method, url, headers, request.body is not None)
        return _forward_response(await self._send(request.method, url, signed, request.body))

    async def send_once(
        self, method: str, bucket: str, key: str, headers: dict[str, str]
    ) -> aiohttp.ClientResponse:
        """One try of a bodiless request made here (``s3_get.py``), its answer unread.

        Raises ``OriginUnavailable`` when no answer came; retries are the caller's.
        """
        url, host = origin_url(self._config, bucket, key)
        signed = await self._signed(method, url, {**headers, "Host": host}, has_body=False)
        return await self._send(method, url, signed, None)

    async def _try(
        self, method: str, url: str, headers: dict[str, str]
    ) -> aiohttp.ClientResponse | None:
        """One try of a bodiless request that may be retried: None when nothing came back."""
        signed = await self._signed(method, url, headers, has_body=False)  # fresh date each try
        try:
            return await self._send(method, url, signed, None)
        except errors.OriginUnavailable:
            return None

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def _signed(
        self, method: str, url: str, headers: dict[str, str], has_body: bool
    ) -> dict[str, str]:
        payload = UNSIGNED_PAYLOAD if has_body else EMPTY_SHA256
        return self._signer.sign(await self._frozen_credentials(), method, url, headers, payload)

    async def _frozen_credentials(self) -> ReadOnlyCredentials:
        try:
            if self._credentials is None:
                async with self._lock:
                    # Re-check: another request may have resolved them while we waited.
                    if self._credentials is None:
                        self._credentials = await _resolve_credentials(self._config)
            if self._credentials is None:
                raise errors.OriginUnavailable("no credentials found for the origin")
            return await self._credentials.get_frozen_credentials()
        except BotoCoreError as err:  # a broken profile, a failed role refresh
            raise errors.OriginUnavailable(f"origin credentials unavailable: {err}") from err

    async def _send(
        self, method: str, url: str, headers: dict[str, str], body: AsyncIterator[bytes] | None
    ) -> aiohttp.ClientResponse:
        watched = None if body is None else _WatchedBody(body)
        try:
            return await self._client().request(
                method,
                URL(url, encoded=True),  # encoded once already, exactly as signed
                headers=headers,
                data=watched,
                allow_redirects=False,
            )
        except (aiohttp.ClientError, TimeoutError, OSError) as err:
            # aiohttp reports a failing body as a connection error; give back the cause.
            if watched is not None and watched.failure is not None:
                raise watched.failure from None
            raise errors.OriginUnavailable(f"origin request failed: {err!r}") from err

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            cfg = self._config
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=cfg.max_connections),
                # sock_read runs from the end of the upload, so a long body is not cut.
                timeout=aiohttp.ClientTimeout(
                    total=None,
                    sock_connect=_seconds(cfg.connect_timeout),
                    sock_read=_seconds(cfg.read_timeout),
                ),
                auto_decompress=False,  # the client gets the origin's bytes
                cookie_jar=aiohttp.DummyCookieJar(),
                skip_auto_headers=_NO_AUTO_HEADERS,
            )
        return self._session


def origin_url(
    config: S3OriginConfig, bucket: str, key: str | None, query: Iterable[tuple[str, str]] = ()
) -> tuple[str, str]:
    """The encoded URL of a request to the origin, and its Host header."""
    endpoint = urlsplit(config.endpoint or _aws_endpoint(config.region))
    host = endpoint.netloc
    path = "" if key is None else "/" + quote(key, safe=_KEY_SAFE)
    if bucket and _virtual_hosted(config, bucket, endpoint.scheme, endpoint.hostname or ""):
        host = f"{bucket}.{host}"
        path = path or "/"
    elif bucket:
        path = f"/{quote(bucket, safe='')}{path}"
    path = (endpoint.path.rstrip("/") + path) or "/"
    # A bare sub-resource goes out as "?uploads", as botocore sends it; S3 reads
    # "uploads" and "uploads=" alike, and SigV4 signs both as "uploads=".
    encoded = "&".join(
        quote(name, safe=_QUERY_SAFE) + (f"={quote(value, safe=_QUERY_SAFE)}" if value else "")
        for name, value in query
    )
    return f"{endpoint.scheme}://{host}{path}" + (f"?{encoded}" if encoded else ""), host


def _aws_endpoint(region: str) -> str:
    if region == "us-east-1":
        return "https://s3.amazonaws.com"  # what botocore uses for us-east-1
    suffix = "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"
    return f"https://s3.{region}.{suffix}"


def _virtual_hosted(config: S3OriginConfig, bucket: str, scheme: str, hostname: str) -> bool:
    """Whether botocore would put ``bucket`` in the host name."""
    style = config.addressing_style
    if style == "path" or _is_ip(hostname):
        return False
    if style == "auto" and config.endpoint:
        return False  # botocore keeps custom endpoints path style unless told otherwise
    # A dotted bucket name would not match the TLS certificate's single-label wildcard.
    labels = bucket.split(".") if scheme == "http" else [bucket]
    return 3 <= len(bucket) <= 63 and not _is_ip(bucket) and all(map(_DNS_LABEL.match, labels))


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _outgoing_headers(headers: Mapping[str, str]) -> dict[str, str]:
    listed = [value for name, value in headers.items() if name.lower() == "connection"]
    dropped = _HOP_BY_HOP | _MADE_HERE | _connection_tokens(listed)
    return {name: value for name, value in headers.items() if name.lower() not in dropped}


def _connection_tokens(values: Iterable[str]) -> frozenset[str]:
    """Header names listed in Connection are hop-by-hop too (RFC 9110 section 7.6.1)."""
    tokens = ",".join(values).split(",")
    return frozenset(token.strip().lower() for token in tokens if token.strip())


def _forward_response(response: aiohttp.ClientResponse) -> ForwardResponse:
    dropped = _HOP_BY_HOP | _connection_tokens(response.headers.getall("Connection", []))
    headers = [
        (name, value) for name, value in response.headers.items() if name.lower() not in dropped
    ]
    return ForwardResponse(response.status, headers, _OriginBody(response))


async def _resolve_credentials(config: S3OriginConfig) -> CredentialSource | None:
    """The same credentials ``S3Origin`` uses: the configured keys, else the AWS chain."""
    if config.access_key is not None:
        secret = config.secret_key.get_secret_value() if config.secret_key else ""
        return AioCredentials(config.access_key, secret)
    return await get_session().get_credentials()


def _seconds(value: float) -> float | None:
    """``forever`` in the config is ``inf``; aiohttp spells "no timeout" as None."""
    return None if math.isinf(value) else value


class _WatchedBody:
    """The caller's body, remembering what it raised (aiohttp wraps it in ClientError).

    A plain iterator, not an async generator: an abandoned async generator is
    finalised later by a task of its own.
    """

    def __init__(self, body: AsyncIterator[bytes]) -> None:
        self._body = body
        self.failure: Exception | None = None

    def __aiter__(self) -> _WatchedBody:
        return self

    async def __anext__(self) -> bytes:
        try:
            return await anext(self._body)
        except StopAsyncIteration:
            raise
        except Exception as exc:
            self.failure = exc
            raise


class _OriginBody:
    """An origin's response body, in pieces; its connection is pooled again at the end."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response

    def __aiter__(self) -> _OriginBody:
        return self

    async def __anext__(self) -> bytes:
        try:
            # read(n) returns what is buffered, at most n bytes; b"" at the end.
            chunk = await self._response.content.read(CHUNK_SIZE)
        except (aiohttp.ClientError, TimeoutError, OSError) as err:
            self._response.close()
            raise errors.OriginUnavailable(f"origin response failed: {err!r}") from err
        if not chunk:
            self._response.release()
            raise StopAsyncIteration
        return chunk

    async def aclose(self) -> None:
        # At the end the connection goes back to the pool; before it, with unread
        # bytes on it, it cannot carry another request and is closed.
        if self._response.content.at_eof():
            self._response.release()
        else:
            self._response.close()
