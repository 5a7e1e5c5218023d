"""SigV4 verification against signatures made by botocore, the signer most clients use.

Every request is signed for real (``S3SigV4Auth``, ``S3SigV4QueryAuth`` or a boto3 client
stopped just before it sends), turned into the ``RequestView`` the server would see, and
verified. Each failure case asserts the exact S3 error code.
"""

from __future__ import annotations

import calendar
import hashlib
import hmac
import time
from collections.abc import Callable, Iterator
from email.utils import parsedate
from urllib.parse import quote, urlsplit

import boto3
import pytest
from botocore.auth import S3SigV4Auth, S3SigV4QueryAuth, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from multidict import CIMultiDict, CIMultiDictProxy

from gateway.s3 import sigv4
from gateway.s3.errors import Code, S3Error
from gateway.s3.sigv4 import RequestView, SigV4Verifier, derive_signing_key, is_signed

KEY = "AKIDHOARDTEST"
SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
ENDPOINT = "http://hoard:9000"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
SPECIAL_KEYS = [
    "plain.txt",
    "dir/with space.txt",
    "unicode/ü日本語-é.bin",
    "a+b=c&d;e,f.txt",
    "tilde~/x~y",
    "specials/!*'()$@:.txt",
    "percent%25literal%",
    "double//slash/./dot/../x",
    "hash#and?question",
]


class RecordingAuth(S3SigV4Auth):
    """botocore's header signer, keeping the strings it signed to compare with ours."""

    canonical = ""
    to_sign = ""

    def canonical_request(self, request: AWSRequest) -> str:
        self.canonical = super().canonical_request(request)
        return self.canonical

    def string_to_sign(self, request: AWSRequest, canonical_request: str) -> str:
        self.to_sign = super().string_to_sign(request, canonical_request)
        return self.to_sign


def view(request: AWSRequest) -> RequestView:
    """What aiohttp would hand the server for this request."""
    parts = urlsplit(request.url)
    headers = CIMultiDict(
        (name, value.decode() if isinstance(value, bytes) else value)  # a sent request has bytes
        for name, value in request.headers.items()
    )
    if "Host" not in headers:
        headers["Host"] = parts.netloc  # added by the HTTP client, signed by botocore
    return RequestView(request.method, parts.path, parts.query, CIMultiDictProxy(headers))


def make(
    method: str, path: str, query: str, headers: dict[str, str] | None, body: bytes, url: str
) -> AWSRequest:
    target = url + path + (f"?{query}" if query else "")
    return AWSRequest(method=method, url=target, headers=headers or {}, data=body)


def sign(
    method: str = "GET",
    path: str = "/bucket/key",
    query: str = "",
    *,
    headers: dict[str, str] | None = None,
    body: bytes = b"",
    url: str = ENDPOINT,
    region: str = "us-east-1",
    key: str = KEY,
    secret: str = SECRET,
    unsigned_payload: bool = False,
    signer: type[SigV4Auth] = S3SigV4Auth,
) -> RequestView:
    request = make(method, path, query, headers, body, url)
    if unsigned_payload:
        request.context["client_config"] = Config(s3={"payload_signing_enabled": False})
    signer(Credentials(key, secret), "s3", region).add_auth(request)
    return view(request)


def presign(
    method: str = "GET",
    path: str = "/bucket/key",
    query: str = "",
    *,
    expires: int = 3600,
    headers: dict[str, str] | None = None,
    url: str = ENDPOINT,
    region: str = "us-east-1",
) -> RequestView:
    request = make(method, path, query, headers, b"", url)
    S3SigV4QueryAuth(Credentials(KEY, SECRET), "s3", region, expires=expires).add_auth(request)
    return view(request)


def verifier(clock: Callable[[], float] = time.time) -> SigV4Verifier:
    return SigV4Verifier({KEY: SECRET}, clock=clock)


def later(seconds: float) -> Callable[[], float]:
    return lambda: time.time() + seconds


def refused(req: RequestView, code: Code, v: SigV4Verifier | None = None) -> S3Error:
    with pytest.raises(S3Error) as caught:
        (v or verifier()).verify(req)
    assert caught.value.code is code, caught.value.message
    return caught.value


