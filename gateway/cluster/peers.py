"""The peer wire: what nodes say to each other over ``/_hoard/peer/``, and how it is signed.

Nodes fill blocks from each other (a node streams a block it owns to the node
that asked), ask a key's owner for its metadata, and carry invalidations. This
module is the protocol only: routes, queries, signatures and errors, as values
that import nothing above them. ``peer_server.py`` answers it and
``peer_client.py`` asks it; both import this module and neither the other.

``GET /_hoard/peer/block/{digest}?origin=&bucket=&key=&etag=&index=&first=&last=&offset=&length=``
answers bytes [offset, offset+length) of the block (``first``..``last``: its range in
the object) with 200 and ``Content-Length: length``, streamed as the owner gets them
from its tiers or its own coalesced origin fill. Errors before the first byte are
JSON with an ``X-Hoard-Error`` code: 404 ``NoSuchKey``, 412 ``OriginChanged`` (the ETag
moved), 503 ``Unavailable``, 400 for a bad query. The client trusts the code, not
the status: a 404 from a node without this endpoint is "unavailable", not "no key".
``cached_only=1`` asks only for what the peer holds in its tiers: it answers 404
``NotCached`` rather than fill from its origin (a new owner asking a previous one).
``GET /_hoard/peer/meta?kind=head|list&origin=&bucket=&key=&…`` asks the owner of
a key (HEAD) or a prefix (LIST) for its metadata answer (see ``gateway/metadata/query.py``; its URL form is
``metadata_target`` and ``parse_metadata_query`` here):
200 with JSON, 404 ``NoSuchKey``, 503 ``Unavailable``.
``POST /_hoard/peer/invalidate?sha256={hex of body}`` with a JSON list of ``{origin,
bucket, key}`` or ``{origin, bucket, prefix}`` drops them → 204; with ``all=1``
first, the node drops its whole metadata cache (a replay that overflowed).
``POST /_hoard/peer/message/{name}?sha256={hex of body}`` hands the body to the
server's ``on_message(name, body)`` → 204 (e.g. prefetch registrations).
Other features add their own routes under ``/_hoard/peer/<name>/`` with ``mount``
(warm jobs: ``gateway/warm/http.py``); they get the same signature check, and a
request body must come with ``sha256={hex of body}`` in the query, as above.

Requests. Each carries ``X-Hoard-Date`` (epoch seconds or RFC 3339),
``X-Hoard-Nonce: <sender>.<counter>`` (the sender: 16 hex digits a client draws
when it starts; the counter: 1, 2, 3… never used twice by that sender) and
``X-Hoard-Signature: hex(HMAC-SHA256(secret, "hoard-peer-2" LF METHOD LF audience
LF path?query LF date LF nonce))``: the target as sent, and the *audience*, the
receiving node's URL as the sender names it (its ``cluster.self``, without a
trailing ``/``). The receiver checks in constant time that the signature is
right for its own URL (a request captured on its way to one node is refused by
every other), that the date is within ``MAX_SKEW`` of its clock, and then that
it never accepted this sender's counter (``replays.py``, remembered node-wide,
in fixed memory): a replay, even a second later, is refused. Missing, wrong,
expired or replayed is 403 before anything is read. ``sha256`` binds a request
body to the signature. A server without a secret refuses everything.

Answers. Every answer to an accepted request carries ``X-Hoard-Answer:
hex(HMAC-SHA256(secret, "hoard-answer-1" LF request signature LF status LF
error code LF length LF body digest))``; the client refuses one without it or
with a wrong one (``PeerUnavailable``), before it reads a byte of a block. It
binds the answer to the very request (so an answer cannot be swapped for
another's, or replayed), its status, ``X-Hoard-Error`` code and length, and,
for every answer held whole (metadata JSON, errors, invalidations, messages,
mounted routes), the SHA-256 of its body. A block's bytes are streamed (from
the page cache by ``sendfile``, without a copy) and are *not* covered: the
digest field says ``stream``. On a network an attacker can write to, give the
peers https URLs (``cluster.ca_bundle``), which covers the bytes too.

Not guaranteed: secrecy and the integrity of block bytes without https;
compatibility with nodes of the previous wire (signed without audience or
nonce): during a rolling upgrade they refuse each other and fall back to the
origin; completeness (after the first byte a failure cuts the connection, the
client raises ``PeerUnavailable`` after yielding what arrived, and the caller
resumes elsewhere at that byte); cleanup of an abandoned ``read_block`` that is
not closed (``contextlib.aclosing``): its connection then stays open until the
garbage collector finalizes the generator.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Protocol
from urllib.parse import parse_qsl, quote

from gateway.cache.block import BlockId
from gateway.metadata.query import MetadataQuery

PREFIX = "/_hoard/peer/"
DATE_HEADER = "X-Hoard-Date"
SIGNATURE_HEADER = "X-Hoard-Signature"
NONCE_HEADER = "X-Hoard-Nonce"
ANSWER_HEADER = "X-Hoard-Answer"
ERROR_HEADER = "X-Hoard-Error"
STREAMED = "stream"  # the body digest of an answer whose bytes the signature does not cover
MAX_SKEW = 300.0  # seconds of clock difference tolerated between nodes
READ_BUFFER = 256 * 1024  # client-side buffer per connection: bounds memory per stream
_EPOCH = re.compile(r"[0-9]{1,12}(\.[0-9]{1,9})?")
_INT = re.compile(r"[0-9]{1,19}")
_NONCE = re.compile(r"([0-9a-f]{16})\.([1-9][0-9]{0,18})")


class PeerError(Exception):
    """A peer did not serve a block. Not a ``HoardError``: never shown to S3 clients as is."""


class PeerUnavailable(PeerError):
    """Unreachable, timed out, refused or failed, after yielding ``received`` bytes."""

    def __init__(self, message: str, received: int = 0, answered: bool = False) -> None:
        super().__init__(message)
        self.received = received
        self.answered = answered  # the peer answered (with an error): it is alive


class PeerNotFound(PeerError):
    """The owner's origin says the object does not exist; ``headers``: what its 404 said."""

    def __init__(self, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.headers = headers or {}


class PeerChanged(PeerError):
    """The owner's origin has another ETag for the object."""


class PeerNotCached(PeerError):
    """A ``cached_only`` request: the peer does not hold the block."""


class PeerEvents(Protocol):
    """What the placement and the metadata router report (``metric_events.PeerMetrics``)."""

    def requested(self, operation: str) -> None: ...
    def failed(self, operation: str, kind: str) -> None: ...
    def took(self, operation: str, seconds: float) -> None: ...
    def received(self, size: int) -> None: ...


@dataclass(frozen=True, slots=True)
class BlockRequest:
    origin: str
    bucket: str
    key: str
    etag: str
    index: int
    first: int  # inclusive byte range of the block within the object
    last: int
    offset: int  # the part wanted, relative to the block
    length: int
    cached_only: bool = False  # from the peer's tiers only, never from its origin

    def __post_init__(self) -> None:
        if not (0 <= self.first <= self.last and self.index >= 0 and self.offset >= 0):
            raise ValueError(f"bad block bounds in {self}")
        if not (self.length >= 1 and self.offset + self.length <= self.last - self.first + 1):
            raise ValueError(f"range outside the block in {self}")

    @property
    def block_id(self) -> BlockId:
        return BlockId(self.origin, self.bucket, self.key, self.etag, self.index)

    def target(self) -> str:
        """The path and query that ask a peer for this; keys may hold any character."""
        query = "&".join(f"{f.name}={_quote(str(getattr(self, f.name)))}"
                         for f in fields(self) if f.name != "cached_only")  # fmt: skip
        flag = "&cached_only=1" if self.cached_only else ""
        return f"{PREFIX}block/{self.block_id.digest}?{query}{flag}"

    @classmethod
    def from_query(cls, query: str) -> BlockRequest:
        """Parse a raw query; ``ValueError`` or ``KeyError`` if it is not one of ours."""
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=True,
                          encoding="utf-8", errors="surrogatepass")  # fmt: skip
        values = dict(pairs)  # a repeated name keeps its last value; all were signed
        texts = {f.name: values[f.name] for f in fields(cls) if f.name != "cached_only"}
        ints = {n: _int(texts.pop(n)) for n in ("index", "first", "last", "offset", "length")}
        return cls(**texts, **ints, cached_only=values.get("cached_only") == "1")


