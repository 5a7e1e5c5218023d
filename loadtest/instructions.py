"""``python -m loadtest instructions``: machine instructions per warm hit, counted, not timed.

On a shared 2-core machine the same build measured 46-80 µs a 4 KiB hit within
an hour: a change worth 5 % cannot be seen in time. Instructions executed are
the same from run to run. This runs each case of ``hitprofile.py`` (the real
application in one process, over a POSIX origin, every object warmed over real
HTTP) under valgrind's callgrind, with counting switched on only inside one
``functools.reduce`` that answers ``-n`` hits in a row, and prints the
instructions per hit, for the hit path (``HitPath.answer_now``, requests
parsed as the wire parses them) and for the express lane's repeats
(``HitPath.answer_again``, the requests' bytes as sent).

The transport is a sink that keeps nothing (``Sink``): what is counted is
Hoard's own work, not the kernel's copy (which is the same for every server:
``loadtest/results/example-capacity-lane.md``, "Where the gap is"). Every
64th hit the per-turn work is done, as a loop turn's end does it: the tally's
flush to the metric series and the reader's deferred bookkeeping.

Instructions are not time: a cache miss costs more than an instruction, and
compiled code does more per instruction. The capacity workload's CPU per
request, beside nginx, stays the target; this is the instrument for the
changes that move it by less than the machine's noise. Needs ``valgrind``
(``apt-get install valgrind``); about a minute per case.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loadtest import hitprofile as hp

CASES = ("4k memory presigned", "4k memory header", "128k segment presigned")
ENTRIES = ("answer_now", "answer_again")


class Sink:
    """A transport that takes every write and keeps none of it."""

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def write(self, data: Any) -> None:
        pass

    def writelines(self, data: Any) -> None:
        pass


async def _inner(
    case_name: str, entry: str, n: int, objects: int = 100, hit_keys: int | None = None
) -> None:
    """Build, warm, then ``n`` hits of ``entry`` inside ``functools.reduce``: the only
    frame callgrind counts (``--toggle-collect=functools_reduce``); over ``objects``
    objects, with hot sets of ``hit_keys`` (None: the defaults)."""
    from gateway.app.server import HIT_PATH
    from gateway.core.heads import parse_head

    (case,) = [c for c in hp.CASES if c.name == case_name]
    workdir = Path(tempfile.mkdtemp(prefix="instructions-"))
    try:
        origin = workdir / "origin"
        keys = hp.write_objects(origin, (case.size,), objects)[case.size]
        async with hp.serving(workdir, origin, case.tier, hit_keys) as (app, port):
            requests = hp.requests_for(case, keys, f"127.0.0.1:{port}")
            await hp.warm(port, requests, case.tier)
            _count_hits(app[HIT_PATH], requests, [parse_head(raw) for raw in requests],
                        entry, n)  # fmt: skip
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _count_hits(hits: Any, requests: list[bytes], heads: list[Any], entry: str, n: int) -> None:
    """``n`` hits of ``entry`` in a row, inside the ``functools.reduce`` callgrind counts;
    ``requests`` as sent, ``heads`` as the wire parses them."""
    sink = Sink()
    for head in heads:  # each answered once on the wire: the lane keeps it
        assert hits.answer_now(head, sink, None)
    answer: Callable[[int], bool]
    if entry == "answer_now":
        answer = lambda i: hits.answer_now(heads[i % len(heads)], sink, None)  # noqa: E731
    else:
        answer = lambda i: hits.answer_again(requests[i % len(requests)], sink, None)  # noqa: E731
    reader = hits._reader

    def step(answered: int, i: int) -> int:
        answered += answer(i)
        if i % 64 == 63:  # what a loop turn's end does for the hits answered in it
            if reader._later:
                reader._serve_later()
            hits._metrics.flush()
        return answered

    for i in range(256):  # warm the interpreter's caches, as a server's first hits do
        step(0, i)
    answered = functools.reduce(step, range(n), 0)
    assert answered == n, f"{n - answered} of {n} hits were not answered on the wire"


def count(case: str, entry: str, n: int, objects: int = 100, hit_keys: int | None = None) -> float:
    """Instructions per hit of ``entry`` in ``case``, from two callgrind runs (``n`` hits
    and none), so that what the reduce itself costs apart from the hits cancels; over
    ``objects`` objects, with hot sets of ``hit_keys`` (``--objects``, ``--hit-keys``)."""

    def counted(hits: int) -> int:
        with tempfile.TemporaryDirectory() as scratch:
            out = Path(scratch) / "callgrind.out"
            command = ["valgrind", "--tool=callgrind", "--collect-atstart=no",
                       "--toggle-collect=functools_reduce", f"--callgrind-out-file={out}",
                       sys.executable, "-m", "loadtest.instructions", "--inner", case, entry,
                       str(hits), "--objects", str(objects),
                       "--hit-keys", str(hit_keys or 0)]  # fmt: skip
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            if done.returncode != 0 or not out.exists():
                raise RuntimeError(f"callgrind failed for {case} {entry}: {done.stderr[-2000:]}")
            found = re.search(r"^(?:summary|totals):\s*(\d+)", out.read_text(), re.MULTILINE)
            if found is None:
                raise RuntimeError(f"no instruction total in callgrind's output for {case}")
            return int(found.group(1))

    return (counted(n) - counted(0)) / n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest instructions", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("-n", type=int, default=5000, help="hits counted per case and entry")
    p.add_argument("--cases", default=",".join(CASES),
                   help=f"comma list of hitprofile's case names (default: {', '.join(CASES)})")  # fmt: skip
    p.add_argument("--objects", type=int, default=100, help="objects of the case's size")
    p.add_argument("--hit-keys", type=int, default=0,
                   help="the hot sets' size (cache.hit_keys; 0: the defaults). Fewer than "
                        "--objects counts the hits of a dataset wider than the sets, which "
                        "keep none of it (the express lane's column is then empty)")  # fmt: skip
    p.add_argument("--inner", nargs=3, metavar=("CASE", "ENTRY", "N"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    hit_keys = args.hit_keys or None
    if args.inner:
        case, entry, n = args.inner
        hp._event_loop()
        asyncio.run(_inner(case, entry, int(n), args.objects, hit_keys))
        return 0
    known = {c.name for c in hp.CASES}
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in known]
    if unknown:
        print(f"unknown cases: {', '.join(unknown)} (known: {', '.join(sorted(known))})")
        return 2
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt-get install valgrind)", file=sys.stderr)
        return 2
    wide = hit_keys is not None and args.objects > hit_keys  # no repeat is kept
    print(f"{'instructions per hit':<28}" + "".join(f"{e:>16}" for e in ENTRIES))
    for case in cases:
        counts = [None if wide and entry == "answer_again" else
                  count(case, entry, args.n, args.objects, hit_keys) for entry in ENTRIES]  # fmt: skip
        cells = "".join(f"{'-':>16}" if c is None else f"{c:>16,.0f}" for c in counts)
        print(f"{case:<28}{cells}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
