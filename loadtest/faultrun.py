"""``python -m loadtest.faultrun [--code DIR]``: the fault campaign of issue 19, as an operator would run it.

moto behind the test suite's fault-injecting proxy (``tests/origin_proxy.py``:
deterministic plans, no timers), one Hoard process, plain HTTP clients that
never retry, every body compared byte for byte. ``--code`` runs another
checkout's gateway (``PYTHONPATH``), so one run gives "before" and another
"after" on the same harness. Scenarios, one line each in the report:

- ``reset`` / ``truncate``: every 4th origin GET (p = 0.25) is cut 1 MiB into
  its body, after its 200; 16 cold objects of 16 MiB, 4 read at once.
- ``replaced``: an object whose block 0 is cached is replaced at the origin;
  then 10 GETs of it.
- ``stall-one``: the first origin GET of an object hangs (a tail request);
  time until the client has the object (``read_timeout`` 10 s).
- ``stall-all``: every origin GET of an object hangs; time until the client
  gets an answer (``read_timeout`` 10 s, ``max_attempts`` 5).
- ``disk-full``: the cache on a 40 MiB tmpfs with ``cache.size`` 1 GiB; read
  set A (32 MiB), then set B (32 MiB) twice: origin GETs of B's second pass,
  and error lines logged (needs root for the mount; skipped otherwise).
- ``workers``: ``workers: 2``, a new connection per request; a 64 KiB and a
  3 MiB key (1 MiB blocks) are read by both workers, overwritten through
  Hoard, then read 360 times; deleted through Hoard, then read 360 times.
  Every read starts after the write was acknowledged, so each must be current.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import boto3
import yaml
from moto.server import ThreadedMotoServer

from loadtest.procs import free_port, stop_process, wait_http

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from tests.origin_proxy import Fault, OriginProxy, fail_every  # noqa: E402

KEY, SECRET = "fault-access", "fault-secret"
MiB = 1024 * 1024


class Node:
    """One Hoard process running the gateway of ``code``."""

    def __init__(self, code: Path, work: Path, config: dict[str, Any]) -> None:
        self.port = free_port()
        self.work = work
        config = {"listen": f"127.0.0.1:{self.port}", "allow_anonymous": True,
                  "credentials": [{"access_key": KEY, "secret_key": SECRET}], **config}  # fmt: skip
        config.setdefault("cache", {}).setdefault("dir", str(work / "cache"))
        (work / "hoard.yaml").write_text(yaml.safe_dump(config))
        self.log_path = work / "hoard.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--config", str(work / "hoard.yaml")],
            stdout=self._log, stderr=subprocess.STDOUT, cwd=work,
            env={**os.environ, "PYTHONPATH": str(code)},
        )  # fmt: skip
        wait_http(f"{self.url}/_hoard/ready", 60, self.proc)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> str:
        stop_process(self.proc)
        self._log.close()
        return self.log_path.read_text(errors="replace")


async def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes | None]:
    """(status, body); body None when the response was cut after its headers."""
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        try:
            async with session.get(url, headers=headers) as answer:
                try:
                    return answer.status, await answer.read()
                except aiohttp.ClientPayloadError:
                    return answer.status, None
        except aiohttp.ClientError:
            return 0, None


async def _outcomes(urls: list[str], want: list[bytes], parallel: int) -> Counter[str]:
    gate = asyncio.Semaphore(parallel)

    async def one(url: str, expected: bytes) -> str:
        async with gate:
            status, body = await _get(url)
        if body is None:
            return f"cut after {status}" if status else "connection error"
        if status != 200:
            return f"status {status}"
        return "ok" if body == expected else "WRONG BYTES"

    return Counter(await asyncio.gather(*(one(u, w) for u, w in zip(urls, want, strict=True))))


def origin_config(proxy: OriginProxy, **origin: Any) -> dict[str, Any]:
    return {"origins": {"moto": {"type": "s3", "endpoint": proxy.endpoint, "access_key": KEY,
                                 "secret_key": SECRET, "addressing_style": "path", **origin}},
            "default_origin": "moto"}  # fmt: skip


def cut_mid_body(code: Path, work: Path, proxy: OriginProxy, s3: Any, kind: str) -> str:
    bucket = f"cut-{kind}"
    s3.create_bucket(Bucket=bucket)
    data = {f"obj/{i:02d}": os.urandom(16 * MiB) for i in range(16)}
    for key, body in data.items():
        s3.put_object(Bucket=bucket, Key=key, Body=body)
    node = Node(code, work, {**origin_config(proxy), "cache": {"block_size": "4MiB"}})
    try:
        proxy.reset()
        proxy.faults = fail_every(4, Fault(kind, after=MiB))
        urls = [f"{node.url}/{bucket}/{key}" for key in data]
        outcomes = asyncio.run(_outcomes(urls, list(data.values()), 4))
        faults = proxy.injected[kind]
        gets = proxy.counts["GetObject"]
    finally:
        proxy.faults = None
        node.stop()
    return f"| {kind} mid-body, p = 0.25 | {_tally(outcomes, 16)}; {faults} faults, {gets} origin GETs |"


def replaced(code: Path, work: Path, proxy: OriginProxy, s3: Any) -> str:
    bucket = "replaced"
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="obj", Body=os.urandom(16 * MiB))
    config = {**origin_config(proxy), "cache": {"block_size": "4MiB", "read_ahead": 0},
              "mounts": [{"bucket": "data", "origin": "moto", "origin_bucket": bucket,
                          "metadata_ttl": "forever"}]}  # fmt: skip
    node = Node(code, work, config)
    try:
        asyncio.run(_get(f"{node.url}/data/obj", {"Range": "bytes=0-99"}))  # block 0 cached
        new = os.urandom(16 * MiB)
        s3.put_object(Bucket=bucket, Key="obj", Body=new)
        seen = []
        for _ in range(10):
            seen += list(asyncio.run(_outcomes([f"{node.url}/data/obj"], [new], 1)).elements())
    finally:
        node.stop()
    return f"| object replaced while block 0 cached (TTL forever), 10 GETs in a row | {', '.join(seen)} |"


def stall(code: Path, work: Path, proxy: OriginProxy, s3: Any, everything: bool) -> str:
    bucket = "stall-all" if everything else "stall-one"
    s3.create_bucket(Bucket=bucket)
    body = os.urandom(2 * MiB)
    s3.put_object(Bucket=bucket, Key="obj", Body=body)
    node = Node(code, work, origin_config(proxy, read_timeout="10s", max_attempts=5))
    try:
        proxy.reset()
        if everything:
            proxy.faults = lambda number, path, byte_range: Fault("hang")
        else:
            proxy.faults = lambda number, path, byte_range: Fault("hang") if number == 1 else None
        started = time.monotonic()
        status, got = asyncio.run(_get(f"{node.url}/{bucket}/obj"))
        waited = time.monotonic() - started
    finally:
        proxy.faults = None
        proxy.release()
        node.stop()
    what = "ok" if got == body else f"status {status}" + (" (cut)" if got is None else "")
    name = "origin stalls on every GET" if everything else "one origin GET stalls (tail)"
    return f"| {name}, read_timeout 10 s | {what} after {waited:.1f} s, {proxy.counts['GetObject']} origin GETs |"


def disk_full(code: Path, work: Path, proxy: OriginProxy, s3: Any) -> str:
    small = work / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40m", "tmpfs", str(small)],
                      capture_output=True, check=False).returncode != 0:  # fmt: skip
        return "| cache disk full | skipped: cannot mount a tmpfs |"
    try:
        bucket = "full"
        s3.create_bucket(Bucket=bucket)
        sets = {name: {f"{name}/{i}": os.urandom(4 * MiB) for i in range(8)} for name in "AB"}
        for objects in sets.values():
            for key, body in objects.items():
                s3.put_object(Bucket=bucket, Key=key, Body=body)
        config = {**origin_config(proxy), "cache": {"dir": str(small), "size": "1GiB",
                  "memory": "4MiB", "memory_item_max": "64KiB", "block_size": "1MiB"}}  # fmt: skip
        node = Node(code, work, config)
        try:
            outcomes: Counter[str] = Counter()
            for name in "ABB":
                if name == "B":
                    proxy.reset()
                urls = [f"{node.url}/{bucket}/{key}" for key in sets[name]]
                outcomes += asyncio.run(_outcomes(urls, list(sets[name].values()), 2))
            second_pass = proxy.counts["GetObject"]
        finally:
            log = node.stop()
        errors = sum(1 for line in log.splitlines() if "ERROR" in line or "disk tier" in line)
        return (f"| cache on a 40 MiB tmpfs, cache.size 1 GiB: set A, then set B twice | "
                f"{_tally(outcomes, 24)}; {second_pass} origin GETs on B's second pass "
                f"(32 blocks each); {errors} error lines |")  # fmt: skip
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)


def across_workers(code: Path, work: Path, proxy: OriginProxy, s3: Any) -> list[str]:
    bucket = "workers"
    s3.create_bucket(Bucket=bucket)
    config = {**origin_config(proxy), "workers": 2,
              "cache": {"block_size": "1MiB", "memory": "64MiB"}}  # fmt: skip
    node = Node(code, work, config)
    hoard = boto3.client("s3", endpoint_url=node.url, region_name="us-east-1",
                         aws_access_key_id=KEY, aws_secret_access_key=SECRET)  # fmt: skip
    rows = []
    try:
        for size in (64 * 1024, 3 * MiB):
            key = f"k{size}"
            url = f"{node.url}/{bucket}/{key}"
            v1, v2 = os.urandom(size), os.urandom(size)
            hoard.put_object(Bucket=bucket, Key=key, Body=v1)
            asyncio.run(_outcomes([url] * 40, [v1] * 40, 4))  # both workers cache v1
            hoard.put_object(Bucket=bucket, Key=key, Body=v2)
            after_put = asyncio.run(_outcomes([url] * 360, [v2] * 360, 4))
            hoard.delete_object(Bucket=bucket, Key=key)
            after_delete = asyncio.run(_outcomes([url] * 360, [b""] * 360, 4))
            served = 360 - after_delete["status 404"]
            rows.append(f"| workers: 2, {size // 1024} KiB: reads after PUT v2 | "
                        f"{_tally(after_put, 360)} |")  # fmt: skip
            rows.append(f"| workers: 2, {size // 1024} KiB: reads after DELETE | "
                        f"{served}/360 served the deleted object |")  # fmt: skip
    finally:
        node.stop()
    return rows


@contextlib.contextmanager
def moto_behind_proxy() -> Iterator[tuple[OriginProxy, Any]]:
    """moto on a loopback port behind the fault proxy, and a boto3 client of moto itself."""
    moto_port = free_port()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=moto_port, verbose=False)
    moto.start()
    proxy = OriginProxy(f"http://127.0.0.1:{moto_port}").start()
    s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{moto_port}", region_name="us-east-1",
                      aws_access_key_id=KEY, aws_secret_access_key=SECRET)  # fmt: skip
    try:
        yield proxy, s3
    finally:
        proxy.stop()
        moto.stop()


def _tally(outcomes: Counter[str], total: int) -> str:
    bad = total - outcomes["ok"]
    rest = ", ".join(f"{n} {what}" for what, n in outcomes.items() if what != "ok")
    return f"{bad}/{total} failed" + (f" ({rest})" if rest else "")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.faultrun")
    p.add_argument("--code", type=Path, default=REPO, help="checkout whose gateway runs")
    p.add_argument(
        "--only", default="workers,reset,truncate,replaced,stall-one,stall-all,disk-full"
    )
    args = p.parse_args(argv)
    rows = [f"## fault run: {args.code}", "", "| scenario | result |", "|---|---|"]
    with (
        moto_behind_proxy() as (proxy, s3),
        tempfile.TemporaryDirectory(prefix="hoard-faults-") as scratch,
    ):
        for name in args.only.split(","):
            work = Path(scratch) / name
            work.mkdir()
            if name in ("reset", "truncate"):
                rows.append(cut_mid_body(args.code, work, proxy, s3, name))
            elif name == "replaced":
                rows.append(replaced(args.code, work, proxy, s3))
            elif name in ("stall-one", "stall-all"):
                rows.append(stall(args.code, work, proxy, s3, name == "stall-all"))
            elif name == "disk-full":
                rows.append(disk_full(args.code, work, proxy, s3))
            elif name == "workers":
                rows.extend(across_workers(args.code, work, proxy, s3))
            print(rows[-1], flush=True)
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
