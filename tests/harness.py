"""Run real Hoard processes on loopback ports for tests."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import boto3
import requests
import yaml
from botocore.config import Config
from prometheus_client.parser import text_string_to_metric_families

ACCESS_KEY = "test-access"
SECRET_KEY = "test-secret-key"
REPO = Path(__file__).resolve().parent.parent


def metric(endpoint: str, selector: str, verify: str | bool = True) -> float:
    """The sum of the samples ``selector`` (``name`` or ``name{label="v",...}``) picks on
    ``endpoint``'s /metrics: labels not named match anything, as in PromQL. ``verify``:
    the CA bundle of an https:// endpoint."""
    answer = requests.get(f"{endpoint}/metrics", timeout=10, verify=verify)
    return sum_samples(answer.text, selector)


def wait_for_metric(endpoint: str, selector: str, least: float, timeout: float = 30) -> None:
    """Wait until ``metric(endpoint, selector)`` reaches ``least`` (the event itself, a
    gauge or a counter, polled; never a sleep in its place); fails past ``timeout``."""
    deadline = time.monotonic() + timeout
    while metric(endpoint, selector) < least:
        assert time.monotonic() < deadline, f"{selector} never reached {least}"
        time.sleep(0.01)


def sum_samples(exposition: str, selector: str) -> float:
    """The sum of the samples ``selector`` picks in a Prometheus text exposition."""
    name, _, rest = selector.partition("{")
    wanted = dict(re.findall(r'(\w+)="([^"]*)"', rest))
    return sum(
        sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
        if sample.name == name and wanted.items() <= sample.labels.items()
    )


def logged(node: HoardProcess, request_id: str) -> dict[str, Any]:
    """The JSON access-log line of ``request_id`` (written in batches: waited for)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for line in node.log().splitlines():
            if request_id in line and line.startswith("{"):
                return json.loads(line)
        time.sleep(0.05)
    raise AssertionError(f"no access-log line for {request_id}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class HoardProcess:
    """One ``python -m gateway serve`` process with a config written to ``workdir``."""

    def __init__(self, workdir: Path, config: dict[str, Any], env: dict[str, str] | None = None,
                 ca: Path | None = None):  # fmt: skip
        """``ca``: the CA that signed ``config["tls"]``'s certificate (HTTPS)."""
        self.workdir = workdir
        self.ca = ca
        self.port = free_port()
        self.config = {
            "listen": f"127.0.0.1:{self.port}",
            "credentials": [{"access_key": ACCESS_KEY, "secret_key": SECRET_KEY}],
            "shutdown_timeout": "5s",
            **config,
        }
        # Every test gets its own cache dir unless it names one.
        self.config["cache"] = {"dir": str(workdir / "cache"), **config.get("cache", {})}
        self.env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / f"hoard-{self.port}.log"

    @property
    def endpoint(self) -> str:
        scheme = "https" if "tls" in self.config else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> HoardProcess:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config_path = self.workdir / f"hoard-{self.port}.yaml"
        config_path.write_text(yaml.safe_dump(self.config))
        env = {**os.environ, **self.env, "PYTHONPATH": str(REPO)}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gateway", "serve", "--config", str(config_path)],
                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.workdir,
            )  # fmt: skip
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"hoard exited early:\n{self.log()}")
            try:
                verify = str(self.ca) if self.ca else True
                ready = requests.get(f"{self.endpoint}/_hoard/ready", timeout=1, verify=verify)
                if ready.status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"hoard not ready after {timeout}s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def client(self, **config: Any):
        return s3_client(self.endpoint, verify=str(self.ca) if self.ca else None, **config)


def s3_client(
    endpoint: str,
    access_key: str = ACCESS_KEY,
    secret_key: str = SECRET_KEY,
    addressing_style: str = "path",
    verify: str | None = None,
    **config: Any,
):
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        verify=verify,
        region_name="us-east-1",
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        config=Config(
            s3={"addressing_style": addressing_style},
            retries={"max_attempts": 1, "mode": "standard"},
            **config,
        ),
    )


class FreshAdmin:
    """An admin client opening a new connection per call: with several workers,
    successive calls reach different workers, as calls of separate tools do."""

    def __init__(self, endpoint: str, timeout: float = 10.0) -> None:
        self.endpoint = endpoint
        self.timeout = timeout

    def call(self, *args: Any, **kwargs: Any) -> Any:
        from gateway.client.admin import AdminClient

        client = AdminClient(self.endpoint, ACCESS_KEY, SECRET_KEY, timeout=self.timeout)
        return client.call(*args, **kwargs)
