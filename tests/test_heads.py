"""Request heads read on the wire (gateway/core/heads.py), both twins.

Each case runs against the Python functions and, where it was built, the
compiled twin (``gateway/core/_heads.pyx``); a property test feeds both the
same generated reads and heads and requires the same answers, so neither
drifts from the other. What is checked: a read is split into heads only if it
is nothing but whole bodiless heads (a body announced by Content-Length other
than 0, Transfer-Encoding or Upgrade, a lone LF, a cut head: None); a head is
parsed only if it is a plain GET over HTTP/1.1 (anything else, or anything
malformed, is None: aiohttp's parser reads it); and what a plain head parses
to is what aiohttp's C parser makes of the same bytes.
"""

from __future__ import annotations

import asyncio
import importlib.util

import pytest
from aiohttp.http_parser import HttpRequestParser
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core import compiled, heads

PRESIGNED = (
    b"GET /bucket/key%20one.jpg?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Signature=ab12 HTTP/1.1\r\n"
    b"Host: 127.0.0.1:9000\r\nUser-Agent: wrk\r\n\r\n"
)
BOTO3 = (
    b"GET /bucket/k HTTP/1.1\r\nHost: h\r\nAccept-Encoding: identity\r\n"
    b"User-Agent: Boto3/1.35 md/Botocore#1.35\r\nX-Amz-Date: 20261129T000000Z\r\n"
    b"X-Amz-Content-SHA256: UNSIGNED-PAYLOAD\r\n"
    b"Authorization: AWS4-HMAC-SHA256 Credential=k/20261129/us-east-1/s3/aws4_request, "
    b"SignedHeaders=host;x-amz-date, Signature=00ff\r\nRange: bytes=0-8388607\r\n\r\n"
)

TWINS = [pytest.param((heads.bodiless_heads_py, heads.parse_head_py), id="python")]
if importlib.util.find_spec("gateway.core._heads") is not None:
    from gateway.core import _heads

    TWINS.append(pytest.param((_heads.bodiless_heads, _heads.parse_head), id="compiled"))


@pytest.fixture(params=TWINS)
def twin(request: pytest.FixtureRequest):
    return request.param


def test_the_compiled_twin_is_built_and_used_unless_refused() -> None:
    """``pip install`` builds it here (gcc is on the machine), and the module runs it
    unless ``HOARD_NO_EXTENSIONS`` asks for Python (the hit tests' second run)."""
    assert len(TWINS) == 2, "gateway/core/_heads.pyx was not built"
    expected = not compiled.NO_EXTENSIONS
    assert compiled.in_use()["gateway.core._heads"] is expected
    assert (heads.parse_head is heads.parse_head_py) is not expected


def test_whole_bodiless_heads_are_split(twin) -> None:
    split, _ = twin
    assert split(PRESIGNED) == [PRESIGNED]
    assert split(PRESIGNED + BOTO3 + PRESIGNED) == [PRESIGNED, BOTO3, PRESIGNED]
    zero = b"GET /b/k HTTP/1.1\r\nHost: h\r\ncontent-length:  0 \r\n\r\n"
    assert split(zero) == [zero]


@pytest.mark.parametrize(
    "data",
    [
        PRESIGNED[:-2],  # cut before its blank line
        PRESIGNED[:30],
        PRESIGNED + BOTO3[:40],  # a whole head, then part of one
        b"PUT /b/k HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\n",
        b"PUT /b/k HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nabcde",
        b"POST /b?bundle HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"GET /b/k HTTP/1.1\r\nHost: h\r\nCONTENT-LENGTH: 10\r\n\r\n",
        b"GET /b/k HTTP/1.1\r\nHost: h\r\nContent-Lengthy: 0\r\n\r\n",  # a prefix is enough
        b"GET /b/k HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\n\r\n",
        b"GET /b/k HTTP/1.1\r\nHost: h\nContent-Length: 5\r\n\r\n",  # a lone LF
        b"GET /b/k HTTP/1.1\nHost: h\r\n\r\n",
        b"",
    ],
)
def test_anything_but_whole_bodiless_heads_is_not_split(twin, data: bytes) -> None:
    split, _ = twin
    assert split(data) is None


