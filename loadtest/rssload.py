"""``rss``: the server's memory while 8 clients each stream a very large object whole,
and while a very large multipart upload and a very large PutObject pass through it.

The load-test issue's target: peak RSS per worker process while 8 clients
stream 2 GiB objects, at most 150 MiB plus the memory tier (Hoard's
``cache.memory``, read from the config the harness wrote). Each client streams
its own object (``Dataset.rss``, put in the origin only when this workload
runs), once cold (the target fills from the origin) and once warm (hits).

The clients are lean: one generator process, one thread per client, plain
HTTP over presigned URLs (plain paths for ``static``), each reading into one
fixed 1 MiB buffer that is overwritten, so no body is ever held and the
generator's own memory is a few MiB.

Memory is read from /proc for every process of the target (a Hoard node and
its workers, nginx's master and workers): VmHWM, reset before each phase
(``clear_refs``), so each phase has its own peak, and VmRSS sampled every
0.2 s, which is all there is if the reset is refused. "Per worker" is the
largest process; "sum" adds every process's peak.

Upload phase (``upload``, targets that take uploads: Hoard): two lean clients
at once (``uploads.py``: signed SigV4 requests, bodies made as they are sent),
a 5 GiB multipart upload (64 MiB parts, 3 in flight) and a 2 GiB PutObject,
into a writable mount (``datasets.UPLOADS``) with Hoard's default
write-through, which keeps PutObjects up to 64 MiB: a 2 GiB one is not teed,
and multipart uploads never are. Afterwards each object is checked at the
origin (moto directly): its size, its ETag against the MD5s the client
computed as it sent the bytes, and one 1 MiB range against the generator. The
phase's figure is the peak per process since the phase began (it starts after
``warm``, so it also shows what the reads left resident) and its growth over
the phase's start.

Object size: 1 GiB at full scale, not the issue's 2 GiB. moto keeps object
bodies in temporary files (not memory), so 8 x 2 GiB would fit, but moto
ingests about 100 MB/s on this machine and the origin link is 1 Gbit/s:
seeding 16 GiB would take about 3 minutes and the cold read at least 137 s,
over the workload's 5-minute budget. Eight clients (what sets the number of
concurrent streams, hence buffers) are kept; 1 GiB per stream is well past
any steady state (125 blocks of 8 MiB each).
"""

from __future__ import annotations

import random
import threading
import time
import urllib.request
from typing import Any

from loadtest import clients, uploads
from loadtest.datasets import UPLOADS, origin_client
from loadtest.procs import memory, reset_peak, tree
from loadtest.report import MiB, Row
from loadtest.workloads import Session
from loadtest.wrkload import presigned_paths

SAMPLE_S = 0.2
TARGET_MIB = 150  # the allowance over the memory tier, per worker
IN_FLIGHT = 3  # parts of the multipart upload sent at once
SPOT = 1024 * 1024  # bytes of each uploaded object read back and compared with the generator


class Watch:
    """Peak memory of a target's processes from construction to ``stop()``."""

    def __init__(self, roots: list[int]) -> None:
        self.roots = roots
        self.initial = set(tree(roots))
        # After a reset, a VmHWM is the peak since now; a process started later has its own.
        self.reset = reset_peak(sorted(self.initial))
        self.sampled: dict[int, int] = {}
        self.names: dict[int, str] = {}
        self._sample(sorted(self.initial))
        self.start = max(self.sampled.values(), default=0)  # the largest process, before
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-watch", daemon=True)
        self._thread.start()

    def _sample(self, pids: list[int]) -> None:
        for pid in pids:
            found = memory(pid)
            if found is not None:
                self.names[pid] = found[0]
                self.sampled[pid] = max(self.sampled.get(pid, 0), found[1])

    def _run(self) -> None:
        pids = sorted(self.initial)
        turn = 0
        while not self._stop.wait(SAMPLE_S):  # bounded: ends with stop()
            turn += 1
            if turn % 5 == 0:  # new workers (a restart) join within a second
                pids = tree(self.roots)
            self._sample(pids)

    def stop(self) -> dict[int, int]:
        """Peak bytes per process over the watch."""
        self._stop.set()
        self._thread.join(5)
        peaks = dict(self.sampled)
        for pid in {*tree(self.roots), *self.sampled}:
            found = memory(pid)
            if found is None:
                continue
            self.names[pid] = found[0]
            peak = max(peaks.get(pid, 0), found[1])
            if self.reset or pid not in self.initial:
                peak = max(peak, found[2])
            peaks[pid] = peak
        return peaks


def tier_in_use(endpoints: list[str]) -> int | None:
    """Bytes Hoard's memory tiers hold now (``hoard_cache_bytes{tier="memory"}``, max over workers)."""
    try:
        with urllib.request.urlopen(endpoints[0] + "/metrics", timeout=10) as response:
            text = response.read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith('hoard_cache_bytes{tier="memory"}'):
            return int(float(line.split()[-1]))
    return None


def _memory_extras(
    s: Session, watch: Watch, peaks: dict[int, int], tier: int | None
) -> dict[str, Any]:
    if not peaks:
        return {}
    worker = max(peaks.values())
    extra: dict[str, Any] = {
        "rss_worker_mib": worker / MiB,
        "rss_sum_mib": sum(peaks.values()) / MiB,
        "rss_start_mib": watch.start / MiB,
        "processes": len(peaks),
        "rss_from": "VmHWM" if watch.reset else f"VmRSS every {SAMPLE_S:g}s",
    }
    if tier is not None:
        extra["memory_tier_mib"] = tier / MiB
        extra["worker_minus_tier_mib"] = (worker - tier) / MiB
        used = tier_in_use(s.target.endpoints)
        if used is not None:
            extra["tier_used_mib"] = used / MiB
    return extra


