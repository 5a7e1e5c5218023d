"""SigV2 verification against signatures made by botocore.

Every request is signed for real (``HmacV1Auth``, ``HmacV1QueryAuth``, a boto3 client with
``signature_version="s3"`` stopped just before it sends, or boto3's default presigned URL
in us-east-1), turned into the ``RequestView`` the server would see, and verified. Each
failure case asserts the exact S3 error code.
"""

from __future__ import annotations

import base64
import hashlib
import time
from collections.abc import Callable
from email.utils import formatdate
from urllib.parse import quote, urlsplit

import boto3
import pytest
from botocore.auth import HmacV1Auth, HmacV1QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.compat import HTTPHeaders
from botocore.config import Config
from botocore.credentials import Credentials
from multidict import CIMultiDict, CIMultiDictProxy

from gateway.s3.errors import Code, S3Error
from gateway.s3.sigv2 import SigV2Verifier, is_sigv2
from gateway.s3.sigv4 import RequestView, is_signed

KEY = "AKIDHOARDTEST"
SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
ENDPOINT = "http://hoard:9000"
DOMAIN = "hoard.internal"
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


class RecordingAuth(HmacV1Auth):
    """botocore's header signer, keeping the string it signed to compare with ours."""

    signed = ""

    def canonical_string(self, *args: object, **kwargs: object) -> str:
        self.signed = super().canonical_string(*args, **kwargs)
        return self.signed


class AmzDateAuth(HmacV1Auth):
    """Signs as clients that cannot set Date do: x-amz-date, and an empty Date line."""

    def canonical_standard_headers(self, headers: HTTPHeaders) -> str:
        headers["x-amz-date"] = formatdate(usegmt=True)
        md5, ctype = (headers.get(name) or "" for name in ("Content-MD5", "Content-Type"))
        return f"{md5}\n{ctype}\n"


def view(request: AWSRequest, host: str | None = None) -> RequestView:
    """What aiohttp would hand the server for this request."""
    parts = urlsplit(request.url)
    headers = CIMultiDict(
        (name, value.decode() if isinstance(value, bytes) else value)  # a sent request has bytes
        for name, value in request.headers.items()
    )
    headers.setdefault("Host", host or parts.netloc)  # added by the HTTP client
    return RequestView(request.method, parts.path, parts.query, CIMultiDictProxy(headers))


def sign(
    method: str = "GET",
    path: str = "/bucket/key",
    query: str = "",
    *,
    headers: dict[str, str] | None = None,
    url: str = ENDPOINT,
    auth_path: str | None = None,
    signer: HmacV1Auth | None = None,
) -> RequestView:
    request = AWSRequest(method=method, url=url + path + (f"?{query}" if query else ""))
    for name, value in (headers or {}).items():
        request.headers[name] = value
    request.auth_path = auth_path  # botocore's full path-style path, for virtual hosts
    (signer or HmacV1Auth(Credentials(KEY, SECRET))).add_auth(request)
    return view(request)


def presign(
    method: str = "GET", path: str = "/bucket/key", query: str = "", *, expires: int = 3600
) -> RequestView:
    request = AWSRequest(method=method, url=ENDPOINT + path + (f"?{query}" if query else ""))
    HmacV1QueryAuth(Credentials(KEY, SECRET), expires=expires).add_auth(request)
    parts = urlsplit(request.url)
    return RequestView(method, parts.path, parts.query, CIMultiDictProxy(CIMultiDict()))


def verifier(clock: Callable[[], float] = time.time) -> SigV2Verifier:
    return SigV2Verifier({KEY: SECRET}, clock=clock, domains=("localhost", DOMAIN))


def later(seconds: float) -> Callable[[], float]:
    return lambda: time.time() + seconds


def refused(req: RequestView, code: Code, v: SigV2Verifier | None = None) -> S3Error:
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


