"""A bundle's TAR read as it streams: ``(name, bytes)`` per member, each in one exact read.

Python's ``tarfile`` in stream mode (``r|``) reads a member as a ``TarInfo``
(every field decoded and checked, through layers made for archives of any
origin), then its bytes through ``extractfile`` in 16 KiB reads, each one a
call into the HTTP response, then the padding and the next header as reads
of their own. For a batch of small objects that per-member work, not the
bytes, is most of a client's CPU. A bundle's archive is simpler than what
``tarfile`` is built for: regular files, named, sized, back to back. So here
a member is two reads: its 512-byte header (with the previous member's
padding before it), then exactly its bytes.

``read(n)`` is the HTTP response's: n bytes, fewer only where the answer
ends. A member's bytes are the ``bytes`` that one call returns, filled by
the connection with no copy in between (``http.client`` reads a large
answer straight into the object it returns); small reads are served from
the response's own buffer. A member is never waited for past what it needs.

What is read: the ustar header (IEEE Std 1003.1-2001) with its ``prefix``
field; a size in octal or in base-256 (GNU, for sizes past 8 GiB); pax
extended headers (typeflag ``x``) with ``path`` and ``size`` records for the
member that follows, global ones (``g``) skipped; GNU long names (``L``).
Members of other types (directories, links) are skipped with their bytes;
a regular file is ``0``, ``7`` or the old ``NUL`` (unless its name ends in
``/``, a directory). The archive ends at the first zero block: the second
and whatever follows are the caller's to drain. An archive that ends
anywhere else (inside a header, inside a member, or between two members:
a cut connection) is a ``TarFormatError``, never a shorter archive.

Not read: v7 archives (no ``ustar`` magic: ``TarFormatError``), checksums
(TCP and the HTTP framing carry the bytes; the magic is checked so a reader
that lost its place says so instead of inventing members), sparse files, pax
``hdrcharset`` (names are UTF-8, undecodable bytes kept as surrogates, as
``tarfile`` keeps them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

BLOCK = 512
_ZERO = bytes(BLOCK)
_REGULAR = frozenset(b"07\0")
_EXTENSIONS = frozenset(b"xgL")


class TarFormatError(ValueError):
    """The bytes are not a TAR this reader understands, or end mid-archive."""


class TarStream:
    """Members of one archive, read with ``read`` (exactly n bytes, fewer only at
    the end), as an HTTP response offers it."""

    def __init__(self, read: Callable[[int], bytes]) -> None:
        self._read = read

    def __iter__(self) -> Iterator[tuple[str, bytes]]:
        extended: dict[str, str] = {}  # pax records for the next member
        padding = 0  # the previous member's, read with the next header
        while True:
            header = self._header(padding)
            if header == _ZERO:
                return
            if header[257:262] != b"ustar":
                raise TarFormatError("not a ustar header")
            size = _number(header[124:136])
            kind = header[156]
            if kind in _EXTENSIONS:
                records = self._exactly(size)
                if kind == 0x78:  # 'x': for the next member only
                    extended.update(_pax(records))
                elif kind == 0x4C:  # 'L': a GNU long name
                    extended["path"] = _text(records.split(b"\0", 1)[0])
                padding = -size % BLOCK
                continue
            name = extended.pop("path", None) or _name(header)
            size = _number_text(extended.pop("size", None), size)
            data = self._exactly(size)
            padding = -size % BLOCK
            extended.clear()
            if kind in _REGULAR and not (kind == 0 and name.endswith("/")):
                yield name, data

    def _header(self, padding: int) -> bytes:
        """The next header block, after ``padding`` bytes that are skipped."""
        got = self._read(padding + BLOCK)
        if len(got) < padding + BLOCK:
            raise TarFormatError("the archive ends before its end (inside or before a header)")
        return got[padding:] if padding else got

    def _exactly(self, size: int) -> bytes:
        if size == 0:
            return b""
        data = self._read(size)
        if len(data) < size:
            raise TarFormatError(f"the archive ends inside a member ({len(data)} of {size})")
        return data


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
