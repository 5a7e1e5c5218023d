"""CORS: the preflights Hoard passes on, and the headers of the answers it gives itself.

Preflights. A browser's preflight is never signed, so no caller's limits can apply
to it: Hoard answers it as S3 does, from the bucket's CORS rules at the origin, and
lets nothing else of the request through. S3 takes a preflight only with an
``Origin`` and an ``Access-Control-Request-Method`` header and refuses it otherwise
(400 BadRequest); Hoard refuses it the same way before anything reaches the origin.
What travels on is those two headers and ``Access-Control-Request-Headers``: no
query (an OPTIONS with ``?acl`` is still only a preflight) and no other client
header, since the forward goes out under Hoard's own credentials.

Actual requests. A GET or HEAD that Hoard answers itself (objects, listings, bucket
reads) from a browser carries ``Origin``, and S3 answers it, whatever its status,
with the CORS headers of the bucket's first matching rule (``cors_rules.py``).
``answer_headers`` finds them: the bucket's rules come from the origin's
GetBucketCors, held for the mount's metadata TTL and asked once however many ask
(``metadata/bucket_config.py``), forgotten when a write of the bucket goes through
Hoard. The S3 front notes them on the request and the server's prepare hook adds
them to whatever answer goes out, an error's too. A request without ``Origin``
pays nothing (the hit path leaves one with it to the general path).

A directory (posix origin) keeps no CORS rules: its preflight is refused (403
CORSResponse, ``writes.py``) and its answers carry no CORS headers.

NOTE: a request refused before it is admitted (a bad signature, a denied bucket)
gets no CORS headers, where S3 may add them: finding them would let an
unauthenticated client make Hoard ask the origin about any bucket name. A
browser then sees a network error instead of the 403.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from functools import partial

from gateway.core import errors
from gateway.s3 import cors_rules
from gateway.s3.call import Call
from gateway.s3.chunked import read_whole
from gateway.s3.cors_rules import NO_RULES, CorsRules
from gateway.s3.errors import Code, S3Error

log = logging.getLogger(__name__)

_PASSED_ON = ("Origin", "Access-Control-Request-Method", "Access-Control-Request-Headers")
_ANSWERED = frozenset({"GET", "HEAD"})  # the methods of the reads Hoard answers itself
_NOT_CONFIGURED = frozenset({404})  # NoSuchCORSConfiguration (or no such bucket): no rules


def checked_preflight(headers: Mapping[str, str]) -> None:
    """Refuse a preflight S3 would refuse, with S3's messages."""
    if not headers.get("Origin"):
        raise S3Error(Code.BadRequest, "Insufficient information. Origin request header needed.")
    if not headers.get("Access-Control-Request-Method"):
        raise S3Error(Code.BadRequest, "Invalid Access-Control-Request-Method: null")


def preflight_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The only client headers a preflight carries to the origin."""
    return {name: headers[name] for name in _PASSED_ON if name in headers}


async def answer_headers(call: Call) -> dict[str, str]:
    """The CORS headers of Hoard's own answer to ``call`` (of any status), as S3 adds
    them; none without an ``Origin``, for a method or bucket no rule names, or while
    the bucket's rules cannot be learned (the read itself is still answered)."""
    request = call.request
    origin = request.headers.get("Origin")
    if not origin or request.method not in _ANSWERED or not call.route.bucket:
        return {}
    try:
        rules = await call.reader.bucket_config(call.bucket, "cors", partial(_origin_rules, call))
    except errors.HoardError:  # logged once per failed ask, in _origin_rules
        return {}
    return cors_rules.answer_headers(rules, origin, request.method)


async def _origin_rules(call: Call) -> CorsRules:
    """The bucket's rules, from the origin's GetBucketCors (under Hoard's credentials);
    ``HoardError`` when no answer came, or a 5xx or a 429 (asked again later)."""
    if not call.writer.forwards(call.bucket):
        return NO_RULES  # a directory keeps none
    try:
        status, body = await _get_bucket_cors(call)
        if status >= 500 or status == 429:
            raise errors.OriginUnavailable(f"GetBucketCors answered {status}")
    except errors.HoardError as exc:
        log.warning("CORS rules of %r unknown, answers go without: %s", call.bucket, exc)
        raise
    if status == 200:
        try:
            return cors_rules.parse_configuration(body)
        except S3Error:  # not XML, or past read_whole's limit (S3 keeps 64 KB at most)
            log.warning("the origin's CORS configuration of %r is no XML of S3's", call.bucket)
            return NO_RULES
    if status not in _NOT_CONFIGURED:  # Hoard's credentials may not read them, say
        log.warning("GetBucketCors of %r answered %d: no CORS rules", call.bucket, status)
    return NO_RULES


async def _get_bucket_cors(call: Call) -> tuple[int, bytes]:
    """The origin's answer to GetBucketCors: its status and body (b"" if too long)."""
    answer = await call.writer.forward(method="GET", bucket=call.bucket, key=None,
                                       query=[("cors", "")], headers={}, body=None,
                                       content_length=None, mutating=False)  # fmt: skip
    async with answer:
        try:
            return answer.status, await read_whole(answer.body)
        except S3Error:
            return answer.status, b""
