"""Lean S3 uploaders: one PutObject and one multipart upload, streamed from a seeded generator.

The upload phase of ``rss`` measures the server's memory while gigabytes are
uploaded through it, so the clients must hold nothing themselves: plain
``http.client`` connections, SigV4 header signatures (botocore's signer) over
``UNSIGNED-PAYLOAD`` so no body is read ahead to be hashed, and bodies sent in
1 MiB pieces from ``Synthetic`` (seeded, made as they are read) through one
buffer per request that is overwritten. A client's memory is its generators' 8 MiB
blocks and one buffer per request, whatever the object's size.

Each body's MD5 is computed as it is sent, which gives the ETag the origin
must report (a PutObject's: the MD5 of the body; a multipart upload's: the MD5
of the parts' MD5s, ``-N``), so the stored bytes can be checked without
reading them back.

The multipart upload is created with ``x-amz-checksum-algorithm: CRC32``: a
composite checksum, which lets the load test's moto complete it without
joining the parts in memory (``motoserver.py``); S3 computes the part
checksums itself when a part does not send one.
"""

from __future__ import annotations

import hashlib
import http.client
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials

from loadtest.datasets import Synthetic

PIECE = 1024 * 1024
_UPLOAD_ID = re.compile(rb"<UploadId>([^<]+)</UploadId>")
_ETAG = re.compile(rb"<ETag>([^<]+)</ETag>")
_UNSIGNED = Config(s3={"payload_signing_enabled": False})


@dataclass(frozen=True)
class Peer:
    """Where uploads go and whose keys sign them."""

    endpoint: str  # http://host:port
    access_key: str
    secret_key: str
    region: str = "us-east-1"


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes  # only small XML answers are kept
    md5: str = ""  # hex MD5 of the body that was sent


def generated(key: str, size: int, seed: int, start: int, length: int) -> bytes:
    """``length`` bytes of the object from ``start``, as an upload sent them (for spot checks)."""
    return b"".join(bytes(p) for p in _pieces(Synthetic(key, size, seed), start, length))


def multipart_etag(part_md5s: list[str]) -> str:
    """S3's ETag of a completed multipart upload: MD5 of the parts' MD5s, then ``-N``."""
    joined = b"".join(bytes.fromhex(m) for m in part_md5s)
    return f"{hashlib.md5(joined, usedforsecurity=False).hexdigest()}-{len(part_md5s)}"


def _pieces(source: Synthetic, start: int, length: int) -> Iterator[memoryview]:
    """``length`` bytes of ``source`` from ``start``, in pieces of one reused 1 MiB buffer."""
    buffer = memoryview(bytearray(PIECE))
    source.pos = start
    left = length
    while left > 0:  # bounded: length / up to 1 MiB per turn
        count = source.readinto(buffer[: min(PIECE, left)])
        if count <= 0:
            raise ValueError(f"generator ended {left} bytes early")
        left -= count
        yield buffer[:count]


def _signed(peer: Peer, method: str, target: str, headers: dict[str, str]) -> dict[str, str]:
    host = urlsplit(peer.endpoint).netloc
    request = AWSRequest(method=method, url=f"http://{host}{target}", headers=dict(headers))
    # botocore signs a payload's hash over plain HTTP unless told not to (as Hoard's forwarder is).
    request.context["client_config"] = _UNSIGNED
    S3SigV4Auth(Credentials(peer.access_key, peer.secret_key), "s3", peer.region).add_auth(request)
    return {**dict(request.headers.items()), "Host": host}


def _send(
    connection: http.client.HTTPConnection, peer: Peer, method: str, target: str,
    headers: dict[str, str], body: tuple[Synthetic, int, int] | None = None,
) -> Answer:  # fmt: skip
    """One signed request; ``body`` is (generator, start, length), streamed and hashed."""
    length = body[2] if body is not None else 0
    signed = _signed(peer, method, target, {**headers, "Content-Length": str(length)})
    connection.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
    for name, value in signed.items():
        connection.putheader(name, value)
    connection.endheaders()
    digest = hashlib.md5(usedforsecurity=False)
    try:
        for piece in _pieces(*body) if body is not None else ():
            digest.update(piece)
            connection.send(piece)
    except OSError as exc:
        # A server that refuses a body answers before closing: its answer says why.
        try:
            refused = connection.getresponse()
        except (OSError, http.client.HTTPException):
            raise exc from None
        reason = refused.read(4096).decode(errors="replace")
        raise OSError(f"{exc} after HTTP {refused.status}: {reason}") from exc
    response = connection.getresponse()
    answer = response.read(1024 * 1024)  # an S3 answer to a write is a small XML document
    response.read()  # anything past that is drained, never kept
    return Answer(response.status, {k.lower(): v for k, v in response.getheaders()}, answer,
                  digest.hexdigest())  # fmt: skip


def _connect(peer: Peer, timeout: float) -> http.client.HTTPConnection:
    parts = urlsplit(peer.endpoint)
    return http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout)


def _path(bucket: str, key: str) -> str:
    return f"/{bucket}/{quote(key, safe='/~')}"


