"""The ``hoard`` command: embedded default, config errors, streaming, shutdown."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest
import requests

from tests.harness import REPO, HoardProcess, free_port, metric
from tests.rawhttp import sign_headers

GiB = 1024**3


def run_hoard(
    args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 20
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args], cwd=cwd, capture_output=True, text=True,
        timeout=timeout, env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
    )  # fmt: skip


@pytest.mark.parametrize(
    ("yaml_text", "expected"),
    [
        ("cache:\n  size: lots\n", "cache.size: invalid size 'lots'"),
        ("bogus: 1\n", "bogus: unknown key"),
        ("cache:\n  bogus: 1\n", "cache.bogus: unknown key"),
        (
            "origins:\n  a: {type: posix, path: /tmp}\nmounts:\n  - {bucket: abc, origin: nope}\n",
            "mounts.0.origin: unknown origin 'nope'",
        ),
        ("default_origin: missing\n", "default_origin: unknown origin 'missing'"),
        ("mounts:\n  - {bucket: abc}\n", "mounts.0.origin: required key is missing"),
        (
            "credentials:\n  - {access_key: a, secret_key: '${HOARD_TEST_UNSET_VAR}'}\n",
            "credentials.0.secret_key: environment variable HOARD_TEST_UNSET_VAR is not set",
        ),
        ("listen: nowhere\n", "listen: invalid listen address"),
        # Where the file breaks, as file:line:column, and what is wrong there.
        (
            "cache: [1, 2\n",
            "bad.yaml:2:1: invalid YAML: expected ',' or ']', but got '<stream end>' "
            "(while parsing a flow sequence that starts at 1:8)",
        ),
        (
            "cache:\n  size: 1GiB\n  size: 2GiB\n",
            "bad.yaml:3:3: invalid YAML: key 'size' appears twice",
        ),
        # A posix origin's folder that is not there is refused at start (it was a 503 to
        # every request), naming the key, the path as written and where it lands.
        (
            "origins:\n  d: {type: posix, path: ./nope}\ndefault_origin: d\n",
            "origins.d.path: 'nope' (",
        ),
        (
            "origins:\n  d: {type: posix, path: ./bad.yaml}\ndefault_origin: d\n",
            "is not a directory",
        ),
        (
            "origins:\n  d: {type: posix, path: .}\nmounts:\n  - {bucket: abc, origin: d, origin_bucket: My_Data}\n",
            "mounts.0.origin_bucket: 'My_Data' has characters other than lowercase letters",
        ),
        # Nothing to serve: say what to add rather than answer NoSuchBucket to everything.
        ("cache:\n  size: 1GiB\n", "default_origin: nothing is served; add an origin"),
    ],
)
def test_bad_config_exits_2_with_one_line(tmp_path, yaml_text, expected):
    config = tmp_path / "bad.yaml"
    config.write_text(yaml_text)
    result = run_hoard(["serve", "--config", str(config)], tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hoard: config error: ")
    assert expected in lines[0]


def test_a_missing_origin_folder_is_named_with_where_it_would_be(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("origins:\n  d: {type: posix, path: ./nope}\ndefault_origin: d\n")
    result = run_hoard(["serve", "--config", str(config)], tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"hoard: config error: origins.d.path: 'nope' ({str(tmp_path / 'nope')!r}) "
        "does not exist (create it, or fix the path)"
    )


def test_folders_that_are_no_bucket_name_are_named_at_start(tmp_path):
    data = tmp_path / "data"
    for name in ("My_Data", "ab", "ok-bucket", ".hidden", "line\nbreak"):
        (data / name).mkdir(parents=True)
    (data / "ok-bucket" / "k").write_bytes(b"served")
    node = HoardProcess(tmp_path, {
        "origins": {"disk": {"type": "posix", "path": str(data)}}, "default_origin": "disk",
    }).start()  # fmt: skip
    try:
        assert [b["Name"] for b in node.client().list_buckets()["Buckets"]] == ["ok-bucket"]
        warnings = [line for line in node.log().splitlines() if "is not served" in line]
    finally:
        node.stop()
    assert len(warnings) == 3, warnings  # not ok-bucket, not the hidden folder
    assert all(" WARNING " in line and f"in {str(data)!r}" in line for line in warnings)
    assert "folder 'My_Data' " in warnings[0] and "other than lowercase letters" in warnings[0]
    assert "folder 'ab' " in warnings[1] and "has 2 characters, not 3 to 63" in warnings[1]
    assert "folder 'line\\nbreak' " in warnings[2]  # escaped: one line, not a forged second


def test_embedded_default_makes_its_data_dir_and_refuses_a_file_in_its_place(tmp_path):
    proc, exports = _start_default(tmp_path, free_port())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0
    assert "AWS_ENDPOINT_URL" in exports and (tmp_path / "data").is_dir()
    (tmp_path / "file").write_text("not a folder")
    result = run_hoard(["serve", "--data-dir", "file"], tmp_path, env={"HOME": str(tmp_path)})
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith("hoard: config error: --data-dir: 'file': ")


def test_environment_overrides_config(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("cache:\n  size: 1GiB\n")
    bad = run_hoard(["serve", "--config", str(config)], tmp_path, env={"HOARD_CACHE__SIZE": "huge"})
    assert bad.returncode == 2 and "cache.size: invalid size 'huge'" in bad.stderr


def test_missing_config_file(tmp_path):
    result = run_hoard(["serve", "--config", str(tmp_path / "absent.yaml")], tmp_path)
    assert result.returncode == 2 and "cannot read config file" in result.stderr


def _start_default(tmp_path: Path, port: int) -> tuple[subprocess.Popen[str], dict[str, str]]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HOME": str(tmp_path)}
    env.pop("XDG_CACHE_HOME", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--port", str(port)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
    )  # fmt: skip
    exports: dict[str, str] = {}
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and "AWS_DEFAULT_REGION" not in exports:
        line = proc.stdout.readline()
        match = re.match(r"\s*export (\w+)=(\S+)", line)
        if match:
            exports[match.group(1)] = match.group(2)
        elif "serving the directory" in line:
            exports["banner"] = line.strip()
    return proc, exports


def test_embedded_default_serves_data_dir_with_generated_credentials(tmp_path):
    port = free_port()
    (tmp_path / "data" / "datasets").mkdir(parents=True)
    (tmp_path / "data" / "datasets" / "a.txt").write_bytes(b"hello")
    proc, exports = _start_default(tmp_path, port)
    try:
        assert exports["AWS_ENDPOINT_URL"] == f"http://127.0.0.1:{port}"
        assert exports["AWS_ACCESS_KEY_ID"].startswith("hoard-")
        _wait_ready(port)
        client = boto3.client(
            "s3", endpoint_url=exports["AWS_ENDPOINT_URL"], region_name="us-east-1",
            aws_access_key_id=exports["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=exports["AWS_SECRET_ACCESS_KEY"],
        )  # fmt: skip
        assert [b["Name"] for b in client.list_buckets()["Buckets"]] == ["datasets"]
        assert client.get_object(Bucket="datasets", Key="a.txt")["Body"].read() == b"hello"
        cli = subprocess.run(  # as the README has it: the endpoint from AWS_ENDPOINT_URL
            ["aws", "s3", "ls", "s3://datasets/"],
            capture_output=True, text=True, timeout=60,
            env={**os.environ, **exports, "HOME": str(tmp_path)},
        )  # fmt: skip
        assert cli.returncode == 0, cli.stderr
        assert "a.txt" in cli.stdout
        _dropped_files_and_buckets_show_at_once(tmp_path, client, exports)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    credentials_file = tmp_path / ".cache" / "hoard" / "credentials.json"
    assert oct(credentials_file.stat().st_mode & 0o777) == "0o600"
    again, exports_again = _start_default(tmp_path, free_port())
    again.send_signal(signal.SIGTERM)
    again.wait(20)
    assert exports_again["AWS_SECRET_ACCESS_KEY"] == exports["AWS_SECRET_ACCESS_KEY"]


def _dropped_files_and_buckets_show_at_once(
    tmp_path: Path, client, exports: dict[str, str]
) -> None:
    """The embedded default asks ./data on every request: no TTL hides a new file."""
    assert (
        exports["banner"]
        == f"serving the directory {tmp_path / 'data'} (each directory in it is a bucket)"
    )

    def listed() -> list[str]:
        return [o["Key"] for o in client.list_objects_v2(Bucket="datasets").get("Contents", [])]

    assert listed() == ["a.txt"]
    with pytest.raises(client.exceptions.ClientError):
        client.head_object(Bucket="datasets", Key="b.txt")  # a miss, cached no longer than 0 s
    (tmp_path / "data" / "datasets" / "b.txt").write_bytes(b"dropped in")
    assert listed() == ["a.txt", "b.txt"]
    assert client.get_object(Bucket="datasets", Key="b.txt")["Body"].read() == b"dropped in"
    env = {**os.environ, **exports, "HOME": str(tmp_path)}
    for command in (
        ["mb", "s3://made-by-cli"],
        ["rb", "s3://made-by-cli"],
    ):  # rclone makes its bucket too
        cli = subprocess.run(["aws", "s3", *command, "--endpoint-url", exports["AWS_ENDPOINT_URL"]],
                             capture_output=True, text=True, timeout=60, env=env)  # fmt: skip
        assert cli.returncode == 0, cli.stderr
    assert not (tmp_path / "data" / "made-by-cli").exists()
    # hoard's own CLI reads AWS_ENDPOINT_URL as the banner tells users to export it
    stats = run_hoard(["cache", "stats"], tmp_path, env={**exports, "HOME": str(tmp_path)})
    assert stats.returncode == 0, stats.stderr


def _wait_ready(port: int) -> None:
    for _ in range(200):
        try:
            if requests.get(f"http://127.0.0.1:{port}/_hoard/ready", timeout=1).ok:
                return
        except requests.RequestException:
            time.sleep(0.05)
    raise AssertionError("not ready")


@pytest.fixture
def big_file_hoard(tmp_path):
    """A Hoard over a directory holding a sparse 2 GiB file."""
    bucket = tmp_path / "data" / "big"
    bucket.mkdir(parents=True)
    with open(bucket / "2g.bin", "wb") as handle:
        handle.truncate(2 * GiB)
    node = HoardProcess(tmp_path, {
        "origins": {"disk": {"type": "posix", "path": str(tmp_path / "data")}},
        "default_origin": "disk", "allow_anonymous": True,
    }).start()  # fmt: skip
    yield node
    node.stop()


def _peak_rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) / 1024


def test_streaming_2gib_keeps_memory_flat(big_file_hoard):
    node = big_file_hoard
    settled = _peak_rss_mib(node.proc.pid)
    received = 0
    with requests.get(f"{node.endpoint}/big/2g.bin", stream=True, timeout=120) as answer:
        assert answer.status_code == 200
        assert int(answer.headers["Content-Length"]) == 2 * GiB
        for chunk in answer.iter_content(4 * 1024 * 1024):
            received += len(chunk)
    assert received == 2 * GiB
    peak = _peak_rss_mib(node.proc.pid)
    print(f"peak RSS streaming 2 GiB: {peak:.0f} MiB, {settled:.0f} MiB before")
    # What a stream may hold: the blocks of its widest read-ahead window plus the one it
    # reads (8 MiB each, cache.read_ahead_max 16), and allocator slack — not the object.
    assert peak - settled < (16 + 1) * 8 + 48


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_client_disconnect_closes_the_origin_stream(big_file_hoard):
    node = big_file_hoard
    pid = node.proc.pid
    requests.get(f"{node.endpoint}/_hoard/health", timeout=5)
    baseline = _open_fds(pid)
    sock = socket.create_connection(("127.0.0.1", node.port))
    sock.sendall(b"GET /big/2g.bin HTTP/1.1\r\nHost: x\r\n\r\n")
    received = 0
    while received < 4 * 1024 * 1024:
        received += len(sock.recv(1024 * 1024))
    assert _open_fds(pid) > baseline  # the socket and the file are open now
    sock.close()
    deadline = time.monotonic() + 10
    while _open_fds(pid) > baseline and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _open_fds(pid) <= baseline
    # …and the gateway still serves.
    assert requests.get(f"{node.endpoint}/_hoard/health", timeout=5).ok
    # The client's doing, whichever way the kernel put it (a reset, or EPIPE on the next
    # write): counted as client_gone, and no warning or traceback in the log.
    gone = 'hoard_responses_cut_total{reason="client_gone"}'
    deadline = time.monotonic() + 10
    while metric(node.endpoint, gone) < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert metric(node.endpoint, gone) == 1
    assert "Traceback" not in node.log() and "response cut" not in node.log()


def test_sigterm_lets_in_flight_requests_finish(big_file_hoard):
    node = big_file_hoard
    want = 300 * 1024 * 1024
    received = 0
    with requests.get(
        f"{node.endpoint}/big/2g.bin",
        headers={"Range": f"bytes=0-{want - 1}"},
        stream=True,
        timeout=60,
    ) as answer:
        chunks = answer.iter_content(1024 * 1024)
        received += len(next(chunks))
        node.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        with pytest.raises(requests.ConnectionError):
            requests.get(f"{node.endpoint}/_hoard/health", timeout=2)
        for chunk in chunks:
            received += len(chunk)
    assert received == want
    assert node.proc.wait(15) == 0


def test_idle_and_slow_connections_are_closed_after_the_keepalive_timeout(tmp_path):
    """aiohttp's handler keeps a connection an hour unless told otherwise (web.run_app tells
    it 75 s; Hoard runs its own listener): a client that connects and sends nothing, one
    that sends half a request head, and one idle after an answer are each closed."""
    (tmp_path / "data" / "bkt").mkdir(parents=True)
    (tmp_path / "data" / "bkt" / "k").write_bytes(b"kept")
    node = HoardProcess(tmp_path, {
        "origins": {"disk": {"type": "posix", "path": str(tmp_path / "data")}},
        "default_origin": "disk", "allow_anonymous": True, "keepalive_timeout": "1s",
    }).start()  # fmt: skip
    try:
        silent, slow, served = (socket.create_connection(("127.0.0.1", node.port), timeout=30)
                                for _ in range(3))  # fmt: skip
        slow.sendall(b"GET /bkt/k HTTP/1.1\r\nHost: x\r\n")  # the head never ends
        served.sendall(b"GET /bkt/k HTTP/1.1\r\nHost: x\r\n\r\n")
        assert served.recv(65536).startswith(b"HTTP/1.1 200 OK")
        for sock in (silent, slow, served):
            with sock:
                assert sock.recv(65536) == b""  # closed by the server (30 s: a failure)
    finally:
        node.stop()


def test_an_upload_that_stalls_is_answered_request_timeout_and_stores_nothing(tmp_path):
    (tmp_path / "data" / "bkt").mkdir(parents=True)
    node = HoardProcess(tmp_path, {
        "origins": {"disk": {"type": "posix", "path": str(tmp_path / "data")}},
        "default_origin": "disk", "body_timeout": "1s",
    }).start()  # fmt: skip
    try:
        host = f"127.0.0.1:{node.port}"
        signed = sign_headers("PUT", host, "/bkt/stalled", {"Content-Length": "10"})
        head = "".join(f"{name}: {value}\r\n" for name, value in signed.items())
        with socket.create_connection(("127.0.0.1", node.port), timeout=30) as sock:
            sock.sendall(
                f"PUT /bkt/stalled HTTP/1.1\r\nHost: {host}\r\n{head}\r\nabc".encode()
            )  # 3 of 10 bytes
            answer = b""
            while b"</Error>" not in answer and (chunk := sock.recv(65536)):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
        assert b"<Code>RequestTimeout</Code>" in answer and b"x-amz-request-id: " in answer
        assert not (tmp_path / "data" / "bkt" / "stalled").exists()
        assert [p.name for p in (tmp_path / "data" / "bkt").iterdir()] == []  # no temp file left
    finally:
        node.stop()


@pytest.mark.parametrize("warm", [False, True])  # a fill's bytes through the transport; sendfile
def test_a_client_that_stops_reading_is_dropped_after_the_send_timeout(tmp_path, warm):
    (tmp_path / "data" / "bkt").mkdir(parents=True)
    with open(tmp_path / "data" / "bkt" / "big", "wb") as handle:
        handle.truncate(32 * 1024 * 1024)
    node = HoardProcess(tmp_path, {
        "origins": {"disk": {"type": "posix", "path": str(tmp_path / "data")}},
        "default_origin": "disk", "allow_anonymous": True, "send_timeout": "1s",
    }).start()  # fmt: skip
    try:
        if warm:  # the blocks on disk: the stalled answer is sent with sendfile
            answer = requests.get(f"{node.endpoint}/bkt/big", timeout=60)
            assert len(answer.content) == 32 * 1024 * 1024
        with socket.create_connection(("127.0.0.1", node.port), timeout=30) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
            sock.sendall(b"GET /bkt/big HTTP/1.1\r\nHost: x\r\n\r\n")
            deadline = time.monotonic() + 30  # the event polled, not a wait in its place
            while metric(node.endpoint, "hoard_responses_cut_total") < 1:
                assert time.monotonic() < deadline, "the stalled answer was never cut"
                time.sleep(0.1)
            received = 0
            with contextlib.suppress(ConnectionResetError):
                while chunk := sock.recv(1 << 20):
                    received += len(chunk)
        assert received < 32 * 1024 * 1024  # cut: the client never got the whole body
        assert requests.get(f"{node.endpoint}/_hoard/health", timeout=5).ok
    finally:
        node.stop()


def test_example_config_parses_with_every_documented_key(monkeypatch):
    from gateway.config.load import build_settings, read_yaml

    for name in [n for n in os.environ if n.startswith("HOARD_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("TRAINER_SECRET", "an-operator-secret-of-32-chars..")
    settings = build_settings(read_yaml(REPO / "config" / "hoard.yaml"))
    assert settings.mounts[0].metadata_ttl == float("inf")
    assert settings.cache.block_size == 8 * 1024 * 1024
    assert set(settings.origins) == {"aws", "nfs"}