def metadata_target(query: MetadataQuery) -> str:
    """The path and query that ask a key's owner for ``query``."""
    pairs = "&".join(f"{f.name}={_quote(str(getattr(query, f.name)))}" for f in fields(query))
    return f"{PREFIX}meta?{pairs}"


def parse_metadata_query(query: str) -> MetadataQuery:
    """A raw query as ``metadata_target`` wrote it; ``ValueError`` or ``KeyError`` if it
    is not one of ours."""
    values = dict(parse_qsl(query, keep_blank_values=True, strict_parsing=True,
                            encoding="utf-8", errors="surrogatepass"))  # fmt: skip
    texts = {f.name: values[f.name] for f in fields(MetadataQuery)}
    floats = {n: float(texts.pop(n)) for n in ("ttl", "negative_ttl")}
    max_keys = _int(texts.pop("max_keys"))
    return MetadataQuery(**texts, **floats, max_keys=max_keys)


def audience_of(url: str) -> str:
    """A node's URL as signatures name it (``cluster.self``, or a peer's URL)."""
    return url.rstrip("/")


def sign(secret: str, method: str, audience: str, target: str, date: str, nonce: str) -> str:
    """The hex signature of one request to the node ``audience``; ``target`` is the
    path and query as sent."""
    text = f"hoard-peer-2\n{method}\n{audience}\n{target}\n{date}\n{nonce}"
    return _mac(secret, text)