def s3_client(style: str = "path", **config: object) -> object:
    return boto3.client(
        "s3",
        endpoint_url=f"http://{DOMAIN}:9000",
        region_name="us-east-1",
        aws_access_key_id=KEY,
        aws_secret_access_key=SECRET,
        config=Config(retries={"total_max_attempts": 1}, s3={"addressing_style": style}, **config),
    )


def client_request(call: Callable[[object], object], style: str = "path") -> RequestView:
    """The request a boto3 SigV2 client sends for ``call``, caught just before the socket."""

    class Sent(Exception):
        pass

    def stop(request: AWSRequest, **_: object) -> None:
        raise Sent(request)

    client = s3_client(style, signature_version="s3")
    client.meta.events.register("before-send.s3", stop)  # type: ignore[attr-defined]
    with pytest.raises(Sent) as sent:
        call(client)
    return view(sent.value.args[0])


def presigned_url(url: str, method: str = "GET", **headers: str) -> RequestView:
    parts = urlsplit(url)
    sent = CIMultiDictProxy(CIMultiDict(Host=parts.netloc, **headers))
    return RequestView(method, parts.path, parts.query, sent)


# --- requests that verify ---------------------------------------------------------------


@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_object_read_verifies_and_returns_the_access_key(method: str) -> None:
    req = sign(method)
    assert req.headers["Authorization"].startswith(f"AWS {KEY}:")
    assert is_sigv2(req) and is_signed(req)
    assert verifier().verify(req) == KEY


@pytest.mark.parametrize("key", SPECIAL_KEYS)
def test_keys_with_special_characters(key: str) -> None:
    assert verifier().verify(sign(path="/bucket/" + quote(key, safe="/~"))) == KEY


@pytest.mark.parametrize("style", ["path", "virtual"])
@pytest.mark.parametrize("key", SPECIAL_KEYS)
def test_keys_sent_by_boto3(key: str, style: str) -> None:
    req = client_request(lambda c: c.get_object(Bucket="bucket", Key=key), style)
    assert req.headers["Authorization"].startswith("AWS ")
    assert verifier().verify(req) == KEY


@pytest.mark.parametrize("style", ["path", "virtual"])
def test_listing_sent_by_boto3_signs_the_bucket_with_a_slash(style: str) -> None:
    req = client_request(lambda c: c.list_objects_v2(Bucket="bucket", Prefix="a b+ü"), style)
    assert req.raw_path == {"path": "/bucket", "virtual": "/"}[style]
    assert verifier().verify(req) == KEY


def test_bucket_path_signed_exactly_as_sent_is_the_fallback() -> None:
    assert verifier().verify(sign(path="/bucket")) == KEY


def test_virtual_hosted_bucket_is_part_of_the_resource() -> None:
    url = f"http://bucket.{DOMAIN}:9000"
    req = sign(path="/dir/a%20b.txt", url=url, auth_path="/bucket/dir/a%20b.txt")
    assert verifier().verify(req) == KEY
    unknown_domain = SigV2Verifier({KEY: SECRET}, domains=("elsewhere",))
    refused(req, Code.SignatureDoesNotMatch, unknown_domain)


@pytest.mark.parametrize(
    "query",
    [
        "acl",
        "location",
        "uploadId=x%20y&partNumber=2",
        "versionId=v%2F1%2B2",
        "response-content-type=text%2Fplain%3B%20charset%3Dutf-8&response-expires=0",
        "tagging&versionId=3",
    ],
)
def test_sub_resources_are_signed_with_decoded_values(query: str) -> None:
    req = sign(path="/bucket/key", query=query)
    assert verifier().verify(req) == KEY
    name = query.split("&")[0].partition("=")[0]
    tampered = with_query(req, req.raw_query.replace(query.split("&")[0], name + "=other", 1))
    refused(tampered, Code.SignatureDoesNotMatch)


def test_sub_resources_sent_by_boto3() -> None:
    req = client_request(
        lambda c: c.get_object(
            Bucket="bucket", Key="k", VersionId="v/1+2", ResponseContentType="text/plain; x=1"
        )
    )
    assert "response-content-type=" in req.raw_query
    assert verifier().verify(req) == KEY
    req = client_request(lambda c: c.get_bucket_location(Bucket="bucket"))
    assert verifier().verify(req) == KEY


