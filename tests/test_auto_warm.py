"""Auto-warm (gateway/warm/auto.py): a cold epoch over a listed prefix warms the rest of it.

The rule first, over the real metadata cache holding a listing (the origin's pages
stand in as in test_metadata_cache.py) and a list of the jobs it would start; then
real Hoard processes (one worker, two) with moto behind the counting proxy, where
the origin's GETs prove what was fetched, once each.
"""

from __future__ import annotations

import random
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from botocore import UNSIGNED

from gateway.config.settings import WarmConfig
from gateway.metadata.memory import MetadataCache
from gateway.obs.metrics import Metrics
from gateway.origins.base import ListEntry
from gateway.origins.memory import MemoryOrigin
from gateway.origins.namespace import Mount
from gateway.warm.auto import AutoWarm
from gateway.warm.listed import ListedPrefixes
from gateway.warm.spec import WarmSpec
from tests.conftest import module_proxy, moto_origin
from tests.fakes import Clock
from tests.harness import ACCESS_KEY, SECRET_KEY, FreshAdmin, HoardProcess, metric, s3_client
from tests.test_metadata_cache import POLICY, T0, Lister

ORIGIN = MemoryOrigin("origin")
MOUNT = Mount("data", ORIGIN, "bucket")


class Jobs:
    """What auto-warm asks of the node's warm jobs: the jobs started, and which run."""

    def __init__(self) -> None:
        self.started: list[WarmSpec] = []
        self.running: set[WarmSpec] = set()

    async def warming(self, spec: WarmSpec) -> bool:
        return spec in self.running

    async def submit(self, spec: WarmSpec) -> str:
        self.started.append(spec)
        self.running.add(spec)
        return f"{len(self.started):016x}"


def listing(keys: dict[str, int]) -> Lister:
    pages = Lister([])
    pages.entries = [ListEntry(k, size, '"1"', T0) for k, size in sorted(keys.items())]
    return pages


class Setup:
    """One worker's auto-warm, its metadata memory and the node's jobs (shared by
    ``sibling``s), over a listing of ``keys``."""

    def __init__(self, keys: dict[str, int], capacity: int = 1 << 30, after: int = 16,
                 node: Path | None = None, jobs: Jobs | None = None,
                 pages: Lister | None = None) -> None:  # fmt: skip
        self.clock = Clock()
        self.metadata = MetadataCache(clock=self.clock)
        self.pages = pages or listing(keys)
        self.jobs = jobs or Jobs()
        self.metrics = Metrics()
        self.node = node or Path(tempfile.mkdtemp())
        config = WarmConfig(auto_after=after)
        self.auto = AutoWarm(self.metadata, config, lambda: capacity, self.jobs.warming,
                             self.jobs.submit, self.metrics, ListedPrefixes(self.node),
                             self.list_prefix)  # fmt: skip

    def sibling(self) -> Setup:
        """Another worker of the same node (same origin, jobs and node directory)."""
        return Setup({}, jobs=self.jobs, node=self.node, pages=self.pages)

    async def list_prefix(self, bucket: str, prefix: str) -> None:
        """What the reader's listing of ``prefix`` does to this worker's memory."""
        await self.metadata.listing(("origin", "bucket"), prefix, "", "", 1, POLICY, self.pages)

    async def list(self, prefix: str = "") -> None:
        """A client lists ``prefix`` through this worker (the cache walks it whole)."""
        await self.metadata.listing(("origin", "bucket"), prefix, "/", "", 1000, POLICY, self.pages)
        self.auto.listing(MOUNT, prefix, True)

    async def cold(self, keys: list[str]) -> None:
        for key in keys:
            self.auto.cold(MOUNT, key, True)
        await self.auto.settle()

    def decided(self, decision: str) -> float:
        return self.metrics.warm_auto.labels(decision)._value.get()


def dataset(prefix: str, count: int, size: int = 1000) -> dict[str, int]:
    return {f"{prefix}{i:05d}.bin": size for i in range(count)}


