"""``python -m loadtest soak [--minutes M] [--workers N]``: a Hoard node under a bounded mixed soak.

What it answers: does a worker's resident memory stay within what its tiers
and metadata bounds allow, or does it grow with time? It starts moto on a
loopback port, seeds a dataset (small objects and multi-block shards), starts
``python -m gateway serve`` with ``--workers`` processes (2) and small bounds
(``cache.memory`` 8 MiB, ``cache.metadata_memory`` 16 MiB: issue 34's), and
runs client threads for ``--minutes`` (then stops by itself) with a mix of
whole and ranged GETs, HEADs, LIST pages, GETs of missing keys, and PUTs,
re-reads and DELETEs of fresh keys — half of the GETs on a new connection
each, as data loaders with short-lived clients make them.

Every ``--interval`` seconds it samples each process of the node (supervisor
and workers, from /proc): resident memory, open descriptors and threads. It
prints the samples as a table and a summary per process: first, middle and
last sample, and the growth over the second half (warm-up excluded), which is
the figure that says "bounded" or "leaking"; then RSS at start and end and
the slope (MiB/min, least squares over the second half) per worker. Bytes
read are checked against the seeded data; any error is counted and printed.
``python -m loadtest soak --minutes 30`` is the issue's soak; a few minutes
show a creep of the size issue 34 found (13 MiB/min).

Not a benchmark: no peer comparison, no latency figures; see ``run.py``.
"""

from __future__ import annotations

import argparse
import http.client
import logging
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import boto3
import yaml
from botocore.config import Config
from moto.server import ThreadedMotoServer

from loadtest.procs import free_port, stop_process, tree, wait_http

KEY, SECRET = "soak-access", "soak-secret"
BUCKET = "soak"
SMALL, SHARDS = 1500, 6
SHARD_SIZE = 6 * 1024 * 1024
REPO = Path(__file__).resolve().parent.parent


@dataclass
class Sample:
    at: float
    pid: int
    rss: int
    fds: int
    threads: int
    anon: int = 0  # of rss: private memory (the rest is file pages: mapped pages, code)


@dataclass
class Tally:
    requests: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, kind: str, error: str | None = None) -> None:
        with self.lock:
            self.requests[kind] += 1
            if error is not None:
                self.errors[f"{kind}: {error}"] += 1


def seed(endpoint: str) -> dict[str, bytes]:
    client = _client(endpoint, KEY, SECRET)
    client.create_bucket(Bucket=BUCKET)
    rng = random.Random(7)
    data: dict[str, bytes] = {}
    for i in range(SMALL):
        data[f"small/{i:05d}"] = rng.randbytes(rng.randint(1024, 64 * 1024))
    for i in range(SHARDS):
        data[f"shard/{i}"] = rng.randbytes(SHARD_SIZE)
    for key, body in data.items():
        client.put_object(Bucket=BUCKET, Key=key, Body=body)
    return data


def hoard_config(moto: str, port: int, directory: Path, workers: int) -> dict[str, object]:
    return {
        "listen": f"127.0.0.1:{port}",
        "workers": workers,
        "credentials": [{"access_key": KEY, "secret_key": SECRET}],
        "allow_anonymous": True,
        "access_log": False,
        "origins": {"moto": {"type": "s3", "endpoint": moto, "access_key": KEY,
                             "secret_key": SECRET, "addressing_style": "path"}},
        "default_origin": "moto",
        "cache": {"dir": str(directory / "cache"), "size": "256MiB", "memory": "8MiB",
                  "block_size": "1MiB", "metadata_memory": "16MiB"},
    }  # fmt: skip


def _client(endpoint: str, key: str, secret: str, signature_version: str | None = None):
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                        aws_access_key_id=key, aws_secret_access_key=secret,
                        config=Config(retries={"total_max_attempts": 1},
                                      s3={"addressing_style": "path"},
                                      signature_version=signature_version))  # fmt: skip


def _get(port: int, path: str, headers: dict[str, str], keep: list) -> tuple[int, bytes]:
    """One GET; on a kept connection (``keep`` holds it) or, if ``keep`` is empty, a new one."""
    connection = keep[0] if keep else http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request("GET", path, headers=headers)
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        if not keep:
            connection.close()


