"""The checksum headers a GetObject or HeadObject answer carries: S3's, whatever the origin sent.

An object's checksum comes in two kinds. A FULL_OBJECT checksum is the digest of the
object's bytes: every single-PUT object's, and a multipart object's when its upload
asked for one. A COMPOSITE checksum is the digest of the parts' digests, which no
reader can recompute from the bytes; S3 spells it ``<base64>-<parts>`` and says
``x-amz-checksum-type: COMPOSITE``, and an SDK seeing the ``-N`` skips validation
(botocore's ``handle_checksum_body``). boto3 >= 1.36 asks for checksums on every
GetObject and checks the body against any value without a dash.

Hoard keeps the object's headers as its origin sent them, from a HEAD as often as
from a GET, and some S3 servers send a composite value bare on HEAD: no ``-N``, no
type (moto does). Replayed on a whole-object GET, that bare value is a checksum the
body does not have, and a default boto3 read fails with ``FlexibleChecksumError``.
So the headers are not replayed, they are derived, per value:

- ``…-N``: composite, served as it is, with ``x-amz-checksum-type: COMPOSITE``;
- type ``FULL_OBJECT``: served, with its type;
- type ``COMPOSITE`` without ``-N``: the part count is the multipart ETag's
  (``"…-N"``, the same N S3 puts on both), appended; without one, dropped;
- no type: the object's ETag tells. A single-part ETag means one body, whose checksum
  is the full object's: served as the origin sent it (no type is made up: an origin
  that names none, as moto for a single PUT, is repeated). A multipart ETag leaves it
  undecidable (composite, or full-object from an origin that names no types):
  dropped, since a wrong checksum fails a read that none lets through.

And none at all on a range or unless asked (``x-amz-checksum-mode: ENABLED``): S3
sends the whole object's checksums on whole-object answers only (``objects.py``
decides when). This is a pure function of the stored headers and the ETag, applied
when an answer is rendered, so headers stored before it was written are served right.

NOT covered: GetObject with ``partNumber`` (S3 then sends that part's checksum, which
Hoard does not know; such a request passes through to the origin).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from gateway.s3.checksums import by_header

PREFIX = "x-amz-checksum-"
TYPE = "x-amz-checksum-type"
FULL_OBJECT, COMPOSITE = "FULL_OBJECT", "COMPOSITE"
_PARTS = re.compile(r"-([1-9][0-9]{0,4})$")  # S3 allows 10,000 parts


def is_checksum_header(name: str) -> bool:
    """Whether ``name`` is one of an object's checksum headers."""
    return name.lower().startswith(PREFIX)


def served(headers: Mapping[str, str], etag: str) -> dict[str, str]:
    """The checksum headers S3 would send for the whole object (see the module docstring)."""
    lowered = {name.lower(): value for name, value in headers.items()}
    declared = lowered.get(TYPE, "").strip().upper()
    parts = _parts(etag.strip('"'))
    answer: dict[str, str] = {}
    for name, value in lowered.items():
        if by_header(name) is None:  # the type, the mode, or no checksum header at all
            continue
        kind, shown = _qualified(value.strip(), declared, parts)
        if shown is not None:
            answer[name] = shown
            if kind:
                answer[TYPE] = kind
    return answer


def _qualified(value: str, declared: str, parts: str | None) -> tuple[str, str | None]:
    """(type to send, '' for none; the value as S3 spells it, None: not to be served)."""
    if _parts(value) is not None:
        return COMPOSITE, value
    if declared == FULL_OBJECT:
        return FULL_OBJECT, value
    if declared == COMPOSITE:
        return COMPOSITE, f"{value}-{parts}" if parts else None
    if parts is None:  # one body: its checksum is the full object's
        return "", value
    return "", None


def _parts(value: str) -> str | None:
    match = _PARTS.search(value)
    return match.group(1) if match else None
