"""Mutated requests against a real Hoard: every one gets a whole S3 answer, nothing else.

The review's attacks (``test_security.py``) are the cases someone thought of;
this module sends the ones nobody did. Valid requests of many kinds (plain
and ranged GETs, HEAD, listings, overrides, signed and presigned ones, a PUT,
DeleteObjects, a CORS preflight) have bytes inserted, removed or replaced in
the request line and the header lines, and headers of their own added. Each
goes on a connection of its own, and must come back as one complete HTTP/1.x
answer: never nothing, never a 5xx but 501 NotImplemented (S3's answer to an
operation or sub-resource Hoard does not serve), an error always in S3 XML
with a request id. Then the same kinds are pipelined on one keep-alive
connection, some in pieces, and every answer must be the one its request gets
alone, in order (wire hits answered inside the protocol included).

The admin API gets the same treatment with its own bodies: signed warm jobs,
prefetch orders and cache drops whose fields hold random JSON (wrong types,
empty and unsafe keys, huge numbers, nested values), by a full and a limited
key. Each answer is a JSON object with a status below 500.

Seeded: the same bytes every run, so a failure names a request that fails
again. Line breaks are never inserted (request smuggling has its own cases),
so every request is complete and is answered without waiting. Found so far: a
request line without ``HTTP/1.x`` was served with an ``HTTP/0.9`` status line;
a prefetch manifest key the origin refuses was a 500; a warm job with an empty
manifest was accepted and then failed on an assertion.
"""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.client.admin import AdminClient, AdminError
from tests.harness import ACCESS_KEY, SECRET_KEY, HoardProcess
from tests.rawhttp import presign, sign_headers

SEED = 20261125
OBJECTS = {f"k{i}": os.urandom(size) for i, size in enumerate((1, 100, 5000, 70_000, 300_000))}
JUNK = ["%", "%zz", "%00", "\x00", "\xff", "..", "/../", "?", "&", "=", ";", "\t", " ", "é", "%2F",
        "*", "99999999999999999999", "-1", "bytes=", '"', "<", "\\", "//", "%C0%AF", "A" * 3000,
        ",", "bytes=5-1", "0x10", "\u2028", ":", "HTTP/1.1", "HTTP/2"]  # fmt: skip
HEADERS = ["Range", "If-Match", "If-None-Match", "If-Modified-Since", "x-amz-checksum-mode",
           "Content-MD5", "x-amz-content-sha256", "Expect", "x-amz-copy-source", "x-amz-date",
           "Authorization", "x-amz-meta-a", "Host", "Connection", "Upgrade", "Transfer-Encoding"]  # fmt: skip


@pytest.fixture(scope="module")
def node(tmp_path_factory) -> Iterator[HoardProcess]:
    root: Path = tmp_path_factory.mktemp("fuzz-data")
    (root / "bkt").mkdir()
    for key, data in OBJECTS.items():
        (root / "bkt" / key).write_bytes(data)
    config = {
        "origins": {"disk": {"type": "posix", "path": str(root)}},
        "default_origin": "disk",
        "default_metadata_ttl": "forever",  # held objects: GETs become wire hits
        "allow_anonymous": True,
        "cache": {"block_size": "128KiB", "memory": "8MiB"},
        "credentials": [
            {"access_key": ACCESS_KEY, "secret_key": SECRET_KEY},  # sign_headers' and presign's
            {"access_key": "fuzz-full", "secret_key": "fuzz-full-secret-0123456789"},
            {"access_key": "fuzz-limited", "secret_key": "fuzz-limited-secret-012345",
             "buckets": ["bkt"]},
        ],
    }  # fmt: skip
    running = HoardProcess(tmp_path_factory.mktemp("fuzz-hoard"), config).start()
    yield running
    assert running.stop() == 0