def edit(req: RequestView, **changes: str | None) -> RequestView:
    """The same request with headers replaced (None removes one)."""
    headers = CIMultiDict(req.headers)
    for name, value in changes.items():
        headers.popall(name.replace("_", "-"), None)
        if value is not None:
            headers[name.replace("_", "-")] = value
    return RequestView(req.method, req.raw_path, req.raw_query, CIMultiDictProxy(headers))


def with_query(req: RequestView, raw_query: str) -> RequestView:
    return RequestView(req.method, req.raw_path, raw_query, req.headers)


def with_path(req: RequestView, raw_path: str) -> RequestView:
    return RequestView(req.method, raw_path, req.raw_query, req.headers)


def client_request(call: Callable[[object], object]) -> RequestView:
    """The request a real boto3 client sends for ``call``, caught just before the socket."""

    class Sent(Exception):
        pass

    def stop(request: AWSRequest, **_: object) -> None:
        raise Sent(request)

    client = boto3.client(
        "s3",
        endpoint_url=ENDPOINT,
        region_name="eu-west-3",
        aws_access_key_id=KEY,
        aws_secret_access_key=SECRET,
        config=Config(retries={"total_max_attempts": 1}, s3={"addressing_style": "path"}),
    )
    client.meta.events.register("before-send.s3", stop)
    with pytest.raises(Sent) as sent:
        call(client)
    return view(sent.value.args[0])


# --- requests that verify ---------------------------------------------------------------


@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_object_read_verifies_with_the_context_later_stages_need(method: str) -> None:
    req = sign(method)
    ctx = verifier().verify(req)
    date = ctx.amz_date[:8]
    assert (ctx.access_key, ctx.region, ctx.presigned) == (KEY, "us-east-1", False)
    assert ctx.scope == f"{date}/us-east-1/s3/aws4_request"
    assert ctx.amz_date == req.headers["x-amz-date"]
    assert ctx.payload_hash == EMPTY_SHA256
    assert ctx.signing_key == derive_signing_key(SECRET, date, "us-east-1")
    assert req.headers["Authorization"].endswith(f"Signature={ctx.seed_signature}")


@pytest.mark.parametrize("key", SPECIAL_KEYS)
def test_keys_with_special_characters(key: str) -> None:
    req = sign(path="/bucket/" + quote(key, safe="/~"))
    assert verifier().verify(req).access_key == KEY


@pytest.mark.parametrize("key", SPECIAL_KEYS)
def test_keys_sent_by_boto3(key: str) -> None:
    req = client_request(lambda c: c.get_object(Bucket="bucket", Key=key, Range="bytes=0-9"))
    assert verifier().verify(req).region == "eu-west-3"


def test_path_sent_unencoded_but_signed_in_the_aws_form() -> None:
    # Some HTTP stacks send '(' or '!' raw while the SDK signed them percent-encoded.
    req = sign(path="/bucket/" + quote("it's (1)!.txt", safe="/~"))
    assert verifier().verify(with_path(req, "/bucket/it's%20(1)!.txt")).access_key == KEY


@pytest.mark.parametrize("path", ["/bucket/a%2Fb", "/bucket/%c3%bc", "/bucket/a%7Eb"])
def test_path_signed_exactly_as_sent_is_the_fallback(path: str) -> None:
    assert verifier().verify(sign(path=path)).access_key == KEY


def test_list_with_awkward_query_parameters() -> None:
    query = "&".join(
        [
            "prefix=" + quote("data set/ü+x", safe="-_.~"),
            "list-type=2",
            "delimiter=%2F",
            "continuation-token=" + quote("1/abc+def==", safe="-_.~"),
            "encoding-type=url",
        ]
    )
    assert verifier().verify(sign(path="/bucket", query=query)).access_key == KEY


def test_list_sent_by_boto3() -> None:
    req = client_request(
        lambda c: c.list_objects_v2(
            Bucket="bucket",
            Prefix="data set/ü+x ~'()",
            Delimiter="/",
            ContinuationToken="1/abc+def==",
            StartAfter="a=b&c",
        )
    )
    assert "list-type=2" in req.raw_query
    assert verifier().verify(req).access_key == KEY


