"""Hoard's own CPU per cold small object, against an origin that costs next to nothing.

``smallobjects.py`` measures what a reader sees, behind moto: there the origin
(one core at most, its GIL) bounds every epoch, and its CPU per request moves
the ratios by ±10 % between epochs. This measures the cache alone: the origin
is nginx serving the objects as files (path-style GETs answered from disk,
ranges honoured, signatures ignored; ``nginx-static.conf``), so the cold epoch
is bound by Hoard, and its CPU per object (the process tree, every thread) is
the number to compare between two versions of the code. Each round starts a
fresh, empty Hoard: one shuffled cold epoch of ranged GETs (``bytes=0-8388607``,
as s3torchconnector asks) through presigned URLs, then one warm epoch.

Not measured here: origin requests (nothing counts them; ``smallobjects.py``
does), nor anything a real origin's latency changes.

Run: ``python -m loadtest.coldcost --objects 5000 --size 4096 --rounds 3``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from loadtest.datasets import BUCKET as PROBE_BUCKET
from loadtest.procs import Pinning, cpu_seconds, stop_process, tree
from loadtest.smallobjects import BUCKET, epoch, presign, start_hoard
from loadtest.targets import HOARD_KEY, HOARD_SECRET, Context, Nginx


def write_objects(root: Path, count: int, size: int) -> list[str]:
    """``count`` files of ``size`` random bytes as ``root/BUCKET/key``; their keys."""
    keys = [f"train/{i:07d}.jpg" for i in range(count)]
    for key in keys:
        path = root / BUCKET / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))
    probe = root / PROBE_BUCKET / "probe"  # what the static target's start-up asks for
    probe.parent.mkdir(parents=True, exist_ok=True)
    probe.write_bytes(b"probe")
    return keys


def static_origin(workdir: Path, root: Path) -> Nginx:
    dataset = SimpleNamespace(local_root=root, images=[SimpleNamespace(key="probe")])
    ctx = Context("", dataset, workdir, Pinning(enabled=False), 0)  # type: ignore[arg-type]
    origin = Nginx("origin", ctx, static=True)
    origin.start()
    return origin


def measure(
    origin: str, keys: list[str], args: argparse.Namespace, workdir: Path
) -> dict[str, Any]:
    """One cold and one warm epoch of a fresh Hoard: objects/s and its CPU µs per object."""
    proc, endpoint = start_hoard(workdir / "hoard", origin, 1 << 30, args.workers)
    row: dict[str, Any] = {}
    try:
        urls = presign(endpoint, keys, HOARD_KEY, HOARD_SECRET)
        pids = tree([proc.pid])
        for phase in ("cold", "warm"):
            before = cpu_seconds(pids)
            row[phase] = asyncio.run(epoch(urls, args.concurrency, args.seed))
            spent = cpu_seconds(pids) - before
            row[phase]["hoard_cpu_us_per_object"] = round(spent * 1e6 / len(keys))
    finally:
        stop_process(proc, 15)
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=5000)
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workdir", default="loadtest/results/coldcost")
    args = parser.parse_args(argv)
    workdir = Path(args.workdir).resolve()
    keys = write_objects(workdir / "root", args.objects, args.size)
    origin = static_origin(workdir / "origin", workdir / "root")
    rounds = []
    try:
        for number in range(args.rounds):
            rounds.append(measure(origin.endpoints[0], keys, args, workdir))
            print(f"round {number + 1}", json.dumps(rounds[-1]), flush=True)
    finally:
        origin.stop()
    cold = sorted(r["cold"]["hoard_cpu_us_per_object"] for r in rounds)
    print(json.dumps({"objects": args.objects, "size": args.size, "workers": args.workers,
                      "cold_cpu_us_per_object_median": cold[len(cold) // 2],
                      "rounds": rounds}, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
