"""The ``Range`` request header (RFC 9110 §14.1.2), as S3 reads it.

S3 serves a single byte range. A header it cannot use (another unit, several
ranges, bad syntax) is ignored and the whole object is returned, as RFC 9110
allows; only a well-formed range past the end is an error (416, raised when
the size is known, by ``RangeSpec.resolve``).
"""

from __future__ import annotations

import re

from gateway.reader import RangeSpec

_SINGLE_RANGE = re.compile(r"^\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*$", re.IGNORECASE)


def parse_range(header: str | None) -> RangeSpec | None:
    """``"bytes=0-99"`` → RangeSpec(0, 99); ``None`` where the header is absent or unusable."""
    if not header:
        return None
    match = _SINGLE_RANGE.match(header)
    if match is None:
        return None
    first, last = match.group(1), match.group(2)
    if first and last:
        if int(last) < int(first):
            return None  # RFC 9110: an invalid range-spec makes the header ignorable
        return RangeSpec(first=int(first), last=int(last))
    if first:
        return RangeSpec(first=int(first))
    if last:
        return RangeSpec(suffix=int(last))
    return None
