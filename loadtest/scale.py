"""Scale workload: a million small objects (``python -m loadtest.scale``).

Training sets are millions of small files under one prefix (ImageNet: 1.28 M
images in 1,000 class directories). This workload builds such a set behind
a directory (posix) origin in seconds, and measures what the other workloads
cannot at 20k objects: metadata at scale.

Dataset: ``--objects`` files of 4 KiB in ``--dirs`` directories
(``train/n00000042/n00000042_00042017.JPEG``), made *sparse* (``truncate``:
a distinct inode and ETag each, no data blocks, so a million take seconds and
no disk). Their bytes read as zeros.

Per target (``direct``: the files read with ``open``; ``nginx``: nginx
serving them statically; ``hoard``: Hoard with the directory as origin, all
settings default but ``--ttl``):

  * LIST (Hoard): every page of ``train/`` (flat, 1,000 keys a page, by
    continuation token), cold and then cached twice (rendered from the
    snapshot, then the same pages again: rendered bodies are kept), and the
    ``/``-delimited pages of the class directories twice: time per page at
    the client, and at the server (``hoard_request_duration_seconds`` of
    ListObjectsV2, sum over count);
  * epochs: ``--readers`` concurrent clients (threads over ``--procs``
    processes, keep-alive HTTP) read the objects of ``--read-dirs`` whole
    directories (all of them by default) in a new shuffled order each epoch:
    obj/s, p50/p99 latency, origin requests by kind (Hoard's own
    ``hoard_origin_requests_total``), requests per 1,000 objects, Hoard's RSS.

Epochs should outlast the TTL (the point: metadata past its TTL is
revalidated by listings, one origin LIST per directory, not a HEAD per
object). Make them so with ``--ttl`` or enough ``--read-dirs``; the report
says which epochs did.

Results go to ``loadtest/results/scale-<time>.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from multiprocessing import Pool
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import yaml

from loadtest.procs import free_port, memory, stop_process, wait_http
from loadtest.report import percentile

HERE = Path(__file__).parent
REPO = HERE.parent
BUCKET = "scale"
SIZE = 4096
_S3 = "{http://s3.amazonaws.com/doc/2006-03-01/}"


def key_of(i: int, per_dir: int) -> str:
    d = i // per_dir
    return f"train/n{d:08d}/n{d:08d}_{i:08d}.JPEG"


def make_dataset(root: Path, objects: int, dirs: int) -> float:
    """Sparse 4 KiB files under ``root/scale``; returns the seconds it took."""
    started = time.monotonic()
    per_dir = -(-objects // dirs)
    for d in range(dirs):
        directory = root / BUCKET / "train" / f"n{d:08d}"
        directory.mkdir(parents=True, exist_ok=True)
        for i in range(d * per_dir, min(objects, (d + 1) * per_dir)):
            fd = os.open(directory / key_of(i, per_dir).rsplit("/", 1)[1], os.O_CREAT | os.O_WRONLY)
            os.ftruncate(fd, SIZE)
            os.close(fd)
    return time.monotonic() - started


# --- servers -------------------------------------------------------------------------


def seed_s3(moto_url: str, objects: int, dirs: int) -> float:
    """``objects`` of 4 KiB put in moto (directly, not counted); returns the seconds it took."""
    from concurrent.futures import ThreadPoolExecutor

    from loadtest.datasets import origin_client

    started = time.monotonic()
    client = origin_client(moto_url, pool=16)
    client.create_bucket(Bucket=BUCKET)
    per_dir = -(-objects // dirs)
    body = bytes(SIZE)
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda i: client.put_object(Bucket=BUCKET, Key=key_of(i, per_dir), Body=body),
                      range(objects)))  # fmt: skip
    return time.monotonic() - started


def start_hoard(
    work: Path, origin: dict[str, Any], ttl: str
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    config = {
        "listen": f"127.0.0.1:{port}",
        "log_level": "warning",
        "access_log": False,
        "allow_anonymous": True,
        "cache": {"dir": str(work / "hoard-cache")},
        "origins": {"files": origin},
        "mounts": [{"bucket": BUCKET, "origin": "files", "metadata_ttl": ttl, "readonly": True}],
    }
    (work / "hoard.yaml").write_text(yaml.safe_dump(config))
    with open(work / "hoard.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--config", str(work / "hoard.yaml")],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(REPO)},
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/_hoard/ready", 60, proc)
    return proc, url


def start_nginx(work: Path, root: Path, probe: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    directory = work / "nginx"
    directory.mkdir(exist_ok=True)
    conf = (HERE / "nginx-static.conf").read_text()
    # open_file_cache keeps up to 100,000 descriptors: more than the hard limit may
    # allow (then every open fails). Keep a quarter of the limit, and raise the soft one.
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    conf = conf.replace(
        "open_file_cache max=100000", f"open_file_cache max={min(100_000, limit // 4)}"
    )
    conf = conf.replace("worker_processes", f"worker_rlimit_nofile {limit};\nworker_processes", 1)
    for name, value in {"@USER@": "user root;" if os.geteuid() == 0 else "", "@WORKERS@": "1",
                        "@DIR@": str(directory), "@PORT@": str(port), "@ROOT@": str(root)}.items():  # fmt: skip
        conf = conf.replace(name, value)
    (directory / "nginx.conf").write_text(conf)
    proc = subprocess.Popen(
        ["nginx", "-p", str(directory), "-e", str(directory / "error.log"),
         "-c", str(directory / "nginx.conf")],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/{BUCKET}/{probe}", 15, proc)
    return proc, url


def metrics(url: str) -> dict[str, float]:
    """Hoard's counters this workload reads: origin requests by operation, LIST time."""
    text = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
    found: dict[str, float] = Counter()
    for line in text.splitlines():
        if m := re.match(r'hoard_origin_requests_total\{.*operation="(\w+)".*\} (\S+)', line):
            found["origin " + m[1]] += float(m[2])
        elif m := re.match(
            r'hoard_request_duration_seconds_(sum|count)\{.*operation="ListObjectsV2".*\} (\S+)',
            line,
        ):
            found["list " + m[1]] += float(m[2])
    return found