def _bases(host: str) -> list[str]:
    signed = sign_headers("GET", host, "/bkt/k2")
    auth = "".join(f"{name}: {value}\r\n" for name, value in signed.items() if name != "Host")
    return [
        f"GET /bkt/k1 HTTP/1.1\r\nHost: {host}\r\n\r\n",
        f"GET /bkt/k2 HTTP/1.1\r\nHost: {host}\r\nRange: bytes=10-20\r\n\r\n",
        f"HEAD /bkt/k3 HTTP/1.1\r\nHost: {host}\r\n\r\n",
        f"GET /bkt?list-type=2&prefix=k&max-keys=2 HTTP/1.1\r\nHost: {host}\r\n\r\n",
        f"GET /bkt/k1?response-content-type=text/plain HTTP/1.1\r\nHost: {host}\r\n\r\n",
        f'GET /bkt/k4 HTTP/1.1\r\nHost: {host}\r\nIf-None-Match: "x"\r\n\r\n',
        f"GET /bkt/k2 HTTP/1.1\r\nHost: {host}\r\n{auth}\r\n",
        f"GET {presign('GET', host, '/bkt/k3')} HTTP/1.1\r\nHost: {host}\r\n\r\n",
        f"PUT /bkt/new HTTP/1.1\r\nHost: {host}\r\nContent-Length: 5\r\n\r\nhello",
        f"POST /bkt?delete HTTP/1.1\r\nHost: {host}\r\nContent-Length: 17\r\n\r\n<Delete></Delete>",
        f"GET /?x-id=ListBuckets HTTP/1.1\r\nHost: {host}\r\n\r\n",
        f"OPTIONS /bkt/k1 HTTP/1.1\r\nHost: {host}\r\nOrigin: http://a\r\n"
        "Access-Control-Request-Method: GET\r\n\r\n",
    ]


def _mutated(rnd: random.Random, request: str) -> bytes:
    """``request`` with up to three mutations of its head (its body, if any, kept whole)."""
    head, _, body = request.partition("\r\n\r\n")
    lines = head.split("\r\n")
    for _ in range(rnd.randint(1, 3)):
        at = rnd.randrange(len(lines))
        line, kind = lines[at], rnd.random()
        if kind < 0.35 and line:
            i = rnd.randrange(len(line) + 1)
            lines[at] = line[:i] + rnd.choice(JUNK) + line[i:]
        elif kind < 0.55 and line:
            i = rnd.randrange(len(line))
            lines[at] = line[:i] + line[i + rnd.randint(1, 8) :]
        elif kind < 0.7 and line:
            i = rnd.randrange(len(line))
            lines[at] = (
                line[:i]
                + chr(rnd.choice([*range(1, 10), *range(11, 13), *range(14, 256)]))
                + line[i + 1 :]
            )
        else:
            value = rnd.choice(JUNK) + rnd.choice(JUNK)
            lines.insert(rnd.randint(1, len(lines)), f"{rnd.choice(HEADERS)}: {value}")
    text = "\r\n".join(lines) + "\r\n\r\n" + body
    return text.encode("utf-8", "surrogateescape")


