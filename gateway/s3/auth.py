"""Who is calling: SigV4 or SigV2 verification plus the anonymous-access policy.

A request with a signature must carry a valid one, even where anonymous
access is allowed (S3 does the same: a bad signature is never downgraded to
anonymous). An unsigned request is anonymous, refused unless
``allow_anonymous`` is set.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gateway.config import Credential
from gateway.s3.errors import Code, S3Error
from gateway.s3.sigv2 import SigV2Verifier, is_sigv2
from gateway.s3.sigv4 import AuthContext, RequestView, SigV4Verifier, is_signed


@dataclass(frozen=True, slots=True)
class Principal:
    """The caller: an access key (with its context if it signed with SigV4), or anonymous."""

    access_key: str | None
    context: AuthContext | None = None

    @property
    def anonymous(self) -> bool:
        return self.access_key is None


ANONYMOUS = Principal(None)


class Authenticator:
    def __init__(
        self,
        credentials: list[Credential],
        allow_anonymous: bool,
        clock: Callable[[], float] = time.time,
        domains: Sequence[str] = ("localhost",),
    ) -> None:
        secrets = {c.access_key: c.secret_key.get_secret_value() for c in credentials}
        self._verifier = SigV4Verifier(secrets, clock=clock)
        self._v2_verifier = SigV2Verifier(secrets, clock=clock, domains=domains)
        self._allow_anonymous = allow_anonymous

    def authenticate(self, request: RequestView) -> Principal:
        """The verified caller; ``S3Error`` for a bad signature or a refused anonymous call."""
        if is_sigv2(request):
            # No AuthContext: SigV2 signs no payload hash and has no chunk signatures.
            return Principal(self._v2_verifier.verify(request))
        if is_signed(request):
            context = self._verifier.verify(request)
            return Principal(context.access_key, context)
        if self._allow_anonymous:
            return ANONYMOUS
        raise S3Error(Code.AccessDenied)