def test_other_query_parameters_are_not_signed() -> None:
    # SigV2 signs only sub-resources: changing a listing's prefix keeps the signature.
    req = sign(path="/bucket", query="list-type=2&prefix=a")
    assert verifier().verify(with_query(req, "list-type=2&prefix=b")) == KEY


def test_content_type_and_md5_are_signed() -> None:
    md5 = base64.b64encode(hashlib.md5(b"data").digest()).decode()
    req = sign("PUT", headers={"Content-Type": "text/plain", "Content-MD5": md5})
    assert verifier().verify(req) == KEY
    refused(edit(req, Content_Type="text/html"), Code.SignatureDoesNotMatch)
    refused(edit(req, Content_MD5=None), Code.SignatureDoesNotMatch)


def test_amz_meta_headers_are_signed() -> None:
    request = AWSRequest(method="PUT", url=ENDPOINT + "/bucket/key")
    request.headers["X-Amz-Meta-Note"] = "  a  b  "
    request.headers["X-Amz-Meta-Note"] = "c"  # a second value, as HTTP allows
    request.headers["x-amz-acl"] = "private"
    HmacV1Auth(Credentials(KEY, SECRET)).add_auth(request)
    req = view(request)
    assert req.headers.getall("x-amz-meta-note") == ["  a  b  ", "c"]
    assert verifier().verify(req) == KEY
    # Repeated values join with ',' and are trimmed; inner spaces are kept, as botocore does.
    assert verifier().verify(edit(req, X_Amz_Meta_Note="a  b,c")) == KEY
    refused(edit(req, X_Amz_Meta_Note="a b,c"), Code.SignatureDoesNotMatch)
    refused(edit(req, X_Amz_Acl=None), Code.SignatureDoesNotMatch)
    refused(edit(req, X_Amz_Meta_Extra="unsigned"), Code.SignatureDoesNotMatch)


def test_x_amz_date_instead_of_date() -> None:
    req = sign(signer=AmzDateAuth(Credentials(KEY, SECRET)))
    assert "Date" not in req.headers
    assert verifier().verify(req) == KEY
    # Date is then ignored, for the clock and for the signature.
    assert verifier().verify(edit(req, Date="Thu, 01 Jan 1970 00:00:00 GMT")) == KEY
    refused(req, Code.RequestTimeTooSkewed, verifier(later(1000)))


def test_string_to_sign_is_botocores_and_never_the_expected_signature() -> None:
    signer = RecordingAuth(Credentials(KEY, "not-the-secret"))
    req = sign("PUT", query="acl", headers={"x-amz-meta-a": "1"}, signer=signer)
    error = refused(req, Code.SignatureDoesNotMatch)
    assert error.fields["StringToSign"] == signer.signed
    assert error.fields["SignatureProvided"] == req.headers["Authorization"].split(":")[1]
    assert error.fields["AWSAccessKeyId"] == KEY
    expected = sign("PUT", query="acl", headers={"x-amz-meta-a": "1"})
    assert expected.headers["Authorization"].split(":")[1] not in str(error.fields)


