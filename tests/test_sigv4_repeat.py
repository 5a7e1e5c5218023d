"""A header-signed repeat's check, learned from one verified request, against the full one.

``sigv4_repeat.py`` checks a repeat of a signed form from its per-call values
alone. The property that matters: it never accepts what the full verification
(``SigV4Verifier.claimed``, which the front runs on every other request)
refuses. Checked here on requests botocore signs at chosen times, and on
thousands of seeded variations of them (a signature byte changed, a date moved
within the day or off it, another key's signature, the header's layout, a
signed SDK id changed), each one also verified in full. And it must accept the
repeats it is for, or it is no check at all. Every test runs on both twins:
the Python class and the compiled one (``_sigv4_repeat.pyx``).
"""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta

import botocore.auth
import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from gateway.core import compiled
from gateway.core.heads import parse_head
from gateway.s3 import sigv4_repeat as module
from gateway.s3.errors import S3Error
from gateway.s3.signed_form import SignedParts, signed_parts
from gateway.s3.sigv4 import RequestView, SigV4Verifier
from gateway.s3.sigv4_repeat import SignedRepeat, learn

KEY, SECRET = "AKIDREPEAT", "repeat-secret"
OTHER, OTHER_SECRET = "AKIDOTHER", "other-secret"
HOST = "127.0.0.1:9000"
NOON = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)