def client_loop(port: int, data: dict[str, bytes], stop: threading.Event, tally: Tally,
                seed_: int) -> None:  # fmt: skip
    rng = random.Random(seed_)
    s3 = _client(f"http://127.0.0.1:{port}", KEY, SECRET)
    smalls = [k for k in data if k.startswith("small/")]
    shards = [k for k in data if k.startswith("shard/")]
    kept = [http.client.HTTPConnection("127.0.0.1", port, timeout=60)]
    n = 0
    while not stop.is_set():
        n += 1
        roll = rng.random()
        keep = kept if rng.random() < 0.5 else []
        kind = "?"
        try:
            if roll < 0.40:
                kind, key = "get", rng.choice(smalls)
                status, body = _get(port, f"/{BUCKET}/{key}", {}, keep)
                _expect(status == 200 and body == data[key], status)
            elif roll < 0.60:
                kind, key = "range", rng.choice(shards)
                first = rng.randrange(SHARD_SIZE - 1)
                last = min(SHARD_SIZE - 1, first + rng.randint(1, 3 * 1024 * 1024))
                status, body = _get(
                    port, f"/{BUCKET}/{key}", {"Range": f"bytes={first}-{last}"}, keep
                )
                _expect(status == 206 and body == data[key][first : last + 1], status)
            elif roll < 0.70:
                kind = "head"
                s3.head_object(Bucket=BUCKET, Key=rng.choice(smalls))
            elif roll < 0.78:
                kind = "list"
                s3.list_objects_v2(
                    Bucket=BUCKET, Prefix=f"small/{rng.randrange(15):02d}", MaxKeys=100
                )
            elif roll < 0.85:
                kind = "missing"
                status, _ = _get(port, f"/{BUCKET}/missing/{seed_}-{n}", {}, keep)
                _expect(status == 404, status)
            else:
                kind = "write"
                key, body = f"scratch/{seed_}-{n}", rng.randbytes(rng.randint(1, 256 * 1024))
                s3.put_object(Bucket=BUCKET, Key=key, Body=body)
                status, got = _get(port, f"/{BUCKET}/{key}", {}, keep)
                _expect(status == 200 and got == body, status)
                s3.delete_object(Bucket=BUCKET, Key=key)
            tally.count(kind)
        except Exception as exc:  # counted and printed: the soak goes on
            tally.count(kind, type(exc).__name__ + ": " + str(exc)[:80])
            kept[0].close()
            kept[0] = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    kept[0].close()


def fresh_keys(port: int, count: int, bucket: str = BUCKET, key: str = KEY,
               secret: str = SECRET, prefix: str = "fresh/") -> Counter[int]:  # fmt: skip
    """The soak's short mode: ``count`` GETs of keys never seen before (what the soak's
    misses and fresh writes bring), presigned, over one kept connection; statuses counted.
    Whatever grows with each new key shows after a few thousand of them, not minutes.
    ``prefix``: the keys' (one with a byte a URL escapes makes every path one the
    signature's canonical form must be worked out for)."""
    # SigV4, as SDKs presign today (boto3's default here is SigV2's query form): the
    # memos of SigV4's canonical request are what a fresh key may grow.
    signer = _client(f"http://127.0.0.1:{port}", key, secret, "s3v4")
    keep = [http.client.HTTPConnection("127.0.0.1", port, timeout=60)]
    statuses: Counter[int] = Counter()
    try:
        for n in range(count):
            url = signer.generate_presigned_url(
                "get_object", Params={"Bucket": bucket, "Key": f"{prefix}{n:07d}"}
            )
            status, _ = _get(port, url.split(str(port), 1)[1], {}, keep)
            statuses[status] += 1
    finally:
        keep[0].close()
    return statuses


def _expect(ok: bool, status: int) -> None:
    if not ok:
        raise AssertionError(f"status {status} or wrong bytes")


