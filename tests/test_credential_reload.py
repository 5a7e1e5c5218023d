"""Credentials re-read on SIGHUP: keys rotated, removed and limited without a restart.

A real node with two workers over a directory origin; the supervisor passes the
signal to each worker, and each logs "config reloaded" once it applies the new
credentials, so the test waits on those lines, not on time.
"""

from __future__ import annotations

import os
import re
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from botocore.exceptions import ClientError

from gateway.config.load import build_settings
from gateway.config.settings import ConfigError
from tests.harness import ACCESS_KEY, SECRET_KEY, HoardProcess, s3_client
from tests.rawhttp import signed_send

pytestmark = pytest.mark.timeout(90)

NEW_KEY, NEW_SECRET = "rotated-key", "rotated-secret-rotated-secret"


def _children(pid: int) -> list[int]:
    """The worker processes of the node ``pid`` supervises."""
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(child) for child in path.read_text().split()]


def _error(call) -> str:
    with pytest.raises(ClientError) as refused:
        call()
    return refused.value.response["Error"]["Code"]


def _reload(node: HoardProcess, credentials: list[dict], reloads: int) -> None:
    """Write ``credentials`` into the node's config, SIGHUP it, and wait until both workers
    have applied it (their ``reloads``-th "config reloaded" lines)."""
    node.config["credentials"] = credentials
    (node.workdir / f"hoard-{node.port}.yaml").write_text(yaml.safe_dump(node.config))
    assert node.proc is not None
    node.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 60
    while node.log().count("config reloaded") < 2 * reloads:
        assert time.monotonic() < deadline, node.log()[-2000:]
        time.sleep(0.05)


