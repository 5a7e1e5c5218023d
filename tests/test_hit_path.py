"""The hit path (gateway/s3/hits.py) answers as the general path does, or leaves the request to it.

A real Hoard process on loopback in front of moto (through the counting
proxy). The first GET of an object is a miss, answered by the general path;
the same GET again is a hit, answered by the hit path
(``hoard_hit_path_responses_total`` counts it, the origin sees nothing). The
two answers must carry the same status, headers and body, but for the date
and the request id. A single byte range is a hit too (training loaders ask
``bytes=0-8388607`` of every small object). Requests the hit path does not
take (a range past the end, conditionals, ``response-*`` overrides, HEAD, bad signatures, denied keys,
objects of more than one block) must get the general path's answer while
the object is hot, and must not be counted as hits.
"""

from __future__ import annotations

import http.client
import os
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from tests.conftest import moto_origin
from tests.harness import HoardProcess, logged, metric, wait_for_metric
from tests.origin_proxy import OriginProxy
from tests.rawhttp import RawResponse, presign, send, sign_headers, signed_send

SMALL = os.urandom(48 * 1024)  # kept in memory (cache.memory_item_max_on_disk)
MEDIUM = os.urandom(100 * 1024)  # kept on disk only: hits sent with sendfile
BIG = os.urandom(1024 * 1024 + 5)  # two blocks of 1 MiB
PER_REQUEST = {"date", "x-amz-request-id", "x-amz-id-2"}
LIMITED_KEY, LIMITED_SECRET = "limited-access", "limited-secret-key"


def _node(workdir: Path, proxy: OriginProxy, bucket: str, memory: str) -> HoardProcess:
    config = {
        "origins": {"moto": moto_origin(proxy)},
        "default_origin": "moto",
        "mounts": [{"bucket": bucket, "origin": "moto", "metadata_ttl": "forever"}],
        "cache": {"block_size": "1MiB", "memory": memory},
        "log_format": "json",
        "credentials": [
            {"access_key": "test-access", "secret_key": "test-secret-key"},
            {"access_key": LIMITED_KEY, "secret_key": LIMITED_SECRET, "buckets": ["elsewhere"]},
        ],
    }
    return HoardProcess(workdir, config).start()


@pytest.fixture
def seeded(origin_client, bucket: str) -> str:
    origin_client.put_object(
        Bucket=bucket, Key="small.bin", Body=SMALL, ContentType="image/jpeg",
        Metadata={"label": "n01440764"}, CacheControl="max-age=60",
    )  # fmt: skip
    origin_client.put_object(Bucket=bucket, Key="big.bin", Body=BIG)
    origin_client.put_object(Bucket=bucket, Key="medium.bin", Body=MEDIUM)
    return bucket


@pytest.fixture
def node(tmp_path: Path, proxy: OriginProxy, seeded: str) -> Iterator[HoardProcess]:
    running = _node(tmp_path, proxy, seeded, "64MiB")
    yield running
    assert running.stop() == 0


def _hits(node: HoardProcess, source: str = "") -> float:
    selector = "hoard_hit_path_responses_total" + (f'{{source="{source}"}}' if source else "")
    return metric(node.endpoint, selector)


def _get(node: HoardProcess, target: str, headers: dict[str, str] | None = None) -> RawResponse:
    return signed_send(node.port, "GET", target, headers=headers)


def _miss(node: HoardProcess, target: str, tier: str = "memory") -> RawResponse:
    """A first GET, then the wait until its block landed in ``tier``: the fill puts it
    there a moment after the client has every byte, and a GET meanwhile is no hit."""
    answer = _get(node, target)
    selector = f'hoard_cache_bytes{{tier="{tier}"}}'
    deadline = time.monotonic() + 30
    while metric(node.endpoint, selector) < len(answer.body) and time.monotonic() < deadline:
        time.sleep(0.01)  # polling the event itself (the gauge), not waiting in its place
    return answer


def _comparable(answer: RawResponse) -> dict[str, list[str]]:
    """Header name (lower case) -> every value sent, without the per-request ones."""
    fields: dict[str, list[str]] = {}
    for name, value in answer.headers.items():
        if name.lower() not in PER_REQUEST:
            fields.setdefault(name.lower(), []).append(value)
    return fields


