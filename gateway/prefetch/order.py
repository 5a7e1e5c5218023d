"""A prefetch registration as it arrives: parsed, validated and bounded, or a 400.

``{"stream": ID, "bucket": B, "keys": [K, ...]}`` or ``{"stream": ID, "bucket": B,
"manifest": KEY}`` (an object of ``B`` holding one key per line), with an optional
``"window"`` in bytes (an int or a size such as ``"512MiB"``). Every bound comes
from ``PrefetchConfig``; what breaks one is an ``OrderError`` whose code and
message the endpoint sends as JSON with status 400.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gateway.config.settings import PrefetchConfig
from gateway.config.units import parse_size

_STREAM_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
MAX_KEY_BYTES = 1024  # S3's limit on a key's UTF-8 length


class OrderError(ValueError):
    """A registration Hoard refuses (HTTP 400); ``code`` names the reason."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class Order:
    """The ordered keys one reader is about to read, and how far ahead to fetch."""

    stream: str
    bucket: str
    keys: tuple[str, ...]
    window: int  # bytes fetched ahead of the reader's position

    def as_json(self) -> dict[str, Any]:
        return {"stream": self.stream, "bucket": self.bucket, "keys": list(self.keys),
                "window": self.window}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Request:
    """What a registration asks for, before a manifest (if named) is read."""

    stream: str
    bucket: str
    window: int
    keys: tuple[str, ...] | None  # None: read them from ``manifest``
    manifest: str | None


def parse_request(body: object, config: PrefetchConfig) -> Request:
    """Validate a registration's JSON; raises ``OrderError``."""
    if not isinstance(body, dict):
        raise OrderError("InvalidRequest", "the body must be a JSON object")
    stream, bucket = body.get("stream"), body.get("bucket")
    if not isinstance(stream, str) or not _STREAM_ID.fullmatch(stream):
        raise OrderError("InvalidStream", "stream: 1-128 characters of A-Z a-z 0-9 . _ : -")
    if not isinstance(bucket, str) or not bucket:
        raise OrderError("InvalidRequest", "bucket is required")
    keys, manifest = body.get("keys"), body.get("manifest")
    if (keys is None) == (manifest is None):
        raise OrderError("InvalidRequest", "give either keys (a list) or manifest (a key)")
    if manifest is not None and (not isinstance(manifest, str) or not manifest):
        raise OrderError("InvalidRequest", "manifest must be an object key")
    if keys is not None:
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise OrderError("InvalidRequest", "keys must be a list of strings")
        keys = check_keys(keys, config)
    return Request(stream, bucket, _window(body.get("window"), config), keys, manifest)


def manifest_keys(text: str, config: PrefetchConfig) -> tuple[str, ...]:
    """The keys of a manifest: one per line, blank lines skipped.

    A line that cannot be a key is named by its number, never quoted: a manifest
    is object content, and an error message must not become a way to read it.
    """
    keys = []
    for number, line in enumerate(text.splitlines(), 1):
        key = line.strip()
        if key and len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
            raise OrderError("InvalidRequest", f"manifest line {number} is not an object key "
                                               f"(longer than {MAX_KEY_BYTES} bytes)")  # fmt: skip
        if key:
            keys.append(key)
    return check_keys(keys, config)


def check_keys(keys: list[str], config: PrefetchConfig) -> tuple[str, ...]:
    if not keys:
        raise OrderError("InvalidRequest", "the order has no keys")
    if len(keys) > config.max_keys:
        raise OrderError("TooManyKeys",
                         f"{len(keys)} keys; this gateway takes at most {config.max_keys} per "
                         "stream (prefetch.max_keys)")  # fmt: skip
    for key in keys:
        if not key or len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
            raise OrderError("InvalidRequest", f"not an object key: {key[:80]!r}")
    return tuple(keys)


def _window(value: object, config: PrefetchConfig) -> int:
    if value is None:
        return config.window
    try:
        window = parse_size(value)
    except ValueError as exc:
        raise OrderError("InvalidWindow", str(exc)) from None
    if not 0 < window <= config.max_window:
        raise OrderError("InvalidWindow",
                         f"window must be between 1 byte and {config.max_window} bytes "
                         "(prefetch.max_window)")  # fmt: skip
    return window