def test_query_sent_in_another_encoding_than_signed() -> None:
    # The canonical query re-encodes what was sent: '/' and '(' may travel raw, hex in
    # lowercase, and the SDK still signed the AWS form.
    req = sign(path="/bucket", query="prefix=a%2Fb%28%C3%BC&delimiter=%2F")
    sent = with_query(req, "prefix=a/b(%c3%bc&delimiter=/")
    assert verifier().verify(sent).access_key == KEY


def test_query_parameter_without_value_and_repeated_names() -> None:
    req = sign("POST", path="/bucket/key", query="uploads&tag=b&tag=a")
    assert verifier().verify(req).access_key == KEY


def test_virtual_hosted_bucket_with_port_in_host() -> None:
    req = sign(path="/key", url="http://bucket.hoard.internal:9000")
    assert req.headers["Host"] == "bucket.hoard.internal:9000"
    assert verifier().verify(req).access_key == KEY


def test_any_region_is_accepted_and_used_for_the_key() -> None:
    ctx = verifier().verify(sign(region="ap-southeast-7"))
    assert ctx.region == "ap-southeast-7"
    assert ctx.signing_key == derive_signing_key(SECRET, ctx.amz_date[:8], "ap-southeast-7")


def test_unsigned_payload() -> None:
    req = sign("PUT", body=b"data", url="https://hoard", unsigned_payload=True)
    assert verifier().verify(req).payload_hash == "UNSIGNED-PAYLOAD"


def test_signed_payload_hash_is_returned_not_checked() -> None:
    req = sign("PUT", body=b"hello world")
    assert verifier().verify(req).payload_hash == hashlib.sha256(b"hello world").hexdigest()


def test_streaming_payload_marker_is_returned() -> None:
    marker = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
    req = sign("PUT", headers={"X-Amz-Content-SHA256": marker}, signer=SigV4Auth)
    assert verifier().verify(req).payload_hash == marker


def test_payload_hash_that_is_not_a_hash() -> None:
    req = sign("PUT", headers={"X-Amz-Content-SHA256": "abc"}, signer=SigV4Auth)
    assert refused(req, Code.InvalidArgument).fields["ArgumentName"] == "x-amz-content-sha256"


def test_repeated_headers_and_inner_spaces() -> None:
    request = make("GET", "/bucket/key", "", {"X-Amz-Meta-Note": "  a   b  "}, b"", ENDPOINT)
    request.headers["X-Amz-Meta-Note"] = "c"  # a second value, as HTTP allows
    S3SigV4Auth(Credentials(KEY, SECRET), "s3", "us-east-1").add_auth(request)
    req = view(request)
    assert req.headers.getall("x-amz-meta-note") == ["  a   b  ", "c"]
    assert verifier().verify(req).access_key == KEY


