"""A header-signed head's *signed form*: its bytes without the lines that change per call.

A SigV4 client signing in headers (boto3, s3fs, s3torchconnector) sends a new
date, a new signature and, for boto3, new per-call ids with every request, so
no two of its heads are the same bytes. Without those lines they are: every
read of one object by one client has the same form, which the express lane
(``express.py``) keys its kept answer by (each repeat's signature is still
verified). The lines left out decide nothing but who signed and when.

A field name is followed by its colon at once (RFC 9112 refuses a blank
between them), and a line ends at its first CR or LF. Compiled twin:
``_signed_form.pyx`` (one byte scan in C; this regular expression cost 8 µs
a header-signed hit in the server's process, where the scan costs under one).
"""

from __future__ import annotations

import re

from gateway.core.compiled import twin

_PER_REQUEST = re.compile(
    rb"\r\n(?:x-amz-date|authorization|amz-sdk-invocation-id|amz-sdk-request):[^\r\n]*",
    re.IGNORECASE,
)
_AUTHORIZATION = re.compile(rb"\r\nauthorization:", re.IGNORECASE)


def signed_form(head: bytes) -> bytes | None:
    """``head`` without the lines a header-signing client changes on every request
    (``_PER_REQUEST``); None if it has no ``Authorization`` line."""
    form, dropped = _PER_REQUEST.subn(b"", head)
    return form if dropped and _AUTHORIZATION.search(head) is not None else None


# The Python path, kept: the tests compare it with the compiled one (``core/compiled.py``).
signed_form_py = signed_form
_compiled = twin("gateway.s3._signed_form")
if _compiled is not None:
    signed_form = _compiled.signed_form
