"""HTTPS: real clients against a certificate the test makes, reloaded on SIGHUP; peers over TLS.

A private CA (made here with ``cryptography``) signs a certificate for
127.0.0.1. boto3 over HTTPS signs uploads differently than over HTTP: its
default is aws-chunked with a trailing CRC32 (``STREAMING-UNSIGNED-PAYLOAD-TRAILER``)
for single and multipart uploads alike, so both are sent and read back. s3fs and
the aws CLI trust the same CA through their own options. Two nodes talk to each
other over https://, verified with ``cluster.ca_bundle``.
"""

from __future__ import annotations

import io
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
from pathlib import Path

import pytest
import s3fs
from boto3.s3.transfer import TransferConfig
from cryptography import x509

from tests.certs import Ca, make_ca
from tests.conftest import ORIGIN_KEY, ORIGIN_SECRET
from tests.harness import ACCESS_KEY, SECRET_KEY, HoardProcess, free_port, metric
from tests.test_cli import run_hoard

MiB = 1024 * 1024


def served_serial(port: int, ca: Path) -> int:
    """The serial of the certificate a new TLS connection to ``port`` is given."""
    context = ssl.create_default_context(cafile=str(ca))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as wrapped,
    ):
        der = wrapped.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


@pytest.fixture(scope="module")
def ca(tmp_path_factory) -> Ca:
    return make_ca(tmp_path_factory.mktemp("ca"))


def moto_origin(moto_endpoint: str) -> dict:
    return {
        "origins": {"moto": {"type": "s3", "endpoint": moto_endpoint, "access_key": ORIGIN_KEY,
                             "secret_key": ORIGIN_SECRET, "addressing_style": "path"}},
        "default_origin": "moto",
    }  # fmt: skip


@pytest.fixture(scope="module")
def hoard(tmp_path_factory, moto_endpoint, ca):
    workdir = tmp_path_factory.mktemp("hoard-tls")
    cert, key = workdir / "cert.pem", workdir / "key.pem"
    ca.issue(cert, key)
    config = {**moto_origin(moto_endpoint), "tls": {"cert": str(cert), "key": str(key)}}
    node = HoardProcess(workdir, config, ca=ca.path).start()
    yield node
    assert node.stop() == 0


def test_boto3_over_https_single_and_multipart_uploads(hoard, origin_client, bucket) -> None:
    s3 = hoard.client()
    assert hoard.endpoint.startswith("https://")
    small = os.urandom(300_000)
    s3.put_object(Bucket=bucket, Key="small", Body=small)  # aws-chunked, trailing CRC32
    large = os.urandom(11 * MiB)
    config = TransferConfig(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB)
    s3.upload_fileobj(io.BytesIO(large), bucket, "large", Config=config)
    assert origin_client.head_object(Bucket=bucket, Key="large")["ETag"].endswith('-3"')
    for key, data in (("small", small), ("large", large)):
        assert origin_client.get_object(Bucket=bucket, Key=key)["Body"].read() == data
        assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == data
        ranged = s3.get_object(Bucket=bucket, Key=key, Range="bytes=100-199")["Body"].read()
        assert ranged == data[100:200]
    assert metric_over_https(hoard, 'hoard_requests_total{operation="UploadPart"}') == 3


def metric_over_https(node: HoardProcess, selector: str) -> float:
    return metric(node.endpoint, selector, verify=str(node.ca))


def test_s3fs_and_the_aws_cli_trust_the_ca(hoard, origin_client, bucket, tmp_path) -> None:
    fs = s3fs.S3FileSystem(key=ACCESS_KEY, secret=SECRET_KEY, client_kwargs={
        "endpoint_url": hoard.endpoint, "region_name": "us-east-1", "verify": str(hoard.ca)})  # fmt: skip
    fs.pipe(f"{bucket}/fs/piped", b"over tls")
    assert fs.cat(f"{bucket}/fs/piped") == b"over tls"
    assert fs.ls(f"{bucket}/fs", detail=False) == [f"{bucket}/fs/piped"]
    if shutil.which("aws") is None:
        pytest.skip("the aws CLI is not installed")
    local = tmp_path / "up.bin"
    local.write_bytes(os.urandom(9 * MiB))  # over the CLI's 8 MiB threshold: multipart
    env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
           "AWS_DEFAULT_REGION": "us-east-1", "HOME": str(tmp_path)}  # fmt: skip
    tls = ["--endpoint-url", hoard.endpoint, "--ca-bundle", str(hoard.ca)]
    for command in (["cp", str(local), f"s3://{bucket}/cli/up.bin"],
                    ["cp", f"s3://{bucket}/cli/up.bin", str(tmp_path / "down.bin")]):  # fmt: skip
        done = subprocess.run(["aws", "s3", *command, *tls], capture_output=True, text=True,
                              timeout=120, env=env)  # fmt: skip
        assert done.returncode == 0, done.stderr
    assert (tmp_path / "down.bin").read_bytes() == local.read_bytes()
    assert (
        origin_client.get_object(Bucket=bucket, Key="cli/up.bin")["Body"].read()
        == local.read_bytes()
    )