# --- clients ---------------------------------------------------------------------------


def _read_http(args: tuple[str, list[str], int]) -> list[float]:
    """Read ``keys`` over ``threads`` keep-alive connections; per-request seconds."""
    import http.client

    url, keys, threads = args
    host, port = url.removeprefix("http://").split(":")
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    work = iter(keys)

    def loop() -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        mine = []
        while True:
            with lock:
                key = next(work, None)
            if key is None:
                break
            started = time.perf_counter()
            try:
                conn.request("GET", key if key.startswith("/") else f"/{BUCKET}/{key}")
                response = conn.getresponse()
                body = response.read()
            except (OSError, http.client.HTTPException):
                conn.close()  # reconnects on the next request
                body, response = b"", None
            if response is None or response.status != 200 or len(body) != SIZE:
                errors.append(key)  # counted in the report; an answer wrong in any way
                continue
            mine.append(time.perf_counter() - started)
        conn.close()
        with lock:
            latencies.extend(mine)

    workers = [threading.Thread(target=loop) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return latencies + [-1.0] * len(errors)  # an error: a negative latency


def _read_files(args: tuple[str, list[str], int]) -> list[float]:
    root, keys, _ = args
    latencies = []
    for key in keys:
        started = time.perf_counter()
        with open(os.path.join(root, BUCKET, key), "rb") as handle:
            if len(handle.read()) != SIZE:
                raise RuntimeError(f"{key}: short read")
        latencies.append(time.perf_counter() - started)
    return latencies


def list_all(url: str, delimiter: str = "") -> list[float]:
    """Every page of ``train/`` at the client: seconds per page."""
    import http.client
    from urllib.parse import quote

    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=600)
    token, times = None, []
    while True:
        query = f"list-type=2&prefix=train/&delimiter={quote(delimiter)}"
        if token:
            query += "&continuation-token=" + quote(token)
        started = time.perf_counter()
        conn.request("GET", f"/{BUCKET}?{query}")
        body = conn.getresponse().read()
        times.append(time.perf_counter() - started)
        tree = ElementTree.fromstring(body)
        token = tree.findtext(f"{_S3}NextContinuationToken")
        if tree.findtext(f"{_S3}IsTruncated") != "true" or not token:
            conn.close()
            return times


# --- the run ---------------------------------------------------------------------------


