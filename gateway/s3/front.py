"""The S3 front door: route, authenticate, dispatch, and turn errors into S3 XML.

One handler per operation lives in ``buckets.py``, ``listing.py`` and
``objects.py``; this module only decides which one runs and how a failure
looks on the wire. Every response carries ``x-amz-request-id`` (added by the
server's prepare hook from ``request[keys.REQUEST_ID]``), and an answer Hoard
gives itself to a request with ``Origin`` the bucket's CORS headers (``cors.py``,
added by the same hook from ``request[keys.CORS]``).
"""

from __future__ import annotations

import functools
import logging
import re
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from typing import NamedTuple
from urllib.parse import unquote

from aiohttp import web
from aiohttp.http import HttpVersion11

from gateway.core import errors
from gateway.core.hot_sets import DEFAULT, Doorkeeper, HotSets
from gateway.obs import request_keys as keys
from gateway.read.reader import Reader
from gateway.s3 import buckets, cors, listing, objects, writes, xml
from gateway.s3.auth import (
    ANONYMOUS,
    Authenticator,
    MemoKey,
    PresignedMemo,
    Principal,
    needs_verifier,
)
from gateway.s3.body import BodySender
from gateway.s3.bundle.operation import bundle_objects
from gateway.s3.call import Call
from gateway.s3.errors import Code, S3Error, from_domain
from gateway.s3.passthrough import passthrough
from gateway.s3.routing import READS, Route, copy_source_bucket, route
from gateway.s3.signed_form import SignedParts
from gateway.s3.sigv4 import RequestView
from gateway.s3.sigv4_repeat import SignedRepeat
from gateway.write.writer import Writer

log = logging.getLogger(__name__)

Handler = Callable[[Call], Awaitable[web.StreamResponse]]

# Bucket names an SDK client (botocore) can send. Hoard's origin client is one, so a
# read of any other name (``a:b``) goes to an S3 origin as it is, for its own answer.
_SDK_BUCKET = re.compile(r"[a-zA-Z0-9.\-_]{1,255}")

HANDLERS: dict[str, Handler] = {
    "ListBuckets": buckets.list_buckets,
    "HeadBucket": buckets.head_bucket,
    "GetBucketLocation": buckets.get_bucket_location,
    "ListObjectsV2": listing.list_objects_v2,
    "ListObjects": listing.list_objects_v1,
    "HeadObject": objects.head_object,
    "GetObject": objects.get_object,
    "BundleObjects": bundle_objects,
}


@functools.lru_cache(maxsize=4096)  # a pure memo: presigned URLs come back every epoch
def _query_pairs(raw_query: str) -> tuple[tuple[str, str], ...]:
    """``parse_qsl(raw_query, keep_blank_values=True)``, pair for pair, without its
    per-part work on parts with nothing to decode (most of a presigned URL's): a URL
    not kept is parsed on every read of a dataset larger than the memo."""
    pairs = []
    for part in raw_query.split("&"):
        if part:
            name, _, value = part.partition("=")
            pairs.append((_form_decoded(name), _form_decoded(value)))
    return tuple(pairs)


def _form_decoded(text: str) -> str:
    """A query part decoded as ``parse_qsl`` decodes it ('+' is a space)."""
    if "%" in text or "+" in text:
        return _form_decoded_escaped(text)
    return text


@functools.lru_cache(maxsize=1024)  # pure: every URL a client presigns has its Credential
def _form_decoded_escaped(text: str) -> str:
    return unquote(text.replace("+", " "), errors="replace")


_MUTATING = frozenset(("PUT", "POST", "DELETE"))


class _Line(NamedTuple):
    """What a request line decides before its caller is known (``S3Front._line_of``)."""

    route: Route
    query: tuple[tuple[str, str], ...]
    mount: str  # the ``mount`` metric label
    served: bool | None  # answered by Hoard itself (not forwarded); None: ask ``_served``


def request_view(request: web.Request) -> RequestView:
    raw_path, _, raw_query = request.raw_path.partition("?")
    return RequestView(request.method, raw_path, raw_query, request.headers)