def sample(pids: list[int], at: float) -> list[Sample]:
    found = []
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            fds = len(os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if "VmRSS" not in fields:
            continue
        rss = int(fields["VmRSS"].split()[0]) * 1024
        anon = int(fields.get("RssAnon", "0 kB").split()[0]) * 1024
        found.append(Sample(at, pid, rss, fds, int(fields["Threads"]), anon))
    return found


def report(samples: list[Sample], tally: Tally, workers: int, seconds: float) -> str:
    mib = 1024 * 1024
    lines = [f"## soak: {workers} worker(s), {seconds:.0f} s, "
             f"{sum(tally.requests.values())} requests, {sum(tally.errors.values())} errors", "",
             "| t (s) | pid | RSS (MiB) | fds | threads |", "|---|---|---|---|---|"]  # fmt: skip
    for s in samples:
        lines.append(f"| {s.at:.0f} | {s.pid} | {s.rss / mib:.1f} | {s.fds} | {s.threads} |")
    lines += ["", "| pid | RSS first / middle / last (MiB) | 2nd-half growth (MiB) | fds first / last"
              " | threads first / last |", "|---|---|---|---|---|"]  # fmt: skip
    for pid in sorted({s.pid for s in samples}):
        mine = [s for s in samples if s.pid == pid]
        first, middle, last = mine[0], mine[len(mine) // 2], mine[-1]
        lines.append(f"| {pid} | {first.rss / mib:.0f} / {middle.rss / mib:.0f} / {last.rss / mib:.0f}"
                     f" | {(last.rss - middle.rss) / mib:+.1f} | {first.fds} / {last.fds}"
                     f" | {first.threads} / {last.threads} |")  # fmt: skip
    lines += ["", "| pid | RSS start (MiB) | RSS end (MiB) | slope, 2nd half (MiB/min) |",
              "|---|---|---|---|"]  # fmt: skip
    for pid in sorted({s.pid for s in samples}):
        mine = [s for s in samples if s.pid == pid]
        lines.append(f"| {pid} | {mine[0].rss / mib:.0f} | {mine[-1].rss / mib:.0f} "
                     f"| {slope(mine[len(mine) // 2 :]) * 60 / mib:+.2f} |")  # fmt: skip
    lines += ["", f"requests: {dict(tally.requests)}"]
    lines += [f"error: {count} x {what}" for what, count in tally.errors.most_common(10)]
    return "\n".join(lines)


def slope(samples: list[Sample]) -> float:
    """RSS bytes per second, least squares over ``samples`` (0 for fewer than two)."""
    if len(samples) < 2:
        return 0.0
    mean_t = sum(s.at for s in samples) / len(samples)
    mean_r = sum(s.rss for s in samples) / len(samples)
    spread = sum((s.at - mean_t) ** 2 for s in samples)
    if spread == 0:
        return 0.0
    return sum((s.at - mean_t) * (s.rss - mean_r) for s in samples) / spread


def soak(workers: int, seconds: float, interval: float, clients: int, fresh: int = 0,
         code: Path = REPO) -> str:  # fmt: skip
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's line per request
    moto_port = free_port()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=moto_port, verbose=False)
    moto.start()
    with tempfile.TemporaryDirectory(prefix="hoard-soak-") as scratch:
        directory = Path(scratch)
        port = free_port()
        try:
            data = seed(f"http://127.0.0.1:{moto_port}")
            config = directory / "hoard.yaml"
            config.write_text(yaml.safe_dump(hoard_config(f"http://127.0.0.1:{moto_port}", port,
                                                          directory, workers)))  # fmt: skip
            log = open(directory / "hoard.log", "wb")  # noqa: SIM115 - closed below
            proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--config", str(config)],
                                    stdout=log, stderr=subprocess.STDOUT, cwd=directory,
                                    env={**os.environ, "PYTHONPATH": str(code)})  # fmt: skip
            try:
                wait_http(f"http://127.0.0.1:{port}/_hoard/ready", 60, proc)
                if fresh:
                    return _fresh(proc, port, fresh)
                return _run(proc, port, data, workers, seconds, interval, clients)
            finally:
                stop_process(proc)
                log.close()
        finally:
            moto.stop()


def _run(proc: subprocess.Popen[bytes], port: int, data: dict[str, bytes], workers: int,
         seconds: float, interval: float, clients: int) -> str:  # fmt: skip
    stop, tally = threading.Event(), Tally()
    threads = [threading.Thread(target=client_loop, args=(port, data, stop, tally, i), daemon=True)
               for i in range(clients)]  # fmt: skip
    for thread in threads:
        thread.start()
    started = time.monotonic()
    samples: list[Sample] = []
    while (now := time.monotonic() - started) < seconds:
        samples += sample(tree([proc.pid]), now)
        stop.wait(interval)
    stop.set()
    for thread in threads:
        thread.join(60)
    samples += sample(tree([proc.pid]), time.monotonic() - started)
    return report(samples, tally, workers, seconds)


def _fresh(proc: subprocess.Popen[bytes], port: int, count: int) -> str:
    """RSS per process before and after ``count`` GETs of fresh keys (``fresh_keys``)."""
    mib = 1024 * 1024
    fresh_keys(port, 200)  # warm-up: imports, first connections, first pages
    before = {s.pid: s for s in sample(tree([proc.pid]), 0.0)}
    statuses = fresh_keys(port, count)
    after = {s.pid: s for s in sample(tree([proc.pid]), 0.0)}
    lines = [f"## fresh keys: {count} GETs of keys never seen, statuses {dict(statuses)}", "",
             "| pid | RSS before (MiB) | after (MiB) | KiB per key | of which private |",
             "|---|---|---|---|---|"]  # fmt: skip
    for pid in sorted(before.keys() & after.keys()):
        grew, anon = after[pid].rss - before[pid].rss, after[pid].anon - before[pid].anon
        lines.append(f"| {pid} | {before[pid].rss / mib:.0f} | {after[pid].rss / mib:.0f} "
                     f"| {grew / 1024 / count:.2f} | {anon / 1024 / count:.2f} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest soak", description=__doc__.split("\n")[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--interval", type=float, default=15.0, help="seconds between RSS samples")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--code", type=Path, default=REPO, help="checkout whose gateway runs")
    p.add_argument("--fresh", type=int, default=0,
                   help="short mode: RSS around this many GETs of fresh keys, no soak")  # fmt: skip
    args = p.parse_args(argv)
    print(soak(args.workers, args.minutes * 60, args.interval, args.clients, args.fresh,
               args.code), flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