def test_sighup_applies_new_removed_and_limited_keys(tmp_path: Path) -> None:
    origin = tmp_path / "origin"
    for bucket in ("data", "other"):
        (origin / bucket).mkdir(parents=True)
        (origin / bucket / "k").write_bytes(bucket.encode())
    config = {
        "workers": 2,
        "origins": {"dir": {"type": "posix", "path": str(origin)}},
        "default_origin": "dir",
    }
    node = HoardProcess(tmp_path, config).start()
    assert node.proc is not None
    first_workers = _children(node.proc.pid)
    try:
        old = s3_client(node.endpoint, ACCESS_KEY, SECRET_KEY)
        new = s3_client(node.endpoint, NEW_KEY, NEW_SECRET)
        url = old.generate_presigned_url("get_object", Params={"Bucket": "data", "Key": "k"})
        assert old.get_object(Bucket="data", Key="k")["Body"].read() == b"data"
        assert _error(lambda: new.head_object(Bucket="data", Key="k")) == "403"

        # The new key added, the old one limited to one bucket, read-only.
        limited = {"access_key": ACCESS_KEY, "secret_key": SECRET_KEY, "buckets": ["other"],
                   "readonly": True}  # fmt: skip
        _reload(node, [limited, {"access_key": NEW_KEY, "secret_key": NEW_SECRET}], 1)
        for _ in range(8):  # new connections: both workers answer some
            assert new.get_object(Bucket="data", Key="k")["Body"].read() == b"data"
            assert old.get_object(Bucket="other", Key="k")["Body"].read() == b"other"
            assert _error(lambda: old.get_object(Bucket="data", Key="k")) == "AccessDenied"
        assert _error(lambda: old.put_object(Bucket="other", Key="w", Body=b"x")) == "AccessDenied"

        # A config that does not load changes nothing.
        (node.workdir / f"hoard-{node.port}.yaml").write_text("credentials: [unclosed\n")
        node.proc.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
        deadline = time.monotonic() + 60
        while node.log().count("config reload failed") < 2:
            assert time.monotonic() < deadline, node.log()[-2000:]
            time.sleep(0.05)
        assert new.get_object(Bucket="data", Key="k")["Body"].read() == b"data"

        # The old key removed: refused, its presigned URL too (remembered or not).
        _reload(node, [{"access_key": NEW_KEY, "secret_key": NEW_SECRET}], 2)
        for _ in range(8):
            assert _error(lambda: old.head_object(Bucket="other", Key="k")) == "403"
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(url, timeout=10)
            assert refused.value.code == 403

        # A worker restarted after the reload starts with what its siblings applied, not
        # with the config the node started with.
        assert node.proc is not None
        killed = _children(node.proc.pid)[0]
        os.kill(killed, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while killed in (kids := _children(node.proc.pid)) or len(kids) < 2:
            assert time.monotonic() < deadline, node.log()[-2000:]
            time.sleep(0.05)
        (replacement,) = set(kids) - {killed} - set(first_workers)
        answered = re.compile(rf"Z {replacement} [0-9A-F]{{16}} ")  # its access-log lines
        while not answered.search(node.log()):  # until it has answered a request
            assert time.monotonic() < deadline, node.log()[-2000:]
            assert _error(lambda: s3_client(node.endpoint, ACCESS_KEY, SECRET_KEY).head_object(
                Bucket="other", Key="k")) == "403"  # fmt: skip
            assert new.get_object(Bucket="data", Key="k")["Body"].read() == b"data"
    finally:
        node.stop()


@pytest.mark.parametrize("secret", ["", "   ", "\t"])
def test_an_empty_or_blank_secret_is_refused_at_start(secret: str) -> None:
    config = {"origins": {"dir": {"type": "posix", "path": "/tmp"}}, "default_origin": "dir",
              "listen": "127.0.0.1:9000",  # on loopback too: an empty secret guards nothing
              "credentials": [{"access_key": "blank", "secret_key": secret}]}  # fmt: skip
    with pytest.raises(
        ConfigError, match=r"credentials\.0\.secret_key: is empty or whitespace \(key 'blank'\)"
    ):
        build_settings(config)
    config = {**config, "credentials": [], "cluster": {"self": "http://a:1", "secret": secret}}
    with pytest.raises(ConfigError, match=r"cluster\.secret: is empty or whitespace"):
        build_settings(config)


def test_sighup_refuses_a_blank_secret_whole_and_warns_of_a_weak_one(tmp_path: Path) -> None:
    """Before: a key with an empty secret was accepted on loopback, and a weak key a reload
    brought in was not even warned about."""
    origin = tmp_path / "origin"
    (origin / "data").mkdir(parents=True)
    (origin / "data" / "k").write_bytes(b"data")
    config = {"workers": 2, "origins": {"dir": {"type": "posix", "path": str(origin)}},
              "default_origin": "dir"}  # fmt: skip
    node = HoardProcess(tmp_path, config).start()
    try:
        old = s3_client(node.endpoint, ACCESS_KEY, SECRET_KEY)
        keep = {"access_key": ACCESS_KEY, "secret_key": SECRET_KEY}
        for blank in ("", "  "):
            failed = node.log().count("config reload failed")
            node.config["credentials"] = [{"access_key": "blank", "secret_key": blank}]
            (node.workdir / f"hoard-{node.port}.yaml").write_text(yaml.safe_dump(node.config))
            assert node.proc is not None
            node.proc.send_signal(signal.SIGHUP)
            deadline = time.monotonic() + 60
            while node.log().count("config reload failed") < failed + 2:  # both workers
                assert time.monotonic() < deadline, node.log()[-2000:]
                time.sleep(0.05)
            assert "secret_key: is empty or whitespace" in node.log()
            # Nothing changed: the old key still reads, the blank one is unknown.
            assert old.get_object(Bucket="data", Key="k")["Body"].read() == b"data"
            answer = signed_send(node.port, "GET", "/data/k", access_key="blank", secret_key=blank)
            assert answer.status == 403 and b"InvalidAccessKeyId" in answer.body
        _reload(node, [keep, {"access_key": "weak", "secret_key": "short"}], 1)
        assert "INSECURE" in node.log().split("config reload failed")[-1]
    finally:
        node.stop()