def test_a_plain_get_parses_as_aiohttp_parses_it(twin) -> None:
    _, parse = twin
    loop = asyncio.new_event_loop()
    try:
        theirs = HttpRequestParser(object(), loop, 2**16, max_line_size=8190, max_field_size=8190)  # type: ignore[arg-type]
        for raw in (PRESIGNED, BOTO3):
            ours = parse(raw)
            (message, _), *_ = theirs.feed_data(raw)[0]
            assert (ours.method, ours.path, ours.version) == (message.method, message.path,
                                                              message.version)  # fmt: skip
            assert list(ours.headers.items()) == list(message.headers.items())
            assert ours.url == message.url
            assert not (ours.should_close or ours.upgrade or ours.chunked)
            assert ours.raw == raw
            assert ours.names == {name.lower() for name in message.headers}
    finally:
        loop.close()


@pytest.mark.parametrize(
    "head",
    [
        b"HEAD /b/k HTTP/1.1\r\nHost: h\r\n\r\n",
        b"GET /b/k HTTP/1.0\r\nHost: h\r\n\r\n",
        b"GET /b/k HTTP/1.1 \r\nHost: h\r\n\r\n",
        b"GET  /b/k HTTP/1.1\r\nHost: h\r\n\r\n",
        b"GET http://h/b/k HTTP/1.1\r\nHost: h\r\n\r\n",  # absolute form: aiohttp's
        b"GET /b/k\x7f HTTP/1.1\r\nHost: h\r\n\r\n",
        b"GET /b/\xc3\xa9 HTTP/1.1\r\nHost: h\r\n\r\n",  # not ASCII
        b"GET /b/k HTTP/1.1\r\nHost : h\r\n\r\n",  # a name that is no token
        b"GET /b/k HTTP/1.1\r\nHost\r\n\r\n",
        b"GET /b/k HTTP/1.1\r\n: h\r\n\r\n",
        b"GET /b/k HTTP/1.1\r\nHost: h\r\nhost: h\r\n\r\n",  # twice
        b"GET /b/k HTTP/1.1\r\nHost: h\x01\r\n\r\n",
        b"GET /b/k HTTP/1.1\r\nHost: h\rx\r\n\r\n",
        b"GET /b/k HTTP/1.1\r\n Folded: h\r\n\r\n",
        b"GET /b/k HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
        b"GET /b/k HTTP/1.1\r\nHost: h\r\nConnection: keep-alive, Upgrade\r\n\r\n",
        b"GET /b/k HTTP/1.1\r\nX: " + b"v" * 8200 + b"\r\n\r\n",  # longer than aiohttp allows
        b"GET /" + b"k" * 8200 + b" HTTP/1.1\r\nHost: h\r\n\r\n",
    ],
)
def test_anything_but_a_plain_get_is_left_to_aiohttp(twin, head: bytes) -> None:
    _, parse = twin
    assert parse(head) is None


def test_values_are_trimmed_and_keep_alive_is_plain(twin) -> None:
    _, parse = twin
    parsed = parse(b"GET /b/k HTTP/1.1\r\nHost:\t h \t\r\nConnection: Keep-Alive\r\nX-E:\r\n\r\n")
    assert list(parsed.headers.items()) == [("Host", "h"), ("Connection", "Keep-Alive"),
                                            ("X-E", "")]  # fmt: skip


LINE = st.sampled_from(
    [b"Host: h", b"X-A: v", b"content-length: 0", b"Content-Length: 7", b"Transfer-Encoding: x",
     b"Upgrade: y", b"Connection: close", b"Bad Name: v", b"X-B:\tv ", b"X-C: \x01", b"",
     b"GET /b/k HTTP/1.1", b"GET /b/k HTTP/1.0", b"PUT /b/k HTTP/1.1", b"X-D: \xc3\xa9"]
)  # fmt: skip
ENDS = st.sampled_from([b"\r\n", b"\n", b"\r"])


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(LINE, ENDS), max_size=10), st.binary(max_size=8))
def test_the_twins_agree_on_any_read(parts, tail) -> None:
    data = b"".join(line + end for line, end in parts) + tail
    python = heads.bodiless_heads_py(data)
    if len(TWINS) == 2:
        assert _heads.bodiless_heads(data) == python
    for head in python or [data + b"\r\n\r\n"]:
        ours = heads.parse_head_py(head)
        if len(TWINS) == 2:
            theirs = _heads.parse_head(head)
            assert (ours is None) == (theirs is None), head
            if ours is not None:
                assert (ours.path, list(ours.headers.items()), ours.names) == (
                    theirs.path, list(theirs.headers.items()), theirs.names)  # fmt: skip