def measure_lists(url: str, pid: int) -> list[dict[str, Any]]:
    """LIST ``train/`` cold, then cached twice (rendered from the snapshot, then served
    as rendered: Hoard keeps rendered pages), flat and ``/``-delimited."""
    rows: list[dict[str, Any]] = [{"phase": "started", "rss_mib": _rss(pid)}]
    phases = [("", "cold"), ("", "cached"), ("", "cached again"),
              ("/", "delimiter / cached"), ("/", "delimiter / again")]  # fmt: skip
    for delimiter, phase in phases:
        before = metrics(url)
        started = time.monotonic()
        pages = list_all(url, delimiter)
        seconds = time.monotonic() - started
        after = metrics(url)
        server = (after["list sum"] - before["list sum"]) / max(
            1, after["list count"] - before["list count"]
        )
        rows.append({"phase": f"LIST train/ {phase}", "pages": len(pages), "seconds": round(seconds, 2),
                     "first_page_ms": round(1e3 * pages[0], 2),
                     "client_ms_p50": round(1e3 * percentile(pages, 0.5), 2),
                     "client_ms_p99": round(1e3 * percentile(pages, 0.99), 2),
                     "server_ms_per_page": round(1e3 * server, 2),
                     "origin": _origin(after, before), "rss_mib": _rss(pid)})  # fmt: skip
    return rows


def _presigned(endpoint: str, keys: list[str]) -> list[str]:
    """Path and query of a presigned GET of each key (signed here, not by the readers)."""
    from urllib.parse import urlsplit

    from loadtest.datasets import origin_client

    client = origin_client(endpoint)
    urls = (client.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": key})
            for key in keys)  # fmt: skip
    return [f"{u.path}?{u.query}" for u in map(urlsplit, urls)]


def epoch(target: str, source: str, keys: list[str], opts: argparse.Namespace) -> dict[str, Any]:
    if target == "direct" and opts.origin == "s3":
        keys = _presigned(source, keys)  # the origin wants signed requests
    chunks = [keys[i :: opts.procs] for i in range(opts.procs)]
    threads = max(1, opts.readers // opts.procs)
    reader = _read_files if target == "direct" and opts.origin == "posix" else _read_http
    started = time.monotonic()
    with Pool(opts.procs) as pool:
        answers = [
            t for part in pool.map(reader, [(source, c, threads) for c in chunks]) for t in part
        ]
    seconds = time.monotonic() - started
    latencies = [t for t in answers if t >= 0]
    return {"objects": len(latencies), "errors": len(answers) - len(latencies), "seconds": round(seconds, 1),
            "obj_per_s": round(len(latencies) / seconds), "p50_ms": round(1e3 * percentile(latencies, 0.5), 2),
            "p99_ms": round(1e3 * percentile(latencies, 0.99), 2)}  # fmt: skip


def _origin(after: dict[str, float], before: dict[str, float]) -> dict[str, int]:
    return {k.split()[1]: int(after[k] - before.get(k, 0)) for k in after
            if k.startswith("origin ") and after[k] - before.get(k, 0)}  # fmt: skip


def _rss(pid: int) -> float | None:
    found = memory(pid)
    return None if found is None else round(found[1] / 2**20, 1)


def run(opts: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="hoard-scale-", dir=opts.workdir))
    try:
        if opts.origin == "posix":
            root = work / "data"
            made = make_dataset(root, opts.objects, opts.dirs)
            return _run(opts, work, made, str(root), {"type": "posix", "path": str(root / BUCKET)})
        from loadtest.datasets import ORIGIN_KEY, ORIGIN_SECRET
        from loadtest.origin import Origin

        with Origin(work / "origin", rtt_ms=opts.rtt_ms) as s3:
            made = seed_s3(s3.moto_url, opts.objects, opts.dirs)
            origin = {"type": "s3", "endpoint": s3.endpoint, "region": "us-east-1",
                      "access_key": ORIGIN_KEY, "secret_key": ORIGIN_SECRET,
                      "addressing_style": "path", "max_connections": 128}  # fmt: skip
            return _run(opts, work, made, s3.endpoint, origin)
    finally:
        if not opts.keep:
            subprocess.run(["rm", "-rf", str(work)], check=False)


