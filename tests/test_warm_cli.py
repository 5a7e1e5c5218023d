"""``hoard warm`` and ``hoard cache`` end to end, as subprocesses against a live node."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

from gateway.client.progress import follow
from tests.harness import ACCESS_KEY, REPO, SECRET_KEY
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


def test_a_prefix_that_matches_nothing_says_so_and_exits_1(node, origin_client, bucket, tmp_path):
    put_dataset(origin_client, bucket, "train/", [100])
    result = hoard(node, "warm", f"s3://{bucket}/trian/", cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.strip() == (
        f"hoard: nothing to warm: no key in bucket {bucket!r} starts with 'trian/' "
        f"(keys are case-sensitive; `aws s3 ls s3://{bucket}/` shows what is there)"
    )


def _warm_as(node, bucket: str, tmp_path, *args: str, **env: str):
    """``hoard warm`` with only the AWS credentials given here: no file, profile or role."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    absent = str(tmp_path / "absent")
    return subprocess.run(
        [sys.executable, "-m", "gateway", "warm", f"s3://{bucket}/x/", "--endpoint",
         node.endpoint, *args], cwd=tmp_path, capture_output=True, text=True, timeout=60,
        env={**clean, "PYTHONPATH": str(REPO), "HOME": str(tmp_path),
             "AWS_SHARED_CREDENTIALS_FILE": absent, "AWS_CONFIG_FILE": absent,
             "AWS_EC2_METADATA_DISABLED": "true", **env},
    )  # fmt: skip


def test_refused_credentials_are_named_with_how_to_set_them(node, bucket, tmp_path):
    """ "403 AccessDenied" alone left a user guessing which credentials went out, if any."""
    how = "set the key Hoard accepts as AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
    unsigned = _warm_as(node, bucket, tmp_path)
    assert unsigned.returncode == 1 and "Traceback" not in unsigned.stderr
    first, second = unsigned.stderr.strip().splitlines()
    assert first.startswith("hoard: HTTP 403: AccessDenied ")
    assert first.endswith("(unsigned: no AWS credentials found)")
    assert second.startswith(f"hoard: {how}")
    wrong = _warm_as(node, bucket, tmp_path, AWS_ACCESS_KEY_ID=ACCESS_KEY,
                     AWS_SECRET_ACCESS_KEY="not-the-secret")  # fmt: skip
    assert wrong.returncode == 1
    assert (
        f"(signed with access key {ACCESS_KEY!r} from the environment (AWS_ACCESS_KEY_ID))"
        in wrong.stderr
    )
    assert how in wrong.stderr and "not-the-secret" not in wrong.stderr
    half = _warm_as(node, bucket, tmp_path, "--access-key", ACCESS_KEY)
    assert half.returncode == 1
    assert half.stderr.strip() == "hoard: give both an access key and a secret key, or neither"


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
