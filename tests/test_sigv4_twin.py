"""SigV4 verification's compiled twins against the Python functions they stand in for.

``gateway/s3/_sigv4_claim.pyx`` (``parse_claim``) and ``gateway/s3/_sigv4.pyx``
(``_check_signature``) read the well-formed case themselves and hand every
other request to the Python functions, so every refusal is the Python's. What
is checked here: generated requests (seeded; odd whitespace, repeated headers,
names in any case, queries with and without escapes, paths not ASCII,
presigned and header-signed, signatures right, wrong and in upper case,
signed headers missing, Authorization headers of many malformed shapes) get
the same answer from both, whole verifications and each function alone: the
same ``AuthContext`` or ``Claim``, or the same exception with the same code,
message and fields; and requests signed by botocore verify on the compiled
path without the Python's help. Each comparison also counts how often the
compiled path answered by itself, so a twin that handed everything on could
not pass.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import random
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from urllib.parse import quote, unquote, urlsplit

import boto3
import pytest
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from multidict import CIMultiDict, CIMultiDictProxy

from gateway.core import compiled
from gateway.core.sigv4_key import KeyedHmac, derive_signing_key
from gateway.s3 import sigv4, sigv4_claim
from gateway.s3.errors import S3Error
from gateway.s3.sigv4 import RequestView, SigV4Verifier
from tests.rawhttp import presign, sign_headers

NAMES = ("gateway.s3._sigv4_claim", "gateway.s3._sigv4")
BUILT = all(importlib.util.find_spec(name) is not None for name in NAMES)
if BUILT:
    from gateway.s3 import _sigv4, _sigv4_claim

needs_twins = pytest.mark.skipif(not BUILT, reason="the compiled twins were not built")

KEY, SECRET = "AKIDTWIN", "twin/Secret+KEY"
SECRETS = {KEY: SECRET, "AK日本": "unicode-key"}
NOW = 1767225600.0  # 2026-01-01T00:00:00Z
DAY, AMZ_DATE = "20260101", "20260101T000000Z"
HOST = "hoard:9000"


def test_the_compiled_twins_are_built_and_used_unless_refused() -> None:
    """``pip install`` builds them here (gcc is on the machine), and the modules run them
    unless ``HOARD_NO_EXTENSIONS`` asks for Python (the hit tests' second run)."""
    assert BUILT, "gateway/s3/_sigv4_claim.pyx or _sigv4.pyx was not built"
    expected = not compiled.NO_EXTENSIONS
    assert all(compiled.in_use()[name] is expected for name in NAMES)
    assert (sigv4_claim.parse_claim is sigv4_claim.parse_claim_py) is not expected
    assert (sigv4.parse_claim is sigv4_claim.parse_claim_py) is not expected
    assert (sigv4._check_signature is sigv4._check_signature_py) is not expected


# --- running either twin -----------------------------------------------------------------


@contextmanager
def running(claim: Callable, check: Callable) -> Iterator[None]:
    """``SigV4Verifier.verify`` with these two functions in the module's place."""
    saved = sigv4.parse_claim, sigv4._check_signature
    sigv4.parse_claim, sigv4._check_signature = claim, check
    try:
        yield
    finally:
        sigv4.parse_claim, sigv4._check_signature = saved


def answer(function: Callable, *args: object) -> tuple:
    """What ``function(*args)`` answered: its value, or its exception (with an S3Error's
    code, message, fields and headers)."""
    try:
        value = function(*args)
    except S3Error as error:
        return ("S3Error", error.code, error.message, error.fields, error.headers)
    except Exception as error:  # whatever the Python raises, the twin must raise alike
        return (type(error).__name__, str(error))
    return ("answer", dataclasses.astuple(value) if dataclasses.is_dataclass(value) else value)


class Handed:
    """Counts the calls the compiled twins hand on to the Python functions."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.claims = self.checks = 0

        def claim(req):
            self.claims += 1
            return sigv4_claim.parse_claim_py(req)

        def check(req, claim, signer):
            self.checks += 1
            return sigv4._check_signature_py(req, claim, signer)

        monkeypatch.setattr(_sigv4_claim, "parse_claim_py", claim)
        monkeypatch.setattr(_sigv4, "_check_signature_py", check)


@pytest.fixture
def handed(monkeypatch: pytest.MonkeyPatch) -> Handed:
    if not BUILT:
        pytest.skip("the compiled twins were not built")
    return Handed(monkeypatch)


def both_verify(req: RequestView, verifier: SigV4Verifier) -> tuple[tuple, tuple]:
    with running(sigv4_claim.parse_claim_py, sigv4._check_signature_py):
        python = answer(verifier.verify, req)
    with running(_sigv4_claim.parse_claim, _sigv4._check_signature):
        twin = answer(verifier.verify, req)
    return python, twin


# --- requests botocore signs ------------------------------------------------------------

TARGETS = ["/bucket/key", "/bucket/dir/with%20space.txt", "/bucket/" + quote("ü日本語-é.bin"),
           "/bucket/" + quote("a+b=c&d;e,f.txt"), "/bucket/tilde~/x~y", "/bucket/k?partNumber=1",
           "/bucket?list-type=2&prefix=a%2Fb&delimiter=%2F", "/bucket?uploads",
           "/bucket/" + quote("specials/!*'()$@:.txt")]  # fmt: skip
EXTRA_HEADERS = [{}, {"Range": "bytes=0-8388607"}, {"X-Amz-Meta-Note": "  a   b  "},
                 {"User-Agent": "Boto3/1.35 md/Botocore#1.35", "amz-sdk-request": "attempt=1"}]  # fmt: skip


@pytest.mark.parametrize("target", TARGETS)
def test_requests_botocore_signs_verify_on_the_compiled_path_alone(
    target: str, handed: Handed
) -> None:
    path, _, query = target.partition("?")
    for method in ("GET", "HEAD"):
        for extra in EXTRA_HEADERS:
            headers = sign_headers(method, HOST, target, extra, KEY, SECRET) | {"Host": HOST}
            req = RequestView(method, path, query, CIMultiDictProxy(CIMultiDict(headers)))
            python, twin = both_verify(req, SigV4Verifier(SECRETS))
            assert python[0] == "answer" and twin == python
        url_path, _, url_query = presign(method, HOST, target, 300, KEY, SECRET).partition("?")
        req = RequestView(method, url_path, url_query, CIMultiDictProxy(CIMultiDict(Host=HOST)))
        python, twin = both_verify(req, SigV4Verifier(SECRETS))
        assert python[0] == "answer" and twin == python
    assert (handed.claims, handed.checks) == (2, 0)  # (a presigned URL's claim: the Python's)


def test_requests_of_a_boto3_client_verify_alike(handed: Handed) -> None:
    """What a boto3 client sends (a GET, a HEAD, a listing), caught before it is sent."""
    sent: list[AWSRequest] = []

    def stop(request: AWSRequest, **_: object) -> None:
        sent.append(request)
        raise RuntimeError("sent")

    client = boto3.client("s3", endpoint_url=f"http://{HOST}", region_name="us-east-1",
                          aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                          config=Config(retries={"total_max_attempts": 1},
                                        s3={"addressing_style": "path"}))  # fmt: skip
    client.meta.events.register("before-send.s3", stop)
    calls = [lambda: client.get_object(Bucket="bucket", Key="dir/ü 1.bin", Range="bytes=0-9"),
             lambda: client.head_object(Bucket="bucket", Key="k"),
             lambda: client.list_objects_v2(Bucket="bucket", Prefix="a/b c", Delimiter="/")]  # fmt: skip
    for call in calls:
        with pytest.raises(RuntimeError):
            call()
    for request in sent:
        parts = urlsplit(request.url)
        headers = CIMultiDict((k, v.decode() if isinstance(v, bytes) else v)
                              for k, v in request.headers.items())  # fmt: skip
        headers.setdefault("Host", parts.netloc)
        req = RequestView(request.method, parts.path, parts.query, CIMultiDictProxy(headers))
        python, twin = both_verify(req, SigV4Verifier(SECRETS))
        assert python[0] == "answer" and twin == python
    assert len(sent) == 3 and (handed.claims, handed.checks) == (0, 0)


# --- generated requests ------------------------------------------------------------------

SEGMENTS = ["bucket", "key.txt", "a b", "a%20b", "%E6%97%A5", "日本", "ü", "x+y", "~t", "%2F",
            "", ".", "..", "a%2fb", "%", "%zz", "!*'()", "\udcff", "d/e", "k-1_2.bin"]  # fmt: skip
QUERY_ITEMS = ["list-type=2", "prefix=a%2Fb", "prefix=a/b", "delimiter=%2F", "max-keys=10",
               "versionId=3", "x=", "y", "a=b=c", "", "Foo=%7e", "k=%E6%97%A5", "k=日",
               "partNumber=1", "uploads", "b=%41", "c=a+b", "z=%7E", "Z=1", "e=%2A%20",
               "%", "Signature=abc", "p=a%2fb", "k=%e6%97%a5", "%7E%2A=%2a"]  # fmt: skip
EXTRA_NAMES = ["Range", "User-Agent", "amz-sdk-invocation-id", "amz-sdk-request",
               "Content-Type", "X-Amz-Meta-Note", "x-amz-meta-tag", "Accept-Encoding"]  # fmt: skip
VALUES = ["bytes=0-8388607", "Boto3/1.35 md/Botocore#1.35", "attempt=1; max=3", "  a   b  ",
          "\tx\t", "", " ", "a\x0bb", "a\x1cb", "é", "日本 語", "x,y", "a  b", "a\xa0b",
          "a\u2003b", "identity"]  # fmt: skip
PAYLOADS = ["e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            "E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855",
            "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"]  # fmt: skip
BAD_PAYLOADS = ["abc", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4", "ü" * 64, None, PAYLOADS[0] + "0",
                PAYLOADS[0][:-1] + "g"]  # fmt: skip
BAD_DATES = [None, "2026-01-01T00:00:00Z", "20251231T235959Z", "20261399T000000Z"]
SEPARATORS = [", ", ",", " ", " , ", ",\t", "\t", ",,", "\n", "\x0b", "\x1c", ",\x1f", "\r"]
BAD_SCHEMES = ["AWS4-HMAC-SHA512", "AWS", "Bearer", "aws4-hmac-sha256"]


class Dice:
    """A seeded random source; ``odd``: whether this request may be malformed at all."""

    def __init__(self, rng: random.Random, odd: bool) -> None:
        self.rng, self.odd = rng, odd

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def rare(self, p: float) -> bool:
        """A malformation, only in an odd request."""
        return self.odd and self.rng.random() < p

    def pick(self, common, rare: list, p: float = 0.1):
        return self.rng.choice(rare) if self.rare(p) else common

    def case(self, name: str) -> str:
        return self.rng.choice([name, name.lower(), name.upper(), name.title()])


def headers_for(dice: Dice) -> CIMultiDict[str]:
    headers: CIMultiDict[str] = CIMultiDict()
    if not dice.rare(0.05):
        headers.add(dice.case("Host"), HOST)
    date = dice.pick(AMZ_DATE, BAD_DATES)
    if date is not None:
        headers.add(dice.case("X-Amz-Date"), date)
    elif dice.chance(0.5):
        headers.add("Date", "Thu, 01 Jan 2026 00:00:00 GMT")
    payload = dice.pick(dice.pick("UNSIGNED-PAYLOAD", PAYLOADS, 0.3), BAD_PAYLOADS)
    if payload is not None:
        headers.add(dice.case("X-Amz-Content-SHA256"), payload)
    for _ in range(dice.rng.randrange(5)):
        name, value = dice.case(dice.rng.choice(EXTRA_NAMES)), dice.rng.choice(VALUES)
        headers.add(name, value)
        if dice.chance(0.2):
            headers.add(dice.case(name), dice.rng.choice(VALUES))  # repeated
    if dice.rare(0.03):
        headers.add("X-Amz-Méta", "x")  # a name not ASCII
    return headers


def signed_list(dice: Dice, headers: CIMultiDict[str]) -> str:
    names = sorted({name.lower() for name in headers})
    if dice.rare(0.05) and "host" in names:
        names.remove("host")
    if dice.rare(0.05):
        names = [n for n in names if not n.startswith("x-amz-meta")]  # one left unsigned
    if dice.rare(0.05):
        names.append("x-missing")
    if dice.rare(0.03):
        names.append("authorization")
    names = [dice.case(n) if dice.rare(0.03) else n for n in names]
    names = [f" {n} " if dice.rare(0.02) else n for n in names]
    return (";;" if dice.rare(0.03) else ";").join(names)


def credential(dice: Dice) -> str:
    access_key = dice.pick(KEY, ["AK日本", "nobody", ""], 0.15)
    date = dice.pick(DAY, ["20251231", "2026011", "2026-1-1"])
    region = dice.pick(dice.pick("us-east-1", ["auto"], 0.2), ["eu-west-1", ""])
    parts = [access_key, date, region, dice.pick("s3", ["ec2"]), dice.pick("aws4_request", ["x"])]
    if dice.rare(0.03):
        parts = parts[:4] if dice.chance(0.5) else [*parts, "x"]
    return "/".join(parts)


def authorization(dice: Dice, scope: str, signed: str) -> Callable[[str], str]:
    """The Authorization header's shape, chosen once: it takes the signature."""
    order = [("Credential", scope), ("SignedHeaders", signed), ("Signature", None)]
    if dice.chance(0.1):
        dice.rng.shuffle(order)
    if dice.chance(0.05):
        order.insert(dice.rng.randrange(len(order) + 1), ("Foo", "bar"))
    if dice.rare(0.05):
        del order[dice.rng.randrange(len(order))]
    if dice.chance(0.05):
        name, value = dice.rng.choice(order)
        order.insert(0, (name, "stale" if value is None else value + "x"))  # the last wins
    if dice.rare(0.03):
        order[0] = (order[0][0].lower(), order[0][1])
    junk = ["junk", "x=y=z", "=", "Signature"][dice.rng.randrange(4)] if dice.rare(0.06) else ""
    scheme = dice.pick("AWS4-HMAC-SHA256", BAD_SCHEMES)
    gaps = [dice.rng.choice(SEPARATORS) if dice.chance(0.3) else ", " for _ in range(8)]
    where = dice.rng.randrange(5)
    pad = dice.pick(("", ""), [("  ", " \t")], 0.3)

    def make(signature: str) -> str:
        items = [f"{n}={signature if v is None else v}" for n, v in order]
        items.insert(where, junk)  # (empty: no item, a separator more)
        text = "".join(item + gap for item, gap in zip(items, gaps, strict=False))
        return f"{pad[0]}{scheme} {text}{pad[1]}"

    return make


def generated(rng: random.Random) -> tuple[RequestView, SigV4Verifier]:
    """One request, signed right (as the Python computes it) or not, and its verifier."""
    dice = Dice(rng, odd=rng.random() < 0.5)
    method = rng.choice(["GET"] * 6 + ["HEAD", "PUT", "DELETE"])
    path = "/" + "/".join(rng.choice(SEGMENTS) for _ in range(rng.randrange(1, 4)))
    items = [rng.choice(QUERY_ITEMS) for _ in range(rng.randrange(4))] if dice.chance(0.4) else []
    headers = headers_for(dice)
    scope, signed = credential(dice), signed_list(dice, headers)
    presigned = dice.chance(0.25)
    if presigned:
        params = {"X-Amz-Algorithm": dice.pick("AWS4-HMAC-SHA256", ["AWS4-X"]),
                  "X-Amz-Credential": scope, "X-Amz-Date": dice.pick(AMZ_DATE, ["x", "2026"]),
                  "X-Amz-Expires": dice.pick("3600", ["0", "-1", "604801", "abc"], 0.3),
                  "X-Amz-SignedHeaders": signed}  # fmt: skip
        if dice.rare(0.05):
            del params[rng.choice(list(params))]
        items += [f"{dice.case(n) if dice.chance(0.1) else n}={quote(v, safe='')}"
                  for n, v in params.items()]  # fmt: skip
        if dice.rare(0.08):
            headers.add("Authorization", f"AWS4-HMAC-SHA256 Credential={scope}")

        signature_name = dice.case("X-Amz-Signature") if dice.chance(0.2) else "X-Amz-Signature"

        def with_signature(signature: str) -> RequestView:
            query = "&".join([*items, f"{signature_name}={signature}"])
            return RequestView(method, path, query, CIMultiDictProxy(headers))
    else:
        make, name = authorization(dice, scope, signed), dice.case("Authorization")

        def with_signature(signature: str) -> RequestView:
            signed_headers = CIMultiDict(headers)
            signed_headers.add(name, make(signature))
            return RequestView(method, path, "&".join(items), CIMultiDictProxy(signed_headers))

    signature = right_signature(with_signature("0" * 64)) or "1" * 64
    kind = rng.random()
    if kind < 0.1:
        signature = signature.upper()  # S3 accepts either case
    elif kind < 0.3:
        signature = signature[:-1] + ("0" if signature[-1] != "0" else "1")
    elif kind < 0.35:
        signature = rng.choice(["zz" * 32, "", "é" * 64])
    req = with_signature(signature)
    skew = dice.pick(0.0, [1000.0, -1000.0, 1e6])
    verifier = SigV4Verifier(SECRETS, region=rng.choice([None, "us-east-1"]),
                             clock=lambda: NOW + skew)  # fmt: skip
    return req, verifier


def right_signature(req: RequestView) -> str | None:
    """The signature the Python verifier expects of ``req`` (its first candidate path);
    None if it refuses ``req`` before comparing signatures."""
    try:
        claim = sigv4_claim.parse_claim_py(req)
        secret = SECRETS[claim.access_key]
    except (S3Error, KeyError, UnicodeError):
        return None
    signer = KeyedHmac(derive_signing_key(secret, claim.date, claim.region))
    try:
        sigv4._check_signature_py(req, claim, signer)
    except S3Error as error:
        return signer.hexdigest(error.fields["StringToSign"].encode("utf-8", "surrogateescape"))
    except UnicodeError:
        return None
    return claim.signature


@needs_twins
@pytest.mark.parametrize("seed", range(8))
def test_generated_requests_get_the_same_answer_from_both(seed: int, handed: Handed) -> None:
    rng = random.Random(seed)
    verified = answered_alone = 0
    for number in range(400):
        req, verifier = generated(rng)
        before = handed.claims + handed.checks
        python, twin = both_verify(req, verifier)
        assert twin == python, (number, req)
        verified += python[0] == "answer"
        answered_alone += python[0] == "answer" and handed.claims + handed.checks == before
    assert verified >= 150, verified  # enough of each kind for the comparison to mean something
    assert answered_alone >= 60, answered_alone


@needs_twins
@pytest.mark.parametrize("seed", range(8, 12))
def test_each_function_alone_answers_as_the_python_one(seed: int, handed: Handed) -> None:
    rng = random.Random(seed)
    claims = checks = 0
    for number in range(400):
        req, _ = generated(rng)
        python = answer(sigv4_claim.parse_claim_py, req)
        assert answer(_sigv4_claim.parse_claim, req) == python, (number, req)
        try:
            claim = sigv4_claim.parse_claim_py(req)
        except S3Error:
            continue
        claims += 1
        secret = SECRETS.get(claim.access_key, "not a key")
        signer = KeyedHmac(derive_signing_key(secret, claim.date, claim.region))
        python = answer(sigv4._check_signature_py, req, claim, signer)
        checks += python[0] == "answer"
        assert answer(_sigv4._check_signature, req, claim, signer) == python, number
    assert claims >= 100 and checks >= 50, (claims, checks)


# --- signatures over another canonical form ----------------------------------------------
# A twin that built the canonical request otherwise than the Python would still agree with
# it on every signature made as the Python makes them (a mismatch is handed back to the
# Python, which accepts). So requests are also signed over forms a careless reading would
# build (values not collapsed, escapes not normalised, a query not sorted, a path decoded):
# the Python refuses nearly all of them (the path as sent is its second candidate), and the
# twin must answer each as it does.


def _values(req: RequestView, names: tuple[str, ...], clean: Callable[[str], str]) -> tuple:
    getall = req.headers.getall
    lines = [f"{n}:{','.join(clean(v) for v in getall(n, ()))}\n" for n in names]
    return "".join(lines), all(getall(n, ()) for n in names)


def _pairs(raw_query: str, presigned: bool) -> list[tuple[str, str]]:
    items = [item.partition("=") for item in raw_query.split("&") if item]
    return [(n, v) for n, _, v in items if not (presigned and n.lower() == "x-amz-signature")]


NEAR_MISSES = {
    "_canonical_headers": [
        lambda req, names: _values(req, names, lambda v: v),  # not trimmed
        lambda req, names: _values(req, names, lambda v: " ".join(re.split(r"[ \t]+", v.strip()))),
        lambda req, names: _values(req, names, lambda v: " ".join(v.split(" ")).strip(" ")),
    ],
    "_canonical_query": [
        lambda q, *, presigned: "&".join(f"{n}={v}" for n, v in sorted(_pairs(q, presigned))),
        lambda q, *, presigned: "&".join(f"{n}={v}" for n, v in _pairs(q, presigned)),
        lambda q, *, presigned: "&".join(sorted(f"{n}={v}" for n, v in _pairs(q, presigned))),
    ],
    "_candidate_uris": [lambda raw_path: (unquote(raw_path),), lambda raw_path: (raw_path,)],
}


@needs_twins
@pytest.mark.parametrize("seed", range(12, 16))
def test_signatures_over_other_canonical_forms_get_the_same_answer(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(seed)
    other_forms = 0
    for number in range(300):
        req, verifier = generated(rng)
        name = rng.choice(list(NEAR_MISSES))
        with monkeypatch.context() as patched:
            patched.setattr(sigv4, name, rng.choice(NEAR_MISSES[name]))
            signature = right_signature(req)
        if signature is None or signature == right_signature(req):
            continue  # refused before the signature, or the same form for this request
        other_forms += 1
        python, twin = both_verify(with_signature_of(req, signature), verifier)
        assert twin == python, (number, name, req)
    assert other_forms >= 40, other_forms


def with_signature_of(req: RequestView, signature: str) -> RequestView:
    """``req`` with its signature (the header's, else the query's) replaced."""
    authorization = req.headers.get("Authorization")
    if authorization is None:
        query = re.sub(r"(?i)(X-Amz-Signature=)[^&]*$", rf"\g<1>{signature}", req.raw_query)
        return RequestView(req.method, req.raw_path, query, req.headers)
    head, _, tail = authorization.rpartition("Signature=")
    rest = re.split(r"([\s,])", tail, maxsplit=1)[1:]
    headers = CIMultiDict(req.headers)
    headers["Authorization"] = head + "Signature=" + signature + "".join(rest)
    return RequestView(req.method, req.raw_path, req.raw_query, CIMultiDictProxy(headers))
