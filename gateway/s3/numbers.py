"""Numbers a client sends: ASCII digits only, of bounded length.

Python reads far more than S3 does as a number: ``int()`` takes Unicode
digits (``"١٢"`` is 12), signs, spaces and underscores, ``str.isdigit()`` is
true for ``"²"`` (which ``int()`` then refuses), ``\\d`` in a regular
expression matches every script's digits, and a string of more than 4,300
digits raises ``ValueError`` from ``int()`` itself. Each of those reached an
``int()`` somewhere as a 500. Every number in a request (query parameters,
headers, XML bodies) is therefore read here or by a pattern of ``[0-9]``,
and what is not a plain decimal number becomes the S3 error the caller names.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from gateway.s3.errors import Code, S3Error

MAX_DIGITS = 19  # every count and offset S3 knows fits in a signed 64-bit integer
_PLAIN = re.compile(r"[0-9]+")
SATURATED = 2**63  # "more than any object has": what an over-long offset means


def natural(text: str, max_digits: int = MAX_DIGITS) -> int | None:
    """``text`` as a non-negative integer, or None unless it is 1..``max_digits`` ASCII digits."""
    if len(text) > max_digits or not _PLAIN.fullmatch(text):
        return None
    return int(text)


def saturating(digits: str) -> int:
    """ASCII ``digits`` (already matched) as an integer, capped at ``SATURATED``.

    For byte offsets, where a number too long to be real still has a meaning:
    past the end of any object.
    """
    significant = digits.lstrip("0") or "0"
    return SATURATED if len(significant) > MAX_DIGITS else min(int(significant), SATURATED)


def query_integer(query: Mapping[str, str], name: str, default: int) -> int:
    """A count in the query (``max-keys``, ``max-parts``, ...), 0..2147483647, as S3 checks it."""
    raw = query.get(name)
    if raw is None:
        return default
    if raw.startswith("-") and natural(raw[1:]) is not None:
        message = f"Argument {name} must be an integer between 0 and 2147483647"
        raise S3Error(Code.InvalidArgument, message)
    value = natural(raw, 10)
    if value is None or value > 2**31 - 1:
        message = f"Provided {name} not an integer or within integer range"
        raise S3Error(Code.InvalidArgument, message)
    return value
