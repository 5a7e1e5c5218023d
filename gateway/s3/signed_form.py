"""A header-signed head's *signed form*: its bytes without the lines that change per call.

A SigV4 client signing in headers (boto3, s3fs, s3torchconnector) sends a new
date, a new signature and, for boto3, new per-call ids with every request, so
no two of its heads are the same bytes. Without those lines they are: every
read of one object by one client has the same form, which the express lane
(``express.py``) keys its kept answer by (each repeat's signature is still
verified). The lines left out decide nothing but who signed and when, and
their values are handed back beside the form: a repeat's signature is checked
from them and the form alone (``sigv4_repeat.py``).

A field name is followed by its colon at once (RFC 9112 refuses a blank
between them), and a line ends at its first CR or LF. A head has no parts
unless it could be a ``Head`` as far as those lines go (``core/heads.py``):
ASCII, each per-call name at most once, each such line ended by CRLF, no
longer than a line may be and with no control byte in its value; and it must
have an ``Authorization`` line. The hit path answers the rest. Compiled twin:
``_signed_form.pyx`` (one byte scan in C; this regular expression cost 8 µs
a header-signed hit in the server's process, where the scan costs under one).
"""

from __future__ import annotations

import re

from gateway.core.compiled import twin
from gateway.core.heads import MAX_LINE

# The per-call lines' names, in the order of their values in ``SignedParts``.
PER_CALL = (b"x-amz-date", b"authorization", b"amz-sdk-invocation-id", b"amz-sdk-request")
_SLOT = {name: slot for slot, name in enumerate(PER_CALL)}
_PER_CALL_LINE = re.compile(rb"\r\n(" + b"|".join(PER_CALL) + rb"):([^\r\n]*)", re.IGNORECASE)
_CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")

# (form, x-amz-date, authorization, amz-sdk-invocation-id, amz-sdk-request): the values
# without their blanks around, None where the line is missing (never the authorization).
SignedParts = tuple[bytes, bytes | None, bytes, bytes | None, bytes | None]


def signed_parts(head: bytes) -> SignedParts | None:
    """``head``'s signed form and its per-call lines' values (``PER_CALL``); None if it
    has no ``Authorization`` line or such a line is not as a ``Head``'s would be."""
    if not head.isascii():
        return None
    values: list[bytes | None] = [None, None, None, None]
    kept, at = [], 0
    for line in _PER_CALL_LINE.finditer(head):
        slot, value, end = _SLOT[line[1].lower()], line[2], line.end()
        if values[slot] is not None or head[end : end + 2] != b"\r\n":
            return None
        if len(line[0]) - 2 > MAX_LINE or _CONTROL.search(value) is not None:
            return None
        values[slot] = value.strip(b" \t")
        kept.append(head[at : line.start()])
        at = end
    if values[1] is None:
        return None
    kept.append(head[at:])
    return (b"".join(kept), *values)  # type: ignore[return-value]


# The Python path, kept: the tests compare it with the compiled one (``core/compiled.py``).
signed_parts_py = signed_parts
_compiled = twin("gateway.s3._signed_form")
if _compiled is not None:
    signed_parts = _compiled.signed_parts