def _same_answer(general: RawResponse, hit: RawResponse) -> None:
    assert (hit.status, hit.body) == (general.status, general.body)
    assert _comparable(hit) == _comparable(general)
    for name in PER_REQUEST:
        assert len(hit.headers.get_all(name) or []) == 1, name
    assert hit.headers["x-amz-request-id"] == hit.headers["x-amz-id-2"]
    assert hit.headers["x-amz-request-id"] != general.headers["x-amz-request-id"]


def test_a_hit_answers_as_the_general_path_did(node, proxy, seeded) -> None:
    target = f"/{seeded}/small.bin"
    general = _miss(node, target)
    assert general.status == 200 and general.body == SMALL
    gets, hits = proxy.counts["GetObject"], _hits(node, "memory")

    hit = _get(node, target)
    _same_answer(general, hit)
    assert _hits(node, "memory") == hits + 1
    assert proxy.counts["GetObject"] == gets  # a hit: nothing reached the origin
    assert hit.headers["Content-Type"] == "image/jpeg"
    assert hit.headers["x-amz-meta-label"] == "n01440764"
    assert hit.headers["Cache-Control"] == "max-age=60"

    host = f"127.0.0.1:{node.port}"
    presigned = send(node.port, "GET", presign("GET", host, target), {"Host": host})
    _same_answer(general, presigned)
    assert _hits(node, "memory") == hits + 2


def test_hits_keep_the_connection_open(node, seeded) -> None:
    target, host = f"/{seeded}/small.bin", f"127.0.0.1:{node.port}"
    assert _miss(node, target).status == 200
    hits = _hits(node)
    connection = http.client.HTTPConnection("127.0.0.1", node.port, timeout=30)
    sockets = []
    try:
        for _ in range(3):
            connection.putrequest("GET", target, skip_host=True, skip_accept_encoding=True)
            for name, value in {**sign_headers("GET", host, target), "Host": host}.items():
                connection.putheader(name, value)
            connection.endheaders()
            answer = connection.getresponse()
            assert (answer.status, answer.read(), answer.will_close) == (200, SMALL, False)
            sockets.append(connection.sock)
    finally:
        connection.close()
    assert sockets[0] is not None and sockets[0] is sockets[1] is sockets[2]
    assert _hits(node) == hits + 3


def test_requests_the_hit_path_leaves_to_the_general_path(node, seeded) -> None:
    target = f"/{seeded}/small.bin"
    etag = _get(node, target).headers["ETag"]
    hits = _hits(node)

    past = _get(node, target, {"Range": f"bytes={len(SMALL)}-"})
    assert past.status == 416 and b"<Code>InvalidRange</Code>" in past.body
    unchanged = _get(node, target, {"If-None-Match": etag})
    assert (unchanged.status, unchanged.body) == (304, b"")
    other = _get(node, target, {"If-Match": '"0123456789abcdef0123456789abcdef"'})
    assert other.status == 412 and b"<Code>PreconditionFailed</Code>" in other.body
    later = _get(node, target, {"If-Modified-Since": "Fri, 01 Jan 2100 00:00:00 GMT"})
    assert later.status == 304
    overridden = _get(node, target + "?response-content-type=text%2Fplain")
    assert (overridden.status, overridden.body) == (200, SMALL)
    assert overridden.headers["Content-Type"] == "text/plain"
    head = signed_send(node.port, "HEAD", target)
    assert (head.status, head.headers["Content-Length"]) == (200, str(len(SMALL)))
    closing = _get(node, target, {"Connection": "close"})
    assert (closing.status, closing.body) == (200, SMALL)
    assert _hits(node) == hits  # none of them was the hit path's

    big = f"/{seeded}/big.bin"
    assert _get(node, big).body == BIG
    assert _get(node, big).body == BIG  # held, but two blocks: the general path
    assert _hits(node) == hits


