"""Small objects the way a DLIO / s3torchconnector reader asks for them, cold and warm.

The reader lists the dataset first (off the clock; ``--no-list``: it does not), as
s3torchconnector's ``from_prefix`` and DLIO do; then each object is read once per
epoch with a ranged GET of ``bytes=0-8388607`` (the
first 8 MiB part s3torchconnector asks for, which for a small object is all of
it) of a URL presigned beforehand for the target, in a shuffled order, by a lean asyncio client holding ``--concurrency``
keep-alive connections. The same epochs run straight at the origin (``direct``),
through Hoard (``hoard``; ``hoard-prefetch``: the reader registers each cold epoch's
order first) and through nginx ``proxy_cache`` in one run, against one origin:
moto behind the counting proxy (``origin.py``), on loopback with no added delay
(``--origin loopback``) or behind the emulated WAN (``--origin wan``: the
harness's default round trip and rates).

Pinning (on by default where there are two CPUs or more; ``--no-pin`` leaves
placement to the scheduler): the origin side (moto and the counting proxy) runs
on the first half of the CPUs, the client and the target (Hoard, nginx) on the
other half. The origin stands for a store on other machines: unpinned, every
µs a cache spends on a cold object is taken from moto (one core at most, its
GIL), so the epoch measures the cache's CPU cost as much as its effect on the
reader; that cost is reported on its own (CPU µs per object, per part).

Reported per target: objects/s for the cold and warm epoch, the ratio to
``direct`` in the same run, origin GETs and HEADs per cold epoch; for Hoard the
files in its cache directory and disk bytes / payload bytes (``du``-style: the
blocks the files occupy). Hoard verifies each signature; nginx passes it on.

Run: ``python -m loadtest.smallobjects --objects 100000 --size 4096 --origin loopback``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import html
import json
import os
import random
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import yaml

from gateway.client import prefetch
from loadtest.datasets import ORIGIN_KEY, ORIGIN_SECRET, origin_client
from loadtest.origin import Origin, diff_counts
from loadtest.procs import Pinning, cpu_seconds, free_port, pin_tree, stop_process, tree, wait_http
from loadtest.targets import HOARD_KEY, HOARD_SECRET, REPO, Context, Nginx

BUCKET = "small"
# Targets that are a fresh Hoard; "hoard-prefetch" is one whose reader registers each
# epoch's order first (POST /_hoard/prefetch, README "Epoch-order prefetch").
HOARDS = ("hoard", "hoard-prefetch")
RANGE = {"Range": "bytes=0-8388607"}


def seed(moto_url: str, count: int, size: int) -> list[str]:
    """Put ``count`` objects of ``size`` random bytes straight into moto (not counted)."""
    client = origin_client(moto_url, pool=32)
    client.create_bucket(Bucket=BUCKET)
    keys = [f"train/{i:07d}.jpg" for i in range(count)]
    with ThreadPoolExecutor(32) as pool:
        list(pool.map(lambda k: client.put_object(Bucket=BUCKET, Key=k, Body=os.urandom(size)),
                      keys))  # fmt: skip
    return keys


def presigner(endpoint: str, key: str, secret: str) -> Any:
    """A boto3 client that presigns requests to ``endpoint`` with the target's credential."""
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                        aws_access_key_id=key, aws_secret_access_key=secret,
                        config=Config(s3={"addressing_style": "path"}))  # fmt: skip


def presign(endpoint: str, keys: list[str], key: str, secret: str) -> list[str]:
    """A presigned GET URL per key for ``endpoint`` (made before the clock starts)."""
    client = presigner(endpoint, key, secret)
    return [client.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": k},
                                          ExpiresIn=7200) for k in keys]  # fmt: skip


