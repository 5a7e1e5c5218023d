"""What a hot set loses when eviction reclaims whole segments: measured against per-block LRU.

The disk tier packs small blocks into segments and evicts whole segments by
their last use (``gateway/cache/segment_sql.py``); the live blocks of an
evicted segment are dropped, not re-appended (``disk_packed.py``). That can
cost a hot block only if its segment is the least recently used one, which
means no block of it was read since everything else was last read: then a
per-block LRU of the same bytes would have kept the block only if that block
were the newest of its segment-mates to be read, and no newer than the rest of
the cache. This measures the difference instead of arguing it.

The pattern: a scan of ``--scan`` times the capacity in new blocks, each
stored once and never read again, and a hot set of blocks read at random,
one hot read after every ``--every`` scan blocks, interleaved from the start
(so the hot blocks are scattered over many segments, each among cold
neighbours). A hot read that misses stores the block again, as a gateway
would. The hot set is sized so its mean reuse distance (the scan bytes written
between two reads of one hot block) is a given share of the capacity
(``--reuse``); reads are uniform, so reuse distances spread around that mean
and even a per-block LRU misses some at 0.5.

Reported per reuse share: the hot hit ratio through the real ``DiskTier``
(segments, 1/32 of the capacity each: the coarsest the tier makes them) and
through a per-block LRU of the same capacity fed the same trace.

    python -m loadtest.hotset [--capacity 32MiB] [--reuse 0.25 0.5 1.0 1.5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
from collections import OrderedDict
from pathlib import Path

from gateway.cache.block import HEADER_SIZE, BlockId
from gateway.cache.disk import DiskTier
from gateway.config.settings import parse_size

SIZE = 4096
RECORD = HEADER_SIZE + SIZE
BATCH = 32  # blocks stored at once: the tier's group commit sees a gateway's concurrency


def trace(capacity: int, reuse: float, every: int, scan: float, seed: int) -> list[tuple[str, int]]:
    """The accesses in order: ("scan", i) stores block i; ("hot", j) reads hot block j."""
    rng = random.Random(seed)
    blocks = capacity // RECORD
    hot = max(1, int(reuse * blocks / every))  # reads of one hot block are hot*every apart
    steps: list[tuple[str, int]] = []
    for i in range(int(scan * blocks)):
        steps.append(("scan", i))
        if i % every == 0:
            steps.append(("hot", rng.randrange(hot)))
    return steps


def block_lru(steps: list[tuple[str, int]], capacity: int) -> float:
    """The hot hit ratio of a per-block LRU holding ``capacity`` bytes of records."""
    held: OrderedDict[tuple[str, int], None] = OrderedDict()
    slots = capacity // RECORD
    hits = reads = 0
    for step in steps:
        if step[0] == "hot":
            reads += 1
            if step in held:
                hits += 1
                held.move_to_end(step)
                continue
        held[step] = None
        if len(held) > slots:
            held.popitem(last=False)
    return hits / reads


async def segment_lru(steps: list[tuple[str, int]], capacity: int) -> float:
    """The hot hit ratio through a packed ``DiskTier`` holding ``capacity`` bytes."""
    with tempfile.TemporaryDirectory() as directory:
        tier = DiskTier(Path(directory), capacity, packed_max=64 << 10)
        await tier.start()
        try:
            hits = reads = 0
            for start in range(0, len(steps), BATCH):
                puts = []
                for kind, number in steps[start : start + BATCH]:
                    block = BlockId("origin", "b", f"{kind}{number}", "e", 0)
                    if kind == "hot":
                        reads += 1
                        found = await tier.get(block)
                        if found is not None:
                            found.close()
                            hits += 1
                            continue
                    puts.append(block)
                await asyncio.gather(*(tier.put(b, bytes(SIZE)) for b in puts))
            return hits / reads
        finally:
            await tier.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--capacity", type=parse_size, default=parse_size("32MiB"))
    parser.add_argument("--reuse", type=float, nargs="+", default=[0.25, 0.5, 1.0, 1.5])
    parser.add_argument("--every", type=int, default=2)
    parser.add_argument("--scan", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    for reuse in args.reuse:
        steps = trace(args.capacity, reuse, args.every, args.scan, args.seed)
        row = {"reuse": reuse,
               "hot_hit_ratio_segments": round(asyncio.run(segment_lru(steps, args.capacity)), 3),
               "hot_hit_ratio_block_lru": round(block_lru(steps, args.capacity), 3)}  # fmt: skip
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
