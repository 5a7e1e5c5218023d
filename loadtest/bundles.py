"""Batch GET against single GETs: a cold and a warm epoch of small objects, per reader.

Readers, each against a fresh (cold) Hoard, same origin, same run:

- ``boto3``: one GET per object, ``--threads`` threads sharing one boto3 client;
- ``s3torch``: s3torchconnector's ``S3MapDataset`` (a GET per sample) in a
  ``DataLoader`` (``--loader-workers`` workers, batch ``--loader-batch``), when
  ``s3torchconnector`` and torch are installed;
- ``s3torch-nginx`` and ``boto3-nginx``: the same readers through nginx as an S3
  caching proxy (``targets.Nginx``, ``nginx-cache.conf``; as many nginx workers
  as CPUs, where Hoard runs one worker: the ratio is the conservative one);
  their "Hoard CPU" column is nginx's;
- ``bundle-loader``: ``gateway.client.torch.BundleDataset`` in the same
  ``DataLoader`` (each batch one ``POST ?bundle``);
- ``bundle-250``: ``gateway.client.bundle`` in this process, ``--bundle`` keys a request;
- ``direct``: ``boto3`` straight at the origin (no Hoard), the reference.

Per reader and epoch: objects/s, Hoard's CPU µs per object (its process
tree's CPU time before and after; before the warm epoch, the server is left
to finish what the cold one started, until a half second passes without a
tick of its CPU: ``settled_s``), the client's CPU µs per object (this
process's, and its reaped children's: a DataLoader's workers), origin GETs. Then the cold case over the
WAN-emulating origin (the counting proxy holding each request ``--rtt-ms``):
a single-threaded per-object cold read against a bundle of the same keys.

The machine these run on is usually shared: read ratios within one run, not
absolute numbers. Run: ``python -m loadtest.bundles --objects 2000``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from loadtest.datasets import ORIGIN_KEY, ORIGIN_SECRET
from loadtest.origin import Origin, diff_counts
from loadtest.procs import Pinning, cpu_seconds, stop_process, tree
from loadtest.smallobjects import BUCKET, seed, start_hoard
from loadtest.targets import HOARD_KEY, HOARD_SECRET, Context, Nginx

READERS = ("direct", "boto3", "boto3-nginx", "s3torch", "s3torch-nginx", "bundle-loader",
           "bundle-250")  # fmt: skip


def _boto3_epoch(endpoint: str, keys: list[str], creds: tuple[str, str], threads: int) -> None:
    import boto3
    from botocore.config import Config

    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id=creds[0], aws_secret_access_key=creds[1],
                          config=Config(s3={"addressing_style": "path"},
                                        max_pool_connections=threads))  # fmt: skip
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda k: client.get_object(Bucket=BUCKET, Key=k)["Body"].read(), keys))


def _s3torch_epoch(
    endpoint: str, keys: list[str], creds: tuple[str, str], args: argparse.Namespace
) -> None:
    from s3torchconnector import S3ClientConfig, S3MapDataset
    from torch.utils.data import DataLoader

    os.environ.update(AWS_ACCESS_KEY_ID=creds[0], AWS_SECRET_ACCESS_KEY=creds[1])
    dataset = S3MapDataset.from_objects(
        [f"s3://{BUCKET}/{k}" for k in keys], region="us-east-1", endpoint=endpoint,
        transform=_read_all, s3client_config=S3ClientConfig(force_path_style=True),
    )  # fmt: skip
    loader = DataLoader(dataset, batch_size=args.loader_batch, num_workers=args.loader_workers,
                        collate_fn=list)  # fmt: skip
    assert sum(len(batch) for batch in loader) == len(keys)


def _read_all(reader: Any) -> int:
    return len(reader.read())


def _length(key: str, data: bytes) -> int:
    """What the bundle loader hands the main process, as ``_read_all`` for s3torch: the
    bytes are read in the worker, and not pickled through the loader's queue after."""
    return len(data)


def _bundle_loader_epoch(endpoint: str, keys: list[str], args: argparse.Namespace) -> None:
    from torch.utils.data import DataLoader

    from gateway.client.torch import BundleDataset

    dataset = BundleDataset(BUCKET, keys, endpoint, _length, aws_access_key_id=HOARD_KEY,
                            aws_secret_access_key=HOARD_SECRET, region_name="us-east-1")  # fmt: skip
    loader = DataLoader(dataset, batch_size=args.loader_batch, num_workers=args.loader_workers,
                        collate_fn=list)  # fmt: skip
    assert sum(len(batch) for batch in loader) == len(keys)


def _bundle_epoch(endpoint: str, keys: list[str], size: int) -> None:
    from gateway.client.bundle import BundleClient

    client = BundleClient(endpoint, aws_access_key_id=HOARD_KEY,
                          aws_secret_access_key=HOARD_SECRET, region_name="us-east-1")  # fmt: skip
    for start in range(0, len(keys), size):
        batch = keys[start : start + size]
        assert sum(1 for _ in client.bundle(BUCKET, batch)) == len(batch)
    client.close()


def _epoch(
    reader: str, endpoint: str, keys: list[str], args: argparse.Namespace
) -> Callable[[], None]:
    at_origin = reader == "direct" or reader.endswith("-nginx")  # nginx passes signatures on
    creds = (ORIGIN_KEY, ORIGIN_SECRET) if at_origin else (HOARD_KEY, HOARD_SECRET)
    return {
        "direct": lambda: _boto3_epoch(endpoint, keys, creds, args.threads),
        "boto3": lambda: _boto3_epoch(endpoint, keys, creds, args.threads),
        "boto3-nginx": lambda: _boto3_epoch(endpoint, keys, creds, args.threads),
        "s3torch": lambda: _s3torch_epoch(endpoint, keys, creds, args),
        "s3torch-nginx": lambda: _s3torch_epoch(endpoint, keys, creds, args),
        "bundle-loader": lambda: _bundle_loader_epoch(endpoint, keys, args),
        "bundle-250": lambda: _bundle_epoch(endpoint, keys, args.bundle),
    }[reader]


