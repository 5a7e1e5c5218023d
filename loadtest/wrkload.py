"""``capacity``: server capacity per core, measured with wrk, a generator that is not the bottleneck.

On two cores a handful of boto3 processes saturate the CPU before any server
does, so their figures measure boto3. wrk (C, epoll, one thread, pinned to the
generator CPU) cycles through requests made before the clock starts instead:

| phase | objects | connections | signed how |
|---|---|---|---|
| ``small 128k`` | ``hit_objects`` of exactly 128 KiB | 64 | presigned URLs |
| ``small 128k sigv4`` | the same (Hoard only) | 64 | header-signed SigV4, as boto3 sends |
| ``small 4k`` | ``hit_objects`` of 4 KiB | 64 | presigned URLs |
| ``small 4k wide`` | ``wide_objects`` of 4 KiB (50,000 at full scale) | 64 | presigned URLs |
| ``large 256m`` | the largest shard, whole | 4 | presigned URL |

Hoard verifies every signature (boto3 presigns the URLs for Hoard's endpoint
and credentials; for the sigv4 phase each request's Authorization, X-Amz-Date
and X-Amz-Content-Sha256 are computed here, one per object, and wrk sends them
as they are: valid for the 15 minutes SigV4 allows). nginx passes signatures to
the origin and keeps them out of its cache key; ``static`` gets plain paths.

wrk cycles through the requests in order. 2,000 objects fit every per-key hot
set Hoard keeps (presigned verdicts, lookup tickets, header blocks, the route
memo: 4,096 to 16,384 entries); a training dataset has a million objects, so
``small 4k wide`` cycles through more than any of them holds and every hit
misses them all, as a reader's hits do. That phase gets ``SECONDS_PER_OBJECT``
per object of its set beyond the scale's time limit (seeding, the cold pass
and the passes after it take minutes at 50,000).

Each phase first reads every request once (until a pass costs the origin
nothing), so a caching target answers from its cache; nginx's answers then
carry ``X-Cache-Status`` and one more pass counts them (all HIT, or the peer
is not measured at its best). wrk then runs ``wrk_repeats`` times; the row is
the median run by req/s, with the median server CPU per request: user +
system time of the server's processes (``/proc/PID/stat``) over the run,
divided by the requests answered (and by the MiB sent: a run of 256 MiB
answers completes few). On a shared machine that figure is the
robust one: other load slows a server, but does not make each request cost
more of its own CPU. For several nodes, wrk drives the first.
"""

from __future__ import annotations

import http.client
import json
import shutil
import statistics
import subprocess
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from botocore.config import Config

from loadtest.datasets import HIT_SIZES, KiB, Obj, Scale
from loadtest.procs import cpu_seconds, tree
from loadtest.report import Row
from loadtest.workloads import Session

HERE = Path(__file__).resolve().parent
# Time a phase may take per object of its set beyond the scale's limit, for signing, the
# cold pass through the origin and the passes after it (measured on a shared 2-core
# machine: 4-7 ms per 4 KiB object), so 50,000 objects have their own 500 s.
SECONDS_PER_OBJECT = 0.01


@dataclass(frozen=True)
class Phase:
    name: str
    connections: int
    header_signed: bool = False  # SigV4 in headers instead of a presigned query
    wide: bool = False  # the wide set (``wide_objects``), beyond every hot set


PHASES = (
    Phase("small 128k", 64),
    Phase("small 128k sigv4", 64, header_signed=True),
    Phase("small 4k", 64),
    Phase("small 4k wide", 64, wide=True),
    Phase("large 256m", 4),
)


def trimmed(scale: Scale, phases: tuple[str, ...]) -> Scale:
    """``scale`` without the objects no phase of ``phases`` reads (all phases: unchanged)."""
    chosen = [p for p in PHASES if not phases or p.name in phases]
    hits = any(not p.wide and p.name.startswith("small") for p in chosen)
    wide = any(p.wide for p in chosen)
    return replace(scale, hit_objects=scale.hit_objects if hits else 0,
                   wide_objects=scale.wide_objects if wide else 0)  # fmt: skip


def unavailable() -> str | None:
    return None if shutil.which("wrk") else "wrk not installed (apt-get install wrk)"


def _objects(s: Session, phase: Phase) -> tuple[Obj, ...]:
    data = s.bench.dataset
    if phase.name.startswith("large"):
        return (data.stream_object,)
    if phase.wide:
        return data.wide
    size = 128 * KiB if "128k" in phase.name else 4 * KiB
    assert size in HIT_SIZES
    return data.hits_of(size)


