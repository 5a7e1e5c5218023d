"""The memo of verified presigned URLs (``auth.PresignedMemo``) never outlives the verdict.

A hit of a presigned URL skips the HMAC work when the same URL was verified
before; these check that the memo answers only what a fresh verification would:
not after the URL expired, not for credentials that are no longer the ones
the verdict was reached with, and not for a URL changed in any signed part.
"""

from __future__ import annotations

from multidict import CIMultiDict
from pydantic import SecretStr

from gateway.config.settings import Credential
from gateway.s3.auth import Authenticator
from gateway.s3.errors import S3Error
from gateway.s3.signing import parse_amz_date
from gateway.s3.sigv4 import RequestView
from tests.rawhttp import presign

HOST = "127.0.0.1:9000"
TARGET = "/bucket/key.jpg"


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _view(target: str) -> RequestView:
    path, _, query = target.partition("?")
    return RequestView("GET", path, query, CIMultiDict({"Host": HOST}))


def _authenticator(secret: str, clock: Clock) -> Authenticator:
    credential = Credential(access_key="memo-key", secret_key=SecretStr(secret))
    return Authenticator([credential], allow_anonymous=False, clock=clock)


def _signed_at(target: str) -> float:
    date = target.split("X-Amz-Date=", 1)[1].split("&", 1)[0]
    signed = parse_amz_date(date)
    assert signed is not None
    return signed


def _refused(auth: Authenticator, view: RequestView) -> str:
    try:
        auth.authenticate(view)
    except S3Error as exc:
        return exc.code.name + ": " + exc.message
    raise AssertionError("the request was accepted")


def test_a_remembered_url_is_refused_once_it_expired() -> None:
    target = presign("GET", HOST, TARGET, expires=60, access_key="memo-key", secret_key="s1")
    clock = Clock(0.0)
    clock.now = _signed_at(target) + 1
    auth = _authenticator("s1", clock)
    view = _view(target)
    assert auth.authenticate(view).access_key == "memo-key"  # verified, remembered
    clock.now += 30
    assert auth.authenticate(view).access_key == "memo-key"  # from the memo
    clock.now += 60
    assert "expired" in _refused(auth, view)
    assert "expired" in _refused(auth, view)  # the memo dropped it; still refused


def test_a_remembered_url_is_refused_by_reloaded_credentials() -> None:
    """A SIGHUP reloads the credentials: nothing remembered under the old ones carries over,
    neither a changed secret nor a removed key."""
    target = presign("GET", HOST, TARGET, expires=600, access_key="memo-key", secret_key="s1")
    clock = Clock(0.0)
    clock.now = _signed_at(target) + 1
    auth = _authenticator("s1", clock)
    assert auth.authenticate(_view(target)).access_key == "memo-key"
    auth.reload([Credential(access_key="memo-key", secret_key=SecretStr("s2"))], False)
    assert _refused(auth, _view(target)).startswith("SignatureDoesNotMatch")
    auth.reload([Credential(access_key="memo-key", secret_key=SecretStr("s1"))], False)
    assert auth.authenticate(_view(target)).access_key == "memo-key"
    auth.reload([Credential(access_key="other-key", secret_key=SecretStr("s1"))], False)
    assert _refused(auth, _view(target)).startswith("InvalidAccessKeyId")


def test_a_changed_url_is_verified_again() -> None:
    target = presign("GET", HOST, TARGET, expires=600, access_key="memo-key", secret_key="s1")
    clock = Clock(0.0)
    clock.now = _signed_at(target) + 1
    auth = _authenticator("s1", clock)
    assert auth.authenticate(_view(target)).access_key == "memo-key"
    other_key = target.replace("/bucket/key.jpg", "/bucket/other.jpg")
    assert _refused(auth, _view(other_key)).startswith("SignatureDoesNotMatch")
    longer = target.replace("X-Amz-Expires=600", "X-Amz-Expires=6000")
    assert _refused(auth, _view(longer)).startswith("SignatureDoesNotMatch")
