"""TAR member headers, built by hand: 512 bytes per object, or 1,536 for a long name.

``tarfile`` builds a ``TarInfo`` per member, checks and encodes each field
through layers made for archives of any origin, and wants a file object to
copy from; a bundle of 5,000 small objects would pay that 5,000 times for
headers that differ only in name, size and time. Here a header is a bytes
template filled in with ``struct``-free slicing: the POSIX ustar layout
(IEEE Std 1003.1-2001, "pax Interchange Format"), typeflag ``'0'`` (a
regular file: Python's reader turns the older ``'\\0'`` with a name ending
in ``/`` into a directory, and ``extractfile`` then gives nothing), mode
0644, uid/gid 0, mtime the object's Last-Modified.

A name that ustar cannot carry (longer than 100 bytes, or not ASCII) gets a
pax extended header first (typeflag ``'x'``) with a UTF-8 ``path`` record,
which every reader the bundle's clients use (Python's ``tarfile``, GNU and
BSD tar, Go's ``archive/tar``) applies to the member that follows; the
member's own name field then holds an ASCII stand-in, cut to fit. A size
past ustar's 11 octal digits (8 GiB) goes in a ``size`` record the same way.

After each member's data come zero bytes to the next 512-byte boundary
(``padding``), and after the last member two zero blocks (``END``). Nothing
here knows about HTTP or objects: names, sizes and times in, bytes out.
"""

from __future__ import annotations

from collections.abc import Iterable

BLOCK = 512
END = bytes(2 * BLOCK)  # end of archive: two zero blocks
_MAX_OCTAL = 8**11 - 1  # what a 12-byte ustar number field holds (size, mtime)
_PAX_NAME = b"././@PaxHeader"  # the name Python's tarfile gives extended headers too

# A ustar header, all fields fixed but name (0:100), size (124:136), mtime
# (136:148), typeflag (156) and the checksum (148:156), filled in per member.
_TEMPLATE = bytearray(BLOCK)
_TEMPLATE[100:108] = b"0000644\0"  # mode
_TEMPLATE[108:116] = b"0000000\0"  # uid
_TEMPLATE[116:124] = b"0000000\0"  # gid
_TEMPLATE[257:265] = b"ustar\x0000"  # magic and version
_TEMPLATE[329:337] = b"0000000\0"  # devmajor
_TEMPLATE[337:345] = b"0000000\0"  # devminor
_TEMPLATE[148:156] = b"        "  # the checksum counts its own field as spaces
_TEMPLATE_BYTES = bytes(_TEMPLATE)
# The checksum is the sum of the header's bytes: the template's (zeros where name, size,
# mtime and typeflag go), plus those fields' own, summed per member (not all 512 bytes).
_TEMPLATE_SUM = sum(_TEMPLATE_BYTES)
_MODES = _TEMPLATE_BYTES[100:124]  # mode, uid, gid: between the name and the size
_TAIL = _TEMPLATE_BYTES[157:]  # after the typeflag: magic, version, devices, zeros


def member(name: str, size: int, mtime: int) -> bytes:
    """The header (pax extended header first, if needed) of a regular file ``name``."""
    encoded = name.encode("utf-8")
    records = b""
    if len(encoded) > 100 or not encoded.isascii():
        records += _record("path", encoded)
        encoded = encoded.decode("ascii", "replace").encode("ascii", "replace")[:100]
    if size > _MAX_OCTAL:
        records += _record("size", str(size).encode())
    mtime = min(max(0, mtime), _MAX_OCTAL)  # before 1970, or after the year 4147
    if not records:
        return _header(encoded, size, mtime, b"0")
    extended = _header(_PAX_NAME, len(records), mtime, b"x")
    return (
        extended
        + records
        + padding(len(records))
        + _header(encoded, min(size, _MAX_OCTAL), mtime, b"0")
    )


def archive_length(members: Iterable[tuple[str, int]]) -> int:
    """The bytes of an archive of regular files ``(name, size)``, END included: what
    ``member``, the data and ``padding`` of each, then ``END``, add up to."""
    return len(END) + sum(_header_length(name, size) + size + (-size % BLOCK)
                          for name, size in members)  # fmt: skip


def _header_length(name: str, size: int) -> int:
    """``len(member(name, size, mtime))``, whatever the mtime: one block, unless pax."""
    if size <= _MAX_OCTAL and len(name) <= 100 and name.isascii():
        return BLOCK
    return len(member(name, size, 0))


def padding(size: int) -> bytes:
    """Zero bytes from the end of ``size`` bytes of data to the next block boundary."""
    return bytes(-size % BLOCK)


def _header(name: bytes, size: int, mtime: int, typeflag: bytes) -> bytes:
    numbers = b"%011o\0%011o\0" % (size, mtime)
    checksum = b"%06o\0 " % (_TEMPLATE_SUM + sum(name) + sum(numbers) + typeflag[0])
    # The template's fixed parts around the fields, joined once (not a 512-byte copy
    # patched field by field: about half the time a header took).
    return b"".join((name.ljust(100, b"\0"), _MODES, numbers, checksum, typeflag, _TAIL))


def _record(keyword: str, value: bytes) -> bytes:
    """One pax record, ``"<length> <keyword>=<value>\\n"``; the length counts itself."""
    body = b" " + keyword.encode() + b"=" + value + b"\n"
    length = len(body) + 1
    while len(str(length)) + len(body) != length:
        length += 1
    return str(length).encode() + body