@pytest.fixture(autouse=True, params=["compiled", "python"])
def twin(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which ``SignedRepeat`` ``learn`` makes: each test runs with both."""
    if request.param == "python":
        monkeypatch.setattr(module, "SignedRepeat", module.SignedRepeatPy)
    elif not compiled.in_use()["gateway.s3._sigv4_repeat"]:
        pytest.skip("the compiled twin is not in use")
    return request.param


def test_the_compiled_twin_is_built_and_used_unless_refused() -> None:
    assert compiled.in_use()["gateway.s3._sigv4_repeat"] is not compiled.NO_EXTENSIONS


def signed_head(
    monkeypatch: pytest.MonkeyPatch,
    at: datetime,
    target: str = "/bucket/data/0001.bin",
    *,
    key: str = KEY,
    secret: str = SECRET,
    ids_signed: bool = False,
    extra: dict[str, str] | None = None,
    signer: type[S3SigV4Auth] = S3SigV4Auth,
    request_line: str = "attempt=1; max=5",
) -> bytes:
    """``target`` signed in headers by botocore as if at ``at``, sent as boto3 sends it:
    with an invocation id and a retry line, signed or (as boto3 does) added after."""
    ids = {"amz-sdk-invocation-id": str(uuid.uuid4()), "amz-sdk-request": request_line}
    headers = {"x-amz-content-sha256": "UNSIGNED-PAYLOAD", **(extra or {})}
    request = AWSRequest(method="GET", url=f"http://{HOST}{target}",
                         headers={**headers, **(ids if ids_signed else {})})  # fmt: skip
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: at.replace(tzinfo=None))
    signer(Credentials(key, secret), "s3", "us-east-1").add_auth(request)
    sent = {**dict(request.headers.items()), **({} if ids_signed else ids)}
    lines = "".join(f"{name}: {value}\r\n" for name, value in sent.items())
    return (
        f"GET {target} HTTP/1.1\r\nHost: {HOST}\r\nUser-Agent: Boto3/1.35\r\n{lines}\r\n".encode()
    )


def verifier(now: datetime) -> SigV4Verifier:
    return SigV4Verifier({KEY: SECRET, OTHER: OTHER_SECRET}, clock=now.timestamp)


def parsed(head: bytes) -> tuple[RequestView, SignedParts]:
    message, parts = parse_head(head), signed_parts(head)
    assert message is not None and parts is not None, head
    raw_path, _, raw_query = message.path.partition("?")
    return RequestView(message.method, raw_path, raw_query, message.headers), parts


def learned(head: bytes, now: datetime) -> SignedRepeat:
    view, parts = parsed(head)
    check = verifier(now)
    claim, signer = check.claimed(view)
    repeat = learn(view, claim, signer, parts, check.max_skew)
    assert repeat is not None
    return repeat


def fully_verified(head: bytes, now: datetime) -> bool:
    message = parse_head(head)
    if message is None:
        return False
    raw_path, _, raw_query = message.path.partition("?")
    try:
        verifier(now).claimed(RequestView(message.method, raw_path, raw_query, message.headers))
    except S3Error:
        return False
    return True


@pytest.mark.parametrize("ids_signed", [False, True])
@pytest.mark.parametrize(
    "target",
    ["/bucket/data/0001.bin", "/bucket/with%20space/a%25b.bin", "/bucket/a%2Fb",
     "/bucket/k?versionId=3&partNumber=1"],
)  # fmt: skip
def test_repeats_signed_later_that_day_are_verified_from_their_parts(
    monkeypatch: pytest.MonkeyPatch, target: str, ids_signed: bool
) -> None:
    """New date, signature and ids: the same form, verified by the check alone (the
    path with an escaped slash is signed as sent: the second of the full check's paths)."""
    extra = {"Range": "bytes=0-8388607", "x-amz-meta-note": "100%"}
    first = signed_head(monkeypatch, NOON, target, ids_signed=ids_signed, extra=extra)
    check = learned(first, NOON)
    for minutes in (1, 7, 300, -200):
        at = NOON + timedelta(minutes=minutes)
        repeat = signed_head(monkeypatch, at, target, ids_signed=ids_signed, extra=extra)
        parts = parsed(repeat)[1]
        assert parts[0] == parsed(first)[1][0]  # one form
        assert check.verifies(parts, at.timestamp())
        assert fully_verified(repeat, at)


def test_a_repeat_is_not_decided_past_the_skew_nor_on_another_day(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    check = learned(signed_head(monkeypatch, NOON), NOON)
    late = signed_head(monkeypatch, NOON + timedelta(minutes=20))
    assert not check.verifies(parsed(late)[1], NOON.timestamp())
    assert not fully_verified(late, NOON)  # RequestTimeTooSkewed
    tomorrow = NOON + timedelta(hours=13)
    next_day = signed_head(monkeypatch, tomorrow)
    assert not check.verifies(parsed(next_day)[1], tomorrow.timestamp())  # another scope
    assert fully_verified(next_day, tomorrow)  # ... which the full check accepts, and
    assert learned(next_day, tomorrow).verifies(parsed(next_day)[1], tomorrow.timestamp())


def test_a_signed_id_changed_after_signing_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    check = learned(signed_head(monkeypatch, NOON, ids_signed=True), NOON)
    repeat = signed_head(monkeypatch, NOON, ids_signed=True)
    changed = repeat.replace(b"attempt=1; max=5", b"attempt=2; max=5")
    assert check.verifies(parsed(repeat)[1], NOON.timestamp())
    assert not check.verifies(parsed(changed)[1], NOON.timestamp())
    assert not fully_verified(changed, NOON)


class AsSentAuth(S3SigV4Auth):
    """A careless signer: header values signed as sent, not trimmed and collapsed."""

    def _header_value(self, value: str) -> str:
        return value


def test_a_value_signed_as_sent_where_s3_collapses_it_is_refused_by_both(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    check = learned(signed_head(monkeypatch, NOON, ids_signed=True), NOON)
    for line in ("attempt=1;  max=5", "attempt=1;\tmax=5"):
        careless = signed_head(monkeypatch, NOON, ids_signed=True, signer=AsSentAuth,
                               request_line=line)  # fmt: skip
        assert not check.verifies(parsed(careless)[1], NOON.timestamp())
        assert not fully_verified(careless, NOON)


def test_another_keys_signature_is_never_taken_for_the_learned_keys(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    check = learned(signed_head(monkeypatch, NOON), NOON)
    theirs = signed_head(monkeypatch, NOON, key=OTHER, secret=OTHER_SECRET)
    assert parsed(theirs)[1][0] == parsed(signed_head(monkeypatch, NOON))[1][0]
    assert not check.verifies(parsed(theirs)[1], NOON.timestamp())
    # Their Authorization with our key's name: the prefix matches, the HMAC does not.
    forged = theirs.replace(OTHER.encode(), KEY.encode())
    assert not check.verifies(parsed(forged)[1], NOON.timestamp())
    assert not fully_verified(forged, NOON)


def test_nothing_is_learned_from_a_request_whose_signature_is_not_last(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    head = signed_head(monkeypatch, NOON)
    start = head.index(b"Authorization: ") + len(b"Authorization: ")
    end = head.index(b"\r\n", start)
    scheme, _, rest = head[start:end].partition(b" ")
    credential, headers, signature = rest.split(b", ")
    reordered = b", ".join((signature, credential, headers))
    moved = head[:start] + scheme + b" " + reordered + head[end:]
    view, parts = parsed(moved)
    check = verifier(NOON)
    claim, signer = check.claimed(view)  # S3 takes the components in any order
    assert learn(view, claim, signer, parts, check.max_skew) is None


def _variations(rng: random.Random, head: bytes) -> bytes:
    """``head`` with one per-call value changed, as a forger or a careless client might."""
    start = head.index(b"Signature=") + len(b"Signature=")
    date_at = head.lower().index(b"x-amz-date: ") + len(b"x-amz-date: ")
    choice = rng.randrange(9)
    if choice == 0:  # a signature digit changed
        at = start + rng.randrange(64)
        return head[:at] + rng.choice(b"0123456789abcdefABCDEF").to_bytes() + head[at + 1 :]
    if choice == 1:  # the signature in capitals: S3 accepts it
        return head[:start] + head[start : start + 64].upper() + head[start + 64 :]
    if choice == 2:  # the date moved: a digit of the time, or of the day
        at = date_at + rng.choice((6, 7, 9, 10, 11, 12, 13, 14))
        return head[:at] + rng.choice(b"0123456789").to_bytes() + head[at + 1 :]
    if choice == 3:  # the date as another shape
        bad = rng.choice((b"20261129T120000", b"20261129T246000Z", b"20261129T120060Z",
                          b" 20261129T120000Z ", b"20261129t120000z", b"2026-11-29T12:00:00Z"))  # fmt: skip
        return head[:date_at] + bad + head[date_at + 16 :]
    if choice == 4:  # the Authorization's layout
        return head.replace(
            b", SignedHeaders", rng.choice((b",SignedHeaders", b",  SignedHeaders"))
        )
    if choice == 5:  # something appended to the signature
        return head[: start + 64] + rng.choice((b"0", b" ", b",Signature=00")) + head[start + 64 :]
    if choice == 6:  # the signature cut short
        return head[: start + 63] + head[start + 64 :]
    if choice == 7:  # a signed id changed
        return head.replace(b"attempt=1", rng.choice((b"attempt=2", b"attempt=1 ", b"attempt =1")))
    return head  # as signed


def test_the_check_accepts_nothing_the_full_verification_refuses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Seeded: heads signed at times around the learned one (some a day off, some by the
    other key), each varied; whatever the check accepts, the full check accepts, and it
    accepts every repeat left as signed within the day and the skew."""
    rng = random.Random(20261129)
    first = {signed: signed_head(monkeypatch, NOON, ids_signed=signed) for signed in (False, True)}
    checks = {signed: learned(head, NOON) for signed, head in first.items()}
    accepted = refused_here_only = 0
    for _ in range(1500):
        signed = rng.random() < 0.5
        at = NOON + timedelta(seconds=rng.randint(-1500, 1500) + rng.choice((0, 0, 0, 86400)))
        now = NOON + timedelta(seconds=rng.randint(-600, 600))
        mine = rng.random() < 0.8
        head = signed_head(monkeypatch, at, key=KEY if mine else OTHER,
                           secret=SECRET if mine else OTHER_SECRET, ids_signed=signed)  # fmt: skip
        varied = _variations(rng, head)
        parts = signed_parts(varied)
        if parts is None or parts[0] != parsed(first[signed])[1][0]:
            continue  # another form: another lane's, never this check's
        fast = checks[signed].verifies(parts, now.timestamp())
        full = fully_verified(varied, now)
        assert not fast or full, varied
        accepted += fast
        refused_here_only += full and not fast
        if (
            varied == head
            and mine
            and at.date() == NOON.date()
            and abs((at - now).total_seconds()) <= 900
        ):
            assert fast, head
    assert accepted > 100  # it is the check for repeats, not a check that says no
    assert refused_here_only > 0  # another day's scope: the full check's, then learned anew


def test_the_twins_agree_on_every_variation(monkeypatch: pytest.MonkeyPatch, twin: str) -> None:
    """The Python class and the compiled one, learned from the same request: the same
    verdict on each seeded variation (as the full check, theirs are only a shortcut)."""
    if twin != "compiled":
        pytest.skip("run once, beside the compiled twin")
    first = signed_head(monkeypatch, NOON, ids_signed=True)
    built = learned(first, NOON)
    monkeypatch.setattr(module, "SignedRepeat", module.SignedRepeatPy)
    reference = learned(first, NOON)
    assert type(built) is not type(reference)
    rng = random.Random(29)
    agreed = 0
    for _ in range(600):
        at = NOON + timedelta(seconds=rng.randint(-1200, 1200))
        parts = signed_parts(_variations(rng, signed_head(monkeypatch, at, ids_signed=True)))
        if parts is None:
            continue
        now = NOON.timestamp() + rng.randint(-300, 300)
        assert built.verifies(parts, now) == reference.verifies(parts, now), parts
        agreed += reference.verifies(parts, now)
    assert agreed > 50
