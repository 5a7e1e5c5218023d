"""One benchmark run: origin up, dataset seeded, every target x workload, report written.

Each target is started cold for each workload and stopped after it, so no
workload sees another's cache. A target or workload that fails is reported as
an error row and the run goes on; Ctrl-C stops the run, still writes what was
measured, and cleans up (namespace, processes, working directory).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from loadtest import report, rssload, workloads, wrkload
from loadtest.datasets import SCALES, plan, seed_origin, write_local
from loadtest.origin import Origin
from loadtest.procs import Pinning
from loadtest.report import MB, Row
from loadtest.targets import REPO, Context, Target, make
from loadtest.workloads import Bench, Session

WORKLOADS: dict[str, Callable[[Session], list[Row]]] = {
    "epochs": workloads.epochs,
    "shards": workloads.shards,
    "herd": workloads.herd,
    "stream": workloads.stream,
    "train": workloads.train,
    "train-prefetch": workloads.train_prefetch,
    "train-warm": workloads.train_warm,
    "capacity": wrkload.capacity,
    "rss": rssload.rss,
}


@dataclass
class Options:
    scale: str = "quick"
    targets: tuple[str, ...] = ("direct", "nginx", "hoard", "static")
    workloads: tuple[str, ...] = tuple(WORKLOADS)
    origin: str = "auto"  # auto | netns | loopback
    rtt_ms: float = 20.0
    train_compute_ms: float | None = None  # overrides the scale's accelerator time per batch
    rate_mbit: float = 1000.0
    stream_mbit: float = 400.0
    pin: bool = True
    seed: int = 1
    phases: tuple[str, ...] = ()  # capacity: only these of its phases (all when empty)
    wide_objects: int | None = None  # overrides the scale's wide set (capacity, small 4k wide)
    out: Path = REPO / "loadtest" / "results"
    keep: bool = False


def gateway_version() -> str:
    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=10
        )
        return done.stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    last = git("log", "-1", "--format=%h", "--", "gateway") or "unknown"
    dirty = git("status", "--porcelain", "--", "gateway")
    return f"gateway/ at {last} (HEAD {head})" + (" + uncommitted changes" if dirty else "")


def one(bench: Bench, target: Target, workload: str) -> list[Row]:
    """Start ``target`` cold, run ``workload`` on it, stop it; errors become a row."""
    try:
        target.start()
        rows = WORKLOADS[workload](Session(bench, target, workload))
        for row in rows:
            row.note = "; ".join(x for x in (row.note, *target.notes) if x)
        return rows
    except Exception as exc:
        if not bench.origin.alive():
            raise RuntimeError("the origin (moto or the counting proxy) has exited") from exc
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        (bench.workdir / f"error-{target.name}-{workload}.txt").write_text(traceback.format_exc())
        return [Row(target.name, workload, "—", note=f"error: {detail}")]
    finally:
        target.stop()


def describe(row: Row) -> str:
    o = row.origin
    if not row.measured:
        failed = f"{row.errors} failed requests; " if row.errors else ""
        return f"  {row.target:14} {row.workload:9} {row.phase:11} NO RESULT: {failed}{row.note}"
    worker = row.extra.get("rss_worker_mib")
    return (
        f"  {row.target:14} {row.workload:9} {row.phase:11} {row.wall_s:7.2f}s "
        f"{row.objects_per_s:8,.0f} obj/s {row.mb_per_s:8,.1f} MB/s  p99 {row.p99_ms:7.1f} ms  "
        f"origin G/H/L {o.get('GET', 0)}/{o.get('HEAD', 0)}/{o.get('LIST', 0)} "
        f"{o.get('bytes', 0) / MB:,.1f} MB" + (f"  errors {row.errors}" if row.errors else "")
        + (f"  peak RSS/worker {worker:,.0f} MiB (sum {row.extra['rss_sum_mib']:,.0f})"
           if worker is not None else "")
    )  # fmt: skip


def run(options: Options) -> dict[str, Path]:
    scale = SCALES[options.scale]
    if options.train_compute_ms is not None:
        scale = replace(scale, train_compute=options.train_compute_ms / 1000)
    if options.wide_objects is not None:
        scale = replace(scale, wide_objects=options.wide_objects)
    scale = wrkload.trimmed(scale, options.phases)
    run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{scale.name}"
    workdir = Path(tempfile.mkdtemp(prefix="hoard-lt-"))
    pinning = Pinning.detect(options.pin)
    meta: dict[str, Any] = {
        "run_id": run_id, "scale": scale.describe(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "gateway": gateway_version(), "pinning": pinning.describe(),
        "generators": (f"realism: boto3, {scale.readers} spawned processes x {scale.threads} "
                       "threads; capacity: wrk -t1 with a Lua script over presigned URLs"),
        "targets": list(options.targets), "workloads": list(options.workloads), "unavailable": {},
        **({"capacity_phases": list(options.phases)} if options.phases else {}),
    }  # fmt: skip
    rows: list[Row] = []
    print(f"loadtest {run_id}: working in {workdir}", flush=True)
    try:
        with Origin(
            workdir / "origin",
            options.origin,
            options.rtt_ms,
            options.rate_mbit,
            options.stream_mbit,
        ) as origin:
            net = origin.network
            meta["origin"] = {"mode": net.mode, "delay": net.delay, "rate": net.rate,
                              "per-stream": net.stream or "unpaced",
                              **({"warning": net.warning} if net.warning else {})}  # fmt: skip
            print(f"origin: {meta['origin']}\npinning: {meta['pinning']}", flush=True)
            started = time.monotonic()
            big = "rss" in options.workloads  # 8 very large objects, for rss only
            dataset = write_local(
                plan(scale, options.seed, rss=big, hits="capacity" in options.workloads), workdir / "static", options.seed,
                rss=big and "static" in options.targets,
            )  # fmt: skip
            seed_origin(dataset, origin.moto_url, options.seed)
            meta["dataset"] = dataset.summary()
            print(
                f"dataset: {meta['dataset']} (seeded in {time.monotonic() - started:.1f}s)",
                flush=True,
            )
            total = dataset.total_bytes
            ctx = Context(origin.endpoint, dataset, workdir, pinning, max(4 * total, 2 * 1024**3))
            bench = Bench(origin, dataset, scale, pinning, options.seed, workdir, options.phases)
            for name in options.targets:
                target = make(name, ctx)
                reason = target.unavailable()
                if reason:
                    meta["unavailable"][name] = reason
                    print(f"  {name}: {reason}", flush=True)
                    continue
                for workload in options.workloads:
                    if workload == "capacity" and (reason := wrkload.unavailable()):
                        meta["unavailable"]["capacity"] = reason
                        continue
                    for row in one(bench, target, workload):
                        rows.append(row)
                        print(describe(row), flush=True)
    finally:
        meta["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
        paths = report.write(rows, meta, options.out)
        print("\n" + "\n".join(f"{kind}: {path}" for kind, path in paths.items()), flush=True)
        if options.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    _summary(rows, meta)
    return paths


def _summary(rows: list[Row], meta: dict[str, Any]) -> None:
    for entry in report.ratios(rows):
        ratios = "  ".join(
            f"{k}={v:.2f}" for k, v in entry.items() if "/" in k and isinstance(v, float)
        )
        print(f"  {entry['workload']:9} {entry['phase']:11} {entry['unit']:5} {ratios}")
    for goal, shown, verdict in report.goals(rows, meta):
        print(f"  [{verdict}] {goal}: {shown}")
    sys.stdout.flush()
