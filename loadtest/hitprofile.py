"""``python -m loadtest hitprofile``: where the CPU of one warm hit goes, stage by stage.

The capacity workload (``wrkload.py``) says what a whole hit costs the server;
this says where it goes. It builds the real application in this process
(``wiring.build`` from a config as ``hoard serve`` reads it, over a POSIX
origin, so no S3 server is needed), warms every object over real HTTP, and
then calls the wire's own entry, ``HitPath.answer_now``, many times in a row
with requests parsed as the wire parses a plain head (``core/heads.py``) and a real transport (a socket pair
drained by ``cat`` in another process, so the send's system calls are paid as
a connection pays them). Each stage's real function is wrapped by a timer
(``thread_time_ns`` before and after; instance attributes shadowing the
methods, so nothing of the code under test is changed):

| stage | what is timed |
|---|---|
| parse | the wire's split and parse of the request's bytes (timed alone: compiled, or Python with ``HOARD_NO_EXTENSIONS=1``), and ``_plain_message`` |
| signature | ``Authenticator.authenticate`` (a presigned URL's verdict memo included), or the front's kept verdict on a presigned read (``S3Front._kept_read``) |
| admission | ``HitPath._admitted`` less the signature: request id, route, limits, ``Call`` |
| metadata | ``Reader.catch_up`` and the held metadata lookup, or the key's ticket (``read/tickets.py``) |
| block | ``Reader.held_now`` less the metadata: the block and the segment's trust |
| headers | ``HitPath._prepared``: the range read, the header block filled in |
| send | ``hit_bytes.write_now``: the transport's ``writelines`` (memory), or sendfile |
| accounting | the server's ``account_hit`` (``Metrics.hit_answered``, the access log), and the
  tally's flush to the series at the end of each loop turn (every 64 hits here) |
| glue | ``answer_now`` less all of the above: what binds them |

A timer costs about 0.1 µs per call; the row ``answer_now, unwrapped`` is
the same calls with no timer at all (``process_time``), the honest total. The
numbers are CPU microseconds of this process on a shared machine: the same
machine's other load makes each figure noisier, not systematically larger.

The whole request, parse to send, under wrk, is the capacity workload's
(``wrkload.py``: the server's utime + stime from ``/proc`` over the run, divided
by the requests answered), beside nginx, static files and the ``bare`` floor.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

BUCKET, HOST = "bench", "127.0.0.1:9"  # the Host the requests carry (signed for)
KEY, SECRET = "profile", "profile-secret-key"
STAGES = ("parse", "signature", "admission", "metadata", "block", "headers", "send",
          "accounting", "glue")  # fmt: skip
RANGE = "bytes=0-8388607"  # what s3torchconnector and DLIO ask of every object


@dataclass(frozen=True)
class Case:
    size: int  # bytes of each object
    tier: str  # "memory" or "segment" (packed disk segment, sendfile)
    signed: str  # "presigned" or "header"
    ranged: bool = False

    @property
    def name(self) -> str:
        extra = " range" if self.ranged else ""
        return f"{self.size // 1024}k {self.tier} {self.signed}{extra}"


CASES = (
    Case(4096, "memory", "presigned"),
    Case(4096, "memory", "header"),
    Case(131072, "memory", "presigned"),
    Case(131072, "memory", "header"),
    Case(4096, "segment", "presigned"),
    Case(131072, "segment", "presigned"),
    Case(131072, "segment", "header"),
    Case(131072, "memory", "presigned", ranged=True),
    Case(131072, "segment", "presigned", ranged=True),
)


def config(
    workdir: Path, origin: Path, tier: str, port: int = 1, hit_keys: int | None = None
) -> dict[str, Any]:
    """A Hoard config over ``origin`` whose hits come from ``tier`` (``hit_keys``: the
    hot sets' size, ``cache.hit_keys``; None: the defaults)."""
    cache: dict[str, Any] = {"dir": str(workdir / f"cache-{tier}")}
    if hit_keys is not None:
        cache["hit_keys"] = hit_keys
    if tier == "memory":
        cache["memory_item_max_on_disk"] = "1MiB"  # a 128 KiB block stays in memory too
    else:
        cache["memory"] = 0
    return {
        "listen": f"127.0.0.1:{port}",
        "log_level": "warning",
        "access_log": False,  # as the capacity workload runs it (and nginx's is off)
        "cache": cache,
        "credentials": [{"access_key": KEY, "secret_key": SECRET}],
        "origins": {"files": {"type": "posix", "path": str(origin)}},
        "default_origin": "files",
        "mounts": [{"bucket": BUCKET, "origin": "files", "metadata_ttl": "forever",
                    "readonly": True}],
    }  # fmt: skip


def write_objects(origin: Path, sizes: tuple[int, ...], count: int) -> dict[int, list[str]]:
    """``count`` objects of each size under ``origin`` (the mount's whole tree): their keys."""
    keys: dict[int, list[str]] = {}
    for size in sizes:
        folder = origin / f"{size // 1024}k"
        folder.mkdir(parents=True, exist_ok=True)
        keys[size] = []
        for i in range(count):
            (folder / f"obj-{i:05d}").write_bytes(os.urandom(size))
            keys[size].append(f"{size // 1024}k/obj-{i:05d}")
    return keys


def presigned(keys: list[str], host: str) -> list[tuple[str, dict[str, str]]]:
    """A presigned GET of each key, as boto3 makes it: (path and query, headers)."""
    import boto3
    from botocore.config import Config

    client = boto3.client("s3", endpoint_url=f"http://{host}", region_name="us-east-1",
                          aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                          config=Config(signature_version="s3v4", s3={"addressing_style": "path"}))  # fmt: skip
    out = []
    for key in keys:
        url = client.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": key},
                                            ExpiresIn=3600)  # fmt: skip
        parts = urlsplit(url)
        out.append((f"{parts.path}?{parts.query}", {}))
    return out