def rss(s: Session) -> list[Row]:
    data = s.bench.dataset
    if not data.rss:
        raise RuntimeError("no rss objects in the origin (the dataset was planned without them)")
    endpoints = s.target.endpoints
    urls = []
    for n, obj in enumerate(data.rss):  # clients spread over the nodes
        endpoint = endpoints[n % len(endpoints)]
        urls.append(endpoint + presigned_paths(s, (obj,), endpoint)[0])
    tier = s.target.memory_tier()
    rows = []
    with s.pool(1, 1) as pool:
        for phase in ("cold", "warm"):

            def run() -> dict[str, Any]:
                watch = Watch(s.target.pids())
                task = {"urls": urls, "start_at": time.time() + 0.5, "timeout": 120.0}
                try:
                    done = s.map(pool, clients.stream_urls, [task])[0]["clients"]
                finally:
                    peaks = watch.stop()
                oks = [c["status"] == 200 and c["size"] == o.size
                       for c, o in zip(done, data.rss, strict=True)]  # fmt: skip
                failures = [c["error"] or f"HTTP {c['status']}, {c['size']} bytes"
                            for c, ok in zip(done, oks, strict=True) if not ok]  # fmt: skip
                durations = [c["end"] - c["begin"] for c in done]
                return {
                    "wall": max(c["end"] for c in done) - min(c["begin"] for c in done),
                    "objects": sum(oks), "errors": len(failures),
                    "bytes": sum(c["size"] for c in done), "latencies": durations,
                    "clients": len(done), "object_mib": data.rss[0].size // MiB,
                    **({"first_error": failures[0][:120]} if failures else {}),
                    **_memory_extras(s, watch, peaks, tier),
                }  # fmt: skip

            rows.append(s.measure(phase, run, generator="http"))
        if s.target.takes_uploads:
            rows.append(s.measure("upload", lambda: _uploads(s, pool, tier), generator="http"))
    return rows


def _uploads(s: Session, pool: Any, tier: int | None) -> dict[str, Any]:
    """The multipart upload and the PutObject at once through the first node; checked after."""
    scale = s.bench.scale
    multi = {"key": "multipart.bin", "size": scale.upload_multipart,
             "part_size": scale.upload_part, "in_flight": IN_FLIGHT}  # fmt: skip
    put = {"key": "put.bin", "size": scale.upload_put}
    task = {"endpoint": s.target.endpoints[0], "access_key": s.target.access_key,
            "secret_key": s.target.secret_key, "bucket": UPLOADS, "seed": s.bench.seed,
            "timeout": 300.0, "start_at": time.time() + 0.5, "multipart": multi, "put": put}  # fmt: skip
    watch = Watch(s.target.pids())
    try:
        done = s.map(pool, uploads.upload_both, [task])[0]
    finally:
        peaks = watch.stop()
    sent = [(done["multipart"], multi), (done["put"], put)]
    failures = [r["error"] or check for r, o in sent
                if (check := _stored(s, r, o["key"], o["size"])) or r["error"]]  # fmt: skip
    extra = _memory_extras(s, watch, peaks, tier)
    if peaks:
        extra["rss_growth_mib"] = (max(peaks.values()) - watch.start) / MiB
    return {
        "wall": max(r["end"] for r, _ in sent) - min(r["begin"] for r, _ in sent),
        "objects": len(sent) - len(failures), "errors": len(failures),
        "bytes": sum(r["size"] for r, _ in sent),
        "latencies": [r["end"] - r["begin"] for r, _ in sent], "clients": len(sent),
        "shape": f"multipart {multi['size'] // MiB:,} MiB ({multi['part_size'] // MiB} MiB parts, "
                 f"{IN_FLIGHT} in flight) + PutObject {put['size'] // MiB:,} MiB",
        "multipart_s": done["multipart"]["end"] - done["multipart"]["begin"],
        "put_s": done["put"]["end"] - done["put"]["begin"],
        **({"first_error": failures[0][:160]} if failures else {}), **extra,
    }  # fmt: skip


def _stored(s: Session, sent: dict[str, Any], key: str, size: int) -> str:
    """Why the object at the origin is not what was sent ("" if it is): size, ETag, one range."""
    if sent["error"]:
        return ""
    client = origin_client(s.bench.origin.moto_url)
    head = client.head_object(Bucket=UPLOADS, Key=key)
    etag = head["ETag"].strip('"')
    if head["ContentLength"] != size or etag != sent["expected_etag"]:
        return f"{key}: {head['ContentLength']} bytes, ETag {etag}; sent {size}, {sent['expected_etag']}"
    start = random.Random(f"{s.bench.seed}:{key}").randrange(max(1, size - SPOT))
    wanted = uploads.generated(key, size, s.bench.seed, start, min(SPOT, size - start))
    got = client.get_object(Bucket=UPLOADS, Key=key,
                            Range=f"bytes={start}-{start + len(wanted) - 1}")["Body"].read()  # fmt: skip
    return "" if got == wanted else f"{key}: bytes {start}+{len(wanted)} differ from the generator"
