"""OriginGuard around real in-process origins: a posix directory, and a small scripted store.

No HTTP here (tests/test_origin_protection.py has moto behind a proxy); time is a
controllable clock whose ``sleep`` advances it, so nothing depends on how fast
the machine is.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gateway.config.settings import PosixOriginConfig, S3OriginConfig
from gateway.core import errors, priority
from gateway.obs.events import OriginGuardMetrics
from gateway.obs.metrics import Metrics
from gateway.origins.base import BucketInfo, ListPage, ObjectInfo, Origin
from gateway.origins.breaker import Ticket
from gateway.origins.guard import OriginGuard
from gateway.origins.posix import PosixOrigin
from gateway.origins.writable import READ_ONLY, Capability
from tests.fakes import Clock

pytestmark = pytest.mark.timeout(20)


def posix_config(path: Path, **protection: Any) -> PosixOriginConfig:
    return PosixOriginConfig(type="posix", path=path, **protection)


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    metrics.flush()  # this loop turn's counts, as a scrape would
    return metrics.registry.get_sample_value(name, labels) or 0.0


class Scripted:
    """An Origin whose answers are scripted: fail the first tries of each key, or always."""

    def __init__(self, name: str = "scripted", fail_first: int = 0) -> None:
        self.name = name
        self.fail_first = fail_first
        self.always: errors.HoardError | None = None
        self.tries: dict[str, int] = {}
        self.calls = 0
        self.broken_bodies = 0  # GETs of a key whose body breaks before its first byte
        self.streams: list[Body] = []

    def _answer(self, key: str) -> None:
        self.calls += 1
        self.tries[key] = self.tries.get(key, 0) + 1
        if self.always is not None:
            raise self.always
        if self.tries[key] <= self.fail_first:
            raise errors.OriginThrottled("SlowDown")

    async def head_object(self, bucket: str, key: str) -> ObjectInfo:
        self._answer(key)
        return ObjectInfo(key, 1, '"e"', datetime(2024, 1, 1, tzinfo=UTC))

    async def list_buckets(self) -> list[BucketInfo]:
        return []

    async def head_bucket(self, bucket: str) -> None:
        self._answer("")

    async def bucket_region(self, bucket: str) -> str:
        return "us-east-1"

    async def get_object(self, bucket: str, key: str, byte_range=None, if_match=None) -> Any:
        self._answer(key)
        broken = self.tries[key] <= self.broken_bodies
        stream = Body(key, b"0123456789", broken)
        self.streams.append(stream)
        return stream

    async def list_objects(self, bucket: str, prefix: str = "", delimiter: str = "",
                           start_after: str = "", max_keys: int = 1000) -> ListPage:  # fmt: skip
        self._answer(prefix)
        return ListPage([], [], False, None)

    async def close(self) -> None:
        pass


class Body:
    """A GET's body in two chunks; ``broken``: the connection resets before the first."""

    def __init__(self, key: str, data: bytes, broken: bool) -> None:
        self.info = ObjectInfo(key, len(data), '"e"', datetime(2024, 1, 1, tzinfo=UTC))
        self.start, self.end = 0, len(data) - 1
        self.data, self.broken, self.closed = data, broken, False

    async def chunks(self) -> AsyncIterator[bytes]:
        if self.broken:
            raise errors.OriginUnavailable("connection reset")
        yield self.data[:4]
        yield self.data[4:]

    async def aclose(self) -> None:
        self.closed = True

    async def __aenter__(self) -> Body:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def guard(origin: Origin, clock: Clock, metrics: Metrics, **protection: Any) -> OriginGuard:
    config = PosixOriginConfig(type="posix", path=Path("/"), **protection)
    return OriginGuard(origin, config, OriginGuardMetrics(metrics, origin.name),
                       clock=clock, sleep=clock.sleep, rand=lambda: 1.0)  # fmt: skip


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "bucket").mkdir()
    for i in range(8):
        (tmp_path / "bucket" / f"obj{i}").write_bytes(os.urandom(3 * 1024 * 1024 + i))
    return tmp_path