def _client(s: Session, endpoint: str) -> Any:
    import boto3

    return boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1",
        aws_access_key_id=s.target.access_key, aws_secret_access_key=s.target.secret_key,
        config=Config(s3={"addressing_style": "path"}),
    )  # fmt: skip


def presigned_paths(s: Session, objects: tuple[Obj, ...], endpoint: str | None = None) -> list[str]:
    """Path + query of a GET for each object against ``endpoint`` (the target's first)."""
    bucket = s.bench.dataset.bucket
    if not s.target.can_list:  # static files: no signature to check
        return [f"/{bucket}/{o.key}" for o in objects]
    client = _client(s, endpoint or s.target.endpoints[0])
    paths = []
    for o in objects:
        url = client.generate_presigned_url(
            "get_object", Params={"Bucket": bucket, "Key": o.key}, ExpiresIn=3600
        )
        parts = urlsplit(url)
        paths.append(parts.path + ("?" + parts.query if parts.query else ""))
    return paths


def header_signed(s: Session, objects: tuple[Obj, ...]) -> list[str]:
    """One wrk request line per object: the path, then its SigV4 headers, tab-separated."""
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    endpoint = s.target.endpoints[0]
    signer = S3SigV4Auth(Credentials(s.target.access_key, s.target.secret_key), "s3", "us-east-1")
    lines = []
    for o in objects:
        path = f"/{s.bench.dataset.bucket}/{o.key}"
        request = AWSRequest(method="GET", url=endpoint + path)
        signer.add_auth(request)
        wanted = ("Authorization", "X-Amz-Date", "X-Amz-Content-SHA256")
        lines.append("\t".join([path, *(f"{name}: {request.headers[name]}" for name in wanted)]))
    return lines


class _Reader(threading.local):
    """GETs of request lines over one kept-alive connection per thread: a pass over
    50,000 small objects pays no handshake (nor the server an accept) per request."""

    def __init__(self, endpoint: str) -> None:
        self.parts = urlsplit(endpoint)
        self.connection: http.client.HTTPConnection | None = None

    def get(self, line: str, body: bool = True) -> tuple[int, str]:
        """The status and ``X-Cache-Status`` ("-" if none) of one request line; the body
        is read whole (``body``) or, past 1 MiB, left unread and the connection closed."""
        path, *headers = line.split("\t")
        fields = dict(h.split(": ", 1) for h in headers)
        for attempt in (1, 2):  # a kept connection the server has closed: once more
            if self.connection is None:
                host, port = self.parts.hostname or "", self.parts.port
                self.connection = http.client.HTTPConnection(host, port, timeout=120)
            try:
                self.connection.request("GET", path, headers=fields)
                response = self.connection.getresponse()
                if body or (response.length or 0) <= 1024 * 1024:
                    while response.read(1024 * 1024):
                        pass
                else:
                    self.close()
                if response.will_close:
                    self.close()
                return response.status, response.headers.get("X-Cache-Status", "-")
            except (http.client.HTTPException, OSError):
                self.close()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()
            self.connection = None


def warm(endpoint: str, lines: list[str], deadline: float) -> Counter[str]:
    """Read every request once (16 at a time); returns the reads that failed, by why
    (a status, an exception's name, or the pass's deadline)."""
    reader = _Reader(endpoint)

    def one(line: str) -> str | None:
        if time.monotonic() > deadline:
            return "past the deadline"
        try:
            status = reader.get(line)[0]
        except (http.client.HTTPException, OSError) as exc:
            return type(exc).__name__
        return f"HTTP {status}" if status >= 400 else None

    with ThreadPoolExecutor(16) as pool:
        return Counter(why for why in pool.map(one, lines) if why is not None)


def cache_statuses(endpoint: str, lines: list[str]) -> Counter[str]:
    """nginx's ``X-Cache-Status`` of each request, "-" where none is sent."""
    reader = _Reader(endpoint)

    def one(line: str) -> str:
        try:
            status, cache = reader.get(line, body=False)
            return cache if status < 400 else f"error HTTP {status}"
        except (http.client.HTTPException, OSError) as exc:
            return f"error {type(exc).__name__}"

    with ThreadPoolExecutor(16) as pool:
        return Counter(pool.map(one, lines))