def test_a_single_range_is_a_hit_answered_as_the_general_path_answers_it(
    node, proxy, seeded
) -> None:
    """Each range from memory and from disk (sendfile at an offset), against the general
    path's answer to the same range (an ``If-Match`` of the object's own ETag sends it
    there and changes nothing in the answer)."""
    for name, body, tier in (("small.bin", SMALL, "memory"), ("medium.bin", MEDIUM, "disk")):
        target, size = f"/{seeded}/{name}", len(body)
        missed = _miss(node, target, tier)
        assert missed.status == 200
        etag = missed.headers["ETag"]
        gets = proxy.counts["GetObject"]
        wanted = {
            "bytes=0-8388607": (206, body),  # what s3torchconnector and DLIO ask
            "bytes=10-19": (206, body[10:20]),
            "bytes=-7": (206, body[-7:]),
            f"bytes={size - 3}-": (206, body[-3:]),
            "bytes=0-1,3-4": (200, body),  # several ranges: S3 sends the whole object
            "bytes=9-2": (200, body),  # not a range: ignored
        }
        for value, (status, part) in wanted.items():
            hits = _hits(node, tier)
            general = _get(node, target, {"Range": value, "If-Match": etag})
            assert _hits(node, tier) == hits, value  # the general path's answer
            hit = _get(node, target, {"Range": value})
            assert (hit.status, hit.body) == (status, part), value
            _same_answer(general, hit)
            assert _hits(node, tier) == hits + 1, value
        whole = _get(node, target, {"Range": "bytes=0-8388607"})
        assert whole.headers["Content-Range"] == f"bytes 0-{size - 1}/{size}"
        assert whole.headers["Content-Length"] == str(size)
        line = logged(
            node, _get(node, target, {"Range": "bytes=10-19"}).headers["x-amz-request-id"]
        )
        assert (line["status"], line["bytes"], line["source"]) == (206, 10, tier)
        assert proxy.counts["GetObject"] == gets  # every one of them from the cache


def test_signatures_and_key_limits_still_hold_for_held_objects(node, seeded) -> None:
    target = f"/{seeded}/small.bin"
    assert _get(node, target).status == 200
    hits = _hits(node)

    forged = signed_send(node.port, "GET", target, secret_key="not-the-secret")
    assert forged.status == 403 and b"<Code>SignatureDoesNotMatch</Code>" in forged.body
    assert forged.headers["x-amz-request-id"]
    denied = signed_send(
        node.port, "GET", target, access_key=LIMITED_KEY, secret_key=LIMITED_SECRET
    )
    assert denied.status == 403 and b"<Code>AccessDenied</Code>" in denied.body
    anonymous = send(node.port, "GET", target, {"Host": f"127.0.0.1:{node.port}"})
    assert anonymous.status == 403 and b"<Code>AccessDenied</Code>" in anonymous.body
    host = f"127.0.0.1:{node.port}"
    tampered = presign("GET", host, target).replace("X-Amz-Signature=", "X-Amz-Signature=0")
    refused = send(node.port, "GET", tampered, {"Host": host})
    assert refused.status == 403
    assert _hits(node) == hits


def test_hits_are_counted_and_logged_as_the_general_path_counts_them(node, seeded) -> None:
    target = f"/{seeded}/small.bin"
    assert _miss(node, target).status == 200
    selector = 'hoard_requests_total{operation="GetObject",status="200",mount="m0"}'
    served = 'hoard_bytes_served_total{source="memory",mount="m0"}'
    requests, memory_bytes = metric(node.endpoint, selector), metric(node.endpoint, served)

    hit = _get(node, target)
    assert metric(node.endpoint, selector) == requests + 1
    assert metric(node.endpoint, served) == memory_bytes + len(SMALL)
    line = logged(node, hit.headers["x-amz-request-id"])
    assert (line["operation"], line["status"], line["bytes"], line["source"]) == (
        "GetObject", 200, len(SMALL), "memory",
    )  # fmt: skip


def test_a_write_through_hoard_is_seen_by_the_next_hit(node, seeded) -> None:
    target = f"/{seeded}/fresh.bin"
    client = node.client()
    client.put_object(Bucket=seeded, Key="fresh.bin", Body=b"first")
    assert _get(node, target).body == b"first"
    assert _get(node, target).body == b"first"  # held
    client.put_object(Bucket=seeded, Key="fresh.bin", Body=b"second version")
    assert _get(node, target).body == b"second version"