async def read(stream: Any) -> bytes:
    async with stream:
        return b"".join([chunk async for chunk in stream.chunks()])


# --- the protocol, and what passes through ---------------------------------------


async def test_guard_is_an_origin_and_passes_writes_through(tree: Path) -> None:
    posix = PosixOrigin("nfs", tree)
    guarded = OriginGuard(posix, posix_config(tree), OriginGuardMetrics(Metrics(), "nfs"))
    assert isinstance(guarded, Origin) and guarded.name == "nfs"
    # Declared, not discovered: the posix origin is written through its own API.
    assert guarded.capability == Capability(writable=posix)
    assert Capability.of(guarded).forwarding is None
    result = await guarded.capability.writable.put_object("bucket", "new", _body(b"abc"))
    assert result.etag
    assert await read(await guarded.get_object("bucket", "new")) == b"abc"


async def _body(data: bytes) -> AsyncIterator[bytes]:
    yield data


def test_s3_guard_forwards(moto_endpoint: str) -> None:
    from gateway.origins.s3 import S3Origin

    config = S3OriginConfig(type="s3", endpoint=moto_endpoint)
    inner = S3Origin("aws", config)
    guarded = OriginGuard(inner, config, OriginGuardMetrics(Metrics(), "aws"))
    assert guarded.capability == Capability(forwarding=inner)


def test_an_origin_that_declares_nothing_is_read_only() -> None:
    assert Capability.of(object()) == READ_ONLY == Capability(None, None)


# --- concurrency and priority --------------------------------------------------------


async def test_a_get_holds_its_slot_until_its_body_is_read(tree: Path) -> None:
    metrics = Metrics()
    guarded = OriginGuard(
        PosixOrigin("nfs", tree), posix_config(tree, limits={"max_concurrency": 1}),
        OriginGuardMetrics(metrics, "nfs"),
    )  # fmt: skip
    first = await guarded.get_object("bucket", "obj0")
    second = asyncio.create_task(guarded.get_object("bucket", "obj1"))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not second.done()
    assert sample(metrics, "hoard_origin_queued_requests", origin="nfs", priority="client") == 1
    assert sample(metrics, "hoard_origin_in_flight_requests", origin="nfs", priority="client") == 1
    body = b"".join([chunk async for chunk in first.chunks()])  # read to the end...
    assert len(body) == 3 * 1024 * 1024
    stream = await asyncio.wait_for(second, 5)  # ...and the slot moves on
    assert await read(stream) == (tree / "bucket" / "obj1").read_bytes()
    await first.aclose()
    assert guarded.gate.held == 0
    assert sample(metrics, "hoard_origin_in_flight_requests", origin="nfs", priority="client") == 0
    assert sample(metrics, "hoard_origin_throttled_total", origin="nfs", limit="concurrency") == 1


async def turns_until(condition: Callable[[], bool], turns: int = 100) -> None:
    """Let the event loop run other tasks (no clock involved) until ``condition`` holds."""
    for _ in range(turns):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"not reached in {turns} loop turns")


class RecordingPosix(PosixOrigin):
    """The posix origin, noting the order in which GETs reach it (after the gate)."""

    def __init__(self, name: str, root: Path) -> None:
        super().__init__(name, root)
        self.order: list[str] = []

    async def get_object(self, bucket: str, key: str, byte_range=None, if_match=None) -> Any:
        self.order.append(key)
        return await super().get_object(bucket, key, byte_range, if_match)