def put_object(
    peer: Peer, bucket: str, key: str, size: int, seed: int, timeout: float = 300.0
) -> dict[str, Any]:
    """PutObject of ``size`` generated bytes; the ETag expected is the body's MD5."""
    begin = time.time()
    connection = _connect(peer, timeout)
    try:
        answer = _send(connection, peer, "PUT", _path(bucket, key), {},
                       (Synthetic(key, size, seed), 0, size))  # fmt: skip
    except (OSError, http.client.HTTPException) as exc:
        return _failed(begin, f"{type(exc).__name__}: {exc}")
    finally:
        connection.close()
    etag = answer.headers.get("etag", "").strip('"')
    error = "" if answer.status == 200 else f"HTTP {answer.status}: {answer.body[:200]!r}"
    return {"begin": begin, "end": time.time(), "size": size if not error else 0,
            "etag": etag, "expected_etag": answer.md5, "error": error}  # fmt: skip


def multipart_upload(
    peer: Peer, bucket: str, key: str, size: int, seed: int, part_size: int,
    in_flight: int, timeout: float = 300.0,
) -> dict[str, Any]:  # fmt: skip
    """A multipart upload of ``size`` generated bytes, ``in_flight`` parts at a time."""
    begin = time.time()
    path = _path(bucket, key)
    connection = _connect(peer, timeout)
    try:
        created = _send(connection, peer, "POST", path + "?uploads",
                        {"x-amz-checksum-algorithm": "CRC32"})  # fmt: skip
        found = _UPLOAD_ID.search(created.body)
        if created.status != 200 or found is None:
            return _failed(begin, f"create: HTTP {created.status}: {created.body[:200]!r}")
        upload = quote(found.group(1).decode(), safe="")
        starts = list(range(0, size, part_size))

        def part(number: int) -> Answer:
            start = starts[number - 1]
            mine = _connect(peer, timeout)
            try:
                return _send(mine, peer, "PUT", f"{path}?partNumber={number}&uploadId={upload}",
                             {}, (Synthetic(key, size, seed), start,
                                  min(part_size, size - start)))  # fmt: skip
            finally:
                mine.close()

        with ThreadPoolExecutor(in_flight) as pool:
            parts = list(pool.map(part, range(1, len(starts) + 1)))
        failed = next((p for p in parts if p.status != 200), None)
        if failed is not None:
            return _failed(begin, f"part: HTTP {failed.status}: {failed.body[:200]!r}")
        document = "".join(
            f"<Part><PartNumber>{n}</PartNumber><ETag>{p.headers.get('etag', '')}</ETag></Part>"
            for n, p in enumerate(parts, 1)
        )
        body = f"<CompleteMultipartUpload>{document}</CompleteMultipartUpload>".encode()
        # A fresh connection: the first sat idle while the parts went, past a server's
        # keep-alive timeout (aiohttp's is 75 s) for a large upload.
        connection.close()
        connection = _connect(peer, timeout)
        done = _send_small(connection, peer, "POST", f"{path}?uploadId={upload}", body)
    except (OSError, http.client.HTTPException) as exc:
        return _failed(begin, f"{type(exc).__name__}: {exc}")
    finally:
        connection.close()
    etag = _ETAG.search(done.body)
    if done.status != 200 or etag is None:  # S3 may answer 200 with an error document
        return _failed(begin, f"complete: HTTP {done.status}: {done.body[:200]!r}")
    return {"begin": begin, "end": time.time(), "size": size, "parts": len(parts),
            "etag": etag.group(1).decode().replace("&quot;", "").strip('"'),
            "expected_etag": multipart_etag([p.md5 for p in parts]), "error": ""}  # fmt: skip


def _send_small(
    connection: http.client.HTTPConnection, peer: Peer, method: str, target: str, body: bytes
) -> Answer:
    """A request with a small body held in memory (CompleteMultipartUpload's XML)."""
    signed = _signed(peer, method, target, {"Content-Length": str(len(body))})
    connection.request(method, target, body=body, headers=signed)
    response = connection.getresponse()
    return Answer(response.status, {k.lower(): v for k, v in response.getheaders()},
                  response.read())  # fmt: skip


def _failed(begin: float, error: str) -> dict[str, Any]:
    return {"begin": begin, "end": time.time(), "size": 0, "etag": "", "expected_etag": "",
            "error": error}  # fmt: skip


def upload_both(task: dict[str, Any]) -> dict[str, Any]:
    """A pool task: the multipart upload and the PutObject, started together at ``start_at``.

    ``task``: endpoint, access_key, secret_key, bucket, seed, timeout, start_at, and
    ``multipart`` (key, size, part_size, in_flight) and ``put`` (key, size).
    """
    peer = Peer(task["endpoint"], task["access_key"], task["secret_key"])
    multi, put = task["multipart"], task["put"]

    def at_start(fn: Any, *args: Any) -> dict[str, Any]:
        time.sleep(min(10.0, max(0.0, task["start_at"] - time.time())))  # a barrier, bounded
        return fn(peer, task["bucket"], *args)

    with ThreadPoolExecutor(2) as pool:
        big = pool.submit(at_start, multipart_upload, multi["key"], multi["size"], task["seed"],
                          multi["part_size"], multi["in_flight"], task["timeout"])  # fmt: skip
        single = pool.submit(at_start, put_object, put["key"], put["size"], task["seed"],
                             task["timeout"])  # fmt: skip
        return {"multipart": big.result(), "put": single.result()}
