"""The express lane: a hit answered again from its request's bytes alone.

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
- the block: the key's ticket's loan (``Reader.held_again``: a memory block
  lends its bytes exactly while the tier holds them) or lease (a packed record
  on disk, lent again while its segment and fingerprint are the ones it was
  checked under), or else looked up (memory, or a disk record with its
  segment's trust check); never kept here.

Anything else sends the bytes down the hit path, which answers them as if the
lane did not exist (and keeps its answer here again). The bytes are the key:
two heads with the same bytes are the same request, header for header.

A header-signed request (SigV4 ``Authorization``: boto3, s3fs,
s3torchconnector) is never sent twice with the same bytes: its date, its
signature and an SDK's invocation id change every time. Its lane is keyed by
its *signed form*, the head without those lines (``signed_form.py``), which is the
same for every read of an object by one client; and every repeat's signature is
verified as the front verifies any (``S3Front.verified``: the key, the date's
skew, the canonical request of this very head), and must be by the same access
key in the same credentials' generation as the answer kept (a reload may change
what a key may read). The lines left out decide nothing but who signed: the
route, the range and the rest are the form's, byte for byte.

The lanes are a hot set of ``hot.urls`` (oldest first out; once full, a new
one taken in on its second sight: ``core/hot_sets.py``), as the verdicts are;
a lane holds no body, so an evicted block is freed as before.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import NamedTuple

from gateway.core.heads import Head, parse_head
from gateway.core.hot_sets import Doorkeeper
from gateway.origins.base import ObjectInfo
from gateway.pieces import FileSegment, Piece
from gateway.read.reader import Reader
from gateway.read.tickets import Ticket
from gateway.s3.auth import Principal
from gateway.s3.front import S3Front, Signer, Verdict
from gateway.s3.hit_bytes import Span, part, status
from gateway.s3.signed_form import signed_parts
from gateway.s3.signing import RequestView
from gateway.s3.sigv4_repeat import SignedRepeat


class Lane(NamedTuple):
    """A hit's decisions, kept for a repeat of its bytes."""

    caller: Verdict | Signer  # a presigned read's kept verdict, or who header-signed it
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
    ticket: Ticket | None  # the read layer's, for ``Reader.held_again``
    check: SignedRepeat | None = None  # a header-signed one's, from its first repeat


# A repeat found valid: its lane, the body to send, the tier it came from (a plain tuple:
# a NamedTuple is built by a Python-level ``__new__``, ~2,000 instructions a repeat).
Repeat = tuple[Lane, Piece, str]


class ExpressLane:
    """Hits' decisions keyed by their heads' bytes, or signed forms (see the module)."""

    def __init__(self, front: S3Front, reader: Reader) -> None:
        self._front = front
        self._reader = reader
        self._lanes: OrderedDict[bytes, Lane] = OrderedDict()
        self._door = Doorkeeper(front.hot.urls)  # what a full set of lanes takes in

    def __len__(self) -> int:
        return len(self._lanes)

    def keep(
        self, head: Head, principal: Principal, host: str, mount: str, path: str, bucket: str,
        key: str, info: ObjectInfo, span: Span, block: bytes, dated: bool,
    ) -> None:  # fmt: skip
        """Keep the answer just sent to ``head`` (by the hit path, nothing awaited since)
        for ``caller``: by its bytes if a repeat of them would be admitted by a kept
        verdict (presigned), by its signed form if SigV4 header-signed it."""
        caller: Verdict | Signer | None = self._front.kept_verdict(head.method, host, head.path,
                                                                  head.headers)  # fmt: skip
        name: bytes | None = head.raw
        if caller is None:
            caller, parts = self._front.signer_of(principal), signed_parts(head.raw)
            if caller is None or parts is None:
                return
            name = parts[0]
        lanes = self._lanes
        if self._door.refuses(name, lanes, self._front.hot.urls):
            return
        lanes.pop(name, None)
        ticket = self._reader.ticket(bucket, key)
        lanes[name] = Lane(caller, bucket, key, info, span, block, dated,
                           *status(span, info.size), mount, path, host,
                           ticket if ticket is not None and ticket.info is info else None)  # fmt: skip
        if len(lanes) > self._front.hot.urls:
            lanes.popitem(last=False)

    def repeat(self, head: bytes, transport: asyncio.Transport) -> Repeat | None:
        """The answer to ``head`` if it repeats a kept hit whose decisions all still hold;
        None: the hit path decides (see the module). The caller sends it, and releases a
        file's piece."""
        name: bytes | None = head
        lane = self._lanes.get(head)
        if lane is None or type(lane.caller) is not Verdict:  # (a signed form is no head)
            name, lane = self._signed(head)
            if name is None or lane is None:
                return None
        elif not self._front.holds(lane.caller):
            del self._lanes[head]  # never again: reloaded, or expired
            return None
        if transport.is_closing():
            return None
        ticket = lane.ticket
        if ticket is not None:  # the whole object lent by memory or leased on disk
            held = self._reader.held_again(ticket, lane.bucket, lane.key)
            if held is not None:
                return lane, part(held, lane.span), "memory" if type(held) is bytes else "disk"
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
            self._lanes.pop(name, None)
            return None
        return lane, part(whole, lane.span), tier

    def _signed(self, head: bytes) -> tuple[bytes | None, Lane | None]:
        """A header-signed ``head``'s signed form and lane, if it has one and its signature
        is verified as the front verifies every one (date, skew, key) by the lane's key:
        from its signed parts by the check the lane learned (``sigv4_repeat.py``), else in
        full, learning it."""
        parts = signed_parts(head)
        lane = None if parts is None else self._lanes.get(parts[0])
        if lane is None or parts is None:
            return None, None
        caller, check = lane.caller, lane.check
        if check is not None and self._front.signed_again(caller, check, parts):  # type: ignore[arg-type]
            return parts[0], lane
        message = parse_head(head)
        if message is None:
            return None, None
        raw_path, _, raw_query = message.path.partition("?")
        view = RequestView(message.method, raw_path, raw_query, message.headers)
        verified = self._front.verified(view, parts)
        if verified is None or verified[0] != caller:  # a bad one: the hit path answers it
            return None, None
        if verified[1] is not check:
            lane = self._lanes[parts[0]] = lane._replace(check=verified[1])
        return parts[0], lane