# The S3 guide's examples, signed by AWS rather than botocore. The guide later renamed the
# bucket to awsexamplebucket1 but kept the signatures made for "johnsmith".
DOC_SECRETS = {"AKIAIOSFODNN7EXAMPLE": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"}
DOC_EXAMPLES = [
    ("/photos/puppy.jpg", "", "19:36:42", "bWq2s1WEIj+Ydj0vQ697zp+IXMU="),
    ("/", "prefix=photos&max-keys=50&marker=puppy", "19:42:41", "htDYFYduRNen8P9ZfE/s9SuKy0U="),
    ("/", "acl", "19:44:46", "c2WLPFtWHVgbEmeEG93a4cG37dM="),
]


@pytest.mark.parametrize(("path", "query", "clock", "signature"), DOC_EXAMPLES)
def test_examples_from_the_s3_guide(path: str, query: str, clock: str, signature: str) -> None:
    date = f"Tue, 27 Mar 2007 {clock} +0000"
    headers = {"Host": "johnsmith.s3.amazonaws.com", "Date": date}
    headers["Authorization"] = f"AWS AKIAIOSFODNN7EXAMPLE:{signature}"
    v = SigV2Verifier(DOC_SECRETS, clock=lambda: 1175024200, domains=["s3.amazonaws.com"])
    assert v.verify(RequestView("GET", path, query, headers)) == "AKIAIOSFODNN7EXAMPLE"


def test_presigned_example_from_the_s3_guide() -> None:
    query = "AWSAccessKeyId=AKIAIOSFODNN7EXAMPLE&Signature=NpgCjnDzrM%2BWFzoENXmpNDUsSn8%3D"
    req = RequestView(
        "GET",
        "/photos/puppy.jpg",
        query + "&Expires=1175139620",
        {"Host": "johnsmith.s3.amazonaws.com"},
    )
    v = SigV2Verifier(DOC_SECRETS, clock=lambda: 1175139620, domains=["s3.amazonaws.com"])
    assert v.verify(req) == "AKIAIOSFODNN7EXAMPLE"


# --- presigned URLs ----------------------------------------------------------------------


def test_presigned_url_verifies() -> None:
    req = presign(path="/bucket/" + quote("a b+ü~!.txt", safe="/~"), query="versionId=3%2F4")
    assert is_sigv2(req) and is_signed(req)
    assert verifier().verify(req) == KEY


def test_presigned_url_from_boto3_default_in_us_east_1() -> None:
    client = boto3.client(
        "s3",
        endpoint_url=ENDPOINT,
        region_name="us-east-1",
        aws_access_key_id=KEY,
        aws_secret_access_key=SECRET,
    )
    params = {"Bucket": "bucket", "Key": "dir/it's a (key)+ü.txt", "ResponseContentType": "a/b"}
    url = client.generate_presigned_url("get_object", Params=params, ExpiresIn=300)
    assert "AWSAccessKeyId=" in url
    assert verifier().verify(presigned_url(url)) == KEY


def test_presigned_put_with_metadata_and_content_type() -> None:
    client = s3_client("virtual", signature_version="s3")
    params = {"Bucket": "bucket", "Key": "k", "ContentType": "text/plain", "Metadata": {"n": "x y"}}
    url = client.generate_presigned_url("put_object", Params=params)  # type: ignore[attr-defined]
    assert "x-amz-meta-n=x%20y" in url  # botocore moves signed headers into the query
    assert verifier().verify(presigned_url(url, "PUT", **{"Content-Type": "text/plain"})) == KEY
    refused(presigned_url(url, "PUT"), Code.SignatureDoesNotMatch)
    tampered = url.replace("x-amz-meta-n=x%20y", "x-amz-meta-n=z")
    refused(
        presigned_url(tampered, "PUT", **{"Content-Type": "text/plain"}), Code.SignatureDoesNotMatch
    )


def expiry(req: RequestView) -> float:
    return float(req.raw_query.split("Expires=", 1)[1].split("&")[0])


def test_presigned_url_is_valid_up_to_its_expires_second() -> None:
    req = presign(expires=60)
    assert verifier(lambda: expiry(req)).verify(req) == KEY
    error = refused(req, Code.AccessDenied, verifier(lambda: expiry(req) + 0.001))
    assert error.message == "Request has expired"
    assert set(error.fields) == {"Expires", "ServerTime"}


def test_presigned_url_expired_long_ago() -> None:
    req = presign(expires=-10)
    assert refused(req, Code.AccessDenied).message == "Request has expired"


@pytest.mark.parametrize("expires", ["abc", "-1", "1e3", "", "99999999999", "2147483648"])
def test_presigned_url_with_bad_expires(expires: str) -> None:
    req = presign()
    query = req.raw_query.replace(f"Expires={int(expiry(req))}", f"Expires={expires}")
    error = refused(with_query(req, query), Code.AccessDenied)
    assert error.message == f"Invalid date (should be seconds since epoch): {expires}"


def test_presigned_url_without_expires() -> None:
    req = presign()
    query = req.raw_query.replace(f"&Expires={int(expiry(req))}", "")
    assert is_sigv2(with_query(req, query))
    assert (
        "requires the Signature, Expires"
        in refused(with_query(req, query), Code.AccessDenied).message
    )


# --- refusals ----------------------------------------------------------------------------


def test_wrong_secret() -> None:
    req = sign(signer=HmacV1Auth(Credentials(KEY, SECRET + "x")))
    refused(req, Code.SignatureDoesNotMatch)
    refused(presign(), Code.SignatureDoesNotMatch, SigV2Verifier({KEY: "other"}))


def test_unknown_access_key() -> None:
    error = refused(
        sign(signer=HmacV1Auth(Credentials("AKIDUNKNOWN", SECRET))), Code.InvalidAccessKeyId
    )
    assert error.fields == {"AWSAccessKeyId": "AKIDUNKNOWN"}
    refused(presign(), Code.InvalidAccessKeyId, SigV2Verifier({}))


def test_tampered_signature_path_and_method() -> None:
    req = sign(path="/bucket/a%20b")
    head, signature = req.headers["Authorization"].split(":")
    flipped = ("B" if signature[0] == "A" else "A") + signature[1:]
    refused(edit(req, Authorization=f"{head}:{flipped}"), Code.SignatureDoesNotMatch)
    refused(with_path(req, "/bucket/a b"), Code.SignatureDoesNotMatch)  # encoding is signed
    refused(with_path(req, "/other/a%20b"), Code.SignatureDoesNotMatch)
    refused(RequestView("DELETE", req.raw_path, "", req.headers), Code.SignatureDoesNotMatch)
    pre = presign()
    refused(with_path(pre, "/bucket/other"), Code.SignatureDoesNotMatch)


def test_skewed_date() -> None:
    req = sign()
    assert verifier(later(800)).verify(req) == KEY
    error = refused(req, Code.RequestTimeTooSkewed, verifier(later(1000)))
    assert error.fields["RequestTime"] == req.headers["Date"]
    refused(req, Code.RequestTimeTooSkewed, verifier(later(-1000)))


@pytest.mark.parametrize("date", [None, "", "Bad Date", "Tue, 07 Jul 1950 21:53:04 GMT"], ids=str)
def test_missing_or_invalid_date(date: str | None) -> None:
    error = refused(edit(sign(), Date=date), Code.AccessDenied)
    assert error.message == "AWS authentication requires a valid Date or x-amz-date header"


def test_invalid_x_amz_date_is_not_rescued_by_date() -> None:
    req = edit(sign(), X_Amz_Date="Bad Date")
    refused(req, Code.AccessDenied)


@pytest.mark.parametrize("value", ["AWS HAHAHA", "AWS :sig", f"AWS {KEY}:", "AWS"])
def test_malformed_authorization_header(value: str) -> None:
    req = edit(sign(), Authorization=value)
    assert is_sigv2(req)
    assert refused(req, Code.InvalidArgument).fields["ArgumentValue"] == value


def test_header_and_query_signature_together() -> None:
    req = sign()
    both = with_query(req, f"AWSAccessKeyId={KEY}&Signature=x&Expires=1")
    assert refused(both, Code.InvalidArgument).fields["ArgumentName"] == "Authorization"


@pytest.mark.parametrize(
    ("headers", "query"),
    [
        ({}, ""),
        ({"Authorization": "AWS4-HMAC-SHA256 Credential=x"}, ""),
        ({}, "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Signature=x"),
        ({}, "Signature=x"),
        ({"Authorization": "AWSX a:b"}, ""),
    ],
)
def test_not_sigv2(headers: dict[str, str], query: str) -> None:
    assert not is_sigv2(RequestView("GET", "/bucket/key", query, headers))