@pytest.fixture
def local_time_not_utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A server whose local time zone is not UTC: dates must not be read as local time."""
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.usefixtures("local_time_not_utc")
def test_date_header_instead_of_x_amz_date() -> None:
    req = sign(headers={"Date": "Thu, 01 Jan 1970 00:00:00 GMT"})  # botocore re-dates it
    assert "x-amz-date" not in req.headers
    ctx = verifier().verify(req)
    assert ctx.amz_date == time.strftime("%Y%m%dT%H%M%SZ", parsedate(req.headers["Date"]))
    refused(req, Code.RequestTimeTooSkewed, verifier(later(1000)))


def test_signature_in_uppercase_hex() -> None:
    req = sign()
    auth = req.headers["Authorization"]
    head, signature = auth.rsplit("=", 1)
    assert verifier().verify(edit(req, Authorization=f"{head}={signature.upper()}"))


@pytest.mark.parametrize("separator", [",", " ,  ", ",\t"])
def test_authorization_spacing_is_tolerated(separator: str) -> None:
    req = sign()
    auth = req.headers["Authorization"].replace(", ", separator)
    assert verifier().verify(edit(req, Authorization=auth)).access_key == KEY


# --- presigned URLs ----------------------------------------------------------------------


def test_presigned_url_verifies() -> None:
    req = presign(path="/bucket/" + quote("a b+ü~!.txt", safe="/~"), query="versionId=3%2F4")
    ctx = verifier().verify(req)
    assert (ctx.presigned, ctx.payload_hash) == (True, "UNSIGNED-PAYLOAD")
    assert ctx.seed_signature in req.raw_query


def test_presigned_url_from_boto3() -> None:
    client = boto3.client(
        "s3",
        endpoint_url=ENDPOINT,
        region_name="us-west-2",
        aws_access_key_id=KEY,
        aws_secret_access_key=SECRET,
        config=Config(signature_version="s3v4"),
    )
    params = {"Bucket": "bucket", "Key": "dir/it's a (key)+ü.txt"}
    url = client.generate_presigned_url("get_object", Params=params, ExpiresIn=300)
    parts = urlsplit(url)
    req = RequestView(
        "GET", parts.path, parts.query, CIMultiDictProxy(CIMultiDict(Host="hoard:9000"))
    )
    assert is_signed(req)
    assert verifier().verify(req).region == "us-west-2"


def test_presigned_url_with_a_signed_payload_hash() -> None:
    digest = hashlib.sha256(b"body").hexdigest()
    req = presign("PUT", headers={"X-Amz-Content-SHA256": digest})
    assert "x-amz-content-sha256" in req.raw_query.lower()  # signed as a header
    assert verifier().verify(req).payload_hash == digest


def test_presigned_url_expired() -> None:
    req = presign(expires=60)
    assert verifier(later(59)).verify(req).presigned
    error = refused(req, Code.AccessDenied, verifier(later(62)))
    assert error.message == "Request has expired"
    assert error.fields["X-Amz-Expires"] == "60"


def test_presigned_url_not_valid_yet() -> None:
    req = presign()
    assert verifier(later(-800)).verify(req).presigned
    assert refused(req, Code.AccessDenied, verifier(later(-1000))).message == (
        "Request is not valid yet"
    )


def signed_at(req: RequestView) -> float:
    stamp = req.raw_query.split("X-Amz-Date=", 1)[1][:16]
    return float(calendar.timegm(time.strptime(stamp, "%Y%m%dT%H%M%SZ")))


def test_presigned_url_is_valid_up_to_its_last_second() -> None:
    req = presign(expires=60)
    assert verifier(lambda: signed_at(req) + 60).verify(req).presigned
    refused(req, Code.AccessDenied, verifier(lambda: signed_at(req) + 60.001))


def test_presigned_url_with_expires_zero_is_always_expired() -> None:
    req = presign(expires=0)
    error = refused(req, Code.AccessDenied, verifier(lambda: signed_at(req)))
    assert error.message == "Request has expired"


@pytest.mark.parametrize("expires", ["604801", "-1", "1h", "", "1e3"])
def test_presigned_url_with_bad_expires(expires: str) -> None:
    req = presign()
    query = req.raw_query.replace("X-Amz-Expires=3600", f"X-Amz-Expires={expires}")
    refused(with_query(req, query), Code.AuthorizationQueryParametersError)


def test_presigned_url_for_seven_days_is_allowed() -> None:
    assert verifier().verify(presign(expires=604800)).presigned


def test_presigned_url_with_tampered_signature() -> None:
    req = presign()
    signature = req.raw_query.rsplit("X-Amz-Signature=", 1)[1]
    forged = ("0" if signature[0] != "0" else "1") + signature[1:]
    error = refused(
        with_query(req, req.raw_query.replace(signature, forged)), Code.SignatureDoesNotMatch
    )
    assert error.fields["SignatureProvided"] == forged
    assert signature not in repr(error.fields)


def test_presigned_url_with_tampered_path() -> None:
    refused(with_path(presign(), "/bucket/other"), Code.SignatureDoesNotMatch)


@pytest.mark.parametrize(
    "tamper",
    [
        lambda q: q.replace("versionId=1", "versionId=2"),
        lambda q: q + "&response-content-type=text%2Fhtml",
        lambda q: q + "&x",
        lambda q: q.replace("X-Amz-Expires=3600", "X-Amz-Expires=3601"),
        lambda q: q.replace("X-Amz-", "x-amz-"),  # names are signed as sent
    ],
)
def test_presigned_url_with_tampered_query(tamper: Callable[[str], str]) -> None:
    req = presign(query="versionId=1")
    assert verifier().verify(req)
    refused(with_query(req, tamper(req.raw_query)), Code.SignatureDoesNotMatch)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("X-Amz-Algorithm", "AWS4-HMAC-SHA1"),
        ("X-Amz-Date", "2026-11-21T00:00:00Z"),
        ("X-Amz-Credential", f"{KEY}%2F20261121%2Fus-east-1%2Fec2%2Faws4_request"),
        ("X-Amz-Credential", f"{KEY}%2F20261121%2Fus-east-1%2Fs3"),
    ],
)
def test_presigned_url_with_malformed_parameters(name: str, value: str) -> None:
    req = presign()
    pairs = [
        p if not p.startswith(name + "=") else f"{name}={value}" for p in req.raw_query.split("&")
    ]
    refused(with_query(req, "&".join(pairs)), Code.AuthorizationQueryParametersError)


def test_presigned_url_missing_a_parameter() -> None:
    req = presign()
    pairs = [p for p in req.raw_query.split("&") if not p.startswith("X-Amz-SignedHeaders=")]
    refused(with_query(req, "&".join(pairs)), Code.AuthorizationQueryParametersError)


def test_presigned_url_and_authorization_header_together() -> None:
    req = edit(presign(), Authorization=sign().headers["Authorization"])
    refused(req, Code.InvalidArgument)


# --- refusals of header-signed requests --------------------------------------------------


def test_wrong_secret_reports_what_the_server_signed_and_nothing_secret() -> None:
    query = "list-type=2&prefix=a%20b%2Bc"
    request = make("GET", "/bucket/a%20b", query, None, b"", ENDPOINT)
    auth = RecordingAuth(Credentials(KEY, "not-the-secret"), "s3", "us-east-1")
    auth.add_auth(request)
    req = view(request)
    error = refused(req, Code.SignatureDoesNotMatch)
    assert error.fields["AWSAccessKeyId"] == KEY
    assert error.fields["SignatureProvided"] == req.headers["Authorization"].rsplit("=", 1)[1]
    assert error.fields["CanonicalRequest"] == auth.canonical
    assert error.fields["StringToSign"] == auth.to_sign
    assert error.fields["CanonicalRequestBytes"].startswith("47 45 54 0a")  # 'GET\n'
    good = sign(path="/bucket/a%20b", query=query)  # the same strings with the right secret
    expected = good.headers["Authorization"].rsplit("=", 1)[1]
    everything = repr(error.fields) + error.message
    assert expected not in everything
    assert SECRET not in everything


def test_unknown_access_key() -> None:
    error = refused(sign(key="AKIDUNKNOWN"), Code.InvalidAccessKeyId)
    assert error.fields == {"AWSAccessKeyId": "AKIDUNKNOWN"}


@pytest.mark.parametrize("skew", [1000, -1000])
def test_request_time_too_skewed(skew: float) -> None:
    req = sign()
    assert verifier(later(skew * 0.8)).verify(req)
    error = refused(req, Code.RequestTimeTooSkewed, verifier(later(skew)))
    assert error.fields["RequestTime"] == req.headers["x-amz-date"]
    assert error.fields["MaxAllowedSkewMilliseconds"] == "900000"


def test_signature_is_checked_before_the_clock() -> None:
    req = sign(secret="wrong")
    refused(req, Code.SignatureDoesNotMatch, verifier(later(5000)))


def test_signed_header_missing_from_the_request() -> None:
    req = sign(headers={"Range": "bytes=0-9"})
    refused(edit(req, Range=None), Code.SignatureDoesNotMatch)


def test_signed_empty_header_missing_from_the_request() -> None:
    req = sign(headers={"X-Hoard-Empty": ""})
    assert verifier().verify(req)
    refused(edit(req, X_Hoard_Empty=None), Code.SignatureDoesNotMatch)


def test_changed_signed_header() -> None:
    req = sign(headers={"Range": "bytes=0-9"})
    refused(edit(req, Range="bytes=0-99"), Code.SignatureDoesNotMatch)


def test_unsigned_x_amz_header_is_refused() -> None:
    req = edit(sign(), X_Amz_Meta_Color="red")
    error = refused(req, Code.AccessDenied)
    assert error.fields["HeadersNotSigned"] == "x-amz-meta-color"


def test_host_must_be_signed() -> None:
    req = sign()
    auth = req.headers["Authorization"].replace("SignedHeaders=host;", "SignedHeaders=")
    error = refused(edit(req, Authorization=auth), Code.AccessDenied)
    assert error.fields["HeadersNotSigned"] == "host"


def _authorization(req: RequestView, old: str, new: str) -> RequestView:
    return edit(req, Authorization=req.headers["Authorization"].replace(old, new, 1))


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("Credential=", "Credentials="),
        ("SignedHeaders=", "Headers="),
        (", Signature=", ", Sig="),
        ("/us-east-1/", "/"),
        ("/s3/", "/ec2/"),
        ("aws4_request", "aws4_requestx"),
        (f"Credential={KEY}/", "Credential=/"),
        (f"{KEY}/20", f"{KEY}/1"),
        (", SignedHeaders", ", junk, SignedHeaders"),
    ],
)
def test_malformed_authorization_header(old: str, new: str) -> None:
    refused(_authorization(sign(), old, new), Code.AuthorizationHeaderMalformed)


def test_scope_date_other_than_the_request_date() -> None:
    req = sign()
    day = req.headers["x-amz-date"][:8]
    other = "19991231" if day != "19991231" else "20000101"
    error = refused(
        _authorization(req, f"/{day}/", f"/{other}/"), Code.AuthorizationHeaderMalformed
    )
    assert "This date is not the same as X-Amz-Date" in error.message


@pytest.mark.parametrize(
    "value",
    [
        f"AWS {KEY}:frJIUN8DYpKDtOLCwo//yllqDzg=",
        "AWS4-HMAC-SHA512 Credential=x",
        "AWS4-ECDSA-P256-SHA256 a",
    ],
)
def test_unsupported_signature_versions(value: str) -> None:
    error = refused(edit(sign(), Authorization=value), Code.InvalidRequest)
    assert "Please use AWS4-HMAC-SHA256" in error.message


def test_sigv2_presigned_url_is_signed_but_refused() -> None:
    req = RequestView("GET", "/bucket/key", f"AWSAccessKeyId={KEY}&Expires=1&Signature=x", {})
    assert is_signed(req)
    refused(req, Code.InvalidRequest)


def test_other_authorization_scheme() -> None:
    refused(edit(sign(), Authorization="Bearer token"), Code.InvalidArgument)


def test_missing_content_sha256() -> None:
    error = refused(edit(sign(), X_Amz_Content_SHA256=None), Code.InvalidRequest)
    assert error.message == "Missing required header for this request: x-amz-content-sha256"


@pytest.mark.parametrize("value", [None, "2026-11-21T00:00:00Z", "20261399T000000Z"])
def test_missing_or_invalid_date(value: str | None) -> None:
    error = refused(edit(sign(), X_Amz_Date=value), Code.AccessDenied)
    assert error.message == "AWS authentication requires a valid Date or x-amz-date header"


def test_is_signed() -> None:
    def req(query: str = "", **headers: str) -> RequestView:
        return RequestView("GET", "/b/k", query, CIMultiDictProxy(CIMultiDict(headers)))

    assert is_signed(req(Authorization="AWS4-HMAC-SHA256 x"))
    assert is_signed(req("X-Amz-Credential=a"))
    assert is_signed(req("x-amz-signature=a"))
    assert not is_signed(req())
    assert not is_signed(req("prefix=X-Amz-Signature"))
    assert not is_signed(req(Authorization=" "))


# --- the signing-key cache --------------------------------------------------------------


@pytest.fixture
def derivations(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, str]]:
    calls: list[tuple[str, str, str]] = []

    def counting(secret: str, date: str, region: str) -> bytes:
        calls.append((secret, date, region))
        return derive_signing_key(secret, date, region)

    monkeypatch.setattr(sigv4, "derive_signing_key", counting)
    return calls


def test_signing_key_is_derived_once_per_day_and_region(derivations: list) -> None:
    v = verifier()
    for path in ("/b/1", "/b/2", "/b/3"):
        v.verify(sign(path=path))
    v.verify(presign())
    assert len(derivations) == 1
    v.verify(sign(region="eu-central-1"))
    assert [region for _, _, region in derivations] == ["us-east-1", "eu-central-1"]


def test_signing_key_cache_is_bounded(derivations: list) -> None:
    v = verifier()
    for n in range(1100):
        v.signing_key(SECRET, "20261121", f"region-{n}")
    v.signing_key(SECRET, "20261121", "region-0")  # dropped when the cache filled up
    assert len(derivations) == 1101
    v.signing_key(SECRET, "20261121", "region-1099")  # still cached
    assert len(derivations) == 1101


def test_signing_key_is_the_sigv4_chain_botocore_uses() -> None:
    auth = S3SigV4Auth(Credentials(KEY, SECRET), "s3", "eu-north-1")
    request = AWSRequest(method="GET", url=ENDPOINT + "/")
    request.context["timestamp"] = "20261121T000000Z"
    key = derive_signing_key(SECRET, "20261121", "eu-north-1")
    assert hmac.new(key, b"x", hashlib.sha256).hexdigest() == auth.signature("x", request)


# --- the worked examples of the S3 documentation (not botocore) ----------------------------

DOC_KEY = "AKIAIOSFODNN7EXAMPLE"
DOC_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
DOC_NOW = 1369353600.0  # 2013-05-24T00:00:00Z


def test_documented_get_object_example() -> None:
    # "Example: GET Object" in "Signature Calculations for the Authorization Header".
    headers = CIMultiDict(
        {
            "Host": "examplebucket.s3.amazonaws.com",
            "Range": "bytes=0-9",
            "x-amz-content-sha256": EMPTY_SHA256,
            "x-amz-date": "20130524T000000Z",
            "Authorization": (
                f"AWS4-HMAC-SHA256 Credential={DOC_KEY}/20130524/us-east-1/s3/aws4_request,"
                "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,"
                "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
            ),
        }
    )
    req = RequestView("GET", "/test.txt", "", CIMultiDictProxy(headers))
    ctx = SigV4Verifier({DOC_KEY: DOC_SECRET}, clock=lambda: DOC_NOW).verify(req)
    assert ctx.scope == "20130524/us-east-1/s3/aws4_request"


def test_documented_presigned_url_example() -> None:
    # The example of "Authenticating Requests: Using Query Parameters".
    query = (
        "X-Amz-Algorithm=AWS4-HMAC-SHA256"
        f"&X-Amz-Credential={DOC_KEY}%2F20130524%2Fus-east-1%2Fs3%2Faws4_request"
        "&X-Amz-Date=20130524T000000Z&X-Amz-Expires=86400&X-Amz-SignedHeaders=host"
        "&X-Amz-Signature=aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404"
    )
    headers = CIMultiDictProxy(CIMultiDict(Host="examplebucket.s3.amazonaws.com"))
    req = RequestView("GET", "/test.txt", query, headers)
    ctx = SigV4Verifier({DOC_KEY: DOC_SECRET}, clock=lambda: DOC_NOW + 3600).verify(req)
    assert (ctx.presigned, ctx.payload_hash) == (True, "UNSIGNED-PAYLOAD")
    expired = SigV4Verifier({DOC_KEY: DOC_SECRET}, clock=lambda: DOC_NOW + 86401)
    refused(req, Code.AccessDenied, expired)


# --- the region Hoard serves --------------------------------------------------------------


def test_a_scope_of_another_region_is_refused_with_the_region_to_use() -> None:
    """Before: a signature scoped to any region was accepted. S3 names the right one, and
    botocore's region redirector signs again with it."""
    serving = SigV4Verifier({KEY: SECRET}, region="us-east-1")
    assert serving.verify(sign()).region == "us-east-1"
    assert serving.verify(presign()).region == "us-east-1"
    header = refused(sign(region="eu-west-1"), Code.AuthorizationHeaderMalformed, serving)
    assert header.message == (
        "The authorization header is malformed; the region 'eu-west-1' is wrong; "
        "expecting 'us-east-1'"
    )
    assert header.fields == {"Region": "us-east-1"}
    query = refused(presign(region="eu-west-1"), Code.AuthorizationQueryParametersError, serving)
    assert "the region 'eu-west-1' is wrong; expecting 'us-east-1'" in query.message
    assert query.fields == {"Region": "us-east-1"}
    # Before the key is looked up, as S3: the region is part of the credential's form.
    unknown = sign(region="eu-west-1", key="nobody")
    refused(unknown, Code.AuthorizationHeaderMalformed, serving)
