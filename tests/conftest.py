"""Shared fixtures: real servers on loopback ports, never mocked HTTP."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import boto3
import pytest
from moto.server import ThreadedMotoServer

ORIGIN_KEY = "origin-access"
ORIGIN_SECRET = "origin-secret"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """moto's threaded S3 server on a loopback port: the origin of most tests."""
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture(scope="session")
def origin_client(moto_endpoint: str):
    """A boto3 client talking to moto directly (to seed data and compare answers)."""
    return boto3.client(
        "s3",
        endpoint_url=moto_endpoint,
        region_name="us-east-1",
        aws_access_key_id=ORIGIN_KEY,
        aws_secret_access_key=ORIGIN_SECRET,
    )
