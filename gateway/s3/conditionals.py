"""Conditional request headers, evaluated in S3's order (RFC 9110 §13.2.2).

If-Match, then If-Unmodified-Since (only without If-Match) → 412;
If-None-Match, then If-Modified-Since (only without If-None-Match) → 304.
S3 documents the same: If-Match true with If-Unmodified-Since false is a 200,
and If-None-Match false with If-Modified-Since true is a 304.
Unparseable dates are ignored, as RFC 9110 requires.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from email.utils import parsedate_to_datetime

from gateway.core import errors
from gateway.origins.base import ObjectInfo


def _http_date(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        parsed = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return parsed if parsed.tzinfo is not None else None


def _etags(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [tag.strip().removeprefix("W/").strip('"') for tag in value.split(",") if tag.strip()]


def _matches(tags: list[str], etag: str) -> bool:
    bare = etag.strip('"')
    return any(tag in ("*", bare) for tag in tags)


@dataclass(frozen=True, slots=True)
class Conditions:
    if_match: list[str] | None = None
    if_none_match: list[str] | None = None
    if_modified_since: datetime | None = None
    if_unmodified_since: datetime | None = None

    @classmethod
    def from_headers(cls, headers: Mapping[str, str]) -> Conditions:
        if not any(name in headers for name in _HEADERS):
            return _UNCONDITIONAL
        return cls(
            if_match=_etags(headers.get("If-Match")),
            if_none_match=_etags(headers.get("If-None-Match")),
            if_modified_since=_http_date(headers.get("If-Modified-Since")),
            if_unmodified_since=_http_date(headers.get("If-Unmodified-Since")),
        )

    def __bool__(self) -> bool:
        return not (
            self.if_match is None
            and self.if_none_match is None
            and self.if_modified_since is None
            and self.if_unmodified_since is None
        )

    def check(self, info: ObjectInfo) -> None:
        """Raise ``PreconditionFailed`` or ``NotModified`` if the object fails a condition."""
        modified = info.last_modified.replace(microsecond=0)
        if self.if_match is not None:
            if not _matches(self.if_match, info.etag):
                raise errors.PreconditionFailed("If-Match")
        elif self.if_unmodified_since is not None and modified > self.if_unmodified_since:
            raise errors.PreconditionFailed("If-Unmodified-Since")
        if self.if_none_match is not None:
            if _matches(self.if_none_match, info.etag):
                raise errors.NotModified(info.etag, info.last_modified)
        elif self.if_modified_since is not None and modified <= self.if_modified_since:
            raise errors.NotModified(info.etag, info.last_modified)


_HEADERS = ("If-Match", "If-None-Match", "If-Modified-Since", "If-Unmodified-Since")
_UNCONDITIONAL = Conditions()
