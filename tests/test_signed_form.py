"""Signed parts: a header-signed head's form and its per-call values, in Python and in C.

``gateway/s3/_signed_form.pyx`` scans a head's bytes in C for what
``signed_form.py``'s regular expression removes and hands back. Checked here:
heads as boto3 signs them; the heads that have no parts because a per-call
line is not as a ``Head``'s would be; and generated ones (seeded: the per-call
names in any case, blank or missing colons, names that only start alike, lone
CRs and LFs, lines at the very end, heads with no Authorization or two) get the
same answer from both, byte for byte.
"""

from __future__ import annotations

import importlib.util
import random

import pytest

from gateway.core import compiled
from gateway.s3 import signed_form as module
from tests.rawhttp import sign_headers

BUILT = importlib.util.find_spec("gateway.s3._signed_form") is not None
needs_twin = pytest.mark.skipif(not BUILT, reason="the compiled twin was not built")

LINES = (
    b"Host: 127.0.0.1:9000",
    b"X-Amz-Date: 20260101T000000Z",
    b"x-amz-date:20260101T000001Z",
    b"Authorization: AWS4-HMAC-SHA256 Credential=AK/20260101/us-east-1/s3/aws4_request, "
    b"SignedHeaders=host;x-amz-date, Signature=00ff",
    b"AUTHORIZATION:x",
    b"authorization :x",
    b"Authorizationx: y",
    b"amz-sdk-invocation-id: 5b0c",
    b"Amz-Sdk-Request: attempt=1; max=5",
    b"amz-sdk-request-extra: 1",
    b"x-amz-content-sha256: UNSIGNED-PAYLOAD",
    b"Range: bytes=0-9",
    b"x-amz-date",
    b"authorization:",
    b"User-Agent: Boto3/1.35",
    b"x-amz-date: a\rb",
    b"authorization: a\nb",
    b"",
    b"Accept-Encoding: identity",
)


def test_the_compiled_twin_is_built_and_used_unless_refused() -> None:
    assert BUILT, "gateway/s3/_signed_form.pyx was not built"
    assert compiled.in_use()["gateway.s3._signed_form"] is not compiled.NO_EXTENSIONS


def test_a_boto3_head_drops_exactly_its_per_call_lines() -> None:
    """Two reads of one object differ only in the lines dropped, so their forms are equal."""
    head = _boto3_head()
    later = head.replace(b"Signature=", b"Signature=0f").replace(b"X-Amz-Date: 2", b"X-Amz-Date: 3")
    heads = [head, later.replace(b"\r\n\r\n", b"\r\namz-sdk-invocation-id: 9a\r\n\r\n")]
    assert heads[0] != heads[1]
    parts = [module.signed_parts_py(head) for head in heads]
    assert parts[0] is not None and parts[1] is not None
    forms = [parts[0][0], parts[1][0]]
    assert forms[0] == forms[1]
    assert parts[0][1] is not None and parts[0][1].startswith(b"2")
    assert parts[1][1] is not None and parts[1][1].startswith(b"3")
    assert parts[0][2].startswith(b"AWS4-HMAC-SHA256 Credential=")
    assert (parts[0][3], parts[1][3]) == (None, b"9a")
    assert b"uthorization" not in forms[0] and b"x-amz-date" not in forms[0].lower()
    assert forms[0].startswith(b"GET /bench/4k/obj-1 HTTP/1.1\r\n")
    assert forms[0].endswith(b"\r\n\r\n") and b"x-amz-content-sha256" in forms[0].lower()


def test_a_head_without_authorization_has_no_form() -> None:
    head = b"GET /b/k HTTP/1.1\r\nHost: h\r\nx-amz-date: 20260101T000000Z\r\n\r\n"
    assert module.signed_parts_py(head) is None


@pytest.mark.parametrize(
    "line",
    [
        b"X-Amz-Date: 20260101T000000Z",  # a second x-amz-date
        b"authorization: again",  # a second Authorization
        b"amz-sdk-request: a\x01b",  # a control byte
        b"amz-sdk-request: a\x7fb",
        b"amz-sdk-request: caf\xc3\xa9",  # not ASCII
        b"amz-sdk-request: " + b"1" * 8190,  # longer than a line may be
    ],
)
def test_a_per_call_line_not_as_a_head_has_it_leaves_no_parts(line: bytes) -> None:
    head = _boto3_head().replace(b"\r\n\r\n", b"\r\n" + line + b"\r\n\r\n")
    assert module.signed_parts_py(_boto3_head()) is not None
    assert module.signed_parts_py(head) is None
    if BUILT:
        from gateway.s3 import _signed_form

        assert _signed_form.signed_parts(head) is None


def test_a_per_call_line_ended_by_a_lone_cr_or_lf_leaves_no_parts() -> None:
    for end in (b"\r", b"\n"):
        head = b"GET /b/k HTTP/1.1\r\nauthorization: x" + end + b"Host: h\r\n\r\n"
        assert module.signed_parts_py(head) is None


def test_values_come_without_the_blanks_around_them() -> None:
    head = b"GET /b/k HTTP/1.1\r\nHost: h\r\nAuthorization:\t AWS4 x \t\r\nx-amz-date:\r\n\r\n"
    parts = module.signed_parts_py(head)
    assert parts == (b"GET /b/k HTTP/1.1\r\nHost: h\r\n\r\n", b"", b"AWS4 x", None, None)


@needs_twin
def test_the_twins_agree_on_boto3_heads() -> None:
    from gateway.s3 import _signed_form

    for head in (_boto3_head(), _boto3_head().replace(b"Host", b"hOST")):
        assert _signed_form.signed_parts(head) == module.signed_parts_py(head) is not None


@needs_twin
def test_the_twins_agree_on_generated_heads() -> None:
    from gateway.s3 import _signed_form

    rng = random.Random(20261129)
    formed = 0
    for _ in range(20_000):
        lines = [rng.choice(LINES) for _ in range(rng.randint(0, 7))]
        head = (
            b"GET /b/k HTTP/1.1\r\n" + b"\r\n".join(lines) + rng.choice((b"\r\n\r\n", b"", b"\r"))
        )
        if rng.random() < 0.2:  # a byte flipped anywhere: a CR, an LF, a colon, a case
            at = rng.randrange(len(head))
            head = head[:at] + rng.choice((b"\r", b"\n", b":", b"A", b"\r\n")) + head[at + 1 :]
        expected = module.signed_parts_py(head)
        assert _signed_form.signed_parts(head) == expected, head
        formed += expected is not None
    assert formed > 2_000  # the generator does reach the case that keeps a form


def _boto3_head() -> bytes:
    headers = sign_headers("GET", "127.0.0.1:9000", "/bench/4k/obj-1")
    lines = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    return f"GET /bench/4k/obj-1 HTTP/1.1\r\n{lines}\r\n".encode()
