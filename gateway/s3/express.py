"""The express lane: a presigned hit answered again from its request's bytes alone.

A loader that reads through presigned URLs (a dataset's URLs signed once, for
an epoch or a job) sends, for each object, the very same bytes every time it
reads it. The hit path's first answer to those bytes decided everything they
decide: the route, the caller (the front's kept verdict on a presigned read),
the range, whether checksums are asked, and the header block rendered from the
object's metadata. Deciding it again, however memoised each step is, cost a
warm 4 KiB hit three times nginx's CPU: a parse into a request, a dozen memo
lookups keyed by its parts, the admission's bookkeeping. So the lane keeps the
answer's decisions keyed by the head's bytes, and a repeat of the bytes checks
only what can change between two repeats:

- the verdict: the credentials reloaded (``SIGHUP``: a key removed is refused
  from then on) or the URL expired (``S3Front.holds``);
- the object: ``Reader.held_now`` is asked as the hit path asks it (the node's
  invalidation journal caught up first, then the key's ticket: a write by any
  worker, a refresh or an eviction is seen), and its metadata must be the one
  the header block was rendered from;
- the block: looked up on every repeat (memory, or a disk record with its
  segment's trust check), and never kept here.

Anything else sends the bytes down the hit path, which answers them as if the
lane did not exist (and keeps its answer here again). Only presigned reads are
kept (``S3Front.kept_verdict``: no ``x-amz-*`` header, no ``Authorization``):
a header-signed request carries its own date and signature, so its bytes are
never sent twice by a client, and S3 checks each. The bytes are the key: two
heads with the same bytes are the same request, header for header. The lanes
are a hot set of ``hot.urls`` (oldest first out), as the verdicts are; a lane
holds no body, so an evicted block is freed as before.
"""

from __future__ import annotations

import asyncio
from typing import NamedTuple

from gateway.core.heads import Head
from gateway.origins.base import ObjectInfo
from gateway.pieces import FileSegment, Piece
from gateway.read.reader import Reader
from gateway.s3.front import S3Front, Verdict
from gateway.s3.hit_bytes import Span, part, status


class Lane(NamedTuple):
    """A hit's decisions, kept for a repeat of its bytes."""

    verdict: Verdict  # the presigned read's, from the front
    bucket: str
    key: str
    info: ObjectInfo  # the metadata the block was rendered from
    span: Span
    block: bytes  # status line and headers, up to the per-request ones
    dated: bool  # whether ``block`` holds the origin's Date
    status: int
    length: int  # the body's
    mount: str  # the mount's label, as requests are counted
    path: str  # decoded, as the access log shows it
    host: str


class Repeat(NamedTuple):
    """A repeat found valid: its lane, the body to send, the tier it came from."""

    lane: Lane
    piece: Piece
    tier: str


class ExpressLane:
    """Presigned hits' decisions keyed by their heads' bytes (see the module)."""

    def __init__(self, front: S3Front, reader: Reader) -> None:
        self._front = front
        self._reader = reader
        self._lanes: dict[bytes, Lane] = {}

    def __len__(self) -> int:
        return len(self._lanes)

    def keep(
        self, head: Head, host: str, mount: str, path: str, bucket: str, key: str,
        info: ObjectInfo, span: Span, block: bytes, dated: bool,
    ) -> None:  # fmt: skip
        """Keep the answer just sent to ``head`` (by the hit path, nothing awaited since)
        if a repeat of its bytes would be admitted by a kept verdict."""
        verdict = self._front.kept_verdict(head.method, host, head.path, head.headers)
        if verdict is None:
            return
        lanes = self._lanes
        lanes.pop(head.raw, None)
        lanes[head.raw] = Lane(verdict, bucket, key, info, span, block, dated,
                               *status(span, info.size), mount, path, host)  # fmt: skip
        if len(lanes) > self._front.hot.urls:
            del lanes[next(iter(lanes))]

    def repeat(self, head: bytes, transport: asyncio.Transport) -> Repeat | None:
        """The answer to ``head`` if it repeats a kept hit whose decisions all still hold;
        None: the hit path decides (see the module). The caller sends it, and releases a
        file's piece."""
        lane = self._lanes.get(head)
        if lane is None or transport.is_closing():
            return None
        if not self._front.holds(lane.verdict):  # never again: reloaded, or expired
            del self._lanes[head]
            return None
        try:
            held = self._reader.held_now(lane.bucket, lane.key)
        except Exception:  # the hit path asks again, and answers or hands on the error
            return None
        if isinstance(held, bool):
            return None
        info, whole, tier = held
        if info is not lane.info and info != lane.info:  # a new version: rendered anew
            if isinstance(whole, FileSegment):
                whole.release()
            del self._lanes[head]
            return None
        return Repeat(lane, part(whole, lane.span), tier)
