"""What a bundle request asks for: its options (headers) and its keys (body), checked.

Tigris's client (``tigris-boto3-ext``'s ``bundle_objects``) sends
``{"keys": [...]}`` with ``json.dumps``' defaults, so a non-ASCII key arrives
as ``\\uXXXX`` escapes: the body is decoded as JSON, never matched as bytes.
Tigris's docs also accept ``<Bundle><Object><Key>…</Key></Object>…</Bundle>``;
which one a body is, is told by its first byte that is not white space (``<``:
XML, parsed as every XML body Hoard reads, a document type declaration
refused: ``xml_writes.root_element``). The Content-Type is not trusted for it:
a client that sends XML as ``application/octet-stream`` still means XML.

The limits are Tigris's: 5,000 keys and a body of 5 MiB. Each key must be one
S3 could store (1 to 1,024 bytes of UTF-8) and one a TAR member may be named
after without harm: no control characters (NUL, newline: a name an extractor
or a log line would misread) and no ``..`` segment (an extractor that follows
the name would write outside its directory). S3 itself stores such keys; a
bundle of them is refused whole, before anything is read, rather than
streamed under names that are traps.

The options: ``X-Tigris-Bundle-Format`` (only ``tar``; absent means tar, so a
hand-made ``curl`` works), ``X-Tigris-Bundle-Compression`` (``none``,
``gzip``; ``zstd`` is 501 NotImplemented: see the package essay) and
``X-Tigris-Bundle-On-Error`` (``skip``, the default, or ``fail``). Each bad
value is a 400 naming its header; nothing here reaches an origin.

One option is Hoard's own: ``X-Hoard-Bundle-Framing: length`` (default
``chunked``) asks that a fail-mode archive without compression, whose length
is known before its first byte, be sent with a Content-Length instead of
chunked: the client reads it in large exact reads, and the server sends a disk
segment with no chunk framing around it. Only a client that asks gets it,
because it must treat a body shorter than its Content-Length as a failure:
that is all a cut leaves then. Tigris's client does not (botocore reads with
``enforce_content_length=False``, and ``tarfile`` ends quietly at a member
boundary), so it keeps the chunked answer, whose missing last chunk its HTTP
layer reports. A server that does not know the header answers chunked, which
the asking client reads too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from gateway.s3.errors import Code, S3Error
from gateway.s3.xml_writes import child_text, local_name, root_element

MAX_KEYS = 5000  # Tigris: keys per bundle
MAX_BODY = 5 * 1024 * 1024  # Tigris: request body bytes
MAX_KEY_BYTES = 1024  # S3: a key's length in UTF-8

FORMAT = "X-Tigris-Bundle-Format"
COMPRESSION = "X-Tigris-Bundle-Compression"
ON_ERROR = "X-Tigris-Bundle-On-Error"
FRAMING = "X-Hoard-Bundle-Framing"

Compression = Literal["none", "gzip"]
OnError = Literal["skip", "fail"]
Framing = Literal["chunked", "length"]

_CONTROL = re.compile("[\x00-\x1f\x7f]")


@dataclass(frozen=True, slots=True)
class Options:
    compression: Compression = "none"
    on_error: OnError = "skip"
    framing: Framing = "chunked"


def options(headers: Mapping[str, str]) -> Options:
    """The bundle's options from its headers (names in any case); 400/501 for a bad one."""
    form = _value(headers, FORMAT, "tar")
    if form != "tar":
        raise _bad(FORMAT, f"{FORMAT} must be tar, not {form!r}.")
    compression = _value(headers, COMPRESSION, "none")
    if compression == "zstd":
        raise S3Error(Code.NotImplemented, "zstd bundles are not implemented; ask for gzip.")
    if compression not in ("none", "gzip"):
        raise _bad(COMPRESSION, f"{COMPRESSION} must be none, gzip or zstd.")
    on_error = _value(headers, ON_ERROR, "skip")
    if on_error not in ("skip", "fail"):
        raise _bad(ON_ERROR, f"{ON_ERROR} must be skip or fail.")
    framing = _value(headers, FRAMING, "chunked")
    if framing not in ("chunked", "length"):
        raise _bad(FRAMING, f"{FRAMING} must be chunked or length.")
    return Options(compression, on_error, framing)  # type: ignore[arg-type]


def _value(headers: Mapping[str, str], name: str, default: str) -> str:
    return headers.get(name, default).strip().lower()


def _bad(argument: str, message: str) -> S3Error:
    return S3Error(Code.InvalidArgument, message, fields={"ArgumentName": argument})


def parse_keys(body: bytes) -> list[str]:
    """The keys of a bundle body (JSON or XML), in order, duplicates kept; 400 if bad."""
    if len(body) > MAX_BODY:
        raise too_large()
    keys = _xml_keys(body) if body.lstrip()[:1] == b"<" else _json_keys(body)
    if not keys:
        raise _bad("keys", "A bundle needs at least one key.")
    if len(keys) > MAX_KEYS:
        raise _bad("keys", f"A bundle takes at most {MAX_KEYS} keys, not {len(keys)}.")
    for key in keys:
        check_key(key)
    return keys


def too_large() -> S3Error:
    return S3Error(Code.MaxMessageLengthExceeded,
                   f"A bundle request body is at most {MAX_BODY} bytes.")  # fmt: skip


def _json_keys(body: bytes) -> list[str]:
    try:
        document = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise _bad("keys", 'The bundle body is neither JSON {"keys": [...]} nor XML.') from None
    keys = document.get("keys") if isinstance(document, dict) else None
    if not isinstance(keys, list) or not all(isinstance(key, str) for key in keys):
        raise _bad("keys", 'The bundle body must be {"keys": [...]}, a list of strings.')
    return keys


def _xml_keys(body: bytes) -> list[str]:
    root = root_element(body, "Bundle")
    keys = []
    for element in root:
        if local_name(element.tag) != "Object":
            continue
        key = child_text(element, "Key")
        if key is None:
            raise S3Error(Code.MalformedXML, "Each <Object> of a <Bundle> needs a <Key>.")
        keys.append(key)
    return keys


def check_key(key: str) -> None:
    """400 unless ``key`` is one S3 could store and a TAR member may be named after."""
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate, sent as a JSON escape
        raise _bad("keys", f"Key {key!r} is not valid Unicode.") from None
    if size > MAX_KEY_BYTES:
        raise S3Error(Code.KeyTooLongError, fields={"Size": str(size),
                                                    "MaxSizeAllowed": str(MAX_KEY_BYTES)})  # fmt: skip
    if size == 0:
        raise _bad("keys", "A key of a bundle may not be empty.")
    if _CONTROL.search(key):
        raise _bad("keys", f"Key {key!r} holds a control character (NUL, newline...).")
    if ".." in key.split("/"):
        raise _bad("keys", f"Key {key!r} has a '..' segment: no TAR member is named so.")
