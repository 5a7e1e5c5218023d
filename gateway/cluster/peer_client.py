"""The peer client: asks other nodes for blocks, metadata and invalidations.

One pooled aiohttp session per client (built on first use, on the running
loop; one client per worker process) carries every signed request of the
peer wire (``peers.py``). Timeouts
are short on purpose: ``connect`` includes the wait for a pooled connection,
so an overloaded pool falls back along the placement ranking instead of
queueing, and ``sock_read`` bounds a stalled stream.

Every request is signed for the node it goes to, with a nonce of its own (a
counter this client never repeats, under a sender id drawn at start), so it
cannot be replayed there or anywhere else. Every answer must carry the
answering node's signature over this request's signature, its status, error
code, length and (for answers held whole) its body (``peers.py``); an answer
without it is ``PeerUnavailable`` and nothing of it is used.

The client trusts the ``X-Hoard-Error`` code, not the status: a 404 from a
node without these endpoints is ``PeerUnavailable``, not "no such key". A
block streams as it arrives and is checked for length; a short body raises
``PeerUnavailable`` with the bytes received, so the caller resumes elsewhere
at that byte.

Not guaranteed: secrecy, and the integrity of a block's bytes (its answer's
status and length are signed, its streamed bytes are not), unless peers have
https URLs;
cleanup of an abandoned ``read_block`` that is not closed
(``contextlib.aclosing``): its connection then stays open until the garbage
collector finalizes the generator.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import secrets
import ssl as ssl_
import time
from collections.abc import AsyncIterator
from dataclasses import asdict
from typing import Any, NoReturn
from urllib.parse import urlsplit

import aiohttp
from yarl import URL

from gateway.cluster.peers import (
    ANSWER_HEADER,
    ERROR_HEADER,
    PREFIX,
    READ_BUFFER,
    SIGNATURE_HEADER,
    STREAMED,
    BlockRequest,
    PeerChanged,
    PeerNotCached,
    PeerNotFound,
    PeerUnavailable,
    audience_of,
    metadata_target,
    nonce_text,
    request_headers,
    same_digest,
    sign_answer,
)
from gateway.core.invalidation import Invalidation
from gateway.metadata.query import MetadataQuery

log = logging.getLogger(__name__)


class PeerClient:
    """Asks other nodes for blocks and invalidations, over one pooled session."""

    def __init__(
        self,
        secret: str,
        *,
        connect_timeout: float = 2.0,
        read_timeout: float = 10.0,
        max_connections: int = 64,
        ssl: ssl_.SSLContext | None = None,
    ) -> None:
        """``ssl``: how https:// peers are verified (default: the system's trust store)."""
        if not secret:
            raise ValueError("peer requests need cluster.secret")
        self._secret = secret
        self._sender = secrets.token_bytes(8)  # with the counter: nonces never repeated
        self._counter = itertools.count(1)
        # "connect" includes the wait for a pooled connection: an overloaded pool
        # falls back along the ranking instead of queueing; sock_read bounds a stall.
        self._timeout = aiohttp.ClientTimeout(connect=connect_timeout, sock_read=read_timeout)
        self._max_connections = max_connections
        self._ssl: ssl_.SSLContext | bool = ssl if ssl is not None else True
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:  # built on first use: a session needs the running loop
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._max_connections, ssl=self._ssl),
                timeout=self._timeout,
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=False,
                read_bufsize=READ_BUFFER,
            )
        return self._session

    def _signed(self, method: str, peer_url: str, target: str) -> tuple[URL, dict[str, str]]:
        """The URL and headers of one request; ``headers[SIGNATURE_HEADER]`` is what
        the answer must be signed over."""
        base, date = audience_of(peer_url), str(int(time.time()))
        nonce = nonce_text(self._sender, next(self._counter))
        headers = request_headers(self._secret, method, base, urlsplit(base).path + target,
                                  date, nonce)  # fmt: skip
        # encoded=True: yarl must send the target byte for byte as it was signed.
        return URL(base + target, encoded=True), headers

    def _check_answer(
        self, response: aiohttp.ClientResponse, signature: str, length: int, digest: str
    ) -> None:
        """PeerUnavailable unless the answering node signed this answer to this request."""
        code = response.headers.get(ERROR_HEADER, "")
        expected = sign_answer(self._secret, signature, response.status, code, length, digest)
        if not same_digest(expected, response.headers.get(ANSWER_HEADER, "")):
            raise PeerUnavailable(
                f"peer answered {response.status} {code} without a valid answer signature"
            )

    async def _whole(self, response: aiohttp.ClientResponse, signature: str) -> bytes:
        """An answer's whole body, once its signature (over the body) holds."""
        body = await response.read()
        self._check_answer(response, signature, len(body), hashlib.sha256(body).hexdigest())
        return body

    async def read_block(self, peer_url: str, request: BlockRequest) -> AsyncIterator[bytes]:
        """The requested bytes from ``peer_url``, each chunk yielded as it arrives.

        Raises ``PeerNotFound`` (404) or ``PeerChanged`` (412) before any byte, and
        ``PeerUnavailable`` (connection error, timeout, any other answer, a short
        body) before or after some. Nothing is sent before the first iteration.
        """
        url, headers = self._signed("GET", peer_url, request.target())
        received = 0
        try:
            async with self._client().get(url, headers=headers) as response:
                if response.status != 200:
                    _raise_for(response, await self._whole(response, headers[SIGNATURE_HEADER]))
                self._check_answer(response, headers[SIGNATURE_HEADER], request.length, STREAMED)
                if response.content_length != request.length:
                    raise PeerUnavailable(
                        f"peer answers {response.content_length} bytes, not {request.length}"
                    )
                try:
                    while chunk := await response.content.readany():
                        received += len(chunk)
                        yield chunk
                finally:
                    if received != request.length:  # abandoned or short: not reusable
                        response.close()
            if received != request.length:
                raise PeerUnavailable(f"{peer_url} sent {received} of {request.length} bytes")
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            message = f"{peer_url}: {type(exc).__name__}: {exc}"
            raise PeerUnavailable(message, received) from exc

    async def metadata(self, peer_url: str, query: MetadataQuery, timeout: float) -> Any:
        """The owner's JSON answer to ``query``.

        Raises ``PeerNotFound`` (the owner's origin said NoSuchKey) or
        ``PeerUnavailable`` (``answered`` when the peer answered with an error).
        """
        url, headers = self._signed("GET", peer_url, metadata_target(query))
        try:
            async with self._client().get(
                url, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout)
            ) as response:
                body = await self._whole(response, headers[SIGNATURE_HEADER])
                if response.status != 200:
                    _raise_for(response, body)
                return json.loads(body)
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            message = f"{peer_url}: {type(exc).__name__}: {exc}"
            raise PeerUnavailable(message) from exc

    async def invalidate(
        self, peer_url: str, items: list[Invalidation], timeout: float = 2.0, drop_all: bool = False
    ) -> bool:
        """Ask ``peer_url`` to drop ``items`` (and, with ``drop_all``, its whole metadata
        cache first): True once it has, False on any failure."""
        body = json.dumps([asdict(item) for item in items]).encode()
        flag = "all=1&" if drop_all else ""
        return await self._post(peer_url, f"invalidate?{flag}", body, timeout, "an invalidation")

    async def message(self, peer_url: str, name: str, body: bytes, timeout: float = 2.0) -> bool:
        """Hand ``body`` to ``peer_url``'s ``on_message(name, body)``: True once it took it."""
        return await self._post(peer_url, f"message/{name}?", body, timeout, f"a {name} message")

    async def _post(self, peer_url: str, path: str, body: bytes, timeout: float, what: str) -> bool:
        """POST ``body`` to ``path`` (ending in ``?`` or ``&``, the digest is appended)."""
        target = f"{PREFIX}{path}sha256={hashlib.sha256(body).hexdigest()}"
        url, headers = self._signed("POST", peer_url, target)
        headers["Content-Type"] = "application/json"
        try:
            async with self._client().post(
                url, data=body, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout)
            ) as response:
                await self._whole(response, headers[SIGNATURE_HEADER])
                if response.status == 204:
                    return True
                log.warning("peer %s refused %s: %s", peer_url, what, response.status)
        except PeerUnavailable as exc:
            log.warning("peer %s: %s, for %s", peer_url, exc, what)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            log.warning("peer %s unreachable for %s: %r", peer_url, what, exc)
        return False

    async def call_json(
        self, method: str, peer_url: str, target: str, body: Any = None, timeout: float = 5.0
    ) -> tuple[int, Any]:
        """A signed JSON request to a mounted route: (status, parsed answer).

        Raises ``PeerUnavailable`` when the peer cannot be reached or its answer
        is not JSON.
        """
        data = b"" if body is None else json.dumps(body).encode()
        if data:
            sep = "&" if "?" in target else "?"
            target = f"{target}{sep}sha256={hashlib.sha256(data).hexdigest()}"
        url, headers = self._signed(method, peer_url, target)
        if data:
            headers["Content-Type"] = "application/json"
        try:
            async with self._client().request(
                method, url, data=data or None, headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as response:  # fmt: skip
                body = await self._whole(response, headers[SIGNATURE_HEADER])
                return response.status, json.loads(body or b"null")
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            raise PeerUnavailable(f"{peer_url}: {type(exc).__name__}: {exc}") from exc

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _raise_for(response: aiohttp.ClientResponse, body: bytes) -> NoReturn:
    """Raise what an answer other than 200 (its signed ``body``) means to the caller."""
    code = response.headers.get(ERROR_HEADER, "")
    message = body[:1024].decode("utf-8", "replace")
    if response.status == 404 and code == "NoSuchKey":
        raise PeerNotFound(message, _said(message))
    if response.status == 412 and code == "OriginChanged":
        raise PeerChanged(message)
    if response.status == 404 and code == "NotCached":
        raise PeerNotCached(message)
    raise PeerUnavailable(f"peer answered {response.status} {code}: {message}", answered=True)


def _said(body: str) -> dict[str, str]:
    """The origin's headers a NoSuchKey answer carries, if it is whole JSON naming them."""
    try:
        said = json.loads(body).get("headers", {})
    except (ValueError, AttributeError):
        return {}
    return {str(k): str(v) for k, v in said.items()} if isinstance(said, dict) else {}