def request_headers(
    secret: str, method: str, audience: str, target: str, date: str, nonce: str
) -> dict[str, str]:
    """The headers that sign one request (``audience``: the receiving node's URL)."""
    signature = sign(secret, method, audience_of(audience), target, date, nonce)
    return {DATE_HEADER: date, NONCE_HEADER: nonce, SIGNATURE_HEADER: signature}


def sign_answer(
    secret: str, request_signature: str, status: int, code: str, length: int, body_digest: str
) -> str:
    """The hex signature of an answer to the request signed ``request_signature``;
    ``body_digest``: the SHA-256 (hex) of a body held whole, or ``STREAMED``."""
    text = f"hoard-answer-1\n{request_signature}\n{status}\n{code}\n{length}\n{body_digest}"
    return _mac(secret, text)


def _mac(secret: str, text: str) -> str:
    message = text.encode("utf-8", "surrogateescape")
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def nonce_text(sender: bytes, counter: int) -> str:
    return f"{sender.hex()}.{counter}"


def parse_nonce(text: str) -> tuple[bytes, int] | None:
    """``(sender, counter)`` of an ``X-Hoard-Nonce`` value, or None if it is not one."""
    match = _NONCE.fullmatch(text)
    if match is None:
        return None
    return bytes.fromhex(match.group(1)), int(match.group(2))


def same_digest(expected: str, given: str) -> bool:
    # Constant time, on bytes: compare_digest refuses str that is not ASCII.
    return hmac.compare_digest(expected.encode(), given.encode("utf-8", "surrogateescape"))


def _quote(text: str) -> str:
    return quote(text.encode("utf-8", "surrogatepass"), safe="")


def _int(text: str) -> int:
    if not _INT.fullmatch(text):  # int() would take " 1", "+1" and "1_0"
        raise ValueError(f"not a non-negative integer: {text!r}")
    return int(text)


def parse_date(text: str) -> float | None:
    if _EPOCH.fullmatch(text):
        return float(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    return moment.timestamp() if moment.tzinfo is not None else None