async def test_client_requests_go_before_background_ones_at_a_saturated_cap(tree: Path) -> None:
    metrics = Metrics()
    posix = RecordingPosix("nfs", tree)
    guarded = OriginGuard(
        posix, posix_config(tree, limits={"max_concurrency": 2}), OriginGuardMetrics(metrics, "nfs")
    )
    holders = [await guarded.get_object("bucket", f"obj{i}") for i in range(2)]

    async def reader(key: str) -> None:
        body = await read(await guarded.get_object("bucket", key))
        assert body == (tree / "bucket" / key).read_bytes()

    async def background_reader(key: str) -> None:
        with priority.background():
            await reader(key)

    # Background work (warm, prefetch) queues first; clients arrive after it.
    def queued(level: str) -> float:
        return sample(metrics, "hoard_origin_queued_requests", origin="nfs", priority=level)

    tasks = [asyncio.create_task(background_reader(f"obj{i}")) for i in (2, 3, 4)]
    await turns_until(lambda: queued("background") == 3)
    tasks += [asyncio.create_task(reader(f"obj{i}")) for i in (5, 6, 7)]
    await turns_until(lambda: queued("client") == 3)
    assert queued("background") == 3
    for stream in holders:
        await stream.aclose()
    await asyncio.wait_for(asyncio.gather(*tasks), 10)
    # Two slots: the clients get them first, background work only after them.
    assert posix.order[2:5] == ["obj5", "obj6", "obj7"]
    assert posix.order[5:] == ["obj2", "obj3", "obj4"]
    waits = sample(metrics, "hoard_origin_queue_wait_seconds_count", origin="nfs",
                   priority="background")  # fmt: skip
    assert waits == 3


# --- token buckets ---------------------------------------------------------------------


async def test_bytes_per_second_delays_chunks_by_what_they_exceed(tree: Path) -> None:
    clock, metrics = Clock(100.0), Metrics()
    mib = 1024 * 1024
    guarded = OriginGuard(
        PosixOrigin("nfs", tree), posix_config(tree, limits={"bytes_per_second": "1MiB"}),
        OriginGuardMetrics(metrics, "nfs"), clock=clock, sleep=clock.sleep,
    )  # fmt: skip
    bodies = [await read(await guarded.get_object("bucket", f"obj{i}")) for i in range(2)]
    assert bodies == [(tree / "bucket" / f"obj{i}").read_bytes() for i in range(2)]
    total = sum(len(body) for body in bodies)
    # 1 MiB of burst, then 1 s per MiB: the fake clock moved exactly as the limit says.
    assert sum(clock.slept) == pytest.approx((total - mib) / mib)
    assert sample(metrics, "hoard_origin_throttled_total", origin="nfs", limit="bytes") > 0


async def test_requests_per_second_paces_requests() -> None:
    clock, metrics = Clock(100.0), Metrics()
    guarded = guard(Scripted(), clock, metrics, limits={"requests_per_second": 5})
    for i in range(15):
        await guarded.head_object("b", f"k{i}")
    # 5 go at once (a second's burst), the next 10 at 5 per second: 2 s of fake time.
    assert clock.now - 100.0 == pytest.approx(2.0)
    assert (
        sample(metrics, "hoard_origin_throttled_total", origin="scripted", limit="requests") == 10
    )


# --- retries ---------------------------------------------------------------------------


async def test_slowdowns_are_retried_and_counted() -> None:
    clock, metrics = Clock(100.0), Metrics()
    origin = Scripted(fail_first=2)
    guarded = guard(origin, clock, metrics, max_attempts=3)
    for i in range(10):
        await guarded.head_object("b", f"k{i}")
    assert origin.calls == 30
    assert sample(metrics, "hoard_origin_retries_total", origin="scripted",
                  operation="HeadObject") == 20  # fmt: skip
    # Full jitter (rand pinned to its top here): 50 ms, then 100 ms, per request.
    assert sorted(set(clock.slept)) == pytest.approx([0.05, 0.1])


async def test_a_body_that_breaks_before_its_first_byte_is_retried() -> None:
    clock, metrics = Clock(100.0), Metrics()
    origin = Scripted()
    origin.broken_bodies = 1
    guarded = guard(origin, clock, metrics, max_attempts=3, limits={"max_concurrency": 1})
    assert await read(await guarded.get_object("b", "k")) == b"0123456789"
    assert origin.calls == 2
    assert [stream.closed for stream in origin.streams] == [True, True]
    assert guarded.gate.held == 0
    assert sample(metrics, "hoard_origin_retries_total", origin="scripted",
                  operation="GetObject") == 1  # fmt: skip


