"""``hoard warm`` and ``hoard cache`` end to end, as subprocesses against a live node."""

from __future__ import annotations

import io
import json

from gateway.client.progress import follow
from tests.harness import ACCESS_KEY, SECRET_KEY
from tests.test_cli import run_hoard
from tests.test_warm import BLOCK, node, proxy, put_dataset  # fixtures, exported below

__all__ = ["node", "proxy"]


def hoard(node, *args: str, cwd=None):
    return run_hoard([*args, "--endpoint", node.endpoint, "--access-key", ACCESS_KEY,
                      "--secret-key", SECRET_KEY], cwd, timeout=60)  # fmt: skip


def test_warm_prints_plain_progress_lines_and_exits_0_when_done(
    node, proxy, origin_client, bucket, tmp_path
):
    data = put_dataset(origin_client, bucket, "cli/", [2 * BLOCK] * 3 + [10])
    result = hoard(node, "warm", f"s3://{bucket}/cli/", "--interval", "0.1", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith("warm job ")
    assert "\x1b[" not in result.stdout  # not a terminal: no escape sequences, no bar
    assert any(line.startswith("done") and "4/4 objects" in line for line in lines), lines
    job_id = lines[0].split()[2]
    status = hoard(node, "warm", "--status", job_id, "--json", cwd=tmp_path)
    assert status.returncode == 0 and json.loads(status.stdout)["bytes_done"] == 6 * BLOCK + 10
    proxy.reset()
    s3 = node.client()
    for key, body in data.items():
        assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == body
    assert proxy.counts["GetObject"] == 0


def test_a_failing_job_exits_non_zero(node, origin_client, bucket, tmp_path):
    put_dataset(origin_client, bucket, "f/", [100])
    keys = tmp_path / "keys.txt"
    keys.write_text("f/0000.bin\nf/not-there\n")
    result = hoard(node, "warm", f"s3://{bucket}", "--keys-from", str(keys), cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "f/not-there" in result.stdout and "1 of 2 objects failed" in result.stdout
    refused = hoard(node, "warm", "s3://no-such-bucket-anywhere/x", cwd=tmp_path)
    assert refused.returncode == 1 and "NoSuchBucket" in refused.stderr


def test_cache_stats_and_drop(node, proxy, origin_client, bucket, tmp_path):
    data = put_dataset(origin_client, bucket, "d/", [BLOCK + 5])
    assert hoard(node, "warm", f"s3://{bucket}/d/", cwd=tmp_path).returncode == 0
    stats = hoard(node, "cache", "stats", cwd=tmp_path)
    assert stats.returncode == 0 and json.loads(stats.stdout)["disk"]["entries"] >= 2
    dropped = hoard(node, "cache", "drop", f"s3://{bucket}/d/", cwd=tmp_path)
    assert dropped.returncode == 0 and json.loads(dropped.stdout)["disk_blocks"] == 2
    proxy.reset()
    key, body = next(iter(data.items()))
    assert node.client().get_object(Bucket=bucket, Key=key)["Body"].read() == body
    assert proxy.counts["GetObject"] > 0


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_a_live_bar_on_a_terminal():
    statuses = iter([
        {"id": "j", "state": "running", "objects_done": 1, "objects_total": 4,
         "bytes_done": 1024, "bytes_total": 4096, "rate": 512.0, "eta": 6.0},
        {"id": "j", "state": "done", "objects_done": 4, "objects_total": 4,
         "bytes_done": 4096, "bytes_total": 4096, "rate": 512.0, "eta": 0.0},
    ])  # fmt: skip
    out = _Terminal()
    final = follow(lambda: next(statuses), lambda _: None, out, interval=0)
    assert final["state"] == "done"
    text = out.getvalue()
    assert "4/4 objects" in text and "4.0 KiB/4.0 KiB" in text and "\x1b[" in text