async def test_the_narrowest_directory_of_the_cold_reads_is_warmed_once_past_the_count() -> None:
    keys = {**dataset("train/a/", 40), **dataset("train/b/", 40), **dataset("val/", 40)}
    setup = Setup(keys)
    await setup.list()  # the bucket's root: a listing of everything
    reads = random.Random(1).sample([k for k in keys if k.startswith("train/")], 16)
    await setup.cold(reads[:15])
    assert setup.jobs.started == []  # 15 of 16
    await setup.cold(reads[15:])
    assert setup.jobs.started == [WarmSpec(bucket="data", prefix="train/")]
    assert setup.decided("started") == 1
    await setup.cold(reads)  # decided for this listing: nothing more
    assert len(setup.jobs.started) == 1


async def test_reads_of_one_directory_warm_that_directory_alone() -> None:
    keys = {**dataset("train/a/", 40), **dataset("train/b/", 40)}
    setup = Setup(keys)
    await setup.list("train/")
    await setup.cold([k for k in keys if k.startswith("train/b/")][:16])
    assert setup.jobs.started == [WarmSpec(bucket="data", prefix="train/b/")]


async def test_a_sample_of_a_large_listing_is_not_warmed_until_one_in_a_thousand() -> None:
    keys = dataset("big/", 20_000, size=10)
    setup = Setup(keys)
    await setup.list("big/")
    reads = random.Random(2).sample(sorted(keys), 20)
    await setup.cold(reads[:19])
    assert setup.jobs.started == []  # 19 of 20,000 is under 1 in 1,000
    await setup.cold(reads[19:])
    assert setup.jobs.started == [WarmSpec(bucket="data", prefix="big/")]


async def test_a_prefix_over_the_share_of_the_disk_tier_is_left_alone() -> None:
    keys = dataset("train/", 100, size=1_000_000)  # 100 MB listed
    setup = Setup(keys, capacity=150_000_000)  # half of it is 75 MB
    await setup.list("train/")
    await setup.cold(sorted(keys)[:16])
    assert setup.jobs.started == []
    assert setup.decided("too_big") == 1


async def test_a_job_the_node_runs_already_is_not_started_again() -> None:
    keys = dataset("train/", 100)
    setup = Setup(keys)
    setup.jobs.running.add(WarmSpec(bucket="data", prefix="train/"))  # a sibling's
    await setup.list("train/")
    await setup.cold(sorted(keys)[:16])
    assert setup.jobs.started == []
    assert setup.decided("running") == 1


async def test_a_listing_learned_again_counts_again() -> None:
    keys = dataset("train/", 100)
    setup = Setup(keys)
    await setup.list("train/")
    await setup.cold(sorted(keys)[:16])
    setup.jobs.running.clear()  # the job finished; the prefix was evicted since
    setup.clock.advance(POLICY.ttl + 1)
    await setup.metadata.whole_listing(("origin", "bucket"), "train/", setup.clock.now, POLICY,
                                       setup.pages)  # fmt: skip
    await setup.cold(sorted(keys)[16:31])
    assert len(setup.jobs.started) == 1  # 15 cold reads of the new listing
    await setup.cold(sorted(keys)[31:32])
    assert len(setup.jobs.started) == 2


async def test_a_worker_reading_under_a_prefix_a_sibling_listed_lists_it_once_then_counts() -> None:
    keys = dataset("train/", 100)
    lister = Setup(keys)
    reader = lister.sibling()
    await lister.list("train/")
    await reader.cold(sorted(keys)[:1])  # not held here: listed (one walk), not counted
    assert len(reader.pages.calls) == 2  # the client's listing, then this worker's
    await reader.cold(sorted(keys)[1:16])
    assert reader.jobs.started == []
    await reader.cold(sorted(keys)[16:17])
    assert reader.jobs.started == [WarmSpec(bucket="data", prefix="train/")]
    await reader.cold(sorted(keys)[17:])
    assert len(reader.pages.calls) == 2  # listed once