def _answers(sock: socket.socket, methods: list[str]) -> list[tuple[int, bytes, bytes]]:
    """(status, head, body) of each answer, read by its Content-Length (HEAD: none)."""
    buffer, answers = b"", []

    def more() -> None:
        nonlocal buffer
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise EOFError(f"closed after {len(answers)} of {len(methods)} answers")
        buffer += chunk

    for method in methods:
        while b"\r\n\r\n" not in buffer:
            more()
        head, _, buffer = buffer.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        if status == 100:  # an interim answer to Expect: the final one follows
            while b"\r\n\r\n" not in buffer:
                more()
            head, _, buffer = buffer.partition(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
        fields = dict(line.split(b":", 1) for line in head.split(b"\r\n")[1:] if b":" in line)
        length = {k.strip().lower(): v.strip() for k, v in fields.items()}.get(b"content-length")
        size = 0 if method == "HEAD" or length is None else int(length)
        while len(buffer) < size:
            more()
        answers.append((status, head, buffer[:size]))
        buffer = buffer[size:]
    return answers


def _exchange(port: int, data: bytes, methods: list[str], pieces: random.Random | None = None):
    with socket.create_connection(("127.0.0.1", port), timeout=15) as sock:
        if pieces is None:
            sock.sendall(data)
        else:
            at = 0
            while at < len(data):
                step = pieces.randint(1, 300)
                sock.sendall(data[at : at + step])
                at += step
        return _answers(sock, methods)


def test_mutated_requests_get_whole_s3_answers(node) -> None:
    host = f"127.0.0.1:{node.port}"
    bases, rnd = _bases(host), random.Random(SEED)
    for base in bases:  # warm: the GETs below find their objects held
        _exchange(node.port, base.encode(), [base.split(" ", 1)[0]])
    for _ in range(1000):
        request = _mutated(rnd, rnd.choice(bases))
        method = request.split(b" ", 1)[0].decode("latin-1")
        ((status, head, body),) = _exchange(node.port, request, [method])
        assert head.startswith((b"HTTP/1.1 ", b"HTTP/1.0 ")), (request, head)
        assert status < 500 or status == 501, (request, head, body[:300])
        if status >= 400:
            assert b"x-amz-request-id: " in head, (request, head)
            assert method == "HEAD" or body.startswith(b"<?xml"), (request, body[:300])


def test_pipelined_requests_are_each_answered_as_alone_in_order(node) -> None:
    host, rnd = f"127.0.0.1:{node.port}", random.Random(SEED + 1)
    kinds = [
        ("GET", f"GET /bkt/{key} HTTP/1.1\r\nHost: {host}\r\n\r\n", 200, data)
        for key, data in OBJECTS.items()
    ] + [
        ("GET", f"GET /bkt/k2 HTTP/1.1\r\nHost: {host}\r\nRange: bytes=3-8\r\n\r\n", 206,
         OBJECTS["k2"][3:9]),
        ("HEAD", f"HEAD /bkt/k3 HTTP/1.1\r\nHost: {host}\r\n\r\n", 200, b""),
        ("GET", f"GET /bkt/nothing HTTP/1.1\r\nHost: {host}\r\n\r\n", 404, None),
        ("GET", f"GET /bkt?list-type=2&max-keys=2 HTTP/1.1\r\nHost: {host}\r\n\r\n", 200, None),
        ("GET", f"GET /bkt/k1?response-content-type=a%2Fb HTTP/1.1\r\nHost: {host}\r\n\r\n",
         400, None),  # overrides need a signed request
        ("PUT", f"PUT /bkt/x HTTP/1.1\r\nHost: {host}\r\nContent-Length: 3\r\n\r\nabc", 403, None),
    ]  # fmt: skip
    for _ in range(300):
        chosen = [rnd.choice(kinds) for _ in range(rnd.randint(1, 8))]
        data = "".join(request for _, request, _, _ in chosen).encode()
        answers = _exchange(
            node.port, data, [m for m, *_ in chosen], rnd if rnd.random() < 0.5 else None
        )
        for (_, request, status, body), (got, head, got_body) in zip(chosen, answers, strict=True):
            assert got == status, (request, head)
            assert body is None or got_body == body, request


VALUES = [None, True, False, 0, -1, 1e308, 2**70, "", "bkt", "other", "k", "../x", "\u0000",
          "x" * 2000, "s1", "bad stream", "1s", "-5s", "forever", 3.5, [], ["k1"], ["k1", ""],
          [1, 2], {"a": 1}, [["k1"]]]  # fmt: skip
# Values of the field's own type half the time, so that calls get past the type checks.
TYPED = {"bucket": ["bkt", "other", ""], "prefix": ["", "k", "../"], "stream": ["s1", "s:2", "s 3"],
         "keys": [["k1"], [], ["../x"], ["k1", "\u0000"]], "manifest": ["", "k1", "../x", "\u0000"],
         "pin": [True], "pin_ttl": ["1h", "0s"], "window": [1, 0, 10**9]}  # fmt: skip
FIELDS = {
    "/_hoard/warm": ("bucket", "prefix", "keys", "manifest", "pin", "pin_ttl", "extra"),
    "/_hoard/prefetch": ("stream", "bucket", "keys", "manifest", "window"),
}


def test_admin_calls_with_random_json_get_json_answers_below_500(node) -> None:
    rnd = random.Random(SEED + 2)
    clients = [
        AdminClient(node.endpoint, "fuzz-full", "fuzz-full-secret-0123456789"),
        AdminClient(node.endpoint, "fuzz-limited", "fuzz-limited-secret-012345"),
    ]
    for _ in range(500):
        client = rnd.choice(clients)
        path = rnd.choice([*FIELDS, "/_hoard/cache"])
        if path == "/_hoard/cache":
            query = {name: str(rnd.choice(VALUES)) for name in rnd.sample(["bucket", "prefix"], 2)}
            call = ("DELETE", path, query, None)
        else:
            body = {
                name: rnd.choice(VALUES) for name in rnd.sample(FIELDS[path], rnd.randint(1, 4))
            }
            if rnd.random() < 0.6:  # past the first checks more often: valid fields around
                body["bucket"] = rnd.choice(["bkt", "other"])
                body.update({"stream": "s1"} if path == "/_hoard/prefetch" else {})
            call = ("POST", path, None, body)
        try:
            answer = client.call(*call)
        except AdminError as refused:
            assert refused.status < 500 and refused.body.get("error") != "InvalidResponse", (
                call, refused.status, refused.body)  # fmt: skip
        else:
            assert isinstance(answer, dict), call