def _run(
    opts: argparse.Namespace, work: Path, made: float, direct: str, origin: dict[str, Any]
) -> dict[str, Any]:
    """Every target over the dataset; ``direct`` is the origin's files (a directory) or URL."""
    per_dir = -(-opts.objects // opts.dirs)
    chosen = random.Random(opts.seed).sample(range(opts.dirs), opts.read_dirs or opts.dirs)
    keys = [
        key_of(i, per_dir)
        for d in chosen
        for i in range(d * per_dir, min(opts.objects, (d + 1) * per_dir))
    ]
    result: dict[str, Any] = {"origin": opts.origin, "objects": opts.objects, "dirs": opts.dirs,
                              "read_per_epoch": len(keys),
                              "ttl": opts.ttl, "dataset_seconds": round(made, 1), "targets": {}}  # fmt: skip
    print(
        f"dataset: {opts.objects} objects in {made:.1f} s; {len(keys)} read per epoch", flush=True
    )
    for target in opts.targets.split(","):
        proc, source = None, direct
        try:
            if target == "hoard":
                proc, source = start_hoard(work, origin, opts.ttl)
            elif target == "nginx":
                if opts.origin != "posix" or shutil.which("nginx") is None:
                    continue  # nginx serves a directory here; as an S3 cache see the main run
                proc, source = start_nginx(work, Path(direct), keys[0])
            rows = measure_lists(source, proc.pid) if target == "hoard" and proc else []
            for n in range(1, opts.epochs + 1):
                rng = random.Random(opts.seed * 1000 + n)
                order = rng.sample(keys, len(keys))
                before = metrics(source) if target == "hoard" else {}
                row = {"phase": f"epoch {n}", **epoch(target, source, order, opts)}
                if target == "hoard" and proc:
                    spent = _origin(metrics(source), before)
                    row |= {"origin": spent, "origin_per_1000": round(1000 * sum(spent.values()) / len(keys), 2),
                            "rss_mib": _rss(proc.pid)}  # fmt: skip
                rows.append(row)
                print(target, json.dumps(row), flush=True)
            result["targets"][target] = rows
        finally:
            stop_process(proc)
    return result


def markdown(result: dict[str, Any]) -> str:
    lines = [f"# Scale workload: {result['objects']:,} objects of 4 KiB in {result['dirs']} directories, "
             f"{result['origin']} origin",
             "", f"Dataset made in {result['dataset_seconds']} s (sparse files); "
             f"{result['read_per_epoch']:,} objects read per epoch; Hoard's metadata_ttl: {result['ttl']}.", "",
             "| target | phase | objects/pages | s | obj/s | p50 ms | p99 ms | server ms/page | origin requests | per 1,000 obj | Hoard RSS MiB |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for target, rows in result["targets"].items():
        for r in rows:
            origin = ", ".join(f"{k} {v}" for k, v in r.get("origin", {}).items()) or (
                "0" if "origin" in r else ""
            )
            lines.append(f"| {target} | {r['phase']} | {r.get('objects', r.get('pages', ''))}{_errors(r)} | {r.get('seconds', '')} | "
                         f"{r.get('obj_per_s', '')} | {r.get('p50_ms', r.get('client_ms_p50', ''))} | "
                         f"{r.get('p99_ms', r.get('client_ms_p99', ''))} | {r.get('server_ms_per_page', '')} | "
                         f"{origin} | {r.get('origin_per_1000', '')} | {r.get('rss_mib', '')} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def _errors(row: dict[str, Any]) -> str:
    return f" ({row['errors']} errors)" if row.get("errors") else ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.scale", description=__doc__.split("\n")[0])
    p.add_argument("--origin", choices=("posix", "s3"), default="posix",
                   help="a directory, or moto behind the emulated WAN (use fewer --objects)")  # fmt: skip
    p.add_argument("--rtt-ms", type=float, default=20.0, help="S3 origin round trip")
    p.add_argument("--objects", type=int, default=1_000_000)
    p.add_argument("--dirs", type=int, default=1000)
    p.add_argument("--read-dirs", type=int, default=0, help="directories read per epoch (0: all)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--ttl", default="60s", help="Hoard's metadata_ttl (default: Hoard's default)")
    p.add_argument("--readers", type=int, default=64)
    p.add_argument("--procs", type=int, default=4)
    p.add_argument("--targets", default="direct,nginx,hoard")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workdir", default=None)
    p.add_argument("--out", type=Path, default=HERE / "results")
    p.add_argument("--keep", action="store_true")
    opts = p.parse_args(argv)
    result = run(opts)
    opts.out.mkdir(parents=True, exist_ok=True)
    stem = opts.out / time.strftime("scale-%Y%m%d-%H%M%S")
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1))
    stem.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
