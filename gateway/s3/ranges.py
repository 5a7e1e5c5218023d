"""The ``Range`` request header (RFC 9110 §14.1.2), as S3 reads it.

S3 serves a single byte range. A header it cannot use (another unit, several
ranges, bad syntax) is ignored and the whole object is returned, as RFC 9110
allows; only a well-formed range past the end is an error (416, raised when
the size is known, by ``RangeSpec.resolve``).

The parsed range is a ``RangeSpec`` (``gateway/core/ranges.py``), before the
object's size is known; the reader resolves it against the size its metadata gives.
"""

from __future__ import annotations

import re

from gateway.core.ranges import RangeSpec
from gateway.s3.numbers import saturating

# ASCII only: "\d" would read other scripts' digits, IGNORECASE alone would match "\u017f" as "s".
_SINGLE_RANGE = re.compile(
    r"^[ \t]*bytes[ \t]*=[ \t]*([0-9]*)[ \t]*-[ \t]*([0-9]*)[ \t]*$", re.IGNORECASE | re.ASCII
)


def parse_range(header: str | None) -> RangeSpec | None:
    """``"bytes=0-99"`` → RangeSpec(0, 99); ``None`` where the header is absent or unusable."""
    if not header:
        return None
    match = _SINGLE_RANGE.match(header)
    if match is None:
        return None
    # A number too long to be an offset means "past any end" (416 for a first byte,
    # the end of the object for a last byte), as S3 reads it; never int()'s ValueError.
    first = saturating(match.group(1)) if match.group(1) else None
    last = saturating(match.group(2)) if match.group(2) else None
    if first is not None and last is not None:
        if last < first:
            return None  # RFC 9110: an invalid range-spec makes the header ignorable
        return RangeSpec(first=first, last=last)
    if first is not None:
        return RangeSpec(first=first)
    if last is not None:
        return RangeSpec(suffix=last)
    return None
