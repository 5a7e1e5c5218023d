"""A fail-mode bundle can be answered with a Content-Length: every member's size is known first.

In fail mode every key is looked up before the first byte, so the archive's
length is known; a client that asks (``X-Hoard-Bundle-Framing: length``) gets
it as a Content-Length instead of a chunked answer. The length must be the
bytes sent, exactly: each test reads the answer off a raw socket with
``Connection: close`` until the server closes it, so a byte too many or too
few shows. An object whose size changed between its lookup and its turn in
the stream cannot fit what was announced: the connection is cut, in either
framing, never a member with other bytes.
"""

from __future__ import annotations

import gzip
import io
import json
import socket
import tarfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from tigris_boto3_ext import BUNDLE_ON_ERROR_FAIL, bundle_objects
from urllib3.exceptions import ProtocolError

from gateway.s3.bundle import tar
from tests.conftest import seed
from tests.harness import HoardProcess, metric
from tests.inprocess import threaded_app
from tests.origin_proxy import Fault, OriginProxy, fail_nth
from tests.rawhttp import sign_headers
from tests.test_bundle import BLOCK, body_of, config, eventually, read_bundle, tigris


@pytest.fixture
def data(bucket: str) -> dict[str, bytes]:
    objects = {f"img/{i:03d}.jpg": body_of(f"img/{i:03d}.jpg", 3000 + 97 * i) for i in range(5)}
    objects["big/multi.bin"] = body_of("big", 5 * BLOCK + 123)  # six blocks
    objects["empty"] = b""
    objects["ü/ключ " + "x" * 120] = b"long unicode name"  # a pax header before its own
    seed(bucket, objects)
    return objects


LENGTH = {"X-Tigris-Bundle-On-Error": "fail", "X-Hoard-Bundle-Framing": "length"}


def _raw_bundle(port: int, bucket: str, keys: list[str], **headers: str) -> tuple[dict, bytes]:
    """(headers, body) of one bundle, the body read until the server closes."""
    body = json.dumps({"keys": keys}).encode()
    host, target = f"127.0.0.1:{port}", f"/{bucket}?bundle"
    signed = sign_headers("POST", host, target, headers, body=body)
    signed.update({"Host": host, "Content-Length": str(len(body)), "Connection": "close"})
    lines = [f"POST {target} HTTP/1.1", *(f"{k}: {v}" for k, v in signed.items()), "", ""]
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall("\r\n".join(lines).encode() + body)
        answer = bytearray()
        while chunk := sock.recv(1 << 16):
            answer += chunk
    head, _, rest = bytes(answer).partition(b"\r\n\r\n")
    status, *fields = head.decode().split("\r\n")
    assert status.startswith("HTTP/1.1 200"), (status, rest[:500])
    return {k.lower(): v for k, _, v in (f.partition(": ") for f in fields)}, rest


def _members(archive: bytes) -> list[tuple[str, bytes]]:
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r|") as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar]  # type: ignore[union-attr]


@pytest.mark.parametrize("tier", ["memory", "disk", "large blocks"])
def test_a_fail_mode_answer_has_a_content_length_equal_to_its_bytes(
    tmp_path: Path, proxy: OriginProxy, bucket: str, data: dict[str, bytes], tier: str
):
    # A pax-named key, an empty one, a six-block one (read, not held), one asked twice.
    keys = ["img/001.jpg", "ü/ключ " + "x" * 120, "empty", "big/multi.bin", "img/002.jpg",
            "img/001.jpg"]  # fmt: skip
    cfg = config(proxy)
    if tier != "memory":
        cfg["cache"]["memory_item_max"] = "1KiB"  # no block stays in memory: disk segments
    if tier == "large blocks":  # the six-block object is one block: a segment past _NOW_MAX
        cfg["cache"]["block_size"] = "1MiB"
    with threaded_app(tmp_path, cfg) as hoard:
        for _ in ("cold", "warm"):
            headers, body = _raw_bundle(hoard.port, bucket, keys, **LENGTH)
            assert "transfer-encoding" not in headers
            assert int(headers["content-length"]) == len(body)
            assert _members(body) == [(key, data[key]) for key in keys]
        # Not asked for (Tigris's client), or not known first (skip mode, gzip): chunked.
        not_length = [{"X-Tigris-Bundle-On-Error": "fail"}, {**LENGTH, "X-Tigris-Bundle-On-Error": "skip"},
                      {**LENGTH, "X-Tigris-Bundle-Compression": "gzip"}]  # fmt: skip
        for options in not_length:
            headers, _ = _raw_bundle(hoard.port, bucket, keys, **options)
            assert headers["transfer-encoding"] == "chunked" and "content-length" not in headers


