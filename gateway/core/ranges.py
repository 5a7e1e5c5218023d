"""A byte range as a client asked for it, before the object's size is known.

The S3 front parses the ``Range`` header into this value (``s3/ranges.py``)
and the reader resolves it against the size its metadata gives: a leaf value
both sides share, so neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.core import errors


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