async def list_dataset(endpoint: str, key: str, secret: str) -> dict[str, Any]:
    """The data loader's listing of its dataset before its first epoch (s3torchconnector's
    ``from_prefix``, DLIO's file list): ListObjectsV2 of ``train/``, page after page."""
    client = presigner(endpoint, key, secret)
    listed, token = 0, ""
    async with aiohttp.ClientSession() as session:
        start = time.perf_counter()
        while True:
            params = {
                "Bucket": BUCKET,
                "Prefix": "train/",
                **({"ContinuationToken": token} if token else {}),
            }
            url = client.generate_presigned_url("list_objects_v2", Params=params, ExpiresIn=7200)
            async with session.get(url) as r:
                body = await r.read()
                if r.status != 200:
                    raise RuntimeError(f"listing failed: {r.status} {body[:300]!r}")
            listed += body.count(b"<Key>")
            more = re.search(rb"<NextContinuationToken>(.*?)</NextContinuationToken>", body)
            if more is None:
                break
            following = html.unescape(more.group(1).decode())
            if following == token:
                raise RuntimeError("the listing returned the same page again")
            token = following
        seconds = time.perf_counter() - start
    return {"keys": listed, "seconds": round(seconds, 2)}


def shuffled(items: list[str], seed: int) -> list[str]:
    """The epoch's order of ``items`` (the same permutation for any list of one length)."""
    order = items[:]
    random.Random(seed).shuffle(order)
    return order


