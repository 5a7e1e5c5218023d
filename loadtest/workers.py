"""``python -m loadtest.workers``: hit throughput and server CPU per request, 1 vs N workers.

One Hoard node serves a local directory (a posix origin: the origin is out
of the picture once everything is cached) with ``workers: 1`` and then
``workers: N``; wrk (one thread) cycles through presigned URLs of small
objects (64 connections) and of large ones (4 connections), after two
warm-up reads of every URL. For each run: requests/s, MiB/s, and the CPU
time the node's processes (supervisor and workers, from ``/proc``) spent per
request, in µs. Throughput on a machine whose cores the generator shares is
noise-prone; CPU per request is the figure that must not grow with workers.

    python -m loadtest.workers [--workers 1,2] [--memory 512MiB,0] [--seconds 10] [--out F.md]

``--memory 512MiB,0`` also answers whether the memory tier earns its keep over
the page cache: with ``cache.memory: 0`` every hit is a disk hit (``sendfile``
from a kept descriptor, the bytes in the kernel's page cache, once per node).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from loadtest.procs import free_port, stop_process, tree, wait_http

HERE = Path(__file__).resolve().parent
ACCESS, SECRET = "bench", "bench-secret-0123456789"
TICK = os.sysconf("SC_CLK_TCK")
PHASES = (("small hits", "small", 64), ("large hits", "large", 4))


def make_dataset(root: Path) -> dict[str, list[str]]:
    """128 KiB objects (400) and 32 MiB ones (4) in bucket ``data``: the keys by phase."""
    bucket = root / "data"
    keys: dict[str, list[str]] = {"small": [], "large": []}
    for kind, count, size in (("small", 400, 128 * 1024), ("large", 4, 32 * 1024 * 1024)):
        (bucket / kind).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            (bucket / kind / f"{i:04d}.bin").write_bytes(os.urandom(size))
            keys[kind].append(f"{kind}/{i:04d}.bin")
    return keys


def start(
    workdir: Path, origin: Path, workers: int, memory: str
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    config = {
        "listen": f"127.0.0.1:{port}", "workers": workers, "access_log": False,
        "credentials": [{"access_key": ACCESS, "secret_key": SECRET}],
        "origins": {"local": {"type": "posix", "path": str(origin)}},
        "default_origin": "local", "default_metadata_ttl": "forever",
        "cache": {"dir": str(workdir / f"cache-{workers}-{memory}"), "size": "4GiB",
                  "memory": memory},
    }  # fmt: skip
    path = workdir / f"hoard-{workers}.yaml"
    path.write_text(yaml.safe_dump(config))
    log = open(workdir / f"hoard-{workers}.log", "wb")  # noqa: SIM115 (the process keeps it)
    proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--config", str(path)],
                            stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    endpoint = f"http://127.0.0.1:{port}"
    wait_http(f"{endpoint}/_hoard/ready", 60, proc)
    deadline = time.monotonic() + 30
    while len(tree([proc.pid])) < (1 if workers == 1 else 1 + workers):
        assert time.monotonic() < deadline, "workers did not start"
        time.sleep(0.1)
    return proc, endpoint


def presigned(endpoint: str, keys: list[str]) -> list[str]:
    import boto3
    from botocore.config import Config

    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id=ACCESS, aws_secret_access_key=SECRET,
                          config=Config(s3={"addressing_style": "path"}))  # fmt: skip
    paths = []
    for key in keys:
        url = urlsplit(client.generate_presigned_url(
            "get_object", Params={"Bucket": "data", "Key": key}, ExpiresIn=3600))  # fmt: skip
        paths.append(f"{url.path}?{url.query}")
    return paths


def warm(endpoint: str, paths: list[str]) -> None:
    def one(path: str) -> None:
        with urllib.request.urlopen(endpoint + path, timeout=120) as response:
            while response.read(1 << 20):
                pass

    with ThreadPoolExecutor(8) as pool:
        for _ in range(2):  # the second read finds every block cached
            list(pool.map(one, paths))


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICK


def run_wrk(endpoint: str, paths_file: Path, connections: int, seconds: float) -> dict:
    command = ["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "--timeout", "60s",
               "-s", str(HERE / "wrk.lua"), endpoint, "--", str(paths_file)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 60)
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"wrk printed no result: {done.stderr[-500:]}")


def measure(workdir: Path, origin: Path, keys: dict[str, list[str]], workers: int,
            memory: str, seconds: float) -> list[dict]:  # fmt: skip
    proc, endpoint = start(workdir, origin, workers, memory)
    rows = []
    try:
        for phase, kind, connections in PHASES:
            paths = presigned(endpoint, keys[kind])
            warm(endpoint, paths)
            paths_file = workdir / f"paths-{kind}.txt"
            paths_file.write_text("\n".join(paths) + "\n")
            pids = tree([proc.pid])
            before = cpu_seconds(pids)
            result = run_wrk(endpoint, paths_file, connections, seconds)
            cpu = cpu_seconds(pids) - before
            errors = sum(result[k] for k in ("connect", "read", "write", "status", "timeout"))
            wall = result["duration_us"] / 1e6
            rows.append({
                "workers": workers, "memory": memory, "phase": phase, "requests_per_s": result["requests"] / wall,
                "mib_per_s": result["bytes"] / wall / 2**20,
                "cpu_us_per_request": cpu * 1e6 / max(1, result["requests"]),
                "server_cores": cpu / wall, "errors": errors,
                "p50_ms": result["p50_us"] / 1000, "p99_ms": result["p99_us"] / 1000,
            })  # fmt: skip
    finally:
        stop_process(proc)
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| workers | cache.memory | phase | req/s | MiB/s | server CPU µs/request "
             "| server cores busy | p50 ms | p99 ms | errors |",
             "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(
            f"| {r['workers']} | {r['memory']} | {r['phase']} | {r['requests_per_s']:,.0f} | "
            f"{r['mib_per_s']:,.0f} | {r['cpu_us_per_request']:,.0f} | {r['server_cores']:.2f} | "
            f"{r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['errors']} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.workers")
    parser.add_argument("--workers", default="1,2", help="worker counts to compare")
    parser.add_argument(
        "--memory",
        default="512MiB",
        help="cache.memory values to compare (0: hits from disk, page cache)",
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="wrk duration per phase")
    parser.add_argument("--out", type=Path, help="also write the table here (markdown)")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        print("wrk not installed (apt-get install wrk)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="hoard-workers-") as tmp:
        workdir = Path(tmp)
        keys = make_dataset(workdir / "origin")
        rows = []
        for memory in args.memory.split(","):
            for workers in map(int, args.workers.split(",")):
                rows += measure(workdir, workdir / "origin", keys, workers, memory, args.seconds)
    text = f"{table(rows)}\n\n(cores: {len(os.sched_getaffinity(0))}, wrk -t1 on the same machine)"
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