def run_wrk(s: Session, lines: list[str], connections: int, seconds: float, tag: str) -> dict:
    requests_file = s.bench.workdir / f"wrk-{s.target.name}-{tag}.txt"
    requests_file.write_text("\n".join(lines) + "\n")
    command = [
        *s.bench.pinning.generator_prefix(), "wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s",
        "--timeout", "60s", "-s", str(HERE / "wrk.lua"), s.target.endpoints[0], "--",
        str(requests_file),
    ]  # fmt: skip
    server = tree(s.target.pids())
    cpu_before = cpu_seconds(server)
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=seconds + 90, check=False
    )
    cpu = cpu_seconds(server) - cpu_before
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("{"):
            return {**json.loads(line), "cpu_s": cpu}
    raise RuntimeError(f"wrk printed no result (exit {done.returncode}): {done.stderr[-500:]}")


def _summarise(runs: list[dict], connections: int) -> dict[str, Any]:
    """The median run by req/s, with the median CPU per request and every run's req/s."""

    def rate(run: dict) -> float:
        return run["requests"] / (run["duration_us"] / 1e6)

    def errors(run: dict) -> int:
        return sum(run[k] for k in ("connect", "read", "write", "status", "timeout"))

    ordered = sorted(runs, key=rate)
    median = ordered[len(ordered) // 2]
    cpu = [1e6 * r["cpu_s"] / r["requests"] for r in runs if r["requests"]]
    # Per MiB too: a 10 s run of 256 MiB answers completes a few, but its CPU moved every byte.
    per_mib = [1e6 * r["cpu_s"] / (r["bytes"] / 1024**2) for r in runs if r["bytes"]]
    return {
        "wall": median["duration_us"] / 1e6, "objects": median["requests"] - errors(median),
        "bytes": median["bytes"], "errors": errors(median),
        "p50_s": median["p50_us"] / 1e6, "p99_s": median["p99_us"] / 1e6,
        "connections": connections,
        "cpu_us_per_req": statistics.median(cpu) if cpu else 0.0,
        "cpu_us_per_mib": statistics.median(per_mib) if per_mib else 0.0,
        "runs_req_s": "/".join(f"{rate(r):.0f}" for r in runs),
    }  # fmt: skip


def _warm_until_cached(s: Session, lines: list[str]) -> Counter[str]:
    """Warm-up passes until one costs the origin no GET (at most three; one for a target
    that caches nothing, whose every pass goes to the origin); the last pass's failed
    reads, by why."""
    failed: Counter[str] = Counter()
    for _ in range(3 if s.target.caches else 1):
        before = s.bench.origin.counts().get("GET", 0)
        limit = max(300.0, SECONDS_PER_OBJECT * len(lines))
        failed = warm(s.target.endpoints[0], lines, time.monotonic() + min(limit, s.remaining()))
        if s.bench.origin.counts().get("GET", 0) == before:
            break
    return failed


def capacity(s: Session) -> list[Row]:
    scale = s.bench.scale
    rows = []
    for phase in PHASES:
        if s.bench.phases and phase.name not in s.bench.phases:
            continue
        objects = _objects(s, phase)
        if not objects or (phase.header_signed and not s.target.hoard_api):
            continue  # nginx verifies no signature: its presigned phase is the comparison
        if phase.wide:
            s.allow(SECONDS_PER_OBJECT * len(objects))
        sign = header_signed if phase.header_signed else presigned_paths
        started = time.monotonic()
        lines = sign(s, objects)
        failed = _warm_until_cached(s, lines)
        statuses = cache_statuses(s.target.endpoints[0], lines)
        setup = time.monotonic() - started
        tag = phase.name.replace(" ", "-")

        def run(lines: list[str] = lines, phase: Phase = phase, tag: str = tag) -> dict:
            runs = [run_wrk(s, lines, phase.connections, scale.wrk_seconds, tag)
                    for _ in range(scale.wrk_repeats)]  # fmt: skip
            return _summarise(runs, phase.connections)

        row = s.measure(phase.name, run, generator="wrk")
        row.extra["keys"] = len(objects)  # what wrk cycles through
        row.extra["setup_s"] = round(setup, 1)  # signing, warm-up and status passes
        why = ", ".join(f"{reason} {count}" for reason, count in failed.most_common())
        notes = [f"{failed.total()} warm-up reads failed ({why})"] if failed else []
        if set(statuses) != {"-"}:
            row.extra["cache_status"] = " ".join(f"{k} {v}" for k, v in sorted(statuses.items()))
        if len(s.target.endpoints) > 1:
            notes.append("wrk drives the first node only")
        row.note = "; ".join(notes)
        rows.append(row)
    return rows
