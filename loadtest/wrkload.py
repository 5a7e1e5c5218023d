"""``capacity``: server capacity measured with wrk, a generator that is not the bottleneck.

On two cores a handful of boto3 processes saturate the CPU before any server
does, so their figures measure boto3. wrk (C, epoll, one thread, pinned to the
generator CPU) cycles through presigned URLs of the dataset instead: Hoard
verifies each signature (boto3 presigns them for Hoard's endpoint and
credentials), nginx passes them to the origin and keeps them out of its cache
key, ``static`` ignores them.

Phases: ``small hits`` (every image, 64 connections) and ``large hits`` (the
shards whole, 4 connections), each after one warm-up read of every URL, so a
caching target answers from its cache. For several nodes, wrk drives the first.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

from botocore.config import Config

from loadtest.datasets import Obj
from loadtest.report import Row
from loadtest.workloads import Session

HERE = Path(__file__).resolve().parent


def unavailable() -> str | None:
    return None if shutil.which("wrk") else "wrk not installed (apt-get install wrk)"


def presigned_paths(s: Session, objects: tuple[Obj, ...], endpoint: str | None = None) -> list[str]:
    """Path + query of a GET for each object against ``endpoint`` (the target's first)."""
    bucket = s.bench.dataset.bucket
    if not s.target.can_list:  # static files: no signature to check
        return [f"/{bucket}/{o.key}" for o in objects]
    import boto3

    client = boto3.client(
        "s3", endpoint_url=endpoint or s.target.endpoints[0], region_name="us-east-1",
        aws_access_key_id=s.target.access_key, aws_secret_access_key=s.target.secret_key,
        config=Config(s3={"addressing_style": "path"}),
    )  # fmt: skip
    paths = []
    for o in objects:
        url = client.generate_presigned_url(
            "get_object", Params={"Bucket": bucket, "Key": o.key}, ExpiresIn=3600
        )
        parts = urlsplit(url)
        paths.append(parts.path + ("?" + parts.query if parts.query else ""))
    return paths


def warm(endpoint: str, paths: list[str], deadline: float) -> int:
    """Read every path once (16 at a time); returns how many failed."""

    def one(path: str) -> bool:
        if time.monotonic() > deadline:
            return False
        try:
            with urllib.request.urlopen(endpoint + path, timeout=120) as response:
                while response.read(1024 * 1024):
                    pass
            return True
        except OSError:
            return False

    with ThreadPoolExecutor(16) as pool:
        return sum(not ok for ok in pool.map(one, paths))


def run_wrk(s: Session, paths: list[str], connections: int, seconds: float, tag: str) -> dict:
    paths_file = s.bench.workdir / f"wrk-{s.target.name}-{tag}.txt"
    paths_file.write_text("\n".join(paths) + "\n")
    command = [
        *s.bench.pinning.generator_prefix(), "wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s",
        "--timeout", "60s", "-s", str(HERE / "wrk.lua"), s.target.endpoints[0], "--", str(paths_file),
    ]  # fmt: skip
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=seconds + 90, check=False
    )
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"wrk printed no result (exit {done.returncode}): {done.stderr[-500:]}")


def capacity(s: Session) -> list[Row]:
    scale, data = s.bench.scale, s.bench.dataset
    rows = []
    for phase, objects, connections in (
        ("small hits", data.images, 64),
        ("large hits", data.shards, 4),
    ):
        paths = presigned_paths(s, objects)
        failed = warm(s.target.endpoints[0], paths, time.monotonic() + min(300.0, s.remaining()))

        def run(paths: list[str] = paths, connections: int = connections, tag: str = phase) -> dict:
            result = run_wrk(s, paths, connections, scale.wrk_seconds, tag.split()[0])
            errors = sum(result[k] for k in ("connect", "read", "write", "status", "timeout"))
            return {
                "wall": result["duration_us"] / 1e6, "objects": result["requests"] - errors,
                "bytes": result["bytes"], "errors": errors,
                "p50_s": result["p50_us"] / 1e6, "p99_s": result["p99_us"] / 1e6,
                "connections": connections,
            }  # fmt: skip

        row = s.measure(phase, run, generator="wrk")
        if failed:
            row.note = f"{failed} warm-up reads failed"
        if len(s.target.endpoints) > 1:
            row.note = (row.note + "; " if row.note else "") + "wrk drives the first node only"
        rows.append(row)
    return rows
