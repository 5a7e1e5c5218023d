"""What a dataset's HEAD answers share, interned once; what each object owns, packed small.

An S3 origin answers a HEAD with more than a key, size, ETag and time: its
content type, storage class, server-side encryption headers, a checksum type,
user metadata, and, asked for them (Hoard always asks), the object's own
checksums. Kept as an ``ObjectInfo`` with two dicts that costs ~1 KB an
object. But across a dataset almost all of it repeats: ten thousand JPEGs
share ``image/jpeg``, ``AES256`` and ``FULL_OBJECT``; only the checksum values
(and a version id, in a versioned bucket) are the object's own.

So an answer splits into a *shape*, everything that repeats, interned once
per table and named by a number, and a short *tail* of bytes per object:

  * each checksum header's value (``x-amz-checksum-crc32`` and its kind, not
    ``x-amz-checksum-type``, which repeats) as its base64-decoded bytes behind
    one length byte (a CRC32 is 5 bytes, not an 8-character string in a dict);
    a value that is not canonical base64 is kept as its UTF-8 text instead,
    flagged in the length byte, so every value comes back exactly as it went in;
  * the version id's UTF-8 bytes, last, when the shape says there is one.

A shape keeps the headers' order, with ``None`` where the tail holds the value.

Shapes are counted by use and forgotten at zero, so a header set that differs
per object (a per-object ``x-amz-meta-uuid``) costs its own shape while held
and nothing after: the table stays bounded by what it holds. Numbers are never
reused (a decoded-answer cache keyed by record bytes can then never mistake an
old shape for a new one).

NOT guaranteed: a tail value of 128 bytes or more, or a shape number past
``2**32 - 2``, does not pack (``None``): the caller keeps the answer unpacked.
Not thread-safe.
"""

from __future__ import annotations

import base64
import binascii
import sys
from dataclasses import dataclass

from gateway.origins.base import ObjectInfo

_CHECKSUM = "x-amz-checksum-"
_SHARED_CHECKSUM_HEADERS = frozenset(("x-amz-checksum-type",))  # repeats: part of the shape
_DECODED = 0x80  # a tail length byte's flag: the value is base64, stored decoded
LAST_NUMBER = 0xFFFF_FFFE  # numbers fit a uint32; 0xFFFFFFFF is the caller's own
_SHAPE_BYTES = 250  # a shape: the object, its tuples and a dict slot, beyond its text


@dataclass(frozen=True, slots=True)
class Shape:
    """The part of a HEAD answer that objects of one dataset share."""

    content_type: str
    storage_class: str
    headers: tuple[tuple[str, str | None], ...]  # None: the value is in the tail
    metadata: tuple[tuple[str, str], ...]
    versioned: bool

    def weight(self) -> int:
        """Bytes the shape holds, estimated (the table counts it once while used)."""
        text = sum(len(n) + len(v or "") for n, v in (*self.headers, *self.metadata))
        return _SHAPE_BYTES + 2 * text + len(self.content_type) + len(self.storage_class)


def split(info: ObjectInfo) -> tuple[Shape, bytes] | None:
    """``info``'s shape and tail, or ``None`` if a value is too long to pack."""
    headers: list[tuple[str, str | None]] = []
    tail = bytearray()
    for name, value in info.headers.items():
        if name.startswith(_CHECKSUM) and name not in _SHARED_CHECKSUM_HEADERS:
            packed = _pack_value(value)
            if packed is None:
                return None
            tail += packed
            headers.append((name, None))
        else:
            headers.append((name, value))
    if info.version_id is not None:
        tail += info.version_id.encode("utf-8", "surrogatepass")
    shape = Shape(info.content_type, info.storage_class, tuple(headers),
                  tuple(info.metadata.items()), info.version_id is not None)  # fmt: skip
    return shape, bytes(tail)


def join(shape: Shape, tail: bytes) -> tuple[dict[str, str], dict[str, str], str | None]:
    """The headers, metadata and version id that ``shape`` and ``tail`` stand for."""
    headers: dict[str, str] = {}
    at = 0
    for name, value in shape.headers:
        if value is None:
            value, at = _unpack_value(tail, at)
        headers[name] = value
    version_id = tail[at:].decode("utf-8", "surrogatepass") if shape.versioned else None
    return headers, dict(shape.metadata), version_id


class Shapes:
    """Interned shapes by number, counted by use; ``weight`` the bytes of those held."""

    def __init__(self) -> None:
        self.weight = 0
        self._numbers: dict[Shape, int] = {}
        self._shapes: dict[int, Shape] = {}
        self._uses: dict[int, int] = {}
        self._next = 0

    def __len__(self) -> int:
        return len(self._shapes)

    def use(self, shape: Shape) -> int | None:
        """The number of ``shape`` (interned now if new), its use counted; ``None``
        once numbers run out."""
        number = self._numbers.get(shape)
        if number is None:
            if self._next > LAST_NUMBER:
                return None
            number = self._next
            self._next += 1
            self._numbers[shape] = number
            self._shapes[number] = _interned(shape)
            self._uses[number] = 0
            self.weight += shape.weight()
        self._uses[number] += 1
        return number

    def release(self, number: int) -> None:
        """One use of ``number`` ended; the shape is forgotten with its last use."""
        self._uses[number] -= 1
        if self._uses[number] == 0:
            shape = self._shapes.pop(number)
            del self._uses[number], self._numbers[shape]
            self.weight -= shape.weight()

    def __getitem__(self, number: int) -> Shape:
        return self._shapes[number]


def _interned(shape: Shape) -> Shape:
    """``shape`` with its strings interned: answers parsed apart share one copy."""
    return Shape(
        sys.intern(shape.content_type),
        sys.intern(shape.storage_class),
        tuple((sys.intern(n), v) for n, v in shape.headers),
        shape.metadata,
        shape.versioned,
    )


def _pack_value(value: str) -> bytes | None:
    """One length byte and the value: base64 decoded when it round-trips exactly."""
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raw = None
    if raw is not None and base64.b64encode(raw).decode() == value and len(raw) < _DECODED:
        return bytes([_DECODED | len(raw)]) + raw
    text = value.encode("utf-8", "surrogatepass")
    return bytes([len(text)]) + text if len(text) < _DECODED else None


def _unpack_value(tail: bytes, at: int) -> tuple[str, int]:
    length = tail[at] & ~_DECODED
    raw = tail[at + 1 : at + 1 + length]
    if tail[at] & _DECODED:
        return base64.b64encode(raw).decode(), at + 1 + length
    return raw.decode("utf-8", "surrogatepass"), at + 1 + length
