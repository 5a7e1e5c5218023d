"""What SigV4 and SigV2 verification share: the request they read, the wire's encodings and dates.

Both schemes verify the same ``RequestView`` (a request as received, free of
the HTTP framework), read the same query strings and the same date headers,
and must turn undecodable request bytes into the same text: one decoder, one
date parser, one formatter for the error fields S3 returns (``Expires``,
``ServerTime``, ``StringToSignBytes``). ``sigv4.py`` (with ``sigv4_claim.py``)
and ``sigv2.py`` import these; neither reaches into the other's private helpers.
"""

from __future__ import annotations

import functools
import re
import time
from calendar import timegm
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from types import MappingProxyType
from urllib.parse import quote, unquote_to_bytes

NO_DATE = "AWS authentication requires a valid Date or x-amz-date header"
AMZ_DATE = re.compile(r"[0-9]{8}T[0-9]{6}Z")


@dataclass(slots=True)  # not frozen: built per request (frozen fields cost a setattr each)
class RequestView:
    """What verification needs of a request, independent of the HTTP framework."""

    method: str
    raw_path: str  # as sent on the request line, percent-encoding intact, no '?query'
    raw_query: str  # as sent, without '?'; '' if none
    headers: Mapping[str, str]  # case-insensitive; repeated headers via getall()


@functools.lru_cache(maxsize=4096)  # pure: clients repeat credentials, dates and header lists
def parse_amz_date(value: str) -> float | None:
    # Slicing, not strptime: this runs for every request and strptime is slow.
    if not AMZ_DATE.fullmatch(value):
        return None
    try:
        moment = datetime(int(value[0:4]), int(value[4:6]), int(value[6:8]),
                          int(value[9:11]), int(value[11:13]), int(value[13:15]))  # fmt: skip
    except ValueError:
        return None
    return float(timegm(moment.timetuple()))


def parse_http_date(value: str) -> float | None:
    try:
        parsed = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)  # '-0000' means UTC with unknown origin
    return parsed.timestamp()


# Pure, and asked for several times per request (is it signed, how, its claim, its
# expiry), so a few recent queries are kept: each is decoded once. Read-only, as shared.
@functools.lru_cache(maxsize=64)
def query_params(raw_query: str) -> Mapping[str, str]:
    """Decoded parameters by lowercased name (S3 matches X-Amz-* names in any case)."""
    params: dict[str, str] = {}
    for item in raw_query.split("&"):
        name, _, value = item.partition("=")
        params.setdefault(decode(name).lower(), decode(value))
    return MappingProxyType(params)


def decode(value: str) -> str:
    # '+' stays '+': S3 signs the query as sent, not as a form.
    if "%" not in value and value.isascii():
        return value  # the common case, without a round trip through bytes
    return _decoded(value)


@functools.lru_cache(maxsize=1024)  # pure: every URL a client presigns has its Credential
def _decoded(value: str) -> str:
    return unquote_to_bytes(utf8(value)).decode("utf-8", "replace")


def uri_encode(value: str, *, safe: str) -> str:
    """Percent-decode, then encode all but A-Za-z0-9-_.~ (and `safe`), uppercase hex."""
    # Most of what is signed (a key's path, a date, a header list) needs no encoding:
    # decoded and encoded again it is itself, so the round trip (~4 us) is skipped.
    unchanged = _UNCHANGED.get(safe)
    if unchanged is not None and unchanged.fullmatch(value):
        return value
    return _encoded(value, safe)


# What encodes to itself, by the characters left safe: unreserved ones (and those).
_UNCHANGED = {"": re.compile(r"[A-Za-z0-9_.~-]*"), "/": re.compile(r"[A-Za-z0-9_.~/-]*")}


@functools.lru_cache(maxsize=1024)  # a URL's credential and header list repeat in every URL
def _encoded(value: str, safe: str) -> str:
    return quote(unquote_to_bytes(utf8(value)), safe=safe)


def utf8(text: str) -> bytes:
    # aiohttp decodes undecodable request bytes to surrogates; encode them back, never crash.
    return text.encode("utf-8", "surrogateescape")


@functools.lru_cache(maxsize=4096)  # pure: clients repeat credentials, dates and header lists
def format_amz_date(timestamp: float) -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(timestamp))


def iso(timestamp: float) -> str:
    return datetime.fromtimestamp(int(timestamp), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def hex_bytes(text: str) -> str:
    return " ".join(f"{b:02x}" for b in utf8(text))
