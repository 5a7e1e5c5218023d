"""boto3 readers that run in load-generator processes (the "realism" figures).

Each function runs in a spawned worker process of a ``multiprocessing`` pool,
pinned to the generator CPUs by ``init``. It returns plain data (counts,
latencies, timestamps) for the parent to aggregate. A failed request is
counted, never retried in a loop, never fatal.

The per-process boto3 clients live in ``_STATE``, set once by ``init``: one
process serves one pool for one target, so this is the process's own wiring,
not a shared registry.
"""

from __future__ import annotations

import http.client
import os
import random
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

import boto3
from botocore.config import Config

READ_CHUNK = 1024 * 1024
_STATE: dict[str, Any] = {}


def init(cpus: list[int], endpoints: list[str], key: str, secret: str, pool: int) -> None:
    if cpus:
        os.sched_setaffinity(0, cpus)
    config = Config(
        s3={"addressing_style": "path"}, max_pool_connections=pool,
        retries={"max_attempts": 1, "mode": "standard"},
        connect_timeout=10, read_timeout=120,
    )  # fmt: skip
    _STATE["credentials"] = (key, secret)
    _STATE["clients"] = [
        boto3.client("s3", endpoint_url=e, region_name="us-east-1", aws_access_key_id=key,
                     aws_secret_access_key=secret, config=config)
        for e in endpoints
    ]  # fmt: skip


def warm(_: int) -> int:
    """A no-op task: returns once the process has imported and built its clients."""
    return len(_STATE["clients"])


def _client(index: int):
    clients = _STATE["clients"]
    return clients[index % len(clients)]


def get(client, bucket: str, key: str, byte_range: str | None = None) -> int:
    """GET one object (or range) and drain the body; returns the byte count."""
    kwargs = {"Range": byte_range} if byte_range else {}
    body = client.get_object(Bucket=bucket, Key=key, **kwargs)["Body"]
    total = 0
    while chunk := body.read(READ_CHUNK):
        total += len(chunk)
    return total


def list_all(client, bucket: str, prefix: str, page: int = 1000) -> list[str]:
    """ListObjectsV2, paginated; bounded by the number of pages S3 returns."""
    keys: list[str] = []
    kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix, "MaxKeys": page}
    for _ in range(100_000):
        answer = client.list_objects_v2(**kwargs)
        keys.extend(item["Key"] for item in answer.get("Contents", []))
        if not answer.get("IsTruncated"):
            break
        kwargs["ContinuationToken"] = answer["NextContinuationToken"]
    return keys


def _timed(fn, *args) -> tuple[float, int, bool]:
    start = time.perf_counter()
    try:
        size = fn(*args)
        return time.perf_counter() - start, size, True
    except Exception:
        return time.perf_counter() - start, 0, False


def _result(
    latencies: list[float], sizes: list[int], oks: list[bool], **extra: Any
) -> dict[str, Any]:
    return {
        "objects": sum(oks), "bytes": sum(sizes), "errors": len(oks) - sum(oks),
        "latencies": [lat for lat, ok in zip(latencies, oks, strict=True) if ok], **extra,
    }  # fmt: skip


def read_objects(task: dict[str, Any]) -> dict[str, Any]:
    """One reader's epoch: list the prefix (if it can), shuffle, read everything."""
    client = _client(task["reader"])
    list_seconds = 0.0
    keys = task["keys"]
    if task["prefix"] is not None:
        start = time.perf_counter()
        keys = list_all(client, task["bucket"], task["prefix"])
        list_seconds = time.perf_counter() - start
    keys = sorted(keys)
    random.Random(f"{task['seed']}:{task['reader']}:{task['epoch']}").shuffle(keys)
    with ThreadPoolExecutor(task["threads"]) as pool:
        done = list(pool.map(lambda k: _timed(get, client, task["bucket"], k), keys))
    lats, sizes, oks = (
        (list(column) for column in zip(*done, strict=True)) if done else ([], [], [])
    )
    return _result(lats, sizes, oks, list_seconds=list_seconds, listed=len(keys))


def read_ranges(task: dict[str, Any]) -> dict[str, Any]:
    """One reader's pass over shards in ranged GETs of ``range_size``, shuffled."""
    client = _client(task["reader"])
    ranges = [
        (key, f"bytes={offset}-{min(offset + task['range_size'], size) - 1}")
        for key, size in task["objects"]
        for offset in range(0, size, task["range_size"])
    ]
    random.Random(f"{task['seed']}:{task['reader']}:{task['epoch']}").shuffle(ranges)
    with ThreadPoolExecutor(task["threads"]) as pool:
        done = list(pool.map(lambda r: _timed(get, client, task["bucket"], r[0], r[1]), ranges))
    lats, sizes, oks = (
        (list(column) for column in zip(*done, strict=True)) if done else ([], [], [])
    )
    return _result(lats, sizes, oks)