async def test_max_attempts_counts_every_try() -> None:
    origin = Scripted(fail_first=5)
    guarded = guard(origin, Clock(100.0), Metrics(), max_attempts=3)
    with pytest.raises(errors.OriginThrottled):
        await guarded.list_objects("b", "p")
    assert origin.calls == 3


async def test_answers_about_the_request_are_not_retried() -> None:
    origin = Scripted()
    origin.always = errors.NoSuchKey("k")
    guarded = guard(origin, Clock(100.0), Metrics(), max_attempts=5, breaker={"failures": 1})
    for _ in range(3):
        with pytest.raises(errors.NoSuchKey):
            await guarded.head_object("b", "k")
    assert origin.calls == 3  # one try each, and the breaker stays closed


async def test_the_retry_budget_bounds_retries_against_a_failing_origin() -> None:
    clock, metrics = Clock(100.0), Metrics()
    origin = Scripted()
    origin.always = errors.OriginUnavailable("503")
    guarded = guard(
        origin, clock, metrics, max_attempts=5, breaker={"failures": 0},
        retry={"budget_ratio": 0.2, "budget_min_per_second": 0.5},
    )  # fmt: skip
    requests = 100
    for i in range(requests):
        with pytest.raises(errors.OriginUnavailable):
            await guarded.head_object("b", f"k{i}")
        clock.now = 100.0 + i * 0.05  # 100 requests within 5 s: one window
    retries = origin.calls - requests
    # Without a budget: 4 retries each (400). With it: 20 % of requests plus 5 s of floor.
    assert retries <= 0.2 * requests + 0.5 * 10
    assert retries == sample(metrics, "hoard_origin_retries_total", origin="scripted",
                             operation="HeadObject")  # fmt: skip
    exhausted = sample(metrics, "hoard_origin_retry_budget_exhausted_total", origin="scripted",
                       operation="HeadObject")  # fmt: skip
    assert exhausted >= requests - retries


# --- circuit breaker -------------------------------------------------------------------


async def test_breaker_opens_fails_fast_and_closes_after_a_probe() -> None:
    clock, metrics = Clock(100.0), Metrics()
    origin = Scripted()
    origin.always = errors.OriginUnavailable("connection refused")
    guarded = guard(origin, clock, metrics, max_attempts=2,
                    breaker={"failures": 3, "open_for": "5s"})  # fmt: skip
    for _ in range(3):
        with pytest.raises(errors.OriginUnavailable):
            await guarded.head_object("b", "k")
    assert origin.calls == 6
    assert sample(metrics, "hoard_origin_breaker_open", origin="scripted") == 1
    for _ in range(10):  # open: fail fast, nothing reaches the origin
        with pytest.raises(errors.OriginUnavailable, match="circuit breaker open"):
            await guarded.get_object("b", "k")
    assert origin.calls == 6
    origin.always = None  # the origin is back
    clock.now += 5
    await guarded.head_object("b", "k")  # the probe
    assert sample(metrics, "hoard_origin_breaker_open", origin="scripted") == 0
    await guarded.head_object("b", "k")
    transitions = {
        state: sample(metrics, "hoard_origin_breaker_transitions_total", origin="scripted",
                      state=state)
        for state in ("open", "half_open", "closed")
    }  # fmt: skip
    assert transitions == {"open": 1, "half_open": 1, "closed": 1}


async def test_retries_stop_when_the_breaker_opens_meanwhile() -> None:
    clock = Clock(100.0)
    origin = Scripted()
    origin.always = errors.OriginUnavailable("down")
    guarded = guard(origin, clock, Metrics(), max_attempts=10, breaker={"failures": 1})

    async def backoff_while_another_request_fails(seconds: float) -> None:
        guarded.breaker.record(Ticket.NORMAL, False)  # it opens the breaker meanwhile
        await clock.sleep(seconds)

    guarded._sleep = backoff_while_another_request_fails
    with pytest.raises(errors.OriginUnavailable):
        await guarded.head_object("b", "k")
    assert origin.calls == 1  # no second try into an open breaker


