"""A bundle's TAR read as it streams: ``(name, bytes)`` per member, in a few large reads.

Python's ``tarfile`` in stream mode (``r|``) reads a member as a ``TarInfo``
(every field decoded and checked, through layers made for archives of any
origin), then its bytes through ``extractfile`` in 16 KiB reads, each one a
call into the HTTP response, then the padding and the next header as reads
of their own. For a batch of small objects that per-member work, not the
bytes, is most of a client's CPU. A bundle's archive is simpler than what
``tarfile`` is built for: regular files, named, sized, back to back. So here
a member is three slices of one buffer: its 512-byte header (name, size,
type), its bytes, its padding to the next block.

The buffer is refilled with ``read1`` (whatever the connection has, up to
``chunk`` bytes: a 64 KiB chunk of the answer holds a dozen 4 KiB members),
so a member is never waited for past what it needs. A member's bytes that
reach past the buffer by more than ``LARGE`` are read with one exact
``read`` of the rest, straight from the response, not in pieces gathered
and then copied out again.

What is read: the ustar header (IEEE Std 1003.1-2001) with its ``prefix``
field; a size in octal or in base-256 (GNU, for sizes past 8 GiB); pax
extended headers (typeflag ``x``) with ``path`` and ``size`` records for the
member that follows, global ones (``g``) skipped; GNU long names (``L``).
Members of other types (directories, links) are skipped with their bytes;
a regular file is ``0``, ``7`` or the old ``NUL`` (unless its name ends in
``/``, a directory). The archive ends at the first zero block: the second
and whatever follows are the caller's to drain.

Not read: v7 archives (no ``ustar`` magic: ``TarFormatError``), checksums
(TCP and the chunked framing carry the bytes; the magic is checked so a
reader that lost its place says so instead of inventing members), sparse
files, pax ``hdrcharset`` (names are UTF-8, undecodable bytes kept as
surrogates, as ``tarfile`` keeps them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

BLOCK = 512
CHUNK = 256 * 1024  # most a buffer refill asks for
LARGE = 16 * 1024  # a member's bytes past the buffer by more than this: one exact read
_ZERO = bytes(BLOCK)
_REGULAR = frozenset(b"07\0")
_EXTENSIONS = frozenset(b"xgL")


class TarFormatError(ValueError):
    """The bytes are not a TAR this reader understands, or end mid-member."""


class TarStream:
    """Members of one archive, read from ``read1`` (up to n bytes, whatever is there)
    and ``read`` (exactly n bytes, fewer only at the end), as a response offers both."""

    def __init__(self, read1: Callable[[int], bytes], read: Callable[[int], bytes],
                 chunk: int = CHUNK) -> None:  # fmt: skip
        self._read1 = read1
        self._read = read
        self._chunk = chunk
        self._buffer = b""
        self._at = 0

    def __iter__(self) -> Iterator[tuple[str, bytes]]:
        extended: dict[str, str] = {}  # pax records for the next member
        while True:
            header = self._take(BLOCK)
            if header == _ZERO:
                return
            if len(header) < BLOCK:
                raise TarFormatError("the archive ends inside a header")
            if header[257:262] != b"ustar":
                raise TarFormatError("not a ustar header")
            size = _number(header[124:136])
            kind = header[156]
            if kind in _EXTENSIONS:
                records = self._member(size)
                if kind == 0x78:  # 'x': for the next member only
                    extended.update(_pax(records))
                elif kind == 0x4C:  # 'L': a GNU long name
                    extended["path"] = _text(records.split(b"\0", 1)[0])
                continue
            name = extended.pop("path", None) or _name(header)
            data = self._member(_number_text(extended.pop("size", None), size))
            extended.clear()
            if kind in _REGULAR and not (kind == 0 and name.endswith("/")):
                yield name, data

    def _member(self, size: int) -> bytes:
        """A member's ``size`` bytes, its padding skipped."""
        data = self._take(size)
        if len(data) < size:
            raise TarFormatError(f"the archive ends inside a member ({len(data)} of {size})")
        padding = -size % BLOCK
        if padding:
            self._take(padding)  # checked by the next header's magic
        return data

    def _take(self, count: int) -> bytes:
        """The next ``count`` bytes (fewer only where the stream ends)."""
        start = self._at
        end = start + count
        if end <= len(self._buffer):
            self._at = end
            return self._buffer[start:end]  # the whole buffer is itself, not a copy
        rest = self._buffer[start:]
        missing = count - len(rest)
        if missing > LARGE:  # a large member: the rest in one read, not in pieces
            self._buffer, self._at = b"", 0
            return rest + self._read(missing)
        parts = [rest]
        while missing > 0:
            got = self._read1(self._chunk)
            if not got:
                break
            parts.append(got)
            missing -= len(got)
        self._buffer = b"".join(parts)
        self._at = min(count, len(self._buffer))
        return self._buffer[: self._at]


def _number(field: bytes) -> int:
    """A numeric header field: octal digits (NUL or space ended), or base-256."""
    if field[0] & 0x80:  # GNU base-256: the rest of the field, big-endian
        if field[0] == 0xFF:
            raise TarFormatError("a negative size")
        return int.from_bytes(field[1:], "big")
    digits = field.split(b"\0", 1)[0].strip()
    try:
        return int(digits, 8) if digits else 0
    except ValueError:
        raise TarFormatError(f"a bad number field {field!r}") from None


def _number_text(text: str | None, otherwise: int) -> int:
    """A pax record's decimal number (the size past what the header holds), if any."""
    if text is None:
        return otherwise
    if not (text.isascii() and text.isdigit()):
        raise TarFormatError(f"a bad pax size {text!r}")
    return int(text)


def _name(header: bytes) -> str:
    name = header[:100].split(b"\0", 1)[0]
    if header[345]:  # ustar's prefix: the directory part of a name past 100 bytes
        name = header[345:500].split(b"\0", 1)[0] + b"/" + name
    return _text(name)


def _pax(records: bytes) -> dict[str, str]:
    """``"<length> <keyword>=<value>\\n"`` records; the length counts the whole record."""
    found: dict[str, str] = {}
    at = 0
    while at < len(records) and records[at] != 0:
        space = records.find(b" ", at)
        try:
            length = int(records[at:space])
        except ValueError:
            raise TarFormatError("a bad pax record") from None
        if space < 0 or length <= 0 or at + length > len(records):
            raise TarFormatError("a bad pax record")
        keyword, _, value = records[space + 1 : at + length - 1].partition(b"=")
        found[_text(keyword)] = _text(value)
        at += length
    return found


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")
