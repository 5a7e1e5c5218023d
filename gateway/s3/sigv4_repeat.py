"""A header-signed repeat's signature, checked from its signed form's parts alone.

The express lane (``express.py``) keeps a header-signed hit's answer under its
signed form: the head without the lines a client changes on every call
(``signed_form.py``). Each repeat's signature must still be verified, and
verifying it as the front verifies any request (the head parsed into headers,
the claim parsed, the canonical request rebuilt from both) cost three quarters
of a header-signed repeat's instructions.

Of a repeat's canonical request, though, only the per-call lines' values can
differ from the last one verified: the request line and every other header are
the form's bytes, the same. So the first repeat verified in full leaves a
``SignedRepeat``: that canonical request with holes where the signed per-call
values go (the date, and an SDK's ids where it signs them), the
``Authorization`` value up to its signature, and the key's HMAC. A later
repeat is checked by what alone can change, as ``sigv4.py`` checks it:

- the ``Authorization`` value is the same bytes up to a signature of 64 hex
  digits (so the same key, scope, region and signed headers);
- its ``x-amz-date`` is a valid time on the scope's day, within the skew;
- the signature is the HMAC of the canonical request with this repeat's values.

Anything else (another day, a layout of the header the check was not learned
from, a value a canonical request would trim or collapse) is not decided here:
the lane verifies it in full, as before, and learns again. A ``SignedRepeat``
is learned only if it verifies the very request the full check just accepted,
so it holds the canonical request that check built. The credentials'
generation is the lane's to compare (a reload changes what a key may read).
"""

from __future__ import annotations

import hashlib
import hmac
import re

from gateway.core.compiled import twin
from gateway.core.sigv4_key import KeyedHmac
from gateway.s3.signed_form import PER_CALL, SignedParts
from gateway.s3.signing import RequestView, parse_amz_date, utf8
from gateway.s3.sigv4 import _candidate_uris, _canonical_headers, _canonical_query
from gateway.s3.sigv4_claim import ALGORITHM, Claim, scope

_SIGNATURE = 64  # hex digits of an HMAC-SHA256
_SIGNATURE_IS = b"Signature="
# Where a per-call name's value is in ``SignedParts`` (after the form).
_PART = {name.decode(): at for at, name in enumerate(PER_CALL, start=1)}
_DATE, _AUTHORIZATION = _PART["x-amz-date"], _PART["authorization"]
# An x-amz-date a calendar has (its day is the scope's, checked apart): trimmed already.
_TIME = re.compile(rb"[0-9]{8}T(?:[01][0-9]|2[0-3])[0-5][0-9][0-5][0-9]Z")
# A value a canonical request takes as it is: visible ASCII, single spaces inside.
_PLAIN = re.compile(rb"(?:[!-~]+(?: [!-~]+)*)?")
_ALGORITHM_LINE = f"{ALGORITHM}\n".encode()


class SignedRepeat:
    """What a header-signed request's repeats are checked by (see the module)."""

    __slots__ = ("_day", "_lead", "_midnight", "_prefix", "_rest", "_scope", "_signer", "_skew",
                 "_slots")  # fmt: skip

    def __init__(
        self, prefix: bytes, day: bytes, midnight: float, request: list[str | int],
        scope_line: bytes, signer: KeyedHmac, skew: float,
    ) -> None:  # fmt: skip
        """``request``: the canonical request's text, and where a value goes, the place
        in the parts of the value (``SignedParts``); one at least, the date's."""
        first = next(at for at, piece in enumerate(request) if type(piece) is int)
        self._prefix = prefix  # the Authorization value up to its signature
        self._day = day  # the scope's YYYYMMDD
        self._midnight = midnight  # its first second, in the clock's seconds
        # The text up to the first value hashed once: a repeat hashes only the rest.
        self._lead = hashlib.sha256(utf8("".join(request[:first])))  # type: ignore[arg-type]
        self._rest = utf8("".join(p.replace("%", "%%") if type(p) is str else "%s"
                                  for p in request[first:]))  # fmt: skip
        self._slots = tuple(piece for piece in request if type(piece) is int)
        self._scope = scope_line  # the string to sign's scope, between its newlines
        self._signer = signer
        self._skew = skew

    def verifies(self, parts: SignedParts, now: float) -> bool:
        """Whether ``parts`` (a repeat's, of the form this was learned from) are signed
        by the key, now; False: not decided here (verified in full)."""
        authorization, date = parts[_AUTHORIZATION], parts[_DATE]
        prefix = self._prefix
        if len(authorization) != len(prefix) + _SIGNATURE or not authorization.startswith(prefix):
            return False
        if date is None or date[:8] != self._day or _TIME.fullmatch(date) is None:
            return False
        moment = self._midnight + int(date[9:11]) * 3600 + int(date[11:13]) * 60 + int(date[13:15])
        if abs(now - moment) > self._skew:
            return False
        values = []
        for at in self._slots:
            value = parts[at]
            if value is None or (at != _DATE and _PLAIN.fullmatch(value) is None):
                return False
            values.append(value)
        canonical = self._lead.copy()
        canonical.update(self._rest % tuple(values))
        to_sign = b"".join((_ALGORITHM_LINE, date, self._scope, canonical.hexdigest().encode()))
        expected = self._signer.hexdigest(to_sign).encode()
        return hmac.compare_digest(expected, authorization[-_SIGNATURE:].lower())


def learn(
    req: RequestView, claim: Claim, signer: KeyedHmac, parts: SignedParts, skew: float
) -> SignedRepeat | None:
    """The check of ``req``'s repeats, from ``req`` whose ``claim`` was just verified with
    ``signer`` (``SigV4Verifier.claimed``); None: its repeats are verified in full."""
    authorization = parts[_AUTHORIZATION]
    prefix = authorization[:-_SIGNATURE]
    signed = claim.signed_headers
    if not prefix.endswith(_SIGNATURE_IS) or claim.expires is not None:
        return None
    if authorization[-_SIGNATURE:].lower() != utf8(claim.signature) or "x-amz-date" not in signed:
        return None
    headers: list[str | int] = []
    for name in signed:
        at = _PART.get(name)
        if at == _AUTHORIZATION:
            return None
        if at is not None:
            headers += (f"{name}:", at, "\n")
            continue
        line, present = _canonical_headers(req, (name,))
        if not present:
            return None
        headers.append(line)
    headers.append(f"\n{';'.join(signed)}\n{claim.payload_hash}")
    query = _canonical_query(req.raw_query, presigned=False)
    midnight = parse_amz_date(f"{claim.date}T000000Z")
    if midnight is None:
        return None
    for uri in _candidate_uris(req.raw_path):  # the one the full check matched
        request = [f"{req.method}\n{uri}\n{query}\n", *headers]
        check = SignedRepeat(prefix, utf8(claim.date), midnight, request,
                             utf8(f"\n{scope(claim)}\n"), signer, skew)  # fmt: skip
        if check.verifies(parts, claim.timestamp):
            return check
    return None


# The Python class, kept: the tests run both (``core/compiled.py``); the compiled one
# hashes with OpenSSL's SHA-256 on contexts copied as structures, with no EVP context.
SignedRepeatPy = SignedRepeat
_compiled = twin("gateway.s3._sigv4_repeat")
if _compiled is not None:
    SignedRepeat = _compiled.SignedRepeat  # type: ignore[misc]