def test_hoard_cache_trusts_a_private_ca_when_told(hoard, tmp_path) -> None:
    """``hoard cache`` (and ``hoard warm``) over https:// with a private CA: refused without
    its certificates, as any verifying client refuses, and answered with ``--ca-bundle`` or
    ``$AWS_CA_BUNDLE``, as the aws CLI takes them."""
    args = ["cache", "stats", "--endpoint", hoard.endpoint,
            "--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY]  # fmt: skip
    untrusted = run_hoard(args, tmp_path, env={"AWS_CA_BUNDLE": ""})
    assert untrusted.returncode != 0
    assert "certificate verify failed" in untrusted.stderr.lower(), untrusted.stderr
    for trusted in (run_hoard([*args, "--ca-bundle", str(hoard.ca)], tmp_path),
                    run_hoard(args, tmp_path, env={"AWS_CA_BUNDLE": str(hoard.ca)})):  # fmt: skip
        assert trusted.returncode == 0, trusted.stderr
        assert "memory" in trusted.stdout


def test_sighup_reloads_the_certificate(hoard, ca) -> None:
    before = served_serial(hoard.port, ca.path)
    cert, key = Path(hoard.config["tls"]["cert"]), Path(hoard.config["tls"]["key"])
    renewed = ca.issue(cert, key)
    assert renewed != before
    assert hoard.proc is not None
    hoard.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10  # the signal is handled by the node's event loop
    while served_serial(hoard.port, ca.path) != renewed:
        assert time.monotonic() < deadline, "the renewed certificate is not served"
        time.sleep(0.05)
    assert hoard.client().list_buckets()["ResponseMetadata"]["HTTPStatusCode"] == 200


def test_unusable_certificate_files_are_a_config_error(tmp_path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "origins: {d: {type: posix, path: .}}\ndefault_origin: d\n"
        f"tls: {{cert: {tmp_path / 'absent.pem'}, key: {tmp_path / 'absent.key'}}}\n"
    )
    result = run_hoard(["serve", "--config", str(config)], tmp_path)
    assert result.returncode == 2 and "tls: cannot load" in result.stderr
    config.write_text(
        "origins: {d: {type: posix, path: .}}\ndefault_origin: d\ntls: {cert: a.pem}\n"
    )
    result = run_hoard(["serve", "--config", str(config)], tmp_path)
    assert result.returncode == 2 and "tls needs both cert and key" in result.stderr


def test_two_nodes_talk_over_https(tmp_path, moto_endpoint, origin_client, bucket, ca) -> None:
    ports = [free_port(), free_port()]
    urls = [f"https://127.0.0.1:{port}" for port in ports]
    nodes = []
    for index, port in enumerate(ports):
        workdir = tmp_path / f"node{index}"
        workdir.mkdir()
        cert, key = workdir / "cert.pem", workdir / "key.pem"
        ca.issue(cert, key)
        config = {**moto_origin(moto_endpoint), "tls": {"cert": str(cert), "key": str(key)},
                  "cluster": {"self": urls[index], "peers": urls, "secret": "s3cret",
                              "ca_bundle": str(ca.path)}}  # fmt: skip
        node = HoardProcess(workdir, config, ca=ca.path)
        node.port = port
        node.config["listen"] = f"127.0.0.1:{port}"
        nodes.append(node)
    data = os.urandom(3 * MiB)
    origin_client.put_object(Bucket=bucket, Key="shared", Body=data)
    try:
        for node in nodes:
            node.start()
        first, second = (node.client() for node in nodes)
        deadline = time.monotonic() + 20  # until each node has probed the other healthy
        while metric_over_https(nodes[0], "hoard_cluster_live_members") < 2:
            assert time.monotonic() < deadline, nodes[0].log()
            time.sleep(0.1)
        assert first.get_object(Bucket=bucket, Key="shared")["Body"].read() == data
        assert second.get_object(Bucket=bucket, Key="shared")["Body"].read() == data
        peer_reads = sum(
            metric_over_https(node, 'hoard_peer_requests_total{operation="block"}')
            for node in nodes
        )
        assert peer_reads >= 1  # some block came from the other node, over https
        assert "CERTIFICATE_VERIFY_FAILED" not in nodes[0].log() + nodes[1].log()
    finally:
        for node in nodes:
            node.stop()
