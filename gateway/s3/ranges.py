"""The ``Range`` request header (RFC 9110 §14.1.2), as S3 reads it.

S3 serves a single byte range. A header it cannot use (another unit, several
ranges, bad syntax) is ignored and the whole object is returned, as RFC 9110
allows; only a well-formed range past the end is an error (416, raised when
the size is known, by ``RangeSpec.resolve``).

``RangeSpec`` is the parsed range before the object's size is known; the
reader resolves it against the size its metadata gives.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gateway.core import errors
from gateway.s3.numbers import saturating

# ASCII only: "\d" would read other scripts' digits, IGNORECASE alone would match "\u017f" as "s".
_SINGLE_RANGE = re.compile(
    r"^[ \t]*bytes[ \t]*=[ \t]*([0-9]*)[ \t]*-[ \t]*([0-9]*)[ \t]*$", re.IGNORECASE | re.ASCII
)


@dataclass(frozen=True, slots=True)
class RangeSpec:
    """One HTTP byte range before the object size is known (RFC 9110 §14.1.2).

    ``bytes=a-b`` → first=a, last=b; ``bytes=a-`` → first=a; ``bytes=-n`` → suffix=n.
    """

    first: int | None = None
    last: int | None = None
    suffix: int | None = None

    def applies(self, size: int) -> bool:
        """Whether a byte range can answer this; if not, the whole object is the answer.

        RFC 9110 §14.1.1: on an empty representation a suffix range with a
        non-zero length is satisfiable, yet no byte range can express it, so
        it is answered as if no Range was sent (as S3 answers: 200, no body).
        """
        return not (size == 0 and self.suffix)

    def resolve(self, size: int) -> tuple[int, int]:
        """The inclusive (start, end) this range selects, or ``RangeNotSatisfiable``."""
        if self.suffix is not None:
            if self.suffix == 0 or size == 0:
                raise errors.RangeNotSatisfiable(size)
            return max(0, size - self.suffix), size - 1
        first = self.first or 0
        if first >= size:
            raise errors.RangeNotSatisfiable(size)
        last = size - 1 if self.last is None else min(self.last, size - 1)
        return first, last


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