@pytest.mark.parametrize("framing", ["length", "chunked"])
def test_an_object_whose_size_changed_since_its_lookup_cuts_the_answer(
    tmp_path: Path, proxy: OriginProxy, bucket: str, data: dict[str, bytes], framing: str
):
    # A process: aiohttp's test server may cancel a handler whose connection is gone
    # before it is accounted; Hoard's own server lets it finish.
    hoard = HoardProcess(tmp_path, config(proxy)).start()
    try:
        keys, changed = ["img/001.jpg", "img/004.jpg", "img/002.jpg"], "img/002.jpg"
        read_bundle(tigris(hoard.endpoint), bucket, [keys[0], changed])  # held
        # The cold key's lookup is held at the origin, so the bundle waits between its
        # lookups and its first byte; meanwhile the held key after it (looked up, not
        # opened: only the held keys before the first cold one are) is written, larger,
        # through Hoard.
        proxy.faults = fail_nth(1, Fault("hang"), keys[1])
        with ThreadPoolExecutor(1) as pool:
            started = pool.submit(_cut_answer, hoard.port, bucket, keys, framing)
            assert proxy.stalled.wait(10)
            tigris(hoard.endpoint).put_object(Bucket=bucket, Key=changed,
                                              Body=data[changed] + b"more")  # fmt: skip
            proxy.release()
            got = started.result(30)
        # Nothing of the changed object: at most the members before it, whole.
        whole = [(key, data[key]) for key in keys[:2]]
        sizes = [(key, len(body)) for key, body in whole]
        ends = [0, *(tar.archive_length(sizes[:n]) - len(tar.END) for n in (1, 2))]
        assert len(got) in ends
        assert _members(got + tar.END) == whole[: ends.index(len(got))]
        cut = 'hoard_responses_cut_total{reason="origin_changed"}'
        assert eventually(lambda: metric(hoard.endpoint, cut) == 1)
    finally:
        proxy.release()
        assert hoard.stop() == 0, hoard.log()


def _cut_answer(port: int, bucket: str, keys: list[str], framing: str) -> bytes:
    """What arrived of a bundle that must be cut: short of its Content-Length, or
    chunked and without its last chunk (Tigris's client reports it)."""
    if framing == "length":
        headers, body = _raw_bundle(port, bucket, keys, **LENGTH)
        assert len(body) < int(headers["content-length"])
        return body
    answer = bundle_objects(tigris(f"http://127.0.0.1:{port}"), bucket, keys,
                            on_error=BUNDLE_ON_ERROR_FAIL)  # fmt: skip
    assert "content-length" not in answer.headers
    got = bytearray()
    with pytest.raises(ProtocolError):
        while piece := answer.read(4096):
            got += piece
    return bytes(got)


def _dechunked(body: bytes) -> tuple[bytes, dict[str, str], bytes]:
    """A chunked body decoded (RFC 9112 §7.1): its data, its trailer fields, what follows."""
    data, at = bytearray(), 0
    while True:
        line_end = body.index(b"\r\n", at)
        size = int(body[at:line_end].split(b";")[0], 16)
        at = line_end + 2
        if size == 0:
            break
        data += body[at : at + size]
        assert body[at + size : at + size + 2] == b"\r\n"
        at += size + 2
    end = body.index(b"\r\n\r\n", at - 2) + 4  # the trailer section, up to its blank line
    fields = body[at : end - 2].decode().split("\r\n")
    trailers = {k.lower(): v for k, _, v in (f.partition(": ") for f in fields if f)}
    return bytes(data), trailers, body[end:]


@pytest.mark.parametrize("options", [{}, {"X-Tigris-Bundle-On-Error": "fail"},
                                     {"X-Tigris-Bundle-Compression": "gzip"}])  # fmt: skip
def test_a_chunked_answer_ends_with_the_totals_as_trailers(
    tmp_path: Path, proxy: OriginProxy, bucket: str, data: dict[str, bytes], options: dict
):
    """The members sent, their object bytes and the keys skipped, as Tigris documents them:
    trailers announced in a ``Trailer`` header, after the last chunk; nothing after them."""
    keys = ["img/001.jpg", "empty", "big/multi.bin", "img/001.jpg"]
    if not options:
        keys.append("not/there")  # skip mode: left out, listed, counted
    with threaded_app(tmp_path, config(proxy)) as hoard:
        headers, body = _raw_bundle(hoard.port, bucket, keys, **options)
    assert headers["transfer-encoding"] == "chunked"
    assert (
        headers["trailer"]
        == "x-tigris-bundle-count, x-tigris-bundle-bytes, x-tigris-bundle-skipped"
    )
    archive, trailers, rest = _dechunked(body)
    assert rest == b""
    if options.get("X-Tigris-Bundle-Compression") == "gzip":
        archive = gzip.decompress(archive)
    sent = [key for key in keys if key in data]
    assert [name for name, _ in _members(archive)] == sent + (
        ["__bundle_errors.json"] if not options else []
    )
    assert trailers == {"x-tigris-bundle-count": str(len(sent)),
                        "x-tigris-bundle-bytes": str(sum(len(data[key]) for key in sent)),
                        "x-tigris-bundle-skipped": "0" if options else "1"}  # fmt: skip
