"""The write operations' request bodies: a document type declaration is refused in any encoding."""

from __future__ import annotations

import pytest

from gateway.s3.errors import Code, S3Error
from gateway.s3.xml_writes import parse_complete, parse_delete

_BOMB = ('<?xml version="1.0" encoding="{enc}"?><!DOCTYPE Delete [<!ENTITY x "boom">'
         '<!ENTITY y "&x;&x;&x;&x;">]><Delete><Object><Key>&y;</Key></Object></Delete>')  # fmt: skip
_PLAIN = '<?xml version="1.0" encoding="{enc}"?><Delete><Object><Key>k</Key></Object></Delete>'


@pytest.mark.parametrize(("codec", "declared"), [
    ("utf-8", "UTF-8"), ("latin-1", "ISO-8859-1"),
    ("utf-16", "UTF-16"), ("utf-16-le", "UTF-16"), ("utf-16-be", "UTF-16"),  # BOM, none, none
])  # fmt: skip
def test_a_dtd_is_refused_whatever_the_encoding(codec: str, declared: str) -> None:
    body = _BOMB.format(enc=declared).encode(codec)
    assert (b"<!DOCTYPE" in body) == (declared != "UTF-16")  # the old byte check's blind spot
    with pytest.raises(S3Error) as refused:
        parse_delete(body)
    assert refused.value.code is Code.MalformedXML


def test_an_internal_subset_without_doctype_keyword_bytes_is_refused_too() -> None:
    body = ('<?xml version="1.0" encoding="UTF-16"?><!DOCTYPE CompleteMultipartUpload ['
            '<!ENTITY e "1">]><CompleteMultipartUpload><Part><PartNumber>&e;</PartNumber>'
            '<ETag>"a"</ETag></Part></CompleteMultipartUpload>').encode("utf-16")  # fmt: skip
    with pytest.raises(S3Error):
        parse_complete(body)


@pytest.mark.parametrize("encoding", ["UTF-8", "UTF-16"])
def test_a_plain_body_parses_in_either_encoding(encoding: str) -> None:
    request = parse_delete(_PLAIN.format(enc=encoding).encode(encoding))
    assert [key for key, _ in request.objects] == ["k"]


# Encodings expat does not read itself (it raised ValueError, a 500): read as declared.
_MULTI_BYTE = [("shift_jis", "Shift_JIS"), ("gbk", "GBK"), ("euc-jp", "EUC-JP"),
               ("big5", "Big5"), ("utf-7", "UTF-7")]  # fmt: skip
_JAPANESE = "日本語のキー"


@pytest.mark.parametrize(("codec", "declared"), _MULTI_BYTE)
def test_a_body_in_a_multi_byte_encoding_is_read_as_declared(codec: str, declared: str) -> None:
    key = _JAPANESE if declared != "Big5" else "中文鍵"
    body = _PLAIN.format(enc=declared).replace(">k<", f">{key}<").encode(codec)
    assert [k for k, _ in parse_delete(body).objects] == [key]
    complete = (f'<?xml version="1.0" encoding="{declared}"?><CompleteMultipartUpload><Part>'
                '<PartNumber>1</PartNumber><ETag>"e"</ETag></Part></CompleteMultipartUpload>')  # fmt: skip
    assert parse_complete(complete.encode(codec)) == [(1, '"e"')]


@pytest.mark.parametrize(("codec", "declared"), _MULTI_BYTE)
def test_a_dtd_in_a_multi_byte_encoding_is_refused(codec: str, declared: str) -> None:
    with pytest.raises(S3Error) as refused:
        parse_delete(_BOMB.format(enc=declared).encode(codec))
    assert refused.value.code is Code.MalformedXML


@pytest.mark.parametrize(
    "body",
    [_PLAIN.format(enc="no-such-codec").encode(),  # unknown to expat and to Python
     _PLAIN.format(enc="Shift_JIS").replace(">k<", ">\x81<").encode("latin-1"),  # half a char
     _PLAIN.format(enc="UTF-7").replace(">k<", ">+/v8-+<").encode()],  # broken UTF-7
    ids=["unknown", "truncated-shift-jis", "bad-utf-7"],
)  # fmt: skip
def test_a_body_not_in_its_declared_encoding_is_malformed(body: bytes) -> None:
    with pytest.raises(S3Error) as refused:
        parse_delete(body)
    assert refused.value.code is Code.MalformedXML
