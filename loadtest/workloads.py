"""Training-shaped workloads, each a function from a ``Session`` to result rows.

A ``Session`` is one target x one workload: it owns a pool of load-generator
processes (spawned, pinned to the generator CPUs, boto3 clients built once),
snapshots the origin's counters around each phase, reads the server's peak RSS
after it, and enforces the scale's time limit: a phase still running at the
deadline is cut off (the pool is terminated) and reported as an error.

| workload | phases |
|---|---|
| ``epochs`` | K readers list ``images/`` (paginated) and read every image in their own shuffled order, for 3 epochs |
| ``shards`` | K readers read every shard in ranged GETs (8 MiB at full scale), shuffled; cold and warm epoch |
| ``herd`` | one client alone on a cold large object; 64 clients at once on another of the same size; 64 clients LISTing one prefix at once |
| ``stream`` | one client reads the 256 MiB shard whole, cold and then warm |
| ``train`` | readers with a prefetching loader and a fixed compute time per batch; share of time waiting for data |
| ``train-prefetch`` | ``train`` on a cold Hoard, each reader registering its epoch order first |
| ``train-warm`` | ``train`` on a Hoard warmed (``POST /_hoard/warm``) as training starts |
| ``capacity`` | wrk over presigned URLs (``wrkload.py``) |
| ``rss`` | 8 lean clients each stream a 1 GiB object whole, cold and warm; then (Hoard) a 5 GiB multipart upload and a 2 GiB PutObject at once; server memory per process (``rssload.py``) |
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.pool import Pool
from pathlib import Path
from typing import Any

from loadtest import clients
from loadtest.datasets import IMAGES, Dataset, Scale
from loadtest.origin import Origin, diff_counts
from loadtest.procs import Pinning, peak_rss
from loadtest.report import Row, percentile
from loadtest.targets import Target

ALL = ("epochs", "shards", "herd", "stream", "train", "train-prefetch", "train-warm", "capacity",
       "rss")  # fmt: skip


@dataclass
class Bench:
    """What stays the same for every session of a run."""

    origin: Origin
    dataset: Dataset
    scale: Scale
    pinning: Pinning
    seed: int
    workdir: Path
    phases: tuple[str, ...] = ()  # capacity: only these of its phases (all when empty)


class Session:
    def __init__(self, bench: Bench, target: Target, workload: str) -> None:
        self.bench = bench
        self.target = target
        self.workload = workload
        self.deadline = time.monotonic() + bench.scale.phase_timeout

    @property
    def readers(self) -> int:
        """K, or one reader per node when a target has more nodes than K."""
        return max(self.bench.scale.readers, len(self.target.endpoints))

    def allow(self, seconds: float) -> None:
        """More time for this session, for a phase of its own size (capacity's wide set)."""
        self.deadline += seconds

    def remaining(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"{self.workload} exceeded {self.bench.scale.phase_timeout:.0f}s")
        return left

    @contextmanager
    def pool(self, processes: int, connections: int) -> Iterator[Pool]:
        """Spawned generator processes with warm boto3 clients for this target."""
        context = multiprocessing.get_context("spawn")
        cpus = sorted(self.bench.pinning.generator) if self.bench.pinning.enabled else []
        args = (cpus, self.target.endpoints, self.target.access_key, self.target.secret_key,
                connections)  # fmt: skip
        pool = context.Pool(processes, initializer=clients.init, initargs=args)
        try:
            pool.map_async(clients.warm, range(processes)).get(min(60.0, self.remaining()))
            yield pool
        finally:
            pool.terminate()
            pool.join()

    def map(self, pool: Pool, fn: Callable[[Any], Any], tasks: list[Any]) -> list[Any]:
        try:
            return pool.map_async(fn, tasks, chunksize=1).get(self.remaining())
        except multiprocessing.TimeoutError as exc:
            raise TimeoutError(f"{self.workload} exceeded its time limit") from exc

    def measure(
        self, phase: str, run: Callable[[], dict[str, Any]], generator: str = "boto3"
    ) -> Row:
        """Run one phase; the row carries its origin counters and the server's peak RSS."""
        before = self.bench.origin.counts()
        start = time.perf_counter()
        result = run()
        wall = result.pop("wall", None) or time.perf_counter() - start
        origin = diff_counts(self.bench.origin.counts(), before)
        latencies = result.pop("latencies", [])
        if self.readers != self.bench.scale.readers and self.workload in (
            "epochs",
            "shards",
            "train",
            "train-prefetch",
            "train-warm",
        ):
            result["readers"] = self.readers  # one per node
        # A generator that reports percentiles itself (wrk) passes them instead of samples.
        p50 = result.pop("p50_s", None) or percentile(latencies, 0.50)
        p99 = result.pop("p99_s", None) or percentile(latencies, 0.99)
        return Row(
            target=self.target.name, workload=self.workload, phase=phase, generator=generator,
            wall_s=wall, objects=result.pop("objects"), bytes=result.pop("bytes"),
            errors=result.pop("errors", 0), p50_ms=p50 * 1000, p99_ms=p99 * 1000, origin=origin,
            rss_bytes=peak_rss(self.target.pids()), extra=result,
        )  # fmt: skip

    def base(self) -> dict[str, Any]:
        return {"bucket": self.bench.dataset.bucket, "seed": self.bench.seed}


def merge(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Sum readers' results: counts add up, latencies concatenate."""
    return {
        "objects": sum(r["objects"] for r in results),
        "bytes": sum(r["bytes"] for r in results),
        "errors": sum(r["errors"] for r in results),
        "latencies": [lat for r in results for lat in r["latencies"]],
    }


def epochs(s: Session) -> list[Row]:
    scale, data = s.bench.scale, s.bench.dataset
    keys = None if s.target.can_list else [o.key for o in data.images]
    rows = []
    with s.pool(s.readers, scale.threads) as pool:
        for epoch in range(1, scale.epochs + 1):
            tasks = [
                {**s.base(), "reader": r, "epoch": epoch, "threads": scale.threads,
                 "prefix": IMAGES if s.target.can_list else None, "keys": keys}
                for r in range(s.readers)
            ]  # fmt: skip

            def run(tasks: list[dict[str, Any]] = tasks) -> dict[str, Any]:
                results = s.map(pool, clients.read_objects, tasks)
                listing = max(r["list_seconds"] for r in results)
                return {**merge(results), "list_s": listing}

            rows.append(s.measure(f"epoch {epoch}", run))
    if not s.target.can_list:
        for row in rows:
            row.note = "keys from the manifest (no ListObjects on static files)"
    return rows


def shards(s: Session) -> list[Row]:
    scale, data = s.bench.scale, s.bench.dataset
    objects = [(o.key, o.size) for o in data.shards]
    rows = []
    with s.pool(s.readers, scale.threads) as pool:
        for epoch in (1, 2):
            tasks = [
                {**s.base(), "reader": r, "epoch": epoch, "threads": scale.threads,
                 "objects": objects, "range_size": scale.range_size}
                for r in range(s.readers)
            ]  # fmt: skip
            rows.append(
                s.measure(
                    f"epoch {epoch}",
                    lambda tasks=tasks: merge(s.map(pool, clients.read_ranges, tasks)),
                )
            )
    return rows


def _herd_phase(s: Session, pool: Pool, processes: int, op: dict[str, Any]) -> dict[str, Any]:
    clients_total = s.bench.scale.herd_clients
    per = clients_total // processes
    start_at = time.time() + s.bench.scale.herd_barrier
    tasks = [
        {**s.base(), **op, "threads": per, "first_client": p * per, "start_at": start_at}
        for p in range(processes)
    ]
    results = s.map(pool, clients.herd, tasks)
    begins = [b for r in results for b in r["begins"]]
    ends = [e for r in results for e in r["ends"]]
    oks = [o for r in results for o in r["oks"]]
    durations = [e - b for b, e in zip(begins, ends, strict=True)]
    return {
        "wall": max(ends) - min(begins), "objects": sum(oks), "errors": len(oks) - sum(oks),
        "bytes": sum(size for r in results for size in r["sizes"]) if op["op"] == "get" else 0,
        "latencies": durations, "slowest_s": max(durations), "fastest_s": min(durations),
        "clients": len(oks),
    }  # fmt: skip


def herd(s: Session) -> list[Row]:
    data = s.bench.dataset
    processes = s.bench.scale.herd_processes
    per = s.bench.scale.herd_clients // processes
    rows = []
    with s.pool(processes, per) as pool:
        alone = s.measure(
            "get alone",
            lambda: merge(
                s.map(pool, clients.stream, [{**s.base(), "key": data.alone_object.key}])
            ),
        )
        rows.append(alone)
        crowd = s.measure(
            f"get x{s.bench.scale.herd_clients}",
            lambda: _herd_phase(s, pool, processes, {"op": "get", "key": data.herd_object.key}),
        )
        crowd.extra["slowest_vs_alone"] = crowd.extra["slowest_s"] / max(alone.wall_s, 1e-9)
        rows.append(crowd)
        prefix = data.images[0].key.rsplit("/", 1)[0] + "/"
        if s.target.can_list:
            rows.append(
                s.measure(
                    f"list x{s.bench.scale.herd_clients}",
                    lambda: _herd_phase(s, pool, processes, {"op": "list", "prefix": prefix}),
                )
            )
    return rows


def stream(s: Session) -> list[Row]:
    key = s.bench.dataset.stream_object.key
    rows = []
    with s.pool(1, 4) as pool:
        for phase in ("cold", "warm"):
            rows.append(
                s.measure(
                    phase, lambda: merge(s.map(pool, clients.stream, [{**s.base(), "key": key}]))
                )
            )
    return rows


def train(s: Session) -> list[Row]:
    """Cold Hoard (or any target): readers fetch on demand."""
    return _train(s)


def train_prefetch(s: Session) -> list[Row]:
    """Cold Hoard; each reader registers its epoch order first (``gateway.client.prefetch``)."""
    if not s.target.hoard_api:
        return [_skipped(s, "skipped: epoch-order prefetch is a Hoard endpoint")]
    return _train(s, register=True)


def _skipped(s: Session, note: str) -> Row:
    return Row(s.target.name, s.workload, "—", note=note)


def train_warm(s: Session) -> list[Row]:
    """Hoard warmed (``POST /_hoard/warm`` of the images) in parallel with the start of training.

    Skipped, with the reason in the row, when the gateway has no warm jobs (404).
    """
    from gateway.client.admin import AdminClient, AdminError  # the repository's own client

    if not s.target.hoard_api:
        return [_skipped(s, "skipped: warm jobs are a Hoard endpoint")]
    client = AdminClient(s.target.endpoints[0], s.target.access_key, s.target.secret_key)
    try:
        job = client.call("POST", "/_hoard/warm", body={"bucket": s.bench.dataset.bucket,
                                                        "prefix": IMAGES})  # fmt: skip
    except AdminError as exc:
        if exc.status == 404:
            return [_skipped(s, "skipped: POST /_hoard/warm answered 404 (no warm jobs here)")]
        raise
    rows = _train(s)
    for row in rows:
        row.note = "; ".join(x for x in (row.note, f"warm job {job.get('id', '?')}") if x)
    return rows


def _train(s: Session, register: bool = False) -> list[Row]:
    scale, data = s.bench.scale, s.bench.dataset
    images = [o.key for o in data.images]
    rows = []
    with s.pool(s.readers, scale.threads) as pool:
        for epoch in (1, 2):
            tasks = [
                {**s.base(), "reader": r, "epoch": epoch, "threads": scale.threads,
                 "keys": images[r :: s.readers][: scale.train_images],
                 "batch": scale.train_batch, "compute": scale.train_compute, "prefetch": 2,
                 "register": register}
                for r in range(s.readers)
            ]  # fmt: skip

            def run(tasks: list[dict[str, Any]] = tasks) -> dict[str, Any]:
                results = s.map(pool, clients.train, tasks)
                shares = [r["wait"] / r["total"] for r in results if r["total"] > 0]
                return {
                    **merge(results),
                    "data_wait_share": sum(shares) / len(shares) if shares else None,
                    "data_wait_share_max": max(shares) if shares else None,
                }

            row = s.measure(f"epoch {epoch}", run)
            row.note = f"compute {scale.train_compute * 1000:g} ms per batch of {scale.train_batch}"
            rows.append(row)
    return rows