async def test_a_mount_with_a_prefix_warms_the_prefix_its_clients_name() -> None:
    mounted = Mount("data", ORIGIN, "bucket", prefix="datasets/")
    keys = {**dataset("datasets/train/", 40), **dataset("datasets/val/", 40)}
    setup = Setup(keys)
    await setup.metadata.listing(("origin", "bucket"), "datasets/", "", "", 1000, POLICY,
                                 setup.pages)  # fmt: skip
    for key in sorted(k for k in keys if "/train/" in k)[:16]:
        setup.auto.cold(mounted, key, True)
    await setup.auto.settle()
    assert setup.jobs.started == [WarmSpec(bucket="data", prefix="train/")]


async def test_reads_outside_every_listing_or_with_auto_warm_off_start_nothing() -> None:
    keys = dataset("train/", 100)
    unlisted = Setup(keys)
    await unlisted.cold(sorted(keys))  # nobody listed
    off = Setup(keys, after=0)
    await off.list("train/")
    await off.cold(sorted(keys))
    assert unlisted.jobs.started == off.jobs.started == []


# -- real Hoard processes --------------------------------------------------------------

proxy = module_proxy


@pytest.fixture(scope="module", params=[1, 2], ids=["workers1", "workers2"])
def node(request, tmp_path_factory, proxy) -> Iterator[HoardProcess]:
    config = {
        "workers": request.param,
        "origins": {"moto": moto_origin(proxy, max_attempts=2)},
        "default_origin": "moto",
        "access_log": False,
        "cache": {"size": "256MiB", "memory": "8MiB"},
    }
    process = HoardProcess(tmp_path_factory.mktemp("auto-warm"), config).start()
    yield process
    assert process.stop() == 0, process.log()