def measure(reader: str, origin: Origin, keys: list[str], args: argparse.Namespace,
            workdir: Path) -> dict[str, Any]:  # fmt: skip
    """A cold and a warm epoch of ``reader`` (a fresh Hoard, or nginx, unless ``direct``)."""
    proc, nginx, endpoint = None, None, origin.endpoint
    if reader.endswith("-nginx"):
        ctx = Context(origin.endpoint, SimpleNamespace(local_root=workdir),  # type: ignore[arg-type]
                      workdir, Pinning(enabled=False), 1 << 30)  # fmt: skip
        nginx = Nginx("nginx", ctx)
        nginx.start()
        endpoint = nginx.endpoints[0]
    elif reader != "direct":
        proc, endpoint = start_hoard(workdir / "hoard", origin.endpoint, 1 << 30, 1)
    roots = [proc.pid] if proc is not None else nginx.pids() if nginx is not None else []
    row: dict[str, Any] = {}
    try:
        order = keys[:]
        random.Random(args.seed).shuffle(order)
        for phase in ("cold", "warm"):
            pids = tree(roots)
            if phase == "warm" and pids:
                row["settled_s"] = _settle(pids)
            before, cpu = origin.counts(), cpu_seconds(pids)
            client = _client_cpu()
            started = time.perf_counter()
            _epoch(reader, endpoint, order, args)()
            elapsed = time.perf_counter() - started
            row[phase] = {
                "objects_per_s": round(len(keys) / elapsed),
                "client_cpu_us_per_object": round((_client_cpu() - client) * 1e6 / len(keys)),
                "hoard_cpu_us_per_object": round((cpu_seconds(pids) - cpu) * 1e6 / len(keys))
                if roots else None,
                "origin_gets": diff_counts(origin.counts(), before).get("GET", 0),
            }  # fmt: skip
    finally:
        stop_process(proc, 15)
        if nginx is not None:
            nginx.stop()
    return row


def _settle(pids: list[int], quiet: float = 0.5, longest: float = 30.0) -> float:
    """Wait until the server spends no CPU tick in ``quiet`` seconds (what the cold epoch
    left behind, disk writes of its fills, done), at most ``longest``: the warm epoch's
    CPU is then its own. Returns the seconds waited."""
    started = time.perf_counter()
    while time.perf_counter() - started < longest:
        before = cpu_seconds(pids)
        time.sleep(quiet)
        if cpu_seconds(pids) - before < 0.005:  # under one clock tick
            break
    return round(time.perf_counter() - started, 1)


def _client_cpu() -> float:
    """CPU seconds of this process and of its children reaped so far (a DataLoader's
    workers, once their epoch ends; Hoard is reaped only after its last epoch)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def _available(reader: str) -> bool:
    if reader.endswith("-nginx") and shutil.which("nginx") is None:
        return False
    if reader not in ("s3torch", "s3torch-nginx", "bundle-loader"):
        return True
    try:
        import torch  # noqa: F401

        if reader.startswith("s3torch"):
            import s3torchconnector  # noqa: F401
    except ImportError:
        return False
    return True


def run(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(args.workdir).resolve()
    results: dict[str, Any] = {"objects": args.objects, "sizes": {}, "wan_cold": {}}
    for size in args.sizes:
        with Origin(workdir / f"origin-{size}", mode="loopback", rtt_ms=0.0, rate_mbit=0.0,
                    stream_mbit=0.0) as origin:  # fmt: skip
            keys = seed(origin.moto_url, args.objects, size)
            rows = {}
            for reader in args.readers:
                if not _available(reader):
                    rows[reader] = "not installed"
                    continue
                rows[reader] = measure(reader, origin, keys, args, workdir)
                print(size, reader, json.dumps(rows[reader]), flush=True)
            results["sizes"][size] = rows
    if args.wan_objects > 0:  # --wan-objects 0: no WAN case
        results["wan_cold"] = _wan_cold(args, workdir)
    return results


def _wan_cold(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """The cold case over the WAN-emulating origin: one thread of single GETs, bundles."""
    rows: dict[str, Any] = {}
    with Origin(workdir / "origin-wan", mode="loopback", rtt_ms=args.rtt_ms) as origin:
        keys = seed(origin.moto_url, args.wan_objects, args.sizes[0])
        for reader, threads in (("boto3", 1), ("bundle-250", 1)):
            args.threads = threads
            rows[reader] = measure(reader, origin, keys, args, workdir)["cold"]
            print("wan", reader, json.dumps(rows[reader]), flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m loadtest.bundles", description=__doc__)
    p.add_argument("--objects", type=int, default=2000)
    p.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")],
                   default=[4096, 112 * 1024])  # fmt: skip
    p.add_argument("--readers", type=lambda s: s.split(","), default=list(READERS))
    p.add_argument("--threads", type=int, default=8, help="boto3 threads (single GETs)")
    p.add_argument("--bundle", type=int, default=250, help="keys per request of bundle-250")
    p.add_argument("--loader-batch", type=int, default=64)
    p.add_argument("--loader-workers", type=int, default=2)
    p.add_argument("--rtt-ms", type=float, default=20.0, help="the WAN origin's round trip")
    p.add_argument("--wan-objects", type=int, default=300)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workdir", default="/tmp/hoard-bundles")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    results = run(args)
    text = json.dumps(results, indent=1)
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
