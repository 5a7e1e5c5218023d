"""The pure parts of a bundle: its request checked, and its TAR headers read back by tarfile."""

from __future__ import annotations

import io
import json
import tarfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.s3.bundle import request, tar
from gateway.s3.errors import Code, S3Error


def _code(body: bytes) -> Code:
    with pytest.raises(S3Error) as caught:
        request.parse_keys(body)
    return caught.value.code


def test_json_keys_come_in_order_with_duplicates_and_escapes():
    body = json.dumps({"keys": ["b", "ü/ключ.txt", "b"]}).encode()
    assert b"\\u" in body  # as tigris-boto3-ext sends it
    assert request.parse_keys(body) == ["b", "ü/ключ.txt", "b"]


def test_xml_keys_with_or_without_the_namespace():
    for ns in ("", ' xmlns="http://s3.amazonaws.com/doc/2006-03-01/"'):
        body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Bundle{ns}><Object><Key>a/1</Key>'
                "</Object><Object><Key>a/&amp;2</Key></Object></Bundle>").encode()  # fmt: skip
        assert request.parse_keys(body) == ["a/1", "a/&2"]


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b'{"keys": []}', Code.InvalidArgument),
        (json.dumps({"keys": ["k"] * 5001}).encode(), Code.InvalidArgument),
        (b"{not json", Code.InvalidArgument),
        (b'{"keys": "a"}', Code.InvalidArgument),
        (b'{"keys": [1]}', Code.InvalidArgument),
        (b"[]", Code.InvalidArgument),
        (b"", Code.InvalidArgument),
        (b"<Bundle><Object>", Code.MalformedXML),
        (b"<Other/>", Code.MalformedXML),
        (b"<Bundle><Object></Object></Bundle>", Code.MalformedXML),
        (b'<!DOCTYPE b [<!ENTITY x "y">]><Bundle><Object><Key>&x;</Key></Object></Bundle>',
         Code.MalformedXML),
        (json.dumps({"keys": ["a/../b"]}).encode(), Code.InvalidArgument),
        (json.dumps({"keys": [".."]}).encode(), Code.InvalidArgument),
        (json.dumps({"keys": ["a\x00b"]}).encode(), Code.InvalidArgument),
        (json.dumps({"keys": ["a\nb"]}).encode(), Code.InvalidArgument),
        (json.dumps({"keys": [""]}).encode(), Code.InvalidArgument),
        (b'{"keys": ["\\ud800"]}', Code.InvalidArgument),
        (json.dumps({"keys": ["é" * 1024]}).encode(), Code.KeyTooLongError),
        (b" " * (request.MAX_BODY + 1), Code.MaxMessageLengthExceeded),
    ],
)  # fmt: skip
def test_bad_bodies_are_clear_400s(body: bytes, code: Code):
    assert _code(body) is code
    assert code.status == 400


def test_a_key_of_1024_bytes_and_5000_keys_are_taken():
    assert request.parse_keys(json.dumps({"keys": ["k" * 1024]}).encode()) == ["k" * 1024]
    assert len(request.parse_keys(json.dumps({"keys": ["k"] * 5000}).encode())) == 5000
    assert request.parse_keys(json.dumps({"keys": ["a..b/.x/..c"]}).encode()) == ["a..b/.x/..c"]


def test_options_from_headers():
    assert request.options({}) == request.Options("none", "skip")
    headers = {"X-Tigris-Bundle-Format": "TAR", "X-Tigris-Bundle-Compression": "gzip",
               "X-Tigris-Bundle-On-Error": "fail"}  # fmt: skip
    assert request.options(headers) == request.Options("gzip", "fail")
    framed = {"X-Tigris-Bundle-On-Error": "fail", "X-Hoard-Bundle-Framing": "Length"}
    assert request.options(framed) == request.Options("none", "fail", "length")
    for name, value, code in [
        ("X-Tigris-Bundle-Format", "zip", Code.InvalidArgument),
        ("X-Tigris-Bundle-Compression", "lz4", Code.InvalidArgument),
        ("X-Tigris-Bundle-Compression", "zstd", Code.NotImplemented),
        ("X-Tigris-Bundle-On-Error", "ignore", Code.InvalidArgument),
        ("X-Hoard-Bundle-Framing", "raw", Code.InvalidArgument),
    ]:
        with pytest.raises(S3Error) as caught:
            request.options({name: value})
        assert caught.value.code is code


def _archive(members: list[tuple[str, bytes, int]]) -> bytes:
    out = bytearray()
    for name, data, mtime in members:
        out += tar.member(name, len(data), mtime) + data + tar.padding(len(data))
    return bytes(out + tar.END)


_names = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1,
    max_size=300,
).filter(lambda n: not n.endswith("/") and n not in (".", ".."))  # fmt: skip


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(_names, st.binary(max_size=1500), st.integers(0, 8**11 - 1)), max_size=5))
def test_tarfile_reads_back_what_was_built(members):
    with tarfile.open(fileobj=io.BytesIO(_archive(members)), mode="r|") as archive:
        read = []
        for info in archive:
            assert info.type == tarfile.REGTYPE and info.mode == 0o644
            read.append((info.name, archive.extractfile(info).read(), info.mtime))
    assert read == members


def test_a_key_ending_in_a_slash_stays_a_regular_file():
    with tarfile.open(fileobj=io.BytesIO(_archive([("d/marker/", b"x", 0)])), mode="r|") as t:
        info = next(iter(t))
        assert (info.name, info.isreg(), t.extractfile(info).read()) == ("d/marker/", True, b"x")


def test_headers_are_one_block_unless_the_name_needs_pax():
    assert len(tar.member("a" * 100, 1, 0)) == 512
    assert len(tar.member("a" * 101, 1, 0)) == 1536
    assert len(tar.member("é", 1, 0)) == 1536
