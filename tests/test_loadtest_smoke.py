"""Smoke run of the load-test harness (loadtest/): every selected target produces numbers.

It asserts nothing about speed: only that each target answered each workload
with measured rows. Tiny scale (``smoke`` in ``loadtest/datasets.py``: quick's
shape with fewer, smaller objects and clients), origin on loopback (no
namespace is created), bounded in time; the run is a subprocess in its own
session so that a timeout stops it (SIGTERM, which cleans up) and then
everything it started.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# shards and train reuse the machinery of epochs; left out to keep this short. rss has a
# test of its own (Hoard only), so this one stays within its time.
WORKLOADS = ("epochs", "herd", "stream")
LIMIT = 180  # seconds for the whole run: a bound against a hang, not a speed (38 s quiet)
RSS_LIMIT = 150  # seconds for the rss run (8 x 16 MiB, Hoard only), as LIMIT


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "loadtest", *args], cwd=REPO, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        pytest.fail(f"loadtest smoke run exceeded {timeout:.0f}s:\n{out[-4000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


@pytest.mark.timeout(LIMIT + 30)
def test_quick_run_gives_numbers_for_every_target(tmp_path: Path) -> None:
    pytest.importorskip("moto.server", reason="moto[server] is needed for the origin")
    targets = ["direct", "hoard"]
    if shutil.which("nginx"):
        targets.append("nginx")
    workloads = list(WORKLOADS) + (["capacity"] if shutil.which("wrk") else [])

    done = _run(
        ["run", "--scale", "smoke", "--origin", "loopback", "--out", str(tmp_path),
         "--targets", ",".join(targets), "--workloads", ",".join(workloads)],
        LIMIT,
    )  # fmt: skip

    assert done.returncode == 0, done.stdout[-4000:]
    reports = list(tmp_path.glob("*.json"))
    assert len(reports) == 1, done.stdout[-4000:]
    rows = json.loads(reports[0].read_text())["rows"]
    for target in targets:
        for workload in workloads:
            mine = [r for r in rows if r["target"] == target and r["workload"] == workload]
            measured = [r for r in mine if r["wall_s"] > 0 and r["objects"] > 0]
            assert measured, f"{target} x {workload} gave no numbers: {mine}\n{done.stdout[-3000:]}"
    assert list(tmp_path.glob("*.md"))


@pytest.mark.timeout(RSS_LIMIT + 30)
def test_quick_rss_reports_memory_per_worker(tmp_path: Path) -> None:
    """``rss`` on Hoard: 8 streams cold and warm, then two uploads at once; peak RSS per process."""
    pytest.importorskip("moto.server", reason="moto[server] is needed for the origin")

    done = _run(
        ["run", "--scale", "smoke", "--origin", "loopback", "--out", str(tmp_path),
         "--targets", "hoard", "--workloads", "rss"],
        RSS_LIMIT,
    )  # fmt: skip

    assert done.returncode == 0, done.stdout[-4000:]
    report = json.loads(next(tmp_path.glob("*.json")).read_text())
    rows = {r["phase"]: r for r in report["rows"] if r["workload"] == "rss"}
    assert set(rows) == {"cold", "warm", "upload"}, done.stdout[-3000:]
    for phase, row in rows.items():
        # Reads: 8 objects; uploads: a multipart upload and a PutObject, checked at the origin.
        assert row["objects"] == (2 if phase == "upload" else 8) and row["errors"] == 0, row
        assert row["extra"]["rss_worker_mib"] > 0, row
        assert row["extra"]["memory_tier_mib"] > 0, row  # cache.memory, as Hoard reads it
    goals = [g for g in report["goals"] if g["goal"].startswith("rss")]
    assert len(goals) == 3, report["goals"]  # reads, uploads' peak, uploads' growth
    assert all(g["verdict"] in ("met", "MISSED") for g in goals), goals