def _until(start_at: float) -> None:
    """Sleep until wall-clock ``start_at`` (at most 10 s): a barrier across processes."""
    time.sleep(min(10.0, max(0.0, start_at - time.time())))


def herd(task: dict[str, Any]) -> dict[str, Any]:
    """``threads`` clients that all start at ``start_at``: GET one key whole, or LIST a prefix."""

    def one(index: int) -> tuple[float, float, int, bool]:
        client = _client(task["first_client"] + index)
        _until(task["start_at"])
        begin = time.time()
        try:
            if task["op"] == "get":
                size = get(client, task["bucket"], task["key"])
            else:
                size = len(list_all(client, task["bucket"], task["prefix"]))
            return begin, time.time(), size, True
        except Exception:
            return begin, time.time(), 0, False

    with ThreadPoolExecutor(task["threads"]) as pool:
        done = list(pool.map(one, range(task["threads"])))
    return {
        "begins": [d[0] for d in done],
        "ends": [d[1] for d in done],
        "sizes": [d[2] for d in done],
        "oks": [d[3] for d in done],
    }


def stream(task: dict[str, Any]) -> dict[str, Any]:
    lat, size, ok = _timed(get, _client(0), task["bucket"], task["key"])
    return _result([lat], [size], [ok])


def train(task: dict[str, Any]) -> dict[str, Any]:
    """An emulated training loop: a prefetching loader and a fixed compute time per batch.

    The loader keeps ``prefetch`` batches in flight on a thread pool, as a torch
    DataLoader with workers does. ``wait`` is the time the "accelerator" spent
    blocked on the next batch; its share of the epoch is what MLPerf Storage
    turns into accelerator utilisation. With ``register``, the reader first
    registers its shuffled order with Hoard (epoch-order prefetch), as the
    README's sampler does; that call counts in the epoch's time.
    """
    client = _client(task["reader"])
    keys = sorted(task["keys"])
    random.Random(f"{task['seed']}:{task['reader']}:{task['epoch']}").shuffle(keys)
    batch = task["batch"]
    batches = [keys[i : i + batch] for i in range(0, len(keys), batch)]
    lats: list[float] = []
    sizes: list[int] = []
    oks: list[bool] = []
    wait = 0.0
    start = time.perf_counter()
    if task.get("register"):
        from gateway.client import prefetch  # the repository's own helper, as a trainer uses it

        access_key, secret_key = _STATE["credentials"]
        prefetch(keys, endpoint=client.meta.endpoint_url, bucket=task["bucket"],
                 stream_id=f"reader-{task['reader']}", access_key=access_key,
                 secret_key=secret_key)  # fmt: skip
    with ThreadPoolExecutor(task["threads"]) as pool:

        def submit(keys: list[str]) -> list[Future[tuple[float, int, bool]]]:
            return [pool.submit(_timed, get, client, task["bucket"], k) for k in keys]

        pending = deque(submit(b) for b in batches[: task["prefetch"]])
        following = task["prefetch"]
        for _ in range(len(batches)):
            blocked = time.perf_counter()
            done = [future.result() for future in pending.popleft()]
            wait += time.perf_counter() - blocked
            if following < len(batches):
                pending.append(submit(batches[following]))
                following += 1
            for lat, size, ok in done:
                lats.append(lat)
                sizes.append(size)
                oks.append(ok)
            time.sleep(task["compute"])  # the accelerator's step
    total = time.perf_counter() - start
    return _result(lats, sizes, oks, wait=wait, total=total)


def _read_url(url: str, start_at: float, timeout: float) -> dict[str, Any]:
    """GET ``url`` whole into one fixed 1 MiB buffer, overwritten and never kept."""
    parts = urlsplit(url)
    buffer = memoryview(bytearray(READ_CHUNK))
    _until(start_at)
    begin = time.time()
    size, status, error = 0, 0, ""
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout)
    try:
        connection.request("GET", parts.path + ("?" + parts.query if parts.query else ""))
        response = connection.getresponse()
        status = response.status
        while count := response.readinto(buffer):  # bounded by the body's length
            size += count
    except (OSError, http.client.HTTPException) as exc:
        error = f"{type(exc).__name__}: {exc}"
    finally:
        connection.close()
    return {"begin": begin, "end": time.time(), "size": size, "status": status, "error": error}


def stream_urls(task: dict[str, Any]) -> dict[str, Any]:
    """One client thread per URL, all starting at ``start_at``, each reading its URL whole.

    The lean client of the ``rss`` workload: plain HTTP (presigned URLs), no SDK,
    no body held; 8 such streams cost one generator process a few MiB.
    """
    urls = task["urls"]
    with ThreadPoolExecutor(len(urls)) as pool:
        return {
            "clients": list(
                pool.map(lambda url: _read_url(url, task["start_at"], task["timeout"]), urls)
            )
        }
