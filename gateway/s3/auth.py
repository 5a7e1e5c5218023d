"""Who is calling: SigV4 or SigV2 verification plus the anonymous-access policy.

A request with a signature must carry a valid one, even where anonymous
access is allowed (S3 does the same: a bad signature is never downgraded to
anonymous). An unsigned request is anonymous, refused unless
``allow_anonymous`` is set.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from gateway.config.settings import Credential
from gateway.core.hot_sets import DEFAULT, Doorkeeper
from gateway.s3 import signing
from gateway.s3.errors import Code, S3Error
from gateway.s3.signed_form import SignedParts
from gateway.s3.sigv2 import SigV2Verifier, is_sigv2
from gateway.s3.sigv4 import AuthContext, RequestView, SigV4Verifier, is_signed
from gateway.s3.sigv4_repeat import SignedRepeat, learn


@dataclass(frozen=True, slots=True)
class Principal:
    """The caller: an access key (with its context if it signed with SigV4), or anonymous."""

    access_key: str | None
    context: AuthContext | None = None
    buckets: frozenset[str] | None = None  # None: every bucket
    readonly: bool = False

    @property
    def anonymous(self) -> bool:
        return self.access_key is None

    def may_use(self, bucket: str) -> bool:
        return self.buckets is None or bucket in self.buckets

    def allows(self, bucket: str, mutating: bool) -> bool:
        """Whether this caller may do this to ``bucket``: the one rule of every entry point
        (warming, auto-warm included, counts as mutating: see ``access.py``)."""
        if mutating and (self.readonly or self.anonymous):
            return False
        return not bucket or self.may_use(bucket)

    def authorize(self, bucket: str, mutating: bool) -> None:
        """AccessDenied unless this caller may do this to ``bucket``; nothing reaches an origin."""
        if not self.allows(bucket, mutating):
            raise S3Error(Code.AccessDenied)


ANONYMOUS = Principal(None, readonly=True)


class Authenticator:
    def __init__(
        self,
        credentials: list[Credential],
        allow_anonymous: bool,
        clock: Callable[[], float] = time.time,
        domains: Sequence[str] = ("localhost",),
        region: str | None = None,
        verdicts_kept: int = DEFAULT.urls,
    ) -> None:
        """``verdicts_kept``: presigned URLs whose verdict is kept (``core/hot_sets.py``)."""
        self.now = clock  # the clock presigned expiries are read on (no wrapper: per hit)
        self._verdicts_kept = verdicts_kept
        self._domains = domains
        self._region = region  # SigV4 scopes must name it (settings.region); None: any
        self.generation = 0  # reloads so far: a verdict reached before one is not reused after
        self.reload(credentials, allow_anonymous)

    def reload(self, credentials: list[Credential], allow_anonymous: bool) -> None:
        """Check against these credentials from now on (SIGHUP): a key removed or limited is
        refused or limited at its next request, a remembered presigned URL included."""
        secrets = {c.access_key: c.secret_key.get_secret_value() for c in credentials}
        self._limits = {
            c.access_key: (frozenset(c.buckets) if c.buckets is not None else None, c.readonly)
            for c in credentials
        }
        self._verifier = SigV4Verifier(secrets, region=self._region, clock=self.now)
        self._v2_verifier = SigV2Verifier(secrets, clock=self.now, domains=self._domains)
        self._allow_anonymous = allow_anonymous
        self._presigned = PresignedMemo(self.now, self._verdicts_kept)
        self.generation += 1

    @property
    def presigned(self) -> PresignedMemo:
        """The verdicts on presigned URLs kept (a bounded hot set)."""
        return self._presigned

    def authenticate(self, request: RequestView) -> Principal:
        """The verified caller; ``S3Error`` for a bad signature or a refused anonymous call."""
        return self.authenticate_as(request, self._presigned.key(request))

    def authenticate_as(self, request: RequestView, key: MemoKey | None) -> Principal:
        """``authenticate``, ``key`` being the request's ``PresignedMemo.key`` (a caller
        that keeps the verdict itself too reads it once)."""
        remembered = self._presigned.get(key)
        if remembered is not None:
            return remembered
        principal = self._verify(request)
        self._presigned.remember(key, request.raw_query, principal)
        return principal

    def header_signer(
        self, request: RequestView, parts: SignedParts
    ) -> tuple[str, SignedRepeat | None] | None:
        """The access key that SigV4 header-signed ``request``, verified as ``authenticate``
        verifies such a request (no verdict is kept on one), and the check its repeats
        can be verified by (``sigv4_repeat.py``; ``parts``: ``request``'s signed parts);
        None for anything else (a bad signature, presigned, SigV2, anonymous), which
        ``authenticate`` decides."""
        try:
            claim, signer = self._verifier.claimed(request)
        except S3Error:
            return None
        if claim.expires is not None:
            return None
        return claim.access_key, learn(request, claim, signer, parts, self._verifier.max_skew)

    def _verify(self, request: RequestView) -> Principal:
        if is_sigv2(request):
            # No AuthContext: SigV2 signs no payload hash and has no chunk signatures.
            return self._principal(self._v2_verifier.verify(request), None)
        if is_signed(request):
            context = self._verifier.verify(request)
            return self._principal(context.access_key, context)
        if self._allow_anonymous:
            return ANONYMOUS
        raise S3Error(Code.AccessDenied)

    def _principal(self, access_key: str, context: AuthContext | None) -> Principal:
        buckets, readonly = self._limits.get(access_key, (None, False))
        return Principal(access_key, context, buckets, readonly)


_READS = frozenset(("GET", "HEAD"))
# What a presigned verdict is kept under: method, raw path, query, Host.
MemoKey = tuple[str, str, str, str]
_HOST_SIGNED = "X-Amz-SignedHeaders=host"


class PresignedMemo:
    """Presigned URLs already verified, so a URL used again skips the HMAC work.

    A data loader reads the same presigned URLs every epoch. The memo is keyed
    by everything such a signature covers when only ``host`` is signed (the
    common case): method, path and query as sent (the query holds the
    signature and the expiry), and the Host header. Expiry is checked on every
    use; a URL whose expiry cannot be read is not remembered.

    A hot set (``LIMIT`` by default, ``core/hot_sets.py``), as the front's route memo: every new URL
    is an entry of ~1 KB (its path and query, a ``Principal``), so a load of
    fresh presigned URLs grew each worker to 65,536 of them, ~60 MB beyond its
    configured tiers (issue 34's soak); a URL not kept costs one HMAC check.
    """

    LIMIT = DEFAULT.urls

    def __init__(self, clock: Callable[[], float], limit: int = LIMIT) -> None:
        self._clock = clock
        self._limit = limit
        self._entries: OrderedDict[MemoKey, tuple[float, Principal]] = OrderedDict()
        self._door = Doorkeeper(limit)  # what a full memo takes in

    @staticmethod
    def key(request: RequestView) -> MemoKey | None:
        """What a remembered verdict on ``request`` is kept under; None: not memoisable."""
        # Reads only, and no x-amz-* headers: a memo hit must not skip the check
        # that every x-amz-* header a request carries is signed (nor the refusal of a
        # second signature in an Authorization header).
        query = request.raw_query
        if "Signature=" not in query or request.method not in _READS:
            return None  # (the query first: a header-signed request walks no header here)
        if "X-Amz-Signature=" in query and not (
            query.endswith(_HOST_SIGNED) or f"{_HOST_SIGNED}&" in query
        ):
            return None  # other signed headers would have to be part of the key
        if needs_verifier(request.headers):
            return None
        return (request.method, request.raw_path, query, request.headers.get("Host", ""))

    def __len__(self) -> int:
        return len(self._entries)

    def expiry(self, key: MemoKey | None) -> float | None:
        """Until when the verdict kept under ``key`` (a request's ``key``) holds; None:
        none is kept."""
        entry = None if key is None else self._entries.get(key)
        return None if entry is None else entry[0]

    def get(self, key: MemoKey | None) -> Principal | None:
        entry = self._entries.get(key) if key is not None else None
        if entry is None:
            return None
        expires, principal = entry
        if self._clock() > expires:
            del self._entries[key]  # type: ignore[arg-type]
            return None  # the verifier answers "Request has expired"
        self._entries.move_to_end(key)  # type: ignore[arg-type]
        return principal

    def remember(self, key: MemoKey | None, raw_query: str, principal: Principal) -> None:
        if key is None or principal.anonymous:
            return
        if self._door.refuses(key, self._entries, self._limit):
            return
        expires = _presigned_expiry(raw_query)
        if expires is None:
            return
        self._entries[key] = (expires, principal)
        self._entries.move_to_end(key)
        if len(self._entries) > self._limit:
            self._entries.popitem(last=False)


def needs_verifier(headers: Iterable[str]) -> bool:
    """Whether a request carrying these headers must be verified whatever verdict is kept
    on its URL: an ``x-amz-*`` header (each must be signed, and a presigned URL signs
    only ``host`` here), or an ``Authorization`` beside the query's signature (refused:
    "only one auth mechanism")."""
    for name in headers:
        lower = name.lower()
        if lower.startswith("x-amz-") or lower == "authorization":
            return True
    return False


def _presigned_expiry(raw_query: str) -> float | None:
    """When a presigned URL stops being valid (SigV4 date + expires, or SigV2 Expires)."""
    params = signing.query_params(raw_query)  # as the verifier read it: decoded once
    try:
        if "x-amz-date" in params:
            start = signing.parse_amz_date(params["x-amz-date"])  # the verifier's reading
            return None if start is None else start + int(params["x-amz-expires"])
        return float(int(params["expires"]))
    except (KeyError, ValueError):
        return None
