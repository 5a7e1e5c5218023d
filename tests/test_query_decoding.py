"""The short cuts taken on a query or a path before it is routed or signed.

A request whose query or path the memos do not hold (every read of a dataset
larger than them) is decoded on arrival: the front's query pairs, and SigV4's
canonical encoding of the path and of each query part. Both skip the work on
parts with nothing to decode or encode. These check, on generated text, that
what the short cuts give is what the library's full round trip gives.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, quote, unquote_to_bytes

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.s3 import front, signing, sigv4

# Pieces that matter to the decoders: separators, escapes (whole, cut short, of
# unreserved or of UTF-8 bytes), '+', non-ASCII, and what aiohttp leaves of bad bytes.
_PIECES = st.sampled_from([
    "a", "Z", "0", "-", "_", ".", "~", "/", "=", "&", "+", " ", ";", "%", "%2", "%2F", "%2f",
    "%41", "%7E", "%7e", "%2D", "%20", "%40", "%60", "%7F", "%FF", "%C3%A9", "%zz", "é",
    "\udcff", "X-Amz-Signature", "x-amz-signature", "X-Amz-Sig%6Eature", "x-amz-date",
])  # fmt: skip
_TEXT = st.lists(_PIECES, max_size=24).map("".join)


@settings(max_examples=400)
@given(_TEXT)
def test_the_fronts_query_pairs_are_parse_qsls(raw_query: str) -> None:
    front._query_pairs.cache_clear()
    expected = tuple(parse_qsl(raw_query, keep_blank_values=True))
    assert front._query_pairs(raw_query) == expected


@settings(max_examples=400)
@given(_TEXT, st.sampled_from(["", "/"]))
def test_uri_encode_is_the_decode_and_encode_round_trip(value: str, safe: str) -> None:
    expected = quote(unquote_to_bytes(signing.utf8(value)), safe=safe)
    assert signing.uri_encode(value, safe=safe) == expected


def test_what_needs_no_encoding_is_returned_as_it_is() -> None:
    path = "/bucket/train/shard-000123_v1.2~final.tar"
    assert signing.uri_encode(path, safe="/") is path
    assert signing.uri_encode("20261129T095000Z", safe="") == "20261129T095000Z"
    assert signing.uri_encode("a/b", safe="") == "a%2Fb"
    assert signing.uri_encode("%41%7e", safe="") == "A~"


def _canonical_query_in_full(raw_query: str, presigned: bool) -> str:
    """SigV4's canonical query as the verifier builds one it cannot take as it is."""
    pairs = []
    for item in raw_query.split("&"):
        name, _, value = item.partition("=")
        if item and not (presigned and signing.decode(name).lower() == "x-amz-signature"):
            pairs.append((signing.uri_encode(name, safe=""), signing.uri_encode(value, safe="")))
    return "&".join(f"{name}={value}" for name, value in sorted(pairs))


@settings(max_examples=400)
@given(_TEXT, st.booleans())
def test_a_query_canonical_already_is_only_sorted(raw_query: str, presigned: bool) -> None:
    expected = _canonical_query_in_full(raw_query, presigned)
    assert sigv4._canonical_query(raw_query, presigned=presigned) == expected


def test_a_presigned_urls_query_is_taken_as_it_is() -> None:
    query = ("X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=ak%2F20261129%2Fus-east-1"
             "%2Fs3%2Faws4_request&X-Amz-Date=20261129T095000Z&X-Amz-Expires=3600"
             "&X-Amz-SignedHeaders=host&X-Amz-Signature=abc")  # fmt: skip
    assert sigv4._CANONICAL_QUERY.fullmatch(query) is not None
    assert sigv4._canonical_query(query, presigned=True) == _canonical_query_in_full(query, True)
    assert "Signature" not in sigv4._canonical_query(query, presigned=True)