def test_example_config_documents_every_protection_key() -> None:
    from gateway.config.load import build_settings, read_yaml
    from gateway.config.settings import BreakerConfig, LimitsConfig, RetryConfig
    from tests.harness import REPO

    raw = read_yaml(
        REPO / "config" / "hoard.yaml",
        environ={"TRAINER_SECRET": "an-operator-secret-of-32-chars.."},
    )
    aws = raw["origins"]["aws"]
    for key, model in (
        ("limits", LimitsConfig),
        ("retry", RetryConfig),
        ("breaker", BreakerConfig),
    ):
        assert set(aws[key]) == set(model.model_fields), key
        assert model(**aws[key]) == model()  # the example shows the defaults
    assert build_settings(raw).origins["nfs"].max_attempts == 3


# --- bodies that break mid-way are resumed ------------------------------------------------


class Breaking(Scripted):
    """A 100-byte object whose n-th GET body breaks after ``cuts[n]`` bytes (None: whole).

    Honours the byte range and If-Match; ``etag`` may change between GETs.
    """

    def __init__(self, cuts: list[int | None]) -> None:
        super().__init__("breaking")
        self.data = bytes(range(100))
        self.cuts = cuts
        self.etag = '"v1"'
        self.ranges: list[tuple[int, int]] = []

    async def get_object(self, bucket: str, key: str, byte_range=None, if_match=None) -> Any:
        self._answer(key)
        if if_match is not None and if_match != self.etag:
            raise errors.OriginChanged(f"{key} changed")
        first, last = byte_range or (0, len(self.data) - 1)
        self.ranges.append((first, last))
        cut = self.cuts[len(self.ranges) - 1] if len(self.ranges) <= len(self.cuts) else None
        return Cut(key, self.data, first, last, cut, self.etag)


class Cut(Body):
    def __init__(self, key: str, data: bytes, first: int, last: int, cut: int | None,
                 etag: str) -> None:  # fmt: skip
        super().__init__(key, data, False)
        self.info = ObjectInfo(key, len(data), etag, datetime(2024, 1, 1, tzinfo=UTC))
        self.start, self.end, self.cut = first, last, cut

    async def chunks(self) -> AsyncIterator[bytes]:
        body = self.data[self.start : self.end + 1]
        if self.cut is None:
            yield body
            return
        if self.cut:
            yield body[: self.cut]
        raise errors.OriginUnavailable("connection reset mid-body")


async def test_a_body_that_breaks_is_resumed_from_the_next_byte_with_if_match() -> None:
    clock, metrics = Clock(100.0), Metrics()
    origin = Breaking(cuts=[30, 10, None])  # breaks twice, each time after some progress
    guarded = guard(origin, clock, metrics, max_attempts=2)
    assert await read(await guarded.get_object("b", "k")) == origin.data
    assert origin.ranges == [(0, 99), (30, 99), (40, 99)]
    assert sample(metrics, "hoard_origin_resumes_total", origin="breaking") == 2


async def test_a_body_that_keeps_breaking_without_progress_gives_up_after_max_attempts() -> None:
    origin = Breaking(cuts=[30, 0, 0, 0, 0, None])
    guarded = guard(origin, Clock(100.0), Metrics(), max_attempts=3)
    with pytest.raises(errors.OriginUnavailable):
        await read(await guarded.get_object("b", "k"))
    assert origin.ranges == [(0, 99), *[(30, 99)] * 3]  # three tries with no byte, then no more


async def test_a_resume_of_a_changed_object_is_refused_never_mixed() -> None:
    origin = Breaking(cuts=[30, None])
    guarded = guard(origin, Clock(100.0), Metrics())
    stream = await guarded.get_object("b", "k")
    origin.etag = '"v2"'  # replaced at the origin while the first body was flowing
    with pytest.raises(errors.OriginChanged):
        await read(stream)