def test_a_new_version_of_the_same_size_is_hit_with_its_own_bytes(node, seeded) -> None:
    # The hit path keeps the name of an object's block per key: a version with the same
    # size but another ETag must name (and serve) its own block.
    target = f"/{seeded}/same-size.bin"
    client = node.client()
    client.put_object(Bucket=seeded, Key="same-size.bin", Body=b"first!")
    assert _miss(node, target).body == b"first!"
    hits = _hits(node)
    assert _get(node, target).body == b"first!"  # held
    assert _hits(node) == hits + 1
    client.put_object(Bucket=seeded, Key="same-size.bin", Body=b"again!")
    # The write drops the old version's block; the new one's lands a moment after the
    # answer (of the write's copy, or of this read's fill): only then is a read a hit.
    assert _miss(node, target).body == b"again!"
    hits = _hits(node)
    assert _get(node, target).body == b"again!"
    assert _hits(node) == hits + 1  # the new version is hit too, with its own bytes


def test_a_hit_counts_one_metadata_lookup(node, seeded) -> None:
    target = f"/{seeded}/small.bin"
    assert _miss(node, target).status == 200
    selector = 'hoard_metadata_lookups_total{kind="head",state="hit",mount="m0"}'
    lookups, hits = metric(node.endpoint, selector), _hits(node)
    for _ in range(3):
        assert _get(node, target).body == SMALL
    assert _hits(node) == hits + 3
    assert metric(node.endpoint, selector) == lookups + 3


def test_a_block_above_the_memory_limit_for_disk_blocks_is_hit_from_disk(
    node, proxy, seeded
) -> None:
    target = f"/{seeded}/medium.bin"
    general = _miss(node, target, "disk")
    gets, hits = proxy.counts["GetObject"], _hits(node, "disk")
    for _ in range(2):
        _same_answer(general, _get(node, target))
    assert _hits(node, "disk") == hits + 2 and _hits(node, "memory") == 0
    assert metric(node.endpoint, 'hoard_cache_bytes{tier="memory"}') == 0  # held once: on disk
    assert proxy.counts["GetObject"] == gets

    small = f"/{seeded}/small.bin"
    _miss(node, small)
    assert metric(node.endpoint, 'hoard_cache_bytes{tier="memory"}') == len(SMALL)
    assert _get(node, small).body == SMALL
    assert _hits(node, "memory") == 1


def test_disk_tier_hits_take_the_hit_path_with_sendfile(tmp_path, proxy, seeded) -> None:
    disk_only = _node(tmp_path, proxy, seeded, "0")
    try:
        target = f"/{seeded}/small.bin"
        general = _miss(disk_only, target, "disk")
        gets = proxy.counts["GetObject"]
        hits = _hits(disk_only, "disk")
        hit = _get(disk_only, target)
        _same_answer(general, hit)
        assert _hits(disk_only, "disk") == hits + 1
        assert proxy.counts["GetObject"] == gets
    finally:
        assert disk_only.stop() == 0


def test_a_hit_asked_for_checksums_answers_as_the_general_path_did(
    node, proxy, origin_client, seeded
) -> None:
    """boto3 >= 1.36 asks for checksums (``x-amz-checksum-mode: ENABLED``) on every
    GetObject: a hit answers with the object's checksums as the general path does (none
    on a range), and a default boto3 client, validating them, reads it through hits."""
    origin_client.put_object(Bucket=seeded, Key="summed.bin", Body=SMALL,
                             ChecksumAlgorithm="SHA256")  # fmt: skip
    target, asked = f"/{seeded}/summed.bin", {"x-amz-checksum-mode": "ENABLED"}
    general = _get(node, target, asked)  # a miss: the general path answers
    assert general.status == 200 and "x-amz-checksum-sha256" in general.headers
    wait_for_metric(node.endpoint, 'hoard_cache_bytes{tier="memory"}', len(SMALL))
    hits = _hits(node, "memory")
    _same_answer(general, _get(node, target, asked))
    plain = _get(node, target)
    assert "x-amz-checksum-sha256" not in plain.headers  # not asked: none, as before
    ranged = _get(node, target, {**asked, "Range": "bytes=0-99"})
    assert ranged.status == 206 and "x-amz-checksum-sha256" not in ranged.headers
    assert _hits(node, "memory") == hits + 3

    client = boto3.client("s3", endpoint_url=node.endpoint, region_name="us-east-1",
                          aws_access_key_id="test-access",
                          aws_secret_access_key="test-secret-key")  # fmt: skip
    assert client.get_object(Bucket=seeded, Key="summed.bin")["Body"].read() == SMALL
    assert _hits(node, "memory") == hits + 4