def wait_for_jobs(client: FreshAdmin, prefix: str, timeout: float = 60.0) -> list[dict]:
    """The node's warm jobs of ``prefix`` once one exists and all are finished."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        jobs = [j for j in client.call("GET", "/_hoard/warm")["jobs"]
                if j["spec"].get("prefix") == prefix]  # fmt: skip
        if jobs and all(j["state"] in ("done", "failed", "cancelled") for j in jobs):
            return jobs
        time.sleep(0.05)
    raise AssertionError(f"no finished warm job of {prefix!r}")


def test_a_cold_epoch_over_a_listed_prefix_fetches_each_object_once_and_not_its_neighbours(
    node, proxy, origin_client, bucket
):
    train = {f"train/{i:04d}.bin": random.randbytes(2000 + i) for i in range(120)}
    other = {f"other/{i:04d}.bin": b"x" * 100 for i in range(30)}
    for key, body in {**train, **other}.items():
        origin_client.put_object(Bucket=bucket, Key=key, Body=body)
    # The data loader lists its dataset first, then reads on one keep-alive connection:
    # with two workers, through the worker that served the listing or the other.
    assert node.client().list_objects_v2(Bucket=bucket, Prefix="")["KeyCount"] == 150
    proxy.reset()
    order = random.Random(3).sample(sorted(train), len(train))
    s3 = node.client(max_pool_connections=1)
    for key in order[:40]:
        assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == train[key]
    jobs = wait_for_jobs(FreshAdmin(node.endpoint), "train/")
    assert {j["state"] for j in jobs} == {"done"}, jobs
    for key in order[40:]:
        assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == train[key]
    assert proxy.counts["ListObjects"] <= 1  # a worker not holding the listing, once
    fetched = sorted(path.split("/", 2)[2] for path, _ in proxy.ranges)
    assert fetched == sorted(train), proxy.listed_gets()  # each once, and no other/ key
    assert proxy.counts["HeadObject"] == proxy.counts["HeadBucket"] == 0
    started = metric(node.endpoint, 'hoard_warm_auto_total{decision="started"}')
    assert started >= 1


def test_auto_warm_is_off_with_auto_after_zero(tmp_path, proxy, origin_client, bucket):
    config = {
        "origins": {"moto": moto_origin(proxy, max_attempts=2)},
        "default_origin": "moto",
        "access_log": False,
        "warm": {"auto_after": 0},
    }
    keys = [f"off/{i:03d}" for i in range(40)]
    for key in keys:
        origin_client.put_object(Bucket=bucket, Key=key, Body=b"y")
    node = HoardProcess(tmp_path, config).start()
    try:
        s3 = node.client()
        s3.list_objects_v2(Bucket=bucket, Prefix="off/")
        proxy.reset()
        for key in keys[:30]:
            s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        assert FreshAdmin(node.endpoint).call("GET", "/_hoard/warm")["jobs"] == []
        assert proxy.counts["GetObject"] == 30
    finally:
        assert node.stop() == 0, node.log()


def test_only_callers_that_may_warm_the_bucket_start_auto_warm(
    tmp_path, proxy, origin_client, bucket
):
    """A readonly key and an anonymous caller are refused warm jobs by the admin API:
    their cold epochs start none either; a full key's does."""
    reader_secret = "reader-secret-" + "r" * 16
    config = {
        "origins": {"moto": moto_origin(proxy, max_attempts=2)},
        "default_origin": "moto",
        "access_log": False,
        "allow_anonymous": True,
        "credentials": [
            {"access_key": ACCESS_KEY, "secret_key": SECRET_KEY},
            {"access_key": "reader", "secret_key": reader_secret, "readonly": True},
        ],
    }
    prefixes = ("readonly/", "anonymous/", "full/")
    keys = {p: [f"{p}{i:03d}" for i in range(40)] for p in prefixes}
    for key in (key for group in keys.values() for key in group):
        origin_client.put_object(Bucket=bucket, Key=key, Body=b"z" * 100)
    node = HoardProcess(tmp_path, config).start()
    try:
        clients = {
            "readonly/": s3_client(node.endpoint, "reader", reader_secret),
            "anonymous/": node.client(signature_version=UNSIGNED),
            "full/": node.client(),
        }
        proxy.reset()
        for prefix, s3 in clients.items():  # the full key last: its job orders the check
            assert s3.list_objects_v2(Bucket=bucket, Prefix=prefix)["KeyCount"] == 40
            for key in keys[prefix][:30]:
                assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == b"z" * 100
        jobs = wait_for_jobs(FreshAdmin(node.endpoint), "full/")
        assert {j["state"] for j in jobs} == {"done"}, jobs
        warmed = {j["spec"].get("prefix") for j in FreshAdmin(node.endpoint).call(
            "GET", "/_hoard/warm")["jobs"]}  # fmt: skip
        assert warmed == {"full/"}
        for prefix in ("readonly/", "anonymous/"):
            gets = [path for path, _ in proxy.ranges if f"/{prefix}" in path]
            assert len(gets) == 30, proxy.listed_gets()  # the reads, and nothing warmed
        assert len([path for path, _ in proxy.ranges if "/full/" in path]) == 40
    finally:
        assert node.stop() == 0, node.log()


def test_a_prefix_with_a_newline_is_logged_on_one_line(tmp_path):
    """Auto-warm logs the prefix it warms: a newline in it must not forge a log line.
    (A directory origin: moto's server cannot route a key holding a newline.)"""
    forged = "2026-01-01 00:00:00,000 1 WARNING hoard forged"
    prefix = f"evil\n{forged}/"
    keys = [f"{prefix}{i:03d}" for i in range(20)]
    root = tmp_path / "root"
    (root / "data" / prefix).mkdir(parents=True)
    for key in keys:
        (root / "data" / key).write_bytes(b"n")
    bucket = "data"
    config = {"origins": {"files": {"type": "posix", "path": str(root)}},
              "default_origin": "files"}  # fmt: skip
    node = HoardProcess(tmp_path, config).start()
    try:
        s3 = node.client()
        assert s3.list_objects_v2(Bucket=bucket, Prefix=prefix)["KeyCount"] == 20
        for key in keys:
            assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == b"n"
        wait_for_jobs(FreshAdmin(node.endpoint), prefix)
    finally:
        assert node.stop() == 0, node.log()
    log = node.log()
    assert f"evil\\x0a{forged}/ read cold" in log, log
    assert not [line for line in log.splitlines() if line.startswith(forged)]