def header_signed(keys: list[str], host: str) -> list[tuple[str, dict[str, str]]]:
    """A header-signed SigV4 GET of each key, as boto3 sends it."""
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    signer = S3SigV4Auth(Credentials(KEY, SECRET), "s3", "us-east-1")
    out = []
    for key in keys:
        request = AWSRequest(method="GET", url=f"http://{host}/{BUCKET}/{key}")
        signer.add_auth(request)
        wanted = ("Authorization", "X-Amz-Date", "X-Amz-Content-SHA256")
        out.append((f"/{BUCKET}/{key}", {name: request.headers[name] for name in wanted}))
    return out


def raw_request(target: str, headers: dict[str, str], host: str, ranged: bool) -> bytes:
    lines = [f"GET {target} HTTP/1.1", f"Host: {host}", "User-Agent: profile", "Accept: */*"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    if ranged:
        lines.append(f"Range: {RANGE}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


CLOCK = time.thread_time_ns  # CPU time of this thread: a neighbour's load does not count


class Timers:
    """CPU nanoseconds spent in each wrapped function, by stage, and the calls timed."""

    def __init__(self) -> None:
        self.ns: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()

    def wrap(self, stage: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        ns, calls, clock = self.ns, self.calls, CLOCK

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                ns[stage] += clock() - started
                calls[stage] += 1

        return timed


def timer_cost(n: int = 20_000) -> tuple[float, float]:
    """What one timer adds, in ns: inside its own reading (counted in its stage), and in
    all (the rest lands in the caller's stage); subtracted from the table's figures."""
    timers = Timers()
    timed = timers.wrap("x", lambda: None)
    started = CLOCK()
    for _ in range(n):
        timed()
    whole = (CLOCK() - started) / n
    started = CLOCK()
    for _ in range(n):
        (lambda: None)()
    bare = (CLOCK() - started) / n
    return timers.ns["x"] / n, whole - bare


@contextlib.contextmanager
def instrumented(app: Any, timers: Timers) -> Iterator[None]:
    """Timers around the hit path's stages of ``app`` (instance attributes; removed after)."""
    from gateway.app.server import HIT_PATH
    from gateway.s3 import hits as hits_module

    hits = app[HIT_PATH]
    reader = hits._reader
    auth = hits._front._auth
    patched = [
        (auth, "authenticate", "signature"),
        (hits._front, "_kept_read", "signature"),
        (hits, "_admitted", "admitted"),
        (reader, "catch_up", "metadata"),
        (reader, "_held_entry", "metadata"),
        (reader._tickets, "valid", "metadata"),
        (reader, "held_now", "lookup"),
        (hits, "_prepared", "headers"),
        (hits, "_head", "headers"),
        (hits._metrics, "hit", "accounting"),
        (hits, "_account", "accounting"),
    ]
    own = [(obj, name, vars(obj).get(name)) for obj, name, _ in patched]  # instance attributes
    for obj, name, stage in patched:
        setattr(obj, name, timers.wrap(stage, getattr(obj, name)))
    originals = {name: getattr(hits_module, name) for name in ("write_now", "_plain_message")}
    hits_module.write_now = timers.wrap("send", originals["write_now"])
    hits_module._plain_message = timers.wrap("parse", originals["_plain_message"])
    try:
        yield
    finally:
        for obj, name, kept in reversed(own):
            if kept is not None:
                setattr(obj, name, kept)
            elif name in vars(obj):
                delattr(obj, name)
        for name, fn in originals.items():
            setattr(hits_module, name, fn)


async def _drained(transport: asyncio.Transport) -> None:
    while transport.get_write_buffer_size():
        await asyncio.sleep(0)


def stage_table(timers: Timers, total_ns: int, n: int) -> dict[str, float]:
    """CPU µs per hit by stage, from the wrapped timers of ``n`` hits, less the timers' own."""
    inner, whole = timer_cost()
    ns = Counter({k: v - inner * timers.calls[k] for k, v in timers.ns.items()})
    ns["parse_c"] = timers.ns["parse_c"]
    total_ns -= int(whole * sum(timers.calls.values()))
    # A nested timer's whole cost lands in the stage around it.
    ns["admitted"] -= (whole - inner) * timers.calls["signature"]
    ns["lookup"] -= (whole - inner) * timers.calls["metadata"]
    row = {
        "parse": ns["parse_c"] + ns["parse"],
        "signature": ns["signature"],
        "admission": ns["admitted"] - ns["signature"],
        "metadata": ns["metadata"],
        "block": ns["lookup"] - ns["metadata"],
        "headers": ns["headers"],
        "send": ns["send"],
        "accounting": ns["accounting"],
    }
    inside = sum(v for k, v in row.items() if k != "parse") + ns["parse"]
    row["glue"] = total_ns - inside
    return {k: v / n / 1000 for k, v in row.items()}


async def profile_case(
    app: Any, case: Case, requests: list[bytes], n: int, rounds: int = 5
) -> dict[str, float]:
    """Per-stage CPU µs of ``n`` wire hits of ``case`` (cycling over ``requests``)."""
    from aiohttp.http_parser import HttpRequestParser

    from gateway.app.server import HIT_PATH
    from gateway.core.heads import bodiless_heads, parse_head

    hits = app[HIT_PATH]
    loop = asyncio.get_running_loop()
    parser = HttpRequestParser(object(), loop, 2**16, max_line_size=8190, max_field_size=8190)  # type: ignore[arg-type]
    messages = [parse_head(raw) for raw in requests]  # as the wire parses a plain head
    started = CLOCK()
    for i in range(n):  # the wire's split and parse alone, on the same bytes
        for head in bodiless_heads(requests[i % len(requests)]) or ():
            parse_head(head)
    parse_ns = CLOCK() - started
    started = CLOCK()
    for i in range(n):  # aiohttp's C parser, which parses whatever is not plain
        parser.feed_data(requests[i % len(requests)])
    aiohttp_ns = CLOCK() - started
    ours, theirs = socket.socketpair()
    drain = subprocess.Popen(["cat"], stdin=theirs, stdout=subprocess.DEVNULL)
    theirs.close()
    transport, _ = await loop.create_connection(asyncio.Protocol, sock=ours)
    try:
        sockfd = ours.fileno()
        assert hits.answer_now(messages[0], transport, sockfd), f"{case.name}: not a wire hit"
        await _drained(transport)
        # Rounds alternate the plain and the timed loop; the quietest round of each is
        # kept (a neighbour's load only ever adds, so the least is the closest).
        plain: list[tuple[float, float]] = []
        stages: list[dict[str, float]] = []
        per_round = max(1, n // rounds)
        # Each round goes on where the last stopped: over more objects than a round asks,
        # every one is asked in turn (``--objects`` past the hot sets: none is kept).
        for at in range(0, 2 * rounds * per_round, 2 * per_round):
            plain.append(await _round(hits, messages, transport, sockfd, per_round, None, at))
            timers = Timers()
            timers.ns["parse_c"] = parse_ns * per_round // n
            with instrumented(app, timers):
                total, _ = await _round(hits, messages, transport, sockfd, per_round, timers,
                                        at + per_round)  # fmt: skip
            row = stage_table(timers, int(total * per_round * 1000), per_round)
            stages.append({**row, "answer_now, timed": total})
        results = min(stages, key=lambda row: row["answer_now, timed"])
        results["answer_now, unwrapped"] = min(p[0] for p in plain)
        results["answer_now, process CPU"] = min(p[1] for p in plain)
        again = [await _again_round(hits, requests, transport, sockfd, per_round)
                 for _ in range(rounds)]  # fmt: skip
        results["answer_again (express lane)"] = min(again)
        results["parse (the wire's)"] = parse_ns / n / 1000
        results["parse (aiohttp's C parser)"] = aiohttp_ns / n / 1000
        return results
    finally:
        transport.abort()
        await asyncio.sleep(0)  # the transport lets go of the socket on the loop's next turn
        drain.kill()  # ends the drain whatever it holds (started here, by its own handle)
        drain.wait(timeout=10)


async def _round(
    hits: Any, messages: list[Any], transport: asyncio.Transport, sockfd: int, n: int,
    timers: Timers | None, start: int = 0,
) -> tuple[float, float]:  # fmt: skip
    """``n`` wire hits (timed stage by stage if ``timers``), from ``messages[start]`` on:
    CPU µs per hit of this thread and of the process, the loop turns' flushes of the
    accounting included."""
    return await _answered(hits, lambda m: hits.answer_now(m, transport, sockfd), messages,
                           transport, n, timers, start)  # fmt: skip


async def _again_round(
    hits: Any, requests: list[bytes], transport: asyncio.Transport, sockfd: int, n: int
) -> float:
    """CPU µs per hit of ``n`` repeats answered by the express lane (``s3/express.py``),
    cycling over ``requests`` as sent (each kept by a wire answer first); NaN where the
    lane keeps none."""
    from gateway.core.heads import parse_head

    for raw in requests:
        hits.answer_now(parse_head(raw), transport, sockfd)
        await _drained(transport)

    def again(head: bytes) -> bool:
        return hits.answer_again(head, transport, sockfd)

    if not again(requests[0]):
        return float("nan")
    return (await _answered(hits, again, requests, transport, n, None))[0]


async def _answered(
    hits: Any, answer: Callable[[Any], bool], items: list[Any], transport: asyncio.Transport,
    n: int, timers: Timers | None, start: int = 0,
) -> tuple[float, float]:  # fmt: skip
    """``answer`` of ``n`` of ``items`` in turn from ``items[start]``, each a hit answered
    on the wire: CPU µs per hit of this thread and of the process, the transport drained
    as a client would, and the accounting flushed at each 64th (a loop turn's end: its
    counts reach their series), its time the accounting's stage if ``timers``."""
    total_ns = cpu_ns = 0
    for i in range(n):
        item = items[(start + i) % len(items)]
        cpu, started = time.process_time_ns(), CLOCK()
        answered = answer(item)
        total_ns += CLOCK() - started
        cpu_ns += time.process_time_ns() - cpu
        assert answered, f"request {i} was not answered on the wire"
        if transport.get_write_buffer_size():
            await _drained(transport)
        if i % 64 == 63:
            started = CLOCK()
            hits._metrics.flush()
            flushed = CLOCK() - started
            total_ns += flushed
            if timers is not None:
                timers.ns["accounting"] += flushed
    return total_ns / n / 1000, cpu_ns / n / 1000


async def warm(port: int, requests: list[bytes], tier: str) -> None:
    """Every request once over HTTP, then again until each is answered on the wire's way."""
    for _ in range(2):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for raw in requests:
            writer.write(raw)
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith((b"HTTP/1.1 200", b"HTTP/1.1 206")), head + await reader.read(
                400
            )
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))  # fmt: skip
            await reader.readexactly(length)
        writer.close()
        await asyncio.sleep(0.2)  # fills land in the tier a moment after the answer


@contextlib.asynccontextmanager
async def serving(
    workdir: Path, origin: Path, tier: str, hit_keys: int | None = None
) -> AsyncIterator[tuple[Any, int]]:
    """The application over ``origin`` with hits from ``tier`` (hot sets of ``hit_keys``:
    ``config``), listening on a loopback port, as ``hoard serve`` builds it: (app, port)."""
    from aiohttp import web

    from gateway.app import wiring
    from gateway.app.cli import settle_collector
    from gateway.config.load import build_settings

    app = wiring.build(build_settings(config(workdir, origin, tier, hit_keys=hit_keys)))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = web.SockSite(runner, _listening())
        await site.start()
        settle_collector()  # as ``hoard serve`` does once its application is built
        yield app, site._sock.getsockname()[1]  # type: ignore[union-attr]
    finally:
        await runner.cleanup()


def requests_for(case: Case, keys: list[str], host: str) -> list[bytes]:
    """A GET of each of ``keys``, signed as ``case`` says, as sent to ``host``."""
    sign = presigned if case.signed == "presigned" else header_signed
    return [raw_request(t, h, host, case.ranged) for t, h in sign(keys, host)]


async def profile_tier(workdir: Path, origin: Path, keys: dict[int, list[str]], tier: str,
                       cases: list[Case], n: int) -> dict[str, dict[str, float]]:  # fmt: skip
    out = {}
    async with serving(workdir, origin, tier) as (app, port):
        for case in cases:
            requests = requests_for(case, keys[case.size], f"127.0.0.1:{port}")
            await warm(port, requests, tier)
            out[case.name] = await profile_case(app, case, requests, n)
            print(f"  {case.name}: {out[case.name]['answer_now, unwrapped']:.1f} µs", flush=True)
    return out


def _listening() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock


def print_table(results: dict[str, dict[str, float]]) -> None:
    names = list(results)
    rows = [*STAGES, "answer_now, timed", "answer_now, unwrapped", "answer_now, process CPU",
            "answer_again (express lane)",
            "parse (the wire's)", "parse (aiohttp's C parser)"]  # fmt: skip
    width = max(len(n) for n in names) + 2
    print(f"{'CPU µs per hit':<26}" + "".join(f"{n:>{width}}" for n in names))
    for row in rows:
        cells = "".join(f"{results[n].get(row, 0.0):>{width}.2f}" for n in names)
        print(f"{row:<26}{cells}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest hitprofile", description=__doc__)
    p.add_argument("-n", type=int, default=20_000, help="hits timed per case")
    p.add_argument("--objects", type=int, default=200, help="objects of each size")
    p.add_argument("--cases", default="", help="comma list of case names (default: all)")
    args = p.parse_args(argv)
    wanted = [c for c in CASES if not args.cases or c.name in args.cases.split(",")]
    workdir = Path(tempfile.mkdtemp(prefix="hitprofile-"))
    try:
        origin = workdir / "origin"
        keys = write_objects(origin, (4096, 131072), args.objects)
        _event_loop()
        results: dict[str, dict[str, float]] = {}
        for tier in ("memory", "segment"):
            cases = [c for c in wanted if c.tier == tier]
            if cases:
                results |= asyncio.run(profile_tier(workdir, origin, keys, tier, cases, args.n))
        print_table(results)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


def _event_loop() -> None:
    """uvloop, as ``hoard serve`` runs (its transports are the ones a hit writes to)."""
    try:
        import uvloop
    except ImportError:
        print("uvloop missing: asyncio's loop is profiled", file=sys.stderr)
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
