"""``python -m loadtest stall [--code DIR] [--blocks N]``: origin GETs per block, with and without a stall.

What it answers: does hedging turn a slow origin into a stampede? moto behind
the test suite's fault-injecting proxy (``tests/origin_proxy.py``, which counts
every origin request), one Hoard process with hedging on (``hedge_after``
200 ms, ``read_timeout`` 1 s, ``deadline`` 3 s, so a stall runs into hedges,
timeouts and retries within seconds), ``--blocks`` single-block objects read
at once by as many clients that never retry. Two passes, each on fresh keys
(cold): the origin healthy, then every origin GET held until the pass ends
(``hang``: no headers; every client gets a 503 at the deadline). Each prints
origin GETs per block and what the clients got; a stampede shows as several
GETs per block in the stalled pass (6 before hedges were bounded). ``--code``
runs another checkout's gateway, so one run gives "before" and another
"after" on the same harness.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from loadtest.faultrun import REPO, Node, _get, moto_behind_proxy, origin_config

sys.path.insert(0, str(REPO))
from tests.origin_proxy import Fault, OriginProxy

BLOCK = 256 * 1024
BUCKET = "stall"


def one_pass(node: Node, proxy: OriginProxy, s3: Any, name: str, blocks: int, stall: bool) -> str:
    """Read ``blocks`` cold single-block objects at once; the row of GETs per block."""
    keys = [f"{name}/{i:03d}" for i in range(blocks)]
    for key in keys:
        s3.put_object(Bucket=BUCKET, Key=key, Body=os.urandom(BLOCK - 1000))
    proxy.reset()
    if stall:
        proxy.faults = lambda number, path, byte_range: Fault("hang")
    try:
        answers = asyncio.run(_all([f"{node.url}/{BUCKET}/{key}" for key in keys]))
    finally:
        proxy.faults = None
        if stall:  # (a release with nothing held would let the next hang through)
            proxy.release()
    gets = proxy.counts["GetObject"]
    statuses = ", ".join(f"{n} x {status}" for status, n in sorted(Counter(answers).items()))
    what = "every origin GET hangs" if stall else "origin healthy"
    return f"| {what} | {blocks} | {gets} | {gets / blocks:.2f} | {statuses} |"


async def _all(urls: list[str]) -> list[int]:
    return [status for status, _ in await asyncio.gather(*(_get(url) for url in urls))]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest stall", description=__doc__.split("\n")[0])
    p.add_argument("--code", type=Path, default=REPO, help="checkout whose gateway runs")
    p.add_argument("--blocks", type=int, default=16)
    args = p.parse_args(argv)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's line per request
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)  # the proxy's cut hangs
    rows = [f"## stall run: {args.code}", "",
            "| origin | blocks | origin GETs | GETs per block | clients got |", "|---|---|---|---|---|"]  # fmt: skip
    with moto_behind_proxy() as (proxy, s3), tempfile.TemporaryDirectory() as scratch:
        s3.create_bucket(Bucket=BUCKET)
        config = {**origin_config(proxy, read_timeout="1s",
                                  retry={"hedge_after": "200ms", "deadline": "3s"}),
                  "cache": {"block_size": "256KiB", "read_ahead": 0}}  # fmt: skip
        node = Node(args.code, Path(scratch), config)
        try:
            for name, stall in (("healthy", False), ("stalled", True)):
                rows.append(one_pass(node, proxy, s3, name, args.blocks, stall))
                print(rows[-1], flush=True)
        finally:
            node.stop()
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