async def epoch(
    urls: list[str], concurrency: int, seed: int, register: Callable[[], object] | None = None
) -> dict[str, Any]:
    """One shuffled pass of ranged GETs; objects/s and failures. ``register``: called
    first, on the clock (the reader tells Hoard its order before it reads)."""
    order = shuffled(urls, seed)
    queue = iter(order)
    failures = 0
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:

        async def reader() -> None:
            nonlocal failures
            for url in queue:
                try:
                    async with session.get(url, headers=RANGE) as r:
                        await r.read()
                        failures += r.status not in (200, 206)
                except aiohttp.ClientError:
                    failures += 1

        start = time.perf_counter()
        if register is not None:
            await asyncio.to_thread(register)
        await asyncio.gather(*(reader() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    return {"objects_per_s": round(len(order) / elapsed, 1), "seconds": round(elapsed, 2),
            "failures": failures}  # fmt: skip


def disk_usage(directory: Path) -> tuple[int, int]:
    """(files, bytes on disk) under ``directory``, as ``du`` counts them."""
    files = used = 0
    for path in directory.rglob("*"):
        if path.is_file():
            files += 1
            used += path.stat().st_blocks * 512
    return files, used


def unindexed(cache: Path, keys: list[str]) -> dict[str, Any]:
    """Objects of the dataset with no block in Hoard's disk index after the epochs: how
    many, and the first few keys (each was served but is not stored; a warm GET of one of
    them is an origin request the cache should not have made)."""
    with closing(sqlite3.connect(f"file:{cache / 'index.sqlite3'}?mode=ro", uri=True)) as db:
        indexed = {key for (key,) in db.execute("SELECT key FROM blocks WHERE bucket = ?",
                                                (BUCKET,))}  # fmt: skip
    missing = [key for key in keys if key not in indexed]
    return {"count": len(missing), "first": missing[:5]}


def start_hoard(
    workdir: Path, origin: str, cache_bytes: int, workers: int, disk_hits: bool = False
) -> tuple[Any, str]:
    """A cold Hoard; ``disk_hits``: its memory tier keeps no small block, so warm hits
    come from the disk tier."""
    port = free_port()
    config = {
        "listen": f"127.0.0.1:{port}", "workers": workers, "log_level": "warning",
        "access_log": False, "shutdown_timeout": "5s",
        "credentials": [{"access_key": HOARD_KEY, "secret_key": HOARD_SECRET}],
        "cache": {"dir": str(workdir / "cache"), "size": cache_bytes,
                  **({"memory_item_max": "1KiB"} if disk_hits else {})},
        "origins": {"origin": {"type": "s3", "endpoint": origin, "region": "us-east-1",
                               "access_key": ORIGIN_KEY, "secret_key": ORIGIN_SECRET,
                               "addressing_style": "path", "max_connections": 128}},
        "default_origin": "origin",
        "mounts": [{"bucket": BUCKET, "origin": "origin", "metadata_ttl": "forever",
                    "readonly": True}],
    }  # fmt: skip
    shutil.rmtree(workdir, ignore_errors=True)  # start cold
    workdir.mkdir(parents=True)
    (workdir / "hoard.yaml").write_text(yaml.safe_dump(config))
    with open(workdir / "hoard.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--config", str(workdir / "hoard.yaml")],
            stdout=log, stderr=subprocess.STDOUT, cwd=workdir,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )  # fmt: skip
    endpoint = f"http://127.0.0.1:{port}"
    wait_http(endpoint + "/_hoard/ready", 60, proc)
    return proc, endpoint


def measure(name: str, origin: Origin, keys: list[str], args: argparse.Namespace,
            workdir: Path, cache_bytes: int, pinning: Pinning) -> dict[str, Any]:  # fmt: skip
    """One cold and one warm epoch of ``name`` (a fresh, empty Hoard or nginx)."""
    row: dict[str, Any] = {}
    proc = None
    nginx = None
    if name == "direct":
        endpoint = origin.endpoint
    elif name in HOARDS:
        proc, endpoint = start_hoard(workdir / "hoard", origin.endpoint, cache_bytes,
                                     args.workers, args.disk_hits)  # fmt: skip
    else:
        ctx = Context(origin.endpoint, SimpleNamespace(local_root=workdir),  # type: ignore[arg-type]
                      workdir, pinning, cache_bytes)  # fmt: skip
        nginx = Nginx("nginx", ctx)
        nginx.start()
        endpoint = nginx.endpoints[0]
    creds = (HOARD_KEY, HOARD_SECRET) if name in HOARDS else (ORIGIN_KEY, ORIGIN_SECRET)
    urls = presign(endpoint, keys, *creds)
    register = None
    if name == "hoard-prefetch":  # the cold epoch's order, registered with the default window
        order = shuffled(keys, args.seed)
        register = functools.partial(prefetch, order, endpoint=endpoint, bucket=BUCKET,
                                     access_key=HOARD_KEY, secret_key=HOARD_SECRET)  # fmt: skip
    try:
        roots = {"moto": [origin.moto.pid],  # type: ignore[union-attr]
                 "proxy": [origin.proxy.pid]}  # type: ignore[union-attr]  # fmt: skip
        if proc is not None or nginx is not None:
            roots[name] = [proc.pid] if proc is not None else [p.pid for p in nginx.procs]  # type: ignore[union-attr]
        if args.list:  # off the clock, as DLIO lists at initialisation; its requests counted
            before = origin.counts()
            row["list"] = asyncio.run(list_dataset(endpoint, *creds))
            row["list"]["origin"] = {
                k: v for k, v in diff_counts(origin.counts(), before).items() if v
            }
        for phase in ("cold", "warm"):
            before = origin.counts()
            # The client is this process alone; its children are the other parts.
            pids = {"client": [os.getpid()], **{part: tree(r) for part, r in roots.items()}}
            cpu_before = {part: cpu_seconds(p) for part, p in pids.items()}
            first = register if phase == "cold" else None
            row[phase] = asyncio.run(epoch(urls, args.concurrency, args.seed, first))
            counts = diff_counts(origin.counts(), before)
            row[phase]["origin"] = {k: v for k, v in counts.items() if v}
            row[phase]["cpu_us_per_object"] = {
                part: round((cpu_seconds(p) - cpu_before[part]) * 1e6 / args.objects)
                for part, p in pids.items()
            }
        if name in HOARDS:
            files, used = disk_usage(workdir / "hoard" / "cache")
            row["cache_files"] = files
            row["disk_bytes_over_payload"] = round(used / (args.objects * args.size), 3)
            row["unindexed"] = unindexed(workdir / "hoard" / "cache", keys)
    finally:
        if proc is not None:
            stop_process(proc, 15)
        if nginx is not None:
            nginx.stop()
    return row


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Each round runs every target in turn, each from empty; a target's ratio to
    ``direct`` is taken within a round (the machine's load drifts between rounds) and
    the row reported is the round with the median cold ratio."""
    workdir = Path(args.workdir).resolve()
    wan = args.origin == "wan"
    origin = Origin(workdir / "origin", mode="auto" if wan else "loopback",
                    **({} if wan else {"rtt_ms": 0.0, "rate_mbit": 0.0, "stream_mbit": 0.0}))  # fmt: skip
    results: dict[str, Any] = {"objects": args.objects, "size": args.size, "origin": args.origin,
                               "concurrency": args.concurrency, "workers": args.workers,
                               "rounds": [], "targets": {}}  # fmt: skip
    with origin:
        results["network"] = str(origin.network)
        keys = seed(origin.moto_url, args.objects, args.size)
        targets, results["pinning"] = _pin(origin, Pinning.detect(args.pin))
        cache_bytes = max(4 * args.objects * args.size, 1 << 30)
        for number in range(args.rounds):
            rows: dict[str, Any] = {}
            for name in args.targets:
                rows[name] = measure(name, origin, keys, args, workdir, cache_bytes, targets)
                print(f"round {number + 1}", name, json.dumps(rows[name]), flush=True)
            _ratios(rows)
            results["rounds"].append(rows)
    for name in args.targets:
        results["targets"][name] = _median_round(results["rounds"], name)
    return results


def _pin(origin: Origin, split: Pinning) -> tuple[Pinning, str]:
    """The origin side on ``split.server``, this process (the client, and the targets it
    starts) on ``split.generator``: the placement the targets get (nginx then runs one
    worker a CPU of its side), and its description."""
    if not split.enabled:
        return Pinning(enabled=False), "off (scheduler decides)"
    pin_tree([origin.moto.pid, origin.proxy.pid], split.server)  # type: ignore[union-attr]
    os.sched_setaffinity(0, split.generator)
    cpus = ",".join(map(str, sorted(split.generator)))
    described = (f"origin (moto, counting proxy) on CPU {','.join(map(str, sorted(split.server)))}; "
                 f"client and target on CPU {cpus}")  # fmt: skip
    return Pinning(True, split.generator, split.generator), described


def _ratios(rows: dict[str, Any]) -> None:
    """Each target's objects/s over ``direct``'s of the same round, per epoch."""
    direct = rows.get("direct")
    if not direct:
        return
    for row in rows.values():
        for phase in ("cold", "warm"):
            row[phase]["vs_direct"] = round(
                row[phase]["objects_per_s"] / direct[phase]["objects_per_s"], 2
            )


def _median_round(rounds: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """``name``'s row of the round with its median cold ratio (objects/s without
    ``direct``), with every round's cold ratio beside it."""
    rows = [r[name] for r in rounds]
    measure_of = "vs_direct" if "vs_direct" in rows[0]["cold"] else "objects_per_s"
    ordered = sorted(rows, key=lambda row: row["cold"][measure_of])
    median = dict(ordered[(len(ordered) - 1) // 2])
    median["cold_" + measure_of + "_by_round"] = [row["cold"][measure_of] for row in rows]
    return median


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--origin", choices=("loopback", "wan"), default="loopback")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=1,
                        help="every target this many times, in turn; the median round is reported")  # fmt: skip
    parser.add_argument("--disk-hits", action="store_true",
                        help="Hoard's memory tier keeps no small block: warm hits from disk")  # fmt: skip
    parser.add_argument("--no-pin", dest="pin", action="store_false",
                        help="no CPU placement (the origin shares every CPU with the targets)")  # fmt: skip
    parser.add_argument("--no-list", dest="list", action="store_false",
                        help="the reader does not list the dataset before its first epoch")  # fmt: skip
    parser.add_argument("--targets", nargs="+", default=["direct", "hoard", "nginx"])
    parser.add_argument("--workdir", default="loadtest/results/smallobjects")
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    results = run(args)
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
