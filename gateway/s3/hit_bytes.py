"""What a hit writes: its header block's per-request lines, the bytes of its range, the send.

Shared by the two ways a hit is answered (``hits.py``, the hit path, and
``express.py``, a presigned hit answered again from its bytes), so both send
the same bytes: what one of them writes the other writes too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from email.utils import formatdate

from gateway.pieces import FileSegment, Piece
from gateway.s3.body import write_segment_now

Span = tuple[int, int] | None  # the inclusive bytes a range selects; None: the whole object


def tail(dated: bool, second: int, request_id: str) -> bytes:
    """The lines set per request, after the object's own (``Date`` unless the object's
    headers hold the origin's, ``dated``), and the head's end."""
    now = "" if dated else date_line(second)
    return (f"{now}Server: Hoard\r\nx-amz-request-id: {request_id}\r\n"
            f"x-amz-id-2: {request_id}\r\n\r\n").encode()  # fmt: skip


@functools.lru_cache(maxsize=2)  # pure: every hit of a second shares its line
def date_line(second: int) -> str:
    """The ``Date`` line of the answers sent during ``second`` (seconds since the epoch)."""
    return f"Date: {formatdate(second, usegmt=True)}\r\n"


def part(piece: Piece, span: Span) -> Piece:
    """The bytes of ``span`` of a whole object's ``piece`` (memory: a view, not a copy)."""
    if span is None:
        return piece
    start, end = span
    if isinstance(piece, FileSegment):
        return dataclasses.replace(piece, offset=piece.offset + start, count=end - start + 1)
    return memoryview(piece)[start : end + 1]


def status(span: Span, size: int) -> tuple[int, int]:
    """The answer's status and body length."""
    return (200, size) if span is None else (206, span[1] - span[0] + 1)


def write_now(transport: asyncio.Transport, sockfd: int | None, head: bytes, piece: Piece) -> None:
    """Headers and body, without an await: memory bytes in one ``writelines``; a disk
    record after its headers as far as sendfile takes it now, the rest read and queued,
    in order (``body.write_segment_now``). The caller releases a file's piece."""
    if isinstance(piece, FileSegment):
        transport.write(head)
        write_segment_now(transport, sockfd, piece)
    else:
        transport.writelines((head, piece))
