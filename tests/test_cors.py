"""A browser's GETs and HEADs carry the bucket's CORS headers, as S3 gives them (gateway/s3/cors.py).

Real Hoard processes on loopback in front of moto (through the counting
proxy), a CORS configuration put at the origin or through Hoard with boto3,
raw HTTP with an ``Origin`` header. An answer Hoard gives itself (a miss, a
cached object, a range, a 304, a 412, a 404, a listing) to a request whose
origin and method a rule allows carries that rule's headers; another origin
gets none, and a request without ``Origin`` is still answered by the hit path.
The origin is asked for the rules once, not per request; a PutBucketCors or
DeleteBucketCors through Hoard applies at once, on every worker.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import module_proxy
from tests.harness import HoardProcess, metric
from tests.inprocess import threaded_app
from tests.origin_proxy import OriginProxy
from tests.rawhttp import RawResponse, signed_send
from tests.test_block_cache import hoard_config

proxy = module_proxy  # one proxy for the module's node
BODY = bytes(range(256)) * 64  # 16 KiB: held in memory, answered by the hit path when hot
VARY = "Origin, Access-Control-Request-Headers, Access-Control-Request-Method"
READERS = {
    "AllowedOrigins": ["https://*.example"],
    "AllowedMethods": ["GET", "HEAD"],
    "AllowedHeaders": ["*"],
    "ExposeHeaders": ["ETag", "x-amz-request-id"],
    "MaxAgeSeconds": 600,
}
# What S3 adds for READERS to a GET from https://a.example (moto adds other things: it
# sends AllowedHeaders too and no Vary, so S3's answer is written out here).
EXPECTED = {
    "access-control-allow-origin": "https://a.example",
    "access-control-allow-methods": "GET, HEAD",
    "access-control-allow-credentials": "true",
    "access-control-expose-headers": "ETag, x-amz-request-id",
    "access-control-max-age": "600",
    "vary": VARY,
}


@pytest.fixture(scope="module")
def node(tmp_path_factory, proxy: OriginProxy) -> Iterator[HoardProcess]:
    running = HoardProcess(tmp_path_factory.mktemp("cors"), hoard_config(proxy)).start()
    yield running
    assert running.stop() == 0, running.log()


def _send(node: HoardProcess, method: str, target: str, origin: str | None = None,
          **headers: str) -> RawResponse:  # fmt: skip
    """A signed request on a connection of its own (with 2 workers, either may take it)."""
    if origin is not None:
        headers["Origin"] = origin
    return signed_send(node.port, method, target, headers=headers)


def _cors(answer: RawResponse) -> dict[str, str]:
    return {
        name.lower(): value
        for name, value in answer.headers.items()
        if name.lower().startswith("access-control-") or name.lower() == "vary"
    }


def _hits(node: HoardProcess) -> float:
    return metric(node.endpoint, "hoard_hit_path_responses_total")


def _held_in_memory(node: HoardProcess, before: float, size: int) -> None:
    """Wait until a miss's block landed in memory (a moment after its client had every
    byte): polling the gauge that says so, not waiting in its place."""
    deadline = time.monotonic() + 30
    selector = 'hoard_cache_bytes{tier="memory"}'
    while metric(node.endpoint, selector) < before + size and time.monotonic() < deadline:
        time.sleep(0.01)


def test_answers_hoard_gives_itself_carry_the_rule_s_headers(node, proxy, origin_client, bucket):
    origin_client.put_object(Bucket=bucket, Key="a.bin", Body=BODY)
    writers = {"AllowedOrigins": ["*"], "AllowedMethods": ["PUT"]}
    origin_client.put_bucket_cors(
        Bucket=bucket, CORSConfiguration={"CORSRules": [writers, READERS]}
    )
    target = f"/{bucket}/a.bin"
    memory = metric(node.endpoint, 'hoard_cache_bytes{tier="memory"}')
    proxy.reset()

    miss = _send(node, "GET", target, "https://a.example")
    assert (miss.status, miss.body) == (200, BODY)
    assert _cors(miss) == EXPECTED
    _held_in_memory(node, memory, len(BODY))
    gets, hits = proxy.counts["GetObject"], _hits(node)
    cached = _send(node, "GET", target, "https://a.example")
    assert (cached.status, cached.body, _cors(cached)) == (200, BODY, EXPECTED)
    assert proxy.counts["GetObject"] == gets  # from the cache, by the general path
    assert _hits(node) == hits

    plain = _send(node, "GET", target)
    assert (plain.status, plain.body, _cors(plain)) == (200, BODY, {})
    assert _hits(node) == hits + 1  # without Origin, the hit path answers as before
    elsewhere = _send(node, "GET", target, "https://elsewhere.org")  # "*" allows PUT only
    assert (elsewhere.status, _cors(elsewhere)) == (200, {})
    assert _cors(_send(node, "GET", target, "http://a.example")) == {}

    etag = cached.headers["ETag"]
    for method, path, headers, status in (
        ("HEAD", target, {}, 200),
        ("GET", target, {"Range": "bytes=0-9"}, 206),
        ("GET", target, {"If-None-Match": etag}, 304),
        ("HEAD", target, {"If-Match": '"other"'}, 412),
        ("GET", target, {"If-Match": '"other"'}, 412),
        ("GET", f"/{bucket}/missing.bin", {}, 404),
        ("HEAD", f"/{bucket}/missing.bin", {}, 404),
        ("GET", f"/{bucket}?list-type=2", {}, 200),
        ("HEAD", f"/{bucket}", {}, 200),
    ):
        answer = _send(node, method, path, "https://a.example", **headers)
        assert (method, path, answer.status) == (method, path, status)
        assert _cors(answer) == EXPECTED, (method, path, headers)
    assert proxy.counts["GetBucketCors"] == 1  # the rules are held, not asked per request


def test_a_bucket_without_rules_adds_nothing_and_is_asked_once(node, proxy, bucket):
    proxy.reset()
    for _ in range(3):
        answer = _send(node, "GET", f"/{bucket}?list-type=2", "https://a.example")
        assert (answer.status, _cors(answer)) == (200, {})
    assert proxy.counts["GetBucketCors"] == 1  # NoSuchCORSConfiguration is held too


def test_an_origin_down_costs_one_ask_and_cached_reads_still_answer(node, proxy, origin_client,
                                                                    bucket):  # fmt: skip
    origin_client.put_object(Bucket=bucket, Key="a.bin", Body=BODY)
    origin_client.put_bucket_cors(Bucket=bucket, CORSConfiguration={"CORSRules": [READERS]})
    target = f"/{bucket}/a.bin"
    memory = metric(node.endpoint, 'hoard_cache_bytes{tier="memory"}')
    assert _send(node, "GET", target).body == BODY  # cached, rules not asked (no Origin)
    _held_in_memory(node, memory, len(BODY))
    proxy.reset()
    proxy.mode = "down"  # every origin request answered 503 SlowDown
    try:
        for _ in range(3):
            answer = _send(node, "GET", target, "https://a.example")
            assert (answer.status, answer.body, _cors(answer)) == (200, BODY, {})
        assert proxy.counts == {"GetBucketCors": 1}  # the failure is held (negative TTL)
    finally:
        proxy.mode = "ok"


def test_a_configuration_written_through_hoard_applies_at_once_on_every_worker(
    tmp_path: Path, proxy, origin_client, bucket
):
    origin_client.put_object(Bucket=bucket, Key="a.bin", Body=BODY)
    origin_client.put_bucket_cors(Bucket=bucket, CORSConfiguration={"CORSRules": [READERS]})
    pair = HoardProcess(tmp_path, {**hoard_config(proxy), "workers": 2}).start()
    try:
        target, client = f"/{bucket}/a.bin", pair.client()
        proxy.reset()
        # Each request on a connection of its own: both workers learn the old rules (all
        # 16 on one worker has a chance of 2^-15; the assertions below hold either way).
        assert all(_cors(_send(pair, "GET", target, "https://a.example")) == EXPECTED
                   for _ in range(16))  # fmt: skip
        assert 1 <= proxy.counts["GetBucketCors"] <= 2  # once per worker at most

        only_b = {"AllowedOrigins": ["https://b.test"], "AllowedMethods": ["GET"]}
        client.put_bucket_cors(Bucket=bucket, CORSConfiguration={"CORSRules": [only_b]})
        allowed = {
            "access-control-allow-origin": "https://b.test",
            "access-control-allow-methods": "GET",
            "access-control-allow-credentials": "true",
            "vary": VARY,
        }
        for _ in range(8):
            assert _cors(_send(pair, "GET", target, "https://a.example")) == {}
            assert _cors(_send(pair, "GET", target, "https://b.test")) == allowed
            assert _cors(_send(pair, "HEAD", target, "https://b.test")) == {}  # GET only

        client.delete_bucket_cors(Bucket=bucket)
        assert all(_cors(_send(pair, "GET", target, "https://b.test")) == {} for _ in range(8))
    finally:
        assert pair.stop() == 0, pair.log()


def test_a_directory_bucket_has_no_rules_and_its_answers_none(tmp_path: Path) -> None:
    (tmp_path / "data" / "pics").mkdir(parents=True)
    (tmp_path / "data" / "pics" / "a.jpg").write_bytes(BODY)
    config = {"origins": {"d": {"type": "posix", "path": str(tmp_path / "data")}},
              "default_origin": "d"}  # fmt: skip
    with threaded_app(tmp_path, config) as directory:
        for method, target, status in (("GET", "/pics/a.jpg", 200), ("HEAD", "/pics/b.jpg", 404)):
            answer = signed_send(directory.port, method, target,
                                 headers={"Origin": "https://a.example"})  # fmt: skip
            assert (answer.status, _cors(answer)) == (status, {})
