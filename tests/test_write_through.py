"""Write-through: what a PutObject stores is also cached, so the next reader hits.

Proved by counting what reaches the origin: moto behind ``OriginProxy`` for S3
origins, Hoard's own origin metrics for a posix directory. The admission of
uploads into the bounded write-through buffer, and the check that a later
write wins over an earlier write-through, are tested in-process with a real
posix origin and a real disk tier.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from gateway.app.wiring import ReadWrite, read_and_write
from gateway.blocks.source import BlockSource
from gateway.cache.disk import DiskTier
from gateway.cache.memory import MemoryTier
from gateway.config.settings import PosixOriginConfig
from gateway.metadata.memory import MetadataCache
from gateway.obs.events import BlockMetrics, OriginGuardMetrics
from gateway.obs.metrics import Metrics
from gateway.origins.base import ObjectInfo
from gateway.origins.guard import OriginGuard
from gateway.origins.namespace import Mount, Namespace
from gateway.origins.posix import PosixOrigin
from gateway.read.reader import Reader
from gateway.write.capture import Budget, Capture
from gateway.write.writer import Attributes
from tests.harness import metric, sum_samples
from tests.inprocess import read_object, threaded_app
from tests.test_block_cache import hoard_config

MiB = 1024 * 1024


# -- admission into the write-through buffer ----------------------------------------------


async def _body(*pieces: bytes) -> AsyncIterator[bytes]:
    for piece in pieces:
        yield piece


async def _drain(body: AsyncIterator[bytes]) -> list[bytes]:
    return [piece async for piece in body]


async def test_capture_keeps_a_declared_body_and_gives_its_room_back() -> None:
    budget = Budget(100)
    capture = Capture(budget, limit=80, declared=60)
    assert capture.keeping and budget.used == 60  # room taken up front
    pieces = [b"a" * 20, b"b" * 40]
    sent = await _drain(capture.tee(_body(*pieces)))
    assert sent == pieces and all(s is p for s, p in zip(sent, pieces, strict=True))
    assert capture.pieces() == pieces and capture.size == 60
    assert budget.used == 60
    capture.release()
    capture.release()  # idempotent
    assert budget.used == 0


async def test_capture_refuses_a_body_over_the_limit_or_without_room() -> None:
    budget = Budget(100)
    assert not Capture(budget, limit=50, declared=51).keeping
    assert budget.used == 0
    first = Capture(budget, limit=100, declared=70)
    assert first.keeping
    second = Capture(budget, limit=100, declared=40)  # 70 + 40 > 100: refused, no wait
    assert not second.keeping and budget.used == 70
    first.release()
    assert Capture(budget, limit=100, declared=40).keeping and budget.used == 40


async def test_capture_of_unknown_length_grows_within_bounds_then_lets_go() -> None:
    budget = Budget(100)
    over_limit = Capture(budget, limit=50, declared=None)
    pieces = [b"x" * 30, b"y" * 30, b"z" * 10]
    assert await _drain(over_limit.tee(_body(*pieces))) == pieces  # the origin gets all
    assert not over_limit.keeping and over_limit.pieces() is None and budget.used == 0

    hog = Capture(budget, limit=100, declared=80)
    squeezed = Capture(budget, limit=100, declared=None)
    sent = await _drain(squeezed.tee(_body(b"1" * 15, b"2" * 15)))  # 80 + 30 > 100
    assert sent == [b"1" * 15, b"2" * 15]
    assert not squeezed.keeping and budget.used == 80  # never above the bound
    hog.release()
    assert budget.used == 0


async def test_capture_of_a_body_that_fails_is_never_whole() -> None:
    budget = Budget(100)
    capture = Capture(budget, limit=100, declared=10)

    async def failing() -> AsyncIterator[bytes]:
        yield b"12345"
        raise ValueError("bad checksum")

    with pytest.raises(ValueError):
        await _drain(capture.tee(failing()))
    assert capture.pieces() is None
    capture.release()
    assert budget.used == 0


# -- in-process: a later write wins over an earlier write-through ------------------------


class GatedPosix(PosixOrigin):
    """A posix origin whose first HEAD, once ``gate`` is set up, answers only when it opens."""

    gate: asyncio.Event | None = None
    heads = 0

    async def head_object(self, bucket: str, key: str) -> ObjectInfo:
        info = await super().head_object(bucket, key)
        self.heads += 1
        if self.gate is not None and self.heads == 1:
            await self.gate.wait()  # the HEAD has its answer; it arrives late
        return info


async def _wired(tmp_path: Path, block_size: int = 64 * 1024, buffer: int = 8 * MiB):
    origin, core, metrics = await _wired_core(tmp_path, block_size, buffer)
    return origin, core.reader, core.writer, metrics


async def _wired_core(
    tmp_path: Path, block_size: int = 64 * 1024, buffer: int = 8 * MiB
) -> tuple[GatedPosix, ReadWrite, Metrics]:
    root = tmp_path / "root"
    (root / "data").mkdir(parents=True)
    origin = GatedPosix("disk", root)
    metrics = Metrics()  # origin requests are counted by the guard, as in a running Hoard
    guarded = OriginGuard(
        origin, PosixOriginConfig(type="posix", path=root), OriginGuardMetrics(metrics, "disk")
    )
    mount = Mount(bucket="b", origin=guarded, origin_bucket="data", write_through_max=4 * MiB)
    namespace = Namespace([mount], write_through_buffer=buffer)
    disk = DiskTier(tmp_path / "cache", 64 * MiB)
    await disk.start()
    blocks = BlockSource(MemoryTier(8 * MiB, 16 * 1024), disk, BlockMetrics(metrics))
    return origin, read_and_write(namespace, blocks, MetadataCache(), metrics, block_size), metrics


async def _read(reader: Reader, key: str, sources: Counter[str] | None = None) -> bytes:
    return await read_object(reader, "b", key, sources)


def _count(metrics: Metrics, name: str, **labels: str) -> float:
    selector = name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
    return sum_samples(metrics.render().decode(), selector)


async def test_write_through_serves_the_next_read_without_the_origin(tmp_path) -> None:
    _, reader, writer, metrics = await _wired(tmp_path)
    data = os.urandom(200 * 1024 + 7)  # four blocks, the last one short
    await writer.put_object("b", "ckpt", _body(data[:100_000], data[100_000:]), Attributes(),
                            length=len(data))  # fmt: skip
    await writer.settle()
    assert writer.budget.used == 0
    assert _count(metrics, "hoard_write_through_bytes_total") == len(data)
    sources: Counter[str] = Counter()
    assert await _read(reader, "ckpt", sources) == data
    origin_gets = _count(
        metrics, "hoard_origin_requests_total", origin="disk", operation="GetObject"
    )
    heads = _count(metrics, "hoard_origin_requests_total", origin="disk", operation="HeadObject")
    assert (origin_gets, heads) == (0, 1)  # the one HEAD learned the metadata
    assert sources["origin"] == 0 and sources["memory"] + sources["disk"] == len(data)
    await reader.blocks.disk.close()


async def test_a_later_write_wins_over_an_earlier_write_through(tmp_path) -> None:
    origin, reader, writer, metrics = await _wired(tmp_path)
    old, new = os.urandom(100_000), os.urandom(90_000)
    origin.gate = asyncio.Event()
    await writer.put_object("b", "k", _body(old), Attributes(), length=len(old))
    while origin.heads < 1:  # the old write-through's HEAD saw the old object...
        await asyncio.sleep(0.001)
    await writer.put_object("b", "k", _body(new), Attributes(), length=len(new))
    while _count(metrics, "hoard_write_through_bytes_total") < len(new):
        await asyncio.sleep(0.001)  # the new write is cached first
    origin.gate.set()  # ...and the old HEAD answers after the new write's invalidation
    await writer.settle()
    # The old one matched its HEAD but was invalidated meanwhile: nothing of it landed.
    assert await _read(reader, "k") == new
    assert _count(metrics, "hoard_write_through_bytes_total") == len(new)
    assert _count(metrics, "hoard_origin_requests_total", origin="disk", operation="GetObject") == 0
    await reader.blocks.disk.close()


async def test_an_invalidated_prefix_stops_a_write_through_too(tmp_path) -> None:
    origin, core, metrics = await _wired_core(tmp_path)
    reader, writer = core.reader, core.writer
    origin.gate = asyncio.Event()
    data = os.urandom(70_000)
    await writer.put_object("b", "dir/k", _body(data), Attributes(), length=len(data))
    while origin.heads < 1:
        await asyncio.sleep(0.001)
    await core.invalidator.drop("b", "dir/")
    origin.gate.set()
    await writer.settle()
    assert _count(metrics, "hoard_write_through_bytes_total") == 0
    assert reader.metadata.known(("disk", "data"), "dir/k") is None
    await reader.blocks.disk.close()


async def test_no_room_in_the_buffer_means_no_write_through(tmp_path) -> None:
    origin, reader, writer, metrics = await _wired(tmp_path, buffer=50_000)
    data = os.urandom(60_000)
    await writer.put_object("b", "big", _body(data), Attributes(), length=len(data))
    await writer.settle()
    assert _count(metrics, "hoard_write_through_bytes_total") == 0
    assert origin.heads == 0
    assert await _read(reader, "big") == data  # read from the origin as usual
    await reader.blocks.disk.close()


# -- end to end: moto behind a counting proxy -----------------------------------------------


def _wait_for(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


WRITTEN = "hoard_write_through_bytes_total"


def _settled(endpoint: str) -> None:
    """Until the bytes written through stop changing for a moment."""
    last = metric(endpoint, WRITTEN)
    while True:
        time.sleep(0.2)
        now = metric(endpoint, WRITTEN)
        if now == last:
            return
        last = now


def test_put_then_get_costs_no_origin_get(tmp_path, proxy, origin_client, bucket) -> None:
    with threaded_app(tmp_path, hoard_config(proxy)) as node:
        client = node.client()
        data = os.urandom(20 * MiB)
        proxy.reset()
        etag = client.put_object(Bucket=bucket, Key="ckpt/step-100", Body=data)["ETag"]
        _wait_for(lambda: metric(node.endpoint, WRITTEN) == len(data))
        # The PUT itself and the one HEAD that learned Last-Modified and Content-Type.
        assert dict(proxy.counts) == {"PUT": 1, "HeadObject": 1}
        proxy.reset()
        got = client.get_object(Bucket=bucket, Key="ckpt/step-100")
        assert got["Body"].read() == data and got["ETag"] == etag
        assert client.head_object(Bucket=bucket, Key="ckpt/step-100")["ContentLength"] == len(data)
        assert sum(proxy.counts.values()) == 0  # not one origin request
        served = 'hoard_bytes_served_total{source="origin"}'
        assert metric(node.endpoint, served) == 0


def test_an_object_over_write_through_max_is_not_cached(tmp_path, proxy, bucket) -> None:
    with threaded_app(tmp_path, hoard_config(proxy)) as node:
        client = node.client()
        data = os.urandom(100 * MiB)
        proxy.reset()
        client.put_object(Bucket=bucket, Key="big", Body=data)
        time.sleep(0.3)  # give a (wrong) write-through a moment to show
        assert dict(proxy.counts) == {"PUT": 1}
        assert metric(node.endpoint, WRITTEN) == 0
        assert client.get_object(Bucket=bucket, Key="big")["Body"].read() == data
        assert proxy.counts["GetObject"] == 13  # every 8 MiB block from the origin


def test_a_mount_with_write_through_off(tmp_path, proxy, bucket) -> None:
    config = {**hoard_config(proxy),
              "mounts": [{"bucket": bucket, "origin": "moto", "write_through": False}]}  # fmt: skip
    with threaded_app(tmp_path, config) as node:
        client = node.client()
        data = os.urandom(3 * MiB)
        proxy.reset()
        client.put_object(Bucket=bucket, Key="k", Body=data)
        time.sleep(0.3)
        assert dict(proxy.counts) == {"PUT": 1}
        assert client.get_object(Bucket=bucket, Key="k")["Body"].read() == data
        assert proxy.counts["GetObject"] == 1


def test_quick_overwrites_read_the_newest_bytes(tmp_path, proxy, origin_client, bucket) -> None:
    with threaded_app(tmp_path, hoard_config(proxy)) as node:
        client = node.client()
        for round_ in range(5):
            key = f"k{round_}"
            versions = [os.urandom(9 * MiB + i) for i in range(3)]
            newest = len(versions[-1])
            before = metric(node.endpoint, WRITTEN)
            proxy.reset()
            for version in versions:
                client.put_object(Bucket=bucket, Key=key, Body=version)
            # Each write-through asks one HEAD; the last one caches the newest bytes.
            _wait_for(lambda: proxy.counts["HeadObject"] == 3)
            _wait_for(lambda: metric(node.endpoint, WRITTEN) >= before + newest)  # noqa: B023
            _settled(node.endpoint)
            for _ in range(3):
                assert client.get_object(Bucket=bucket, Key=key)["Body"].read() == versions[-1]
            direct = origin_client.get_object(Bucket=bucket, Key=key)["Body"].read()
            assert direct == versions[-1]


# -- end to end: a posix origin ---------------------------------------------------------------


def test_posix_put_then_get_is_served_from_the_cache(tmp_path) -> None:
    root = tmp_path / "root"
    (root / "scratch").mkdir(parents=True)
    config = {"origins": {"nfs": {"type": "posix", "path": str(root)}}, "default_origin": "nfs"}
    with threaded_app(tmp_path / "node", config) as node:
        client = node.client()
        data = os.urandom(20 * MiB + 5)
        client.put_object(Bucket="scratch", Key="eval/ckpt.pt", Body=data)
        assert (root / "scratch" / "eval" / "ckpt.pt").read_bytes() == data
        _wait_for(lambda: metric(node.endpoint, WRITTEN) == len(data))
        gets = 'hoard_origin_requests_total{operation="GetObject",origin="o0"}'
        heads = 'hoard_origin_requests_total{operation="HeadObject",origin="o0"}'
        before = {
            name: metric(node.endpoint, name)
            for name in (gets, heads, 'hoard_bytes_served_total{source="disk"}',
                         'hoard_bytes_served_total{source="memory"}')
        }  # fmt: skip
        assert before[gets] == 0 and before[heads] == 1
        assert client.get_object(Bucket="scratch", Key="eval/ckpt.pt")["Body"].read() == data
        cached = sum(
            metric(node.endpoint, name) - before[name]
            for name in ('hoard_bytes_served_total{source="disk"}',
                         'hoard_bytes_served_total{source="memory"}')
        )  # fmt: skip
        assert cached == len(data)
        assert metric(node.endpoint, gets) == 0 and metric(node.endpoint, heads) == 1
        assert metric(node.endpoint, 'hoard_bytes_served_total{source="origin"}') == 0
