"""Keep-alive HTTP connections to one endpoint, kept per process, for the bundle client.

A batch GET is one request whose answer is megabytes read in a few large,
exact reads. ``http.client`` does exactly that (``HTTPResponse.read(n)``: one
``bytes`` of n, filled by the socket without an intermediate buffer) in a few
lines of Python per call; urllib3's response, built over the same
``http.client`` object, wraps every read in its own layers (content decoding,
an error-translating context manager, its own buffer), which cost more per
call than the bytes of a small member do. So the bundle client speaks
``http.client`` itself, and this is the little it needs of a pool: idle
connections handed back once an answer was read whole, reused in turn.

A process's connections are its own. ``Connections`` remembers the process
that made its idle ones; in a child made by ``fork`` (a ``DataLoader``
worker) it drops them unused, and makes the child's own. An idle connection
the server has closed meanwhile (keep-alive timeout, restart) is readable
(its end of file) before any request is sent: ``take`` checks that with one
``select`` and makes a new one instead, as urllib3 does.

Not done: proxies, retries (a failed request is the caller's to repeat:
bundles are reads), HTTP/2.
"""

from __future__ import annotations

import http.client
import os
import select
import ssl
import threading
from urllib.parse import SplitResult


class Connections:
    """Up to ``size`` idle connections to ``endpoint`` (``urlsplit`` of it), for reuse."""

    def __init__(self, endpoint: SplitResult, size: int, timeout: float) -> None:
        if endpoint.scheme not in ("http", "https") or not endpoint.hostname:
            raise ValueError(f"not an http(s) endpoint: {endpoint.geturl()!r}")
        self._endpoint = endpoint
        self._size = size
        self._timeout = timeout
        self._lock = threading.Lock()
        self._idle: list[http.client.HTTPConnection] = []
        self._pid = os.getpid()
        self._tls: ssl.SSLContext | None = None

    def take(self) -> http.client.HTTPConnection:
        """An idle connection still open, else a new one (connected on first use)."""
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the parent's sockets are not ours
                self._idle, self._pid = [], os.getpid()
            while self._idle:
                connection = self._idle.pop()
                if _open(connection):
                    return connection
                connection.close()
        return self._new()

    def give(self, connection: http.client.HTTPConnection) -> None:
        """Back to the idle ones, once its last answer was read whole."""
        with self._lock:
            if self._pid == os.getpid() and len(self._idle) < self._size:
                self._idle.append(connection)
                return
        connection.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    def _new(self) -> http.client.HTTPConnection:
        host, port = self._endpoint.hostname, self._endpoint.port
        if self._endpoint.scheme == "http":
            return http.client.HTTPConnection(host, port, timeout=self._timeout)  # type: ignore[arg-type]
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return http.client.HTTPSConnection(host, port, timeout=self._timeout,  # type: ignore[arg-type]
                                           context=self._tls)  # fmt: skip


def _open(connection: http.client.HTTPConnection) -> bool:
    """Whether an idle connection is still usable: not yet connected, or nothing to read
    (an idle one that is readable holds the server's close, or bytes no request asked)."""
    sock = connection.sock
    if sock is None:
        return True
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):  # closed under us
        return False
    return not readable