class Verdict(NamedTuple):
    """A presigned read's kept verdict: who checked it, with which credentials, until when."""

    auth: Authenticator
    generation: int  # the credentials' generation it was checked with
    expires: float  # on the authenticator's clock


class Signer(NamedTuple):
    """Who SigV4 header-signed a request, and the credentials' generation it was checked
    in (a reload may change what the key may read)."""

    access_key: str
    generation: int


class S3Front:
    def __init__(
        self,
        reader: Reader,
        writer: Writer,
        auth: Authenticator,
        domains: list[str],
        body: BodySender,
        body_idle: float,
        hot: HotSets = DEFAULT,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._body = body
        self._auth = auth
        self._domains = domains
        self._body_idle = body_idle
        # Routes memoised by request line, a hot set of ``hot.urls`` (a refused route raises
        # and is not kept). A memo pays only for lines that come back soon (a hot object's
        # GETs); a miss costs ~5 us. Each entry holds ~0.5 KB, and every new key or missing
        # one adds one: at 65,536 a load of fresh keys grew each worker by ~30 MB beyond its
        # configured tiers (issue 34's soak: RSS +13 MiB/min), at the default 4,096 ~2 MB.
        self._hot = hot  # how many URLs' routes and verdicts are kept (``core/hot_sets.py``)
        self._line = functools.lru_cache(maxsize=hot.urls)(self._line_of)
        # (method, host, target) -> a presigned read's line, caller and verdict
        # (``_kept_read``): a hot set, as the routes.
        self._reads: OrderedDict[tuple[str, str, str], tuple[_Line, Principal, Verdict]] = (
            OrderedDict()
        )
        self._reads_door = Doorkeeper(hot.urls)  # what a full set of them takes in

    @property
    def reader(self) -> Reader:
        return self._reader

    @property
    def presigned_verdicts(self) -> PresignedMemo:
        """The presigned URLs' verdicts kept (``auth.PresignedMemo``)."""
        return self._auth.presigned

    @property
    def routes_kept(self) -> int:
        """Routes memoised now (at most ``hot.urls``)."""
        return self._line.cache_info().currsize

    @property
    def hot(self) -> HotSets:
        """The hot sets' bounds, for the hit path's own (``hits.py``)."""
        return self._hot

    @property
    def body(self) -> BodySender:
        return self._body

    @property
    def credentials_generation(self) -> int:
        """Changes at every reload of the credentials (SIGHUP)."""
        return self._auth.generation

    async def handle(self, request: web.Request) -> web.StreamResponse:
        request_id: str = request[keys.REQUEST_ID]
        try:
            return await self._dispatch(request, request_id)
        except S3Error as exc:
            return self._error(request, exc)
        except errors.HoardError as exc:
            return self._error(request, from_domain(exc))
        except Exception:
            # A bug must still answer S3 XML with the request id, so it can be traced.
            log.exception("unhandled error, request %s", request_id)
            return self._error(request, S3Error(Code.InternalError))

    async def _dispatch(self, request: web.Request, request_id: str) -> web.StreamResponse:
        call, served = self.admit(request, request_id)
        writes.refuse_declared_too_large(call)  # S3's EntityTooLarge comes before any 100
        await send_continue(request)  # admitted: now the client may send its body
        if served and "Origin" in request.headers:  # a browser's: added to any answer
            request[keys.CORS] = await cors.answer_headers(call)
        handler = HANDLERS[call.route.operation] if served else passthrough
        return await handler(call)

    def admit(self, request: web.Request, request_id: str) -> tuple[Call, bool]:
        """Route and authenticate ``request``: the call for its handler, and whether Hoard
        answers it itself (else it goes to the origin as it is). ``S3Error`` if refused.

        The hit path (``hits.py``) admits requests here too, so both paths check
        the same signatures and the same per-key limits.
        """
        line, principal = self._kept_read(request) or self._checked(request)
        found = line.route
        request[keys.OPERATION] = found.operation
        request[keys.BUCKET] = found.bucket
        request[keys.MOUNT] = line.mount
        query = dict(line.query) if line.query else {}  # a handler's own: never the memo's
        call = Call(request, found, query, principal, self._reader, request_id, self._body,
                    self._writer, self._body_idle)  # fmt: skip
        return call, (line.served if line.served is not None else self._served(found))

    def _checked(self, request: web.Request) -> tuple[_Line, Principal]:
        """The line and the verified caller of ``request``, checked in full (a presigned
        read's verdict is then kept: ``_kept_read``)."""
        method = request.method
        raw_path, _, raw_query = request.raw_path.partition("?")
        copy_source = request.headers.get("x-amz-copy-source")
        line = self._line(method, request.host, raw_path, raw_query, copy_source is not None)
        found = line.route
        if method == "OPTIONS":
            # A CORS preflight is never signed (browsers send none): the bucket's CORS
            # rules at the origin answer it, as S3 does.
            cors.checked_preflight(request.headers)
            return line, ANONYMOUS
        principal = request.get(keys.PRINCIPAL)
        memo_key: MemoKey | None = None
        if principal is None:
            view = RequestView(method, raw_path, raw_query, request.headers)
            memo_key = self._auth.presigned.key(view)
            principal = request[keys.PRINCIPAL] = self._auth.authenticate_as(view, memo_key)
        if principal.anonymous and not found.served:
            # Anonymous reads are object reads and listings Hoard answers itself, never
            # an ACL, version, upload or tagging read fetched with Hoard's credentials.
            raise S3Error(Code.AccessDenied)
        mutating = method in _MUTATING and found.operation not in READS
        principal.authorize(found.bucket, mutating=mutating)
        if copy_source is not None:  # a copy also reads its source: may this caller?
            principal.authorize(copy_source_bucket(copy_source), mutating=False)
        elif memo_key is not None and not principal.anonymous:
            self._keep_read(request, memo_key, line, principal)
        return line, principal

    def _kept_read(self, request: web.Request) -> tuple[_Line, Principal] | None:
        """What admitting this very request decided before (its line, its caller), if that
        still holds: a presigned read's verdict, kept until the URL expires or the
        credentials are reloaded, for a request carrying no ``x-amz-*`` header (which its
        signature would have to cover) and no ``Authorization``."""
        key = (request.method, request.host, request.raw_path)
        kept = self._reads.get(key)
        if kept is None or keys.PRINCIPAL in request:
            return None
        line, principal, verdict = kept
        if not self.holds(verdict):
            del self._reads[key]
            return None
        if needs_verifier(request.headers):
            return None
        self._reads.move_to_end(key)
        request[keys.PRINCIPAL] = principal
        return line, principal

    def kept_verdict(
        self, method: str, host: str, raw_path: str, headers: Iterable[str]
    ) -> Verdict | None:
        """The kept verdict (``_kept_read``) a repeat of this very request would be admitted
        by, for a memo of its answer (``express.py``); None: a repeat is checked anew."""
        kept = self._reads.get((method, host, raw_path))
        if kept is None or needs_verifier(headers):
            return None
        return kept[2]

    def signer_of(self, principal: Principal) -> Signer | None:
        """Who SigV4 header-signed a request ``principal`` was verified as, with the
        credentials' generation (``express.py`` keeps its answer under it); None: not
        such a request (anonymous, presigned, SigV2)."""
        context = principal.context
        if principal.access_key is None or context is None or context.presigned:
            return None
        return Signer(principal.access_key, self._auth.generation)

    def verified(
        self, view: RequestView, parts: SignedParts
    ) -> tuple[Signer, SignedRepeat | None] | None:
        """``view``'s caller verified as ``admit`` verifies it (signature, date, skew), as
        ``signer_of`` names it, and the check of its repeats (``signed_again``); None:
        refused, or not header-signed (``admit`` answers). ``parts``: its signed parts."""
        signed = self._auth.header_signer(view, parts)
        if signed is None:
            return None
        return Signer(signed[0], self._auth.generation), signed[1]

    def signed_again(self, signer: Signer, check: SignedRepeat, parts: SignedParts) -> bool:
        """Whether a repeat (``parts``) of a request ``verified`` as by ``signer``, and
        which left ``check``, is signed by the same key now, with no reload since;
        False: not decided here (``verified`` decides)."""
        auth = self._auth
        return signer.generation == auth.generation and check.verifies(parts, auth.now())

    def holds(self, verdict: Verdict) -> bool:
        """Whether ``verdict`` still admits its request (``_kept_read``, ``express.py``): the
        same credentials (no reload since) and the URL not expired."""
        auth = verdict.auth
        return (
            auth is self._auth
            and verdict.generation == auth.generation
            and (auth.now() <= verdict.expires)
        )

    def _keep_read(
        self, request: web.Request, memo_key: MemoKey, line: _Line, principal: Principal
    ) -> None:
        """Keep the verdict on a presigned read (``_kept_read``), as the presigned memo
        keeps it under ``memo_key`` (``PresignedMemo.key``: reads only, only ``host``
        signed, no ``x-amz-*``)."""
        key = (request.method, request.host, request.raw_path)
        if self._reads_door.refuses(key, self._reads, self._hot.urls):
            return
        expires = self._auth.presigned.expiry(memo_key)
        if expires is None:
            return
        self._reads[key] = (line, principal, Verdict(self._auth, self._auth.generation, expires))
        self._reads.move_to_end(key)
        if len(self._reads) > self._hot.urls:
            self._reads.popitem(last=False)

    def _line_of(self, method: str, host: str, raw_path: str, raw_query: str, copy: bool) -> _Line:
        """What the request line alone decides (pure in its arguments, for the process's
        life: the namespace and the origins' capabilities are fixed at start; memoised as
        ``_line``): the route, the query, the mount label, whether Hoard answers it."""
        query = _query_pairs(raw_query) if raw_query else ()
        found = route(method, host, raw_path, dict(query), self._domains, copy)
        try:
            served: bool | None = self._served(found)
        except errors.HoardError:  # raised after the caller is verified, as it always was
            served = None
        return _Line(found, query, self._reader.mount_label(found.bucket), served)

    def _served(self, found: Route) -> bool:
        """Whether Hoard answers ``found`` itself; else it goes to the origin as it is."""
        return found.served and (
            not found.bucket
            or _SDK_BUCKET.fullmatch(found.bucket) is not None
            or not self._writer.forwards(found.bucket)
        )

    def _error(self, request: web.Request, exc: S3Error) -> web.StreamResponse:
        request[keys.ERROR_CODE] = exc.code.name
        if exc.code is Code.NotModified:
            return web.Response(status=304, headers=exc.headers)
        if exc.status >= 500 and exc.code is not Code.NotImplemented:
            # A server's failure; a 501 is the client's ask this gateway does not serve.
            log.warning("%s %r: %s", request.method, request.path, exc.message)
        fields = dict(exc.fields)
        fields.setdefault("Resource", request.path)
        if exc.code is Code.InvalidRange:
            fields["RangeRequested"] = request.headers.get("Range", "")
        if request.method == "HEAD":
            # A HEAD answer has no body, so the code travels in its status only; the
            # type is still the one a GET's error body would have, as S3 sends it.
            return web.Response(
                status=exc.status, headers=exc.headers, content_type="application/xml"
            )
        body = xml.error(exc.code.name, exc.message, request[keys.REQUEST_ID], fields)
        response = web.Response(
            status=exc.status, body=body, headers=exc.headers, content_type="application/xml"
        )
        if _expects_continue(request) and not request.get(keys.CONTINUED):
            # The client holds its body back for a 100 it will not get: without a close,
            # whether it sends the body anyway is unknown, and so is where its next request
            # starts (RFC 9110 §15.2.1: the server says whether it reads on or closes).
            response.force_close()
        return response


def _expects_continue(request: web.BaseRequest) -> bool:
    return (
        request.version == HttpVersion11
        and request.headers.get("Expect", "").lower() == "100-continue"
    )


async def send_continue(request: web.BaseRequest) -> None:
    """Answer ``Expect: 100-continue`` with ``100 Continue``, once, when the request may go on.

    Not before: RFC 9110 §10.1.1 lets a server answer a request it refuses (a bad
    signature, an anonymous write) with its final status at once, and S3 does, so
    a refused client never sends a body only for it to be thrown away.
    """
    if _expects_continue(request) and not request.get(keys.CONTINUED):
        request[keys.CONTINUED] = True
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the answer's own bytes are still to come
