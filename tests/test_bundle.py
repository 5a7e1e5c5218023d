"""Batch GET (``POST /{bucket}?bundle``) against real Hoard, read by Tigris's own client.

``tigris-boto3-ext``'s ``bundle_objects`` is the client, unchanged: it signs the
POST with SigV4 and the test reads the answer as its docs do (``tarfile``
mode ``r|``). moto behind the counting proxy is the origin, so what reached
the origin is counted; a directory origin and several workers are covered too.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import tarfile
import time
from pathlib import Path

import boto3
import pytest
from botocore.config import Config
from tigris_boto3_ext import BUNDLE_ON_ERROR_FAIL, BundleError, bundle_objects
from urllib3.exceptions import ProtocolError

from gateway.app.server import HIT_PATH
from tests.conftest import moto_origin, seed
from tests.harness import ACCESS_KEY, SECRET_KEY, HoardProcess, metric
from tests.inprocess import threaded_app
from tests.origin_proxy import Fault, OriginProxy
from tests.rawhttp import presign, send, sign_headers, signed_send
from tests.test_cluster import start_cluster

BLOCK = 64 * 1024  # the smallest block size: multi-block objects stay small


def config(proxy: OriginProxy, **extra: object) -> dict:
    return {
        "origins": {"moto": moto_origin(proxy, max_attempts=2)},
        "default_origin": "moto",
        "cache": {"block_size": "64KiB", "size": "256MiB", "memory": "64MiB"},
        **extra,
    }


def tigris(endpoint: str, access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY):
    return boto3.client("s3", endpoint_url=endpoint, region_name="auto",
                        aws_access_key_id=access_key, aws_secret_access_key=secret_key,
                        config=Config(retries={"max_attempts": 1}))  # fmt: skip


def read_bundle(client, bucket: str, keys: list[str], **options):
    """(members as (name, bytes), the errors entry or None) of one bundle."""
    members, errors = [], None
    with contextlib.ExitStack() as stack:
        answer = stack.enter_context(bundle_objects(client, bucket, keys, **options))
        assert answer.status_code == 200
        gzipped = options.get("compression") == "gzip"
        stream = stack.enter_context(gzip.open(answer, "rb")) if gzipped else answer
        archive = stack.enter_context(tarfile.open(fileobj=stream, mode="r|"))
        for member in archive:
            assert member.isreg()
            data = archive.extractfile(member).read()
            if member.name == "__bundle_errors.json":
                errors = json.loads(data)
            else:
                assert member.size == len(data)
                members.append((member.name, data))
    return members, errors


def body_of(key: str, size: int) -> bytes:
    seed_bytes = hashlib.sha256(key.encode()).digest()
    return (seed_bytes * (size // 32 + 1))[:size]


@pytest.fixture
def data(bucket: str) -> dict[str, bytes]:
    objects = {f"img/{i:03d}.jpg": body_of(f"img/{i:03d}.jpg", 3000 + 97 * i) for i in range(40)}
    objects["big/multi.bin"] = body_of("big", 5 * BLOCK + 123)  # six blocks
    objects["empty"] = b""
    objects["ü/ключ " + "x" * 120] = b"long unicode name"
    seed(bucket, objects)
    return objects


def test_tigris_client_gets_cold_then_warm_keys_in_order_once_each(
    tmp_path: Path, proxy: OriginProxy, bucket: str, data: dict[str, bytes]
):
    keys = [*sorted(data)[::-1], "img/005.jpg"]  # reverse order, one asked twice
    with threaded_app(tmp_path, config(proxy)) as hoard:
        client = tigris(hoard.endpoint)
        proxy.reset()
        members, errors = read_bundle(client, bucket, keys)
        assert [name for name, _ in members] == keys
        assert all(body == data[name] for name, body in members)
        assert errors is None
        # Cold: one origin GET per one-block object, one per block of the large one.
        small = [k for k in data if 0 < len(data[k]) <= BLOCK and k.isascii()]
        assert all(proxy.gets("/" + k) == 1 for k in small), proxy.listed_gets()
        assert proxy.gets("/big/multi.bin") == 6, proxy.listed_gets()
        proxy.reset()
        assert read_bundle(client, bucket, keys) == (members, None)  # warm
        assert proxy.counts["GetObject"] == 0 and proxy.counts["HeadObject"] == 0


def test_skip_mode_lists_missing_keys_and_fail_mode_refuses_them(
    tmp_path: Path, proxy: OriginProxy, bucket: str, data: dict[str, bytes]
):
    with threaded_app(tmp_path, config(proxy)) as hoard:
        client = tigris(hoard.endpoint)
        members, errors = read_bundle(client, bucket, ["img/001.jpg", "nope", "img/002.jpg"])
        assert [name for name, _ in members] == ["img/001.jpg", "img/002.jpg"]
        assert errors == {"skipped": [{"key": "nope", "reason": "NoSuchKey"}]}
        with pytest.raises(BundleError) as caught:
            bundle_objects(client, bucket, ["img/001.jpg", "gone", "nope"],
                           on_error=BUNDLE_ON_ERROR_FAIL)  # fmt: skip
        assert (caught.value.status_code, caught.value.code) == (404, "BundleKeyNotFound")
        assert "<MissingKeys><Key>gone</Key><Key>nope</Key></MissingKeys>" in caught.value.body
        assert caught.value.request_id
        answer = bundle_objects(client, bucket, ["img/003.jpg", "img/003.jpg"],
                                on_error=BUNDLE_ON_ERROR_FAIL)  # fmt: skip
        assert (answer.object_count, answer.bundle_bytes, answer.skipped_count) == (
            2, 2 * len(data["img/003.jpg"]), 0)  # fmt: skip
        with tarfile.open(fileobj=answer, mode="r|") as archive:
            assert [m.name for m in archive] == ["img/003.jpg", "img/003.jpg"]


def test_gzip_bundle(tmp_path: Path, proxy: OriginProxy, bucket: str, data: dict[str, bytes]):
    keys = ["img/010.jpg", "big/multi.bin", "empty", "missing"]
    with threaded_app(tmp_path, config(proxy)) as hoard:
        client = tigris(hoard.endpoint)
        for _ in range(2):  # cold, then warm (memory bytes and segments both compressed)
            members, errors = read_bundle(client, bucket, keys, compression="gzip")
            assert members == [(k, data[k]) for k in keys[:3]]
            assert errors == {"skipped": [{"key": "missing", "reason": "NoSuchKey"}]}
        with pytest.raises(BundleError) as caught:
            bundle_objects(client, bucket, keys, compression="zstd")
        assert (caught.value.status_code, caught.value.code) == (501, "NotImplemented")


BAD_BODIES = {
    "empty list": b'{"keys": []}',
    "5001 keys": json.dumps({"keys": ["k"] * 5001}).encode(),
    "6 MiB body": json.dumps({"keys": ["k" * 1000] * 6300}).encode(),
    "invalid JSON": b'{"keys": [',
    "invalid XML": b"<Bundle><Object><Key>a</Key>",
    "a DTD": b'<!DOCTYPE Bundle [<!ENTITY e "img/001.jpg">]><Bundle><Object><Key>&e;</Key>'
    b"</Object></Bundle>",
    "a .. segment": json.dumps({"keys": ["img/../img/001.jpg"]}).encode(),
    "a NUL": json.dumps({"keys": ["img/001.jpg\x00"]}).encode(),
    "a newline": json.dumps({"keys": ["img/\n001.jpg"]}).encode(),
    "2 KiB of UTF-8": json.dumps({"keys": ["é" * 1024]}).encode(),
}


def test_bad_input_is_a_clear_s3_error_and_nothing_reaches_the_origin(
    tmp_path: Path, proxy: OriginProxy, bucket: str, data: dict[str, bytes]
):
    limited = {"access_key": "other", "secret_key": "other-secret", "buckets": ["elsewhere"]}
    credentials = [{"access_key": ACCESS_KEY, "secret_key": SECRET_KEY}, limited]
    with threaded_app(tmp_path, config(proxy, credentials=credentials)) as hoard:
        proxy.reset()
        for name, body in BAD_BODIES.items():
            answer = signed_send(hoard.port, "POST", f"/{bucket}?bundle", body=body)
            assert answer.status == 400, (name, answer.status, answer.body)
            assert b"<Error><Code>" in answer.body and b"<RequestId>" in answer.body, name
        # A wrong signature, and a key that may not read this bucket.
        body = json.dumps({"keys": ["img/001.jpg"]}).encode()
        wrong = signed_send(hoard.port, "POST", f"/{bucket}?bundle", body=body,
                            secret_key="not-the-secret")  # fmt: skip
        assert wrong.status == 403 and b"SignatureDoesNotMatch" in wrong.body
        with pytest.raises(BundleError) as caught:
            bundle_objects(tigris(hoard.endpoint, "other", "other-secret"), bucket, ["img/001.jpg"])
        assert (caught.value.status_code, caught.value.code) == (403, "AccessDenied")
        # A body that is not the one signed.
        host, other = f"127.0.0.1:{hoard.port}", body.replace(b"001", b"002")
        headers = {**sign_headers("POST", host, f"/{bucket}?bundle", body=body), "Host": host,
                   "Content-Length": str(len(other))}  # fmt: skip
        swapped = send(hoard.port, "POST", f"/{bucket}?bundle", headers, other)
        assert swapped.status == 400 and b"XAmzContentSHA256Mismatch" in swapped.body
        unsigned = send(hoard.port, "POST", f"/{bucket}?bundle",
                        {"Host": f"127.0.0.1:{hoard.port}", "Content-Length": str(len(body))},
                        body)  # fmt: skip
        assert unsigned.status == 403
        assert proxy.counts.total() == 0, proxy.counts


def test_a_presigned_bundle(tmp_path: Path, proxy: OriginProxy, bucket: str, data):
    with threaded_app(tmp_path, config(proxy)) as hoard:
        target = presign("POST", f"127.0.0.1:{hoard.port}", f"/{bucket}?bundle")
        body = b"<Bundle><Object><Key>img/007.jpg</Key></Object></Bundle>"
        answer = send(hoard.port, "POST", target,
                      {"Host": f"127.0.0.1:{hoard.port}", "Content-Length": str(len(body))},
                      body)  # fmt: skip
        assert answer.status == 200, answer.body
        with tarfile.open(fileobj=io.BytesIO(answer.body), mode="r|") as archive:
            assert [(m.name, archive.extractfile(m).read()) for m in archive] == [
                ("img/007.jpg", data["img/007.jpg"])]  # fmt: skip


def test_an_origin_failure_mid_object_cuts_the_answer(
    tmp_path: Path, proxy: OriginProxy, bucket: str, data: dict[str, bytes]
):
    # A process: aiohttp's test server cancels a handler whose client left, before
    # it is accounted; Hoard's own server lets it finish.
    hoard = HoardProcess(tmp_path, config(proxy)).start()
    try:
        client = tigris(hoard.endpoint)
        # The third block of the large object fails for good (every try), after the
        # object's header and first blocks went out: the answer is cut, never finished.
        proxy.faults = lambda n, path, rng: (
            Fault("status", status=503) if path.endswith("multi.bin") and "=131072-" in rng
            else None
        )  # fmt: skip
        with pytest.raises((ProtocolError, tarfile.ReadError)):
            read_bundle(client, bucket, ["img/001.jpg", "big/multi.bin", "img/002.jpg"])
        # Accounted once the handler returns, which may be after the client saw the cut.
        cut = 'hoard_requests_total{operation="BundleObjects",status="cut"}'
        assert eventually(lambda: metric(hoard.endpoint, cut) == 1)
        assert metric(hoard.endpoint, 'hoard_responses_cut_total{reason="origin_unavailable"}') == 1
        # One that fails before its first byte is listed in skip mode, and the rest goes on.
        proxy.faults = lambda n, path, rng: (
            Fault("status", status=503) if path.endswith("img/020.jpg") else None
        )  # fmt: skip
        members, errors = read_bundle(client, bucket, ["img/020.jpg", "img/021.jpg"])
        assert members == [("img/021.jpg", data["img/021.jpg"])]
        assert errors == {"skipped": [{"key": "img/020.jpg", "reason": "SlowDown"}]}
    finally:
        assert hoard.stop() == 0, hoard.log()


def eventually(check, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_a_directory_origin_and_metrics(tmp_path: Path):
    root = tmp_path / "data"
    (root / "pics" / "a").mkdir(parents=True)
    files = {f"a/{i}.png": body_of(str(i), 1000 * i + 1) for i in range(5)}
    for key, body in files.items():
        (root / "pics" / key).write_bytes(body)
    cfg = {"origins": {"d": {"type": "posix", "path": str(root)}}, "default_origin": "d"}
    with threaded_app(tmp_path, cfg) as hoard:
        client = tigris(hoard.endpoint)
        keys = [*files, "a/none.png"]
        members, errors = read_bundle(client, "pics", keys)
        assert members == list(files.items())
        assert errors == {"skipped": [{"key": "a/none.png", "reason": "NoSuchKey"}]}
        assert metric(hoard.endpoint, "hoard_bundles_total") == 1
        assert metric(hoard.endpoint, 'hoard_bundle_keys_total{outcome="sent"}') == 5
        assert metric(hoard.endpoint, 'hoard_bundle_keys_total{outcome="skipped"}') == 1
        assert metric(hoard.endpoint, "hoard_bundle_object_bytes_total") == sum(
            map(len, files.values()))  # fmt: skip
        assert metric(hoard.endpoint,
                      'hoard_requests_total{operation="BundleObjects",status="200"}') == 1  # fmt: skip


def test_two_workers_answer_bundles_and_log_their_key_count(
    tmp_path: Path, proxy: OriginProxy, bucket: str, data: dict[str, bytes]
):
    node = HoardProcess(tmp_path, {**config(proxy), "workers": 2,
                                   "log_format": "json"}).start()  # fmt: skip
    try:
        keys = sorted(data)
        for _ in range(4):  # each on a connection of its own: both workers answer some
            members, errors = read_bundle(tigris(node.endpoint), bucket, keys)
            assert members == [(k, data[k]) for k in keys] and errors is None
        assert proxy.counts["GetObject"] <= len(data) + 5  # filled once, shared by the node
    finally:
        assert node.stop() == 0, node.log()
    # The access log is written in batches: read once the workers have stopped (and flushed).
    lines = [json.loads(line) for line in node.log().splitlines()
             if line.startswith("{") and '"BundleObjects"' in line]  # fmt: skip
    assert len(lines) == 4 and all(line["objects"] == len(keys) for line in lines)


def test_a_bundle_counts_for_prefetch_and_auto_warm_as_its_gets_would(
    tmp_path: Path, proxy: OriginProxy, bucket: str, data: dict[str, bytes]
):
    keys = ["img/001.jpg", "img/002.jpg", "big/multi.bin"]
    with threaded_app(tmp_path, config(proxy)) as hoard:
        reader = hoard.app[HIT_PATH]._reader
        observed, cold = [], []
        reader.observers.append(lambda b, k: observed.append(k))
        reader.cold_reads.append(
            lambda mount, okey, may_warm: cold.append(okey) if may_warm else None
        )
        read_bundle(tigris(hoard.endpoint), bucket, keys)  # cold
        assert observed == keys and cold == keys
        read_bundle(tigris(hoard.endpoint), bucket, keys)  # warm: held hits observed too
        assert observed == keys * 2 and cold == keys


def test_a_cluster_of_three_fills_each_block_once_and_streams_peers_blocks(
    tmp_path: Path, proxy: OriginProxy, bucket: str, data: dict[str, bytes]
):
    nodes = start_cluster(tmp_path, proxy, cache={"block_size": "64KiB"})
    try:
        keys = sorted(data)
        proxy.reset()
        for node in nodes:
            members, errors = read_bundle(tigris(node.endpoint), bucket, keys)
            assert members == [(k, data[k]) for k in keys] and errors is None
        blocks = sum(max(1, -(-len(body) // BLOCK)) for body in data.values() if body)
        assert proxy.counts["GetObject"] == blocks, proxy.listed_gets()
        peer = [metric(n.endpoint, 'hoard_bytes_served_total{source="peer"}') for n in nodes]
        assert sum(peer) > 0
    finally:
        for node in nodes:
            assert node.stop() == 0, node.log()


def test_warm_keys_from_the_disk_tier_go_out_with_sendfile_as_chunks_of_their_own(
    tmp_path: Path, proxy: OriginProxy, bucket: str, data: dict[str, bytes]
):
    keys = ["img/001.jpg", "big/multi.bin", "img/002.jpg", "empty", "img/001.jpg"]
    cfg = config(proxy)
    cfg["cache"]["memory_item_max"] = "1KiB"  # no block stays in memory: hits are disk segments
    with threaded_app(tmp_path, cfg) as hoard:
        client = tigris(hoard.endpoint)
        expected = [(k, data[k]) for k in keys]
        assert read_bundle(client, bucket, keys) == (expected, None)  # cold
        for options in ({}, {"compression": "gzip"}):  # warm, from disk, plain and gzip
            assert read_bundle(client, bucket, keys, **options) == (expected, None)
        assert metric(hoard.endpoint, 'hoard_bytes_served_total{source="disk"}') > 0
